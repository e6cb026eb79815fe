"""Semantic versions and version ranges, as kernel packages use them.

    Version.parse("1.2.3-rc.1")
    Range.parse(">=1.1,<2").matches(Version.parse("1.4.0"))    # True
    Range.parse("^1.2")      # >=1.2.0,<2.0.0      ("^0.3" -> >=0.3.0,<0.4.0)
    Range.parse("~=1.4")     # >=1.4.0,<2.0.0      ("~=1.4.2" -> >=1.4.2,<1.5.0)
    Range.parse("1.1.2")     # ==1.1.2

Pre-releases sort before their release and match a range only when a bound names one.
"""

from __future__ import annotations

import re
from functools import total_ordering

_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


class _Frozen:
    """Immutable value classes with equality and hashing over `_fields` (plain classes rather than
    frozen dataclasses: creating those costs about a millisecond per class at `import kjit`)."""

    __slots__ = ()
    _fields: tuple = ()

    def __init__(self, *values):
        assert len(values) == len(self._fields)
        for name, value in zip(self._fields, values):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field '{name}' of an immutable {type(self).__name__}")

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other):
        return type(other) is type(self) and self._values() == other._values()

    def __hash__(self):
        return hash((type(self).__name__, self._values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"


@total_ordering
class Version(_Frozen):
    __slots__ = _fields = ("major", "minor", "patch", "pre")

    def __init__(self, major: int, minor: int, patch: int, pre: tuple = ()):
        super().__init__(major, minor, patch, pre)

    @staticmethod
    def parse(text: str, partial: bool = False) -> "Version":
        match = _VERSION.match(text.strip())
        if not match or (not partial and (match.group(2) is None or match.group(3) is None)):
            raise ValueError(f"'{text}' is not a semantic version (MAJOR.MINOR.PATCH)")
        pre = ()
        if match.group(4):
            pre = tuple(int(p) if p.isdigit() else p for p in match.group(4).split("."))
        return Version(int(match.group(1)), int(match.group(2) or 0), int(match.group(3) or 0), pre)

    def _key(self):
        # A release sorts after its pre-releases; numeric identifiers before alphanumeric ones.
        pre = tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre)

    def __lt__(self, other: "Version") -> bool:
        return self._key() < other._key()

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        return text + ("-" + ".".join(map(str, self.pre)) if self.pre else "")


_CLAUSE = re.compile(r"^(>=|<=|==|!=|~=|>|<|\^|~)?\s*(\S+)$")


class Range(_Frozen):
    __slots__ = _fields = ("clauses", "text")  # clauses: (operator, Version) pairs

    def __init__(self, clauses: tuple, text: str):
        super().__init__(clauses, text)

    @staticmethod
    def parse(text: str) -> "Range":
        clauses = []
        parts = [p.strip() for p in str(text).split(",")]
        if not any(parts):
            raise ValueError("an empty version range")
        for part in parts:
            match = _CLAUSE.match(part)
            if not match:
                raise ValueError(f"'{part}' is not a version constraint (>=, <, ==, ~=, ^)")
            op, version_text = match.group(1) or "==", match.group(2)
            dots = version_text.lstrip("v").split("-")[0].count(".")
            version = Version.parse(version_text, partial=True)
            if op == "^":
                if version.major > 0 or dots == 0:
                    upper = Version(version.major + 1, 0, 0)
                elif version.minor > 0 or dots == 1:
                    upper = Version(0, version.minor + 1, 0)
                else:
                    upper = Version(0, 0, version.patch + 1)
                clauses += [(">=", version), ("<", upper)]
            elif op in ("~=", "~"):
                if dots == 0:
                    raise ValueError(f"'{part}' needs at least MAJOR.MINOR")
                upper = (
                    Version(version.major + 1, 0, 0)
                    if dots == 1
                    else Version(version.major, version.minor + 1, 0)
                )
                clauses += [(">=", version), ("<", upper)]
            elif op == "==" and dots < 2:
                # "==1.2" means any 1.2.x
                upper = (
                    Version(version.major + 1, 0, 0)
                    if dots == 0
                    else Version(version.major, version.minor + 1, 0)
                )
                clauses += [(">=", version), ("<", upper)]
            else:
                clauses.append((op, version))
        return Range(tuple(clauses), str(text))

    def matches(self, version: Version) -> bool:
        if version.pre:
            base = (version.major, version.minor, version.patch)
            if not any(v.pre and (v.major, v.minor, v.patch) == base for _, v in self.clauses):
                return False
        for op, bound in self.clauses:
            ok = {
                ">=": version >= bound,
                ">": version > bound,
                "<=": version <= bound,
                "<": version < bound,
                "==": version == bound,
                "!=": version != bound,
            }[op]
            if not ok:
                return False
        return True

    def __str__(self) -> str:
        return self.text
