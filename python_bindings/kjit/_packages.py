"""Finding, versioning, fetching, locking, bundling and packaging kernel packages.

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

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ._entry_points import entry_point_dirs
from ._errors import Error, PackageNotFoundError
from ._safety import UnsafeInputError, check_name, check_url, check_version, inside, package_files, read_regular
from ._trust import source_trusted, tomllib_module
from ._versions import Range, Version, _Frozen

LOCK_FORMAT = 1
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


def fetch(url: str, version: str | None = None) -> Candidate:
    """Fetches a package from a git repository into the package store.

    `version` is a range matched against the repository's `vX.Y.Z` tags (the highest wins), or a
    commit hash (7 to 40 hex digits) that pins an exact revision.
    """
    check_url(url)
    revision = version.lower() if version and re.fullmatch(r"[0-9a-fA-F]{7,40}", version) else None
    wanted = Range.parse(version) if version and not revision else None
    if offline():
        stored = _stored_from(url, wanted, revision)
        if stored is None:
            raise FetchError(f"KJIT_OFFLINE=1: not fetching '{url}' (version {version or 'any'}), and no fetched copy matches")
        return stored
    tag = None
    if revision is None:
        tags = remote_versions(url)
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


# ---- locking --------------------------------------------------------------------------------


def check_relative(text: str) -> Path:
    """A relative file path from a lock or a repository: no absolute path, no '..', no NUL."""
    path = Path(text)
    if not text or "\0" in text or "\\" in text or path.is_absolute() or ".." in path.parts or path.as_posix() != text:
        raise UnsafeInputError(f"file name '{text}' is not a plain relative path")
    return path


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def package_contents(path: Path) -> dict[str, bytes]:
    """Every file of a package folder (relative posix path -> bytes), read once."""
    try:
        return {f.as_posix(): read_regular(path / f) for f in package_files(path, ignored=_IGNORED)}
    except UnsafeInputError as e:
        raise LockError(str(e)) from None


def file_hashes(path: Path) -> dict[str, str]:
    return {name: sha256(data) for name, data in package_contents(path).items()}


def content_hash(hashes: dict[str, str]) -> str:
    text = "\n".join(f"{name} {digest}" for name, digest in sorted(hashes.items()))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def project_dependencies(project: Path) -> dict[str, dict]:
    tomllib = tomllib_module()
    if tomllib is None:
        raise Error("reading pyproject.toml needs Python 3.11 (tomllib)")
    pyproject = project / "pyproject.toml"
    data = tomllib.loads(pyproject.read_text())
    deps = data.get("tool", {}).get("kjit", {}).get("dependencies")
    if deps is None:
        raise Error(f"{pyproject} has no [tool.kjit.dependencies]")
    result = {}
    for name, spec in deps.items():
        check_name(name, f"{pyproject}: tool.kjit.dependencies key")
        if isinstance(spec, str):
            spec = {"version": spec}
        unknown = set(spec) - {"version", "source"}
        if unknown:
            raise Error(f"{pyproject}: tool.kjit.dependencies.{name}: unknown key(s) {sorted(unknown)}")
        result[name] = spec
    return result


def lock(project: Path) -> Path:
    """Resolves [tool.kjit.dependencies] of `project`/pyproject.toml and writes kjit.lock."""
    packages = {}
    for name, spec in project_dependencies(project).items():
        version = spec.get("version")
        if spec.get("source"):
            candidate = fetch(spec["source"], version)
            if candidate.name != name:
                raise Error(f"'{spec['source']}' holds package '{candidate.name}', not '{name}'")
        else:
            candidate = resolve(name, version)
        source = _source_info(candidate.path)
        hashes = file_hashes(candidate.path)
        packages[name] = {
            "version": str(candidate.version),
            "requested": version or "*",
            "source": source.get("url", spec.get("source", "")),
            "commit": source.get("commit", ""),
            "path": str(candidate.path),
            "files": hashes,
            "hash": content_hash(hashes),
        }
    path = project / "kjit.lock"
    path.write_text(json.dumps({"format": LOCK_FORMAT, "packages": packages}, indent=2, sort_keys=True) + "\n")
    return path


def find_lock(start: Path | None = None) -> Path:
    if os.environ.get("KJIT_LOCK"):
        return Path(os.environ["KJIT_LOCK"])
    here = (start or Path.cwd()).resolve()
    for folder in [here, *here.parents]:
        if (folder / "kjit.lock").is_file():
            return folder / "kjit.lock"
    raise LockError(f"no kjit.lock in {here} or its parents (run `kjit lock`, or set KJIT_LOCK)")


def read_lock(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LockError(f"cannot read lock file '{path}': {e}") from e
    if data.get("format") != LOCK_FORMAT:
        raise LockError(f"'{path}' has lock format {data.get('format')}, this kjit reads {LOCK_FORMAT}")
    return data


def _checked_entry(lock_path: Path, name: str, entry: object) -> dict:
    """A lock entry whose fields are safe to use (a lock may come from elsewhere)."""
    where = f"'{lock_path}': package '{name}'"
    try:
        check_name(name, f"'{lock_path}': package name")
        if not isinstance(entry, dict):
            raise UnsafeInputError(f"{where}: the entry is not an object")
        check_version(entry.get("version"), f"{where}: version")
        for key in ("path", "source", "commit"):
            if not isinstance(entry.get(key, ""), str):
                raise UnsafeInputError(f"{where}: '{key}' is not a string")
        files = entry.get("files")
        if not isinstance(files, dict) or not files:
            raise UnsafeInputError(f"{where}: 'files' is not a non-empty object")
        for file, digest in files.items():
            check_relative(file)
            if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                raise UnsafeInputError(f"{where}: file '{file}' has no sha256 digest")
    except UnsafeInputError as e:
        raise LockError(str(e)) from None
    return entry


def verified_package(name: str, lock_path: Path) -> tuple[Path, dict, dict[str, bytes]]:
    """Locked package `name`: its folder, its lock entry and the bytes of every file, each file
    read once and checked against the lock. Use the bytes, not the folder: it may change after."""
    data = read_lock(lock_path)
    packages = data.get("packages")
    if not isinstance(packages, dict):
        raise LockError(f"'{lock_path}' has no 'packages' object")
    if name not in packages:
        raise LockError(f"'{lock_path}' locks no package '{name}' (locked: {', '.join(sorted(packages))})")
    entry = _checked_entry(lock_path, name, packages[name])
    path = Path(entry.get("path", ""))
    if not path.is_absolute():
        path = lock_path.parent / path
    if not (path / "kernel.toml").is_file():
        raise LockError(f"locked package '{name}' {entry['version']} is missing: no kernel.toml in '{path}'")
    contents = package_contents(path)
    for file, digest in entry["files"].items():
        actual = sha256(contents[file]) if file in contents else None
        if actual != digest:
            state = "is missing" if actual is None else f"has {actual}"
            raise LockError(f"'{lock_path}': {name} {entry['version']}: file '{file}' {state}, the lock has {digest}; refusing to compile it")
    extra = sorted(set(contents) - set(entry["files"]))
    if extra:
        raise LockError(f"'{lock_path}': {name} {entry['version']}: file '{extra[0]}' is not in the lock; refusing to compile it")
    return path, entry, contents


# ---- bundles and wheels ---------------------------------------------------------------------


def bundle(out: Path, archs: str | None, lock_path: Path, cli: Path) -> Path:
    """Copies the locked packages and a pre-warmed read-only store into `out`.

    The bundle is made in a folder beside `out` and renamed into place when complete, so a failure
    leaves no partial bundle. An existing `out` is replaced only when it is an earlier bundle (it
    holds a kjit.lock) or empty."""
    data = read_lock(lock_path)
    out = Path(os.path.abspath(out))
    if out.exists() and (not out.is_dir() or out.is_symlink() or (any(out.iterdir()) and not (out / "kjit.lock").is_file())):
        raise Error(f"'{out}' exists and is not an earlier bundle (no kjit.lock): refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        bundled = {}
        dirs = []
        for name in sorted(data.get("packages", {})):
            _, entry, contents = verified_package(name, lock_path)
            relative = Path("packages") / name / entry["version"]
            write_files(staging / relative, contents)
            bundled[name] = dict(entry, path=relative.as_posix())
            dirs.append(str(out / relative))
        lock_data = {"format": LOCK_FORMAT, "packages": bundled}
        if archs:
            with tempfile.TemporaryDirectory(prefix="kjit-bundle-") as tmp:
                env = dict(os.environ, KJIT_CACHE_DIR=tmp)
                env.pop("KJIT_CACHE_READONLY", None)
                staged = [str(staging / Path(d).relative_to(out)) for d in dirs]
                store = staging / "kernels.sqlite"
                for args in (["warm", *staged, "--arch", archs], ["cache", "export", str(store), "--arch", archs]):
                    result = subprocess.run([str(cli), *args], env=env)
                    if result.returncode != 0:
                        raise Error(f"kjit {args[0]} failed while bundling (exit {result.returncode})")
            lock_data["store"] = "kernels.sqlite"
        (staging / "kjit.lock").write_text(json.dumps(lock_data, indent=2, sort_keys=True) + "\n")
        staging.chmod(0o755)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
        staging.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def build_wheel(package: Path, out_dir: Path, store: Path | None = None) -> Path:
    """A py3-none-any wheel of a kernel package that registers itself with kjit when installed."""
    name, version = package_identity(package)
    check_name(name, f"{package}: package.name")
    module = f"kjit_pkg_{name}"
    dist = f"kjit_pkg_{name}"
    files = {f"{module}/{relative}": data for relative, data in package_contents(package).items()}
    files.setdefault(f"{module}/__init__.py", b"")
    if store is not None:
        files[f"{module}/kernels.sqlite"] = store.read_bytes()
    info = f"{dist}-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n"
        f"Summary: kjit kernel package {name}\nRequires-Dist: kjit\n"
    ).encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: kjit\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/entry_points.txt"] = f"[kjit.packages]\n{name} = {module}\n".encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in files.items():
        writer.writerow(_record_line(path, data))
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = record.getvalue().encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{dist}-{version}-py3-none-any.whl"
    partial = out_dir / f".{wheel.name}.partial-{os.getpid()}"
    try:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path, data in files.items():
                archive.writestr(path, data)
        partial.replace(wheel)
    finally:
        partial.unlink(missing_ok=True)
    return wheel


def locate(name_or_path, version: str | None) -> Candidate:
    """The package a name, folder, manifest path or git URL names (fetching a URL). Needs the
    extension (the manifest is read by the C++ parser) but not torch."""
    text = str(name_or_path)
    if is_url(text):
        return fetch(text, version)
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
