"""Versions side by side, git repositories, lock files, offline bundles and wheels (CPU only).

Each scenario that registers ops runs in its own Python process, so namespaces start empty.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest
import torch

import kjit
from kjit._versions import Range, Version

SHIPPED = Path(kjit.__file__).resolve().parent / "kernels" / "img2gray"


def make_package(folder: Path, version: str, name: str = "gray") -> Path:
    """A copy of the shipped img2gray package named `name` at `version`."""
    shutil.copytree(SHIPPED, folder, ignore=shutil.ignore_patterns("__pycache__"))
    manifest = (folder / "kernel.toml").read_text()
    manifest = manifest.replace('name = "img2gray"', f'name = "{name}"').replace('version = "1.0.0"', f'version = "{version}"')
    (folder / "kernel.toml").write_text(manifest)
    return folder


def python(code: str, env: dict, cwd=None, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env={**os.environ, **env}, cwd=cwd, timeout=600,
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def cli(*args, env=None, cwd=None, check=0) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "kjit", *map(str, args)],
        capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd, timeout=600,
    )
    assert result.returncode == check, result.stdout + result.stderr
    return result


def git(repo: Path, *args) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=kjit", "-c", "user.email=kjit@localhost", "-c", "init.defaultBranch=main", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    ).stdout.strip()


@pytest.fixture
def env(tmp_path):
    return {
        "KJIT_PACKAGES_DIR": str(tmp_path / "store"),
        "KJIT_CACHE_DIR": str(tmp_path / "cache"),
        "KJIT_PATH": str(tmp_path / "root"),
    }


@pytest.fixture
def repo(tmp_path):
    """A kernel package repository with tags v1.0.0, v1.1.0 and v2.0.0."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for version in ["1.0.0", "1.1.0", "2.0.0"]:
        for item in repo.iterdir():
            if item.name != ".git":
                shutil.rmtree(item) if item.is_dir() else item.unlink()
        staging = tmp_path / f"staging-{version}"
        make_package(staging, version)
        for item in staging.iterdir():
            shutil.move(str(item), repo / item.name)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"release {version}")
        git(repo, "tag", f"v{version}")
    return repo


# ---- ranges ---------------------------------------------------------------------------------

VERSIONS = ["0.3.1", "0.3.9", "0.4.0", "1.0.0", "1.1.2", "1.4.0", "2.0.0-rc.1", "2.0.0"]


@pytest.mark.parametrize(
    "spec, expected",
    [
        (">=1.1,<2", ["1.1.2", "1.4.0"]),
        ("^1.2", ["1.4.0"]),
        ("^0.3", ["0.3.1", "0.3.9"]),
        ("~=1.4", ["1.4.0"]),
        ("~=1.1.2", ["1.1.2"]),
        ("1.1.2", ["1.1.2"]),
        ("==1", ["1.0.0", "1.1.2", "1.4.0"]),
        (">1.0.0,!=1.4.0", ["1.1.2", "2.0.0"]),
        ("2.0.0-rc.1", ["2.0.0-rc.1"]),
        (">=2.0.0-rc.1", ["2.0.0-rc.1", "2.0.0"]),
        ("<0.3.1", []),
    ],
)
def test_ranges(spec, expected):
    assert [v for v in VERSIONS if Range.parse(spec).matches(Version.parse(v))] == expected


def test_version_order_and_errors():
    assert sorted(Version.parse(v) for v in ["1.10.0", "1.2.0", "1.2.0-rc.2", "1.2.0-rc.10", "1.2.0-alpha"]) == [
        Version.parse(v) for v in ["1.2.0-alpha", "1.2.0-rc.2", "1.2.0-rc.10", "1.2.0", "1.10.0"]
    ]
    for bad in ["1.2", "one", "1.2.3.4"]:
        with pytest.raises(ValueError):
            Version.parse(bad)
    for bad in ["", "=>1.0", "~=1"]:
        with pytest.raises(ValueError):
            Range.parse(bad)


# ---- versions side by side ------------------------------------------------------------------


def test_highest_matching_version_and_two_majors_in_one_process(tmp_path, env):
    root = tmp_path / "root"
    for version in ["1.0.0", "1.1.2", "1.4.0", "2.0.0"]:
        make_package(root / "gray" / version, version)
    python(
        """
        import torch, kjit
        assert kjit.versions("gray") == ["1.0.0", "1.1.2", "1.4.0", "2.0.0"]
        one = kjit.load("gray", version=">=1.1,<1.4")
        assert one.__version__ == "1.1.2" and one.namespace == "gray"
        two = kjit.load("gray", version="^2")
        assert two.__version__ == "2.0.0" and two.namespace == "gray_v2"
        image = torch.randint(0, 256, (5, 7, 3), dtype=torch.uint8)
        assert torch.equal(torch.ops.gray.img2gray(image), torch.ops.gray_v2.img2gray(image))
        assert kjit.load("gray") is two                      # highest overall
        assert kjit.load("gray", version="1.1.2") is one     # exact
        try:
            kjit.load("gray", version="1.4.0")               # same namespace as 1.1.2
        except kjit.ManifestError as e:
            assert "namespace 'gray' is taken" in str(e), e
        else:
            raise AssertionError("two minor versions of one major cannot share a process")
        try:
            kjit.load("gray", version=">=3")
        except kjit.PackageNotFoundError as e:
            assert "installed: 1.0.0, 1.1.2, 1.4.0, 2.0.0" in str(e), e
        else:
            raise AssertionError("no 3.x")
        """,
        env,
    )
    versions = cli("versions", "gray", env=env).stdout
    assert "1.1.2" in versions and "2.0.0" in versions
    listed = json.loads(cli("versions", "gray", "--json", env=env).stdout)
    assert [v["version"] for v in listed] == ["1.0.0", "1.1.2", "1.4.0", "2.0.0"] and listed[0]["origin"] == "path"
    info = json.loads(cli("info", "gray", "--version", "^1", "--json", env=env).stdout)
    assert info["version"] == "1.4.0" and info["namespace"] == "gray"
    assert info["ops"] == {"img2gray": "img2gray(Tensor image) -> Tensor"}
    assert info["source_hash"].startswith("sha256:")


# ---- git repositories -----------------------------------------------------------------------


def test_fetch_resolves_tags_and_records_the_commit(repo, env):
    url = repo.as_uri()
    out = cli("fetch", url, "--version", "^1", env=env).stdout
    assert "gray 1.1.0" in out
    stored = Path(env["KJIT_PACKAGES_DIR"]) / "gray" / "1.1.0"
    source = json.loads((stored / ".kjit-source.json").read_text())
    assert source["url"] == url and source["tag"] == "v1.1.0"
    assert source["commit"] == git(repo, "rev-parse", "v1.1.0")
    assert not (stored / ".git").exists()
    # A commit hash pins exactly, short or full.
    first = git(repo, "rev-parse", "v1.0.0")
    assert "gray 1.0.0" in cli("fetch", url, "--version", first[:9], env=env).stdout
    cli("fetch", url, "--version", ">=9", env=env, check=1)


def test_load_url_fetches_on_first_use_unless_offline(repo, env):
    url = repo.as_uri()
    offline = python(
        f"""
        import kjit
        try:
            kjit.load({url!r}, version="^2")
        except kjit.FetchError as e:
            print(e)
        """,
        {**env, "KJIT_OFFLINE": "1"},
    )
    assert "KJIT_OFFLINE=1" in offline.stdout
    python(
        f"""
        import kjit, torch
        module = kjit.load({url!r}, version="^2")
        assert module.__version__ == "2.0.0" and module.namespace == "gray_v2"
        """,
        env,
    )
    # Now fetched: offline use works, and by name too.
    python(
        f"""
        import kjit
        assert kjit.load({url!r}, version="^2").__version__ == "2.0.0"
        assert kjit.versions("gray") == ["2.0.0"]
        """,
        {**env, "KJIT_OFFLINE": "1"},
    )


def test_a_fetched_copy_serves_without_network_and_fetch_refreshes(repo, env, tmp_path):
    """Offline first: kjit.load of a URL uses a fetched copy that matches, even when the remote
    is down or has a newer tag; `kjit fetch` asks the remote, and falls back to the copy with a
    warning when the remote cannot be reached."""
    url = repo.as_uri()
    cli("fetch", url, "--version", "^1", env=env)
    # A newer 1.x tag: load keeps to the fetched copy, fetch takes the new one.
    for item in repo.iterdir():
        if item.name != ".git":
            shutil.rmtree(item) if item.is_dir() else item.unlink()
    staging = make_package(tmp_path / "staging-1.2.0", "1.2.0")
    for item in staging.iterdir():
        shutil.move(str(item), repo / item.name)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "release 1.2.0")
    git(repo, "tag", "v1.2.0")
    load = f"""
        import warnings, torch, kjit
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            version = kjit.load({url!r}, version="^1").__version__
        print(version, sum("cannot reach" in str(w.message) for w in caught))
        """
    assert python(load, env).stdout.strip() == "1.1.0 0"
    assert "gray 1.2.0" in cli("fetch", url, "--version", "^1", env=env).stdout
    assert python(load, env).stdout.strip() == "1.2.0 0"
    shutil.move(str(repo), str(tmp_path / "repo-gone"))  # the remote is down
    assert python(load, env).stdout.strip() == "1.2.0 0"  # no network asked, no warning
    down = cli("fetch", url, "--version", "^1", env=env)
    assert "gray 1.2.0" in down.stdout and "cannot reach" in down.stderr
    missing = cli("fetch", url, "--version", "^3", env=env, check=1)
    assert "failed" in missing.stderr and "Traceback" not in missing.stderr


# ---- locking and bundles --------------------------------------------------------------------


def write_project(project: Path, url: str):
    project.mkdir()
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [project]
            name = "app"
            version = "0.1.0"

            [tool.kjit.dependencies]
            gray = {{ version = ">=1.0,<2", source = "{url}" }}
            activation = "^1"
            """
        )
    )


def test_lock_then_load_locked_refuses_tampered_files(repo, env, tmp_path):
    project = tmp_path / "app"
    write_project(project, repo.as_uri())
    cli("lock", env=env, cwd=project)
    lock = json.loads((project / "kjit.lock").read_text())
    gray = lock["packages"]["gray"]
    assert gray["version"] == "1.1.0" and gray["commit"] == git(repo, "rev-parse", "v1.1.0")
    assert set(gray["files"]) >= {"kernel.toml", "img2gray.cu", "__init__.py"}
    assert lock["packages"]["activation"]["version"] == "1.0.0"
    python(
        """
        import kjit, torch
        gray = kjit.load_locked("gray")
        assert gray.__version__ == "1.1.0"
        assert gray.img2gray(torch.zeros(2, 2, 3, dtype=torch.uint8)).shape == (2, 2)
        """,
        {**env, "KJIT_TRUSTED_SOURCES": repo.as_uri()},  # its CPU code runs: the source is trusted
        cwd=project,
    )
    assert "path" not in gray and env["KJIT_PACKAGES_DIR"] not in (project / "kjit.lock").read_text()
    source = Path(env["KJIT_PACKAGES_DIR"]) / "gray" / "1.1.0" / "img2gray.cu"
    source.write_text(source.read_text() + "\n// drifted\n")
    refused = python(
        """
        import kjit
        try:
            kjit.load_locked("gray")
        except kjit.LockError as e:
            print(e)
        """,
        env,
        cwd=project,
    )
    assert "file 'img2gray.cu' has sha256:" in refused.stdout
    assert gray["files"]["img2gray.cu"] in refused.stdout
    assert "kjit.lock" in refused.stdout


def test_a_lock_travels_to_another_machine_and_loads_offline_after_sync(repo, tmp_path):
    """Locked on machine A (its HOME and package store); on machine B (another HOME and store)
    `kjit sync` fetches exactly what the lock names, after which load_locked works offline with
    the repository gone."""
    def machine(name):
        root = tmp_path / name
        return {"HOME": str(root / "home"), "KJIT_PACKAGES_DIR": str(root / "store"),
                "KJIT_CACHE_DIR": str(root / "cache"), "KJIT_PATH": ""}

    a, b = machine("a"), machine("b")
    project = tmp_path / "app"
    write_project(project, repo.as_uri())
    cli("lock", env=a, cwd=project)
    assert str(tmp_path / "a") not in (project / "kjit.lock").read_text()  # no machine paths
    elsewhere = tmp_path / "b" / "app"
    elsewhere.mkdir(parents=True)
    shutil.copy(project / "kjit.lock", elsewhere / "kjit.lock")
    load = """
        import kjit, torch
        gray = kjit.load_locked("gray")
        assert gray.__version__ == "1.1.0"
        print(gray.img2gray(torch.zeros(2, 2, 3, dtype=torch.uint8)).shape)
        """
    missing = python(load, b, cwd=elsewhere, check=False)
    assert missing.returncode != 0 and "run `kjit sync` to fetch it from" in missing.stderr
    synced = cli("sync", env=b, cwd=elsewhere).stdout
    assert f"gray 1.1.0: fetched from {repo.as_uri()}" in synced and "activation 1.0.0: present" in synced
    assert "gray 1.1.0: present" in cli("sync", env=b, cwd=elsewhere).stdout
    shutil.move(str(repo), str(tmp_path / "repo-gone"))
    offline = {**b, "KJIT_OFFLINE": "1", "KJIT_TRUSTED_SOURCES": repo.as_uri()}
    assert python(load, offline, cwd=elsewhere).stdout.strip() == "torch.Size([2, 2])"
    assert "gray 1.1.0: present" in cli("sync", env=offline, cwd=elsewhere).stdout


def test_sync_refuses_a_copy_that_differs_from_the_lock(repo, env, tmp_path):
    project = tmp_path / "app"
    write_project(project, repo.as_uri())
    cli("lock", env=env, cwd=project)
    kernel = Path(env["KJIT_PACKAGES_DIR"]) / "gray" / "1.1.0" / "img2gray.cu"
    kernel.write_text(kernel.read_text() + "// changed\n")
    result = cli("sync", env=env, cwd=project, check=1)
    assert "file 'img2gray.cu' has sha256:" in result.stderr and "Traceback" not in result.stderr


def test_bundle_works_offline_from_a_read_only_folder(repo, env, tmp_path):
    project = tmp_path / "app"
    write_project(project, repo.as_uri())
    cli("lock", env=env, cwd=project)
    bundle = tmp_path / "bundle"
    cli("bundle", bundle, "--arch", "sm_90", env=env, cwd=project)
    assert (bundle / "kernels.sqlite").is_file()
    assert (bundle / "packages" / "gray" / "1.1.0" / "kernel.toml").is_file()
    for path in sorted(bundle.rglob("*"), reverse=True):
        path.chmod(0o555 if path.is_dir() else 0o444)
    bundle.chmod(0o555)
    try:
        result = python(
            f"""
            import json, kjit, torch
            gray = kjit.load_locked("gray", lock={str(bundle / "kjit.lock")!r})
            act = kjit.load_locked("activation", lock={str(bundle / "kjit.lock")!r})
            assert gray.img2gray(torch.zeros(2, 2, 3, dtype=torch.uint8)).shape == (2, 2)
            assert act.silu_and_mul(torch.randn(2, 8)).shape == (2, 4)
            print(json.dumps(kjit.cache_info()))
            """,
            {
                "KJIT_OFFLINE": "1",
                "KJIT_PACKAGES_DIR": str(tmp_path / "absent"),
                "KJIT_CACHE_DIR": str(bundle / "no-writable-store-here"),
                "KJIT_PATH": "",
                "KJIT_TRUSTED_SOURCES": f"{bundle}/",  # the deployer trusts the bundle it ships
            },
        )
    finally:
        for path in [bundle, *bundle.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    info = json.loads(result.stdout.strip().splitlines()[-1])
    assert info["store"] is not None


# ---- wheels ---------------------------------------------------------------------------------


def test_wheel_installs_into_a_fresh_environment_and_loads(tmp_path, env):
    package = make_package(tmp_path / "root" / "gray" / "1.2.0", "1.2.0")
    out = cli("wheel", package, "-o", tmp_path / "dist", env=env).stdout
    wheel = tmp_path / "dist" / "kjit_pkg_gray-1.2.0-py3-none-any.whl"
    assert str(wheel) in out and wheel.is_file()
    environment = tmp_path / "venv"
    venv.create(environment, system_site_packages=True, with_pip=True)
    bin_dir = environment / "bin"
    # torch and kjit come from this interpreter's site-packages, which is not the base
    # interpreter's where this interpreter is itself a virtual environment.
    site = subprocess.run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    paths = sorted({str(Path(torch.__file__).parent.parent), str(Path(kjit.__file__).parent.parent)})
    (Path(site) / "outer-environment.pth").write_text("\n".join(paths) + "\n")
    subprocess.run([bin_dir / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps", wheel], check=True)
    result = subprocess.run(
        [bin_dir / "python", "-c", textwrap.dedent(
            """
            import torch, kjit
            module = kjit.load("gray")
            print(module.__version__, module.__file__)
            assert torch.equal(module.img2gray(torch.full((1, 1, 3), 200, dtype=torch.uint8)), torch.full((1, 1), 200, dtype=torch.uint8))
            """
        )],
        capture_output=True, text=True, env={**os.environ, "KJIT_PATH": "", "KJIT_PACKAGES_DIR": str(tmp_path / "empty"), "KJIT_CACHE_DIR": env["KJIT_CACHE_DIR"]},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("1.2.0") and "site-packages/kjit_pkg_gray/kernel.toml" in result.stdout
    # The command finds it by name too (one registry for both halves of the CLI).
    warm = subprocess.run(
        [bin_dir / "python", "-m", "kjit", "warm", "gray", "--arch", "sm_90"], capture_output=True, text=True,
        env={**os.environ, "KJIT_PATH": "", "KJIT_PACKAGES_DIR": str(tmp_path / "empty"),
             "KJIT_CACHE_DIR": str(tmp_path / "warm-cache")},
    )
    assert warm.returncode == 0 and "1 compiled, 0 already cached, 0 failed" in warm.stdout, warm.stdout + warm.stderr


def test_warm_finds_fetched_packages_by_name_and_skips_a_broken_one(repo, env, tmp_path):
    """`kjit warm` sees what kjit.load sees: a package fetched into the store, by name and with
    no names; a broken package beside good ones is reported and the good ones are warmed."""
    cli("fetch", repo.as_uri(), "--version", "^1", env=env)
    by_name = cli("warm", "gray", "--arch", "sm_90", env=env).stdout
    assert "warming 1 package(s)" in by_name and "gray/img2gray" in by_name
    assert "gray 1.1.0: 1 launch(es) checked" in cli("check", "gray", "--arch", "sm_90", env=env).stdout
    broken = Path(env["KJIT_PATH"]) / "brokenpkg"
    broken.mkdir(parents=True)
    (broken / "kernel.toml").write_text('[package]\nname = "brokenpkg"\nversion = "1.0.0"\n[op.x]\nschema = 3\n')
    result = cli("warm", "--arch", "sm_90", env=env, check=1)
    assert f"skipping the package at {broken}" in result.stderr and "kernel.toml:5" in result.stderr
    assert "1 package(s) skipped" in result.stderr
    assert "gray/img2gray" in result.stdout and "activation/" in result.stdout and "0 failed" in result.stdout
    named = cli("warm", "brokenpkg", "--arch", "sm_90", env=env, check=1)
    assert "kernel package 'brokenpkg' at" in named.stderr and "does not load" in named.stderr


def _metadata_points(group):
    from importlib import metadata

    return sorted((e.name, e.value) for e in metadata.entry_points(group=group))


def test_entry_point_scan_lists_what_importlib_metadata_lists(tmp_path, monkeypatch):
    from kjit._entry_points import entry_points

    # This environment's console scripts: the same list as importlib.metadata's.
    assert sorted(entry_points("console_scripts")) == _metadata_points("console_scripts")
    # A distribution found twice counts where it is found first, with or without the group.
    first, second, third = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder, dist, text in [
        (first, "shadowed_pkg-1.0.dist-info", "[console_scripts]\nx = y\n"),
        (second, "Shadowed.Pkg-2.0.dist-info", "[kjit.packages]\nshadow = shadow_module\n"),
        (second, "other-3.0.dist-info", "# comment\n[kjit.packages]\n  mine = my.module  \n\n[x]\nz = w\n"),
        (third, "legacy.egg-info", "[kjit.packages]\nold = old_module\n"),
    ]:
        (folder / dist).mkdir(parents=True)
        (folder / dist / "entry_points.txt").write_text(text)
    monkeypatch.setattr(sys, "path", [str(first), str(second), str(third), str(tmp_path / "missing")])
    expected = [("mine", "my.module"), ("old", "old_module")]
    assert sorted(entry_points()) == expected == _metadata_points("kjit.packages")


def test_entry_point_scan_skips_what_is_not_a_small_regular_file(tmp_path, monkeypatch):
    from kjit._entry_points import entry_points

    def dist(name, make):
        folder = tmp_path / f"{name}-1.0.dist-info"
        folder.mkdir()
        make(folder / "entry_points.txt")

    dist("fifo", lambda p: os.mkfifo(p))  # would block a plain open() and read()
    dist("folder", lambda p: p.mkdir())
    dist("huge", lambda p: p.write_text("[kjit.packages]\nhuge = huge_module\n" + "#" * (2 << 20)))
    dist("fine", lambda p: p.write_text("[kjit.packages]\nfine = fine_module\n"))
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert entry_points() == [("fine", "fine_module")]
