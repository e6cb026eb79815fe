"""Runs every benchmark on this machine's GPU and writes the report: bench/RESULTS.md and the
chart bench/results.png (copies of both, the JSON results and the logs go to --out).

  python3 bench/run_all.py --build BUILD_DIR --out DIR     (after a build and `pip install .`)
  python3 bench/run_all.py --report-only --out DIR         (rewrite the report from DIR's JSON;
                                                           bench/results/ holds this report's)
  --suites runtime,ops       runs some suites only (the report uses every JSON in DIR)
  --merge-kernels FILE ...   puts the rows of later bench_kernels.py runs (some --ops) into
                             DIR/kernels.json, each with its run's copy figure and date, in
                             place of the rows of the same op, pass, dtype and shape; the
                             runs must be on the device the table was measured on, timed
                             the same way
  DIR/kernels-NAME.json      a bench_kernels.py run kept apart (another device, or timed
                             another way): a table of its own after the main one; its
                             "command" key says how it was made, "superseded": true keeps
                             it out of the targets (a 'before' kept for comparison)

Suites: bench_runtime (C++: cold/warm first use, lookup, launch, header-heavy compiles),
bench_first_use.py (kjit and each peer in new processes), bench_ops.py (per call and
bandwidth, with the peers), bench_real_ops.py (per call of in-place and optional ops, and the
cost of each launch in an op's list, against an AOT extension), bench_kernels.py (the kernel
library against Liger, torch.compile and eager), bench_e2e.py (a ~1B Llama forward and
training step: eager, kjit.kernelize and Liger's patched model), bench_warm.py (`kjit warm` scaling with jobs), bench_remote.py (the
fleet tier against real redis-servers).
"""

import argparse
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from report_tables import kernel_table_lines, kernel_target_rows, tune_lines  # noqa: E402

SUITES = ["runtime", "first_use", "ops", "real_ops", "kernels", "tune", "e2e", "warm", "remote"]


def run(name, command, out):
    """Runs one suite, its output appended to DIR/bench.log and echoed."""
    header = f"== {name}: {' '.join(command)}\n"
    print(header, end="", flush=True)
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(out / "bench.log", "a") as log:
        log.write(header + result.stdout + f"== {name} exit {result.returncode}\n")
    print(result.stdout[-3000:] + f"== {name} exit {result.returncode}", flush=True)
    return result.returncode


def load(out, name):
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def fmt_s(seconds):
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def yes(ok):
    return "yes" if ok else "**no**"


PEER_ORDER = ["kjit", "AOT extension", "load_inline", "CuPy RawKernel", "Triton", "jiterator",
              "torch eager"]
FIRST_USE_NAMES = {"kjit": "kjit", "aot": "AOT extension (nvcc build)", "load_inline": "load_inline",
                   "cupy": "CuPy RawKernel", "triton": "Triton", "jiterator": "jiterator"}


def stored_note(out):
    path = out / "note.txt"
    return path.read_text().strip() if path.exists() else ""


def render(out, command, note=""):
    """The text of RESULTS.md from the JSON results in `out`."""
    runtime = load(out, "runtime") or []
    first = load(out, "first_use") or {}
    ops = load(out, "ops") or {}
    warm = load(out, "warm") or {}

    def rt(prefix):
        return next((r for r in runtime if r["metric"].startswith(prefix)), None)

    lines = ["# kjit benchmark results", ""]
    date_file = out / "date.txt"
    date = date_file.read_text().strip() if date_file.exists() else datetime.date.today().isoformat()
    device = ops.get("device", "?")
    lines += [
        f"Measured on {device} (torch {ops.get('torch', '?')}), "
        f"{date}, every comparison inside one run, side by side with "
        "its peer. Reproduce (builds, runs every suite, rewrites this file and `results.png`):",
        "", "```sh", command, "```", "",
        "The JSON results behind it are in `bench/results/`; "
        "`python3 bench/run_all.py --report-only --out bench/results` rewrites the report from them.",
        ""] + ([note, ""] if note else []) + ["![results](results.png)", ""]

    # Targets.
    rows = []
    cold = rt("cold first use")
    if cold:
        ratio = cold["value"] / cold["peer_value"]
        rows.append(("cold first use, request -> launchable (C++)",
                     f"{cold['value']:.2f} ms vs NVRTC {cold['peer_value']:.2f} ms = {ratio:.3f}x",
                     "<= 1.10x NVRTC", ratio <= 1.10))
    w = rt("warm first use")
    if w:
        rows.append(("warm first use, new process, request -> launchable (C++)",
                     f"{w['value']:.3f} ms (CUDA context {w['peer_value']:.0f} ms apart)", "<= 1 ms",
                     w["value"] <= 1))
    lookup = rt("in-process repeat lookup")
    if lookup:
        rows.append(("in-process repeat lookup", f"{lookup['value']:.3f} us", "<= 1 us",
                     lookup["value"] <= 1))
    per_call = ops.get("per_call_us", {})
    if "kjit" in per_call and "AOT extension" in per_call:
        ratio = per_call["kjit"] / per_call["AOT extension"]
        rows.append(("per call from Python, tiny image",
                     f"{per_call['kjit']:.2f} us vs AOT {per_call['AOT extension']:.2f} us = {ratio:.3f}x",
                     "<= 1.05x AOT", ratio <= 1.05))
    launch = rt("launch, host time")
    if launch:
        diff = launch["value"] - launch["peer_value"]
        rows.append(("C++ Kernel::launch vs raw cuLaunchKernel",
                     f"{launch['value']:.3f} vs {launch['peer_value']:.3f} us = +{diff:.3f} us",
                     "<= +0.3 us", diff <= 0.3))
    copy = ops.get("copy_gbps")
    bw = ops.get("img2gray_gbps", {})
    if copy and "kjit" in bw:
        share = bw["kjit"] / copy
        rows.append(("img2gray 64 MPixel bandwidth", f"{bw['kjit']:.0f} GB/s = {share:.1%} of copy "
                     f"({copy:.0f} GB/s), byte-exact", ">= 85% of copy", share >= 0.85))
    for a in ops.get("activations", []):
        gbps = a["bytes"] / a["kjit"] / 1e6
        rows.append((f"{a['op']} {a['dtype']} [16384, 2x8192]",
                     f"{gbps:.0f} GB/s = {gbps / copy:.1%} of copy; {a['torch eager'] / a['kjit']:.2f}x eager",
                     ">= 85% of copy, >= eager", gbps / copy >= 0.85 and a["kjit"] <= a["torch eager"]))
    real = load(out, "real_ops") or {}
    burst = real.get("burst", {})
    for name, ratio in real.get("ratios", {}).items():
        also = f" (burst {burst['ratios'][name]:.3f}x)" if burst else ""
        rows.append((f"per call from Python, {name}", f"{ratio:.3f}x AOT{also}", "<= 1.05x AOT",
                     ratio <= 1.05))
    slope = real.get("launch_slope_us")
    if slope:
        extra = slope["kjit"] - slope["cuLaunchKernel"]
        rows.append(("each extra launch in an op's list, host time",
                     f"{slope['kjit']:.2f} us vs raw cuLaunchKernel {slope['cuLaunchKernel']:.2f} us "
                     f"= {extra:+.2f} us", "<= +0.5 us", extra <= 0.5))
    kernels = load(out, "kernels") or {}
    rows += kernel_target_rows(kernels, "")
    for path in sorted(out.glob("kernels-*.json")):  # a later run's rows are targets too
        later = json.loads(path.read_text())
        if not later.get("superseded"):  # a 'before' kept for comparison is not a target
            rows += kernel_target_rows(later, f" ({later['device']}, `{path.name}`)")
    default = [r for r in warm.get("rows", []) if r["pch"]]
    if default:
        worst = min(r["speedup"] / r["jobs"] for r in default)
        text = ", ".join(f"{r['speedup']:.2f}x at {r['jobs']}" for r in default[1:])
        rows.append((f"`kjit warm` scaling ({default[0]['kernels']} kernels)", text,
                     ">= 0.7 x jobs up to 8", worst >= 0.7))
    heavy = rt("header-heavy")
    if heavy:
        ratio = heavy["peer_value"] / heavy["value"]
        rows.append(("header-heavy kernels, 2nd..Nth cold compile",
                     f"{heavy['value']:.0f} ms with PCH vs {heavy['peer_value']:.0f} ms without = {ratio:.1f}x",
                     ">= 3x faster", ratio >= 3))
    lines += ["## Against the targets", "", "| metric | measured | target | met |", "|---|---|---|---|"]
    lines += [f"| {m} | {v} | {t} | {yes(ok)} |" for m, v, t, ok in rows]

    if first:
        lines += ["", "## First use of img2gray in a new process (`bench_first_use.py`)", "",
                  "Request -> first result on the GPU, synchronized. *Cold*: every cache empty, so "
                  "each system compiles; *warm*: a new process on the caches the cold run left "
                  "(median of 3). Importing torch with making its CUDA context, and importing "
                  "the system's module, are measured apart.", "",
                  "| system | cold | warm | import of the module (apart) | torch import + CUDA context (apart) |",
                  "|---|---|---|---|---|"]
        for key, name in FIRST_USE_NAMES.items():
            r = first.get(key)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {name} | failed: {r['error']} | | | |")
            else:
                lines.append(f"| {name} | {fmt_s(r['cold_s'])} | {fmt_s(r['warm_s'])} | "
                             f"{fmt_s(r['import_s'])} | {fmt_s(r['context_s'])} |")

    if per_call:
        base = per_call.get("AOT extension")
        lines += ["", "## Per call from Python, 4x4 image (`bench_ops.py`)", "",
                  "| system | host time per call | vs AOT extension |", "|---|---|---|"]
        for name in PEER_ORDER:
            if name in per_call:
                lines.append(f"| {name} | {per_call[name]:.2f} us | "
                             f"{per_call[name] / base:.3f}x |" if base else f"| {name} | {per_call[name]:.2f} us | - |")
    by_device = ops.get("per_call_us_by_device") or {}
    if by_device:
        lines += ["", "Per call of kjit's op by device: " + ", ".join(
            f"{d} {us:.2f} us" for d, us in by_device.items()) + "."]
    if bw:
        lines += ["", "## img2gray bandwidth, 8192x8192 (64 MPixel), byte-exact", "",
                  f"Copy (1 GiB device-to-device, read + write counted): {copy:.0f} GB/s.", "",
                  "| system | GB/s | of copy |", "|---|---|---|"]
        for name in PEER_ORDER + [k for k in bw if k not in PEER_ORDER]:
            if name in bw:
                lines.append(f"| {name} | {bw[name]:.0f} | {bw[name] / copy:.1%} |")
    if ops.get("activations"):
        lines += ["", "## Gated activations, [16384, 2x8192]", "",
                  "| op | kjit | torch eager | jiterator | kjit of copy |", "|---|---|---|---|---|"]
        for a in ops["activations"]:
            jit = f"{a['jiterator']:.3f} ms" if "jiterator" in a else "-"
            lines.append(f"| {a['op']} {a['dtype']} | {a['kjit']:.3f} ms | {a['torch eager']:.3f} ms | "
                         f"{jit} | {a['bytes'] / a['kjit'] / 1e6 / copy:.1%} |")
    if real:
        us, bus = real["per_call_us"], real["burst"]["per_call_us"]
        lines += ["", "## Real-op features, per call from Python (`bench_real_ops.py`)", "",
                  "Test package optest's kernels through kjit and through an nvcc AOT extension "
                  "(`bench/aot/optest_aot.cu`) with the same checks, 4 x 48 float32; the launch "
                  "list is one op of bench/packages/launches with 1 and 8 launches of a tiny kernel, "
                  "against a C++ loop of launches. Host time per call, measured two ways, each in "
                  "alternation between the systems: *steady*, rounds of 2000 calls (as the per-call "
                  "rows above; the targets use it), and *burst*, 50 calls from an idle GPU. "
                  f"Measured on {real['device']} (torch {real['torch']}), {real.get('date', '?')}, "
                  "with `python3 bench/bench_real_ops.py --root DIR --json real_ops.json` (the "
                  "suite `real_ops` of run_all.py).", "",
                  "| call | kjit steady | AOT steady | ratio | kjit burst | AOT burst | ratio |",
                  "|---|---|---|---|---|---|---|"]
        for label, key in [("add_rms_(x!, residual!, weight, eps) -> ()", "add_rms_"),
                           ("bias_act(x, bias, \"relu\")", "bias_act(bias)"),
                           ("bias_act(x, None, \"relu\")", "bias_act(None)")]:
            k, a, bk, ba = us[f"{key} kjit"], us[f"{key} AOT"], bus[f"{key} kjit"], bus[f"{key} AOT"]
            lines.append(f"| {label} | {k:.2f} us | {a:.2f} us | {k / a:.3f}x | {bk:.2f} us | "
                         f"{ba:.2f} us | {bk / ba:.3f}x |")
        lines += ["", "| launches per call (steady) | kjit op | C++ loop, <<<>>> | C++ loop, cuLaunchKernel |",
                  "|---|---|---|---|"]
        for n, key in [(1, "1 launch"), (8, "8 launches")]:
            lines.append(f"| {n} | {us[key + ' kjit']:.2f} us | {us[key + ' <<<>>>']:.2f} us | "
                         f"{us[key + ' cuLaunchKernel']:.2f} us |")
        for label, s in [("each extra (slope), steady", real["launch_slope_us"]),
                         ("each extra (slope), burst", real["burst"]["launch_slope_us"])]:
            lines.append(f"| {label} | {s['kjit']:.2f} us | {s['<<<>>>']:.2f} us | "
                         f"{s['cuLaunchKernel']:.2f} us |")
    if kernels.get("rows"):
        lines += ["", "## Kernel library (`bench_kernels.py`)", ""]
        lines += kernel_table_lines(kernels, "with `python3 bench/bench_kernels.py --json kernels.json` "
                                    "(the suite `kernels` of run_all.py)")
    for path in sorted(out.glob("kernels-*.json")):  # later runs kept apart (another device or timing)
        later = json.loads(path.read_text())
        lines += ["", f"## Kernel library, a later run on {later['device']} (`{path.name}`)", ""]
        lines += kernel_table_lines(later, later.get("command", "with `python3 bench/bench_kernels.py`"))
    notes = HERE / "KERNELS_NOTES.md"  # after every kernel table: it reads them together
    if notes.exists() and (kernels.get("rows") or list(out.glob("kernels-*.json"))):
        lines += ["", notes.read_text().rstrip()]
    lines += tune_lines(load(out, "tune") or {})
    lines += tune_lines(load(out, "tune-sweep") or {}, "Autotuning, the full sweep (`tune-sweep.json`)")
    e2e = load(out, "e2e") or {}
    if e2e.get("forward") or e2e.get("training"):
        systems = ["torch eager", "kjit", "Liger"]
        lines += ["", "## End to end (`bench_e2e.py`)", "",
                  f"A Llama-style model of {e2e['params'] / 1e9:.2f}B parameters, bfloat16, "
                  f"{e2e['tokens']} tokens a step, on {e2e['device']} (torch {e2e['torch']}, "
                  f"transformers {e2e['transformers']}), {e2e['date']}"
                  + (f", {e2e['command']}" if e2e.get("command") else "") + ": tokens/s (and vs eager).", "",
                  "| pass | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
        for phase in ("forward", "training"):
            got = e2e.get(phase, {})
            base = got.get("torch eager")
            errors = e2e.get("errors", {})
            cells = [f"{got[n]:,.0f}" + (f" ({got[n] / base:.2f}x)" if base else "") if n in got
                     else f"failed: {errors[f'{phase} {n}']}" if f"{phase} {n}" in errors
                     else "not run" for n in systems]
            lines.append(f"| {phase} | " + " | ".join(cells) + " |")
        checks = e2e.get("checks", {})
        logits = {n: c for n, c in checks.items() if "top1_agreement" in c}
        gradients = {n.removesuffix(" gradients"): c for n, c in checks.items() if "max_relative_error" in c}
        if logits:
            lines += ["", "Forward logits against eager's: " + "; ".join(
                f"{n} relative error {c['relative_error']:.2e}, top-1 agreement {c['top1_agreement']:.4f}"
                for n, c in logits.items()) + "."]
        if gradients:
            lines += ["", "A training step's gradients against eager's, each parameter's relative error: " + "; ".join(
                f"{n} median {c['median_relative_error']:.2e}, max {c['max_relative_error']:.2e} ({c['worst']})"
                for n, c in gradients.items()) + "."]
    if warm.get("rows"):
        lines += ["", f"## Pre-warm throughput (`bench_warm.py`, {warm['cores']} cores)", "",
                  f"`kjit warm` of img2gray and activation for {warm['archs']}, empty cache each time.",
                  "", "| NVRTC PCH | jobs | kernels | time | speedup | speedup / jobs |",
                  "|---|---|---|---|---|---|"]
        for r in warm["rows"]:
            lines.append(f"| {'on (default)' if r['pch'] else 'off'} | {r['jobs']} | {r['kernels']} | "
                         f"{r['seconds']:.2f} s | {r['speedup']:.2f}x | {r['speedup'] / r['jobs']:.2f} |")
    if runtime:
        lines += ["", "## Runtime overheads, C++ (`bench_runtime.cpp`)", "",
                  "| metric | kjit | peer | ratio / difference | target |", "|---|---|---|---|---|"]
        lines += [f"| {r['metric']} | {r['kjit']} | {r['peer']} | {r['ratio']} | {r['target']} |"
                  for r in runtime]
    remote = load(out, "remote")
    if remote:
        what = "request -> launchable" if remote.get("gpu") else "request -> binary (no GPU)"
        lines += ["", "## Fleet tier (`bench_remote.py`, Redis on 127.0.0.1)", "",
                  "Each request is a new process's first, on the shipped activation kernel "
                  "(bfloat16; cuda_fp16.h and cuda_bf16.h), median of 7.", "",
                  "| metric | kjit | peer | ratio / difference | target |", "|---|---|---|---|---|",
                  f"| remote hit, new process, {what} | {remote['remote_ms']:.2f} ms | local hit "
                  f"{remote['local_ms']:.2f} ms | +{remote['remote_ms'] - remote['local_ms']:.2f} ms | <= +2 ms |",
                  f"| remote hit vs the cold compile it replaces | {remote['remote_ms']:.2f} ms | cold "
                  f"{remote['cold_ms']:.1f} ms | {remote['cold_ms'] / remote['remote_ms']:.0f}x faster | >= 20x |",
                  f"| remote hit, a new host's first process (empty store) | {remote['fresh_ms']:.2f} ms | "
                  f"local hit {remote['local_ms']:.2f} ms | +{remote['fresh_ms'] - remote['local_ms']:.2f} ms | - |",
                  f"| first use, Redis refusing connections | {remote['refused_ms']:.1f} ms | cold without "
                  f"a tier {remote['cold_ms']:.1f} ms | {remote['refused_ms'] - remote['cold_ms']:+.1f} ms | "
                  "<= +100 ms (connect timeout) |",
                  f"| first use, Redis hung (SIGSTOP), 100 ms timeout | {remote['hung_ms']:.1f} ms | cold "
                  f"without a tier {remote['cold_ms']:.1f} ms | {remote['hung_ms'] - remote['cold_ms']:+.1f} ms "
                  "| <= +100 ms and a little |",
                  f"| lookup while the breaker is open | {remote['open_us']:.3f} us | - | - | <= 1 us |"]
        if remote.get("note"):
            lines += ["", remote["note"]]
        lines += ["", "A model of a fleet (`python3 bench/fleet_model.py`; it counts events, it does "
                  "not time them):", "",
                  subprocess.run([sys.executable, str(HERE / "fleet_model.py")], capture_output=True,
                                 text=True).stdout.rstrip()]
    lines += ["", (HERE / "RESULTS_NOTES.md").read_text().rstrip()]
    return "\n".join(lines) + "\n"


def report(out, command, note=""):
    """Writes RESULTS.md and the chart."""
    (HERE / "RESULTS.md").write_text(render(out, command, note))
    first = load(out, "first_use") or {}
    ops = load(out, "ops") or {}
    chart(out, first, ops.get("per_call_us", {}), ops.get("img2gray_gbps", {}), ops.get("copy_gbps"),
          load(out, "warm") or {})
    if HERE.resolve() not in out.resolve().parents:  # beside the logs of a GPU run
        for name in ["RESULTS.md", "results.png"]:
            if (HERE / name).exists():
                shutil.copy(HERE / name, out / name)


def chart(out, first, per_call, bw, copy, warm):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing: no chart", flush=True)
        return
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    names = [k for k in FIRST_USE_NAMES if k in first and "error" not in first[k]]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [first[k]["cold_s"] for k in names], 0.4, label="cold (empty caches)")
    ax.bar([x + 0.2 for x in xs], [first[k]["warm_s"] for k in names], 0.4, label="warm (new process)")
    ax.set_xticks(list(xs), [FIRST_USE_NAMES[k].split(" (")[0] for k in names], rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (log)")
    ax.set_title("img2gray first use: request -> result")
    ax.legend()

    ax = axes[0][1]
    names = [n for n in PEER_ORDER if n in per_call]
    ax.bar(names, [per_call[n] for n in names], color=["C2" if n == "kjit" else "C7" for n in names])
    if "AOT extension" in per_call:
        ax.axhline(per_call["AOT extension"] * 1.05, color="C3", linestyle="--", label="1.05x AOT")
        ax.legend()
    ax.set_ylabel("us per call")
    ax.set_title("per call from Python, 4x4 image")
    ax.tick_params(axis="x", rotation=20)

    ax = axes[1][0]
    names = [n for n in PEER_ORDER if n in bw] + [n for n in bw if n not in PEER_ORDER]
    ax.barh([n.replace(" (AOT, readable kernel)", "\n(readable kernel)") for n in names],
            [100 * bw[n] / copy for n in names], color=["C2" if n == "kjit" else "C7" for n in names])
    ax.axvline(85, color="C3", linestyle="--", label="85% target")
    ax.set_xlabel("% of device-to-device copy bandwidth")
    ax.set_title("img2gray, 64 MPixel")
    ax.invert_yaxis()
    ax.legend()

    ax = axes[1][1]
    for pch, label in [(True, "NVRTC PCH on (default)"), (False, "PCH off")]:
        rows = [r for r in warm.get("rows", []) if r["pch"] == pch]
        ax.plot([r["jobs"] for r in rows], [r["speedup"] for r in rows], marker="o", label=label)
    jobs = [1, 2, 4, 8]
    ax.plot(jobs, jobs, color="C7", linestyle=":", label="ideal")
    ax.plot(jobs, [0.7 * j for j in jobs], color="C3", linestyle="--", label="0.7 x jobs target")
    ax.set_xlabel("jobs")
    ax.set_ylabel("speedup over 1 job")
    ax.set_title("kjit warm throughput")
    ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "results.png", dpi=90)


def merge_kernels(out, paths):
    """Rows of later bench_kernels.py runs into out/kernels.json (see the module's doc)."""
    base = load(out, "kernels")
    if base is None:
        sys.exit(f"{out / 'kernels.json'}: missing; a merge needs the table it goes into")
    for path in paths:
        run = json.loads(Path(path).read_text())
        if run["device"] != base["device"]:
            sys.exit(f"{path}: measured on {run['device']}, the table on {base['device']}: not merged")
        if run.get("timing") != base.get("timing"):
            sys.exit(f"{path}: timed as {run.get('timing') or 'host and GPU together'}, the table as "
                     f"{base.get('timing') or 'host and GPU together'}: not merged")
        key = lambda r: (r["op"], r["direction"], r["dtype"], r["rows"], r["hidden"])  # noqa: E731
        new = {key(r): dict(r, copy_gbps=run["copy_gbps"], date=run["date"]) for r in run["rows"]}
        replaced = [key(r) for r in base["rows"] if key(r) in new]
        base["rows"] = [new.pop(key(r)) if key(r) in new else r for r in base["rows"]] + list(new.values())
        print(f"{path}: {len(replaced) + len(new)} rows, {len(replaced)} of them in place of earlier ones")
    (out / "kernels.json").write_text(json.dumps(base, indent=1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", required=True)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--command", default="scripts/gpu-check bench")
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--note", default="", help="a line for the report (e.g. which runs)")
    parser.add_argument("--merge-kernels", nargs="+", metavar="FILE", default=[],
                        help="rows of later bench_kernels.py runs, into DIR/kernels.json")
    args = parser.parse_args()
    suites = args.suites.split(",")
    unknown = set(suites) - set(SUITES)
    if unknown:
        parser.error(f"unknown suites {sorted(unknown)}; choose from {SUITES}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge_kernels:
        merge_kernels(out, args.merge_kernels)
    if not args.report_only:
        build = Path(args.build)
        root = Path(tempfile.mkdtemp(prefix="kjit-bench-"))
        py = sys.executable
        if "runtime" in suites:
            run("runtime", [str(build / "bench" / "kjit_bench_runtime"), "--json",
                            str(out / "runtime.json")], out)
        if "remote" in suites:
            run("remote", [py, str(HERE / "bench_remote.py"), "--build", str(build), "--json",
                           str(out / "remote.json")], out)
        if "first_use" in suites:
            run("first_use", [py, str(HERE / "bench_first_use.py"), "--root", str(root), "--json",
                              str(out / "first_use.json")], out)
        if "ops" in suites:
            run("ops", [py, str(HERE / "bench_ops.py"), "--root", str(root), "--json",
                        str(out / "ops.json")], out)
        if "real_ops" in suites:
            run("real_ops", [py, str(HERE / "bench_real_ops.py"), "--root", str(root), "--json",
                             str(out / "real_ops.json")], out)
        if "kernels" in suites:
            run("kernels", [py, str(HERE / "bench_kernels.py"), "--json", str(out / "kernels.json")], out)
        if "tune" in suites:
            run("tune", [py, str(HERE / "bench_tune.py"), "--json", str(out / "tune.json")], out)
        if "e2e" in suites:
            run("e2e", [py, str(HERE / "bench_e2e.py"), "--json", str(out / "e2e.json")], out)
        if "warm" in suites:
            run("warm", [py, str(HERE / "bench_warm.py"), "--kjit", str(build / "tools" / "kjit"),
                         "--json", str(out / "warm.json")], out)
        shutil.rmtree(root, ignore_errors=True)
        (out / "date.txt").write_text(datetime.date.today().isoformat() + "\n")
        (out / "note.txt").unlink(missing_ok=True)
        results = HERE / "results"  # the repository keeps the JSON behind its report
        results.mkdir(exist_ok=True)
        for path in [out / f"{name}.json" for name in SUITES] + [out / "date.txt"]:
            if path.exists():
                shutil.copy(path, results / path.name)
    report(out, args.command, args.note or stored_note(out))
    print((HERE / "RESULTS.md").read_text())


if __name__ == "__main__":
    sys.exit(main())
