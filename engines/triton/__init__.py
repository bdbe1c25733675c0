"""This project's Triton SDPA backward engine: kernels, launch, per-arch configs
and capabilities. Importing the package does not import Triton's kernels; launch does."""
