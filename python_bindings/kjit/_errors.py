"""kjit's exception classes (raised from the C++ runtime as well)."""


class Error(RuntimeError):
    """Base of every kjit error."""


class CompileError(Error):
    """NVRTC could not compile a kernel. Attributes: log, options, arch, program_name,
    result_name."""


class ManifestError(Error, ValueError):
    """A kernel package's manifest is wrong. Attributes: file, location, line, column."""


class LaunchError(Error, ValueError):
    """A kernel launch was refused (wrong arguments, unknown kernel, driver error)."""


class DriverError(Error):
    """No CUDA driver, or a driver call failed. Attributes: code, code_name."""


class NvrtcError(Error):
    """No usable NVRTC was found: the message lists what was searched and what to install
    (``pip install nvidia-cuda-nvrtc``). Only compiling needs NVRTC."""


class CacheError(Error):
    """An explicit kernel cache operation failed."""


class PackageNotFoundError(Error, LookupError):
    """No kernel package of that name is on the search path."""
