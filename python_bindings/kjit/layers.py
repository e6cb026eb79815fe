"""kjit layers: the forward of a model's module replaced by kjit ops, keeping the module's own
parameters (kjit.kernelize puts them in place).

Each layer follows the layer contract of Hugging Face `kernels`: a plain `nn.Module` subclass
with `forward` only, whose `forward` runs on the module it replaces (it reads that module's
attributes: `weight`, `variance_epsilon`, `gate_proj`, ...), with the class attributes
`can_torch_compile` and `has_backward`. So `kernels.kernelize` can map them too.

Where an input does not fit the kernel (a dtype the weight does not share, say, as under some
mixed-precision set-ups), a layer runs the module's own forward (its class's) instead: the
result is never wrong, only not accelerated.
"""

import functools
import types

import torch
from torch import nn

_PACKAGES = {}


def _package(name: str):
    """The shipped package `name`, loaded once."""
    if name not in _PACKAGES:
        from ._api import load

        _PACKAGES[name] = load(name)
    return _PACKAGES[name]


_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.dtype in _KERNEL_DTYPES and weight.dtype == x.dtype and x.device == weight.device and x.dim() >= 1


class RMSNorm(nn.Module):
    """Llama, Qwen2, Qwen3 and Mistral RMSNorm: weight * (x / rms(x)).to(x.dtype), over
    `weight` and `variance_epsilon`."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not _fits(hidden_states, self.weight):
            return type(self).forward(self, hidden_states)
        return _package("norm").rms_norm(hidden_states.contiguous(), self.weight, self.variance_epsilon)


class GemmaRMSNorm(nn.Module):
    """Gemma, Gemma 2 and Gemma 3 RMSNorm: (x / rms(x) * (1 + weight)) in float32, over `weight`
    and `eps`."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _fits(x, self.weight):
            return type(self).forward(self, x)
        return _package("norm").rms_norm(x.contiguous(), self.weight, self.eps, 1.0, "gemma")


def _gated_mlp(module: nn.Module, x: torch.Tensor, op: str) -> torch.Tensor:
    """down_proj(act(gate_proj(x)) * up_proj(x)) with the activation and product one kernel."""
    gate, up = module.gate_proj(x), module.up_proj(x)
    if gate.dtype not in _KERNEL_DTYPES or up.dtype != gate.dtype or up.shape != gate.shape:
        return type(module).forward(module, x)
    return module.down_proj(getattr(_package("activation"), op)(gate.contiguous(), up.contiguous()))


class SiluAndMulMLP(nn.Module):
    """A gated MLP with SiLU (Llama, Qwen2, Mistral): gate_proj, up_proj, down_proj."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gated_mlp(self, x, "silu_mul")


class GeluTanhAndMulMLP(nn.Module):
    """A gated MLP with tanh-approximated GELU (Gemma 1-3): gate_proj, up_proj, down_proj."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gated_mlp(self, x, "gelu_tanh_mul")


class GeluAndMulMLP(nn.Module):
    """A gated MLP with exact GELU: gate_proj, up_proj, down_proj."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gated_mlp(self, x, "gelu_mul")


def _rotary_fits(q, k, cos, sin, unsqueeze_dim) -> bool:
    return (unsqueeze_dim == 1 and q.dim() == 4 and k.dim() == 4 and q.dtype in _KERNEL_DTYPES
            and k.dtype == q.dtype and cos.dtype == q.dtype and sin.dtype == q.dtype and cos.dim() == 3
            and sin.shape == cos.shape and q.stride(-1) == 1 and k.stride(-1) == 1 and q.numel() > 0
            and k.shape[0] == q.shape[0] and k.shape[2:] == q.shape[2:] and cos.shape[1] == q.shape[2]
            and cos.shape[0] in (1, q.shape[0]) and cos.shape[2] % 2 == 0 and 0 < cos.shape[2] <= q.shape[3]
            and cos.shape[2] <= 512 and q.device == k.device == cos.device == sin.device)


def rotary_pos_emb(fallback):
    """Hugging Face's `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)` (NeoX style, the
    halves of cos and sin duplicated; q and k [B, H, S, D], cos and sin [B, S, rot]) as one kjit
    kernel for q and k, with a backward. Inputs the kernel does not take go to `fallback` (the
    model's own function)."""

    @functools.wraps(fallback)
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, *args, **kwargs):
        if args or kwargs or not _rotary_fits(q, k, cos, sin, unsqueeze_dim):
            return fallback(q, k, cos, sin, unsqueeze_dim, *args, **kwargs)
        return tuple(_package("rotary").apply_rotary(q, k, cos.contiguous(), sin.contiguous()))

    return apply_rotary_pos_emb


def _with_global(fn, name: str, value):
    """A copy of function `fn` that sees `value` as its global `name`, through the
    functools.wraps wrappers around it (each copied wrapper closes over the copy of what it
    wraps). Nothing global changes: other modules of the class keep theirs."""
    inner = getattr(fn, "__wrapped__", None)
    closure = fn.__closure__
    if inner is not None and closure:
        new_inner = _with_global(inner, name, value)

        def contents(cell):
            try:
                return cell.cell_contents
            except ValueError:  # an empty cell
                return None

        cells = tuple(types.CellType(new_inner) if contents(c) is inner else c for c in closure)
        globals_ = fn.__globals__
    else:
        cells = closure
        globals_ = {**fn.__globals__, name: value}
    copy = types.FunctionType(fn.__code__, globals_, fn.__name__, fn.__defaults__, cells)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)
    copy.__qualname__ = fn.__qualname__
    if inner is not None and closure:
        copy.__wrapped__ = new_inner
    return copy


@functools.cache
def attention_with_rotary(attention: type) -> type:
    """A layer for an attention class whose forward calls its module's `apply_rotary_pos_emb`
    (Llama, Qwen2, Qwen3, Mistral, Gemma 1-3): the class's own forward, seeing kjit's
    rotary_pos_emb there instead. The projections, the attention and the cache are the
    module's own."""
    forward = attention.forward
    original = inspect_global(forward, "apply_rotary_pos_emb")
    layer = type(f"{attention.__name__}KjitRotary", (nn.Module,), {
        "__doc__": f"{attention.__name__}.forward with kjit's rotary embedding.",
        "forward": _with_global(forward, "apply_rotary_pos_emb", rotary_pos_emb(original)),
        "can_torch_compile": True,
        "has_backward": True,
    })
    return layer


def inspect_global(fn, name: str):
    """The global `name` that the innermost function under `fn`'s wrappers reads, or None."""
    while getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    return fn.__globals__.get(name) if name in fn.__code__.co_names else None


def causal_lm_loss(fallback):
    """transformers' ForCausalLMLoss (labels shifted left, ignore_index, mean, or sum divided by
    num_items_in_batch) on kjit's cross-entropy, which reads the logits in their own dtype with
    float32 arithmetic: no float32 copy of the logits is made, and the backward keeps one
    log-sum-exp per row instead of a softmax. Other inputs go to `fallback`."""

    @functools.wraps(fallback)
    def loss_function(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
                      shift_labels=None, **kwargs):
        if logits.dtype not in _KERNEL_DTYPES or logits.shape[-1] != vocab_size or logits.numel() == 0:
            return fallback(logits, labels, vocab_size, num_items_in_batch=num_items_in_batch,
                            ignore_index=ignore_index, shift_labels=shift_labels, **kwargs)
        if shift_labels is None:
            labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:]
        target = shift_labels.reshape(-1).to(device=logits.device, dtype=torch.int64).contiguous()
        reduction = "sum" if num_items_in_batch is not None else "mean"
        loss = _package("softmax").cross_entropy(logits.reshape(-1, vocab_size).contiguous(), target,
                                                 ignore_index, 0.0, reduction)
        if reduction == "sum":
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(loss.device)
            loss = loss / num_items_in_batch
        return loss

    loss_function.kjit_layer = True
    return loss_function
