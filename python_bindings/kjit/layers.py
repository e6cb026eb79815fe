"""kjit layers: the forward of a model's module replaced by kjit ops, keeping the module's own
parameters (kjit.kernelize puts them in place).

Each layer follows the layer contract of Hugging Face `kernels`: a plain `nn.Module` subclass
with `forward` only, whose `forward` runs on the module it replaces (it reads that module's
attributes: `weight`, `variance_epsilon`, `gate_proj`, ...), with the class attributes
`can_torch_compile` and `has_backward`. So `kernels.kernelize` can map them too.

Where an input does not fit the kernel (a dtype the weight does not share, say, as under some
mixed-precision set-ups), a layer runs the module's own forward (its class's) instead: the
result is never wrong, only not accelerated.
"""

import torch
from torch import nn

_PACKAGES = {}


def _package(name: str):
    """The shipped package `name`, loaded once."""
    if name not in _PACKAGES:
        from ._api import load

        _PACKAGES[name] = load(name)
    return _PACKAGES[name]


_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.dtype in _KERNEL_DTYPES and weight.dtype == x.dtype and x.device == weight.device and x.dim() >= 1


class RMSNorm(nn.Module):
    """Llama, Qwen2, Qwen3 and Mistral RMSNorm: weight * (x / rms(x)).to(x.dtype), over
    `weight` and `variance_epsilon`."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not _fits(hidden_states, self.weight):
            return type(self).forward(self, hidden_states)
        return _package("norm").rms_norm(hidden_states.contiguous(), self.weight, self.variance_epsilon)


class GemmaRMSNorm(nn.Module):
    """Gemma and Gemma 2 RMSNorm: (x / rms(x) * (1 + weight)) in float32, over `weight` and
    `eps`."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _fits(x, self.weight):
            return type(self).forward(self, x)
        return _package("norm").rms_norm(x.contiguous(), self.weight, self.eps, 1.0, "gemma")


def _gated_mlp(module: nn.Module, x: torch.Tensor, op: str) -> torch.Tensor:
    """down_proj(act(gate_proj(x)) * up_proj(x)) with the activation and product one kernel."""
    gate, up = module.gate_proj(x), module.up_proj(x)
    if gate.dtype not in _KERNEL_DTYPES or up.dtype != gate.dtype or up.shape != gate.shape:
        return type(module).forward(module, x)
    return module.down_proj(getattr(_package("activation"), op)(gate.contiguous(), up.contiguous()))


class SiluAndMulMLP(nn.Module):
    """A gated MLP with SiLU (Llama, Qwen2, Mistral): gate_proj, up_proj, down_proj."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gated_mlp(self, x, "silu_mul")


class GeluTanhAndMulMLP(nn.Module):
    """A gated MLP with tanh-approximated GELU (Gemma): gate_proj, up_proj, down_proj."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gated_mlp(self, x, "gelu_tanh_mul")


class GeluAndMulMLP(nn.Module):
    """A gated MLP with exact GELU: gate_proj, up_proj, down_proj."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gated_mlp(self, x, "gelu_mul")
