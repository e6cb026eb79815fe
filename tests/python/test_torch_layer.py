"""The torch layer on torch's stable ABI: one built module for every torch, and a Python half that
evaluates exactly what the C++ parser produced."""

import itertools
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import kjit
from kjit import _C, _expr

MODULE = Path(_C.__file__)


EXPRESSIONS = [
    "a + b * c",
    "a - b - c",
    "a / b",
    "a % b",
    "cdiv(a, b)",
    "cdiv(a, b) * b - a",
    "-a / b + c % 7",
    "min(a, b) - max(b, c)",
    "a * b * c",
    "a / b == c",
    "a < b && b <= c || !(a != c)",
    "a >= b == (c > 0)",
    "max(1, min(a / 256, 65535))",
    "(a + b) % (c - a)",
    "a * 2.5 < b",
    "a / 2.0 + c",
]

VALUES = [0, 1, -1, 2, 3, -7, 31, 256, 1 << 31, -(1 << 40), (1 << 62), -(1 << 63), (1 << 63) - 1]


def test_the_python_evaluator_agrees_with_the_cpp_one():
    rng = random.Random(7)
    cases = 0
    for text in EXPRESSIONS:
        combos = list(itertools.product(VALUES, repeat=3))
        for values in rng.sample(combos, 120):
            exported, expected = _C._evaluate_expr(text, ["a", "b", "c"], list(values))
            try:
                got = _expr.compile(exported)(list(values))
            except _expr.EvalError as e:
                got = str(e)
            if isinstance(expected, float) and isinstance(got, float):
                assert got == pytest.approx(expected, nan_ok=True), (text, values)
            else:
                assert (type(got), got) == (type(expected), expected), (text, values)
            cases += 1
    assert cases == len(EXPRESSIONS) * 120


def test_preserved_layouts_are_torch_empty_likes():
    """layout = "preserve" keeps like's strides exactly where torch.empty_like does (c10's
    non-overlapping-and-dense rule, which the C++ layer computes the same way)."""
    from kjit._torch_layer import _non_overlapping_and_dense

    base = torch.empty(2, 3, 4, 5)
    cases = [
        base,
        base.transpose(1, 2),
        base.permute(3, 1, 0, 2),
        base[:, :2],  # a slice: gaps
        base[..., ::2],  # a step: gaps
        torch.empty(3, 1, 5).expand(3, 4, 5),  # stride 0: overlapping
        torch.empty(1, 4).as_strided((1, 4), (100, 1)),  # a size-1 dim's stride does not matter
        torch.empty(4, 1, 6).as_strided((4, 1, 6), (6, 7, 1)),
        torch.empty(0, 3),
        torch.empty(7),
        torch.empty(7)[::2],
        torch.empty(()),
        torch.empty(4, 6).t(),
        torch.empty(8, 8).as_strided((4, 4), (4, 1)),  # dense, offset-free view of a larger block
        torch.empty(8, 8).as_strided((4, 4), (1, 4)),
        torch.empty(8, 8).as_strided((4, 4), (8, 1)),  # rows apart: gaps
    ]
    for t in cases:
        kept = torch.empty_like(t).stride() == t.stride()
        assert _non_overlapping_and_dense(t) == kept, (t.shape, t.stride())


def test_the_module_links_nothing_of_torch():
    if shutil.which("readelf") is None or shutil.which("nm") is None:
        pytest.fail("readelf and nm (binutils) are needed to inspect the module")
    needed = subprocess.run(["readelf", "-d", str(MODULE)], capture_output=True, text=True, check=True).stdout
    libraries = [line.split("[")[1].rstrip("]") for line in needed.splitlines() if "(NEEDED)" in line]
    assert libraries and not [lib for lib in libraries if "torch" in lib or "c10" in lib], libraries
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", str(MODULE)], capture_output=True, text=True, check=True
    ).stdout.split()
    torch_symbols = [s for s in undefined if s.startswith(("aoti_", "torch_", "_ZN3c10", "_ZN2at", "_ZN5torch"))]
    assert not torch_symbols, torch_symbols[:10]


def test_the_ops_carry_the_pt2_compliant_tag(img2gray):
    assert torch.Tag.pt2_compliant_tag in torch.ops.img2gray.img2gray.default.tags


def test_fake_kernels_give_symbolic_shapes(activation):
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(activation.silu_and_mul, tracing_mode="symbolic")(torch.empty(6, 10))
    (x,) = [n for n in graph.graph.nodes if n.op == "placeholder"]
    # silu_and_mul is differentiable: a trace records the twin its Autograd kernel calls
    # (Note [Backward ops]).
    (call,) = [n for n in graph.graph.nodes if n.target == torch.ops.activation._kjit_silu_and_mul.default]
    rows, cols = call.meta["val"].shape
    assert isinstance(rows, torch.SymInt) and isinstance(cols, torch.SymInt)
    assert str(rows) == str(x.meta["val"].shape[0])
    assert cols.node.hint == 5 and str(x.meta["val"].shape[1]) in str(cols)


def test_meta_tensors_use_the_fake_kernel(img2gray):
    out = img2gray.img2gray(torch.empty(5, 7, 3, dtype=torch.uint8, device="meta"))
    assert out.shape == (5, 7) and out.device.type == "meta" and out.dtype == torch.uint8


def test_a_second_package_cannot_take_a_namespace(tmp_path):
    folder = Path(kjit.load("img2gray").__file__).parent
    copy = tmp_path / "img2gray"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__", "*.sqlite"))
    with pytest.raises(kjit.ManifestError, match="namespace 'img2gray' is taken by the package at"):
        kjit._api._register(copy, "img2gray", True)
