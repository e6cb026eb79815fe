"""CPU kernels of the test package `optest` (the references the CUDA kernels are tested against)."""

import torch


def add_rms_cpu(x, residual, weight, eps):
    residual += x
    x.copy_(residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + eps) * weight)


def scale_cpu(x, s):
    x.mul_(s)
    return x


def bias_act_cpu(x, bias, mode):
    v = x if bias is None else x + bias
    return torch.relu(v) if mode == "relu" else v.clone()


def total_cpu(x):
    return x.sum().reshape(1)


def tile_cpu(x, reps):
    return x.repeat(reps[0])


def reverse_cpu(x):
    return x.flip(0)


def rms_cpu(x, weight, eps):
    rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
    return x * rstd[:, None] * weight, rstd  # the returned output, then the hidden one


def rms_backward_cpu(grad, x, weight, rstd):
    r = rstd[:, None]
    gw = grad * weight
    dx = r * (gw - x * r * r * (gw * x).mean(-1, keepdim=True))
    return dx, (grad * x * r).sum(0)
