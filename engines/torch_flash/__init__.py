"""torch-flash: PyTorch's FlashAttention-2 SDPA backward (aten::_scaled_dot_product_flash_attention_backward)."""
from bundlegen.engines.torch_flash.engine import TorchFlashEngine

__all__ = ["TorchFlashEngine"]
