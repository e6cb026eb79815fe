"""kjit: CUDA kernels compiled at first use, cached, and exposed as torch ops.

    import kjit, torch
    img2gray = kjit.load("img2gray")        # finds the package, registers its ops
    gray = img2gray.img2gray(image)         # == torch.ops.img2gray.img2gray(image)

    k = kjit.RawKernel(source, "my_kernel")
    k((blocks,), (256,), (x, y, n))         # tensors, ints, floats, bools

    kjit.kernelize(model, mode="training")  # a transformers model's norms and MLPs on kjit
    kjit.tuning.entries()                   # the tuned launch configurations in the store
"""

# Note [Lazy kjit]: `import kjit` imports neither torch nor the extension; the first use of
# anything in the API does (kjit._api). So the `kjit` command's C++ subcommands start in
# milliseconds (they never need torch), and a program pays for torch once, where it uses it.

__all__ = [
    "load",
    "load_locked",
    "fetch",
    "versions",
    "RawKernel",
    "cache_info",
    "search_path",
    "kernelize",
    "tuning",
    "register_layer",
    "KernelizeReport",
    "Error",
    "CompileError",
    "ManifestError",
    "LaunchError",
    "DriverError",
    "NvrtcError",
    "CacheError",
    "PackageNotFoundError",
    "LockError",
    "FetchError",
    "TrustError",
    "UnsafeInputError",
]


def __getattr__(name: str):
    import importlib
    import importlib.util

    if name.startswith("__") and name != "__version__":
        raise AttributeError(f"module 'kjit' has no attribute {name!r}")
    if name == "tuning" or (
        name.startswith("_") and name != "__version__" and importlib.util.find_spec(f"{__name__}.{name}")
    ):
        return importlib.import_module(f"{__name__}.{name}")  # a submodule: kjit._C, kjit._packages
    api = importlib.import_module(f"{__name__}._api")
    try:
        value = getattr(api, name)
    except AttributeError:
        raise AttributeError(f"module 'kjit' has no attribute {name!r}") from None
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__) | {"__version__"})
