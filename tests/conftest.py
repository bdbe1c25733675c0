"""The test session runs the Triton engine in the Triton interpreter.

Triton reads TRITON_INTERPRET when a kernel is decorated, that is when a module that
defines kernels is imported, and the mode of its own library is fixed for the process
from then on. pytest imports this file before it collects (imports) any test module, so
setting it here, once, holds for every module that imports Triton, whatever the order
of collection or the modules selected. Child processes inherit it: a test that needs the
kernels compiled for a GPU (ahead-of-time compiles, resource sweeps) runs them in a child
started with `bundlegen.engines.triton.aot.compile_env()`, which leaves it out.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"
