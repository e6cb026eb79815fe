"""kjit.kernelize: a model's modules run kjit layers (kjit.layers), chosen by class name.

    model = transformers.AutoModelForCausalLM.from_config(config)
    report = kjit.kernelize(model, mode="training")     # or "inference"; compile=True if the
    print(report)                                       # model will be torch.compile'd

Each module whose class is mapped gets its `forward` replaced by the layer's, bound to the
module: its parameters, hooks and state dict stay as they are, and so does every module that is
not mapped or does not fit (said in the report, with why). RMSNorm and gated-MLP modules take
kjit layers; attention modules keep their own forward, with the rotary embedding it calls
(apply_rotary_pos_emb) replaced by kjit's for that module alone. The registry maps class names to a
"fit" function (module, mode, compile) -> (layer class or None, reason); `register_layer` adds
to it.
"""

import logging
import types
from dataclasses import dataclass, field
from typing import Callable

from torch import nn

from . import layers

_log = logging.getLogger("kjit")

MODES = ("inference", "training")

Fit = Callable[[nn.Module, str, bool], "tuple[type[nn.Module] | None, str]"]


def _needs(*names: str):
    def missing(module: nn.Module) -> str:
        absent = [n for n in names if not hasattr(module, n)]
        return f"it has no {', '.join(absent)}" if absent else ""

    return missing


def _fixed(layer: type, *attributes: str) -> Fit:
    """A fit that takes `layer` for every module having `attributes`."""
    missing = _needs(*attributes)

    def fit(module, mode, compile):
        reason = missing(module)
        return (None, reason) if reason else (layer, "")

    return fit


def _activation_name(act: nn.Module) -> str | None:
    """'silu', 'gelu_tanh' or 'gelu' for the activation modules of torch and transformers."""
    name = type(act).__name__
    if name in ("SiLU", "SiLUActivation"):
        return "silu"
    if name in ("PytorchGELUTanh", "GELUTanh", "NewGELUActivation", "GELUTanhActivation"):
        return "gelu_tanh"
    if name == "GELU":  # torch.nn.GELU
        return "gelu_tanh" if getattr(act, "approximate", "none") == "tanh" else "gelu"
    if name == "GELUActivation" and not getattr(act, "use_gelu_python", False):
        return "gelu"
    return None


_GATED = {"silu": layers.SiluAndMulMLP, "gelu_tanh": layers.GeluTanhAndMulMLP, "gelu": layers.GeluAndMulMLP}


def _gated_mlp(module, mode, compile):
    reason = _needs("gate_proj", "up_proj", "down_proj", "act_fn")(module)
    if reason:
        return None, reason
    act = _activation_name(module.act_fn)
    if act is None:
        return None, f"its activation {type(module.act_fn).__name__} has no kjit kernel"
    return _GATED[act], ""


_REGISTRY: dict[str, Fit] = {}


def register_layer(class_name: str, layer: type[nn.Module] | Fit, *attributes: str) -> None:
    """Maps modules of class `class_name` to `layer` (a layer class, given the attributes its
    forward reads, or a fit function (module, mode, compile) -> (layer or None, reason))."""
    if isinstance(layer, type):
        if not issubclass(layer, nn.Module) or not hasattr(layer, "forward"):
            raise TypeError(f"{layer!r} is not a layer (an nn.Module subclass with forward)")
        _REGISTRY[class_name] = _fixed(layer, *attributes)
    elif callable(layer):
        _REGISTRY[class_name] = layer
    else:
        raise TypeError(f"expected a layer class or a fit function, got {type(layer).__name__}")


for _name in ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"):
    register_layer(_name, layers.RMSNorm, "weight", "variance_epsilon")
for _name in ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm"):
    register_layer(_name, layers.GemmaRMSNorm, "weight", "eps")
for _name in ("LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP", "GemmaMLP", "Gemma2MLP", "Gemma3MLP"):
    register_layer(_name, _gated_mlp)


def _attention(module, mode, compile):
    """The attention modules of transformers' Llama family: their forward with kjit's rotary
    embedding (layers.attention_with_rotary), where the forward calls apply_rotary_pos_emb."""
    if layers.inspect_global(type(module).forward, "apply_rotary_pos_emb") is None:
        return None, "its forward does not call apply_rotary_pos_emb"
    return layers.attention_with_rotary(type(module)), ""


for _name in ("LlamaAttention", "Qwen2Attention", "Qwen3Attention", "MistralAttention", "GemmaAttention",
              "Gemma2Attention", "Gemma3Attention"):
    register_layer(_name, _attention)


@dataclass
class KernelizeReport:
    """What kernelize did: modules replaced per (class, layer), and those left alone with why."""

    mode: str
    compile: bool
    replaced: dict[str, int] = field(default_factory=dict)  # "LlamaRMSNorm -> RMSNorm": count
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (path, class, reason)

    def __str__(self) -> str:
        total = sum(self.replaced.values())
        lines = [f"kjit.kernelize ({self.mode}{', compiled' if self.compile else ''}): "
                 f"{total} module(s) replaced"]
        lines += [f"  {what}: {count}" for what, count in sorted(self.replaced.items())]
        if self.skipped:
            lines.append(f"  left alone: {len(self.skipped)}")
            lines += [f"    {path} ({cls}): {reason}" for path, cls, reason in self.skipped]
        return "\n".join(lines)


def kernelize(model: nn.Module, mode: str = "inference", compile: bool = False) -> KernelizeReport:
    """Replaces the forward of `model`'s mapped modules with kjit layers (see the module doc).
    mode "training" takes only layers with a backward; compile=True only those that torch.compile
    can trace. Returns the report (also logged at info on the 'kjit' logger)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"kernelize takes an nn.Module, not {type(model).__name__}")
    report = KernelizeReport(mode, bool(compile))
    for path, module in model.named_modules():
        cls = type(module).__name__
        fit = _REGISTRY.get(cls)
        if fit is None:
            continue
        layer, reason = fit(module, mode, bool(compile))
        if layer is not None and mode == "training" and not getattr(layer, "has_backward", False):
            layer, reason = None, f"{layer.__name__} has no backward"
        if layer is not None and compile and not getattr(layer, "can_torch_compile", False):
            layer, reason = None, f"{layer.__name__} cannot be compiled"
        if layer is None:
            report.skipped.append((path or "<model>", cls, reason))
            continue
        module.forward = types.MethodType(layer.forward, module)
        key = f"{cls} -> {layer.__name__}"
        report.replaced[key] = report.replaced.get(key, 0) + 1
    _kernelize_loss(model, report)
    _log.info("%s", report)
    return report


def _kernelize_loss(model: nn.Module, report: "KernelizeReport") -> None:
    """A transformers causal LM's loss_function (ForCausalLMLoss) on kjit's cross-entropy
    (layers.causal_lm_loss), for this model alone (its loss_function setter)."""
    if not isinstance(getattr(type(model), "loss_function", None), property):
        return
    current = model.loss_function
    name = getattr(current, "__name__", type(current).__name__)
    if getattr(current, "kjit_layer", False):
        return  # kernelized already
    if name != "ForCausalLMLoss":
        report.skipped.append(("loss_function", name, "only ForCausalLMLoss has a kjit kernel"))
        return
    model.loss_function = layers.causal_lm_loss(current)
    key = "ForCausalLMLoss -> causal_lm_loss"
    report.replaced[key] = report.replaced.get(key, 0) + 1
