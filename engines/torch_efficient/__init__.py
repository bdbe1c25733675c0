"""torch-efficient: PyTorch's memory-efficient (CUTLASS) SDPA backward (aten::_scaled_dot_product_efficient_attention_backward)."""
from bundlegen.engines.torch_efficient.engine import TorchEfficientEngine

__all__ = ["TorchEfficientEngine"]
