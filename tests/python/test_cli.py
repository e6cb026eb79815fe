"""The kjit command, end to end: the installed console script over the C++ tool."""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kjit

# The C++ tool and the console script: nothing here depends on torch's version.
pytestmark = pytest.mark.torch_independent

KERNELS = Path(kjit.__file__).parent / "kernels"


def warm_count(*packages):
    """The programs `kjit warm` compiles for one arch: the packages' warm lists."""
    return sum(len(kjit._C.warm_list(str(KERNELS / p))) for p in packages)


ACTIVATION = warm_count("activation")
SHIPPED = 2 * warm_count("img2gray", "activation")  # for two archs


def run(*args, cache=None, env=None, check=None):
    environment = dict(os.environ)
    if cache is not None:
        environment["KJIT_CACHE_DIR"] = str(cache)
    environment.update(env or {})
    result = subprocess.run(
        [sys.executable, "-m", "kjit", *map(str, args)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
    )
    if check is not None:
        assert result.returncode == check, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    result = run("warm", "img2gray", "activation", "--arch", "sm_80,sm_90", "-j", "2", cache=cache, check=0)
    assert f"{SHIPPED} compiled, 0 already cached, 0 failed" in result.stdout
    return cache


def test_second_warm_finds_everything_cached(warmed):
    result = run("warm", "img2gray", "activation", "--arch", "sm_80,sm_90", cache=warmed, check=0)
    assert f"0 compiled, {SHIPPED} already cached, 0 failed" in result.stdout


def test_warm_without_arch_or_gpu_is_a_usage_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: its arch is used")
    result = run("warm", "img2gray", cache=tmp_path, check=2)
    assert "--arch sm_80,sm_90" in result.stderr
    assert "Usage:" in result.stderr


def test_warm_failure_lists_the_compile_error(tmp_path):
    package = tmp_path / "broken"
    package.mkdir()
    (package / "k.cu").write_text('extern "C" __global__ void k(float* x) { oops; }\n')
    (package / "kernel.toml").write_text(
        '[package]\nname = "broken"\nversion = "1.0.0"\n[kernel.k]\nsource = "k.cu"\nentry = "k"\n'
        '[op.f]\nschema = "f(Tensor x) -> Tensor"\nkernel = "k"\noutputs = [{ like = "x" }]\n'
        'args = ["out0"]\ngrid = [1]\nblock = [1]\n'
    )
    result = run("warm", package, "--arch", "sm_90", cache=tmp_path / "cache", check=1)
    assert "0 compiled, 0 already cached, 1 failed" in result.stdout
    assert "k.cu(1): error" in result.stderr


def test_unknown_package_and_subcommand(tmp_path):
    assert "no kernel package 'nope'" in run("warm", "nope", "--arch", "sm_90", cache=tmp_path, check=1).stderr
    run("bogus", check=2)
    run(check=2)


def test_stats_and_ls(warmed):
    stats = json.loads(run("cache", "stats", "--json", cache=warmed, check=0).stdout)
    assert stats["stats"]["entries"] == SHIPPED
    assert stats["stats"]["compiles"] == SHIPPED
    entries = json.loads(run("cache", "ls", "--json", cache=warmed, check=0).stdout)
    assert len(entries) == SHIPPED
    assert {e["arch"] for e in entries} == {"sm_80", "sm_90"}
    assert "silu_and_mul_kernel<__half>" in {k for e in entries for k in e["kernels"]}
    assert {(e["package"], e["version"]) for e in entries} == {("img2gray", "1.0.0"), ("activation", "1.0.0")}
    text = run("cache", "ls", cache=warmed, check=0).stdout
    assert "img2gray 1.0.0 img2gray_vec_kernel" in text and f"{SHIPPED} entries" in text
    only = json.loads(run("cache", "ls", "--json", "--package", "activation", "--op", "silu_and_mul", "--arch", "sm_90", cache=warmed, check=0).stdout)
    assert only and all(e["package"] == "activation" and "silu_and_mul" in e["ops"] and e["arch"] == "sm_90" for e in only)
    assert f"{len(only)} entries matching" in run("cache", "ls", "--package", "activation", "--op", "silu_and_mul", "--arch", "sm_90", cache=warmed, check=0).stdout


def test_cache_by_package_why_and_rm_for_a_package_of_the_store(tmp_path):
    """A package installed in the package store (not on the C++ tool's search path): listed by
    kjit info, warmed and explained by name; a changed source is named as the miss's cause; its
    entries are removed by package, leaving the others."""
    store = tmp_path / "packages"
    env = {"KJIT_PACKAGES_DIR": str(store)}
    cache = tmp_path / "cache"
    run("new", "whyme", store / "whyme" / "0.1.0", check=0)
    info = json.loads(run("info", "--json", cache=cache, env=env, check=0).stdout)
    assert ("whyme", "0.1.0") in {(p.get("name"), p.get("version")) for p in info["packages"]}
    run("warm", "whyme", "img2gray", "--arch", "sm_90", cache=cache, env=env, check=0)
    why = json.loads(run("cache", "why", "whyme", "--arch", "sm_90", "--json", cache=cache, env=env, check=0).stdout)
    assert why["package"] == "whyme" and why["lookups"] and all(item["hit"] for item in why["lookups"])
    source = store / "whyme" / "0.1.0" / "whyme.cu"
    source.write_text(source.read_text() + "// edited\n")
    why = json.loads(run("cache", "why", "whyme", "whyme", "--arch", "sm_90", "--json", cache=cache, env=env, check=0).stdout)
    assert why["lookups"] and not any(item["hit"] for item in why["lookups"])
    assert all(item["differences"] == ["the source of whyme.cu changed"] for item in why["lookups"]), why
    text = run("cache", "why", "whyme", "--arch", "sm_80", cache=cache, env=env, check=0).stdout
    assert "arch: the entry has sm_90, this lookup sm_80" in text and "0 of " in text
    assert "has no op 'nope'" in run("cache", "why", "whyme", "nope", cache=cache, env=env, check=2).stderr
    removed = run("cache", "rm", "--package", "whyme", cache=cache, check=0).stdout
    assert removed.startswith(f"removed {len(why['lookups'])} entries")
    left = json.loads(run("cache", "ls", "--json", cache=cache, check=0).stdout)
    assert left and {e["package"] for e in left} == {"img2gray"}
    run("cache", "rm", cache=cache, check=2)  # nothing named
    run("cache", "rm", "not-hex", cache=cache, check=2)
    run("cache", "rm", left[0]["key"][:8], cache=cache, check=0)
    assert json.loads(run("cache", "ls", "--json", cache=cache, check=0).stdout) == []


def test_verify_finds_and_fixes_a_corrupted_entry(tmp_path):
    cache = tmp_path / "cache"
    run("warm", "img2gray", "--arch", "sm_90", cache=cache, check=0)
    assert run("cache", "verify", cache=cache, check=0).stdout.strip().endswith("ok")
    db = sqlite3.connect(cache / "kjit-v1.sqlite")
    (key,) = db.execute("SELECT key FROM entries").fetchone()
    db.execute("UPDATE entries SET blob = zeroblob(length(blob)) WHERE key = ?", (key,))
    db.commit()
    db.close()
    report = json.loads(run("cache", "verify", "--json", cache=cache, check=1).stdout)
    assert report["bad_entries"] == [key] and not report["ok"]
    fixed = run("cache", "verify", "--fix", cache=cache, check=1)  # found something bad
    assert "(removed)" in fixed.stdout and "1 bad entries removed" in fixed.stdout
    assert run("cache", "verify", cache=cache, check=0).stdout.strip().endswith("ok")
    assert json.loads(run("cache", "ls", "--json", cache=cache, check=0).stdout) == []


def test_prune_and_clear(tmp_path):
    cache = tmp_path / "cache"
    run("warm", "activation", "--arch", "sm_90", cache=cache, check=0)
    run("cache", "prune", cache=cache, check=2)
    run("cache", "prune", "--max-size", "lots", cache=cache, check=2)
    run("cache", "prune", "--older-than", "30d", cache=cache, check=0)
    entries = json.loads(run("cache", "ls", "--json", cache=cache, check=0).stdout)
    assert len(entries) == ACTIVATION
    limit = sum(sorted(e["size"] for e in entries)[-2:])  # room for two entries, not all
    run("cache", "prune", "--max-size", str(limit), cache=cache, check=0)
    left = json.loads(run("cache", "ls", "--json", cache=cache, check=0).stdout)
    assert 0 < len(left) < ACTIVATION and sum(e["size"] for e in left) <= limit
    run("cache", "clear", cache=cache, check=0)
    assert json.loads(run("cache", "ls", "--json", cache=cache, check=0).stdout) == []


def test_deploy_recipe_export_import_verify_and_read_only_use(warmed, tmp_path):
    """The README's container recipe as far as a CPU machine goes."""
    baked = tmp_path / "image" / "kjit-baked.sqlite"
    baked.parent.mkdir()
    assert f"exported {SHIPPED // 2} entries" in run("cache", "export", baked, "--arch", "sm_90", cache=warmed, check=0).stdout
    fresh = tmp_path / "fresh"
    assert f"imported {SHIPPED // 2} new entries" in run("cache", "import", baked, cache=fresh, check=0).stdout
    assert run("cache", "verify", cache=fresh, check=0).stdout.strip().endswith("ok")
    # At run time the baked store is read-only, searched after an empty writable store: a
    # pre-warmed kernel compiles nothing.
    os.chmod(baked, 0o444)
    os.chmod(baked.parent, 0o555)
    try:
        info = json.loads(
            run("info", "--json", cache=tmp_path / "runtime", env={"KJIT_CACHE_READONLY": str(baked)}, check=0).stdout
        )
        assert any(s["read_only"] and s["path"] == str(baked) for s in info["stores"])
        warm = run(
            "warm", "img2gray", "activation", "--arch", "sm_90",
            cache=tmp_path / "runtime", env={"KJIT_CACHE_READONLY": str(baked)}, check=0,
        )
        assert f"0 compiled, {SHIPPED // 2} already cached" in warm.stdout
        listed = json.loads(run("cache", "ls", "--json", cache=tmp_path / "runtime",
                                env={"KJIT_CACHE_READONLY": str(baked)}, check=0).stdout)
        assert len(listed) == SHIPPED // 2 and {e["store"] for e in listed} == {str(baked)}
        text = run("cache", "ls", cache=tmp_path / "runtime", env={"KJIT_CACHE_READONLY": str(baked)}, check=0).stdout
        assert f"read-only store {baked}:" in text and f"({SHIPPED // 2} in read-only stores)" in text
        assert not list(baked.parent.glob("*-wal"))  # never written
    finally:
        os.chmod(baked.parent, 0o755)
        os.chmod(baked, 0o644)


def test_info(tmp_path):
    info = json.loads(run("info", "--json", cache=tmp_path, check=0).stdout)
    assert info["kjit"] == kjit.__version__
    assert info["nvrtc"].startswith("13.")
    assert "sm_90" in info["nvrtc_archs"]
    assert {"img2gray", "activation"} <= {p.get("name") for p in info["packages"]}
    text = run("info", cache=tmp_path, check=0).stdout
    assert "NVRTC" in text and "img2gray 1.0.0" in text


def test_compile(tmp_path):
    source = tmp_path / "axpy.cu"
    source.write_text('extern "C" __global__ void axpy(float a, float* x) { x[0] *= a; }\n')
    out = tmp_path / "axpy.cubin"
    run("compile", source, "--arch", "sm_90", "-o", out, check=0)
    assert out.read_bytes()[:4] == b"\x7fELF"
    run("compile", source, "--arch", "sm_90", "--ptx", "-o", tmp_path / "axpy.ptx", check=0)
    assert ".entry axpy" in (tmp_path / "axpy.ptx").read_text()
    source.write_text("__global__ void k() { nope(); }\n")
    failed = run("compile", source, "--arch", "sm_90", check=1)
    assert "axpy.cu(1): error" in failed.stderr
    run("compile", source, check=2)  # --arch is required


def test_new_scaffolds_a_package_that_warms_and_loads(tmp_path):
    package = tmp_path / "scaled"
    run("new", "scaled", package, check=0)
    assert {p.name for p in package.iterdir()} >= {"kernel.toml", "scaled.cu", "__init__.py", "test_scaled.py"}
    warm = run("warm", package, "--arch", "sm_90", cache=tmp_path / "cache", check=0)
    assert "2 compiled" in warm.stdout
    module = kjit.load(package)
    x = torch.randn(10)
    torch.testing.assert_close(module.scaled(x, 2.0, 1.0), 2.0 * x + 1.0)
    torch.library.opcheck(torch.ops.scaled.scaled.default, (torch.randn(8), 2.0, 1.0))
    run("new", "scaled", package, check=1)  # exists
    run("new", "not-a-name", tmp_path / "x", check=2)
    # The template's own tests pass, `kjit check` among them.
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(package)],
                           capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "KJIT_CACHE_DIR": str(tmp_path / "cache")})
    assert tests.returncode == 0 and "passed" in tests.stdout, tests.stdout + tests.stderr


def test_check_finds_a_wrong_manifest_before_a_gpu_does(tmp_path):
    package = tmp_path / "wrong"
    run("new", "wrong", package, check=0)
    good = run("check", package, "--arch", "sm_80,sm_90", cache=tmp_path / "cache", check=0)
    assert "wrong 0.1.0: 4 launch(es) checked against their kernels' parameters, 0 problem(s)" in good.stdout
    manifest = (package / "kernel.toml").read_text()
    args = manifest[manifest.index("args = "):].splitlines()[0]
    (package / "kernel.toml").write_text(manifest.replace(args, 'args = ["out0", "x", "a"]'))
    bad = run("check", package, "--arch", "sm_90", cache=tmp_path / "cache", check=1)
    assert "the manifest passes 3 arguments but the kernel takes" in bad.stderr, bad.stderr
    report = json.loads(run("check", package, "--arch", "sm_90", "--json", cache=tmp_path / "cache", check=1).stdout)
    assert report[0]["package"] == "wrong" and "the manifest passes 3 arguments" in report[0]["problems"][0]["what"]
    (package / "kernel.toml").write_text(manifest.replace(args, args.replace('"x"', '"x.numel() > 0"', 1)))
    bad = run("check", package, "--arch", "sm_90", cache=tmp_path / "cache", check=1)
    assert "('x.numel() > 0') is a bool (1 byte), but the kernel's parameter 1 is 8 bytes" in bad.stderr, bad.stderr


FULL_DISK = """
set -u
mount -t tmpfs -o size=64k,mode=0700 tmpfs "$1" || exit 77
mount -t tmpfs -o size=64k,mode=0700 tmpfs "$2" || exit 77
exec "$3" -m kjit warm img2gray activation --arch sm_90 -j 2
"""


def test_full_disk_under_the_store_and_tmp_compiles_everything_with_one_warning(tmp_path):
    # Real ENOSPC, from 64 KiB file systems (tmpfs in a private user and mount namespace): one
    # under the store, one as TMPDIR, where NVRTC would map its precompiled headers (a full
    # file system under that mapping is a SIGBUS, so kjit must not ask for them there).
    if not Path("/usr/bin/unshare").exists():
        pytest.skip("no unshare(1) to mount a small tmpfs")
    cache = tmp_path / "cache"
    tmp = tmp_path / "tmp"
    cache.mkdir()
    tmp.mkdir()
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", FULL_DISK, "sh", str(cache),
         str(tmp), sys.executable],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, KJIT_CACHE_DIR=str(cache), TMPDIR=str(tmp)),
    )
    if result.returncode == 77 or "unshare:" in result.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{SHIPPED // 2} compiled, 0 already cached, 0 failed" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if line.startswith("kjit: warning:")]
    assert len(warnings) == 1 and "disk is full" in warnings[0], result.stderr


def test_subcommands_import_torch_only_when_they_need_it(tmp_path):
    """Note [Lazy kjit]: `kjit cache stats` & co. are the C++ tool behind a few lines of Python;
    `import kjit` alone imports neither torch nor kjit._C."""
    env = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path))
    for argv in (["cache", "stats"], ["info"], ["cache", "ls"]):
        result = subprocess.run([sys.executable, "-X", "importtime", "-m", "kjit", *argv],
                                capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 0, result.stderr
        imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
        assert "kjit._cli" in imported
        assert not {"torch", "kjit._C", "kjit._api"} & imported, sorted(imported)
    # The Python subcommands that need no tensors import no torch either.
    for argv in (["versions", "img2gray"], ["info", "img2gray"], ["info", "img2gray", "--json"]):
        result = subprocess.run([sys.executable, "-X", "importtime", "-m", "kjit", *argv],
                                capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 0, result.stderr
        imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
        assert "kjit._trust" in imported  # through kjit._packages
        assert not {"torch", "kjit._api"} & imported, sorted(imported)
    probe = "import sys, kjit; assert not {'torch', 'kjit._C'} & set(sys.modules); kjit.load; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", probe], check=True, env=env, timeout=120)


def test_help_names_every_command_and_the_readme_table_has_each():
    text = run("--help", check=0).stdout
    assert text.startswith("kjit: ") and "Usage: kjit [OPTIONS] SUBCOMMAND" in text  # no binary path
    commands = ["warm", "check", "cache", "info", "compile", "new", "fetch", "lock", "sync", "bundle", "wheel", "versions"]
    for command in commands:
        assert f"\n  {command} " in text, command
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("| command | does |"):]
    table = table[: table.index("\n\n")]
    for command in commands:
        assert f"`kjit {command}" in table, f"the README's command table lacks kjit {command}"


@pytest.mark.parametrize("command", ["warm", "check", "cache", "info", "compile", "new", "fetch", "lock", "sync", "bundle", "wheel", "versions"])
def test_every_command_has_one_help_style_and_usage_errors_exit_2(command):
    """The Python half's commands read as the C++ half's (CLI11's style): description, Usage
    line with the program name, the same option column; a usage error is one line and 2."""
    text = run(command, "--help", check=0).stdout
    assert f"Usage: kjit {command} [OPTIONS]" in text, text
    assert "\nOptions:\n  -h,--help                   Print this help message and exit\n" in text, text
    if command in ("fetch", "bundle", "wheel", "versions", "compile", "new"):  # each needs an argument
        assert "Run with --help for more information." in run(command, check=2).stderr


def test_an_unknown_command_is_a_usage_error_naming_the_commands():
    result = run("bogus", check=2)
    assert "kjit: unknown command 'bogus'" in result.stderr and "sync" in result.stderr and "warm" in result.stderr


def test_warm_says_what_it_cannot_warm_and_fails(tmp_path):
    """A template kernel with no warm values is listed with the fix, and the exit code is 1; a
    placeholder on a tensor's dtype takes the dtypes of the op's checks."""
    package = tmp_path / "gappy"
    package.mkdir()
    (package / "k.cu").write_text(
        "template <typename T> __global__ void scale_kernel(T* x, int n) {}\n"
        "template <int B> __global__ void block_kernel(float* x) {}\n")
    (package / "kernel.toml").write_text("""
[package]
name = "gappy"
version = "1.0.0"

[kernel.scale]
source = "k.cu"
entry = "scale_kernel<{T}>"

[kernel.block]
source = "k.cu"
entry = "block_kernel<{B}>"

[op.scale_]
schema = "scale_(Tensor(a!) x) -> ()"
kernel = "scale"
checks = ["x.dtype == float32 || x.dtype == float64"]
args = ["x", "x.numel()"]
grid = [1]
block = [32]
specialize = { T = "x.dtype" }

[op.block_]
schema = "block_(Tensor(a!) x) -> ()"
kernel = "block"
checks = ["x.dtype == float32"]
args = ["x"]
grid = [1]
block = [1]
specialize = { B = "x.size(0)" }
""")
    result = run("warm", package, "--arch", "sm_90", cache=tmp_path / "cache", check=1)
    assert "scale_kernel<float>" in result.stdout and "scale_kernel<double>" in result.stdout
    assert "2 compiled, 0 already cached, 0 failed" in result.stdout
    assert ("kjit: cannot warm gappy/block_ kernel 'block': no warm values for B; "
            "add warm = { B = [...] } to [op.block_]") in result.stderr
    assert "1 kernel(s) not warmed" in result.stderr
    gaps = kjit._C.warm_gaps(str(package))
    assert [(op, kernel, needs) for op, kernel, needs, _ in gaps] == [("block_", "block", ["B"])]


def test_lock_without_a_pyproject_is_one_clear_line(tmp_path):
    result = run("lock", tmp_path, check=1)
    assert result.stderr.startswith(f"kjit: no pyproject.toml in '{tmp_path}'") and "Traceback" not in result.stderr
    (tmp_path / "pyproject.toml").write_text("[tool.kjit\n")
    result = run("lock", tmp_path, check=1)
    assert "cannot read" in result.stderr and "Traceback" not in result.stderr


def test_debug_logs_say_hit_or_miss_per_lookup(tmp_path):
    for outcome in ("miss", "hit"):
        result = run("warm", "img2gray", "--arch", "sm_90", "-j", "1", cache=tmp_path, env={"KJIT_LOG": "debug"}, check=0)
        assert f"'img2gray.cu' for sm_90: {outcome} in the store (key " in result.stderr, result.stderr


def test_importing_a_file_that_is_no_store_is_one_line(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not a database\n" * 100)
    result = run("cache", "import", bad, cache=tmp_path / "cache", check=1)
    assert result.stderr.strip() == (f"kjit: cannot import '{bad}': SQLite: file is not a database "
                                     "(a kjit store of schema version 1 is needed)")


def test_cache_ls_shows_tuned_configurations_and_export_carries_them(tmp_path):
    """A tuned configuration (as the autotuner stores one: Note [Tuner]) is listed with its
    timings, and travels with export and import."""
    cache = tmp_path / "cache"
    run("warm", "img2gray", "--arch", "sm_90", cache=cache, check=0)
    config = ("name\tBLOCK\nname\tROWS\nbest\t256 2\npruned\t1\nbudget\t0\nseconds\t1.5\n"
              "timing\t256 1|0.02|\ntiming\t256 2|0.0125|\ntiming\t512 2|inf|too many resources\n")
    store = sqlite3.connect(cache / "kjit-v1.sqlite")
    store.execute("INSERT INTO tuning VALUES(?, ?, ?, ?, ?, ?)",
                  ("ab" * 16, "norm::rms_norm", "4096 x 4096 bfloat16", "NVIDIA H200 (sm_90, 132 SMs)", config, 0))
    store.commit()
    store.close()
    text = run("cache", "ls", cache=cache, check=0).stdout
    assert "tuned configurations:" in text
    assert "norm::rms_norm [4096 x 4096 bfloat16] on NVIDIA H200 (sm_90, 132 SMs): BLOCK=256 ROWS=2 (0.0125 ms; 3 timed, 1 pruned" in text
    listed = json.loads(run("cache", "ls", "--json", "--package", "norm", cache=cache, check=0).stdout)
    assert listed == [listed[0]] and listed[0]["kind"] == "tuned" and listed[0]["best"] == [256, 2]
    assert listed[0]["timings"][2] == {"values": [512, 2], "ms": None, "error": "too many resources"}
    run("cache", "export", tmp_path / "baked.sqlite", cache=cache, check=0)
    run("cache", "import", tmp_path / "baked.sqlite", cache=tmp_path / "other", check=0)
    assert "BLOCK=256 ROWS=2" in run("cache", "ls", cache=tmp_path / "other", check=0).stdout
