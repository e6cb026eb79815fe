"""Pre-warm throughput: `kjit warm` of every bundled package for every arch NVRTC supports, on an
empty cache each time, with 1, 2, 4 and 8 jobs (worker processes, the CLI's default). Speedup =
time with 1 job / time with N jobs.
Measured with NVRTC's automatic precompiled headers (the default) and without (KJIT_NVRTC_PCH=0).

  python3 bench/bench_warm.py --kjit PATH [--json FILE]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [str(ROOT / "kernels_src" / "img2gray"), str(ROOT / "kernels_src" / "activation")]
ARCHS = "sm_75,sm_80,sm_86,sm_87,sm_88,sm_89,sm_90,sm_100,sm_103,sm_110,sm_120,sm_121"  # all of NVRTC 13.0
JOBS = [1, 2, 4, 8]


def warm(kjit, jobs, pch):
    with tempfile.TemporaryDirectory(prefix="kjit-warm-bench-") as cache:
        env = dict(os.environ, KJIT_CACHE_DIR=cache, KJIT_NVRTC_PCH="1" if pch else "0")
        result = subprocess.run([kjit, "warm", *PACKAGES, "--arch", ARCHS, "-j", str(jobs)],
                                env=env, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"kjit warm -j {jobs}: exit {result.returncode}\n{result.stderr}")
        last = result.stdout.strip().splitlines()[-1]
        match = re.match(r"(\d+) compiled, 0 already cached, 0 failed, in ([0-9.]+) s", last)
        if not match:
            raise RuntimeError(f"kjit warm -j {jobs}: unexpected summary '{last}'")
        return int(match.group(1)), float(match.group(2))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kjit", required=True)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    for pch in [True, False]:
        for jobs in JOBS:
            kernels, seconds = warm(args.kjit, jobs, pch)
            one = seconds if jobs == 1 else next(r["seconds"] for r in rows
                                                 if r["pch"] == pch and r["jobs"] == 1)
            rows.append({"pch": pch, "jobs": jobs, "kernels": kernels, "seconds": seconds,
                         "speedup": one / seconds})
            print(f"PCH {'on ' if pch else 'off'} -j {jobs}: {kernels} kernels in {seconds:.2f} s, "
                  f"speedup {one / seconds:.2f}x ({one / seconds / jobs:.2f} x jobs)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"archs": ARCHS, "cores": os.cpu_count(),
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
