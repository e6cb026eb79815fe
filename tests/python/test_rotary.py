"""The shipped rotary package against pure-torch references: vLLM's rotary_embedding (NeoX and
GPT-J, with and without a key, partial rotary, a float32 or a same-dtype cache) and Hugging
Face's apply_rotary_pos_emb with rotate_half (gradients by autograd through it in float32): on
CPU its CPU implementations, on a GPU its CUDA kernels, over head sizes 64-256, vector and
one-element paths, the transposed views attention passes."""

import pytest
import torch

import kjit
from conftest import cuda

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(scope="module")
def rotary():
    return kjit.load("rotary")


def close(got, want, dtype, scale=1.0):
    tol = TOL[dtype] * scale
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def cos_sin_cache(max_position, rot, dtype, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), -1).to(dtype)


def reference_rotary_embedding(positions, x, head_size, cache, neox):
    """vLLM's RotaryEmbedding.forward_native, in float32, rounded once."""
    rot = cache.shape[1]
    cos, sin = cache.float()[positions.reshape(-1)].chunk(2, -1)
    h = x.float().reshape(positions.numel(), -1, head_size)
    r, rest = h[..., :rot], h[..., rot:]
    cos, sin = cos[:, None], sin[:, None]
    if neox:
        x1, x2 = r.chunk(2, -1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)
    else:
        x1, x2 = r[..., 0::2], r[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)
    return torch.cat((out, rest), -1).reshape(x.shape).to(x.dtype)


# (tokens as a shape, q heads, kv heads, head size, rotary dims)
CASES = [((7,), 4, 2, 64, 64), ((2, 5), 8, 8, 128, 128), ((3,), 2, 1, 256, 256),
         ((4,), 4, 4, 128, 64), ((5,), 3, 1, 80, 80), ((1,), 1, 1, 64, 10)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,q_heads,kv_heads,head_size,rot", CASES)
@pytest.mark.parametrize("neox", [True, False])
def test_rotary_embedding_in_place(rotary, device, dtype, tokens, q_heads, kv_heads, head_size, rot, neox):
    g = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 512, tokens, generator=g).to(device)
    query = torch.randn(*tokens, q_heads * head_size, generator=g).to(device, dtype)
    key = torch.randn(*tokens, kv_heads * head_size, generator=g).to(device, dtype)
    for cache_dtype in (torch.float32, dtype):
        cache = cos_sin_cache(512, rot, cache_dtype).to(device)
        q, k = query.clone(), key.clone()
        assert rotary.rotary_embedding(positions, q, k, head_size, cache, neox) is None
        close(q, reference_rotary_embedding(positions, query, head_size, cache, neox), dtype)
        close(k, reference_rotary_embedding(positions, key, head_size, cache, neox), dtype)
        q = query.clone()
        rotary.rotary_embedding(positions, q, None, head_size, cache, neox)  # no key
        close(q, reference_rotary_embedding(positions, query, head_size, cache, neox), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_embedding_leaves_tokens_outside_the_cache(rotary, device):
    positions = torch.tensor([0, 600, -1, 3], device=device)
    query = torch.randn(4, 2 * 64, device=device)
    q = query.clone()
    rotary.rotary_embedding(positions, q, None, 64, cos_sin_cache(512, 64, torch.float32).to(device))
    torch.testing.assert_close(q[1:3], query[1:3], rtol=0, atol=0)
    assert not torch.equal(q[3], query[3])


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def reference_apply(q, k, cos, sin):
    """Hugging Face's apply_rotary_pos_emb (unsqueeze_dim=1), with partial rotary as Phi does."""
    rot = cos.shape[-1]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    out = []
    for x in (q, k):
        r, rest = x[..., :rot], x[..., rot:]
        out.append(torch.cat(((r * cos) + (rotate_half(r) * sin), rest), -1))
    return tuple(out)


def hf_inputs(batch, q_heads, kv_heads, seq, head_size, rot, dtype, device, seed=0, batched_cos=True):
    """q and k as attention passes them: [B, S, H*D] projections viewed as [B, H, S, D]; cos and
    sin as LlamaRotaryEmbedding makes them (halves duplicated, in the model's dtype)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, q_heads * head_size, generator=g).view(batch, seq, q_heads, head_size).transpose(1, 2)
    k = torch.randn(batch, seq, kv_heads * head_size, generator=g).view(batch, seq, kv_heads, head_size).transpose(1, 2)
    positions = torch.randint(0, 4096, (batch if batched_cos else 1, seq), generator=g).float()
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), -1)
    to = dict(device=device, dtype=dtype)
    return q.to(**to), k.to(**to), emb.cos().to(**to), emb.sin().to(**to)


HF_CASES = [(2, 4, 2, 7, 64, 64), (1, 8, 8, 16, 128, 128), (2, 2, 1, 5, 256, 256), (1, 4, 4, 3, 128, 64),
            (2, 3, 1, 4, 80, 80), (1, 2, 2, 3, 64, 10)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,q_heads,kv_heads,seq,head_size,rot", HF_CASES + [(1, 2, 1, 37, 64, 64)])
@pytest.mark.parametrize("layout", ["projection", "contiguous"])  # the two launches' schedules
def test_apply_rotary_forward_and_backward(rotary, device, dtype, batch, q_heads, kv_heads, seq, head_size, rot, layout):
    q, k, cos, sin = hf_inputs(batch, q_heads, kv_heads, seq, head_size, rot, dtype, device, batched_cos=batch > 1)
    if layout == "contiguous":
        q, k = q.contiguous(), k.contiguous()
    q_out, k_out = rotary.apply_rotary(q, k, cos, sin)
    q_ref, k_ref = reference_apply(q.float(), k.float(), cos.float(), sin.float())
    close(q_out, q_ref.to(dtype), dtype)
    close(k_out, k_ref.to(dtype), dtype)
    # Laid out as q and k (layout = "preserve"), as eager's q * cos + rotate_half(q) * sin is.
    assert q_out.shape == q.shape and q_out.stride() == q.stride() and k_out.stride() == k.stride()

    g = torch.Generator().manual_seed(3)
    grad_q = torch.randn(q.shape, generator=g).to(device, dtype)
    grad_k = torch.randn(k.shape, generator=g).to(device, dtype)
    qr, kr = q.detach().float().requires_grad_(), k.detach().float().requires_grad_()
    a, b = reference_apply(qr, kr, cos.float(), sin.float())
    ((a * grad_q.float()).sum() + (b * grad_k.float()).sum()).backward()
    qk, kk = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    a, b = rotary.apply_rotary(qk, kk, cos, sin)
    ((a * grad_q).sum() + (b * grad_k).sum()).backward()
    close(qk.grad, qr.grad.to(dtype), dtype, 2)
    close(kk.grad, kr.grad.to(dtype), dtype, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_apply_rotary_output_layout(rotary, device):
    """Outputs take q's and k's strides where those are dense (the transposed views of
    projections), in the real, meta and fake kernels alike; else they are contiguous."""
    q, k, cos, sin = hf_inputs(2, 4, 2, 5, 64, 64, torch.float32, device)
    assert not q.is_contiguous()
    wide = torch.randn(2, 4, 5, 96, device=device)[..., :64]  # a slice: not dense
    want = reference_apply(q, k, cos, sin)
    for qq, kk in [(q, k), (wide, k), (q.contiguous(), k)]:
        q_out, k_out = rotary.apply_rotary(qq, kk, cos, sin)
        dense = qq is not wide
        assert q_out.stride() == (qq.stride() if dense else qq.contiguous().stride())
        assert k_out.stride() == kk.stride()
        for t in (qq, kk, cos, sin):
            assert t.device.type == device
        meta = rotary.apply_rotary(*(t.to("meta") for t in (qq, kk, cos, sin)))
        assert [m.stride() for m in meta] == [q_out.stride(), k_out.stride()]
    q_out, k_out = rotary.apply_rotary(q, k, cos, sin)
    close(q_out, want[0], torch.float32)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = rotary.apply_rotary(*(mode.from_tensor(t) for t in (q, k, cos, sin)))
    assert [f.stride() for f in fake] == [q_out.stride(), k_out.stride()]

    # Gradients laid out as the outputs reach the backward op as they are (no copy), others
    # contiguous; both give the reference's gradients.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        strides = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "apply_rotary_backward" in str(func):
                self.strides.append([a.stride() for a in args[:2]])
            return func(*args, **(kwargs or {}))

    for transposed in (True, False):
        qr, kr = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
        a, b = rotary.apply_rotary(qr, kr, cos, sin)
        ga, gb = torch.randn_like(a), torch.randn_like(b)  # randn_like keeps a's layout
        if not transposed:
            ga, gb = ga.contiguous(), gb.contiguous()
        Seen.strides.clear()
        with Seen():
            dq, dk = torch.autograd.grad((a, b), (qr, kr), (ga, gb))
        assert Seen.strides == [[a.stride(), b.stride()] if transposed else [ga.stride(), gb.stride()]]
        qf, kf = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
        ra, rb = reference_apply(qf, kf, cos, sin)
        want_q, want_k = torch.autograd.grad((ra, rb), (qf, kf), (ga, gb))
        close(dq, want_q, torch.float32)
        close(dk, want_k, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_torch_compile(rotary, device):
    q, k, cos, sin = hf_inputs(2, 4, 2, 5, 64, 64, torch.float32, device)
    positions = torch.arange(6, device=device)
    cache = cos_sin_cache(16, 64, torch.float32).to(device)
    for op, args in [
        (torch.ops.rotary.apply_rotary, (q, k, cos, sin)),
        (torch.ops.rotary.apply_rotary_backward, (q.contiguous(), k.contiguous(), cos, sin)),
        (torch.ops.rotary.rotary_embedding, (positions, torch.randn(6, 128, device=device), torch.randn(6, 64, device=device), 64, cache, True)),
        (torch.ops.rotary.rotary_embedding, (positions, torch.randn(6, 128, device=device), None, 64, cache, False)),
    ]:
        torch.library.opcheck(op, args)

    def attention_like(q, k, cos, sin, positions, cache):
        a, b = rotary.apply_rotary(q, k, cos, sin)
        flat = q.transpose(1, 2).reshape(-1, q.shape[1] * q.shape[3]) * 1  # an intermediate, rotated in place
        rotary.rotary_embedding(positions, flat, None, q.shape[3], cache, True)
        return a.sum() + b.sum() * 2 + flat.sum()

    positions = torch.arange(10, device=device)
    leaves = [t.clone().requires_grad_() for t in (q, k)]
    want = [t.clone().requires_grad_() for t in (q, k)]
    compiled = torch.compile(attention_like, fullgraph=True, dynamic=True)
    got = compiled(*leaves, cos, sin, positions, cache)
    expected = attention_like(*want, cos, sin, positions, cache)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    got.backward()
    expected.backward()
    for a, b in zip(leaves, want):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_clear_errors(rotary, device):
    q, k, cos, sin = hf_inputs(1, 2, 2, 3, 64, 64, torch.float32, device)
    with pytest.raises(ValueError, match=r"cos.dtype == q.dtype"):
        rotary.apply_rotary(q, k, cos.half(), sin)
    with pytest.raises(ValueError, match=r"cos.size\(2\) <= q.size\(3\)"):
        rotary.apply_rotary(q, k, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    with pytest.raises(ValueError, match=r"q.stride\(3\) == 1"):
        rotary.apply_rotary(torch.randn(1, 2, 3, 128, device=device)[..., ::2], k, cos, sin)
    positions = torch.arange(3, device=device)
    with pytest.raises(ValueError, match=r"positions.dtype == int64"):
        rotary.rotary_embedding(positions.int(), torch.randn(3, 64, device=device), None, 64, cos_sin_cache(8, 64, torch.float32).to(device))
    with pytest.raises(ValueError, match=r"query.numel\(\) % \(positions.numel\(\) \* head_size\) == 0"):
        rotary.rotary_embedding(positions, torch.randn(3, 60, device=device), None, 64, cos_sin_cache(8, 64, torch.float32).to(device))


def test_warm_covers_the_common_head_sizes(rotary):
    """Llama-style heads (128, bf16, vectors of 8) and float32 (vectors of 4) are pre-compiled."""
    warm = {kernel for _, kernel in kjit._C.warm_list(str(rotary.__file__).rsplit("/", 1)[0])}
    assert "apply_rotary_kernel<__nv_bfloat16, 8, false>" in warm
    assert "apply_rotary_kernel<__nv_bfloat16, 8, true>" in warm
    assert "apply_rotary_kernel<float, 4, false>" in warm
    assert "rotary_embedding_kernel<__nv_bfloat16, float, 8>" in warm
    assert "rotary_embedding_kernel<__half, __half, 8>" in warm
