"""First use of img2gray in a new process, kjit against each peer, cold (empty caches: every
system compiles) and warm (a new process on the caches the cold run left).

Each measurement is a child process: torch is imported and its CUDA context made first (reported
apart), then the system's module import (apart), then the timed part: request -> first result, synchronized
(kjit: kjit.load + the op's first call; AOT: cpp_extension.load + call; load_inline: the same;
CuPy: RawKernel + call; Triton: first call of the jitted function; jiterator: _create_jit_fn +
call). Every cache is pointed at a folder of this run: KJIT_CACHE_DIR, build folders,
CUPY_CACHE_DIR, TRITON_CACHE_DIR, PYTORCH_KERNEL_CACHE_PATH.

  python3 bench/bench_first_use.py --root DIR [--json FILE]
  (leaves the AOT and load_inline builds in DIR/aot and DIR/inline for bench_ops.py)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SYSTEMS = ["kjit", "aot", "load_inline", "cupy", "triton", "jiterator"]
WARM_RUNS = 3


def child(system, root):
    start = time.perf_counter()
    import torch

    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    context_s = time.perf_counter() - start
    sys.path.insert(0, str(HERE))
    import peers

    tiny = torch.randint(0, 256, (4, 4, 3), dtype=torch.uint8, device="cuda")
    expected = peers.eager_img2gray(tiny)
    start = time.perf_counter()
    if system == "kjit":
        import kjit
    elif system == "cupy":
        import cupy
    elif system == "triton":
        import triton  # noqa: F401
    elif system in ("aot", "load_inline"):
        import torch.utils.cpp_extension  # noqa: F401
    import_s = time.perf_counter() - start

    start = time.perf_counter()
    if system == "kjit":
        kjit.load("img2gray")
        out = torch.ops.img2gray.img2gray(tiny)
    elif system == "aot":
        out = peers.build_aot(Path(root) / "aot")(tiny)
    elif system == "load_inline":
        out = peers.build_load_inline(Path(root) / "inline")(tiny)
    elif system == "cupy":
        out = torch.as_tensor(peers.CupyImg2gray()(cupy.asarray(tiny)), device="cuda")
    elif system == "triton":
        out = peers.make_triton_img2gray()(tiny)
    elif system == "jiterator":
        out = peers.make_jiterator_img2gray()(tiny)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    assert torch.equal(out.cpu(), expected.cpu()), f"{system}: wrong result"
    print(json.dumps({"context_s": context_s, "import_s": import_s, "first_s": first_s}))


def run_child(system, root, env):
    result = subprocess.run([sys.executable, __file__, "--child", system, "--root", str(root)],
                            env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"{system}: exit {result.returncode}\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--root", required=True)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.root)

    root = Path(args.root)
    env = dict(os.environ)
    env.update(KJIT_CACHE_DIR=str(root / "kjit-cache"), CUPY_CACHE_DIR=str(root / "cupy-cache"),
               TRITON_CACHE_DIR=str(root / "triton-cache"),
               PYTORCH_KERNEL_CACHE_PATH=str(root / "torch-kernels"))
    results = {}
    for system in SYSTEMS:
        try:
            cold = run_child(system, root, env)
            warm = [run_child(system, root, env) for _ in range(WARM_RUNS)]
            results[system] = {
                "cold_s": cold["first_s"],
                "warm_s": statistics.median(w["first_s"] for w in warm),
                "import_s": statistics.median(w["import_s"] for w in warm),
                "context_s": statistics.median([cold["context_s"]] + [w["context_s"] for w in warm]),
            }
        except Exception as e:  # a peer that fails is reported, not fatal
            results[system] = {"error": str(e).splitlines()[0]}
        r = results[system]
        print(f"{system:12s} " + ("error: " + r["error"] if "error" in r else
              f"cold {r['cold_s'] * 1e3:9.1f} ms  warm {r['warm_s'] * 1e3:8.2f} ms  "
              f"(import {r['import_s'] * 1e3:.1f} ms, CUDA context {r['context_s'] * 1e3:.0f} ms, apart)"),
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
