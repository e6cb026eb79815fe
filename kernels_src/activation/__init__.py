"""CPU kernels of the activation package (float32 arithmetic, like the CUDA kernels)."""

import torch
import torch.nn.functional as F


def _split(x: torch.Tensor):
    d = x.shape[-1] // 2
    return x[..., :d].float(), x[..., d:].float()


def silu_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    a, b = _split(x)
    return (F.silu(a) * b).to(x.dtype)


def gelu_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    a, b = _split(x)
    return (F.gelu(a) * b).to(x.dtype)
