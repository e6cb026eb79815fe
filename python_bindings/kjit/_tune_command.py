"""`kjit tune PACKAGE --shape ...`: pre-tunes ops on this machine's GPU (Note [Tuning]).

Each --shape is one call of each op: its tensors made as named (float dtypes filled with
normal samples, integer ones with zeros, valid class or position indices), its other arguments
from --arg or the schema's defaults. The call tunes its bucket unless the stores already hold it;
what it tuned is read back from the store. A package or an image ships the result with
`kjit cache export` (tuned configurations travel with the kernels)."""

from __future__ import annotations

import json
import os
import sys

import torch

import kjit
import kjit.tuning
from kjit._errors import Error


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise Error(f"'{name}' is not a torch dtype (float32, bfloat16, float16, int64, ...)")
    return value


def _value(text: str, type_name: str):
    if type_name in ("int", "SymInt"):
        return int(text)
    if type_name == "float":
        return float(text)
    if type_name == "bool":
        if text.lower() not in ("true", "false", "1", "0"):
            raise Error(f"'{text}' is not a bool")
        return text.lower() in ("true", "1")
    if type_name.startswith("int[]") or type_name.startswith("SymInt[]"):
        return [int(v) for v in text.split(",") if v]
    if type_name == "ScalarType":
        return _dtype(text)
    return text  # str


def _arguments(schema, tensors: dict, extra: dict, default_dtype: torch.dtype):
    """The call's arguments, or a string saying what is missing."""
    args = []
    for arg in schema.arguments:
        type_name = str(arg.type)
        is_tensor = type_name.startswith("Tensor")
        if is_tensor and arg.name in tensors:
            shape, dtype_name = tensors[arg.name]
            dtype = _dtype(dtype_name) if dtype_name else default_dtype
            if dtype.is_floating_point:
                args.append(torch.randn(shape, device="cuda", dtype=dtype))
            else:
                args.append(torch.zeros(shape, device="cuda", dtype=dtype))
        elif is_tensor and type_name.endswith("?"):
            args.append(None)
        elif is_tensor:
            return f"needs tensor '{arg.name}' (add {arg.name}=DIMS to --shape)"
        elif arg.name in extra:
            args.append(_value(extra[arg.name], type_name.rstrip("?")))
        elif arg.has_default_value():
            args.append(arg.default_value)
        else:
            return f"needs argument '{arg.name}' (--arg {arg.name}=VALUE)"
    return args


def _describe(tensors: dict, default_dtype: torch.dtype) -> str:
    return ", ".join(
        f"{name}=[{'x'.join(map(str, shape))}] {dtype or str(default_dtype).removeprefix('torch.')}"
        for name, (shape, dtype) in tensors.items()
    )


def run(args) -> int:
    if os.environ.get("KJIT_AUTOTUNE", "").lower() in ("0", "false", "no", "off"):
        raise Error("KJIT_AUTOTUNE turns tuning off in this environment; unset it to tune")
    if not torch.cuda.is_available():
        raise Error("kjit tune times kernels on a GPU: it needs a CUDA device, and torch finds none here")
    if args.budget is not None:
        os.environ["KJIT_TUNE_BUDGET"] = str(args.budget)  # read by the tuner at each bucket
    module = kjit.load(args.package)
    ns = module.namespace
    tunable = [op for op in module.ops if kjit.tuning.parameters(f"{ns}::{op}")]
    if args.op:
        unknown = [op for op in args.op if op not in module.ops]
        if unknown:
            raise Error(f"package '{ns}' has no op {', '.join(unknown)} (ops: {', '.join(module.ops)})")
        untuned = [op for op in args.op if op not in tunable]
        if untuned:
            raise Error(f"op {', '.join(untuned)} of '{ns}' has no tune parameters")
        tunable = args.op
    if not tunable:
        raise Error(f"package '{ns}' has no op with tune parameters")
    extra = dict(args.arg)
    default_dtype = _dtype(args.dtype)
    report = []
    failed = 0
    for op in tunable:
        qualified = f"{ns}::{op}"
        packet = getattr(getattr(torch.ops, ns), op)
        kjit.tuning.use(packet, "tuned")
        for tensors in args.shape:
            row = {"op": qualified, "shape": _describe(tensors, default_dtype), "tuned_now": False}
            call = _arguments(packet.default._schema, tensors, extra, default_dtype)
            if isinstance(call, str):
                row["skipped"] = call
                report.append(row)
                if not args.json:
                    print(f"{qualified} {row['shape']}: skipped, {call}")
                continue
            before = {e["key"] for e in kjit.tuning.entries(qualified)}
            if not args.json:
                print(f"{qualified} {row['shape']}: tuning ...", file=sys.stderr, flush=True)
            try:
                packet(*call)
                torch.cuda.synchronize()
            except (ValueError, RuntimeError, Error) as e:
                row["error"] = str(e).splitlines()[0]
                failed += 1
                report.append(row)
                print(f"{qualified} {row['shape']}: failed: {row['error']}", file=sys.stderr)
                continue
            new = [e for e in kjit.tuning.entries(qualified) if e["key"] not in before]
            if new:
                entry = new[0]
                timed = [t for t in entry["timings"] if t[1] != float("inf")]
                best_ms = next((ms for values, ms, _ in entry["timings"] if values == entry["best"]), None)
                default_ms = entry["timings"][0][1] if entry["timings"] else None
                row.update(
                    tuned_now=True,
                    bucket=entry["bucket"],
                    best=dict(zip(entry["names"], entry["best"])),
                    best_ms=best_ms,
                    default=dict(zip(entry["names"], entry["timings"][0][0])) if entry["timings"] else None,
                    default_ms=default_ms,
                    candidates=len(entry["timings"]),
                    failed_candidates=len(entry["timings"]) - len(timed),
                    pruned=entry["pruned"],
                    seconds=entry["seconds"],
                    budget_exhausted=entry["budget_exhausted"],
                )
            report.append(row)
            if args.json:
                continue
            if not new:
                print(f"{qualified} {row['shape']}: already tuned (the store holds this bucket)")
                continue
            best = ", ".join(f"{k}={v}" for k, v in row["best"].items())
            speedup = (
                f", {row['default_ms'] / row['best_ms']:.2f}x the default"
                if row["best_ms"] and row["default_ms"] not in (None, float("inf"))
                else ""
            )
            print(
                f"{qualified} {row['shape']}: {best} ({row['best_ms']:.4f} ms{speedup}); "
                f"{row['candidates']} timed, {row['pruned']} pruned, in {row['seconds']:.2f} s"
                + (" (budget spent)" if row["budget_exhausted"] else "")
            )
    if args.json:
        print(json.dumps(report, indent=2))
    if failed:
        return 1
    if all("skipped" in row for row in report):
        # Every op needed something the command line did not give: nothing was tuned.
        print("kjit tune: no call could be made (each needs a tensor or argument not given)", file=sys.stderr)
        return 1
    return 0
