"""Helpers of the adversarial tests (not a conftest.py: tests/python has one, and both run in one
pytest session): each case plays an attacker (a crafted URL, repository, manifest, lock, store or
number) and asserts the safe outcome."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

os.environ.setdefault("KJIT_CACHE_DIR", tempfile.mkdtemp(prefix="kjit-adversarial-cache-"))

import pytest  # noqa: E402

import kjit  # noqa: E402

SHIPPED = Path(kjit.__file__).resolve().parent / "kernels" / "img2gray"


def make_package(folder: Path, name: str = "gray", version: str = "1.0.0", init: str | None = None) -> Path:
    """A copy of the shipped img2gray package as `name` `version`; `init` replaces __init__.py."""
    shutil.copytree(SHIPPED, folder, ignore=shutil.ignore_patterns("__pycache__"))
    manifest = (folder / "kernel.toml").read_text()
    manifest = manifest.replace('name = "img2gray"', f'name = "{name}"').replace('version = "1.0.0"', f'version = "{version}"')
    (folder / "kernel.toml").write_text(manifest)
    if init is not None:
        (folder / "__init__.py").write_text(textwrap.dedent(init))
    return folder


def git(repo: Path, *args) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=kjit", "-c", "user.email=kjit@localhost", "-c", "init.defaultBranch=main", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    ).stdout.strip()


def make_repo(repo: Path, package: Path, tag: str = "v1.0.0") -> Path:
    """A git repository holding the files of `package` (links kept as links), tagged `tag`."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    for item in package.iterdir():
        target = repo / item.name
        if item.is_symlink():
            target.symlink_to(os.readlink(item))
        elif item.is_dir():
            shutil.copytree(item, target, symlinks=True)
        else:
            shutil.copy2(item, target)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "release")
    git(repo, "tag", tag)
    return repo


def python(code: str, env: dict, cwd=None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs `code` in a new interpreter (ops register once per process)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env={**os.environ, **env}, cwd=cwd, timeout=timeout,
    )


def cli(*args, env=None, cwd=None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kjit", *map(str, args)],
        capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd, timeout=timeout,
    )


def tree(path: Path) -> set:
    """Every path under `path` (to show nothing was written or deleted)."""
    return {p.relative_to(path).as_posix() for p in path.rglob("*")} if path.exists() else set()


@pytest.fixture
def env(tmp_path):
    return {
        "KJIT_PACKAGES_DIR": str(tmp_path / "store"),
        "KJIT_CACHE_DIR": str(tmp_path / "cache"),
        "KJIT_PATH": str(tmp_path / "root"),
        "KJIT_TRUSTED_SOURCES": "",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
