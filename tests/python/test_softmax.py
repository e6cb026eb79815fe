"""The shipped softmax package against torch: softmax over the last dim (forward, backward by
autograd through torch.softmax in float32) and cross-entropy (torch.nn.functional.cross_entropy
in float32: ignore_index, label smoothing, mean and sum; its gradient in logits), on CPU its CPU
implementations, on a GPU its CUDA kernels, over row lengths up to a 128k+ vocabulary, unaligned
rows and every row ignored."""

import pytest
import torch
import torch.nn.functional as F

import kjit
from conftest import cuda

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(scope="module")
def softmax():
    return kjit.load("softmax")


def close(got, want, dtype, scale=1.0):
    tol = TOL[dtype] * scale
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
# Short rows go several a block (the last block part empty): (1000, 128), (37, 40). On sm_90 on,
# rows past 4096 vectors go to a cluster of 8 blocks a row: (1, 131072) (its parts in registers),
# (2, 100003) (unaligned: vectors of 1, parts of uneven length, read twice), (2, 262152) (bfloat16
# parts of 4097 vectors: read twice).
@pytest.mark.parametrize("shape", [(5, 64), (3, 4096), (2, 3, 1000), (2, 32768), (1, 131072), (4, 7),
                                   (1000, 128), (37, 40), (2, 100003), (2, 262152)])
def test_softmax_forward_and_backward(softmax, device, dtype, shape):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 3).to(device, dtype)
    close(softmax.softmax(x), torch.softmax(x.float(), -1).to(dtype), dtype)
    grad = torch.randn(shape, generator=g).to(device, dtype)
    xr = x.detach().float().requires_grad_()
    torch.softmax(xr, -1).backward(grad.float())
    xk = x.detach().clone().requires_grad_()
    softmax.softmax(xk).backward(grad)
    close(xk.grad, xr.grad.to(dtype), dtype, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [64, 4096, 32768, 131072])
def test_softmax_masked_rows(softmax, device, dtype, n):
    """-inf logits (attention masks): whole vectors and whole threads' shares of a row masked,
    a row with one element left, and a fully masked row (NaN, as torch)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, n, generator=g) * 3
    x[0, n // 2 :] = float("-inf")  # after the finite part of each thread's share
    x[1, : n // 2] = float("-inf")  # before it
    x[2, 1:] = float("-inf")
    x[3, ::3] = float("-inf")
    x[4] = float("-inf")
    x = x.to(device, dtype)
    got = softmax.softmax(x)
    want = torch.softmax(x.float(), -1).to(dtype)
    close(got[:4], want[:4], dtype)
    assert torch.isnan(got[4]).all() and torch.isnan(want[4]).all()


def reference_ce(logits, target, ignore_index, smoothing, reduction):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=ignore_index, label_smoothing=smoothing, reduction=reduction)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,vocab", [(8, 128), (6, 32000), (4, 128256), (3, 1001), (2, 151936)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_forward_and_backward(softmax, device, dtype, rows, vocab, smoothing, reduction):
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(rows, vocab, generator=g) * 2).to(device, dtype)
    target = torch.randint(0, vocab, (rows,), generator=g)
    target[1] = -100  # ignored
    target = target.to(device)
    loss = softmax.cross_entropy(logits, target, -100, smoothing, reduction)
    want = reference_ce(logits, target, -100, smoothing, reduction)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-4)

    lr = logits.detach().float().requires_grad_()
    (reference_ce(lr, target, -100, smoothing, reduction) * 1.5).backward()
    lk = logits.detach().clone().requires_grad_()
    (softmax.cross_entropy(lk, target, -100, smoothing, reduction) * 1.5).backward()
    # Gradients are O(1 / (rows x vocab)): compared against their largest magnitude.
    scale = lr.grad.abs().max().item()
    close(lk.grad.float() / scale, lr.grad / scale, dtype, 2)
    assert torch.all(lk.grad[1] == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_edge_cases(softmax, device):
    logits = torch.randn(2, 3, 50, device=device)  # [batch, seq, vocab]: targets [batch, seq]
    target = torch.randint(0, 50, (2, 3), device=device)
    torch.testing.assert_close(softmax.cross_entropy(logits, target), reference_ce(logits, target, -100, 0.0, "mean"))
    everything_ignored = torch.full((2, 3), -1, device=device)
    assert torch.isnan(softmax.cross_entropy(logits, everything_ignored, -1))  # as torch: 0 / 0
    assert softmax.cross_entropy(logits, everything_ignored, -1, 0.0, "sum").item() == 0.0
    outside = target.clone()
    outside[0, 0] = 50
    assert torch.isnan(softmax.cross_entropy(logits, outside))  # a target outside the vocabulary
    with pytest.raises(ValueError, match=r"target.dtype == int64"):
        softmax.cross_entropy(logits, target.int())
    with pytest.raises(ValueError, match=r"'reduction' is 'none'; expected one of 'mean', 'sum'"):
        softmax.cross_entropy(logits, target, -100, 0.0, "none")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_torch_compile(softmax, device):
    x = torch.randn(4, 256, device=device)
    target = torch.tensor([3, -100, 0, 255], device=device)
    for op, args in [
        (torch.ops.softmax.softmax, (x,)),
        (torch.ops.softmax.cross_entropy, (x, target, -100, 0.1, "mean")),
        (torch.ops.softmax.cross_entropy, (x, target, -100, 0.0, "sum")),
    ]:
        torch.library.opcheck(op, args)

    def loss_of(x, target):
        return softmax.cross_entropy(x * 2, target) + softmax.softmax(x).pow(2).sum()

    leaves = [x.clone().requires_grad_() for _ in range(2)]
    compiled = torch.compile(loss_of, fullgraph=True, dynamic=True)
    got, want = compiled(leaves[0], target), loss_of(leaves[1], target)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got.backward()
    want.backward()
    torch.testing.assert_close(leaves[0].grad, leaves[1].grad, rtol=1e-5, atol=1e-6)


def test_warm_covers_the_common_shapes(softmax):
    warm = {kernel for _, kernel in kjit._C.warm_list(str(softmax.__file__).rsplit("/", 1)[0])}
    assert "cross_entropy_kernel<float, 1024, 4>" in warm  # float32 logits, vocab % 4 == 0
    assert "cross_entropy_kernel<__nv_bfloat16, 1024, 8>" in warm
    assert "cross_entropy_backward_kernel<float, 1024, 4>" in warm
    assert "cross_entropy_reduce_kernel<1>" in warm and "cross_entropy_reduce_kernel<0>" in warm
    assert "softmax_kernel<__nv_bfloat16, 1024, 8, 0>" in warm  # a 128k vocabulary before sm_90: read twice
    assert "softmax_cluster_kernel<__nv_bfloat16, 1024, 8, 2>" in warm  # on sm_90: an eighth a block
    assert "softmax_backward_cluster_kernel<float, 1024, 4, 4>" in warm
    assert "softmax_backward_kernel<__nv_bfloat16, 128, 8, 4>" in warm  # hidden 4096 in registers
    assert "softmax_kernel<__nv_bfloat16, 128, 8, 4>" in warm  # hidden 4096: the row in registers
