"""Checks for input that comes from outside: repository URLs, names and versions from manifests,
locks and tags, and the files of a package folder. See ARCHITECTURE.md, "Threat model".

Code behind these checks may assume valid names, versions and paths.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from ._errors import Error

# The transports `kjit fetch` uses. `http` is refused (no integrity), and so are git's `ext::`
# and `fd::` (they run commands or use descriptors), and every other remote helper.
TRANSPORTS = ("https", "ssh", "git", "file")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SCP = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9.-]+:(?!//)[^:]")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# Limits on what a package may hold (a package is a few sources and headers).
MAX_PACKAGE_FILES = 4096
MAX_FILE_BYTES = 16 << 20


class UnsafeInputError(Error, ValueError):
    """Input from outside (a URL, name, version, path or file) was refused."""


def check_url(url: str) -> str:
    """`url` if git may be pointed at it; raises UnsafeInputError otherwise."""
    if not isinstance(url, str) or not url:
        raise UnsafeInputError("a package URL must be a non-empty string")
    if any(ord(c) < 0x20 or c == "\x7f" for c in url):
        raise UnsafeInputError(f"package URL {url!r} holds control characters")
    if url.startswith("-"):
        raise UnsafeInputError(f"package URL '{url}' begins with '-': refused, it would be read as an option")
    scheme = _SCHEME.match(url)
    if scheme:
        if scheme.group(1).lower() not in TRANSPORTS:
            raise UnsafeInputError(
                f"package URL '{url}': transport '{scheme.group(1)}' is not allowed (allowed: {', '.join(TRANSPORTS)})"
            )
        return url
    if "::" in url:
        raise UnsafeInputError(f"package URL '{url}': git remote helpers ('<helper>::') are not allowed")
    if _SCP.match(url) or Path(url).is_absolute() or url.startswith("./") or url.startswith("../"):
        return url  # ssh in scp form (user@host:path), or a local path (file transport)
    raise UnsafeInputError(
        f"package URL '{url}' is not an https://, ssh://, git:// or file:// URL, user@host:path or a local path"
    )


def reserved_namespaces() -> frozenset[str]:
    from . import _C

    return frozenset(_C.reserved_namespaces())


def check_name(name: object, what: str = "package name") -> str:
    """A package name: an identifier that is not one of torch's namespaces."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise UnsafeInputError(f"{what} {name!r} is not an identifier of at most 64 characters")
    if name in reserved_namespaces() or name.startswith("kjit_"):
        raise UnsafeInputError(f"{what} '{name}' is reserved (a namespace of torch or kjit)")
    return name


def check_version(version: object, what: str = "version") -> str:
    """A version as used in a folder name: MAJOR.MINOR.PATCH with an optional pre-release."""
    from ._versions import Version

    if not isinstance(version, str):
        raise UnsafeInputError(f"{what} {version!r} is not a string")
    try:
        parsed = Version.parse(version)
    except ValueError as e:
        raise UnsafeInputError(f"{what}: {e}") from None
    if str(parsed) != version:
        raise UnsafeInputError(f"{what} '{version}' is not in canonical form ('{parsed}')")
    return version


def inside(root: Path, path: Path) -> Path:
    """`path` resolved; raises UnsafeInputError unless it lies inside `root` (resolved)."""
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(path))
    if real != real_root and real_root not in real.parents:
        raise UnsafeInputError(f"'{path}' resolves to '{real}', outside '{real_root}'")
    return real


def is_python_cache(relative: Path) -> bool:
    """A file Python writes beside a module (never read by kjit)."""
    return len(relative.parts) >= 2 and relative.parts[-2] == "__pycache__" and relative.suffix == ".pyc"


def package_files(root: Path, ignored: frozenset[str] = frozenset()) -> list[Path]:
    """The regular files of a package folder, relative and sorted, without following links.

    Refuses symbolic links, devices, FIFOs and sockets, more than MAX_PACKAGE_FILES files and files
    over MAX_FILE_BYTES. Top-level names in `ignored` are skipped; so are Python's bytecode caches
    (`__pycache__/*.pyc`), which kjit never reads.
    """
    files = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        here = Path(folder)
        for entry in sorted(dirs + names):
            path = here / entry
            relative = path.relative_to(root)
            if relative.parts[0] in ignored:
                if entry in dirs:
                    dirs.remove(entry)
                continue
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                raise UnsafeInputError(f"'{path}' is a symbolic link: packages hold regular files and folders only")
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                raise UnsafeInputError(f"'{path}' is not a regular file")
            if is_python_cache(relative):
                continue
            if info.st_size > MAX_FILE_BYTES:
                raise UnsafeInputError(f"'{path}' has {info.st_size} bytes, more than a package file may ({MAX_FILE_BYTES})")
            files.append(relative)
            if len(files) > MAX_PACKAGE_FILES:
                raise UnsafeInputError(f"'{root}' holds more than {MAX_PACKAGE_FILES} files")
    return sorted(files)


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file, read once through one descriptor (no link followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeInputError(f"'{path}' is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise UnsafeInputError(f"'{path}' has {info.st_size} bytes, more than a package file may ({MAX_FILE_BYTES})")
        chunks = []
        total = 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > MAX_FILE_BYTES:
                raise UnsafeInputError(f"'{path}' grew past {MAX_FILE_BYTES} bytes while read")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
