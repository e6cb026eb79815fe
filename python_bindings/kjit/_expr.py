"""Evaluation of manifest expressions in Python, for fake kernels (symbolic sizes) and CPU
implementations (concrete values).

The C++ parser does the parsing and type checking (`kjit::detail::Expr`); `_C.load_package`
hands over its node arrays, and `compile` turns one into a closure over the call's values. The
semantics are those of `kjit::detail::Evaluator` (runtime/manifest/expr.hpp): concrete integers are
checked (overflow and division by zero raise EvalError), division truncates as in C++, and a
symbolic divisor is guarded non-zero; the rest is left to torch's SymInt arithmetic.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

# kjit's DType numbers (c10::ScalarType's), their torch dtypes and names.
DTYPES = {
    0: torch.uint8,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.int64,
    5: torch.float16,
    6: torch.float32,
    7: torch.float64,
    11: torch.bool,
    15: torch.bfloat16,
}
CODES = {dtype: code for code, dtype in DTYPES.items()}
NAMES = {
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bool: "bool",
    torch.bfloat16: "bfloat16",
}

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class EvalError(Exception):
    """An evaluation failed (division by zero, dimension out of range): the message says which."""


def _float_div(p: float, q: float) -> float:
    """IEEE division, as C++: a zero divisor gives an infinity or NaN, never an exception."""
    if q != 0:
        return p / q
    return math.nan if p == 0 or math.isnan(p) else math.copysign(math.inf, p) * math.copysign(1, q)


def dtype_code(dtype: torch.dtype) -> int:
    return CODES.get(dtype, -1)


def dtype_name(dtype: torch.dtype) -> str:
    return NAMES.get(dtype) or str(dtype).replace("torch.", "")


def compile(expr: dict) -> Callable[[list], Any]:
    """The closure evaluating `expr` (as exported by _C) over `values`, the call's arguments and
    outputs by symbol index."""
    nodes = expr["nodes"]
    text = expr["text"]

    def fail(message: str):
        raise EvalError(f"{message} in '{text}'")

    def checked(op: str, a: int, b: int) -> int:
        if op in ("div", "mod", "cdiv") and b == 0:
            fail("division by zero")
        if op == "add":
            r = a + b
        elif op == "sub":
            r = a - b
        elif op == "mul":
            r = a * b
        else:
            if a == _INT64_MIN and b == -1:
                fail("integer overflow")
            q = abs(a) // abs(b)
            q = q if (a < 0) == (b < 0) else -q  # truncated, as C++
            if op == "div":
                r = q
            elif op == "mod":
                r = a - b * q
            else:
                r = q + 1 if a - b * q != 0 and (a < 0) == (b < 0) else q
        if r < _INT64_MIN or r > _INT64_MAX:
            fail("integer overflow")
        return r

    def arithmetic(op: str, a, b):
        if isinstance(a, int) and isinstance(b, int):
            return checked(op, a, b)
        if op == "add":
            return a + b
        if op == "sub":
            return a - b
        if op == "mul":
            return a * b
        if b == 0:  # guards a symbolic divisor
            fail("division by zero")
        if op == "div":
            return a // b
        if op == "mod":
            return a % b
        return (a + b - 1) // b

    def absent(symbol_node: int):
        name = text[nodes[symbol_node][7] - 1 :].split("(")[0]
        name = "".join(c for c in name if c.isalnum() or c == "_") if name else "an argument"
        fail(f"'{name}' is None (an absent optional argument); ask present({name}) first")

    def leaf(symbol_node: int) -> Callable:
        """values[symbol], checked present when the symbol is optional."""
        symbol, optional = nodes[symbol_node][2], nodes[symbol_node][4]
        if not optional:
            return lambda values: values[symbol]

        def present(values):
            v = values[symbol]
            if v is None:
                absent(symbol_node)
            return v

        return present

    def plain(x) -> int:
        return x if isinstance(x, int) else int(x)  # guards a symbolic value

    def dimension(tensor_node: int, dim_node: int) -> Callable:
        tensor = leaf(tensor_node)
        dim = build(dim_node)

        def wrapped(values):
            t = tensor(values)
            rank = t.dim()
            d = int(dim(values))
            w = d + rank if d < 0 else d
            if w < 0 or w >= rank:
                fail(f"dimension {d} is out of range for a tensor of {rank} dimensions")
            return t, w

        return wrapped

    def next_pow2(n: int) -> int:
        if n > 1 << 62:
            fail("integer overflow in next_pow2")
        return 1 if n <= 1 else 1 << (n - 1).bit_length()

    def build(i: int) -> Callable:
        op, kind, a, b, value, number, c = nodes[i][:7]
        if op == "int":
            return lambda values: value
        if op == "float":
            return lambda values: number
        if op == "bool":
            return lambda values: value != 0
        if op == "dtype":
            return lambda values: value
        if op == "symbol":
            get = leaf(i)
            if kind == "dtype":
                return lambda values: dtype_code(get(values))
            if kind == "float":
                return lambda values: float(get(values))
            if kind == "bool":
                return lambda values: bool(get(values))
            return get
        if op == "present":
            symbol = nodes[a][2]
            return lambda values: values[symbol] is not None
        if op == "select":
            cond, x, y = build(a), build(b), build(c)
            if kind == "float":
                return lambda values: float(x(values)) if cond(values) else float(y(values))
            return lambda values: x(values) if cond(values) else y(values)
        if op == "next_pow2":
            x = build(a)
            return lambda values: next_pow2(plain(x(values)))
        if op == "gcd":
            x, y = build(a), build(b)

            def gcd(values):
                p, q = plain(x(values)), plain(y(values))
                if p == _INT64_MIN or q == _INT64_MIN:
                    fail("integer overflow in gcd")
                return math.gcd(p, q)

            return gcd
        if op == "len":
            lst = leaf(a)
            return lambda values: len(lst(values))
        if op == "item":
            lst, index = leaf(a), build(b)

            def item(values):
                items, raw = lst(values), plain(index(values))
                k = raw + len(items) if raw < 0 else raw
                if k < 0 or k >= len(items):
                    fail(f"index {raw} is out of range for a list of {len(items)}")
                return items[k]

            return item
        if op in ("aligned", "device_prop"):
            raise EvalError(f"internal: '{text}' reads what only a launch knows")
        if op == "neg":
            x = build(a)
            if kind == "float":
                return lambda values: -x(values)
            return lambda values: arithmetic("sub", 0, x(values))
        if op == "not":
            x = build(a)
            return lambda values: not x(values)
        if op in ("add", "sub", "mul", "div", "mod", "cdiv"):
            x, y = build(a), build(b)
            if kind == "float":
                fn = {
                    "add": lambda p, q: p + q,
                    "sub": lambda p, q: p - q,
                    "mul": lambda p, q: p * q,
                    "div": _float_div,
                }[op]
                return lambda values: fn(float(x(values)), float(y(values)))
            return lambda values: arithmetic(op, x(values), y(values))
        if op in ("min", "max"):
            x, y = build(a), build(b)
            if kind == "float":
                pick = min if op == "min" else max
                return lambda values: pick(float(x(values)), float(y(values)))
            sym = torch.sym_min if op == "min" else torch.sym_max
            pick = min if op == "min" else max

            def minmax(values):
                p, q = x(values), y(values)
                return pick(p, q) if isinstance(p, int) and isinstance(q, int) else sym(p, q)

            return minmax
        if op in ("and", "or"):
            x, y = build(a), build(b)
            if op == "and":
                return lambda values: bool(x(values)) and bool(y(values))
            return lambda values: bool(x(values)) or bool(y(values))
        if op in ("eq", "ne", "lt", "le", "gt", "ge"):
            x, y = build(a), build(b)
            left, right = nodes[a][1], nodes[b][1]
            as_float = left == "float" or right == "float"
            compare = {
                "eq": lambda p, q: p == q,
                "ne": lambda p, q: p != q,
                "lt": lambda p, q: p < q,
                "le": lambda p, q: p <= q,
                "gt": lambda p, q: p > q,
                "ge": lambda p, q: p >= q,
            }[op]
            if as_float:
                return lambda values: compare(float(x(values)), float(y(values)))
            return lambda values: bool(compare(x(values), y(values)))
        if op in ("size", "stride"):
            where = dimension(a, b)
            if op == "size":

                def size(values):
                    t, d = where(values)
                    return t.shape[d]

                return size

            def stride(values):
                t, d = where(values)
                return t.stride(d)

            return stride
        tensor = leaf(a) if a >= 0 else None
        if op == "numel":
            return lambda values: tensor(values).numel()
        if op == "dim":
            return lambda values: tensor(values).dim()
        if op == "dtype_of":
            return lambda values: dtype_code(tensor(values).dtype)
        if op == "is_contiguous":
            return lambda values: bool(tensor(values).is_contiguous())
        raise EvalError(f"internal: unknown node '{op}' in '{text}'")

    return build(expr["root"])
