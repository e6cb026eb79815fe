"""Autotuning on the CUDA path (Note [Tuning]) with the test package tests/packages/tuned, and
kjit.tuning. The tuner's logic with a fake timer is tested in C++ (runtime_tune_tuner_test.cpp);
here: the Python API's checks (CPU), and on a GPU that every candidate computes the same result,
that a written argument is written once and a zeroed workspace is zero again after tuning, that
a second process pays nothing, and that capture and KJIT_AUTOTUNE=0 use the default rule."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kjit
import kjit.tuning
from conftest import cuda

PACKAGE = Path(__file__).resolve().parents[1] / "packages" / "tuned"


@pytest.fixture(scope="module")
def tuned():
    return kjit.load(PACKAGE)


def test_parameters_and_candidates(tuned):
    assert kjit.tuning.parameters(tuned.scale) == {"BLOCK": [64, 128, 256, 512, 1024], "VEC": [1, 2, 4]}
    assert kjit.tuning.parameters("tuned::sum") == {"BLOCK": [128, 256, 512, 1024], "GRID": [1, 2, 4]}
    assert kjit.tuning.parameters(torch.ops.tuned.add_.default) == {"BLOCK": [128, 256, 512, 1024]}
    every = kjit.tuning.candidates(tuned.scale)
    assert len(every) == 15 and every[0] == {"BLOCK": 64, "VEC": 1} and every[-1] == {"BLOCK": 1024, "VEC": 4}


def test_use_checks_its_configuration(tuned):
    with pytest.raises(ValueError, match=r"unknown: \['ROWS'\]"):
        kjit.tuning.use(tuned.scale, {"BLOCK": 256, "VEC": 1, "ROWS": 2})
    with pytest.raises(ValueError, match=r"missing: \['VEC'\]"):
        kjit.tuning.use(tuned.scale, {"BLOCK": 256})
    with pytest.raises(ValueError, match="'tuned', 'default' or a mapping"):
        kjit.tuning.use(tuned.scale, "fastest")
    with pytest.raises(kjit.Error, match="not an op of a package kjit has loaded"):
        kjit.tuning.use("nosuch::op", "default")
    img2gray = kjit.load("img2gray")
    with pytest.raises(kjit.Error, match="has no tune parameters"):
        kjit.tuning.use(img2gray.img2gray, "default")
    with kjit.tuning.using(tuned.scale, {"BLOCK": 128, "VEC": 2}):
        pass  # accepted; the CUDA kernel takes it (tested on the GPU below)
    assert isinstance(kjit.tuning.entries(), list)


def test_kjit_tune_needs_a_gpu_or_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the command tunes instead (tested below)")
    result = subprocess.run(
        [sys.executable, "-m", "kjit", "tune", str(PACKAGE), "--shape", "x=1024"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "needs a CUDA device" in result.stderr


def test_kjit_tune_usage_errors():
    result = subprocess.run(
        [sys.executable, "-m", "kjit", "tune", str(PACKAGE), "--shape", "x=12xq"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert "x=12xq" in result.stderr and "NAME=DIMS" in result.stderr


def _run(code: str, cache: Path, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "KJIT_CACHE_DIR": str(cache), "KJIT_LOG": "info", **env}
    script = "import kjit, kjit.tuning, torch, json\n" + f"tuned = kjit.load({str(PACKAGE)!r})\n" + textwrap.dedent(code)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=full_env, timeout=600)
    assert result.returncode == 0, result.stderr
    return result


@cuda
def test_every_candidate_computes_the_same_result(tuned):
    x = torch.randn(1 << 20, device="cuda")
    for config in kjit.tuning.candidates(tuned.scale):
        with kjit.tuning.using(tuned.scale, config):
            assert torch.equal(tuned.scale(x, 3.0), x * 3.0), config
    for config in kjit.tuning.candidates(tuned.sum):
        with kjit.tuning.using(tuned.sum, config):
            torch.testing.assert_close(tuned.sum(x), x.sum(), rtol=1e-4, atol=1e-2, msg=str(config))
    # A configuration that does not fit the arguments is refused, not run.
    odd = torch.randn(1001, device="cuda")
    with kjit.tuning.using(tuned.scale, {"BLOCK": 256, "VEC": 4}):
        with pytest.raises(ValueError, match="fails tune_valid"):
            tuned.scale(odd, 2.0)
    with kjit.tuning.using(tuned.scale, "default"):
        assert torch.equal(tuned.scale(odd, 2.0), odd * 2.0)


@cuda
def test_the_first_call_tunes_and_a_second_process_pays_nothing(tmp_path):
    code = """
        x = torch.randn(3 << 20, device="cuda")
        y = tuned.scale(x, 2.0)
        assert torch.equal(y, x * 2.0)
        print(json.dumps(kjit.tuning.entries("tuned::scale")))
    """
    first = _run(code, tmp_path)
    entries = json.loads(first.stdout.strip().splitlines()[-1])
    assert len(entries) == 1
    entry = entries[0]
    assert entry["names"] == ["BLOCK", "VEC"] and "sm_" in entry["device"]
    assert len(entry["timings"]) == 15  # the default (256, 1) is a candidate: timed once
    assert entry["timings"][0][0] == [256, 1]
    assert all(ms > 0 and ms != float("inf") for _, ms, _ in entry["timings"])
    best_ms = min(ms for _, ms, _ in entry["timings"])
    chosen = next(ms for values, ms, _ in entry["timings"] if values == entry["best"])
    assert chosen <= entry["timings"][0][1]  # never slower than the default
    assert chosen <= best_ms / 0.99 + 1e-9
    assert "tuned tuned::scale" in first.stderr
    second = _run(code, tmp_path)
    assert "tuned tuned::scale" not in second.stderr
    assert json.loads(second.stdout.strip().splitlines()[-1]) == entries


@cuda
@pytest.mark.parametrize("mode", ["auto", "cold", "warm", "bogus"])
def test_kjit_tune_l2_says_how_candidates_are_timed(tmp_path, mode):
    """auto evicts the L2 before each timed run where the call's tensors span less than twice
    the L2 (a 24 MB call), not for a call that moves more (a 1 GiB one); cold always, warm never;
    anything else warns and means auto."""
    code = """
        for n in [3 << 20, 128 << 20]:
            x = torch.randn(n, device="cuda")
            assert torch.equal(tuned.scale(x, 2.0), x * 2.0)
    """
    stderr = _run(code, tmp_path, KJIT_LOG="debug", KJIT_TUNE_L2=mode).stderr
    lines = [line for line in stderr.splitlines() if "tuned::scale: BLOCK, VEC = " in line]
    assert len(lines) == 30, stderr[-3000:]  # 15 candidates of each of two buckets
    small, large = lines[:15], lines[15:]
    evicted = {"auto": (True, False), "bogus": (True, False), "cold": (True, True), "warm": (False, False)}[mode]
    for group, want in zip([small, large], evicted):
        assert all(("the L2 evicted" if want else "the L2 as left") in line for line in group), group
    assert ("none of 'auto', 'cold' and 'warm'" in stderr) == (mode == "bogus")


@cuda
def test_a_written_argument_is_written_once_and_workspaces_are_zeroed(tmp_path):
    result = _run(
        """
        x = torch.randn(1 << 20, device="cuda")
        y = torch.randn(1 << 20, device="cuda")
        expected = x + y
        assert tuned.add_(x, y) is x
        assert torch.equal(x, expected)
        z = torch.rand(5 << 20, device="cuda")
        torch.testing.assert_close(tuned.sum(z), z.sum(), rtol=1e-4, atol=1e-1)
        torch.testing.assert_close(tuned.sum(z), z.sum(), rtol=1e-4, atol=1e-1)
        print(len(kjit.tuning.entries()))
        """,
        tmp_path,
    )
    assert result.stdout.strip().splitlines()[-1] == "2"
    assert "tuned tuned::add_" in result.stderr and "tuned tuned::sum" in result.stderr


@cuda
def test_capture_and_kjit_autotune_0_take_the_default(tmp_path):
    captured = _run(
        """
        x = torch.randn(1 << 18, device="cuda")
        with kjit.tuning.using(tuned.scale, "default"):
            tuned.scale(x, 4.0)  # loads the default's kernel (no module loads while capturing)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = tuned.scale(x, 4.0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, x * 4.0)
        print(len(kjit.tuning.entries()))
        tuned.scale(x, 4.0)  # eager: tunes now
        print(len(kjit.tuning.entries()))
        """,
        tmp_path / "capture",
    )
    assert captured.stdout.strip().splitlines()[-2:] == ["0", "1"]
    off = _run(
        """
        x = torch.randn(1 << 18, device="cuda")
        assert torch.equal(tuned.scale(x, 4.0), x * 4.0)
        print(len(kjit.tuning.entries()))
        """,
        tmp_path / "off",
        KJIT_AUTOTUNE="0",
    )
    assert off.stdout.strip().splitlines()[-1] == "0"


@cuda
def test_kjit_tune_pretunes_shapes(tmp_path):
    env = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "kjit", "tune", str(PACKAGE), "--op", "scale", "--shape", "x=4096", "--shape",
         "x=65536x16", "--arg", "alpha=2.0", "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [r["op"] for r in report] == ["tuned::scale", "tuned::scale"]
    assert all(r["tuned_now"] and "skipped" not in r for r in report), report
    assert [r["bucket"] for r in report] != [report[0]["bucket"]] * 2  # two buckets
    again = subprocess.run(
        [sys.executable, "-m", "kjit", "tune", str(PACKAGE), "--op", "scale", "--shape", "x=4096", "--arg", "alpha=2.0",
         "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert again.returncode == 0, again.stderr
    assert not json.loads(again.stdout)[0]["tuned_now"]
    # An argument the schema needs and the command line does not give: nothing tuned, an error.
    missing = subprocess.run(
        [sys.executable, "-m", "kjit", "tune", str(PACKAGE), "--op", "scale", "--shape", "x=8192"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert missing.returncode == 1
    assert "needs argument 'alpha' (--arg alpha=VALUE)" in missing.stdout
    assert "no call could be made" in missing.stderr


def _shipped_cases():
    """(package, op, inputs maker, reference) for the shipped tuned ops."""

    def norm_inputs(dtype, rows=300, n=4096):
        x = torch.randn(rows, n, device="cuda", dtype=dtype)
        return (x, torch.randn(n, device="cuda", dtype=dtype))

    def rms_ref(x, w):
        xf = x.float()
        return ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w)

    def ln_ref(x, w):
        return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w.float(), None, 1e-5).to(x.dtype)

    def softmax_inputs(dtype):
        return (torch.randn(300, 3000, device="cuda", dtype=dtype),)

    # Short rows: the candidates of fewer than 32 threads a row, several rows a block.
    # Many rows: the LOOP candidates (fewer blocks than row groups, each looping with the next
    # group's loads in flight).
    def many_norm_inputs(dtype):
        return norm_inputs(dtype, 4096, 1024)

    def short_norm_inputs(dtype):
        x = torch.randn(300, 200, device="cuda", dtype=dtype)
        return (x, torch.randn(200, device="cuda", dtype=dtype))

    def short_softmax_inputs(dtype):
        return (torch.randn(300, 200, device="cuda", dtype=dtype),)

    # Rows past 4096 vectors: a cluster of blocks a row on sm_90 on (an unaligned one: VEC 1).
    def long_softmax_inputs(dtype):
        return (torch.randn(5, 100003, device="cuda", dtype=dtype) * 3,)

    def softmax_backward_inputs(dtype, rows=300, n=3000):
        y = torch.softmax(torch.randn(rows, n, device="cuda") * 3, -1).to(dtype)
        return (torch.randn(rows, n, device="cuda", dtype=dtype), y)

    def long_softmax_backward_inputs(dtype):
        return softmax_backward_inputs(dtype, 6, 70000)

    def softmax_backward_ref(grad, y):
        g, yf = grad.float(), y.float()
        return (yf * (g - (g * yf).sum(-1, keepdim=True))).to(y.dtype)

    def ce_inputs(dtype):
        logits = torch.randn(257, 32000, device="cuda", dtype=dtype)
        return (logits, torch.randint(0, 32000, (257,), device="cuda"))

    def ce_ref(logits, target):
        return torch.nn.functional.cross_entropy(logits.float(), target)

    def rotary_inputs(dtype):
        q = torch.randn(2, 300, 32, 128, device="cuda", dtype=dtype).transpose(1, 2)  # strided view
        k = torch.randn(2, 8, 300, 128, device="cuda", dtype=dtype)  # contiguous
        cos = torch.randn(1, 300, 128, device="cuda", dtype=dtype)
        return (q, k, cos, torch.randn_like(cos))

    def rotary_ref(q, k, cos, sin):
        def rot(x):
            x1, x2 = x.float().chunk(2, dim=-1)
            return torch.cat((-x2, x1), dim=-1)

        c, s = cos.float().unsqueeze(1), sin.float().unsqueeze(1)
        return ((q.float() * c + rot(q) * s).to(q.dtype), (k.float() * c + rot(k) * s).to(k.dtype))

    # The backward ops' candidates include rows split over a cluster of blocks (sm_90 on); long
    # rows give each block of a cluster several vectors a thread.
    def rms_backward_inputs(dtype, rows=300, n=4096):
        x, w = norm_inputs(dtype, rows, n)
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
        return (torch.randn_like(x), x, w, rstd)

    def rms_backward_ref(grad, x, w, rstd):
        xf = x.float().requires_grad_()
        wf = w.float().requires_grad_()
        # The llama casting mode, as the forward: the normalized x rounded to x's dtype before
        # the weight multiplies it, so dweight sums grad * (that rounded value).
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype).float() * wf
        dx, dw = torch.autograd.grad(y, (xf, wf), grad.float())
        return (dx.to(x.dtype), dw.to(w.dtype))

    def long_rms_backward_inputs(dtype):
        return rms_backward_inputs(dtype, 70, 16384)

    def ln_backward_inputs(dtype, rows=300, n=4096):
        x, w = norm_inputs(dtype, rows, n)
        mean = x.float().mean(-1)
        rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)
        return (torch.randn_like(x), x, w, mean, rstd)

    def ln_backward_ref(grad, x, w, mean, rstd):
        xf = x.float().requires_grad_()
        wf = w.float().requires_grad_()
        bf = torch.zeros_like(wf, requires_grad=True)
        y = torch.nn.functional.layer_norm(xf, (x.shape[-1],), wf, bf, 1e-5)
        dx, dw, db = torch.autograd.grad(y, (xf, wf, bf), grad.float())
        return (dx.to(x.dtype), dw.to(w.dtype), db.to(w.dtype))

    def long_ln_backward_inputs(dtype):
        return ln_backward_inputs(dtype, 70, 16384)

    return [
        ("norm", "rms_norm", norm_inputs, rms_ref),
        ("norm", "rms_norm_backward", rms_backward_inputs, rms_backward_ref),
        ("norm", "layer_norm", norm_inputs, ln_ref),
        ("norm", "layer_norm_backward", ln_backward_inputs, ln_backward_ref),
        ("norm", "rms_norm_backward", long_rms_backward_inputs, rms_backward_ref),
        ("norm", "layer_norm_backward", long_ln_backward_inputs, ln_backward_ref),
        ("norm", "rms_norm", short_norm_inputs, rms_ref),
        ("norm", "layer_norm", short_norm_inputs, ln_ref),
        ("norm", "rms_norm", many_norm_inputs, rms_ref),
        ("norm", "layer_norm", many_norm_inputs, ln_ref),
        ("softmax", "softmax", softmax_inputs, lambda x: torch.softmax(x.float(), -1).to(x.dtype)),
        ("softmax", "softmax", short_softmax_inputs, lambda x: torch.softmax(x.float(), -1).to(x.dtype)),
        ("softmax", "softmax", long_softmax_inputs, lambda x: torch.softmax(x.float(), -1).to(x.dtype)),
        ("softmax", "softmax_backward", softmax_backward_inputs, softmax_backward_ref),
        ("softmax", "softmax_backward", long_softmax_backward_inputs, softmax_backward_ref),
        ("softmax", "cross_entropy", ce_inputs, ce_ref),
        ("rotary", "apply_rotary", rotary_inputs, rotary_ref),
    ]


@cuda
@pytest.mark.parametrize("case", _shipped_cases(), ids=lambda c: f"{c[0]}.{c[1]}.{c[2].__name__}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_candidate_of_the_shipped_ops_is_right_and_deterministic(case, dtype):
    package, op, make, reference = case
    module = kjit.load(package)
    fn = getattr(module, op)
    args = make(dtype)
    expected = reference(*args)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    tried = small = clusters = loops = 0
    for config in kjit.tuning.candidates(fn):
        with kjit.tuning.using(fn, config):
            try:
                first = fn(*args)
            except ValueError as e:
                assert "fails tune_valid" in str(e), e
                continue
            again = fn(*args)
        tried += 1
        small += config.get("BLOCK", 1024) < 32
        clusters += config.get("CL", 1) > 1
        loops += config.get("GRID", 0) > 0
        pairs = zip(first, again) if isinstance(first, tuple) else [(first, again)]
        for a, b in pairs:
            assert torch.equal(a, b), f"{op} {config}: two runs differ"
        outs = first if isinstance(first, tuple) else (first,)
        refs = expected if isinstance(expected, tuple) else (expected,)
        for got, want in zip(outs, refs):
            torch.testing.assert_close(got, want, **tolerance, msg=lambda m: f"{op} {config}: {m}")
    assert tried >= 2
    assert small > 0 or not make.__name__.startswith("short"), "no candidate of < 32 threads a row ran"
    if "CL" in kjit.tuning.parameters(fn) and torch.cuda.get_device_capability() >= (9, 0):
        assert clusters > 0, "no candidate splitting rows over a cluster ran"
    assert loops > 0 or not make.__name__.startswith("many"), "no LOOP candidate ran"


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_candidate_of_fused_add_rms_norm_writes_the_same(dtype):
    """The in-place op on fresh copies for each candidate (both schedules, 4096 x 1024)."""
    fn = kjit.load("norm").fused_add_rms_norm
    x = torch.randn(4096, 1024, device="cuda", dtype=dtype)
    r = torch.randn_like(x)
    w = torch.randn(1024, device="cuda", dtype=dtype)
    s = (r.float() + x.float()).to(dtype)
    want = ((s.float() * torch.rsqrt(s.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype) * w, s)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    tried = loops = 0
    for config in kjit.tuning.candidates(fn):
        xs, rs = x.clone(), r.clone()
        with kjit.tuning.using(fn, config):
            try:
                fn(xs, rs, w)
            except ValueError as e:
                assert "fails tune_valid" in str(e), e
                continue
        tried += 1
        loops += config["GRID"] > 0
        torch.testing.assert_close(rs, want[1], rtol=0, atol=0, msg=lambda m: f"{config}: {m}")
        torch.testing.assert_close(xs, want[0], **tolerance, msg=lambda m: f"{config}: {m}")
    assert tried >= 2 and loops > 0
