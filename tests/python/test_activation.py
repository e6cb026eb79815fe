import pytest
import torch
import torch.nn.functional as F

import kjit
from conftest import cuda

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(scope="module")
def activation():
    return kjit.load("activation")


ACTS = {"silu_and_mul": F.silu, "gelu_and_mul": F.gelu,
        "gelu_tanh_and_mul": lambda a: F.gelu(a, approximate="tanh")}
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]


def reference(name, x):
    d = x.shape[-1] // 2
    a, b = x[..., :d].double(), x[..., d:].double()
    return ACTS[name](a) * b


def check_close(out, ref, dtype):
    rel = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert rel < TOLERANCE[dtype], rel


@pytest.mark.parametrize("name", list(ACTS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_matches_torch(activation, name, dtype):
    x = torch.randn(4, 7, 2 * 96, dtype=dtype)
    out = getattr(activation, name)(x)
    assert out.shape == (4, 7, 96) and out.dtype == dtype
    check_close(out, reference(name, x), dtype)


@pytest.mark.parametrize("name", list(ACTS))
def test_opcheck_cpu(activation, name):
    op = getattr(torch.ops.activation, name).default
    torch.library.opcheck(op, (torch.randn(3, 10),))


def test_compile_dynamic_cpu(activation):
    fn = torch.compile(lambda x: activation.silu_and_mul(x) + 1, fullgraph=True, dynamic=True)
    for shape in [(2, 8), (3, 5, 12), (1, 2)]:
        x = torch.randn(shape)
        torch.testing.assert_close(fn(x), activation.silu_and_mul(x) + 1)


@cuda
@pytest.mark.parametrize("name", list(ACTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [(1, 2), (3, 5, 2 * 11), (16, 2 * 4096), (8, 2 * 11008), (7, 2 * 64), (6, 2 * 1000), (5, 2 * 12)],
)
def test_cuda_matches_torch(activation, name, dtype, shape):
    x = torch.randn(shape, dtype=dtype, device="cuda")
    out = getattr(activation, name)(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    check_close(out, reference(name, x), dtype)


@cuda
def test_cuda_many_tokens(activation):
    # Many short rows: a vector is one whole row of a (d = 8 halves), the last block is partial.
    x = torch.randn(270003, 2 * 8, device="cuda", dtype=torch.float16)
    check_close(activation.silu_and_mul(x), reference("silu_and_mul", x), torch.float16)


@cuda
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_properties(0).total_memory < 64 << 30,
    reason="needs a CUDA device with 64 GiB",
)
def test_cuda_more_than_2_to_the_32_elements(activation):
    """Past 2^32 output elements the kernels find rows with 64-bit division (32-bit below); the
    first rows and the last (past 2^32) against the reference, forward and backward."""
    d, tokens = 4096, (1 << 32) // 4096 + 3
    x = torch.randn(tokens, 2 * d, device="cuda", dtype=torch.bfloat16)
    ends = [slice(0, 2), slice(tokens - 4, tokens)]
    out = activation.silu_and_mul(x)
    for rows in ends:
        check_close(out[rows], reference("silu_and_mul", x[rows]), torch.bfloat16)
    del out
    grad = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
    dx = torch.ops.activation.silu_and_mul_backward(grad, x)
    for rows in ends:
        xr = x[rows].double().requires_grad_()
        reference("silu_and_mul", xr).backward(grad[rows].double())
        check_close(dx[rows], xr.grad, torch.bfloat16)


@cuda
def test_cuda_unaligned_view_falls_back_to_scalar_loads(activation):
    base = torch.randn(2 * 64 * 3 + 1, device="cuda", dtype=torch.float16)
    x = base[1:].view(3, 128)  # 2-byte aligned only
    check_close(activation.silu_and_mul(x), reference("silu_and_mul", x), torch.float16)


@cuda
@pytest.mark.parametrize("name", list(ACTS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_two_input_form_unaligned_views(activation, name, dtype):
    """a, b and grad that are not 16-byte aligned (views one element in): element moves, forward and
    backward, against the same op on aligned copies."""
    op = getattr(activation, name.replace("_and_mul", "_mul"))
    bases = [torch.randn(7 * 96 + 1, device="cuda", dtype=dtype) for _ in range(3)]
    a, b, grad = (t[1:].view(7, 96) for t in bases)
    ak, bk = a.clone().requires_grad_(), b.clone().requires_grad_()
    want = op(ak, bk)
    want.backward(grad.clone())
    assert a.data_ptr() % 16 and ak.data_ptr() % 16 == 0
    da, db = getattr(torch.ops.activation, name.replace("_and_mul", "_mul_backward"))(grad, a, b)
    torch.testing.assert_close(op(a, b), want)
    torch.testing.assert_close(da, ak.grad)
    torch.testing.assert_close(db, bk.grad)


@cuda
@pytest.mark.parametrize("name", list(ACTS))
def test_opcheck_cuda(activation, name):
    op = getattr(torch.ops.activation, name).default
    torch.library.opcheck(op, (torch.randn(3, 64, device="cuda", dtype=torch.bfloat16),))


@cuda
def test_compile_dynamic_cuda(activation):
    fn = torch.compile(lambda x: activation.gelu_and_mul(x) * 3, fullgraph=True, dynamic=True)
    for shape in [(2, 8), (3, 5, 128)]:
        x = torch.randn(shape, device="cuda", dtype=torch.float16)
        torch.testing.assert_close(fn(x), activation.gelu_and_mul(x) * 3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(ACTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2), (3, 5, 2 * 11), (16, 2 * 4096), (7, 2 * 1000), (70000, 2 * 8), (0, 16)])
def test_forward_and_backward_match_autograd(activation, device, name, dtype, shape):
    """The backward ops against autograd through the float64 formula, the unaligned scalar path
    (d % 8 != 0) and more rows than a grid holds (70000) included."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(device, dtype)
    grad = torch.randn(*shape[:-1], shape[-1] // 2, generator=g).to(device, dtype)
    xk = x.clone().requires_grad_()
    out = getattr(activation, name)(xk)
    check_close(out, reference(name, x), dtype)
    out.backward(grad)
    xr = x.double().requires_grad_()
    reference(name, xr).backward(grad.double())
    assert xk.grad.dtype == dtype and xk.grad.shape == x.shape
    if x.numel():
        check_close(xk.grad, xr.grad, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(ACTS))
def test_out_variants_write_out(activation, device, name):
    x = torch.randn(4, 2 * 300, device=device, dtype=torch.bfloat16)
    out = torch.full((4, 300), float("nan"), device=device, dtype=torch.bfloat16)
    assert getattr(activation, f"{name}_out")(out, x) is None
    check_close(out, reference(name, x), torch.bfloat16)
    with pytest.raises(ValueError, match=r"out.size\(-1\) \* 2 == x.size\(-1\)"):
        getattr(activation, f"{name}_out")(torch.empty(4, 299, device=device, dtype=torch.bfloat16), x)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_backward_and_out_ops(activation, device):
    x = torch.randn(3, 2 * 40, device=device)
    grad = torch.randn(3, 40, device=device)
    for name in ACTS:
        torch.library.opcheck(getattr(torch.ops.activation, name), (x,))
        torch.library.opcheck(getattr(torch.ops.activation, f"{name}_backward"), (grad, x))
        torch.library.opcheck(getattr(torch.ops.activation, f"{name}_out"), (torch.empty(3, 40, device=device), x))


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_training_step(activation, device):
    def step(x):
        return (activation.silu_and_mul(x) * activation.gelu_tanh_and_mul(x)).sum()

    x = torch.randn(5, 2 * 64, device=device)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    step(xe).backward()
    torch.compile(step, fullgraph=True, dynamic=True)(xc).backward()
    torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(ACTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5, 11), (16, 4096), (70000, 8), (0, 16)])
def test_two_input_form_and_its_backward(activation, device, name, dtype, shape):
    """act(a) * b of two tensors (the gate and up projections, not concatenated)."""
    op = getattr(activation, name.replace("_and_mul", "_mul"))
    g = torch.Generator().manual_seed(1)
    a, b, grad = (torch.randn(shape, generator=g).to(device, dtype) for _ in range(3))
    ak, bk = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = op(ak, bk)
    ar, br = a.double().requires_grad_(), b.double().requires_grad_()
    want = ACTS[name](ar) * br
    check_close(out, want.detach(), dtype)
    out.backward(grad)
    want.backward(grad.double())
    if a.numel():
        check_close(ak.grad, ar.grad, dtype)
        check_close(bk.grad, br.grad, dtype)
    torch.library.opcheck(getattr(torch.ops.activation, name.replace("_and_mul", "_mul")), (a, b))
