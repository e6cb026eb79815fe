"""The shipped norm package against pure-torch references (Hugging Face's LlamaRMSNorm and
GemmaRMSNorm formulas, vLLM's fused_add_rms_norm, torch's layer_norm; gradients by autograd
through them in float32): on CPU its CPU implementations, on a GPU its CUDA kernels, over shapes
that reach each launch rule (rows in registers with 1-4 vectors a thread, rows read twice,
unaligned rows, no rows)."""

import pytest
import torch
import torch.nn.functional as F

import kjit
from conftest import cuda

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]
# (leading shape, hidden): registers with ITEMS 1, 2, 3 and 4; n % 8 != 0 (one element at a
# time, rows read twice); a row too long for registers; a 3-D input; no rows; short rows, several
# a block, the last block part empty (128: 8 or 16 rows a block; 40: 16 or 32).
SHAPES = [((5,), 64), ((7,), 4096), ((3,), 3072), ((2,), 5000), ((4,), 24576), ((2,), 32768),
          ((2,), 65536), ((2, 3), 256), ((0,), 128), ((1000,), 128), ((37,), 40)]
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(scope="module")
def norm():
    return kjit.load("norm")


def reference_rms(x, weight, eps=1e-6, offset=0.0, casting_mode="llama"):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if casting_mode == "llama":  # LlamaRMSNorm: weight * hidden_states.to(input_dtype)
        return ((weight.float() + offset) * h.to(x.dtype).float()).to(x.dtype)
    return (h * (offset + weight.float())).to(x.dtype)  # GemmaRMSNorm


def close(got, want, dtype, scale=1.0):
    tol = TOL[dtype] * scale
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def inputs(lead, n, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, n, generator=g).to(device, dtype)
    weight = (torch.rand(n, generator=g) + 0.5).to(device, dtype)
    return x, weight


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,n", SHAPES)
def test_rms_norm_forward(norm, device, dtype, lead, n):
    x, weight = inputs(lead, n, dtype, device)
    close(norm.rms_norm(x, weight, 1e-6), reference_rms(x, weight), dtype)
    close(norm.rms_norm(x, weight - 1, 1e-6, 1.0, "gemma"),
          reference_rms(x, weight - 1, 1e-6, 1.0, "gemma"), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,n", [((5,), 64), ((7,), 4096), ((2,), 5000), ((2,), 65536), ((0,), 128)])
@pytest.mark.parametrize("casting_mode", ["llama", "gemma"])
def test_rms_norm_backward(norm, device, dtype, lead, n, casting_mode):
    x, weight = inputs(lead, n, dtype, device, seed=1)
    offset = 1.0 if casting_mode == "gemma" else 0.0
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)).to(device, dtype)
    xr = x.detach().float().clone().requires_grad_()
    wr = weight.detach().float().clone().requires_grad_()
    h = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6)
    (h * (wr + offset)).backward(grad.float())
    xk, wk = x.clone().requires_grad_(), weight.clone().requires_grad_()
    norm.rms_norm(xk, wk, 1e-6, offset, casting_mode).backward(grad)
    close(xk.grad, xr.grad.to(dtype), dtype, 2)
    # dweight sums over rows: compared relative to the size of the sum.
    scale = max(1.0, wr.grad.abs().max().item())
    close(wk.grad.float() / scale, wr.grad / scale, dtype, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,n", [((5,), 64), ((7,), 4096), ((3,), 3072), ((2,), 5000), ((2,), 65536), ((0,), 128)])
def test_fused_add_rms_norm_writes_both(norm, device, dtype, lead, n):
    x, weight = inputs(lead, n, dtype, device, seed=3)
    residual = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).to(device, dtype)
    want_residual = (residual.float() + x.float()).to(dtype)
    want_x = reference_rms(want_residual, weight)
    assert norm.fused_add_rms_norm(x, residual, weight, 1e-6) is None
    torch.testing.assert_close(residual, want_residual, rtol=0, atol=0)
    close(x, want_x, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,n", [((5,), 64), ((7,), 4096), ((3,), 3072), ((2,), 5000), ((2,), 65536), ((0,), 128)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_forward_and_backward(norm, device, dtype, lead, n, with_bias):
    x, weight = inputs(lead, n, dtype, device, seed=5)
    x = x * 3 + 2  # a mean far from 0
    g = torch.Generator().manual_seed(6)
    bias = torch.randn(n, generator=g).to(device, dtype) if with_bias else None
    grad = torch.randn(x.shape, generator=g).to(device, dtype)
    xr, wr = x.detach().float().clone().requires_grad_(), weight.detach().float().clone().requires_grad_()
    br = bias.detach().float().clone().requires_grad_() if with_bias else None
    want = F.layer_norm(xr, (n,), wr, br, 1e-5)
    want.backward(grad.float())
    xk, wk = x.clone().requires_grad_(), weight.clone().requires_grad_()
    bk = bias.clone().requires_grad_() if with_bias else None
    got = norm.layer_norm(xk, wk, bk, 1e-5)
    close(got, want.detach().to(dtype), dtype, 2)
    got.backward(grad)
    close(xk.grad, xr.grad.to(dtype), dtype, 4)
    for k, r in [(wk, wr)] + ([(bk, br)] if with_bias else []):
        scale = max(1.0, r.grad.abs().max().item())
        close(k.grad.float() / scale, r.grad / scale, dtype, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(norm, device):
    x, weight = inputs((3, 4), 256, torch.float32, device)
    residual, bias = torch.randn_like(x), torch.randn_like(weight)
    for op, args in [
        (torch.ops.norm.rms_norm, (x, weight, 1e-6)),
        (torch.ops.norm.rms_norm, (x, weight, 1e-5, 1.0, "gemma")),
        (torch.ops.norm.fused_add_rms_norm, (x.clone(), residual, weight, 1e-6)),
        (torch.ops.norm.layer_norm, (x, weight, bias, 1e-5)),
        (torch.ops.norm.layer_norm, (x, weight, None, 1e-5)),
    ]:
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_forward_and_backward(norm, device):
    def f(x, residual, weight, bias):
        h = norm.rms_norm(x, weight, 1e-6) + norm.layer_norm(x, weight, bias, 1e-5)
        return h.sum()

    def fused(x, residual, weight):
        x = x * 1  # an intermediate, written in the graph
        norm.fused_add_rms_norm(x, residual, weight, 1e-6)
        return x + residual

    x, weight = inputs((2, 8), 512, torch.float32, device)
    bias = torch.randn_like(weight)
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    want_leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    compiled(leaves[0], None, leaves[1], leaves[2]).backward()
    f(want_leaves[0], None, want_leaves[1], want_leaves[2]).backward()
    for a, b in zip(leaves, want_leaves):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)
    residual = torch.randn_like(x)
    torch.testing.assert_close(torch.compile(fused, fullgraph=True, dynamic=True)(x, residual.clone(), weight),
                               fused(x, residual.clone(), weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_clear_errors(norm, device):
    x, weight = inputs((2,), 64, torch.float32, device)
    with pytest.raises(ValueError, match=r"weight.size\(0\) == x.size\(-1\)"):
        norm.rms_norm(x, weight[:32])
    with pytest.raises(ValueError, match=r"weight.dtype == x.dtype"):
        norm.rms_norm(x, weight.half())
    with pytest.raises(ValueError, match=r"'casting_mode' is 'none'; expected one of 'gemma', 'llama'"):
        norm.rms_norm(x, weight, 1e-6, 0.0, "none")
    with pytest.raises(ValueError, match=r"is_contiguous"):
        norm.rms_norm(x.t(), weight[:2])


def test_warm_covers_the_common_hidden_sizes(norm):
    """hidden 4096 (bfloat16 and float16) and 2048..4096 (float32) are pre-compiled by `kjit warm`."""
    warm = {kernel for _, kernel in kjit._C.warm_list(str(norm.__file__).rsplit("/", 1)[0])}
    assert "rms_norm_kernel<__nv_bfloat16, 256, 8, 2, 0, false>" in warm  # 4096 / 8 / 256 = 2
    assert "rms_norm_kernel<float, 512, 4, 2, 0, false>" in warm  # 4096 / 4 / 512 = 2
    assert "rms_norm_backward_kernel<__half, 256, 8, 2, 0>" in warm
    assert "layer_norm_kernel<__nv_bfloat16, 256, 8, 2, true, false>" in warm
    assert "col_sum_kernel<__nv_bfloat16>" in warm
