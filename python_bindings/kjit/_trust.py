"""Whose Python code kjit runs: the trust policy for kernel packages.

A package's CUDA sources are compiled by NVRTC and run on the GPU in any case; its `__init__.py`
(the CPU implementations) runs in this process only when the package is trusted:

- packages shipped with kjit, and packages installed as wheels (the user ran pip);
- packages in folders the user named: `kjit.load(path)`, the folders of `KJIT_PATH`;
- fetched packages (and locked or bundled ones) whose source is a trusted source: a URL or a
  folder listed in `KJIT_TRUSTED_SOURCES` (whitespace-separated) or under `trusted_sources` in
  `$XDG_CONFIG_HOME/kjit/config.toml` (else `~/.config/kjit/config.toml`). An entry ending in
  `/` trusts everything below it; others must match exactly;
- any package loaded with `trust=True`.

A project's pyproject.toml cannot grant trust: it comes with the repository it describes.
Ops of an untrusted package work on CUDA tensors; their CPU kernel raises TrustError.
"""

from __future__ import annotations

import os
from pathlib import Path

from ._errors import Error


def tomllib_module():
    """Python's tomllib, imported at need (it costs ~3 ms, a third of a warm kjit.load); None
    before Python 3.11."""
    try:
        import tomllib
    except ImportError:
        return None
    return tomllib


class TrustError(Error, PermissionError):
    """Code of an untrusted kernel package was not run."""


def config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "kjit" / "config.toml"


def trusted_sources() -> list[str]:
    """The trusted sources from the environment and the user's configuration file."""
    sources = os.environ.get("KJIT_TRUSTED_SOURCES", "").split()
    path = config_file()
    if path.is_file():
        tomllib = tomllib_module()
        if tomllib is None:
            raise Error(f"reading '{path}' needs Python 3.11 (tomllib)")
        try:
            listed = tomllib.loads(path.read_text()).get("trusted_sources", [])
        except (OSError, ValueError) as e:
            raise Error(f"cannot read kjit configuration '{path}': {e}") from e
        if not isinstance(listed, list) or not all(isinstance(s, str) for s in listed):
            raise Error(f"'{path}': trusted_sources must be a list of strings")
        sources += listed
    return sources


def _matches(source: str, entry: str) -> bool:
    if entry.endswith("/"):
        return source.startswith(entry)
    return source == entry or source == entry.rstrip("/")


def source_trusted(source: str) -> bool:
    """Whether `source` (a URL, or a folder) is listed as trusted."""
    if not source:
        return False
    candidates = {source}
    if not ("://" in source or "@" in source):
        candidates.add(os.path.realpath(source))
    return any(_matches(s, entry) or _matches(s + "/", entry) for s in candidates for entry in trusted_sources())


def untrusted_cpu_kernel(namespace: str, op: str, why: str):
    """A CPU implementation that refuses to run, for ops of untrusted packages."""

    def refuse(*args, **kwargs):
        raise TrustError(
            f"{namespace}.{op}: the CPU implementation of this package was not run: {why}. "
            "Pass trust=True to kjit.load, or list the source in KJIT_TRUSTED_SOURCES or in "
            f"trusted_sources of {config_file()}; CUDA tensors work without it"
        )

    refuse.__name__ = f"untrusted_{op}"
    return refuse
