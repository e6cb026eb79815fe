"""Attacks through numbers, store files and special files (CPU only): sizes that overflow,
expressions that divide by zero or wrap on meta tensors, CPU implementations that lie about
their outputs, damaged stores, FIFOs and devices as sources, headers the scanner cannot see."""

import json
import os
import sqlite3
import textwrap
import time

import pytest

from attack_helpers import cli, env, python  # noqa: F401 (env: a fixture)

MANIFEST = """
[package]
name = "numbers"
version = "1.0.0"

[kernel.k]
source = "k.cu"
entry = "k"

[op.ratio]
schema = "ratio(Tensor x) -> Tensor"
kernel = "k"
outputs = [{{ shape = ["{shape}"], dtype = "float32" }}]
args = ["out0"]
grid = [1]
block = [1]
cpu = "ratio_cpu"
"""

INIT = """
import torch

def ratio_cpu(x):
    return {returned}
"""


def numbers_package(tmp_path, shape="x.size(0) / x.size(1)", returned="torch.zeros(x.size(0) // x.size(1))"):
    folder = tmp_path / "numbers"
    folder.mkdir()
    (folder / "kernel.toml").write_text(MANIFEST.format(shape=shape))
    (folder / "k.cu").write_text('extern "C" __global__ void k(float* out) {}\n')
    (folder / "__init__.py").write_text(INIT.format(returned=returned))
    return folder


@pytest.mark.parametrize(
    "shape, sizes, message",
    [
        ("x.size(0) / x.size(1)", (4, 0), "division by zero"),
        ("x.size(0) % x.size(1)", (4, 0), "division by zero"),
        ("cdiv(x.size(0), x.size(1))", (4, 0), "division by zero"),
        ("x.size(0) * 4611686018427387904", (4, 1), "integer overflow"),
        ("x.size(0) + 9223372036854775807", (4, 1), "integer overflow"),
    ],
)
def test_meta_and_compiled_shape_arithmetic_is_checked(tmp_path, env, shape, sizes, message):
    folder = numbers_package(tmp_path, shape=shape)
    result = python(
        f"""
        import kjit, torch
        ops = kjit.load({str(folder)!r})
        for device in ("meta", "cpu"):
            try:
                ops.ratio(torch.empty({sizes}, device=device))
                print(device, "no error")
            except ValueError as e:
                print(device, "ValueError:", e)
        try:
            torch.compile(ops.ratio, fullgraph=True, dynamic=True)(torch.empty({sizes}))
            print("compiled: no error")
        except Exception as e:
            print("compiled:", type(e).__name__, "{message}" in str(e))
        """,
        env,
    )
    assert result.returncode == 0, f"the process died ({result.returncode}): {result.stderr[-2000:]}"
    assert f"meta ValueError: numbers::ratio: cannot compute the shape of output 0: {message}" in result.stdout
    assert f"cpu ValueError: numbers::ratio: cannot compute the shape of output 0: {message}" in result.stdout
    assert "compiled: " in result.stdout and "no error" not in result.stdout.split("compiled:")[1]


@pytest.mark.parametrize(
    "returned, message",
    [
        ("torch.zeros(x.size(0) + 1)", "returned output 0 of shape [5], float32 on cpu; the manifest declares shape [4]"),
        ("torch.zeros(x.size(0), dtype=torch.int64)", "int64 on cpu; the manifest declares shape [4], float32"),
        ("(torch.zeros(4), torch.zeros(4))", "returned 2 values, the schema declares 1 outputs"),
    ],
)
def test_a_cpu_implementation_is_held_to_the_declared_outputs(tmp_path, env, returned, message):
    folder = numbers_package(tmp_path, shape="x.size(0)", returned=returned)
    result = python(
        f"""
        import kjit, torch
        ops = kjit.load({str(folder)!r})
        try:
            ops.ratio(torch.empty(4, 1))
            print("accepted")
        except RuntimeError as e:
            print("refused:", e)
        """,
        env,
    )
    assert "refused:" in result.stdout and message in result.stdout, result.stdout + result.stderr


def warm_store(tmp_path, env):
    result = cli("warm", "img2gray", "--arch", "sm_90", env=env)
    assert result.returncode == 0, result.stderr
    return tmp_path / "cache" / "kjit-v1.sqlite"


@pytest.mark.parametrize("size", ["18446744073709551615", "18446744073709551616", "1e30", "-1", "9.3e18", "16EiB", "nan"])
def test_prune_sizes_that_overflow_are_usage_errors_and_delete_nothing(tmp_path, env, size):
    store = warm_store(tmp_path, env)
    before = sqlite3.connect(store).execute("SELECT count(*) FROM entries").fetchone()[0]
    result = cli("cache", "prune", "--max-size", size, env=env)
    assert result.returncode == 2 and "is not a size" in result.stderr, result.stdout + result.stderr
    assert sqlite3.connect(store).execute("SELECT count(*) FROM entries").fetchone()[0] == before > 0


def test_verify_reports_a_store_it_had_to_move_aside(tmp_path, env):
    store = warm_store(tmp_path, env)
    store.write_bytes(b"this is not an SQLite database" * 200)
    for suffix in ("-wal", "-shm"):
        store.with_name(store.name + suffix).unlink(missing_ok=True)
    result = cli("cache", "verify", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "moved it to" in result.stdout and "ok" not in result.stdout.splitlines()
    report = json.loads(cli("cache", "verify", "--json", env=env).stdout)
    assert report["ok"] and report["moved_aside"] == []  # the new store is sound


def test_fifos_and_devices_are_not_read_as_sources(tmp_path, env):
    fifo = tmp_path / "k.cu"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):  # (a folder is refused by the option parser, exit 2)
        start = time.monotonic()
        result = cli("compile", path, "--arch", "sm_90", env=env, timeout=30)
        assert result.returncode == 1 and "not a regular file" in result.stderr, result.stderr
        assert time.monotonic() - start < 20


def test_a_header_included_through_a_macro_is_recompiled_when_edited(tmp_path, env):
    include = tmp_path / "inc"
    include.mkdir()
    (include / "value.cuh").write_text("#define VALUE 1\n")
    result = python(
        f"""
        import pathlib, kjit
        source = '#define HEADER "value.cuh"\\n#include HEADER\\nextern "C" __global__ void k(int* x) {{ *x = VALUE; }}\\n'
        def compile_once():
            kjit.RawKernel(source, "k", include_dirs=[{str(include)!r}]).compile("sm_90")
            return kjit.cache_info()["process"]["compiles"]
        first = compile_once()
        assert compile_once() == first  # same bytes: a hit
        pathlib.Path({str(include / "value.cuh")!r}).write_text("#define VALUE 2\\n")
        print(first, compile_once())
        """,
        env,
    )
    assert result.returncode == 0, result.stderr
    first, second = map(int, result.stdout.split())
    assert second == first + 1
