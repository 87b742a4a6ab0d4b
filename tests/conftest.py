"""Session-wide test setup.

Triton fixes interpreter vs compiled mode when it is first imported, and PyTorch may import it
early (e.g. through ``torch._dynamo``). Without a GPU the fused-kernel tests run in Triton's
interpreter, so switch it on before anything imports Triton.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
