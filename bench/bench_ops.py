"""kjit ops against their peers (bench/peers.py), in one process on one GPU:

  per call     host time per call from Python on a 4x4 image: kjit op, AOT extension op,
               load_inline function, CuPy RawKernel, Triton, jiterator, torch eager
  img2gray     bandwidth at 8192x8192 (64 MPixel) against the device-to-device copy, results
               checked byte-exact against torch eager
  activations  silu_and_mul / gelu_and_mul (fp16, bf16, [16384, 2x8192]) against torch eager and
               jiterator, and the copy

  python3 bench/bench_ops.py --root DIR [--json FILE]   (DIR: builds of bench_first_use.py)
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kjit  # noqa: E402
import peers  # noqa: E402


def per_call_us(fn, arg, calls=2000, rounds=7):
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


def interleaved(fns, repeats=5):
    """Per-call times of several (fn, arg) measured in alternation, medians of the repeats."""
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, (fn, arg) in fns.items():
            samples[name].append(per_call_us(fn, arg))
    return {name: statistics.median(v) for name, v in samples.items()}


def gpu_ms(fn, arg, iters=50):
    """Median of CUDA-event times of single calls, after warm-up."""
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


def try_peer(results, name, make):
    try:
        results[name] = make()
    except Exception as e:  # a peer that fails is reported, not fatal
        print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--json")
    args = parser.parse_args()
    root = Path(args.root)
    device = torch.cuda.get_device_name()
    print(f"device: {device}, torch {torch.__version__}, kjit {kjit.__version__}", flush=True)

    kjit.load("img2gray")
    activation = kjit.load("activation")
    img2gray = {"kjit": torch.ops.img2gray.img2gray, "torch eager": peers.eager_img2gray}
    try_peer(img2gray, "AOT extension", lambda: peers.build_aot(root / "aot"))
    try_peer(img2gray, "load_inline", lambda: peers.build_load_inline(root / "inline"))
    try_peer(img2gray, "CuPy RawKernel", peers.CupyImg2gray)
    try_peer(img2gray, "Triton", peers.make_triton_img2gray)
    try_peer(img2gray, "jiterator", peers.make_jiterator_img2gray)

    def argument(name, image):
        if name == "CuPy RawKernel":
            import cupy

            return cupy.asarray(image)
        return image

    def as_torch(name, out):
        return torch.as_tensor(out, device="cuda") if name == "CuPy RawKernel" else out

    # Per call, tiny image: every peer that gives the right answer, in alternation.
    tiny = torch.randint(0, 256, (4, 4, 3), dtype=torch.uint8, device="cuda")
    expected = peers.eager_img2gray(tiny)
    for name in list(img2gray):
        try:
            ok = torch.equal(as_torch(name, img2gray[name](argument(name, tiny))), expected)
        except Exception as e:  # a peer that cannot run this is reported, not fatal
            print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0]}; left out", flush=True)
            ok = None
        if not ok:
            if ok is False:
                print(f"{name}: wrong result on the tiny image; left out", flush=True)
            del img2gray[name]
    per_call = interleaved({name: (fn, argument(name, tiny)) for name, fn in img2gray.items()})
    per_device = {}
    if torch.cuda.device_count() >= 2:
        # The same op on every device: the device guard and per-device slot cost the same.
        per_device = interleaved({f"cuda:{i}": (torch.ops.img2gray.img2gray, tiny.to(f"cuda:{i}"))
                                  for i in range(torch.cuda.device_count())})

    # Bandwidth at 64 MPixel.
    copy = copy_gbps(1 << 30)
    h = w = 8192
    image = torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, device="cuda")
    expected = peers.eager_img2gray(image)
    fns = dict(img2gray)
    if "AOT extension" in img2gray:
        fns["one thread per pixel (AOT, readable kernel)"] = torch.ops.aot.img2gray_naive
    bandwidth = {}
    for name, fn in fns.items():
        arg = argument(name, image)
        if not torch.equal(as_torch(name, fn(arg)), expected):
            print(f"{name}: wrong result at 64 MPixel; left out", flush=True)
            continue
        bandwidth[name] = h * w * 4 / gpu_ms(fn, arg) / 1e6
        del arg

    activations = []
    acts = {"silu_and_mul": (peers.eager_silu_and_mul, peers.JITERATOR_SILU),
            "gelu_and_mul": (peers.eager_gelu_and_mul, peers.JITERATOR_GELU)}
    for dtype in [torch.float16, torch.bfloat16]:
        x = torch.randn(16384, 2 * 8192, dtype=dtype, device="cuda")
        nbytes = x.numel() * x.element_size() * 3 // 2
        for op_name, (eager, code) in acts.items():
            row = {"op": op_name, "dtype": str(dtype)[6:], "bytes": nbytes}
            ref = eager(x)
            systems = {"kjit": getattr(activation, op_name), "torch eager": eager}
            try_peer(systems, "jiterator", lambda: peers.make_jiterator_act(code))
            for name, fn in systems.items():
                try:
                    torch.testing.assert_close(fn(x), ref, atol=2e-2, rtol=2e-2)
                except Exception as e:
                    if name == "kjit":
                        raise
                    print(f"{op_name} {name}: {type(e).__name__}: {str(e).splitlines()[0]}; left out")
                    continue
                row[name] = gpu_ms(fn, x)
            activations.append(row)
            del ref

    print(f"\ncopy {copy:.0f} GB/s\nper call (us):", flush=True)
    for name, us in per_call.items():
        print(f"  {name:45s} {us:8.2f}")
    for name, us in per_device.items():
        print(f"  kjit on {name:37s} {us:8.2f}")
    print("img2gray 64 MPixel (GB/s, % of copy):")
    for name, gbps in bandwidth.items():
        print(f"  {name:45s} {gbps:8.0f}  {gbps / copy:6.1%}")
    print("activations (ms):")
    for row in activations:
        print(f"  {row['op']} {row['dtype']}: " + ", ".join(
            f"{k} {row[k]:.3f} ({row['bytes'] / row[k] / 1e6 / copy:.1%} of copy)"
            for k in row if k not in ("op", "dtype", "bytes")))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"device": device, "torch": torch.__version__, "copy_gbps": copy, "per_call_us": per_call,
             "img2gray_gbps": bandwidth, "activations": activations,
             "per_call_us_by_device": per_device}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
