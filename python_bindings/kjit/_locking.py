"""Lock files, bundles and wheels of kernel packages (finding and fetching them: _packages).

A lock (`kjit.lock`, JSON) names each package by version, source, commit and the sha256 of every
file, with no paths of the machine that wrote it: `verified_package` finds the locked version
wherever packages are installed and checks every file; `sync` fetches what is missing.
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
import tempfile
import zipfile
from pathlib import Path

from ._errors import Error
from ._packages import (
    _IGNORED,
    LOCK_FORMAT,
    LockError,
    _source_info,
    check_relative,
    candidates,
    fetch,
    package_identity,
    resolve,
    search_path,
    write_files,
)
from ._safety import UnsafeInputError, check_name, check_version, package_files, read_regular
from ._trust import tomllib_module


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
    if not pyproject.is_file():
        raise Error(f"no pyproject.toml in '{project}': `kjit lock` reads the project's kernels from its "
                    "[tool.kjit.dependencies] (e.g. img2gray = \"^1\")")
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise Error(f"cannot read '{pyproject}': {e}") from None
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
            "origin": candidate.origin,  # where it was found (no path: locks travel)
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
    if data.get("format") not in (1, LOCK_FORMAT):
        raise LockError(f"'{path}' has lock format {data.get('format')}, this kjit reads 1 and {LOCK_FORMAT}")
    return data


def _checked_entry(lock_path: Path, name: str, entry: object) -> dict:
    """A lock entry whose fields are safe to use (a lock may come from elsewhere)."""
    where = f"'{lock_path}': package '{name}'"
    try:
        check_name(name, f"'{lock_path}': package name")
        if not isinstance(entry, dict):
            raise UnsafeInputError(f"{where}: the entry is not an object")
        check_version(entry.get("version"), f"{where}: version")
        for key in ("path", "source", "commit", "origin"):
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


def _mismatch(lock_path: Path, name: str, entry: dict, contents: dict[str, bytes]) -> str:
    """Why `contents` are not the locked package ('' when they are)."""
    for file, digest in entry["files"].items():
        actual = sha256(contents[file]) if file in contents else None
        if actual != digest:
            state = "is missing" if actual is None else f"has {actual}"
            return f"'{lock_path}': {name} {entry['version']}: file '{file}' {state}, the lock has {digest}; refusing to compile it"
    extra = sorted(set(contents) - set(entry["files"]))
    if extra:
        return f"'{lock_path}': {name} {entry['version']}: file '{extra[0]}' is not in the lock; refusing to compile it"
    return ""


class NotInstalledError(LockError):
    """A locked package that no folder here holds (`kjit sync` fetches it)."""


def _locked_entry(name: str, lock_path: Path) -> tuple[dict, dict]:
    data = read_lock(lock_path)
    packages = data.get("packages")
    if not isinstance(packages, dict):
        raise LockError(f"'{lock_path}' has no 'packages' object")
    if name not in packages:
        raise LockError(f"'{lock_path}' locks no package '{name}' (locked: {', '.join(sorted(packages))})")
    return data, _checked_entry(lock_path, name, packages[name])


def verified_package(name: str, lock_path: Path) -> tuple[Path, dict, dict[str, bytes]]:
    """Locked package `name`: its folder, its lock entry and the bytes of every file, each file
    read once and checked against the lock. Use the bytes, not the folder: it may change after.

    The package is looked for wherever packages are installed (KJIT_PATH, the package store,
    the shipped ones, wheels' entry points), and first in the folder a bundle's lock names
    (relative to the lock); the first folder of the locked version whose files are the lock's
    wins. None there: NotInstalledError (`kjit sync` fetches it); one whose files differ:
    LockError naming the file."""
    data, entry = _locked_entry(name, lock_path)
    places = []
    if entry.get("path"):
        hint = Path(entry["path"])
        if not hint.is_absolute():
            places.append(lock_path.parent / check_relative(entry["path"]))
        elif data.get("format") == 1:  # locks of format 1 named the folder of the locking machine
            places.append(hint)
    places += [c.path for c in candidates(name) if str(c.version) == entry["version"]]
    mismatch = ""
    for path in places:
        if not (path / "kernel.toml").is_file():
            continue
        contents = package_contents(path)
        why = _mismatch(lock_path, name, entry, contents)
        if not why:
            return path, entry, contents
        mismatch = mismatch or why
    if mismatch:
        raise LockError(mismatch)
    source = entry.get("source", "")
    fix = (f"run `kjit sync` to fetch it from {source} at {entry.get('commit', '')[:12] or 'its tag'}"
           if source else "install it (a folder in KJIT_PATH, a wheel, or `kjit fetch` its repository)")
    raise NotInstalledError(f"locked package '{name}' {entry['version']} is missing: no folder here holds it "
                            f"(searched {', '.join(str(r) for r in search_path())}); {fix}")


def sync(lock_path: Path) -> list[tuple[str, str, str, Path]]:
    """Makes every package of the lock present here: those installed are verified, the others
    fetched from their locked source at the locked commit into the package store, then verified.
    Returns (name, version, what was done, folder) per package."""
    done = []
    for name in sorted(read_lock(lock_path).get("packages") or {}):
        try:
            path, entry, _ = verified_package(name, lock_path)
            done.append((name, entry["version"], "present", path))
            continue
        except NotInstalledError:
            _, entry = _locked_entry(name, lock_path)
        source, commit = entry.get("source", ""), entry.get("commit", "")
        if not source:
            raise NotInstalledError(f"locked package '{name}' {entry['version']} is not installed here and "
                                    "the lock names no source to fetch it from: install it")
        fetch(source, commit or entry["version"])
        path, entry, _ = verified_package(name, lock_path)
        done.append((name, entry["version"], f"fetched from {source}", path))
    return done


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


