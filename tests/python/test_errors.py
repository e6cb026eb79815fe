"""Every bad input gets a typed error whose message names the problem."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kjit
from conftest import cuda

OPTEST = Path(__file__).resolve().parents[1] / "packages" / "optest"



@pytest.mark.parametrize(
    "image, fragment",
    [
        (torch.zeros(4, 4, dtype=torch.uint8), "image.dim() == 3"),
        (torch.zeros(4, 4, 4, dtype=torch.uint8), "image.size(2) == 3"),
        (torch.zeros(4, 4, 3, dtype=torch.float32), "image.dtype == uint8"),
        (torch.zeros(4, 3, 4, dtype=torch.uint8).transpose(1, 2), "image.is_contiguous()"),
    ],
)
def test_bad_tensors_are_value_errors_with_the_actual_values(img2gray, image, fragment):
    with pytest.raises(ValueError) as info:
        img2gray.img2gray(image)
    message = str(info.value)
    assert fragment in message
    assert "img2gray::img2gray" in message
    assert f"shape [{', '.join(str(s) for s in image.shape)}]" in message

def test_wrong_dtype_names_the_dtype(activation):
    with pytest.raises(ValueError, match="dtype int32"):
        activation.silu_and_mul(torch.zeros(2, 4, dtype=torch.int32))


def test_odd_last_dimension(activation):
    with pytest.raises(ValueError, match=r"x.size\(-1\) % 2 == 0"):
        activation.silu_and_mul(torch.zeros(2, 5))


def test_wrong_argument_count_is_rejected_by_the_schema(img2gray):
    with pytest.raises(RuntimeError):
        img2gray.img2gray()
    with pytest.raises(RuntimeError):
        img2gray.img2gray(torch.zeros(2, 2, 3, dtype=torch.uint8), 3)


def test_zero_size_inputs_give_empty_results(img2gray, activation):
    assert img2gray.img2gray(torch.zeros(0, 5, 3, dtype=torch.uint8)).shape == (0, 5)
    assert activation.silu_and_mul(torch.zeros(0, 8)).shape == (0, 4)


def test_backward_through_an_op_without_backward_is_an_error():
    # A clean interpreter: pytest replaces the process's warning filters during a test, and kjit
    # makes torch's autograd-fallback warning for its ops an error through one (Note [Op
    # registration]). optest.bias_act declares no backward.
    script = f"""
import kjit, torch
kjit.load({str(OPTEST)!r})
x = torch.randn(2, 8, requires_grad=True)
out = torch.ops.optest.bias_act(x)
assert out.requires_grad
try:
    out.sum().backward()
    print("no error")
except UserWarning as e:
    print("refused:", e)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "refused: optest::bias_act: an autograd kernel was not registered" in result.stdout, result.stdout
    kjit.load(OPTEST)
    x = torch.randn(2, 8, requires_grad=True)
    # No history where no grad is asked for.
    with torch.no_grad():
        assert not torch.ops.optest.bias_act(x).requires_grad
    assert not torch.ops.optest.bias_act(x.detach()).requires_grad


def test_unknown_package():
    with pytest.raises(kjit.PackageNotFoundError, match="no kernel package 'nope'"):
        kjit.load("nope")


def write_package(tmp_path, name, manifest, source="extern \"C\" __global__ void k(float* x) {}\n"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "kernel.toml").write_text(textwrap.dedent(manifest))
    (folder / "k.cu").write_text(source)
    return folder


GOOD_OP = """
    [package]
    name = "{name}"
    version = "1.0.0"

    [kernel.k]
    source = "k.cu"
    entry = "k"

    [op.f]
    schema = "f(Tensor x) -> Tensor"
    kernel = "k"
    outputs = [{{ like = "x" }}]
    args = ["out0"]
    grid = [1]
    block = [1]
    {extra}
"""


@pytest.mark.parametrize(
    "extra, location, fragment",
    [
        ('checks = ["x.size(0) ==== 2"]', "op.f.checks[0]", "column"),
        ('checks = ["x.sizes(0) == 2"]', "op.f.checks[0]", "unknown tensor property 'sizes'"),
        ('checks = ["y.dim() == 2"]', "op.f.checks[0]", "unknown name 'y'"),
        ('checks = ["x.dim()"]', "op.f.checks[0]", "expected bool"),
        ('checks = ["x.dtype == 3"]', "op.f.checks[0]", "cannot combine dtype and int"),
        ("colour = 3", "op.f.colour", "unknown key 'colour'"),
        ('cpu = 3', "op.f.cpu", "expected a string"),
        ('specialize = { T = "x.dtype" }', "op.f.specialize.T", "has no placeholder {T}"),
    ],
)
def test_broken_manifests_point_at_the_spot(tmp_path, extra, location, fragment):
    name = f"broken_{abs(hash((extra, location))) % 10**8}"
    folder = write_package(tmp_path, name, GOOD_OP.format(name=name, extra=extra))
    with pytest.raises(kjit.ManifestError) as info:
        kjit.load(folder)
    assert info.value.location == location
    assert fragment in str(info.value)
    assert str(folder / "kernel.toml") in str(info.value)
    assert info.value.line > 0


def test_expression_errors_carry_the_column(tmp_path):
    name = "broken_column"
    manifest = GOOD_OP.format(name=name, extra="").replace("grid = [1]", 'grid = ["cdiv(x.numel(), )"]')
    with pytest.raises(kjit.ManifestError) as info:
        kjit.load(write_package(tmp_path, name, manifest))
    assert info.value.location == "op.f.grid[0]"
    assert info.value.column == 17  # the ')' where a value was expected


def test_toml_syntax_error(tmp_path):
    folder = write_package(tmp_path, "broken_toml", "[package\nname = 1\n")
    with pytest.raises(kjit.ManifestError, match="kernel.toml:1"):
        kjit.load(folder)


def test_missing_source_file(tmp_path):
    folder = write_package(
        tmp_path, "broken_source", GOOD_OP.format(name="broken_source", extra="").replace("k.cu", "gone.cu")
    )
    with pytest.raises(kjit.ManifestError, match="does not exist"):
        kjit.load(folder)


def test_huge_values_are_refused_at_launch_time_not_crashes(tmp_path):
    name = "huge_grid"
    folder = write_package(tmp_path, name, GOOD_OP.format(name=name, extra="").replace("grid = [1]", 'grid = ["99999999999"]'))
    module = kjit.load(folder)  # loads: the value is only known per call
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="outside"):
            module.f(torch.zeros(2, device="cuda"))


def test_op_without_cpu_kernel_says_so(tmp_path):
    name = "no_cpu"
    module = kjit.load(write_package(tmp_path, name, GOOD_OP.format(name=name, extra="")))
    with pytest.raises(NotImplementedError, match="has no CPU kernel"):
        module.f(torch.zeros(2))


def test_cpu_function_missing_from_init(tmp_path):
    name = "missing_cpu_fn"
    folder = write_package(tmp_path, name, GOOD_OP.format(name=name, extra='cpu = "nope"'))
    (folder / "__init__.py").write_text("def other(x):\n    return x\n")
    with pytest.raises(kjit.ManifestError, match="no function 'nope'"):
        kjit.load(folder)


def test_raw_kernel_compile_error_carries_the_log():
    kernel = kjit.RawKernel("extern \"C\" __global__ void bad() { nope(); }", "bad")
    with pytest.raises(kjit.CompileError) as info:
        kernel.compile("sm_90")
    assert "bad.cu(1)" in info.value.log
    assert info.value.arch == "sm_90"
    assert isinstance(info.value, RuntimeError)


def test_raw_kernel_rejects_cpu_tensors_and_odd_types():
    kernel = kjit.RawKernel("extern \"C\" __global__ void k(float* x) {}", "k")
    assert kernel.compile("sm_90") > 0
    with pytest.raises(kjit.LaunchError, match="expected a CUDA tensor"):
        kernel((1,), (1,), (torch.zeros(1),))
    with pytest.raises(kjit.LaunchError, match="pass tensors, ints, floats or bools"):
        kernel((1,), (1,), ("text",))


@cuda
def test_mixed_devices(tmp_path):
    name = "two_inputs"
    manifest = GOOD_OP.format(name=name, extra="").replace(
        "f(Tensor x) -> Tensor", "f(Tensor x, Tensor y) -> Tensor"
    ).replace('args = ["out0"]', 'args = ["out0"]')
    module = kjit.load(write_package(tmp_path, name, manifest))
    with pytest.raises(ValueError, match="expected all tensors on one device, but 'x' is on cuda:0 and 'y' is on cpu"):
        module.f(torch.zeros(2, device="cuda"), torch.zeros(2))


@cuda
def test_raw_kernel_argument_checks():
    kernel = kjit.RawKernel(
        "extern \"C\" __global__ void axpy(float a, const float* x, float* y, int n) {"
        " int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += a * x[i]; }",
        "axpy",
    )
    x = torch.randn(1000, device="cuda")
    y = torch.randn(1000, device="cuda")
    expected = y + 2.0 * x
    kernel((4,), (256,), (2.0, x, y, 1000))
    torch.testing.assert_close(y, expected)
    with pytest.raises(kjit.LaunchError, match="takes 4 arguments, 3 given"):
        kernel((4,), (256,), (2.0, x, y))
    with pytest.raises(kjit.LaunchError, match="parameter 0 is 4 bytes"):
        kernel((4,), (256,), (x, x, y, 1000))
    with pytest.raises(kjit.LaunchError, match="does not fit its 32-bit parameter"):
        kernel((4,), (256,), (2.0, x, y, 2**40))


def test_cache_info_shape():
    info = kjit.cache_info()
    assert set(info) == {"enabled", "read_only", "path", "process", "store"}
    assert {"store_hits", "compiles", "compile_ms"} <= set(info["store"])


def test_a_package_that_does_not_load_is_named_with_its_error(tmp_path, monkeypatch):
    """Found by name but broken: the error says where and why, not that no package exists; a
    good package beside it still loads."""
    broken = tmp_path / "brokenpkg"
    broken.mkdir()
    (broken / "kernel.toml").write_text('[package]\nname = "brokenpkg"\nversion = "1.0.0"\n[op.x]\nschema = 3\n')
    good = tmp_path / "goodpkg"
    shutil.copytree(Path(kjit.load("img2gray").__file__).parent, good,
                    ignore=shutil.ignore_patterns("__pycache__"))
    text = (good / "kernel.toml").read_text().replace('name = "img2gray"', 'name = "goodpkg"')
    (good / "kernel.toml").write_text(text)
    monkeypatch.setenv("KJIT_PATH", str(tmp_path))
    with pytest.raises(kjit.PackageNotFoundError, match=r"kernel package 'brokenpkg' at .*brokenpkg does not load: .*kernel.toml:5"):
        kjit.load("brokenpkg")
    assert kjit.load("goodpkg").__name__ == "goodpkg"
