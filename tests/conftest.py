"""The test session runs the Triton engine in the Triton interpreter.

Triton reads TRITON_INTERPRET when a kernel is decorated, that is when a module that
defines kernels is imported, and the mode of its own library is fixed for the process
from then on. pytest imports this file before it collects (imports) any test module, so
setting it here, once, holds for every module that imports Triton, whatever the order
of collection or the modules selected. Child processes inherit it: a test that needs the
kernels compiled for a GPU (ahead-of-time compiles, resource sweeps) runs them in a child
started with `bundlegen.engines.triton.aot.compile_env()`, which leaves it out.

Every process of the session runs one OpenMP thread unless OMP_NUM_THREADS says
otherwise: the suite runs many processes side by side (pytest-xdist's workers, the runs
and servers tests start, their workers), each on small tensors, and OpenMP threads that
outnumber the cores spin against each other (the 75 ragged cases of a quick torch-math
run took 90 s with two threads on a busy 2-core host, 5 s with one). torch reads it when
it is first imported, which is after this file; children inherit it. A run's workers
side by side still get their share of the cores from the run itself (cpu_threads).
"""
import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")
