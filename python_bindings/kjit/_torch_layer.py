"""The Python half of the torch layer (Note [Op registration] in python_bindings/torch/ops.hpp).

For each op of a package: the schema (with the pt2_compliant tag), a fake kernel (outputs from
the manifest's expressions with symbolic sizes, for torch.compile and meta tensors), the CPU
implementation (the manifest's checks, the package's Python function, its outputs held to the
declared shapes and dtypes), and the CUDA kernel from C++ (`_C.register_cuda`). All of it goes
through torch.library's public API and torch's stable C ABI, so it works with every torch from
2.11 on.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any, Callable

import torch

from . import _C, _expr
from ._errors import ManifestError

_libraries: list = []  # torch.library.Library objects, kept for the process
_namespaces: dict[str, str] = {}  # op namespace -> manifest
_attached = False
_NO_DEFAULT = object()


def attach() -> None:
    """Resolves torch's stable C ABI from the torch this process imported (once)."""
    global _attached
    if _attached:
        return
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    _C.attach_torch(os.path.join(lib, "libtorch_cpu.so"), os.path.join(lib, "libtorch_cuda.so"))
    _attached = True


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """c10's is_non_overlapping_and_dense, as the C++ layer computes it: t's elements fill a
    dense block, each once, in some order of its dimensions (torch.empty_like keeps such strides)."""
    sizes, strides = list(t.shape), list(t.stride())
    if len(sizes) == 1:
        return bool(sizes[0] < 2 or strides[0] == 1)
    order = sorted((d for d in range(len(sizes)) if not sizes[d] < 2), key=lambda d: strides[d])
    want = 1
    for d in order:
        if strides[d] != want:
            return False
        want *= sizes[d]
    return True


def _manifest_error(manifest: str, location: str, message: str) -> ManifestError:
    error = ManifestError(f"{manifest}: {location}: {message}")
    error.file, error.location, error.line, error.column = manifest, location, 0, 0
    return error


class OpSpec:
    """One op's parsed manifest, evaluated in Python."""

    def __init__(self, namespace: str, op: dict):
        self.name = op["name"]
        self.namespace = namespace
        self.qualified = f"{namespace}::{self.name}"
        self.symbols = [s[0] for s in op["symbols"]]
        self.kinds = [s[1] for s in op["symbols"]]
        self.num_inputs = op["num_inputs"]
        self.inputs = op["inputs"]
        self.returns = [tuple(r) for r in op["returns"]]  # (output index, aliased argument)
        self.tensor_inputs = [i for i in range(self.num_inputs) if self.kinds[i] == "Tensor"]
        self.strings = {i: a["strings"] for i, a in enumerate(self.inputs) if a["str"]}
        self.checks = [(c["text"], _expr.compile(c)) for c in op["checks"]]
        self.hidden = [out["hidden"] for out in op["outputs"]]
        self.backward = op["backward"]  # None, or {op, args: [(source, index)], gradients}
        self.outputs = []
        for out in op["outputs"]:
            self.outputs.append(
                (
                    [_expr.compile(e) for e in out["shape"]],
                    out["like"],
                    [(dim, _expr.compile(e)) for dim, e in out["dims"]],
                    _expr.compile(out["dtype"]) if out["dtype"] is not None else None,
                    out["preserve_layout"],
                )
            )

    def learn_defaults(self, schema) -> None:
        """The schema's defaults (torch.FunctionSchema), for Python kernels: torch hands them the
        arguments as the caller gave them."""
        self.defaults = [a.default_value if a.has_default_value() else _NO_DEFAULT for a in schema.arguments]

    def bind(self, args: tuple, kwargs: dict) -> tuple:
        """All the arguments, positionally, with the schema's defaults filled in."""
        if len(args) == self.num_inputs and not kwargs:
            return args
        full = list(args)
        for i in range(len(args), self.num_inputs):
            name = self.symbols[i]
            if name in kwargs:
                full.append(kwargs[name])
            elif self.defaults[i] is not _NO_DEFAULT:
                full.append(self.defaults[i])
            else:
                raise TypeError(f"{self.qualified}: missing argument '{name}'")
        return tuple(full)

    @property
    def aliasing(self) -> bool:
        """Whether a return aliases a written argument (Note [Aliasing returns], ops.hpp)."""
        return any(alias >= 0 for _, alias in self.returns)

    @property
    def has_twin(self) -> bool:
        """Whether the op has a twin `_kjit_<name>` that returns every new output (Note
        [Aliasing returns], Note [Backward ops] in ops.hpp)."""
        return self.aliasing or self.backward is not None

    @property
    def twin(self) -> str:
        return f"_kjit_{self.name}"

    def twin_schema(self, schema: str) -> str:
        """The schema of the twin: the same arguments, the new outputs alone."""
        arguments = schema[schema.index("(") + 1 : schema[: schema.rindex("->")].rindex(")")]
        n = len(self.outputs)
        returns = "()" if n == 0 else "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"
        return f"{self.twin}({arguments}) -> {returns}"

    def values(self, args: tuple) -> list:
        """The call's values as expressions see them: str arguments as the manifest's integers."""
        values = list(args)
        for i, strings in self.strings.items():
            if values[i] not in strings:
                known = ", ".join(f"'{k}'" for k in strings)
                raise ValueError(
                    f"{self.qualified}: argument '{self.symbols[i]}' is '{values[i]}'; expected one of {known}"
                )
            values[i] = strings[values[i]]
        return values

    def describe(self, values: list) -> str:
        parts = []
        for i in self.tensor_inputs:
            t = values[i]
            if t is None:
                parts.append(f"'{self.symbols[i]}' is None")
                continue
            parts.append(
                f"'{self.symbols[i]}' has shape [{', '.join(str(s) for s in t.shape)}], dtype "
                f"{_expr.dtype_name(t.dtype)}, device {t.device}"
                + ("" if t.is_contiguous() else ", not contiguous")
            )
        return "; ".join(parts)

    def device(self, values: list) -> torch.device:
        """The device every present tensor argument is on; ValueError naming the odd one out."""
        present = [i for i in self.tensor_inputs if values[i] is not None]
        if not present:
            raise ValueError(f"{self.qualified}: no tensor argument")
        first = present[0]
        device = values[first].device
        for i in present[1:]:
            if values[i].device != device:
                raise ValueError(
                    f"{self.qualified}: expected all tensors on one device, but "
                    f"'{self.symbols[first]}' is on {device} and '{self.symbols[i]}' is on "
                    f"{values[i].device}"
                )
        return device

    def check(self, values: list) -> None:
        for text, check in self.checks:
            try:
                ok = check(values)
            except _expr.EvalError as e:
                raise ValueError(
                    f"{self.qualified}: cannot evaluate check '{text}': {e}; {self.describe(values)}"
                ) from None
            if not ok:
                raise ValueError(f"{self.qualified}: check '{text}' failed: {self.describe(values)}")

    def output_shapes(self, values: list) -> list[tuple[list, torch.dtype, tuple | None]]:
        """Each output's shape, dtype and strides (None: contiguous; layout = "preserve" gives
        like's where like is non-overlapping and dense, as the C++ layer does)."""
        result = []
        for o, (shape_exprs, like, dims, dtype_expr, preserve) in enumerate(self.outputs):
            try:
                if like >= 0:
                    shape = list(values[like].shape)
                    for dim, expr in dims:
                        d = dim + len(shape) if dim < 0 else dim
                        if d < 0 or d >= len(shape):
                            raise ValueError(
                                f"{self.qualified}: output {o} replaces dimension {dim} of "
                                f"'{self.symbols[like]}', which has {len(shape)} dimensions"
                            )
                        shape[d] = expr(values)
                    dtype = values[like].dtype
                else:
                    shape = [expr(values) for expr in shape_exprs]
                    dtype = None
                if dtype_expr is not None:
                    dtype = _expr.DTYPES[dtype_expr(values)]
            except _expr.EvalError as e:
                raise ValueError(f"{self.qualified}: cannot compute the shape of output {o}: {e}") from None
            for d, size in enumerate(shape):
                if isinstance(size, int) and size < 0:
                    raise ValueError(f"{self.qualified}: output {o} would have size {size} in dimension {d}")
            strides = None
            if preserve and _non_overlapping_and_dense(values[like]):
                strides = tuple(values[like].stride())
            result.append((shape, dtype, strides))
        return result

    @staticmethod
    def new_output(shape, dtype, strides, device) -> torch.Tensor:
        if strides is None:
            return torch.empty(shape, dtype=dtype, device=device)
        return torch.empty_strided(shape, strides, dtype=dtype, device=device)

    def results(self, args: tuple, outs: list, outputs_only: bool):
        """What the op returns: the new outputs (the twin), or the schema's returns, the
        aliased ones being the arguments themselves; one value plain, none as None."""
        if outputs_only:
            result = list(outs)
        else:
            result = [outs[o] if alias < 0 else args[alias] for o, alias in self.returns]
        if not result:
            return None
        return result[0] if len(result) == 1 else tuple(result)

    def fake(self, outputs_only: bool = False) -> Callable:
        """The fake kernel: new outputs of the declared shapes (symbolic where the inputs' are);
        written arguments are left as they are (their metadata does not change)."""

        def fake(*args, **kwargs):
            args = self.bind(args, kwargs)
            values = self.values(args)
            device = self.device(values)
            outs = [self.new_output(*out, device) for out in self.output_shapes(values)]
            return self.results(args, outs, outputs_only)

        fake.__name__ = f"fake_{self.name}"
        return fake

    def composite(self) -> Callable:
        """The CompositeImplicitAutograd kernel of an op with aliasing returns: the twin, then the
        written arguments (Note [Aliasing returns])."""
        twin = getattr(getattr(torch.ops, self.namespace), self.twin).default

        def composite(*args, **kwargs):
            args = self.bind(args, kwargs)
            outs = twin(*args)
            outs = [] if outs is None else list(outs) if isinstance(outs, (tuple, list)) else [outs]
            return self.results(args, outs, False)

        composite.__name__ = f"composite_{self.name}"
        return composite

    def autograd(self, library) -> None:
        """The op's Autograd kernel (Note [Backward ops], ops.hpp): an autograd.Function whose
        forward calls the twin (every output, the hidden ones too) and saves what the backward's
        arguments name, and whose backward calls the backward op with them and the gradients of
        the returned outputs; its returns are the gradients of the arguments it names. Where no
        gradient is needed it calls the twin alone."""
        namespace_ops = getattr(torch.ops, self.namespace)
        twin = getattr(namespace_ops, self.twin).default
        backward_op = getattr(namespace_ops, self.backward["op"]).default
        num_inputs, tensor_inputs = self.num_inputs, list(self.tensor_inputs)
        gradients = list(self.backward["gradients"])
        returned = [o for o, _ in self.returns]  # outputs the op returns, in order
        single = len(returned) == 1
        # Per backward argument: ("saved", k), ("value", argument index) or ("grad", the
        # position of that output among the op's returns; hidden ones have no gradient).
        plan, saved_from = [], []
        for source, index in self.backward["args"]:
            if source == "grad":
                plan.append(("grad", returned.index(index)))
            elif source == "output" or index in tensor_inputs:
                plan.append(("saved", len(saved_from)))
                saved_from.append((source == "input", index))
            else:
                plan.append(("value", index))
        values_from = [index if kind == "value" else None for kind, index in plan]
        # Returned outputs laid out like an input (layout = "preserve"): their gradients pass to
        # the backward op as they come where they are laid out as the output (the layout the op
        # chose, which its kernels take); any other gradient is made contiguous first.
        preserved = [self.outputs[o][4] for o in returned]

        def forward(ctx, *args):
            outs = twin(*args)
            outs = outs if isinstance(outs, tuple) else (outs,)
            ctx.kjit_strides = [tuple(outs[o].stride()) if keep else None for o, keep in zip(returned, preserved)]
            ctx.save_for_backward(*[args[i] if from_input else outs[i] for from_input, i in saved_from])
            ctx.kjit_values = [None if i is None else args[i] for i in values_from]
            ctx.kjit_present = [args[i] is not None for i in gradients]
            return outs[returned[0]] if single else tuple(outs[o] for o in returned)

        def backward(ctx, *grads):
            saved = ctx.saved_tensors
            args = []
            for (kind, index), value in zip(plan, ctx.kjit_values):
                if kind == "saved":
                    args.append(saved[index])
                elif kind == "grad":
                    grad, strides = grads[index], ctx.kjit_strides[index]
                    same = strides is not None and tuple(grad.stride()) == strides
                    args.append(grad if same else grad.contiguous())
                else:
                    args.append(value)
            result = backward_op(*args)
            result = result if isinstance(result, (tuple, list)) else (result,)
            grads_in = [None] * num_inputs
            needs = ctx.needs_input_grad
            for g, i in enumerate(gradients):
                if ctx.kjit_present[g] and needs[i]:
                    grads_in[i] = result[g]
            return tuple(grads_in)

        function = type(
            f"KjitAutograd_{self.namespace}_{self.name}",
            (torch.autograd.Function,),
            {"forward": staticmethod(forward), "backward": staticmethod(backward)},
        )
        apply, bind, is_grad_enabled = function.apply, self.bind, torch.is_grad_enabled

        def autograd_kernel(*args, **kwargs):
            args = bind(args, kwargs)
            if is_grad_enabled() and any(args[i] is not None and args[i].requires_grad for i in tensor_inputs):
                return apply(*args)
            outs = twin(*args)
            outs = outs if isinstance(outs, tuple) else (outs,)
            return outs[returned[0]] if single else tuple(outs[o] for o in returned)

        autograd_kernel.__name__ = f"autograd_{self.name}"
        library.impl(self.name, autograd_kernel, "Autograd")

    def cpu(self, function: Callable | None, outputs_only: bool = False) -> Callable:
        """The CPU kernel: checks, then `function`, which writes the arguments the schema marks
        written and returns the new outputs (or all the schema's returns, the aliased ones being
        its arguments); they must be what the manifest says."""

        def cpu(*args, **kwargs):
            args = self.bind(args, kwargs)
            values = self.values(args)
            device = self.device(values)
            if device.type != "cpu":
                raise ValueError(f"{self.qualified}: unexpected {device}")
            if function is None:
                raise NotImplementedError(
                    f"{self.qualified} has no CPU kernel (its package gives none): move the tensors "
                    "to a CUDA device"
                )
            self.check(values)
            declared = self.output_shapes(values)
            # Below autograd, as a device kernel: no graph is recorded through the reference
            # implementation's torch calls (the op's own autograd decides about gradients).
            with torch.no_grad():
                result = function(*args)
            got = [] if result is None else list(result) if isinstance(result, (tuple, list)) else [result]
            if len(got) == len(self.returns) and len(got) != len(declared):
                for k, (o, alias) in enumerate(self.returns):
                    if alias >= 0 and got[k] is not args[alias]:
                        raise RuntimeError(
                            f"{self.qualified}: the CPU implementation's return {k} must be its "
                            f"argument '{self.symbols[alias]}' (the schema returns it written)"
                        )
                got = [got[k] for k, (o, alias) in enumerate(self.returns) if alias < 0]
            if len(got) != len(declared):
                aliased = sum(1 for _, alias in self.returns if alias >= 0)
                hidden = sum(self.hidden)
                also = (
                    f" ({aliased} more returns alias arguments; return all"
                    f" {len(self.returns)} or only the new ones)"
                    if aliased
                    else f" ({hidden} of them hidden, which it returns too, after the others)"
                    if hidden
                    else ""
                )
                raise RuntimeError(
                    f"{self.qualified}: the CPU implementation returned {len(got)} values, the "
                    f"schema declares {len(declared)} outputs{also}"
                )
            for o, (out, (shape, dtype, strides)) in enumerate(zip(got, declared)):
                if not isinstance(out, torch.Tensor):
                    raise RuntimeError(
                        f"{self.qualified}: the CPU implementation returned a "
                        f"{type(out).__name__} as output {o}, not a tensor"
                    )
                if list(out.shape) != shape or out.dtype != dtype or out.device.type != "cpu":
                    raise RuntimeError(
                        f"{self.qualified}: the CPU implementation returned output {o} of shape "
                        f"[{', '.join(map(str, out.shape))}], {_expr.dtype_name(out.dtype)} on "
                        f"{out.device}; the manifest declares shape [{', '.join(map(str, shape))}], "
                        f"{_expr.dtype_name(dtype)} on cpu"
                    )
                if any(out is a for a in args if isinstance(a, torch.Tensor)):
                    raise RuntimeError(
                        f"{self.qualified}: the CPU implementation returned an argument as new "
                        f"output {o}; declare it Tensor(a!) in the schema and return it as such"
                    )
                # Laid out as the CUDA kernel's outputs and the fake kernel's are (torch.compile
                # and opcheck compare strides): contiguous, or like's with layout = "preserve".
                if strides is None and not out.is_contiguous():
                    got[o] = out.contiguous()
                elif strides is not None and tuple(out.stride()) != strides:
                    got[o] = self.new_output(shape, dtype, strides, out.device).copy_(out)
            return self.results(args, got, outputs_only)

        cpu.__name__ = f"cpu_{self.name}"
        return cpu


def _known_to_inspect() -> None:
    """torch.library.register_fake records its caller's module with inspect.getmodule, which
    maps files to modules by scanning every module imported since its last scan: 2.5-3 ms in a
    process that just imported torch and kjit. Telling inspect's map (the one the scan fills)
    which module this file is lets the lookup stop at once; where the map is gone (another
    Python), the scan runs as before."""
    import inspect

    by_file = getattr(inspect, "modulesbyfile", None)
    if isinstance(by_file, dict) and __file__:
        path = os.path.normcase(os.path.abspath(__file__))
        by_file.setdefault(path, __name__)
        by_file.setdefault(os.path.realpath(path), __name__)


def register(info: dict, cpu_functions: dict[str, Callable]) -> None:
    """Defines and implements the ops of a loaded package (`info` from _C.load_package) under
    torch.ops.<namespace>; `cpu_functions` maps op names to their CPU functions."""
    attach()
    namespace, manifest = info["namespace"], info["manifest"]
    taken = _namespaces.get(namespace)
    if taken is not None:
        if taken != manifest:
            raise _manifest_error(manifest, "package.name", f"op namespace '{namespace}' is taken by the package at '{taken}'")
        return
    specs = [OpSpec(namespace, op) for op in info["ops"]]
    try:
        library = torch.library.Library(namespace, "DEF")
    except RuntimeError as e:
        raise _manifest_error(manifest, "package.name", f"cannot define op namespace '{namespace}': {e}") from None
    try:
        for op, spec in zip(info["ops"], specs):
            schemas = [op["schema"]] + ([spec.twin_schema(op["schema"])] if spec.has_twin else [])
            for schema in schemas:
                try:
                    library.define(schema, tags=(torch.Tag.pt2_compliant_tag,))
                except RuntimeError as e:
                    raise _manifest_error(manifest, f"op.{op['name']}.schema", str(e).split("\n")[0]) from None
        _C.register_cuda(info["handle"], namespace)
    except BaseException:
        library._destroy()
        raise
    _known_to_inspect()
    for spec in specs:
        spec.learn_defaults(getattr(getattr(torch.ops, namespace), spec.name).default._schema)
        function = cpu_functions.get(spec.name)
        library.impl(spec.name, spec.cpu(function), "CPU")
        if spec.has_twin:  # Note [Aliasing returns], Note [Backward ops] (ops.hpp)
            torch.library.register_fake(f"{namespace}::{spec.twin}", spec.fake(True), lib=library)
            library.impl(spec.twin, spec.cpu(function, True), "CPU")
        if spec.backward is not None:
            torch.library.register_fake(spec.qualified, spec.fake(), lib=library)
            spec.autograd(library)
        elif spec.aliasing:
            library.impl(spec.name, spec.composite(), "CompositeImplicitAutograd")
        else:
            torch.library.register_fake(spec.qualified, spec.fake(), lib=library)
    # Ops without a backward have torch's autograd fallback, which only warns when a backward
    # passes through them (and the gradient is lost): make that an error naming the op.
    warnings.filterwarnings(
        "error",
        message=re.escape(namespace) + r"::\w+: an autograd kernel was not registered",
        category=UserWarning,
    )
    _libraries.append(library)
    _namespaces[namespace] = manifest
