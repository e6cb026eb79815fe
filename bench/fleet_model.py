"""A model of a fleet's compiles and Redis traffic with and without kjit's remote tier.

    python3 bench/fleet_model.py [--hosts 1000 --kernels 200 --restarts 3 --outage 0.5]

Hosts are containers with ephemeral local stores: every (re)start begins with an empty store and
uses every kernel once soon after it starts. Starts are spread over a day (rolling restarts);
Redis is down for `--outage` hours in the middle of it. With the tier: a kernel is compiled by
the first host that misses it (the others wait for its entry: Note [Remote tier]), hosts that
start while Redis is down compile locally, and every other first use is one GET. Compile time
and entry size are the means measured on the H200 machine (bench/RESULTS.md). A model, not a
measurement: it counts events, it does not time Redis.
"""

import argparse
import random


def simulate(hosts, kernels, restarts, outage_h, compile_s, entry_kb, seed=1):
    rng = random.Random(seed)
    starts = sorted(rng.uniform(0, 24) for _ in range(hosts * (1 + restarts)))
    outage = (12.0, 12.0 + outage_h)
    without = {"compiles": len(starts) * kernels}
    compiled_remotely = set()
    compiles = gets = hits = 0
    for t in starts:
        down = outage[0] <= t < outage[1]
        for k in range(kernels):
            if down:
                compiles += 1  # the breaker is open: compile locally, no traffic
                continue
            gets += 1
            if k in compiled_remotely:
                hits += 1
            else:
                compiles += 1
                compiled_remotely.add(k)
    with_tier = {"compiles": compiles, "gets": gets, "hits": hits, "sets": len(compiled_remotely)}
    return {
        "starts": len(starts),
        "without": without,
        "with": with_tier,
        "nvrtc_hours_without": without["compiles"] * compile_s / 3600,
        "nvrtc_hours_with": compiles * compile_s / 3600,
        "redis_read_gb": hits * entry_kb / 1e6,
        "redis_write_mb": len(compiled_remotely) * entry_kb / 1e3,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--kernels", type=int, default=200)
    parser.add_argument("--restarts", type=int, default=3, help="restarts per host per day")
    parser.add_argument("--outage", type=float, default=0.5, help="hours Redis is down")
    parser.add_argument("--compile-s", type=float, default=0.8, help="mean cold compile")
    parser.add_argument("--entry-kb", type=float, default=25.0, help="mean entry size")
    args = parser.parse_args()
    r = simulate(args.hosts, args.kernels, args.restarts, args.outage, args.compile_s, args.entry_kb)
    print(f"| {args.hosts} hosts x {args.kernels} kernels, {r['starts']} starts in 24 h, Redis down "
          f"{args.outage} h | without the tier | with it |")
    print("| --- | --- | --- |")
    print(f"| NVRTC compiles | {r['without']['compiles']:,} | {r['with']['compiles']:,} |")
    print(f"| NVRTC time (at {args.compile_s} s each) | {r['nvrtc_hours_without']:,.1f} h | "
          f"{r['nvrtc_hours_with']:,.1f} h |")
    print(f"| Redis GETs (hits) | 0 | {r['with']['gets']:,} ({r['with']['hits']:,}) |")
    print(f"| Redis traffic ({args.entry_kb:.0f} KB entries) | 0 | {r['redis_read_gb']:.1f} GB read, "
          f"{r['redis_write_mb']:.1f} MB written |")


if __name__ == "__main__":
    main()
