"""End to end on one GPU: a Llama-style model of about 1B parameters (hidden 2048, 16 layers, 32
query and 8 key-value heads, intermediate 8192, vocabulary 128256; random weights from a config,
nothing downloaded), bfloat16, batch x sequence = 8 x 2048, in one process:

  forward        tokens/s of model(ids) under torch.no_grad (logits included)
  training step  tokens/s of forward with labels (transformers' own loss), backward and an SGD
                 step

for torch eager (transformers' modules as they are), kjit.kernelize (mode "inference" and
"training": RMSNorm, gated MLP and rotary on kjit kernels) and Liger's patched model
(apply_liger_kernel_to_llama on the instance: RMSNorm, SwiGLU, RoPE, and for training its fused
linear cross-entropy, as Liger applies it by default), each the same weights. The same logits
(forward: the relative error of the whole tensor, recorded in the JSON with the top-1 agreement), loss
and gradients (training: each parameter's relative error, the median and the worst recorded) are
checked across systems before timing; time is the median of
timed repeats after warm-up, synchronized.

  python3 bench/bench_e2e.py [--json FILE] [--layers N] [--batch B] [--seq S]
  python3 bench/bench_e2e.py --tiny --device cpu   (a smoke test of the script: tests/python)
"""

import argparse
import copy
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import kjit


def config(layers, tiny=False):
    import transformers

    if tiny:
        return transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=layers, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=256,
                                        attn_implementation="sdpa")
    return transformers.LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                    num_hidden_layers=layers, num_attention_heads=32,
                                    num_key_value_heads=8, max_position_embeddings=8192,
                                    rope_theta=500000.0, attn_implementation="sdpa")


# The forward's logits against eager's: ||out - eager|| / ||eager|| at most this (bf16 rounds
# each layer's result and the systems round in different places; a wrong kernel gives errors of
# order 1). The share of positions whose most likely token is the same is recorded beside it.
LOGITS_RELATIVE_ERROR = 5e-2


# A training step's gradients against eager's, each parameter's as a whole:
# ||g - eager|| / ||eager|| at most this (as the logits: rounding moves them by about 1e-2 in
# bf16; a wrong backward gives errors of order 1). The median over the parameters is recorded.
GRADIENTS_RELATIVE_ERROR = 1e-1


def check_gradients(name, grads, want, results):
    """Records the relative error of each parameter's gradient against eager's (`want`) and
    raises where one is missing or off by more than GRADIENTS_RELATIVE_ERROR."""
    missing = sorted(set(want) - set(grads))
    if missing:
        raise AssertionError(f"no gradient for {len(missing)} parameter(s), e.g. {missing[0]}")
    errors = {}
    for n, g in grads.items():
        reference = want[n].float()
        errors[n] = ((g.float() - reference).norm() / reference.norm().clamp_min(1e-30)).item()
    worst = max(errors, key=errors.get)
    median = statistics.median(errors.values())
    results["checks"][f"{name} gradients"] = {"max_relative_error": errors[worst], "worst": worst,
                                              "median_relative_error": median}
    print(f"training {name}: gradients' relative error median {median:.2e}, max {errors[worst]:.2e} "
          f"({worst}) (vs eager)", flush=True)
    if not errors[worst] <= GRADIENTS_RELATIVE_ERROR:
        raise AssertionError(f"gradient of {worst} differs from eager's: relative error "
                             f"{errors[worst]:.2e} (at most {GRADIENTS_RELATIVE_ERROR})")


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, warmup=2, repeats=5):
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def liger(model, training):
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                fused_linear_cross_entropy=training, model=model)
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 64-wide model, for a smoke test")
    args = parser.parse_args()
    import transformers

    if args.tiny:
        args.layers, args.batch, args.seq = 2, 2, 16
    where = args.device
    device = torch.cuda.get_device_name() if where == "cuda" else where
    print(f"device: {device}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"kjit {kjit.__version__}", flush=True)
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(config(args.layers, args.tiny)).to(where, torch.bfloat16)
    vocab = base.config.vocab_size
    params = sum(p.numel() for p in base.parameters())
    tokens = args.batch * args.seq
    ids = torch.randint(0, vocab, (args.batch, args.seq), device=where)
    print(f"{params / 1e9:.2f}B parameters, {tokens} tokens a step", flush=True)
    results = {"device": device, "torch": torch.__version__, "transformers": transformers.__version__,
               "date": datetime.date.today().isoformat(), "params": params, "tokens": tokens,
               "forward": {}, "training": {}, "checks": {}, "errors": {}}
    reference = {}
    # Eager first: Liger patches modules in place, and kernelize too (per instance).
    for name in ["torch eager", "kjit", "Liger"]:
        for phase in ["forward", "training"]:
            model = copy.deepcopy(base)
            try:
                if name == "kjit":
                    kjit.kernelize(model, mode="training" if phase == "training" else "inference")
                elif name == "Liger":
                    liger(model, phase == "training")
                if phase == "forward":
                    model.eval()

                    def step():
                        with torch.no_grad():
                            return model(ids).logits

                    out = step()
                    if "forward" in reference:
                        # Elementwise tolerances do not fit ~10^9 bf16 logits after 16 layers
                        # (rounding in another order moves some by more than any sane atol):
                        # the relative error of the whole tensor, and the top-1 agreement.
                        want = reference["forward"]
                        error = ((out.float() - want).norm() / want.norm()).item()
                        agree = (out.argmax(-1) == want.argmax(-1)).float().mean().item()
                        results["checks"][name] = {"relative_error": error, "top1_agreement": agree}
                        print(f"forward {name}: logits relative error {error:.2e}, top-1 agreement "
                              f"{agree:.4f} (vs eager)", flush=True)
                        if not error <= LOGITS_RELATIVE_ERROR:
                            raise AssertionError(f"logits differ from eager: relative error "
                                                 f"{error:.2e} (at most {LOGITS_RELATIVE_ERROR})")
                    else:
                        reference["forward"] = out.float()
                    del out
                else:
                    model.train()
                    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)

                    def step():
                        optimizer.zero_grad(set_to_none=True)
                        loss = model(ids, labels=ids).loss
                        loss.backward()
                        optimizer.step()
                        return loss.detach()

                    loss = step().float()
                    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
                    if "training" in reference:
                        torch.testing.assert_close(loss, reference["training"], rtol=2e-2, atol=2e-2)
                        check_gradients(name, grads, reference["gradients"], results)
                    else:
                        reference["training"] = loss
                        reference["gradients"] = {n: g.clone() for n, g in grads.items()}
                    del grads
                seconds = timed(step, where, repeats=5 if phase == "forward" else 3)
                results[phase][name] = tokens / seconds
                print(f"{phase} {name}: {tokens / seconds:,.0f} tokens/s ({seconds * 1e3:.1f} ms)", flush=True)
            except Exception as e:  # a system that fails is reported, not fatal
                results["errors"][f"{phase} {name}"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                print(f"{phase} {name}: {results['errors'][f'{phase} {name}']}", flush=True)
            del model
            if where == "cuda":
                torch.cuda.empty_cache()
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
    for phase in ["forward", "training"]:
        got = results[phase]
        if "torch eager" in got:
            ratios = ", ".join(f"{k} {v / got['torch eager']:.3f}x" for k, v in got.items())
            print(f"{phase} vs eager: {ratios}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
