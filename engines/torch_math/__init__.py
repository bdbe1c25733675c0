"""torch-math: the PyTorch math path, the engine the harness is exercised with end to end."""
