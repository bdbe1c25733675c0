"""Process and speed machinery: worker processes and their pool, the zygote, served workers,
the MPS daemon, the early CUDA context, the warm case path, bytecode and the switches that
turn each speed-up off. Above the one-case path (harness.case), never below it."""
