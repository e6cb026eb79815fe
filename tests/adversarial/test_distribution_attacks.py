"""Attacks through what kjit fetches, locks, bundles and loads (CPU only).

Each case asserts the safe outcome: nothing executed, nothing written outside its destination,
nothing deleted, and a typed error that names the problem.
"""

import json
import os
from pathlib import Path

import pytest

import kjit
from kjit import _locking

from attack_helpers import cli, env, git, make_package, make_repo, python, tree  # noqa: F401 (env: a fixture)

# Fetching, locking and bundling: the packages' loads under each torch are test_distribution.py's.
pytestmark = pytest.mark.torch_independent

MARKER_INIT = """
    import pathlib, torch
    pathlib.Path({marker!r}).write_text("package code ran")

    def img2gray_cpu(image):
        rgb = image.to(torch.int32)
        return ((77 * rgb[..., 0] + 150 * rgb[..., 1] + 29 * rgb[..., 2] + 128) >> 8).to(torch.uint8)
"""


# ---- 1. option and transport injection ------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "--upload-pack=touch {marker}",
        "-u touch {marker} x.git",
        "ext::sh -c touch% {marker}",
        "fd::17",
        "http://127.0.0.1:9/kernels.git",
        "file:///x\n--upload-pack=touch {marker}",
    ],
)
def test_urls_that_would_run_commands_are_refused(tmp_path, env, url):
    marker = tmp_path / "pwned"
    url = url.format(marker=marker)
    result = python(
        f"""
        import kjit
        for call in (lambda: kjit.fetch({url!r}), lambda: kjit.load({url!r})):
            try:
                call()
            except kjit.UnsafeInputError as e:
                print("refused:", e)
            except kjit.PackageNotFoundError as e:
                print("not a URL:", e)
        """,
        env,
    )
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout
    assert not marker.exists()


def test_a_pyproject_source_beginning_with_a_dash_runs_nothing(tmp_path, env):
    marker = tmp_path / "pwned"
    project = tmp_path / "app"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        f'[tool.kjit.dependencies]\ngray = {{ version = "^1", source = "--upload-pack=touch {marker}" }}\n'
    )
    result = cli("lock", env=env, cwd=project)
    assert result.returncode == 1 and "begins with '-'" in result.stderr
    assert not marker.exists() and not (project / "kjit.lock").exists()


# ---- 2. names, versions and paths from repositories and locks -------------------------------


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/abs", "aten", "a b"])
def test_a_fetched_manifest_name_cannot_leave_the_store(tmp_path, env, name):
    package = make_package(tmp_path / "pkg")
    manifest = (package / "kernel.toml").read_text().replace('name = "gray"', f'name = "{name}"')
    (package / "kernel.toml").write_text(manifest)
    repo = make_repo(tmp_path / "repo", package)
    before = tree(tmp_path)
    result = python(f"import kjit\ntry:\n    kjit.fetch({repo.as_uri()!r})\nexcept kjit.FetchError as e:\n    print('refused:', e)\n", env)
    assert "refused:" in result.stdout, result.stdout + result.stderr
    assert "package.name" in result.stdout
    assert tree(tmp_path) - before <= {"cache"} | {p for p in tree(tmp_path) if p.startswith("cache/")}
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("kernel.toml"))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("version", "../../../victim", "version"),
        ("version", "1.0.0/../../x", "version"),
        ("files", {"../../etc/passwd": "sha256:" + "0" * 64}, "not a plain relative path"),
        ("files", {"/etc/passwd": "sha256:" + "0" * 64}, "not a plain relative path"),
    ],
)
def test_crafted_lock_entries_are_refused_and_bundle_deletes_nothing(tmp_path, env, field, value, message):
    package = make_package(tmp_path / "root" / "gray")
    hashes = _locking.file_hashes(package)
    entry = {"version": "1.0.0", "source": "", "commit": "", "path": str(package), "files": hashes, "hash": _locking.content_hash(hashes)}
    entry[field] = value
    lock = tmp_path / "kjit.lock"
    lock.write_text(json.dumps({"format": 1, "packages": {"gray": entry}}))
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    (victim / "keep" / "data").write_text("precious")
    out = tmp_path / "out" / "bundle"
    result = cli("bundle", out, "--lock", lock, env=env)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert (victim / "keep" / "data").read_text() == "precious"
    assert not out.exists() and list((tmp_path / "out").iterdir()) == []  # no partial bundle
    with pytest.raises(kjit.LockError, match=message):
        _locking.verified_package("gray", lock)


def test_bundle_refuses_to_replace_a_folder_that_is_not_a_bundle(tmp_path, env):
    make_package(tmp_path / "root" / "gray")
    project = tmp_path / "app"
    project.mkdir()
    (project / "pyproject.toml").write_text('[tool.kjit.dependencies]\ngray = "^1"\n')
    assert cli("lock", env=env, cwd=project).returncode == 0
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("key")
    result = cli("bundle", home, env=env, cwd=project)
    assert result.returncode == 1 and "is not an earlier bundle" in result.stderr
    assert (home / ".ssh" / "id_rsa").read_text() == "key"


# ---- 3. symbolic links and special files in repositories ------------------------------------


@pytest.mark.parametrize("target", ["/", "{secret}", "../../.."])
def test_symlinks_in_a_fetched_repository_are_refused(tmp_path, env, target):
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY")
    package = make_package(tmp_path / "pkg")
    (package / "data").symlink_to(target.format(secret=secret))
    repo = make_repo(tmp_path / "repo", package)
    result = python(f"import kjit\ntry:\n    kjit.fetch({repo.as_uri()!r})\nexcept kjit.FetchError as e:\n    print('refused:', e)\n", env)
    assert "refused:" in result.stdout and "symbolic link" in result.stdout, result.stdout + result.stderr
    store = tmp_path / "store"
    assert not store.exists() or not any("PRIVATE" in p.read_text(errors="ignore") for p in store.rglob("*") if p.is_file())
    assert not store.exists() or [p for p in store.rglob("*") if p.name.startswith(".") and "partial" in p.name] == []


def test_symlinked_files_are_refused_by_lock_and_wheel(tmp_path, env):
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY")
    package = make_package(tmp_path / "root" / "gray")
    (package / "notes.txt").symlink_to(secret)
    with pytest.raises(kjit.LockError, match="symbolic link"):
        _locking.file_hashes(package)
    result = cli("wheel", package, "-o", tmp_path / "dist", env=env)
    assert result.returncode == 1 and "symbolic link" in result.stderr
    assert not (tmp_path / "dist").exists() or list((tmp_path / "dist").iterdir()) == []


# ---- 4. locks that mean something -----------------------------------------------------------


def locked_project(tmp_path, env, init=None):
    package = make_package(tmp_path / "root" / "gray", init=init)
    project = tmp_path / "app"
    project.mkdir()
    (project / "pyproject.toml").write_text('[tool.kjit.dependencies]\ngray = "^1"\n')
    assert cli("lock", env=env, cwd=project).returncode == 0
    return package, project


def test_a_planted_bytecode_cache_never_runs(tmp_path, env):
    marker = tmp_path / "pwned"
    package, project = locked_project(tmp_path, env)
    # What an attacker plants: bytecode of other code, newer than the source, where Python looks.
    evil = tmp_path / "evil.py"
    evil.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('bytecode ran')\n")
    import py_compile
    import sys

    tag = sys.implementation.cache_tag
    # Unchecked-hash bytecode is used by Python's import system without looking at the source.
    py_compile.compile(
        str(evil), cfile=str(package / "__pycache__" / f"__init__.{tag}.pyc"),
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    result = python(
        """
        import kjit, torch
        gray = kjit.load_locked("gray")
        print(gray.img2gray(torch.zeros(2, 2, 3, dtype=torch.uint8)).shape)
        """,
        env,
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    assert not marker.exists()


def test_unlisted_files_are_refused_pycache_included(tmp_path, env, monkeypatch):
    package, project = locked_project(tmp_path, env)
    for key, value in env.items():  # verified_package below runs in this process
        monkeypatch.setenv(key, value)
    for extra in ["helper.cuh", "__pycache__/payload.py", "sub/x.h"]:
        path = package / extra
        path.parent.mkdir(exist_ok=True)
        path.write_text("// not locked\n")
        with pytest.raises(kjit.LockError, match="is not in the lock"):
            _locking.verified_package("gray", project / "kjit.lock")
        path.unlink()


def test_a_locked_package_loads_the_bytes_that_were_checked(tmp_path, env):
    package, project = locked_project(tmp_path, env)
    result = python(
        """
        import os, pathlib, kjit
        gray = kjit.load_locked("gray")
        folder = pathlib.Path(gray.__file__).parent
        print(folder, oct(os.stat(folder.parent).st_mode & 0o777))
        """,
        env,
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    folder, mode = result.stdout.split()
    assert Path(folder) != package and mode == "0o700"  # a private copy, not the shared folder


def test_the_lock_covers_every_python_file(tmp_path, env, monkeypatch):
    package, project = locked_project(tmp_path, env)
    for key, value in env.items():  # verified_package below runs in this process
        monkeypatch.setenv(key, value)
    (package / "__init__.py").write_text((package / "__init__.py").read_text() + "\nimport os  # drift\n")
    with pytest.raises(kjit.LockError, match="'__init__.py' has sha256"):
        _locking.verified_package("gray", project / "kjit.lock")


# ---- 5. trust policy ------------------------------------------------------------------------


def test_python_of_an_untrusted_fetched_package_does_not_run(tmp_path, env):
    marker = tmp_path / "import-ran"
    package = make_package(tmp_path / "pkg", init=MARKER_INIT.format(marker=str(marker)))
    repo = make_repo(tmp_path / "repo", package)
    code = f"""
        import kjit, torch
        gray = kjit.load({repo.as_uri()!r}, version="^1")
        print("trusted:", gray.trusted)
        try:
            gray.img2gray(torch.zeros(2, 2, 3, dtype=torch.uint8))
            print("cpu ran")
        except kjit.TrustError as e:
            print("refused:", e)
        """
    result = python(code, env)
    assert result.returncode == 0, result.stderr
    assert "trusted: False" in result.stdout and "refused:" in result.stdout and "KJIT_TRUSTED_SOURCES" in result.stdout
    assert not marker.exists()
    # Trusted through the environment, the configuration file, or trust=True: the code runs.
    trusted = python(code, {**env, "KJIT_TRUSTED_SOURCES": repo.as_uri()})
    assert "cpu ran" in trusted.stdout and marker.exists(), trusted.stdout + trusted.stderr
    marker.unlink()
    (tmp_path / "config" / "kjit").mkdir(parents=True)
    (tmp_path / "config" / "kjit" / "config.toml").write_text(f'trusted_sources = ["{repo.parent.as_uri()}/"]\n')
    assert "cpu ran" in python(code, env).stdout and marker.exists()
    marker.unlink()
    (tmp_path / "config" / "kjit" / "config.toml").unlink()
    explicit = python(code.replace('version="^1")', 'version="^1", trust=True)'), env)
    assert "cpu ran" in explicit.stdout and marker.exists()


def test_a_project_file_cannot_grant_trust(tmp_path, env):
    marker = tmp_path / "import-ran"
    package = make_package(tmp_path / "pkg", init=MARKER_INIT.format(marker=str(marker)))
    repo = make_repo(tmp_path / "repo", package)
    project = tmp_path / "app"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        f'[tool.kjit]\ntrusted_sources = ["{repo.as_uri()}"]\n[tool.kjit.dependencies]\ngray = {{ version = "^1", source = "{repo.as_uri()}" }}\n'
    )
    assert cli("lock", env=env, cwd=project).returncode == 0
    result = python(
        """
        import kjit, torch
        gray = kjit.load_locked("gray")
        try:
            gray.img2gray(torch.zeros(1, 1, 3, dtype=torch.uint8))
        except kjit.TrustError:
            print("refused")
        """,
        env,
        cwd=project,
    )
    assert "refused" in result.stdout, result.stdout + result.stderr
    assert not marker.exists()


# ---- 6. manifests: namespaces and files outside the package --------------------------------


@pytest.mark.parametrize("name", ["aten", "prim", "torch", "kjit"])
def test_torch_namespaces_are_refused_as_package_names(tmp_path, name):
    package = make_package(tmp_path / "pkg", name=name)
    with pytest.raises(kjit.ManifestError, match="reserved namespace"):
        kjit.load(package)


def test_sources_outside_the_package_are_refused(tmp_path):
    (tmp_path / "secret.cu").write_text("// private\n")
    package = make_package(tmp_path / "pkg", name="outside")
    manifest = (package / "kernel.toml").read_text().replace('source = "img2gray.cu"', 'source = "../secret.cu"')
    (package / "kernel.toml").write_text(manifest)
    with pytest.raises(kjit.ManifestError, match="lies outside the package folder"):
        kjit.load(package)
