"""The manifest features real kernels need, on the test package tests/packages/optest: written
arguments (and returns aliasing them), optionals, str and int[] arguments, several launches with
a workspace, device properties, computed template constants, dynamic shared memory. On CPU the
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
    }


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
    names = {kernel for _, kernel in kjit._C.load_package(str(PACKAGE), "optest")["warm"]}
    assert {"add_rms_kernel<32>", "add_rms_kernel<1024>", "bias_act_kernel<true, 0>", "bias_act_kernel<false, 1>"} <= names
    assert {"partial_sum_kernel", "final_sum_kernel"} <= names
