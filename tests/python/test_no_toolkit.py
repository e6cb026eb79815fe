"""NVRTC and the CUDA headers from the pip wheels (CPU only).

`scripts/dev wheel-test` runs the suite in a mount namespace where the CUDA toolkit is hidden
(KJIT_EXPECT_NO_TOOLKIT=1): there, NVRTC must come from site-packages. Everywhere, the NVRTC that
compiles is the one `kjit info` reports, and kernels including cuda_fp16.h and cuda/std headers
compile with the headers found beside it.
"""

import os
from pathlib import Path

import kjit
from kjit import _C

FP16 = r"""
#include <cuda_fp16.h>
extern "C" __global__ void scale(__half* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __float2half(__half2float(x[i]) * s);
}
"""

CCCL = r"""
#include <cuda/std/limits>
#include <cuda/std/type_traits>
template <class T> __global__ void fill_max(T* out) {
  static_assert(cuda::std::is_integral_v<T>);
  out[threadIdx.x] = cuda::std::numeric_limits<T>::max();
}
"""


def mapped_nvrtc() -> list[str]:
    return sorted({line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                   if "/libnvrtc.so" in line})


def test_the_nvrtc_that_compiles_is_the_one_reported_and_finds_its_headers():
    assert kjit.RawKernel(FP16, "scale").compile("sm_90") > 0
    assert kjit.RawKernel(CCCL, "fill_max<int>", name_expressions=["fill_max<int>"]).compile("sm_90") > 0
    info = _C.nvrtc_info()
    assert info["found"], info
    library = os.path.realpath(info["library"])
    assert library in [os.path.realpath(p) for p in mapped_nvrtc()], (library, mapped_nvrtc())
    # The headers are those of NVRTC's own root.
    root = Path(library).parent.parent
    assert info["include_dirs"] and all(Path(d).is_relative_to(root) for d in info["include_dirs"]), info
    if os.environ.get("KJIT_EXPECT_NO_TOOLKIT") == "1":
        assert not Path("/usr/local/cuda/include").exists(), "the toolkit is not hidden"
        assert "CUDA_HOME" not in os.environ and "LD_LIBRARY_PATH" not in os.environ
        assert all("site-packages/nvidia/" in p for p in mapped_nvrtc()), mapped_nvrtc()
        assert "site-packages/nvidia/" in library, info
