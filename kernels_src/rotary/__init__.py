"""CPU kernels of the rotary package: the references the CUDA kernels are tested against, with
the same float32 arithmetic and the same rounding points."""

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool):
    """Rotates the first cos.shape[-1] * 2 dims of x's last dim (float32 in, float32 out); cos and
    sin hold one value per pair."""
    half = cos.shape[-1]
    rot, rest = x[..., : 2 * half], x[..., 2 * half :]
    if neox:
        x1, x2 = rot[..., :half], rot[..., half:]
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    y = torch.cat((y1, y2), -1) if neox else torch.stack((y1, y2), -1).flatten(-2)
    return torch.cat((y, rest), -1)


def rotary_embedding_cpu(positions, query, key, head_size, cos_sin_cache, is_neox):
    half = cos_sin_cache.shape[1] // 2
    flat = positions.reshape(-1)
    inside = (flat >= 0) & (flat < cos_sin_cache.shape[0])
    cache = cos_sin_cache.float()[flat.clamp(0, cos_sin_cache.shape[0] - 1)]
    cos, sin = cache[:, None, :half], cache[:, None, half:]
    for x in (query, key):
        if x is None:
            continue
        heads = x.reshape(flat.numel(), -1, head_size)
        rotated = _rotate(heads.float(), cos, sin, is_neox).to(x.dtype)
        heads.copy_(torch.where(inside[:, None, None], rotated, heads))


def _apply(q, k, cos, sin, backward):
    half = cos.shape[-1] // 2
    # Hugging Face's cos and sin duplicate their halves; the kernels take c1, s1 from the first
    # half and c2, s2 from the second, and so does this reference.
    c = cos.float()[:, None]
    s = sin.float()[:, None]
    out = []
    for x in (q, k):
        xf = x.float()
        x1, x2 = xf[..., :half], xf[..., half : 2 * half]
        c1, c2, s1, s2 = c[..., :half], c[..., half:], s[..., :half], s[..., half:]
        if backward:
            y1, y2 = x1 * c1 + x2 * s2, x2 * c2 - x1 * s1
        else:
            y1, y2 = x1 * c1 - x2 * s1, x2 * c2 + x1 * s2
        out.append(torch.cat((y1, y2, xf[..., 2 * half :]), -1).to(x.dtype).contiguous())
    return tuple(out)


def apply_rotary_cpu(q, k, cos, sin):
    return _apply(q, k, cos, sin, backward=False)


def apply_rotary_backward_cpu(grad_q, grad_k, cos, sin):
    return _apply(grad_q, grad_k, cos, sin, backward=True)
