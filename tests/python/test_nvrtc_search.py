"""NVRTC found at run time (Note [Finding NVRTC]): the pip wheel's beside kjit, the toolkit's
not needed, and one clear error when there is none."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kjit


def _wheel_nvrtc():
    for entry in sys.path:
        candidate = Path(entry or ".") / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
        if candidate.is_file():
            return candidate.resolve()
    return None


WHEEL_NVRTC = _wheel_nvrtc()
# torch's CUDA wheels depend on nvidia-cuda-nvrtc: where torch is one, the wheel must be there.
needs_wheel = pytest.mark.skipif(
    WHEEL_NVRTC is None and torch.version.cuda is None,
    reason="torch is a CPU-only build, so no nvidia-cuda-nvrtc wheel came with it",
)

FP16_AND_STD = r"""
#include <cuda_fp16.h>
#include <cuda/std/limits>
#include <cuda/std/type_traits>
extern "C" __global__ void k(__half* x) {
  static_assert(cuda::std::is_same_v<int, int>);
  x[0] = __float2half(cuda::std::numeric_limits<float>::max());
}
"""


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "KJIT_NVRTC_LIBRARY")}
    env.update(extra)
    return env


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kjit", *map(str, args)], capture_output=True,
                          text=True, env=env or clean_env(), timeout=600)


@needs_wheel
def test_the_cli_uses_the_wheel_nvrtc_beside_kjit_and_its_headers(tmp_path):
    assert WHEEL_NVRTC is not None, "torch is a CUDA build but nvidia-cuda-nvrtc is missing"
    result = run_cli("info", "--json", env=clean_env(KJIT_CACHE_DIR=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    nvrtc = json.loads(result.stdout)["nvrtc_library"]
    assert nvrtc["found"]
    assert Path(nvrtc["library"]) == WHEEL_NVRTC
    assert nvrtc["how"] == "pip wheel beside kjit"
    assert nvrtc["include_dirs"][0] == str(WHEEL_NVRTC.parent.parent / "include")
    text = run_cli("info", env=clean_env(KJIT_CACHE_DIR=str(tmp_path))).stdout
    assert f"from {WHEEL_NVRTC} (pip wheel beside kjit)" in text


@needs_wheel
def test_python_compiles_with_the_wheel_nvrtc_mapped_into_the_process(tmp_path):
    script = textwrap.dedent(f"""
        import kjit
        source = {FP16_AND_STD!r}
        assert kjit.RawKernel(source, "k").compile("sm_90") > 1000  # cubin bytes
        maps = [line.split()[-1] for line in open("/proc/self/maps") if "libnvrtc.so" in line]
        print("\\n".join(sorted(set(maps))))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=clean_env(KJIT_CACHE_DIR=str(tmp_path)), timeout=600)
    assert result.returncode == 0, result.stderr
    assert str(WHEEL_NVRTC) in result.stdout.split(), result.stdout
    info = json.loads(subprocess.run([sys.executable, "-c", "import json, kjit; print(json.dumps(kjit._C.nvrtc_info()))"],
                                     capture_output=True, text=True, env=clean_env(), check=True).stdout)
    assert Path(info["library"]) == WHEEL_NVRTC


def test_no_nvrtc_is_one_clear_error_and_everything_else_still_works(tmp_path):
    missing = tmp_path / "libnvrtc.so.13"
    env = clean_env(KJIT_NVRTC_LIBRARY=str(missing), KJIT_CACHE_DIR=str(tmp_path / "cache"))
    source = tmp_path / "k.cu"
    source.write_text('extern "C" __global__ void k() {}\n')
    failed = run_cli("compile", source, "--arch", "sm_90", env=env)
    assert failed.returncode == 1
    assert "KJIT_NVRTC_LIBRARY" in failed.stderr and str(missing) in failed.stderr
    assert "Traceback" not in failed.stderr
    info = run_cli("info", env=env)
    assert info.returncode == 0 and "NVRTC     none" in info.stdout
    assert run_cli("cache", "stats", env=env).returncode == 0
    script = textwrap.dedent("""
        import kjit
        assert kjit.cache_info()["enabled"]
        package = kjit.load("img2gray")  # loading a package compiles nothing
        try:
            kjit.RawKernel('extern "C" __global__ void k() {}', "k").compile("sm_90")
        except kjit.NvrtcError as e:
            print("NvrtcError:", e)
        else:
            raise SystemExit("compiled without NVRTC")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert "NvrtcError: cannot use NVRTC from KJIT_NVRTC_LIBRARY" in result.stdout


def _can_hide_the_toolkit():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


@needs_wheel
@pytest.mark.skipif(not _can_hide_the_toolkit(), reason="needs root and unshare for a mount namespace")
def test_everything_works_with_the_cuda_toolkit_hidden(tmp_path):
    """/usr/local/cuda (and what it links to) under an empty folder, CUDA_HOME and
    LD_LIBRARY_PATH unset: NVRTC and CUDA's headers (cuda_fp16.h, and cuda/std/ from the
    `cccl` extra) come from the pip wheels."""
    if not (WHEEL_NVRTC.parent.parent / "include" / "cccl").is_dir():
        pytest.fail("nvidia-cuda-cccl is not installed: install kjit with the `cccl` extra")
    empty = tmp_path / "empty"
    empty.mkdir()
    hidden = {"/usr/local/cuda"}
    if Path("/usr/local/cuda").exists():
        hidden.add(str(Path("/usr/local/cuda").resolve()))
    mounts = " && ".join(f"mount --bind {empty} {path}" for path in sorted(hidden) if Path(path).exists())
    script = textwrap.dedent(f"""
        import os, kjit
        assert not os.listdir("/usr/local/cuda")
        assert kjit.RawKernel({FP16_AND_STD!r}, "k").compile("sm_90") > 1000  # cubin bytes
        maps = {{line.split()[-1] for line in open("/proc/self/maps") if "libnvrtc" in line}}
        assert any(m.startswith({str(WHEEL_NVRTC.parent)!r}) for m in maps), maps
        assert not any(m.startswith("/usr/local/cuda") for m in maps), maps
        print("ok")
    """)
    (tmp_path / "check.py").write_text(script)
    command = (f"{mounts or 'true'} && {sys.executable} {tmp_path / 'check.py'} && "
               f"{sys.executable} -m kjit warm img2gray activation --arch sm_90")
    result = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True,
                            env=clean_env(KJIT_CACHE_DIR=str(tmp_path / "cache")), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok" in result.stdout
    assert "0 failed" in result.stdout + result.stderr
