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


def attach() -> None:
    """Resolves torch's stable C ABI from the torch this process imported (once)."""
    global _attached
    if _attached:
        return
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    _C.attach_torch(os.path.join(lib, "libtorch_cpu.so"), os.path.join(lib, "libtorch_cuda.so"))
    _attached = True


def _manifest_error(manifest: str, location: str, message: str) -> ManifestError:
    error = ManifestError(f"{manifest}: {location}: {message}")
    error.file, error.location, error.line, error.column = manifest, location, 0, 0
    return error


class OpSpec:
    """One op's parsed manifest, evaluated in Python."""

    def __init__(self, namespace: str, op: dict):
        self.name = op["name"]
        self.qualified = f"{namespace}::{self.name}"
        self.symbols = [name for name, _ in op["symbols"]]
        self.kinds = [kind for _, kind in op["symbols"]]
        self.num_inputs = op["num_inputs"]
        self.tensor_inputs = [i for i in range(self.num_inputs) if self.kinds[i] == "Tensor"]
        self.checks = [(c["text"], _expr.compile(c)) for c in op["checks"]]
        self.outputs = []
        for out in op["outputs"]:
            self.outputs.append(
                (
                    [_expr.compile(e) for e in out["shape"]],
                    out["like"],
                    [(dim, _expr.compile(e)) for dim, e in out["dims"]],
                    _expr.compile(out["dtype"]) if out["dtype"] is not None else None,
                )
            )

    def describe(self, values: list) -> str:
        parts = []
        for i in self.tensor_inputs:
            t = values[i]
            parts.append(
                f"'{self.symbols[i]}' has shape [{', '.join(str(s) for s in t.shape)}], dtype "
                f"{_expr.dtype_name(t.dtype)}, device {t.device}"
                + ("" if t.is_contiguous() else ", not contiguous")
            )
        return "; ".join(parts)

    def device(self, values: list) -> torch.device:
        """The device every tensor argument is on; ValueError naming the odd one out."""
        if not self.tensor_inputs:
            raise ValueError(f"{self.qualified}: no tensor argument")
        first = self.tensor_inputs[0]
        device = values[first].device
        for i in self.tensor_inputs[1:]:
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

    def output_shapes(self, values: list) -> list[tuple[list, torch.dtype]]:
        result = []
        for o, (shape_exprs, like, dims, dtype_expr) in enumerate(self.outputs):
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
            result.append((shape, dtype))
        return result

    def fake(self) -> Callable:
        """The fake kernel: outputs of the declared shapes (symbolic where the inputs' are)."""

        def fake(*args):
            values = list(args)
            device = self.device(values)
            outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.output_shapes(values)]
            return outs[0] if len(outs) == 1 else tuple(outs)

        fake.__name__ = f"fake_{self.name}"
        return fake

    def cpu(self, function: Callable | None) -> Callable:
        """The CPU kernel: checks, then `function`, whose outputs must be what the manifest says."""

        def cpu(*args):
            values = list(args)
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
            outs = result if isinstance(result, (tuple, list)) else (result,)
            if len(outs) != len(declared):
                raise RuntimeError(
                    f"{self.qualified}: the CPU implementation returned {len(outs)} values, the "
                    f"schema declares {len(declared)} outputs"
                )
            for o, (out, (shape, dtype)) in enumerate(zip(outs, declared)):
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
            return result

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
        for op in info["ops"]:
            try:
                library.define(op["schema"], tags=(torch.Tag.pt2_compliant_tag,))
            except RuntimeError as e:
                raise _manifest_error(manifest, f"op.{op['name']}.schema", str(e).split("\n")[0]) from None
        _C.register_cuda(info["handle"], namespace)
    except BaseException:
        library._destroy()
        raise
    _known_to_inspect()
    for spec in specs:
        torch.library.register_fake(spec.qualified, spec.fake(), lib=library)
        library.impl(spec.name, spec.cpu(cpu_functions.get(spec.name)), "CPU")
    # Ops without a backward have torch's autograd fallback, which only warns when a backward
    # passes through them (and the gradient is lost): make that an error naming the op.
    warnings.filterwarnings(
        "error",
        message=re.escape(namespace) + r"::\w+: an autograd kernel was not registered",
        category=UserWarning,
    )
    _libraries.append(library)
    _namespaces[namespace] = manifest
