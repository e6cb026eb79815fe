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


def gelu_tanh_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    a, b = _split(x)
    return (F.gelu(a, approximate="tanh") * b).to(x.dtype)


def _silu_grad(a):
    s = torch.sigmoid(a)
    return s * (1 + a * (1 - s))


def _gelu_grad(a):
    return 0.5 * (1 + torch.erf(a * 0.5**0.5)) + a * torch.exp(-0.5 * a * a) * (2 * torch.pi) ** -0.5


def _gelu_tanh_grad(a):
    k = (2 / torch.pi) ** 0.5
    t = torch.tanh(k * (a + 0.044715 * a**3))
    return 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * 0.044715 * a * a)


def _backward(act, act_grad, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[g * b * act'(a), g * act(a)], the derivative written out as the CUDA kernels have it."""
    a, b = _split(x)
    g = grad.float()
    return torch.cat([g * b * act_grad(a), g * act(a)], dim=-1).to(x.dtype)


def silu_and_mul_backward_cpu(grad, x):
    return _backward(F.silu, _silu_grad, grad, x)


def gelu_and_mul_backward_cpu(grad, x):
    return _backward(F.gelu, _gelu_grad, grad, x)


def gelu_tanh_and_mul_backward_cpu(grad, x):
    return _backward(lambda a: F.gelu(a, approximate="tanh"), _gelu_tanh_grad, grad, x)


def silu_and_mul_out_cpu(out, x):
    out.copy_(silu_and_mul_cpu(x))


def gelu_and_mul_out_cpu(out, x):
    out.copy_(gelu_and_mul_cpu(x))


def gelu_tanh_and_mul_out_cpu(out, x):
    out.copy_(gelu_tanh_and_mul_cpu(x))


def _act_mul(act, a, b):
    return (act(a.float()) * b.float()).to(a.dtype)


def silu_mul_cpu(a, b):
    return _act_mul(F.silu, a, b)


def gelu_mul_cpu(a, b):
    return _act_mul(F.gelu, a, b)


def gelu_tanh_mul_cpu(a, b):
    return _act_mul(lambda v: F.gelu(v, approximate="tanh"), a, b)


def _act_mul_backward(act, act_grad, grad, a, b):
    af, g = a.float(), grad.float()
    return (g * b.float() * act_grad(af)).to(a.dtype), (g * act(af)).to(b.dtype)


def silu_mul_backward_cpu(grad, a, b):
    return _act_mul_backward(F.silu, _silu_grad, grad, a, b)


def gelu_mul_backward_cpu(grad, a, b):
    return _act_mul_backward(F.gelu, _gelu_grad, grad, a, b)


def gelu_tanh_mul_backward_cpu(grad, a, b):
    return _act_mul_backward(lambda v: F.gelu(v, approximate="tanh"), _gelu_tanh_grad, grad, a, b)
