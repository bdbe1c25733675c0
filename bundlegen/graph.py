"""The graph and case records of a bundle, their JSON codec, and graphs built from sizes:
one import name for all three (docs/CONTRACTS.md names them here). Each part lives in a
module of its own: bundlegen.graph_records (the frozen records, ports and bundle keys),
bundlegen.graph_codec (bundle text to records) and bundlegen.graph_shapes (port dims,
packed layouts, score-modifier ports)."""
from __future__ import annotations

from bundlegen.graph_records import (ALIGNMENTS, ATTRIBUTE_KEYS, BIAS_VALUES, BUNDLE_KEYS,
                                     BUNDLE_VERSION, CASE_KEYS, DATA_KEYS, DISTRIBUTIONS, DTYPES,
                                     GRAPH_KEYS, INPUT_PORTS, INT64_LIMIT, KNOWN_PORTS, MODIFIERS,
                                     MODIFIER_INPUT_PORTS, MODIFIER_OUTPUT_PORTS, OFFSET_PORTS,
                                     OUTPUT_PORTS, PORTS, PURPOSES, RAGGED_KEYS, REJECTION_LAYERS,
                                     SEQUSED_PORTS, TENSOR_KEYS, Attributes, Bundle, BundleError, Case, Cost,
                                     DataSpec, Graph, Ragged, Rejection, TensorSpec, canonical_json,
                                     packed_strides)
from bundlegen.graph_codec import (FieldReader, case_from_json, graph_from_json, load_bundle,
                                   tensor_from_json)
from bundlegen.graph_shapes import (ALIBI_SLOPES_DIMS, BIAS_BROADCASTS, LAYOUT_ORDERS, RAGGED_LAYOUT_ORDERS,
                                    RAGGED_STATS_ORDER, dbias_dims, default_scale, dense_graph,
                                    port_dims, ragged_graph, ragged_port_dims, with_modifiers)

__all__ = ['ALIGNMENTS', 'ATTRIBUTE_KEYS', 'BIAS_VALUES', 'BUNDLE_KEYS', 'BUNDLE_VERSION',
           'CASE_KEYS', 'DATA_KEYS', 'DISTRIBUTIONS', 'DTYPES', 'GRAPH_KEYS', 'INPUT_PORTS',
           'INT64_LIMIT', 'KNOWN_PORTS', 'MODIFIERS', 'MODIFIER_INPUT_PORTS',
           'MODIFIER_OUTPUT_PORTS', 'OFFSET_PORTS', 'OUTPUT_PORTS', 'PORTS', 'PURPOSES',
           'RAGGED_KEYS', 'REJECTION_LAYERS', 'SEQUSED_PORTS', 'TENSOR_KEYS', 'Attributes', 'Bundle', 'BundleError',
           'Case', 'Cost', 'DataSpec', 'Graph', 'Ragged', 'Rejection', 'TensorSpec',
           'canonical_json', 'packed_strides', 'FieldReader', 'case_from_json', 'graph_from_json',
           'load_bundle', 'tensor_from_json', 'ALIBI_SLOPES_DIMS', 'BIAS_BROADCASTS', 'LAYOUT_ORDERS',
           'RAGGED_LAYOUT_ORDERS', 'RAGGED_STATS_ORDER', 'dbias_dims', 'default_scale',
           'dense_graph', 'port_dims', 'ragged_graph', 'ragged_port_dims', 'with_modifiers']
