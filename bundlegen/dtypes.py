"""The torch dtype of each bundle dtype name (imports torch: only for code that runs cases)."""
from __future__ import annotations

import torch

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
