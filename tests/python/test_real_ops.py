"""The manifest features real kernels need, on the test package tests/packages/optest: written
arguments (and returns aliasing them), optionals, str and int[] arguments, several launches with
a workspace, device properties, computed template constants, dynamic shared memory, a backward
that is another op with a hidden output saved for it. On CPU the
package's CPU kernels run; on a GPU its CUDA kernels, against them."""

from pathlib import Path

import pytest
import torch

import kjit
from conftest import cuda

PACKAGE = Path(__file__).resolve().parents[1] / "packages" / "optest"


@pytest.fixture(scope="module")
def optest():
    return kjit.load(PACKAGE)


def reference_add_rms(x, residual, weight, eps=1e-6):
    r = residual + x
    return r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight, r


def samples(device):
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    return {
        "add_rms_": [(randn(4, 48), randn(4, 48), randn(48), 1e-5), (randn(3, 1500), randn(3, 1500), randn(1500))],
        "scale_": [(randn(1000), 3.0)],
        "bias_act": [(randn(5, 7), None), (randn(5, 7), randn(7)), (randn(5, 7), randn(7), "identity")],
        "total": [(randn(10000),), (randn(0),)],
        "tile": [(randn(33), [3]), (randn(4), [0])],
        "reverse": [(randn(300),)],
        "rms": [(randn(4, 300), randn(300)), (randn(0, 16), randn(16), 1e-3)],
        "rms_backward": [(randn(4, 300), randn(4, 300), randn(300), randn(4).abs())],
    }


def reference_rms(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def test_the_schemas_carry_alias_annotations(optest):
    schema = torch.ops.optest.add_rms_.default._schema
    assert schema.is_mutable and [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments] == [
        True,
        True,
        False,
        False,
    ]
    assert torch.ops.optest.scale_.default._schema.returns[0].alias_info.is_write
    # Note [Aliasing returns]: the twin that torch functionalizes.
    assert str(torch.ops.optest._kjit_scale_.default._schema).endswith("-> ()")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_opcheck_passes_for_every_op(optest, device):
    for name, cases in samples(device).items():
        for args in cases:
            torch.library.opcheck(getattr(torch.ops.optest, name), args)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_written_arguments_are_written(optest, device):
    x, residual = torch.randn(6, 100, device=device), torch.randn(6, 100, device=device)
    weight = torch.randn(100, device=device)
    want_x, want_r = reference_add_rms(x, residual, weight)
    assert torch.ops.optest.add_rms_(x, residual, weight) is None
    torch.testing.assert_close(residual, want_r)
    torch.testing.assert_close(x, want_x, rtol=1e-4, atol=1e-4)
    y = torch.arange(10.0, device=device)
    assert optest.scale_(y, 2.0) is y and y[3].item() == 6.0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_torch_compile_keeps_the_writes(optest, device):
    def f(x, residual, weight, y):
        h = x * 2  # an intermediate, written in the graph
        torch.ops.optest.add_rms_(h, residual, weight)  # and a graph input
        z = torch.ops.optest.scale_(y, 3.0)
        return h + 1, z * 2

    def inputs():
        g = torch.Generator().manual_seed(1)
        return [torch.randn(*s, generator=g).to(device) for s in [(4, 64), (4, 64), (64,), (9,)]]

    eager, compiled = inputs(), inputs()
    want = f(*eager)
    got = torch.compile(f, fullgraph=True, dynamic=True)(*compiled)
    for a, b in zip(want + tuple(eager), got + tuple(compiled)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_optionals_strings_and_lists(optest, device):
    x, bias = torch.randn(3, 8, device=device), torch.randn(8, device=device)
    torch.testing.assert_close(optest.bias_act(x), torch.relu(x))
    torch.testing.assert_close(optest.bias_act(x, bias), torch.relu(x + bias))
    torch.testing.assert_close(optest.bias_act(x, bias, "identity"), x + bias)
    torch.testing.assert_close(optest.bias_act(x, mode="identity"), x)
    with pytest.raises(ValueError, match=r"'mode' is 'gelu'; expected one of 'identity', 'relu'"):
        optest.bias_act(x, None, "gelu")
    with pytest.raises(ValueError, match=r"check .*present\(bias\).* failed"):
        optest.bias_act(x, torch.randn(5, device=device))
    v = torch.arange(5.0, device=device)
    torch.testing.assert_close(optest.tile(v, [3]), v.repeat(3))
    with pytest.raises(ValueError, match=r"len\(reps\) == 1"):
        optest.tile(v, [1, 2])
    compiled = torch.compile(lambda a, b: optest.bias_act(a, b) + optest.bias_act(a, None, "identity"), fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(x, bias), torch.relu(x + bias) + x)


@cuda
def test_two_launches_share_a_zeroed_workspace(optest):
    for n in [0, 1, 255, 100_000, 3_000_001]:
        x = torch.rand(n, device="cuda")
        torch.testing.assert_close(optest.total(x), x.sum().reshape(1), rtol=1e-4, atol=1e-3)


@cuda
def test_dynamic_shared_memory_above_48_kib(optest):
    x = torch.randn(30_000, device="cuda")  # 120 KB of shared memory
    torch.testing.assert_close(optest.reverse(x), x.flip(0))
    limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    too_big = torch.randn(limit // 4 + 1, device="cuda")
    with pytest.raises(ValueError, match=rf"asks {(limit // 4 + 1) * 4} bytes of dynamic shared memory; cuda:0 allows at most {limit}"):
        optest.reverse(too_big)


def test_warm_covers_the_computed_constants(optest):
    names = {kernel for _, kernel in kjit._C.warm_list(str(PACKAGE))}
    assert {"add_rms_kernel<32>", "add_rms_kernel<1024>", "bias_act_kernel<true, 0>", "bias_act_kernel<false, 1>"} <= names
    assert {"partial_sum_kernel", "final_sum_kernel"} <= names


def test_a_differentiable_op_passes_gradcheck_on_cpu_in_float64(optest):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 12, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(12, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: optest.rms(a, b, 1e-5), (x, w))
    # Only the gradient asked for is returned (the other argument needs none).
    (dx,) = torch.autograd.grad(optest.rms(x, w.detach()).sum(), [x])
    assert dx.shape == x.shape
    # opcheck's autograd tests, with gradients required, on the op; its twin (Note [Backward
    # ops]) is not differentiable itself: checked without gradients, and a backward through a
    # direct call of it is refused naming it (an error outside pytest, test_errors.py).
    torch.library.opcheck(torch.ops.optest.rms, (x, w))
    torch.library.opcheck(torch.ops.optest._kjit_rms, (x.detach(), w.detach()))
    y, _ = torch.ops.optest._kjit_rms(x, w)
    with pytest.warns(UserWarning, match="optest::_kjit_rms: an autograd kernel was not registered"):
        y.sum().backward()


def test_the_hidden_output_is_made_but_not_returned(optest):
    x, w = torch.randn(3, 20), torch.randn(20)
    y = optest.rms(x, w)
    assert isinstance(y, torch.Tensor) and y.shape == x.shape
    y2, rstd = torch.ops.optest._kjit_rms(x, w)  # Note [Backward ops]: the twin returns it
    torch.testing.assert_close(y2, y)
    torch.testing.assert_close(rstd, torch.rsqrt(x.pow(2).mean(-1) + 1e-6))
    assert "-> (Tensor, Tensor)" in str(torch.ops.optest._kjit_rms.default._schema)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_a_differentiable_op_without_gradients(optest, device):
    # Note [Backward ops]: no gradient needed (the twin alone), and inference mode, where the
    # call reaches the op's own CPU or CUDA kernel.
    x, w = torch.randn(4, 64, device=device), torch.randn(64, device=device)
    want = reference_rms(x, w)
    with torch.no_grad():
        y = optest.rms(x, w.requires_grad_())
    assert not y.requires_grad
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        y = optest.rms(x, w)
    assert isinstance(y, torch.Tensor) and y.is_inference()
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_matches_autograd_of_the_reference(optest, device, dtype):
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(7, 1000, dtype=dtype, generator=g).to(device)
    w0 = torch.randn(1000, dtype=dtype, generator=g).to(device)
    upstream = torch.randn(7, 1000, dtype=dtype, generator=g).to(device)
    grads = []
    for f in (optest.rms, reference_rms):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = f(x, w)
        (y * upstream).sum().backward()
        grads.append((y.detach(), x.grad, w.grad))
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_backward_under_torch_compile_matches_eager(optest, device):
    def loss(x, w):
        h = optest.rms(x * 2, w)  # an intermediate input: the gradient flows through it
        return (h * h).sum() + optest.rms(x, w).mean()

    g = torch.Generator().manual_seed(4)
    x0, w0 = torch.randn(6, 96, generator=g).to(device), torch.randn(96, generator=g).to(device)
    results = []
    for f in (loss, torch.compile(loss, fullgraph=True, dynamic=True)):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        value = f(x, w)
        value.backward()
        results.append((value.detach(), x.grad, w.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

