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


def reference(name, x):
    d = x.shape[-1] // 2
    a, b = x[..., :d].double(), x[..., d:].double()
    act = F.silu(a) if name == "silu_and_mul" else F.gelu(a)
    return act * b


def check_close(out, ref, dtype):
    rel = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert rel < TOLERANCE[dtype], rel


@pytest.mark.parametrize("name", ["silu_and_mul", "gelu_and_mul"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_matches_torch(activation, name, dtype):
    x = torch.randn(4, 7, 2 * 96, dtype=dtype)
    out = getattr(activation, name)(x)
    assert out.shape == (4, 7, 96) and out.dtype == dtype
    check_close(out, reference(name, x), dtype)


@pytest.mark.parametrize("name", ["silu_and_mul", "gelu_and_mul"])
def test_opcheck_cpu(activation, name):
    op = getattr(torch.ops.activation, name).default
    torch.library.opcheck(op, (torch.randn(3, 10),))


def test_compile_dynamic_cpu(activation):
    fn = torch.compile(lambda x: activation.silu_and_mul(x) + 1, fullgraph=True, dynamic=True)
    for shape in [(2, 8), (3, 5, 12), (1, 2)]:
        x = torch.randn(shape)
        torch.testing.assert_close(fn(x), activation.silu_and_mul(x) + 1)


@cuda
@pytest.mark.parametrize("name", ["silu_and_mul", "gelu_and_mul"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(1, 2), (3, 5, 2 * 11), (16, 2 * 4096), (8, 2 * 11008), (7, 2 * 64), (6, 2 * 1000)]
)
def test_cuda_matches_torch(activation, name, dtype, shape):
    x = torch.randn(shape, dtype=dtype, device="cuda")
    out = getattr(activation, name)(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    check_close(out, reference(name, x), dtype)


@cuda
def test_cuda_many_tokens(activation):
    # More rows than the grid's 65535 blocks of 4 rows each: blocks loop over rows, and the last
    # block gets fewer than 4 (270003 = 4 x 65535 + 7863).
    x = torch.randn(270003, 2 * 8, device="cuda", dtype=torch.float16)
    check_close(activation.silu_and_mul(x), reference("silu_and_mul", x), torch.float16)


@cuda
def test_cuda_unaligned_view_falls_back_to_scalar_loads(activation):
    base = torch.randn(2 * 64 * 3 + 1, device="cuda", dtype=torch.float16)
    x = base[1:].view(3, 128)  # 2-byte aligned only
    check_close(activation.silu_and_mul(x), reference("silu_and_mul", x), torch.float16)


@cuda
@pytest.mark.parametrize("name", ["silu_and_mul", "gelu_and_mul"])
def test_opcheck_cuda(activation, name):
    op = getattr(torch.ops.activation, name).default
    torch.library.opcheck(op, (torch.randn(3, 64, device="cuda", dtype=torch.bfloat16),))


@cuda
def test_compile_dynamic_cuda(activation):
    fn = torch.compile(lambda x: activation.gelu_and_mul(x) * 3, fullgraph=True, dynamic=True)
    for shape in [(2, 8), (3, 5, 128)]:
        x = torch.randn(shape, device="cuda", dtype=torch.float16)
        torch.testing.assert_close(fn(x), activation.gelu_and_mul(x) * 3)
