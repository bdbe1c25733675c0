"""torch-cudnn: PyTorch's cuDNN SDPA backward (aten::_scaled_dot_product_cudnn_attention_backward)."""
from bundlegen.engines.torch_cudnn.engine import TorchCudnnEngine

__all__ = ["TorchCudnnEngine"]
