"""Where the first use of img2gray from Python goes, with a warm store: import kjit, kjit.load,
the first call (and a second one), each in a new process after torch and its CUDA context are up;
then the loads of the kernel-library packages kjit.kernelize uses (their manifests are the large
ones: norm and softmax declare hundreds of specializations).
Prints three plain runs, one with KJIT_LOG=debug (the C++ side times the store opening, NVRTC's
identity, the binary and the module load), one under cProfile and one with -X importtime.

  python3 bench/profile_first_use.py [CACHE_DIR]
"""

import os
import subprocess
import sys

CHILD = r'''
import os, time
T = time.perf_counter
import torch
torch.empty(1, device="cuda"); torch.cuda.synchronize()
tiny = torch.randint(0, 256, (4, 4, 3), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
import cProfile, pstats
profile = cProfile.Profile() if os.environ.get("PROFILE") == "1" else None
if profile:
    profile.enable()
t0 = T()
import kjit
import kjit._api
t1 = T()
kjit.load("img2gray")
t2 = T()
torch.ops.img2gray.img2gray(tiny); torch.cuda.synchronize()
t3 = T()
torch.ops.img2gray.img2gray(tiny); torch.cuda.synchronize()
t4 = T()
if profile:
    profile.disable()
print(f"import {1e3*(t1-t0):.2f} ms, load {1e3*(t2-t1):.2f} ms, first call {1e3*(t3-t2):.2f} ms "
      f"(second {1e3*(t4-t3):.3f} ms): {1e3*(t3-t0):.2f} ms", flush=True)
loads = []
for name in ("norm", "activation", "rotary", "softmax"):
    t5 = T()
    kjit.load(name)
    loads.append(f"{name} {1e3*(T()-t5):.2f} ms")
print("kernel-library loads: " + ", ".join(loads), flush=True)
if profile:
    pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
'''


def run(env, extra=(), args=()):
    result = subprocess.run([sys.executable, *args, "-c", CHILD], env={**env, **dict(extra)},
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    return result.stdout, result.stderr


def main():
    cache = sys.argv[1] if len(sys.argv) > 1 else "/tmp/kjit-first-use-cache"
    env = dict(os.environ, KJIT_CACHE_DIR=cache)
    run(env)  # fills the store
    for _ in range(3):
        print("\n".join(run(env)[0].splitlines()[:2]))
    out, err = run(env, {"KJIT_LOG": "debug"})
    print("\n".join(out.splitlines()[:2]) + "\n" + err)
    print(run(env, {"PROFILE": "1"})[0])
    _, err = run(env, args=["-X", "importtime"])
    print("\n".join(line for line in err.splitlines() if "kjit" in line))


if __name__ == "__main__":
    main()
