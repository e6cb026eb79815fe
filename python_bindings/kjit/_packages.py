"""Finding, versioning and fetching kernel packages (locks, bundles and wheels: _locking).

Layout of a package root (a `KJIT_PATH` folder, the package store, the shipped kernels):

    <root>/<name>/kernel.toml              one unversioned package
    <root>/<name>/<version>/kernel.toml    versions side by side (what `kjit fetch` writes)

The package store is `KJIT_PACKAGES_DIR`, else `$XDG_DATA_HOME/kjit/packages`, else
`~/.local/share/kjit/packages`. Wheels made by `kjit wheel` register packages through the
`kjit.packages` entry point group.

Op namespaces: a package of major version 0 or 1 registers `torch.ops.<name>`; major version N >= 2
registers `torch.ops.<name>_v<N>`, so two major versions load side by side in one process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from ._entry_points import entry_point_dirs
from ._errors import Error, PackageNotFoundError
from ._safety import UnsafeInputError, check_name, check_url, inside, package_files, read_regular
from ._trust import source_trusted, tomllib_module
from ._versions import Range, Version, _Frozen

LOCK_FORMAT = 2  # 2: no machine paths (1, which had them, is still read)
SOURCE_FILE = ".kjit-source.json"
_IGNORED = frozenset({".git", SOURCE_FILE})  # top-level names that are not package files
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class LockError(Error):
    """A locked package is missing, or its files differ from the lock."""


class FetchError(Error):
    """A package could not be fetched from its repository."""


class Candidate(_Frozen):
    # origin: "path" (a folder the user named or KJIT_PATH), "shipped", "store", "entry point"
    __slots__ = _fields = ("name", "version", "path", "origin")

    def __init__(self, name: str, version: Version, path: Path, origin: str):
        super().__init__(name, version, path, origin)

    @property
    def trusted(self) -> bool:
        """Whether the package's Python code may run (see kjit._trust)."""
        if self.origin != "store":
            return True
        return source_trusted(_source_info(self.path).get("url", ""))


def package_store() -> Path:
    if os.environ.get("KJIT_PACKAGES_DIR"):
        return Path(os.environ["KJIT_PACKAGES_DIR"])
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "kjit" / "packages"


def installed_kernels() -> Path:
    return Path(__file__).resolve().parent / "kernels"


def user_roots() -> list[Path]:
    return [Path(p) for p in os.environ.get("KJIT_PATH", "").split(os.pathsep) if p]


def search_path() -> list[Path]:
    return user_roots() + [package_store(), installed_kernels()]


def trusted_folder(path: Path) -> bool:
    """Whether `path` lies in a folder whose packages' code is trusted without being listed:
    a KJIT_PATH folder, the packages shipped with kjit, or an installed wheel's package."""
    real = Path(os.path.realpath(path))
    roots = [*user_roots(), installed_kernels(), *entry_point_dirs()]
    return any(real == (r := Path(os.path.realpath(root))) or r in real.parents for root in roots)


def _source_info(path: Path) -> dict:
    """What `kjit fetch` recorded about a package in the store ({} when nothing)."""
    try:
        info = json.loads(read_regular(path / SOURCE_FILE))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def offline() -> bool:
    return os.environ.get("KJIT_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def read_manifest(path: Path) -> dict:
    text = (path / "kernel.toml").read_text()
    tomllib = tomllib_module()
    if tomllib is not None:
        return tomllib.loads(text)
    # Without tomllib: the two fields needed here, from the [package] table.
    table = text.split("[package]", 1)[-1].split("\n[", 1)[0]
    values = dict(re.findall(r'^\s*(name|version)\s*=\s*"([^"]*)"', table, re.M))
    return {"package": values}


def package_identity(path: Path) -> tuple[str, Version]:
    """The name and version of the package at `path`, read by the C++ parser (a manifest it
    refuses raises ManifestError, a ValueError)."""
    from . import _C

    name, version = _C.package_identity(path)
    return name, Version.parse(version)


def namespace_for(name: str, version: Version) -> str:
    return name if version.major <= 1 else f"{name}_v{version.major}"


def candidates(name: str, broken: list | None = None) -> list[Candidate]:
    """Every installed version of package `name`, in search order. A folder that has a
    kernel.toml but is not a package is skipped; when `broken` is given, those in folders named
    `name` are appended to it as (path, error), for an error that says why `name` is missing."""
    found = []

    def consider(path: Path, origin: str):
        if not (path / "kernel.toml").is_file():
            return
        try:
            pkg_name, version = package_identity(path)
        except (ValueError, OSError, Error) as e:  # not a package: skipped
            if broken is not None and (path.name == name or path.parent.name == name):
                broken.append((path, e))
            return
        if pkg_name == name:
            found.append(Candidate(name, version, path, origin))

    store = package_store()
    roots = [(r, "path") for r in user_roots()] + [(store, "store"), (installed_kernels(), "shipped")]
    for root, origin in roots:
        folder = root / name
        consider(folder, origin)
        if folder.is_dir():
            for child in sorted(folder.iterdir()):
                if child.is_dir() and not child.name.startswith("."):
                    consider(child, origin)
    for path in entry_point_dirs(name):
        consider(path, "entry point")
    return found


def installed() -> tuple[list[Candidate], list[tuple[Path, Exception]]]:
    """Every installed package, the highest version of each name (what `kjit warm` with no
    names warms), and the folders with a kernel.toml that do not load, with their errors."""
    broken: list = []
    names = set()
    for root in search_path():
        if not root.is_dir():
            continue
        for folder in sorted(root.iterdir()):
            if not folder.is_dir() or folder.name.startswith("."):
                continue
            if (folder / "kernel.toml").is_file() or any((c / "kernel.toml").is_file() for c in folder.iterdir() if c.is_dir()):
                names.add(folder.name)
    from ._entry_points import entry_points

    names.update(point for point, _ in entry_points())
    best = []
    for name in sorted(names):
        found = candidates(name, broken)
        if found:
            best.append(max(found, key=lambda c: c.version))
    return best, broken


def resolve(name: str, version: str | None = None) -> Candidate:
    """The highest installed version of `name` matching `version` (a range or an exact one)."""
    broken: list = []
    all_versions = candidates(name, broken)
    wanted = Range.parse(version) if version else None
    matching = [c for c in all_versions if wanted is None or wanted.matches(c.version)]
    if wanted is None:
        matching = [c for c in matching if not c.version.pre] or matching
    if not matching:
        if not all_versions and broken:
            path, error = broken[0]
            raise PackageNotFoundError(
                f"kernel package '{name}' at {path} does not load: {error}"
            ) from error
        if not all_versions:
            roots = ", ".join(str(r) for r in search_path())
            raise PackageNotFoundError(
                f"no kernel package '{name}': not a folder with a kernel.toml, and not in the "
                f"search path ({roots}); set KJIT_PATH to add folders, or `kjit fetch` it"
            )
        have = ", ".join(sorted({str(c.version) for c in all_versions}))
        raise PackageNotFoundError(f"no version of kernel package '{name}' matches '{version}' (installed: {have})")
    best = max(c.version for c in matching)
    return next(c for c in matching if c.version == best)


# ---- repositories ---------------------------------------------------------------------------


def is_url(text: str) -> bool:
    return "://" in text or text.startswith("git@") or text.endswith(".git")


def _git(*args, cwd=None) -> str:
    # Only the allowed transports, even for redirects and submodules; no prompts; no `ext::`.
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ALLOW_PROTOCOL=":".join(("https", "ssh", "git", "file")))
    command = ["git", "-c", "protocol.ext.allow=never", "-c", "core.symlinks=true", *args]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise FetchError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def remote_versions(url: str) -> dict[Version, str]:
    """Tag versions of the repository at `url` -> their commits."""
    versions = {}
    for line in _git("ls-remote", "--tags", "--", check_url(url)).splitlines():
        commit, ref = line.split("\t")
        if not _COMMIT.fullmatch(commit):
            continue
        tag = ref[len("refs/tags/") :]
        peeled = tag.endswith("^{}")
        tag = tag[:-3] if peeled else tag
        try:
            version = Version.parse(tag)
        except ValueError:
            continue
        if peeled or version not in versions:
            versions[version] = commit  # the peeled commit of an annotated tag wins
    return versions


def _stored_from(url: str, wanted: Range | None, revision: str | None) -> Candidate | None:
    """A package in the store fetched from `url` that satisfies the request."""
    root = package_store()
    if not root.is_dir():
        return None
    best = None
    for source in root.glob(f"*/*/{SOURCE_FILE}"):
        info = _source_info(source.parent)
        if info.get("url") != url:
            continue
        if revision and not str(info.get("commit", "")).startswith(revision):
            continue
        try:
            name, version = package_identity(source.parent)
        except (OSError, ValueError):
            continue
        if wanted is not None and not wanted.matches(version):
            continue
        if best is None or version > best.version:
            best = Candidate(name, version, source.parent, "store")
    return best


def fetch(url: str, version: str | None = None, refresh: bool = True) -> Candidate:
    """Fetches a package from a git repository into the package store.

    `version` is a range matched against the repository's `vX.Y.Z` tags (the highest wins), or a
    commit hash (7 to 40 hex digits) that pins an exact revision.

    refresh=False (offline first, what kjit.load of a URL does): a fetched copy that satisfies
    the request is used without asking the remote. refresh=True asks the remote for its tags;
    when the remote cannot be reached and a fetched copy satisfies the request, that copy is
    used with a warning.
    """
    check_url(url)
    revision = version.lower() if version and re.fullmatch(r"[0-9a-fA-F]{7,40}", version) else None
    wanted = Range.parse(version) if version and not revision else None
    stored = _stored_from(url, wanted, revision)
    if offline() or (stored is not None and (not refresh or revision is not None)):
        if stored is None:
            raise FetchError(f"KJIT_OFFLINE=1: not fetching '{url}' (version {version or 'any'}), and no fetched copy matches")
        return stored
    tag = None
    if revision is None:
        try:
            tags = remote_versions(url)
        except FetchError as e:
            if stored is None:
                raise
            warnings.warn(f"cannot reach '{url}' ({e}); using the fetched {stored.name} {stored.version}",
                          stacklevel=2)
            return stored
        matching = [v for v in tags if (wanted.matches(v) if wanted else not v.pre)]
        if not matching:
            have = ", ".join(str(v) for v in sorted(tags)) or "none"
            raise FetchError(f"no tag of '{url}' matches '{version}' (version tags: {have})")
        best = max(matching)
        tag, revision = f"v{best}", tags[best]
    stored = _stored_from(url, None, revision)
    if stored is not None:
        return stored
    with tempfile.TemporaryDirectory(prefix="kjit-fetch-") as tmp:
        clone = Path(tmp) / "clone"
        _git("clone", "--quiet", "--no-checkout", "--", url, str(clone))
        _git("checkout", "--quiet", "--detach", revision, "--", cwd=clone)
        commit = _git("rev-parse", "--verify", "HEAD^{commit}", cwd=clone).strip()
        where = f"'{url}' at {commit[:12]}"
        try:
            files = package_files(clone, ignored=_IGNORED)
            if not (clone / "kernel.toml").is_file():
                raise FetchError(f"{where} has no kernel.toml at its root")
            name, found_version = package_identity(clone)
            check_name(name, f"{where}: package.name")
        except (UnsafeInputError, ValueError) as e:
            raise FetchError(f"{where}: {e}" if where not in str(e) else str(e)) from None
        if tag is not None and found_version != Version.parse(tag):
            raise FetchError(f"'{url}' tag {tag} holds a kernel.toml of version {found_version}")
        store = package_store()
        dest = store / name / str(found_version)
        if dest.exists():
            info = _source_info(dest)
            if info.get("commit") != commit:
                raise FetchError(
                    f"'{dest}' already holds {name} {found_version} from another source "
                    f"({info.get('url', 'local files')} {str(info.get('commit', ''))[:12]}); remove it first"
                )
            return Candidate(name, found_version, dest, "store")
        dest.parent.mkdir(parents=True, exist_ok=True)
        inside(store, dest.parent)
        staging = dest.parent / f".{found_version}.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            write_files(staging, {f: read_regular(clone / f) for f in files})
            (staging / SOURCE_FILE).write_text(json.dumps({"url": url, "commit": commit, "tag": tag}, indent=1))
            staging.rename(dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return Candidate(name, found_version, dest, "store")


def check_relative(text: str) -> Path:
    """A relative file path from a lock or a repository: no absolute path, no '..', no NUL."""
    path = Path(text)
    if not text or "\0" in text or "\\" in text or path.is_absolute() or ".." in path.parts or path.as_posix() != text:
        raise UnsafeInputError(f"file name '{text}' is not a plain relative path")
    return path


def write_files(dest: Path, files: dict) -> None:
    """Writes `files` (relative path -> bytes, checked by package_files or check_relative) into
    the new folder `dest`, refusing any path that would leave it."""
    dest.mkdir(parents=True)
    root = Path(os.path.realpath(dest))
    for relative, data in files.items():
        target = root / check_relative(str(relative))
        target.parent.mkdir(parents=True, exist_ok=True)
        inside(root, target.parent)
        with open(target, "xb") as out:  # never through an existing file or link
            out.write(data)


def locate(name_or_path, version: str | None) -> Candidate:
    """The package a name, folder, manifest path or git URL names (fetching a URL). Needs the
    extension (the manifest is read by the C++ parser) but not torch."""
    text = str(name_or_path)
    if is_url(text):
        return fetch(text, version, refresh=False)  # offline first: a fetched copy serves
    path = Path(name_or_path)
    if path.name == "kernel.toml" and path.is_file():
        path = path.parent
    if (path / "kernel.toml").is_file():
        from . import _C

        name, found_text = _C.package_identity(path)  # the manifest's mistakes as ManifestError
        found = Version.parse(found_text)
        if version and not Range.parse(version).matches(found):
            raise PackageNotFoundError(f"'{path}' holds {name} {found}, which does not match '{version}'")
        return Candidate(name, found, path, "path")
    return resolve(text, version)
