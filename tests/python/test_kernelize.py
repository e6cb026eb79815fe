"""kjit.kernelize on tiny, randomly initialised transformers models built from a config (no
weights downloaded): Llama, Qwen2, Qwen3, Mistral and Gemma 1-3. Kernelized logits match the original's, and so do a
training step's loss and gradients; on CPU the packages' CPU implementations run, on a GPU their
kernels."""

import copy
import logging

import pytest
import torch
from torch import nn

import kjit
import kjit.layers
from conftest import cuda

transformers = pytest.importorskip("transformers")

DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]
TOL = {torch.float32: 2e-4, torch.bfloat16: 4e-2}


def tiny(family: str):
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    if family == "qwen3":  # RMSNorms of the heads' queries and keys in its attention
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **common))
    if family == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**common))
    gemma = dict(head_dim=16, hidden_act="gelu_pytorch_tanh", **common)
    if family == "gemma2":  # four norms a layer; soft-capped attention and logits
        return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**gemma))
    if family == "gemma3":  # and query and key norms; local and global rotary embeddings
        return transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**gemma))
    return transformers.GemmaForCausalLM(transformers.GemmaConfig(**gemma))


EXPECTED = {
    "llama": {"LlamaRMSNorm -> RMSNorm": 5, "LlamaMLP -> SiluAndMulMLP": 2, "LlamaAttention -> LlamaAttentionKjitRotary": 2,
              "ForCausalLMLoss -> causal_lm_loss": 1},
    "qwen2": {"Qwen2RMSNorm -> RMSNorm": 5, "Qwen2MLP -> SiluAndMulMLP": 2, "Qwen2Attention -> Qwen2AttentionKjitRotary": 2,
              "ForCausalLMLoss -> causal_lm_loss": 1},
    "qwen3": {"Qwen3RMSNorm -> RMSNorm": 9, "Qwen3MLP -> SiluAndMulMLP": 2, "Qwen3Attention -> Qwen3AttentionKjitRotary": 2,
              "ForCausalLMLoss -> causal_lm_loss": 1},
    "mistral": {"MistralRMSNorm -> RMSNorm": 5, "MistralMLP -> SiluAndMulMLP": 2,
                "MistralAttention -> MistralAttentionKjitRotary": 2, "ForCausalLMLoss -> causal_lm_loss": 1},
    "gemma": {"GemmaRMSNorm -> GemmaRMSNorm": 5, "GemmaMLP -> GeluTanhAndMulMLP": 2, "GemmaAttention -> GemmaAttentionKjitRotary": 2,
              "ForCausalLMLoss -> causal_lm_loss": 1},
    "gemma2": {"Gemma2RMSNorm -> GemmaRMSNorm": 9, "Gemma2MLP -> GeluTanhAndMulMLP": 2,
               "Gemma2Attention -> Gemma2AttentionKjitRotary": 2, "ForCausalLMLoss -> causal_lm_loss": 1},
    "gemma3": {"Gemma3RMSNorm -> GemmaRMSNorm": 13, "Gemma3MLP -> GeluTanhAndMulMLP": 2,
               "Gemma3Attention -> Gemma3AttentionKjitRotary": 2, "ForCausalLMLoss -> causal_lm_loss": 1},
}


def pair(family, device, dtype):
    torch.manual_seed(0)
    model = tiny(family).to(device, dtype)
    for p in model.parameters():  # norms away from their initial ones and zeros
        if p.dim() == 1:
            with torch.no_grad():
                p.add_(torch.randn_like(p) * 0.1)
    return model, copy.deepcopy(model)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", list(EXPECTED))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_match_and_modules_keep_their_parameters(family, device, dtype, caplog, monkeypatch):
    model, original = pair(family, device, dtype)
    names = [n for n, _ in model.named_parameters()]
    with caplog.at_level(logging.INFO, logger="kjit"):
        report = kjit.kernelize(model.eval(), mode="inference")
    assert report.replaced == EXPECTED[family]
    assert "module(s) replaced" in caplog.text
    assert [n for n, _ in model.named_parameters()] == names
    # Every replaced module runs its kjit op (none falls back to its own forward) once a forward.
    calls = {}
    for package, op in (("norm", "rms_norm"), ("activation", "silu_mul"), ("activation", "gelu_tanh_mul"),
                        ("rotary", "apply_rotary")):
        loaded = kjit.layers._package(package)
        real = getattr(loaded, op)
        monkeypatch.setattr(loaded, op, lambda *a, _op=op, _real=real: calls.update({_op: calls.get(_op, 0) + 1}) or _real(*a))
    ids = torch.randint(0, 128, (2, 12), device=device)
    with torch.no_grad():
        got = model(ids).logits
    ops = {"RMSNorm": "rms_norm", "SiluAndMulMLP": "silu_mul", "GeluTanhAndMulMLP": "gelu_tanh_mul",
           "KjitRotary": "apply_rotary"}
    want_calls = {op: n for entry, n in EXPECTED[family].items() for suffix, op in ops.items() if entry.endswith(suffix)}
    assert calls == want_calls
    with torch.no_grad():
        torch.testing.assert_close(got, original.eval()(ids).logits, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma", "gemma3"])
def test_a_training_step_matches(family, device):
    model, original = pair(family, device, torch.float32)
    kjit.kernelize(model.train(), mode="training")
    ids = torch.randint(0, 128, (2, 12), device=device)
    losses = []
    for m in (model, original.train()):
        out = m(ids, labels=ids)
        out.loss.backward()
        losses.append(out.loss.detach())
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), original.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=lambda m: f"{name}: {m}")
    # and the optimizer moves the same parameters
    for m in (model, original):
        torch.optim.SGD(m.parameters(), lr=0.1).step()
    for p, q in zip(model.parameters(), original.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_kernelized_model(device):
    model, original = pair("llama", device, torch.float32)
    kjit.kernelize(model.eval(), mode="inference", compile=True)
    ids = torch.randint(0, 128, (2, 12), device=device)
    with torch.no_grad():
        want = original.eval()(ids).logits
        got = torch.compile(model)(ids).logits
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)


def test_unfit_modules_are_left_alone_and_said(caplog):
    class LlamaRMSNorm(nn.Module):  # the class name of a mapped one, without its attributes
        def forward(self, x):
            return x

    class MyMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = nn.Linear(4, 8), nn.Linear(4, 8), nn.Linear(8, 4)
            self.act_fn = nn.ReLU()

    model = nn.Sequential(LlamaRMSNorm(), MyMLP())
    kjit.register_layer("MyMLP", kjit._kernelize._gated_mlp)
    report = kjit.kernelize(model)
    assert report.replaced == {}
    assert ("0", "LlamaRMSNorm", "it has no weight, variance_epsilon") in report.skipped
    assert ("1", "MyMLP", "its activation ReLU has no kjit kernel") in report.skipped
    assert "left alone: 2" in str(report)
    with pytest.raises(ValueError, match="mode must be one of inference, training"):
        kjit.kernelize(model, mode="serving")


def test_a_user_registry_entry_and_a_layer_that_falls_back():
    class MyNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.rand(16) + 0.5)
            self.variance_epsilon = 1e-6

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * h.to(x.dtype)

    norm = MyNorm()
    kjit.register_layer("MyNorm", kjit.layers.RMSNorm, "weight", "variance_epsilon")
    assert kjit.kernelize(norm).replaced == {"MyNorm -> RMSNorm": 1}
    x = torch.randn(3, 16)
    torch.testing.assert_close(norm(x), MyNorm.forward(norm, x))
    # float64 has no kernel: the module's own forward runs
    torch.testing.assert_close(norm.double()(x.double()), MyNorm.forward(norm, x.double()))


def test_layers_follow_the_kernels_layer_contract():
    for layer in (kjit.layers.RMSNorm, kjit.layers.GemmaRMSNorm, kjit.layers.SiluAndMulMLP,
                  kjit.layers.GeluTanhAndMulMLP, kjit.layers.GeluAndMulMLP):
        assert issubclass(layer, nn.Module)
        assert set(vars(layer)) - {"__module__", "__doc__", "__qualname__", "__firstlineno__",
                                   "__static_attributes__"} == {"forward", "can_torch_compile", "has_backward"}
        assert layer.can_torch_compile and layer.has_backward


@pytest.mark.parametrize("device", DEVICES)
def test_attention_runs_kjits_rotary_and_only_in_the_kernelized_model(device, monkeypatch):
    """The attention modules of the kernelized model call kjit's rotary kernel (once per layer
    and forward); a model of the same class left alone still runs transformers' own."""
    model, original = pair("llama", device, torch.float32)
    kjit.kernelize(model.eval())
    rotary = kjit.layers._package("rotary")
    calls = []
    real = rotary.apply_rotary
    monkeypatch.setattr(rotary, "apply_rotary", lambda *a: calls.append(a[0].shape) or real(*a))
    ids = torch.randint(0, 128, (2, 12), device=device)
    with torch.no_grad():
        got = model(ids).logits
        assert len(calls) == 2 and calls[0] == (2, 4, 12, 16)
        want = original.eval()(ids).logits
    assert len(calls) == 2
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    # float64 has no kernel: the model's own rotary runs, and the result still matches
    with torch.no_grad():
        torch.testing.assert_close(model.double()(ids).logits, original.double()(ids).logits)
    assert len(calls) == 2


def test_rebinding_a_global_goes_through_wrappers_and_changes_nothing_else():
    import functools

    def helper():
        return "original"

    def decorate(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            return "wrapped " + f(*args, **kwargs)

        return wrapper

    namespace = {"helper": helper, "functools": functools}
    exec("def uses():\n    return helper()\n", namespace)
    wrapped = decorate(decorate(namespace["uses"]))
    copy = kjit.layers._with_global(wrapped, "helper", lambda: "kjit")
    assert copy() == "wrapped wrapped kjit"
    assert wrapped() == "wrapped wrapped original"
    assert kjit.layers.inspect_global(wrapped, "helper") is helper
    assert kjit.layers.inspect_global(wrapped, "nothing") is None


@pytest.mark.parametrize("device", DEVICES)
def test_the_causal_lm_loss_runs_kjits_cross_entropy_mean_and_sum(device, monkeypatch):
    model, original = pair("llama", device, torch.float32)
    kjit.kernelize(model.train(), mode="training")
    assert "ForCausalLMLoss -> causal_lm_loss" not in kjit.kernelize(model, mode="training").replaced  # once
    softmax = kjit.layers._package("softmax")
    calls = []
    real = softmax.cross_entropy
    monkeypatch.setattr(softmax, "cross_entropy", lambda *a: calls.append(a[4]) or real(*a))
    ids = torch.randint(0, 128, (2, 12), device=device)
    for extra in ({}, {"num_items_in_batch": torch.tensor(17, device=device)}):
        got = model(ids, labels=ids, **extra).loss
        want = original.train()(ids, labels=ids, **extra).loss
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert calls == ["mean", "sum"]

