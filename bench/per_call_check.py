"""Per call from Python: kjit's img2gray op against the AOT extension, side by side in one process
(9 alternating rounds of 2000 calls each, after 3 warm-up rounds; medians). A quick check of the
per-call target between full runs of bench_ops.py; run it in a few processes, as the machine's
speed drifts between processes far more than between the two systems inside one.

  python3 bench/per_call_check.py BUILD_DIR     (the AOT extension is built there, or reused)
"""

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import kjit  # noqa: E402
import peers  # noqa: E402
from bench_ops import per_call_us  # noqa: E402


def main():
    aot = peers.build_aot(os.path.join(sys.argv[1], "aot"))
    kjit.load("img2gray")
    ours = torch.ops.img2gray.img2gray
    x = torch.randint(0, 256, (4, 4, 3), dtype=torch.uint8, device="cuda")
    assert torch.equal(ours(x), aot(x))
    for fn in (ours, aot):
        for _ in range(3):
            per_call_us(fn, x, rounds=1)
    samples = {"kjit": [], "aot": []}
    for _ in range(9):
        samples["kjit"].append(per_call_us(ours, x, rounds=1))
        samples["aot"].append(per_call_us(aot, x, rounds=1))
    k, a = statistics.median(samples["kjit"]), statistics.median(samples["aot"])
    print(f"per call: kjit {k:.3f} us, AOT {a:.3f} us, ratio {k / a:.4f}")


if __name__ == "__main__":
    main()
