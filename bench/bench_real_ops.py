"""The per-call cost of the manifest features real kernels need, against an nvcc AOT extension
doing the same (bench/aot/optest_aot.cu), in one process on one GPU, measured in alternation:

  in place     optest.add_rms_(x!, residual!, weight, eps) -> (): two written arguments, no
               return, a computed template constant (BLOCK = min(next_pow2(hidden), 1024))
  optional     optest.bias_act(x, bias?, mode): the bias given and absent (compiled in or out),
               a str argument mapped to an integer
  launch list  launches.touch1_ and launches.touch8_ (one and eight launches of a tiny kernel in
               one op): the slope (t8 - t1) / 7 is what each extra launch in a list costs, against
               the same slope of n launches in a C++ loop, with <<<>>> and with raw cuLaunchKernel

Every result is checked against the peer's before it is timed. Shapes are tiny (4 x 48), so the
time is the host's, measured two ways: steady (rounds of 2000 calls, as bench_ops.py) and burst
(50 calls from an idle GPU, the synchronization left out).

  python3 bench/bench_real_ops.py --root DIR [--json FILE]   (DIR: where the AOT build goes)
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kjit  # noqa: E402
import peers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
AOT_SOURCE = ROOT / "bench" / "aot" / "optest_aot.cu"


def build_aot(build_dir):
    from torch.utils.cpp_extension import load

    os.makedirs(build_dir, exist_ok=True)
    load(name="kjit_bench_optest_aot", sources=[str(AOT_SOURCE)], is_python_module=False,
         extra_cuda_cflags=peers.NVCC_FLAGS, build_directory=str(build_dir), verbose=False)
    return torch.ops.aot_optest


def steady_us(fn, calls=2000):
    """Host time per call in a long run of calls, synchronized at the end (bench_ops.py's
    per-call measure): the GPU keeps up, as each call takes the host longer than the device."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def burst_us(fn, calls=50):
    """Host time per call of a burst of calls from an idle GPU, the synchronization left out: the
    calls of a program that waits between steps, on caches that the wait made cold."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def alternate(fns, measure, rounds):
    """`measure` of each named zero-argument function, alternating between the functions round by
    round after a warm-up round: medians over the rounds."""
    for fn in fns.values():
        measure(fn)
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(measure(fn))
    return {name: statistics.median(v) for name, v in samples.items()}


def summary(us):
    ratios = {
        "in place (add_rms_)": us["add_rms_ kjit"] / us["add_rms_ AOT"],
        "optional given (bias_act)": us["bias_act(bias) kjit"] / us["bias_act(bias) AOT"],
        "optional absent (bias_act)": us["bias_act(None) kjit"] / us["bias_act(None) AOT"],
    }
    slope = {name: (us[f"8 launches {name}"] - us[f"1 launch {name}"]) / 7
             for name in ("kjit", "<<<>>>", "cuLaunchKernel")}
    return ratios, slope


def check_same(name, ours, theirs):
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.cuda.get_device_name()
    print(f"device: {device}, torch {torch.__version__}, kjit {kjit.__version__}", flush=True)

    aot = build_aot(Path(args.root) / "optest_aot")
    kjit.load(ROOT / "tests" / "packages" / "optest")
    kjit.load(ROOT / "bench" / "packages" / "launches")
    optest, launches = torch.ops.optest, torch.ops.launches

    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    # The results first: the same inputs through both.
    x, r, w = randn(4, 48), randn(4, 48), randn(48)
    xa, ra = x.clone(), r.clone()
    optest.add_rms_(x, r, w, 1e-5)
    aot.add_rms_(xa, ra, w, 1e-5)
    check_same("add_rms_", (x, r), (xa, ra))
    bias = randn(48)
    for b in (bias, None):
        for mode in ("relu", "identity"):
            check_same("bias_act", (optest.bias_act(x, b, mode),), (aot.bias_act(x, b, mode),))
    counter = torch.zeros(1, device="cuda")
    launches.touch1_(counter)
    launches.touch8_(counter)
    aot.touch_(counter, 8)
    aot.touch_driver_(counter, 1)
    torch.cuda.synchronize()
    assert counter.item() == 18, counter.item()

    # Inputs that stay finite however often the in-place op runs on them.
    x, r, w = randn(4, 48), randn(4, 48), randn(48).abs() + 0.5
    fns = {
        "add_rms_ kjit": lambda: optest.add_rms_(x, r, w, 1e-5),
        "add_rms_ AOT": lambda: aot.add_rms_(x, r, w, 1e-5),
        "bias_act(bias) kjit": lambda: optest.bias_act(x, bias, "relu"),
        "bias_act(bias) AOT": lambda: aot.bias_act(x, bias, "relu"),
        "bias_act(None) kjit": lambda: optest.bias_act(x, None, "relu"),
        "bias_act(None) AOT": lambda: aot.bias_act(x, None, "relu"),
        "1 launch kjit": lambda: launches.touch1_(counter),
        "8 launches kjit": lambda: launches.touch8_(counter),
        "1 launch <<<>>>": lambda: aot.touch_(counter, 1),
        "8 launches <<<>>>": lambda: aot.touch_(counter, 8),
        "1 launch cuLaunchKernel": lambda: aot.touch_driver_(counter, 1),
        "8 launches cuLaunchKernel": lambda: aot.touch_driver_(counter, 8),
    }
    results = {}
    for mode, measure, rounds in [("steady", steady_us, 9), ("burst", burst_us, 300)]:
        us = alternate(fns, measure, rounds)
        ratios, slope = summary(us)
        results[mode] = {"per_call_us": us, "ratios": ratios, "launch_slope_us": slope}
        print(f"{mode}: per call (us)")
        for name, v in us.items():
            print(f"  {name:28s} {v:8.2f}")
        print(f"{mode}: kjit / AOT")
        for name, v in ratios.items():
            print(f"  {name:28s} {v:8.3f}x")
        print(f"{mode}: each extra launch (us)")
        for name, v in slope.items():
            print(f"  {name:28s} {v:8.2f}")
        print(f"  kjit over cuLaunchKernel     {slope['kjit'] - slope['cuLaunchKernel']:+8.2f}")
    assert torch.isfinite(x).all() and torch.isfinite(r).all()
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"device": device, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
             **results["steady"], "burst": results["burst"]}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
