"""This project's Triton SDPA backward engine (issue 4): kernels, launch, per-arch configs
and capabilities. Importing the package does not import Triton's kernels; launch does."""
