"""kjit ops against their peers, in one process on one GPU:

  per-call overhead  kjit op vs the same kernel in an AOT torch extension (nvcc, kernel-builder
                     style) vs torch eager, on a tiny image; calls from Python
  img2gray           bandwidth at 64 MPixel vs the device-to-device copy
  activations        silu_and_mul / gelu_and_mul (fp16, bf16) vs torch eager and the copy

  python3 bench/bench_ops.py [--json FILE]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import kjit

HERE = Path(__file__).resolve().parent


def build_aot():
    from torch.utils.cpp_extension import load

    start = time.perf_counter()
    load(
        name="kjit_bench_aot",
        sources=[str(HERE / "aot" / "img2gray_aot.cu")],
        is_python_module=False,
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"],
        build_directory=tempfile.mkdtemp(prefix="kjit-aot-"),
        verbose=False,
    )
    return time.perf_counter() - start


def per_call_us(fn, arg, calls=2000, rounds=31):
    """Median over rounds of host time per call; each round ends synchronized."""
    results = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(arg)
        torch.cuda.synchronize()
        results.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(results)


def interleaved(fns, arg, repeats=5):
    """Per-call times of several functions measured in alternation, medians of repeats."""
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(per_call_us(fn, arg, calls=2000, rounds=7))
    return {name: statistics.median(v) for name, v in samples.items()}


def gpu_ms(fn, arg, iters=50):
    for _ in range(3):
        fn(arg)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn(arg)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def copy_gbps(nbytes):
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = gpu_ms(lambda s: dst.copy_(s), src)
    return 2 * nbytes / ms / 1e6


def eager_img2gray(image):
    rgb = image.to(torch.int32)
    return ((77 * rgb[..., 0] + 150 * rgb[..., 1] + 29 * rgb[..., 2] + 128) >> 8).to(torch.uint8)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    device = torch.cuda.get_device_name()
    print(f"device: {device}, torch {torch.__version__}, kjit {kjit.__version__}", flush=True)

    aot_build_s = build_aot()
    img2gray = kjit.load("img2gray")
    activation = kjit.load("activation")
    kjit_op = torch.ops.img2gray.img2gray
    aot_op = torch.ops.aot.img2gray

    tiny = torch.randint(0, 256, (4, 4, 3), dtype=torch.uint8, device="cuda")
    assert torch.equal(kjit_op(tiny), aot_op(tiny))
    times = interleaved({"kjit": kjit_op, "aot": aot_op, "eager": eager_img2gray}, tiny)
    rows.append(
        {
            "metric": "per-call, img2gray op from Python, 4x4 image",
            "kjit": f"{times['kjit']:.2f} us",
            "peer": f"AOT extension {times['aot']:.2f} us; torch eager {times['eager']:.2f} us",
            "ratio": f"{times['kjit'] / times['aot']:.3f}x AOT",
            "target": "<= 1.05x AOT",
        }
    )

    copy = copy_gbps(1 << 30)
    h = w = 8192
    image = torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, device="cuda")
    assert torch.equal(kjit_op(image), aot_op(image))
    nbytes = h * w * 4
    for name, fn in [("kjit", kjit_op), ("AOT extension", aot_op), ("torch eager", eager_img2gray)]:
        ms = gpu_ms(fn, image)
        gbps = nbytes / ms / 1e6
        rows.append(
            {
                "metric": f"img2gray 8192x8192 (64 MPixel), {name}",
                "kjit": f"{ms:.3f} ms, {gbps:.0f} GB/s",
                "peer": f"copy {copy:.0f} GB/s",
                "ratio": f"{gbps / copy:.1%} of copy",
                "target": ">= 85% of copy" if name == "kjit" else "-",
            }
        )

    for dtype in [torch.float16, torch.bfloat16]:
        x = torch.randn(16384, 2 * 8192, dtype=dtype, device="cuda")
        nbytes = x.numel() * x.element_size() * 3 // 2
        for op_name, ref in [
            ("silu_and_mul", lambda t: F.silu(t[..., : t.shape[-1] // 2]) * t[..., t.shape[-1] // 2 :]),
            ("gelu_and_mul", lambda t: F.gelu(t[..., : t.shape[-1] // 2]) * t[..., t.shape[-1] // 2 :]),
        ]:
            op = getattr(activation, op_name)
            k_ms = gpu_ms(op, x)
            e_ms = gpu_ms(ref, x)
            rows.append(
                {
                    "metric": f"{op_name} {str(dtype)[6:]} [16384, 2x8192]",
                    "kjit": f"{k_ms:.3f} ms, {nbytes / k_ms / 1e6:.0f} GB/s",
                    "peer": f"torch eager {e_ms:.3f} ms",
                    "ratio": f"{e_ms / k_ms:.2f}x eager; {nbytes / k_ms / 1e6 / copy:.1%} of copy",
                    "target": ">= 85% of copy, >= eager",
                }
            )

    print(f"\nAOT extension build (nvcc, cpp_extension.load): {aot_build_s:.1f} s")
    print("\n| metric | kjit | peer | ratio | target |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['metric']} | {r['kjit']} | {r['peer']} | {r['ratio']} | {r['target']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "aot_build_s": aot_build_s, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
