"""CPU kernels of the softmax package: the references the CUDA kernels are tested against, with
the same float32 arithmetic and the same rounding points."""

import torch


def softmax_cpu(x):
    return torch.softmax(x.float(), -1).to(x.dtype)


def softmax_backward_cpu(grad, y):
    g, yf = grad.float(), y.float()
    return (yf * (g - (g * yf).sum(-1, keepdim=True))).to(y.dtype)


def _rows(logits, target):
    return logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1)


def cross_entropy_cpu(logits, target, ignore_index, label_smoothing, reduction):
    x, t = _rows(logits, target)
    n = x.shape[-1]
    lse = torch.logsumexp(x, -1)
    kept = t != ignore_index
    inside = (t >= 0) & (t < n)
    xt = x.gather(1, t.clamp(0, n - 1)[:, None])[:, 0]
    loss = lse - (1 - label_smoothing) * xt - label_smoothing / n * x.sum(-1)
    loss = torch.where(kept, torch.where(inside, loss, torch.full_like(loss, float("nan"))), torch.zeros_like(loss))
    count = kept.sum().float().reshape(1) if reduction == "mean" else torch.ones(1)
    return loss.sum() / count[0], lse, count


def cross_entropy_backward_cpu(grad, logits, target, lse, count, ignore_index, label_smoothing):
    x, t = _rows(logits, target)
    n = x.shape[-1]
    p = torch.exp(x - lse[:, None])
    onehot = torch.zeros_like(p)
    kept = t != ignore_index
    onehot[kept.nonzero()[:, 0], t[kept].clamp(0, n - 1)] = 1.0
    d = (p - label_smoothing / n - (1 - label_smoothing) * onehot) * (grad.float() / count[0])
    d = torch.where(kept[:, None], d, torch.zeros_like(d))
    return d.to(logits.dtype).reshape(logits.shape)
