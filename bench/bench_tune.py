"""Autotuning (Note [Tuning]) on one GPU, over a sweep of shapes: for each tuned op and shape,
the GPU time of the package's default rule, of the configuration kjit tuned at the first call,
and of every candidate (the exhaustive best), beside inductor's max-autotune (with coordinate
descent tuning) of the same formula and Liger's kernel, all timed alike in one process (CUDA
events around each call, median of 20, an L2-evicting memset before each: bench_kernels.py's
gpu_ms). Also the tuning's cost (seconds, from the store's entry) and, in a second process on the
same store, what the same calls cost there (nothing is tuned again). The first call of each
bucket comes first, so its cost includes compiling the candidates' kernels.

  python3 bench/bench_tune.py [--json FILE] [--ops rms_norm,softmax] [--quick] [--no-inductor]
                              [--l2 auto|warm|cold]

Done when (issue): tuned within 3% of the exhaustive best, never slower than the default, ahead
of the max-autotuned peer.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A store of its own: every bucket is tuned here, in this run (set before kjit is imported).
STORE = os.environ.setdefault("KJIT_CACHE_DIR", tempfile.mkdtemp(prefix="kjit-bench-tune-"))

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kjit  # noqa: E402
import kjit.tuning  # noqa: E402
from bench_kernels import FORMULAS, gpu_ms, kjit_systems, liger_systems, make_inputs  # noqa: E402
from bench_ops import try_peer  # noqa: E402

# op -> the kjit op that is tuned, and its sweep of (rows, hidden).
ROWS = [1, 16, 256, 4096, 65536]
HIDDEN = [128, 1024, 4096, 16384]
SWEEPS = {
    "rms_norm": ("norm::rms_norm", [(r, h) for r in ROWS for h in HIDDEN]),
    "layer_norm": ("norm::layer_norm", [(r, h) for r in ROWS for h in HIDDEN]),
    "softmax": ("softmax::softmax", [(r, h) for r in ROWS for h in HIDDEN]),
    "cross_entropy": ("softmax::cross_entropy", [(r, v) for r in [16, 256, 4096, 16384] for v in [32000, 128256]]),
    # rows are tokens (batches of 2048 positions), hidden the query's heads x 128.
    "rotary": ("rotary::apply_rotary", [(t, h) for t in [2048, 8192, 16384] for h in [1024, 4096]]),
}
QUICK = {"rms_norm": [(1, 4096), (4096, 1024), (65536, 4096)], "softmax": [(4096, 1024), (16, 16384)],
         "cross_entropy": [(4096, 32000)], "layer_norm": [(4096, 4096)], "rotary": [(8192, 4096)]}


def fits(op, rows, hidden):
    return rows * hidden <= (1 << 30) and not (op == "rotary" and rows % 2048)


def second_process(cases):
    """The same calls in a new process on the same store: its first-call wall time and the
    tuning entries it added (none expected)."""
    code = f"""
import json, sys, time, torch
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import kjit, kjit.tuning
from bench_kernels import kjit_systems, make_inputs
ours = kjit_systems()
before = len(kjit.tuning.entries())
spent = 0.0
for op, rows, hidden, dtype in {cases!r}:
    inputs = make_inputs(op, rows, hidden, getattr(torch, dtype))
    torch.cuda.synchronize()
    t = time.perf_counter()
    ours[op](*inputs)
    torch.cuda.synchronize()
    spent += time.perf_counter() - t
print(json.dumps({{"calls": len({cases!r}), "seconds": spent, "new_entries": len(kjit.tuning.entries()) - before}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, KJIT_CACHE_DIR=STORE), timeout=600)
    if result.returncode != 0:
        return {"error": result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--ops", help="only these, e.g. rms_norm,softmax")
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--quick", action="store_true", help="a few shapes per op")
    parser.add_argument("--no-inductor", action="store_true", help="skip the max-autotuned peer (slow to compile)")
    parser.add_argument("--l2", choices=["auto", "warm", "cold"], default="auto",
                        help="how the tuner times candidates (KJIT_TUNE_L2; the table's times are always L2-cold)")
    args = parser.parse_args()
    os.environ["KJIT_TUNE_L2"] = args.l2
    device = torch.cuda.get_device_name()
    print(f"device: {device}, torch {torch.__version__}, kjit {kjit.__version__}, store {STORE}", flush=True)
    import torch._inductor.config as inductor_config

    inductor_config.coordinate_descent_tuning = True
    ours, liger = kjit_systems(), liger_systems()
    only = set(args.ops.split(",")) if args.ops else None
    rows_out, cases = [], []
    started = time.time()

    def save():
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"device": device, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                 "tuner_l2": args.l2,
                 "rows": rows_out, "second_process": second, "seconds": time.time() - started}, indent=1))

    second = None
    for op, (qualified, sweep) in SWEEPS.items():
        if only and op not in only:
            continue
        fn = ours[op]
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            for rows, hidden in QUICK.get(op, []) if args.quick else sweep:
                if not fits(op, rows, hidden):
                    continue
                inputs = make_inputs(op, rows, hidden, dtype)
                row = {"op": op, "dtype": dtype_name, "rows": rows, "hidden": hidden, "ms": {}}
                call = lambda a: fn(*a)  # noqa: E731
                # First: the first call of the bucket, which compiles and times the candidates.
                before = {e["key"] for e in kjit.tuning.entries(qualified)}
                torch.cuda.synchronize()
                t = time.perf_counter()
                fn(*inputs)  # tunes this bucket
                torch.cuda.synchronize()
                row["first_call_s"] = time.perf_counter() - t
                new = [e for e in kjit.tuning.entries(qualified) if e["key"] not in before]
                if new:
                    row["tuned"] = dict(zip(new[0]["names"], new[0]["best"]))
                    row["tune_s"] = new[0]["seconds"]
                    row["candidates"] = len(new[0]["timings"])
                with kjit.tuning.using(qualified, "default"):
                    try_peer(row["ms"], "default", lambda: gpu_ms(call, inputs))
                best = None
                for config in kjit.tuning.candidates(qualified):
                    with kjit.tuning.using(qualified, config):
                        try:
                            fn(*inputs)
                        except ValueError:
                            continue  # tune_valid refuses it for these arguments
                        ms = gpu_ms(call, inputs)
                    if best is None or ms < best[0]:
                        best = (ms, config)
                if best:
                    row["ms"]["exhaustive best"] = best[0]
                    row["best"] = best[1]
                try_peer(row["ms"], "kjit tuned", lambda: gpu_ms(call, inputs))
                if liger and op in liger:
                    try_peer(row["ms"], "Liger", lambda: gpu_ms(lambda a: liger[op](*a), inputs))
                if not args.no_inductor:
                    compiled = torch.compile(FORMULAS[op], mode="max-autotune-no-cudagraphs", dynamic=False)
                    try_peer(row["ms"], "inductor max-autotune", lambda: gpu_ms(lambda a: compiled(*a), inputs))
                    torch._dynamo.reset()
                cases.append((op, rows, hidden, dtype_name))
                rows_out.append(row)
                ms = row["ms"]
                print(f"{op} {dtype_name} [{rows}, {hidden}]: "
                      + ", ".join(f"{k} {v * 1e3:.2f} us" for k, v in ms.items() if isinstance(v, float))
                      + f"; tuned {row.get('tuned')} in {row.get('tune_s', 0):.2f} s, best {row.get('best')}",
                      flush=True)
                del inputs
                save()
    second = second_process(cases)
    print(f"second process: {second}", flush=True)
    save()


if __name__ == "__main__":
    sys.exit(main())
