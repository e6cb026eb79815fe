"""kjit's kernel library against Liger-Kernel's Triton kernels, torch.compile (inductor) of the
same formula and torch eager, in one process on one GPU: GPU time per call (CUDA events around
each call, median of 20 after warm-up; before each call a 256 MB memset evicts L2, as Triton's
do_bench does, and then the GPU waits (torch.cuda._sleep) long enough for the host to queue the
whole call, so the time is the GPU's alone however long the host takes), the bytes each call must
move, GB/s and the share of the device's copy bandwidth; and apart, the host time of a call (from
the call to its return, the GPU idle, median of 7). Backward rows time the gradients alone
(torch.autograd.grad of a kept graph), so they include every kernel a system runs for them
(Liger's dweight sum, inductor's reductions) and the autograd engine's host work. Every system's
result is checked against the float32 reference before it is timed; one that fails or is missing
is reported, not fatal. A row's "tuned" key holds the configurations kjit's tuner chose while the
row ran (op: bucket and values; buckets tuned before the row are not repeated).

  python3 bench/bench_kernels.py [--json FILE] [--quick] [--ops rotary,rms_norm]

Large shapes move >= 128 MB a call; mid shapes are hidden 1024-4096 at 4096 rows.
"""

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kjit  # noqa: E402
from bench_ops import copy_gbps, try_peer  # noqa: E402

EPS = 1e-6
_FLUSH = []
_CLOCK = []


def _cycles_per_us():
    """The GPU's clock as torch.cuda._sleep counts it, measured once."""
    if not _CLOCK:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)  # warm
        start.record()
        torch.cuda._sleep(20_000_000)
        end.record()
        torch.cuda.synchronize()
        _CLOCK.append(20_000_000 / (start.elapsed_time(end) * 1e3))
    return _CLOCK[0]


def gpu_ms(fn, arg, reps=20, host=None):
    """Median GPU ms of fn(arg). Each call comes after an L2-evicting memset and a GPU-side wait
    that outlasts the host's time to queue the call, with no synchronization between calls, so
    neither launch latency nor host time is counted. `host`, a list, gets the host ms of a call
    (median of 7, each from an idle GPU)."""
    if not _FLUSH:
        _FLUSH.append(torch.empty(256 << 20, dtype=torch.int8, device="cuda"))
    flush = _FLUSH[0]
    for _ in range(3):
        fn(arg)
    torch.cuda.synchronize()
    host_s = []
    for _ in range(7):
        t = time.perf_counter()
        fn(arg)
        host_s.append(time.perf_counter() - t)
        torch.cuda.synchronize()
    host_ms = statistics.median(host_s) * 1e3
    if host is not None:
        host.append(host_ms)
    wait_cycles = int(_cycles_per_us() * (2 * max(host_s) * 1e6 + 50))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        flush.zero_()
        torch.cuda._sleep(wait_cycles)
        start.record()
        fn(arg)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def rms_formula(x, w):  # Hugging Face's LlamaRMSNorm
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(x.dtype)


def fused_add_formula(x, r, w):
    s = r + x
    return rms_formula(s, w), s


def layer_norm_formula(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def silu_mul_formula(a, b):  # a gated MLP's activation: silu(gate) * up
    return F.silu(a) * b


def gelu_tanh_mul_formula(a, b):  # Gemma's gated MLP (GEGLU, tanh GELU)
    return F.gelu(a, approximate="tanh") * b


def gelu_and_mul_formula(x):  # vLLM's form: gate and up concatenated, the exact (erf) GELU
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d]) * x[..., d:]


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), -1)


def rotary_formula(q, k, cos, sin):  # Hugging Face's apply_rotary_pos_emb
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def softmax_formula(x):
    return torch.softmax(x, -1)


def cross_entropy_formula(logits, target):  # as transformers' loss: upcast, then mean
    return F.cross_entropy(logits.float(), target, ignore_index=-100)


def liger_systems():
    """Liger's autograd functions, as its modules call them (None where Liger is missing)."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
        from liger_kernel.ops.geglu import LigerGELUMulFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except Exception as e:  # reported, and the rows go without Liger
        print(f"Liger: {type(e).__name__}: {e}", flush=True)
        return None
    return {
        "rms_norm": lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False),
        "fused_add_rms_norm": lambda x, r, w: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama", False),
        "layer_norm": lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, 1e-5),
        "silu_mul": lambda a, b: LigerSiLUMulFunction.apply(a, b),
        "gelu_tanh_mul": lambda a, b: LigerGELUMulFunction.apply(a, b),
        "rotary": lambda q, k, cos, sin: LigerRopeFunction.apply(q, k, cos, sin),
        "softmax": lambda x: LigerSoftmaxFunction.apply(x),
        "cross_entropy": lambda x, t: LigerCrossEntropyFunction.apply(x, t, None, -100, 0.0, 0.0, "mean",
                                                                     None, False, False, False)[0],
    }


def kjit_systems():
    norm = kjit.load("norm")
    activation = kjit.load("activation")
    rotary = kjit.load("rotary")
    softmax = kjit.load("softmax")

    def fused(x, r, w):  # in place, as vLLM calls it; the timing loop rewrites the same buffers
        norm.fused_add_rms_norm(x, r, w, EPS)
        return x, r

    return {
        "rms_norm": lambda x, w: norm.rms_norm(x, w, EPS),
        "fused_add_rms_norm": fused,
        "layer_norm": lambda x, w, b: norm.layer_norm(x, w, b, 1e-5),
        "silu_mul": activation.silu_mul,
        "gelu_tanh_mul": activation.gelu_tanh_mul,
        "gelu_and_mul": activation.gelu_and_mul,
        "rotary": rotary.apply_rotary,
        "softmax": softmax.softmax,
        "cross_entropy": softmax.cross_entropy,
    }


FORMULAS = {"rms_norm": rms_formula, "fused_add_rms_norm": fused_add_formula,
            "layer_norm": layer_norm_formula, "silu_mul": silu_mul_formula,
            "gelu_tanh_mul": gelu_tanh_mul_formula, "gelu_and_mul": gelu_and_mul_formula,
            "rotary": rotary_formula,
            "softmax": softmax_formula, "cross_entropy": cross_entropy_formula}
# Bytes a call must move per element of x: forward reads x and writes y; backward reads dy and
# x and writes dx; the fused add reads x and residual and writes both.
TRAFFIC = {("rms_norm", "forward"): 2, ("rms_norm", "backward"): 3,
           ("fused_add_rms_norm", "forward"): 4, ("layer_norm", "forward"): 2,
           ("layer_norm", "backward"): 3, ("silu_mul", "forward"): 3, ("silu_mul", "backward"): 5,
           ("gelu_tanh_mul", "forward"): 3, ("gelu_tanh_mul", "backward"): 5,
           ("gelu_and_mul", "forward"): 3, ("gelu_and_mul", "backward"): 5}
# silu_mul and gelu_tanh_mul: rows x hidden are the gate's (and up's) shape; forward reads both
# and writes one, backward reads dy, a and b and writes da and db. rotary: rows are tokens (batch
# 8 or 2 of 2048), hidden the query's heads x 128 with a quarter as many key heads, as Llama 3
# has; both directions read q and k (or their gradients) and cos and sin, and write two tensors
# of q's and k's shapes. gelu_and_mul: rows x hidden is its output's shape (x is rows x 2 hidden,
# gate and up side by side); Liger has no exact-GELU kernel, so its peer is torch.compile.
TRAFFIC.update({("rotary", "forward"): 0, ("rotary", "backward"): 0})  # bytes: rotary_bytes
TRAFFIC.update({("softmax", "forward"): 2, ("softmax", "backward"): 3,
                ("cross_entropy", "forward"): 1, ("cross_entropy", "backward"): 2})
# cross_entropy: rows x vocab logits; the forward reads them once, the backward reads them and
# writes their gradient. Liger computes that gradient in its forward (into the logits' buffer),
# so its forward does the backward's work too and its backward only scales.
DIFFERENTIABLE = {"rotary": 2, "cross_entropy": 1}  # inputs with gradients; else all


def rotary_bytes(inputs):
    q, k, cos, sin = inputs
    return (2 * (q.numel() + k.numel()) + cos.numel() + sin.numel()) * q.element_size()


def make_inputs(op, rows, hidden, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, hidden, device="cuda", dtype=dtype, generator=g)
    w = (torch.rand(hidden, device="cuda", generator=g) + 0.5).to(dtype)
    if op == "rms_norm":
        return [x, w]
    if op == "fused_add_rms_norm":
        return [x, torch.randn(rows, hidden, device="cuda", dtype=dtype, generator=g), w]
    if op in ("silu_mul", "gelu_tanh_mul"):
        return [x, torch.randn(rows, hidden, device="cuda", dtype=dtype, generator=g)]
    if op == "gelu_and_mul":
        return [torch.cat([x, torch.randn(rows, hidden, device="cuda", dtype=dtype, generator=g)], -1)]
    if op == "softmax":
        return [x * 3]
    if op == "cross_entropy":
        target = torch.randint(0, hidden, (rows,), device="cuda", generator=g)
        target[::7] = -100
        return [x * 2, target]
    if op == "rotary":  # q and k as attention passes them: transposed views of the projections
        batch, seq, dim = rows // 2048, 2048, 128
        heads = hidden // dim
        q = x.view(batch, seq, heads, dim).transpose(1, 2)
        k = torch.randn(batch, seq, heads // 4 * dim, device="cuda", dtype=dtype,
                        generator=g).view(batch, seq, heads // 4, dim).transpose(1, 2)
        inv_freq = 1.0 / (500000.0 ** (torch.arange(0, dim, 2, device="cuda").float() / dim))
        freqs = torch.arange(seq, device="cuda").float()[None, :, None] * inv_freq
        emb = torch.cat((freqs, freqs), -1).expand(batch, seq, dim)
        return [q, k, emb.cos().to(dtype).contiguous(), emb.sin().to(dtype).contiguous()]
    return [x, w, torch.randn(hidden, device="cuda", dtype=dtype, generator=g)]


def first(out):
    return out[0] if isinstance(out, tuple) else out


def tuned_keys():
    """(op, bucket) of every tuned configuration in kjit's stores."""
    return {(e["op"], e["bucket"]) for e in kjit.tuning.entries()}


def tuned_since(before):
    """The configurations tuned since `before` (tuned_keys()): {op: {bucket, best}}, so that a
    row says which candidate kjit ran (a bucket tuned before the row, by an earlier row or
    process, is not repeated)."""
    return {e["op"].split("::")[-1]: {"bucket": e["bucket"], "best": dict(zip(e["names"], e["best"]))}
            for e in kjit.tuning.entries() if (e["op"], e["bucket"]) not in before}


def measure(op, direction, fn, inputs, reference, dtype, host=None):
    """GPU ms of one call of `fn` (forward) or of its gradients (backward), after checking the
    result against `reference` (the float32 formula's); its host ms goes to `host` (gpu_ms)."""
    tol = 2e-2 if dtype != torch.float32 else 1e-4
    if direction == "forward":
        if op in ("fused_add_rms_norm", "rotary", "cross_entropy"):  # Liger's rope and cross-entropy write their inputs
            fresh = [t.clone() for t in inputs]
            out = fn(*fresh)
            torch.testing.assert_close(first(out).float(), reference[0], rtol=tol, atol=tol)
            return gpu_ms(lambda args: fn(*args), fresh, host=host)
        torch.testing.assert_close(first(fn(*inputs)).float(), reference[0], rtol=tol, atol=tol)
        return gpu_ms(lambda args: fn(*args), inputs, host=host)
    n = DIFFERENTIABLE.get(op, len(inputs))
    leaves = [t.detach().clone().requires_grad_() for t in inputs[:n]]
    rest = inputs[n:]
    out = fn(*leaves, *rest)
    outs = list(out) if op == "rotary" else [first(out)]  # both of rotary's outputs
    dys = [torch.randn_like(o) for o in outs]
    ref_leaves = [t.detach().float().clone().requires_grad_() for t in inputs[:n]]
    ref = FORMULAS[op](*ref_leaves, *[t.float() if t.is_floating_point() else t for t in rest])
    want = torch.autograd.grad(list(ref) if op == "rotary" else [first(ref)], ref_leaves,
                               [d.float() for d in dys])
    # On copies of the output gradients: Liger's rope backward rotates them in place.
    grads = torch.autograd.grad(outs, leaves, [d.clone() for d in dys], retain_graph=True)
    for got, exp in zip(grads, want):
        scale = max(1.0, exp.abs().max().item())
        torch.testing.assert_close(got.float() / scale, exp / scale, rtol=tol * 2, atol=tol * 2)
    return gpu_ms(lambda _: torch.autograd.grad(outs, leaves, dys, retain_graph=True), None, host=host)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true", help="one large and one mid shape")
    parser.add_argument("--ops", help="only these ops, e.g. rotary,rms_norm")
    args = parser.parse_args()
    device = torch.cuda.get_device_name()
    print(f"device: {device}, torch {torch.__version__}, kjit {kjit.__version__}", flush=True)
    copy = copy_gbps(1 << 30)
    print(f"copy {copy:.0f} GB/s", flush=True)

    ours, liger = kjit_systems(), liger_systems()
    shapes = [("large", 16384, 4096), ("large", 4096, 16384), ("mid", 4096, 1024),
              ("mid", 4096, 2048), ("mid", 4096, 4096)]
    mlp_shapes = [("large", 16384, 8192), ("large", 4096, 14336), ("mid", 4096, 2048),
                  ("mid", 4096, 4096)]  # gate/up [tokens, intermediate]
    rotary_shapes = [("large", 16384, 4096), ("mid", 4096, 4096), ("mid", 4096, 2048)]
    ce_shapes = [("large", 4096, 128256), ("large", 2048, 151936), ("mid", 4096, 32000)]
    softmax_shapes = [("large", 16384, 4096), ("large", 1024, 128256), ("mid", 4096, 1024),
                      ("mid", 4096, 4096)]
    if args.quick:
        shapes = [shapes[0], shapes[2]]
    rows_out = []
    only = set(args.ops.split(",")) if args.ops else None
    for op in ["rms_norm", "fused_add_rms_norm", "layer_norm", "silu_mul", "gelu_tanh_mul", "gelu_and_mul",
               "rotary", "softmax", "cross_entropy"]:
        if only and op not in only:
            continue
        for dtype in [torch.bfloat16, torch.float32]:
            shapes_of = {"silu_mul": mlp_shapes, "gelu_tanh_mul": mlp_shapes, "gelu_and_mul": mlp_shapes,
                         "rotary": rotary_shapes,
                         "softmax": softmax_shapes, "cross_entropy": ce_shapes}
            for size, rows, hidden in shapes_of.get(op, shapes):
                inputs = make_inputs(op, rows, hidden, dtype)
                compiled = torch.compile(FORMULAS[op], dynamic=False)
                systems = {"kjit": ours[op]}
                if liger and op in liger:
                    systems["Liger"] = liger[op]
                systems["torch.compile"] = compiled
                systems["kjit under torch.compile"] = torch.compile(ours[op], dynamic=False)
                systems["torch eager"] = FORMULAS[op]
                ref_forward = [first(FORMULAS[op](*[i.float() if i.is_floating_point() else i for i in inputs]))]
                for direction in ["forward", "backward"]:
                    if (op, direction) not in TRAFFIC:
                        continue
                    nbytes = (rotary_bytes(inputs) if op == "rotary" else
                              TRAFFIC[(op, direction)] * rows * hidden * inputs[0].element_size())
                    row = {"op": op, "direction": direction, "dtype": str(dtype)[6:], "size": size,
                           "rows": rows, "hidden": hidden, "bytes": nbytes, "ms": {}, "host_ms": {}}
                    for name, fn in systems.items():
                        host = []
                        before = tuned_keys() if name == "kjit" else None
                        try_peer(row["ms"], name,
                                 lambda: measure(op, direction, fn, inputs, ref_forward, dtype, host))
                        if name in row["ms"]:
                            row["host_ms"][name] = host[-1]
                        if before is not None:
                            row["tuned"] = tuned_since(before)
                    rows_out.append(row)
                    ms = row["ms"]
                    text = ", ".join(f"{k} {v * 1e3:.1f} us ({nbytes / v / 1e6 / copy:.0%}; host "
                                     f"{row['host_ms'][k] * 1e3:.0f} us)" for k, v in ms.items())
                    print(f"{op} {direction} {row['dtype']} [{rows}, {hidden}]: {text}", flush=True)
                del inputs
                torch._dynamo.reset()
                if args.json:  # after every shape: a run cut short keeps what it measured
                    Path(args.json).write_text(json.dumps(
                        {"device": device, "torch": torch.__version__,
                         "date": datetime.date.today().isoformat(), "copy_gbps": copy,
                         "timing": "gpu alone, host queued first",
                         "rows": rows_out}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
