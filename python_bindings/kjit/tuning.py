"""Autotuning of kjit ops' launch parameters (Note [Tuning]).

An op whose manifest declares `tune` parameters is tuned at its first CUDA call for each bucket
(its `tune_key` values and tensor dtypes) on each device: every candidate that `tune_valid`
keeps is timed on the device, and the fastest is kept in the kernel store, so later processes
(and hosts that import the store) pay nothing. `KJIT_AUTOTUNE=0` turns tuning off (configurations
already in the stores are still used); `KJIT_TUNE_BUDGET` bounds the seconds per bucket (30).

    import kjit, kjit.tuning
    norm = kjit.load("norm")
    kjit.tuning.parameters(norm.rms_norm)        # {'BLOCK': [64, 128, ...]}
    with kjit.tuning.using(norm.rms_norm, {"BLOCK": 256}):
        y = norm.rms_norm(x, w)                  # this configuration, for every call
    kjit.tuning.entries("norm::rms_norm")        # what the stores hold, with every timing
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Iterator, Mapping, Union

from . import _C, _api
from ._errors import Error

Config = Union[str, Mapping[str, int]]


def _qualified(op) -> str:
    """'ns::name' of torch.ops.ns.name, one of its overloads, or a string 'ns::name' / 'ns.name'."""
    if isinstance(op, str):
        name = op.replace(".", "::", 1) if "::" not in op else op
    else:
        name = getattr(op, "_qualified_op_name", None)  # an OpOverloadPacket
        if name is None and hasattr(op, "name"):  # an OpOverload: 'ns::name' or 'ns::name.overload'
            name = op.name().split(".")[0]
        if name is None:
            raise TypeError(f"expected a kjit op (torch.ops.NS.OP) or 'NS::OP', not {op!r}")
    if name not in _api._ops:
        raise Error(f"'{name}' is not an op of a package kjit has loaded (kjit.load it first)")
    return name


def parameters(op) -> dict[str, list[int]]:
    """The op's tune parameters and their candidate values, in the manifest's order."""
    return {name: list(values) for name, values in _api._ops[_qualified(op)]["tune"]}


def candidates(op) -> list[dict[str, int]]:
    """Every combination of the candidate values (before `tune_valid`, which depends on the
    arguments), the first parameter varying slowest."""
    params = parameters(op)
    return [dict(zip(params, values)) for values in itertools.product(*params.values())]


def use(op, config: Config = "tuned") -> None:
    """How the op's CUDA calls pick their tune parameters from now on: "tuned" (per bucket, the
    default), "default" (the package's rule, tune_default) or a configuration {name: value} for
    every call (a call it does not fit, by tune_valid, raises ValueError)."""
    name = _qualified(op)
    params = parameters(name)
    if not params:
        raise Error(f"op '{name}' has no tune parameters")
    ns, op_name = name.split("::")
    if isinstance(config, str):
        if config not in ("tuned", "default"):
            raise ValueError(f"config is 'tuned', 'default' or a mapping of {list(params)}; got {config!r}")
        _C.set_tune_mode(ns, op_name, config)
        return
    unknown = sorted(set(config) - set(params))
    missing = [p for p in params if p not in config]
    if unknown or missing:
        raise ValueError(
            f"op '{name}' has tune parameters {list(params)}"
            + (f"; unknown: {unknown}" if unknown else "")
            + (f"; missing: {missing}" if missing else "")
        )
    _C.set_tune_mode(ns, op_name, "fixed", [int(config[p]) for p in params])


@contextlib.contextmanager
def using(op, config: Config) -> Iterator[None]:
    """`use(op, config)` inside the block, "tuned" after it."""
    use(op, config)
    try:
        yield
    finally:
        use(op, "tuned")


def forget(op) -> None:
    """Forgets the configurations this process looked up or tuned for the op; the stores keep
    theirs (`kjit cache rm` removes entries)."""
    ns, op_name = _qualified(op).split("::")
    _C.forget_tuned(ns, op_name)


def entries(op=None) -> list[dict]:
    """The tuned configurations of the stores (the writable one, then the read-only ones), each
    with its op, bucket, device, best values, every candidate's time (ms; inf for a failure, with
    the error) and the tuning's cost in seconds; only the op's when given."""
    found = _C.tuned_entries()
    if op is not None:
        name = _qualified(op) if not isinstance(op, str) or "::" not in op else op
        found = [e for e in found if e["op"] == name]
    return found
