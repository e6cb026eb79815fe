"""kjit: CUDA kernels compiled at first use, cached, and exposed as torch ops.

    import kjit, torch
    img2gray = kjit.load("img2gray")        # finds the package, registers its ops
    gray = img2gray.img2gray(image)         # == torch.ops.img2gray.img2gray(image)

    k = kjit.RawKernel(source, "my_kernel")
    k((blocks,), (256,), (x, y, n))         # tensors, ints, floats, bools
"""

from __future__ import annotations

import importlib.util
import os
import threading
import types
from pathlib import Path
from typing import Iterable, Sequence

import torch

from . import _C
from ._errors import (
    CacheError,
    CompileError,
    DriverError,
    Error,
    LaunchError,
    ManifestError,
    PackageNotFoundError,
)

__all__ = [
    "load",
    "RawKernel",
    "cache_info",
    "search_path",
    "Error",
    "CompileError",
    "ManifestError",
    "LaunchError",
    "DriverError",
    "CacheError",
    "PackageNotFoundError",
]
__version__ = _C.version()

_lock = threading.Lock()
_loaded: dict[str, types.ModuleType] = {}  # manifest path -> module
_impl_libraries: list = []  # torch.library.Library objects kept alive


def _installed_kernels() -> Path:
    """The kernel packages installed with kjit (kernels_src/ of the source tree)."""
    return Path(_C.__file__).resolve().parent / "kernels"


def search_path() -> list[Path]:
    """Where `load` looks for packages by name: `KJIT_PATH` entries, then kjit's own."""
    roots = [Path(p) for p in os.environ.get("KJIT_PATH", "").split(os.pathsep) if p]
    return roots + [_installed_kernels()]


def _find(name_or_path: str | os.PathLike) -> Path:
    candidate = Path(name_or_path)
    if candidate.is_file() and candidate.name == "kernel.toml":
        return candidate.parent
    if (candidate / "kernel.toml").is_file():
        return candidate
    name = str(name_or_path)
    for root in search_path():
        if (root / name / "kernel.toml").is_file():
            return root / name
    roots = ", ".join(str(r) for r in search_path())
    raise PackageNotFoundError(
        f"no kernel package '{name}': not a folder with a kernel.toml, and not in the search "
        f"path ({roots}); set KJIT_PATH to add folders"
    )


def _package_module(info: dict) -> types.ModuleType | None:
    init = Path(info["dir"]) / "__init__.py"
    if not init.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"kjit_packages.{info['name']}", init)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(name_or_path: str | os.PathLike) -> types.ModuleType:
    """Loads a kernel package (a name on the search path, or a folder) and registers its ops.

    Returns a module with one callable per op: `torch.ops.<package>.<op>` itself, so calls go
    straight to the dispatcher. Loading the same package again returns the same module.
    Raises ManifestError for a broken manifest, PackageNotFoundError for an unknown name.
    """
    path = _find(name_or_path)
    with _lock:
        manifest = str((path / "kernel.toml").resolve())
        if manifest in _loaded:
            return _loaded[manifest]
        info = _C.load_package(path)
        namespace = info["name"]
        python = None
        cpu_ops = [op for op in info["ops"] if op["cpu"]]
        if cpu_ops:
            python = _package_module(info)
            if python is None:
                raise ManifestError(
                    f"{info['manifest']}: op.{cpu_ops[0]['name']}.cpu: names "
                    f"'{cpu_ops[0]['cpu']}' but the package has no __init__.py"
                )
            library = torch.library.Library(namespace, "IMPL")
            for op in cpu_ops:
                function = getattr(python, op["cpu"], None)
                if function is None:
                    raise ManifestError(
                        f"{info['manifest']}: op.{op['name']}.cpu: the package's __init__.py "
                        f"has no function '{op['cpu']}'"
                    )
                library.impl(op["hidden_cpu_op"], function, "CPU")
            _impl_libraries.append(library)

        module = types.ModuleType(namespace)
        lines = [f"kjit package {namespace} {info['version']}: {info['description']}", ""]
        namespace_ops = getattr(torch.ops, namespace)
        for op in info["ops"]:
            packet = getattr(namespace_ops, op["name"])
            setattr(module, op["name"], packet)
            lines.append(f"{op['schema']}" + (f"\n    {op['doc']}" if op["doc"] else ""))
        module.__doc__ = "\n".join(lines)
        module.__version__ = info["version"]
        module.__file__ = info["manifest"]
        module.ops = [op["name"] for op in info["ops"]]
        module.schemas = {op["name"]: op["schema"] for op in info["ops"]}
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
