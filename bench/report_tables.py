"""The tables of bench/RESULTS.md that read one run's JSON (bench_kernels.py, bench_tune.py):
the rows, the criteria they meet and the target rows they add; run_all.py assembles the report."""

import statistics


def kernel_row_met(row, copy, share):
    """A kernel-library row meets its target: kjit at `share` of copy and ahead of Liger and of
    torch.compile (each where it ran)."""
    ms = row["ms"]
    if "kjit" not in ms:
        return False
    ahead = all(ms["kjit"] <= ms[peer] for peer in ("Liger", "torch.compile") if peer in ms)
    return row["bytes"] / ms["kjit"] / 1e6 / copy >= share and ahead


def kernel_table_lines(kernels, command):
    """The GB/s table of one bench_kernels.py run and, where it has them, its host times."""
    copy_k = kernels["copy_gbps"]
    names = ["kjit", "Liger", "torch.compile", "kjit under torch.compile", "torch eager"]
    timing = ("GPU time per call with L2 evicted before each call and the host's queueing "
              "not counted (the GPU waits until the whole call is queued; host times are in "
              "the table after this one)" if kernels.get("timing") else
              "GPU time per call with L2 evicted before each call")
    lines = [f"{timing}, as GB/s and % of copy "
             f"({copy_k:.0f} GB/s). Measured on {kernels['device']} (torch {kernels['torch']}), "
             f"{kernels.get('date', '?')}, {command}. Best of each row in bold.", "",
             "| op | pass | dtype | rows x hidden | " + " | ".join(names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    for r in kernels["rows"]:
        ms = r["ms"]
        best = min(ms.values()) if ms else None
        cells = []
        for name in names:
            if name not in ms:
                cells.append("-")
                continue
            gbps = r["bytes"] / ms[name] / 1e6
            cell = f"{gbps:.0f} ({gbps / r.get('copy_gbps', copy_k):.0%})"  # a row of a later run: its own copy figure
            cells.append(f"**{cell}**" if ms[name] == best else cell)
        lines.append(f"| {r['op']} | {r['direction']} | {r['dtype']} | {r['rows']} x {r['hidden']} | "
                     + " | ".join(cells) + " |")
    hosted = [r for r in kernels["rows"] if r.get("host_ms")]
    if hosted:
        lines += ["", "Host time of a call (us, the GPU idle: from the call to its return, "
                  "median of 7) for the same rows. Where it exceeds the GPU time above, a "
                  "stream of such calls runs at the host's pace.", "",
                  "| op | pass | dtype | rows x hidden | " + " | ".join(names) + " |",
                  "|---|---|---|---|" + "---|" * len(names)]
        for r in hosted:
            cells = [f"{r['host_ms'][n] * 1e3:.0f}" if n in r["host_ms"] else "-" for n in names]
            lines.append(f"| {r['op']} | {r['direction']} | {r['dtype']} | {r['rows']} x "
                         f"{r['hidden']} | " + " | ".join(cells) + " |")
    return lines


def kernel_target_rows(kernels, where):
    """The target rows of one bench_kernels.py run; `where` names the run after each metric."""
    rows = []
    for size, share in [("large", 0.90), ("mid", 0.70)]:
        group = [r for r in kernels.get("rows", []) if r["size"] == size]
        if group:
            met = [r for r in group if kernel_row_met(r, r.get("copy_gbps", kernels["copy_gbps"]), share)]
            rows.append((f"kernel library, {size} shapes: >= {share:.0%} of copy and ahead of Liger and "
                         f"torch.compile{where}", f"{len(met)} of {len(group)} rows", "every row",
                         len(met) == len(group)))
    for size in ("large", "mid"):
        compiled = [r["ms"]["kjit under torch.compile"] / r["ms"]["kjit"] for r in kernels.get("rows", [])
                    if "kjit under torch.compile" in r["ms"] and "kjit" in r["ms"] and r["size"] == size]
        if compiled:
            what = ", GPU time" if kernels.get("timing") else ""
            rows.append((f"kernel library under torch.compile vs eager, {size} shapes{what}{where}",
                         f"median {statistics.median(compiled):.3f}x, worst {max(compiled):.3f}x",
                         "<= 1.05x", max(compiled) <= 1.05))
        host = [r["host_ms"]["kjit under torch.compile"] / r["host_ms"]["kjit"]
                for r in kernels.get("rows", []) if r["size"] == size
                and {"kjit under torch.compile", "kjit"} <= set(r.get("host_ms", {}))]
        if host:
            rows.append((f"kernel library under torch.compile vs eager, {size} shapes, host time{where}",
                         f"median {statistics.median(host):.3f}x, worst {max(host):.3f}x",
                         "<= 1.05x", max(host) <= 1.05))
    return rows


def tune_lines(tune, title="Autotuning (`bench_tune.py`)"):
    """The autotuning table (bench_tune.py): per op and shape, the default rule, the tuned
    configuration, the exhaustive best, the peers; then the criteria met and the second process."""
    rows = tune.get("rows") or []
    if not rows:
        return []
    lines = ["", f"## {title}", "",
             f"{tune['device']}, torch {tune['torch']}, {tune['date']}"
             + (f", {tune['command']}" if tune.get("command") else "") + ": GPU us per call (L2 evicted "
             "before each). Tuned: the configuration kjit chose at the bucket's first call; best: the "
             "fastest candidate timed one by one here; tune s: the time the tuner spent timing (its "
             f"candidates timed with the L2 {tune.get('tuner_l2', 'warm')}); first call s: the "
             "whole first call of the bucket, compiling the candidates included.", "",
             "| op | dtype | rows x hidden | default | kjit tuned | exhaustive best | tuned / best | "
             "tuned / default | inductor max-autotune | Liger | tune s | first call s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    within = never_slower = ahead = with_peer = ahead_liger = with_liger = 0

    def us(ms):
        return f"{ms * 1e3:.2f}" if isinstance(ms, float) else "-"

    def config(c):
        return " ".join(f"{k}={v}" for k, v in (c or {}).items())

    for r in rows:
        ms = r["ms"]
        tuned, best, default = ms.get("kjit tuned"), ms.get("exhaustive best"), ms.get("default")
        peer = ms.get("inductor max-autotune")
        ok_best = tuned is not None and best is not None and tuned <= best * 1.03
        ok_default = tuned is not None and default is not None and tuned <= default * 1.01
        within += ok_best
        never_slower += ok_default
        if peer is not None:
            with_peer += 1
            ahead += tuned is not None and tuned < peer
        if ms.get("Liger") is not None:
            with_liger += 1
            ahead_liger += tuned is not None and tuned < ms["Liger"]
        lines.append(
            f"| {r['op']} | {r['dtype']} | {r['rows']} x {r['hidden']} | {us(default)} | {us(tuned)} "
            f"({config(r.get('tuned'))}) | {us(best)} ({config(r.get('best'))}) | "
            + (f"{tuned / best:.3f}" if tuned and best else "-") + " | "
            + (f"{tuned / default:.3f}" if tuned and default else "-") + f" | {us(peer)}"
            + (f" ({peer / tuned:.2f}x)" if peer and tuned else "") + f" | {us(ms.get('Liger'))} | "
            + (f"{r['tune_s']:.2f}" if "tune_s" in r else "-") + " | "
            + (f"{r['first_call_s']:.2f}" if "first_call_s" in r else "-") + " |")
    peers = [f"ahead of inductor's max-autotune: {ahead} of {with_peer}"] if with_peer else []
    peers += [f"ahead of Liger: {ahead_liger} of {with_liger}"] if with_liger else []
    lines += ["", f"Tuned within 3% of the exhaustive best: {within} of {len(rows)}; no slower than "
              f"the default (1% noise): {never_slower} of {len(rows)}"
              + "".join(f"; {p}" for p in peers) + "."]
    # One second process per run; a file merged from several runs keeps a list (each with "runs").
    seconds = tune.get("second_process")
    for second in seconds if isinstance(seconds, list) else [seconds] if seconds else []:
        runs = f" ({second['runs']})" if second.get("runs") else ""
        if "calls" in second:
            lines.append(f"A second process on the same store{runs} made the same {second['calls']} "
                         f"calls' first calls in {second['seconds']:.2f} s in all, tuning "
                         f"{second['new_entries']} buckets (the store served every one).")
        else:
            lines.append(f"The second process{runs} failed: {second.get('error')}")
    return lines
