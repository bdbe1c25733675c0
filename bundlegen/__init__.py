"""bundlegen: a declarative test plan, bundle generator, harness and support matrix for
the SDPA backward pass. This package holds the records and rules every layer shares and
the one CLI; plans/, generator/, harness/ and engines/ hold the rest."""

__version__ = "0.1.0"
