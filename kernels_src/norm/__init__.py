"""CPU kernels of the norm package: the references the CUDA kernels are tested against, with the
same float32 arithmetic and the same rounding points."""

import torch


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).float()


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, casting_mode: str):
    xf = _rows(x)
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
    normed = xf * rstd[:, None]
    if casting_mode == "llama":
        normed = normed.to(x.dtype).float()
    return (normed * (weight.float() + offset)).to(x.dtype).reshape(x.shape), rstd


def rms_norm_cpu(x, weight, eps, offset, casting_mode):
    return _rms(x, weight, eps, offset, casting_mode)


def rms_norm_backward_cpu(grad, x, weight, rstd, offset, casting_mode):
    xf, g = _rows(x), _rows(grad)
    xh = xf * rstd[:, None]
    gw = g * (weight.float() + offset)
    dx = rstd[:, None] * (gw - xh * (gw * xh).mean(-1, keepdim=True))
    if casting_mode == "llama":
        xh = xh.to(x.dtype).float()
    dw = (g * xh).sum(0)
    return dx.to(x.dtype).reshape(x.shape), dw.to(weight.dtype)


def fused_add_rms_norm_cpu(x, residual, weight, eps, offset, casting_mode):
    residual.copy_((residual.float() + x.float()).to(residual.dtype))
    x.copy_(_rms(residual, weight, eps, offset, casting_mode)[0])


def layer_norm_cpu(x, weight, bias, eps):
    xf = _rows(x)
    mean = xf.mean(-1)
    rstd = torch.rsqrt((xf - mean[:, None]).pow(2).mean(-1) + eps)
    y = (xf - mean[:, None]) * rstd[:, None] * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(x.shape), mean, rstd


def layer_norm_backward_cpu(grad, x, weight, mean, rstd):
    xf, g = _rows(x), _rows(grad)
    xh = (xf - mean[:, None]) * rstd[:, None]
    gw = g * weight.float()
    dx = rstd[:, None] * (gw - gw.mean(-1, keepdim=True) - xh * (gw * xh).mean(-1, keepdim=True))
    return dx.to(x.dtype).reshape(x.shape), (g * xh).sum(0).to(weight.dtype), g.sum(0).to(weight.dtype)
