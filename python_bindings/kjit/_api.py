"""kjit's Python API (re-exported by `kjit`; imported at first use of any of it)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Iterable, Sequence

import torch

from . import _C, _torch_layer

# NVRTC is looked for in every site-packages of this interpreter (Note [Finding NVRTC]).
_torch_layer.attach()
_C.set_python_paths([p for p in sys.path if p])
from . import _locking, _packages
from ._kernelize import KernelizeReport, kernelize, register_layer  # noqa: F401 (the API)
from ._errors import (
    CacheError,
    CompileError,
    DriverError,
    NvrtcError,
    Error,
    LaunchError,
    ManifestError,
    PackageNotFoundError,
)
from ._packages import FetchError, LockError
from ._safety import UnsafeInputError
from . import _trust
from ._trust import TrustError, untrusted_cpu_kernel
from ._versions import Range, Version

# The public names are listed in kjit/__init__.py (__all__), which re-exports them.
__version__ = _C.version()

# Kernels compiled in this process reach the fleet's remote cache before it exits (Note
# [Remote tier]); the runtime itself lives until the end of the process.
atexit.register(_C.flush_remote)

_lock = threading.Lock()
_loaded: dict[str, types.ModuleType] = {}  # manifest path -> module
_ops: dict[str, dict] = {}  # "namespace::op" -> its spec as load_package gave it (kjit.tuning)


def search_path() -> list[Path]:
    """Where `load` looks for packages by name: `KJIT_PATH` folders, the package store
    (`KJIT_PACKAGES_DIR`), then the packages installed with kjit; then wheels (entry points)."""
    return _packages.search_path()


def versions(name: str) -> list[str]:
    """The installed versions of package `name`, ascending."""
    return [str(v) for v in sorted({c.version for c in _packages.candidates(name)})]


def fetch(url: str, version: str | None = None, refresh: bool = True) -> Path:
    """Fetches a kernel package from a git repository (tags vX.Y.Z; `version` a range, or a
    commit hash to pin) into the package store; returns its folder. Asks the remote for its
    newest matching tag unless refresh=False (then a fetched copy that matches serves); a remote
    that cannot be reached, with a matching copy fetched before, is a warning. Not with
    KJIT_OFFLINE=1."""
    return _packages.fetch(url, version, refresh).path


def _package_module(info: dict, source: bytes | None) -> types.ModuleType | None:
    """The package's `__init__.py` run from `source` (read once, or the verified bytes of a
    lock): never through the import system, so no bytecode cache is read or written and the
    module cannot import siblings from its folder."""
    init = Path(info["dir"]) / "__init__.py"
    if source is None:
        if not init.is_file():
            return None
        source = _packages.read_regular(init)
    module = types.ModuleType(f"kjit_packages.{info['namespace']}")
    module.__file__ = str(init)
    exec(compile(source, str(init), "exec", dont_inherit=True), module.__dict__)
    return module


def load(name_or_path: str | os.PathLike, version: str | None = None, trust: bool = False) -> types.ModuleType:
    """Loads a kernel package and registers its ops.

    `name_or_path`: a package name (searched in `search_path()` and installed wheels), a folder
    with a kernel.toml, or a git URL (fetched into the package store on first use unless
    KJIT_OFFLINE=1; later a fetched copy that matches `version` serves without network: `kjit
    fetch URL` or kjit.fetch refreshes). `version`: a range such as ">=1.1,<2", "^1.2", "~=1.4", or an exact "1.1.2";
    the highest matching version wins.

    Returns a module with one callable per op: `torch.ops.<namespace>.<op>` itself, so calls go
    straight to the dispatcher. The namespace is the package name for major versions 0 and 1,
    `<name>_v<major>` from 2 on, so two major versions load side by side. Loading the same package
    again returns the same module. Raises ManifestError for a broken manifest,
    PackageNotFoundError when nothing matches.

    The package's Python code (CPU implementations) runs only when the package is trusted or
    `trust` is true (see the trust policy in kjit._trust): a package fetched from a source that is
    not listed as trusted gets ops whose CPU kernel raises TrustError.
    """
    candidate = _packages.locate(name_or_path, version)
    trusted = trust or candidate.trusted
    return _register(candidate.path, _packages.namespace_for(candidate.name, candidate.version), trusted)


_snapshots: list[str] = []


def _snapshot(name: str, contents: dict[str, bytes]) -> Path:
    """A private copy (mode 0700, removed at exit) of a locked package's verified bytes, so that
    what is compiled is what was checked, whatever happens to the original folder later."""
    if not _snapshots:
        atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in _snapshots])
    folder = tempfile.mkdtemp(prefix=f"kjit-locked-{name}-")
    _snapshots.append(folder)
    path = Path(folder) / "package"
    _packages.write_files(path, contents)
    return path


def load_locked(name: str, lock: str | os.PathLike | None = None, trust: bool = False) -> types.ModuleType:
    """Loads exactly the version of `name` in the lock file (`lock`, else `KJIT_LOCK`, else
    kjit.lock in the working folder or a parent), after checking every file's hash: a package
    whose files differ from the lock raises LockError and is never compiled. A lock written by
    `kjit bundle` also brings its pre-warmed read-only store.

    What is compiled and run is the bytes that were checked (a private copy of them), never a
    bytecode cache. Python code runs when the entry's source is trusted or `trust` is true; a
    lock itself grants no trust."""
    lock_path = Path(lock) if lock is not None else _locking.find_lock()
    path, entry, contents = _locking.verified_package(name, lock_path)
    data = _locking.read_lock(lock_path)
    if data.get("store"):
        store = _packages.check_relative(str(data["store"]))
        _C.add_read_only_cache(lock_path.parent / store, _packages.namespace_for(name, Version.parse(entry["version"])))
    source = entry.get("source", "")
    trusted = (
        trust
        or _trust.source_trusted(source)
        or _trust.source_trusted(str(path))
        or (not source and _packages.trusted_folder(path))
    )
    snapshot = _snapshot(name, contents)
    namespace = _packages.namespace_for(name, Version.parse(entry["version"]))
    return _register(snapshot, namespace, trusted, key=str(path), origin=source or str(path))


def _register(
    path: Path, namespace: str, trusted: bool, key: str | None = None, origin: str | None = None
) -> types.ModuleType:
    with _lock:
        manifest = key or str((path / "kernel.toml").resolve())
        if manifest in _loaded:
            return _loaded[manifest]
        info = _C.load_package(path, namespace)
        if (path / "kernels.sqlite").is_file():  # a wheel's pre-warmed store, for its own kernels
            _C.add_read_only_cache(path / "kernels.sqlite", info["namespace"])
        cpu_ops = [op for op in info["ops"] if op["cpu"]]
        functions = {}
        if cpu_ops and trusted:
            python = _package_module(info, None)
            if python is None:
                raise ManifestError(
                    f"{info['manifest']}: op.{cpu_ops[0]['name']}.cpu: names "
                    f"'{cpu_ops[0]['cpu']}' but the package has no __init__.py"
                )
        for op in cpu_ops:
            if not trusted:
                why = f"package '{info['name']}' from '{origin or path}' is not from a trusted source"
                functions[op["name"]] = untrusted_cpu_kernel(namespace, op["name"], why)
                continue
            function = getattr(python, op["cpu"], None)
            if function is None:
                raise ManifestError(
                    f"{info['manifest']}: op.{op['name']}.cpu: the package's __init__.py "
                    f"has no function '{op['cpu']}'"
                )
            functions[op["name"]] = function
        _torch_layer.register(info, functions)
        for op in info["ops"]:
            _ops[f"{info['namespace']}::{op['name']}"] = op

        module = types.ModuleType(namespace)
        lines = [f"kjit package {namespace} {info['version']}: {info['description']}", ""]
        namespace_ops = getattr(torch.ops, namespace)
        for op in info["ops"]:
            packet = getattr(namespace_ops, op["name"])
            setattr(module, op["name"], packet)
            lines.append(f"{op['schema']}" + (f"\n    {op['doc']}" if op["doc"] else ""))
        module.__doc__ = "\n".join(lines)
        module.__version__ = info["version"]
        module.namespace = namespace
        module.__file__ = info["manifest"]
        module.ops = [op["name"] for op in info["ops"]]
        module.schemas = {op["name"]: op["schema"] for op in info["ops"]}
        module.trusted = trusted
        _loaded[manifest] = module
        return module


class RawKernel:
    """A kernel from CUDA source, launched by hand:

        k = kjit.RawKernel(src, "axpy")
        k((blocks,), (256,), (a, x, y, n))        # on torch's current stream

    Tensors pass their data pointer; ints and floats are packed to the size of the kernel's
    parameter (from the driver), bools as one byte. A wrong count or size raises LaunchError.
    """

    def __init__(
        self,
        source: str,
        name: str,
        options: Iterable[str] = (),
        include_dirs: Iterable[str | os.PathLike] = (),
        name_expressions: Iterable[str] = (),
    ):
        self._kernel = _C.RawKernel(
            source, name, list(options), [Path(p) for p in include_dirs], list(name_expressions)
        )

    @property
    def name(self) -> str:
        return self._kernel.name

    def compile(self, arch: str | None = None) -> int:
        """Compiles now: for `arch` (e.g. "sm_90", no GPU needed) or for the current device.
        Returns the binary's size (compile) or the parameter count (device). Raises CompileError."""
        if arch is not None:
            return self._kernel.compile(arch)
        return len(self._kernel.prepare())

    def __call__(
        self,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence,
        stream=None,
        shared_mem: int = 0,
    ) -> None:
        kinds = []
        values = []
        device = None
        for i, arg in enumerate(args):
            if isinstance(arg, torch.Tensor):
                if not arg.is_cuda:
                    raise LaunchError(
                        f"kernel '{self.name}': argument {i} is a tensor on {arg.device}, "
                        "expected a CUDA tensor"
                    )
                if device is None:
                    device = arg.device
                elif arg.device != device:
                    raise LaunchError(
                        f"kernel '{self.name}': argument {i} is on {arg.device}, "
                        f"the others on {device}"
                    )
                kinds.append("p")
                values.append(arg.data_ptr())
            elif isinstance(arg, bool):
                kinds.append("b")
                values.append(arg)
            elif isinstance(arg, int):
                kinds.append("i")
                values.append(arg)
            elif isinstance(arg, float):
                kinds.append("f")
                values.append(arg)
            else:
                raise LaunchError(
                    f"kernel '{self.name}': argument {i} is a {type(arg).__name__}; "
                    "pass tensors, ints, floats or bools"
                )
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        with torch.cuda.device(device):
            if stream is None:
                handle = torch.cuda.current_stream(device).cuda_stream
            elif isinstance(stream, int):
                handle = stream
            else:
                handle = stream.cuda_stream
            self._kernel.launch(list(grid), list(block), "".join(kinds), values, handle, shared_mem)


def cache_info() -> dict:
    """The kernel cache: path, whether enabled or read-only, this process's counters
    ("process") and the store's persistent counters and size ("store")."""
    return _C.cache_info()
