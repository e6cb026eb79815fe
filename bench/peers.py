"""The peers kjit is measured against, each running img2gray (and the gated activations where
they fit), built the way their users build them:

  eager        the same arithmetic in torch ops
  aot          an ahead-of-time torch extension built with nvcc (the kernel-builder way):
               torch.ops.aot.img2gray, the same kernel as kjit's op (bench/aot/img2gray_aot.cu)
  load_inline  torch.utils.cpp_extension.load_inline with the same kernel, a pybind function
  cupy         cupy.RawKernel with the same kernel source, on CuPy arrays
  triton       a Triton kernel written for the job (one program per 1024 pixels)
  jiterator    torch.cuda.jiterator: an elementwise function over the R, G and B views

Shared by bench_first_use.py (each peer's first use in a new process) and bench_ops.py.
"""

import os
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
KERNEL_SOURCE = ROOT / "kernels_src" / "img2gray" / "img2gray.cu"
AOT_SOURCE = ROOT / "bench" / "aot" / "img2gray_aot.cu"
NVCC_FLAGS = ["-O3", "-gencode=arch=compute_90,code=sm_90"]


def eager_img2gray(image):
    rgb = image.to(torch.int32)
    return ((77 * rgb[..., 0] + 150 * rgb[..., 1] + 29 * rgb[..., 2] + 128) >> 8).to(torch.uint8)


def eager_silu_and_mul(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def eager_gelu_and_mul(x):
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d]) * x[..., d:]


def build_aot(build_dir):
    """Builds (or, when `build_dir` holds a build, loads) the AOT extension: torch.ops.aot.*."""
    from torch.utils.cpp_extension import load

    os.makedirs(build_dir, exist_ok=True)
    load(name="kjit_bench_aot", sources=[str(AOT_SOURCE)], is_python_module=False,
         extra_cuda_cflags=NVCC_FLAGS, build_directory=str(build_dir), verbose=False)
    return torch.ops.aot.img2gray


LOAD_INLINE_CPP = "at::Tensor img2gray(const at::Tensor& image);"
LOAD_INLINE_CUDA = (
    "#include <ATen/ATen.h>\n#include <ATen/cuda/CUDAContext.h>\n"
    + KERNEL_SOURCE.read_text()
    + r"""
at::Tensor img2gray(const at::Tensor& image) {
  TORCH_CHECK(image.dim() == 3 && image.size(2) == 3, "image must be H x W x 3");
  TORCH_CHECK(image.scalar_type() == at::kByte && image.is_contiguous(), "contiguous uint8 image");
  auto out = at::empty({image.size(0), image.size(1)}, image.options());
  const long long pixels = out.numel();
  if (pixels > 0) {
    img2gray_vec_kernel<<<(pixels + 4095) / 4096, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      image.data_ptr<unsigned char>(), out.data_ptr<unsigned char>(), pixels);
  }
  return out;
}
"""
)


def build_load_inline(build_dir):
    from torch.utils.cpp_extension import load_inline

    os.makedirs(build_dir, exist_ok=True)
    module = load_inline(name="kjit_bench_inline", cpp_sources=[LOAD_INLINE_CPP],
                         cuda_sources=[LOAD_INLINE_CUDA], functions=["img2gray"],
                         extra_cuda_cflags=NVCC_FLAGS, build_directory=str(build_dir),
                         verbose=False)
    return module.img2gray


class CupyImg2gray:
    """cupy.RawKernel of the same source; call on a CuPy (H, W, 3) uint8 array."""

    def __init__(self):
        import cupy

        self.cp = cupy
        self.kernel = cupy.RawKernel(KERNEL_SOURCE.read_text(), "img2gray_vec_kernel")

    def __call__(self, image):
        out = self.cp.empty(image.shape[:2], dtype=self.cp.uint8)
        pixels = out.size
        self.kernel(((pixels + 4095) // 4096,), (256,), (image, out, self.cp.int64(pixels)))
        return out


def make_triton_img2gray():
    import triton
    import triton.language as tl

    @triton.jit
    def img2gray_triton(rgb, gray, pixels, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < pixels
        r = tl.load(rgb + 3 * offsets, mask=mask).to(tl.uint32)
        g = tl.load(rgb + 3 * offsets + 1, mask=mask).to(tl.uint32)
        b = tl.load(rgb + 3 * offsets + 2, mask=mask).to(tl.uint32)
        tl.store(gray + offsets, ((77 * r + 150 * g + 29 * b + 128) >> 8).to(tl.uint8), mask=mask)

    def run(image):
        out = torch.empty(image.shape[:2], dtype=torch.uint8, device=image.device)
        pixels = out.numel()
        img2gray_triton[(triton.cdiv(pixels, 1024),)](image, out, pixels, BLOCK=1024)
        return out

    return run


JITERATOR_IMG2GRAY = """
template <typename T> T img2gray(T r, T g, T b) {
  return T((77u * unsigned(r) + 150u * unsigned(g) + 29u * unsigned(b) + 128u) >> 8);
}"""
JITERATOR_SILU = """
template <typename T> T silu_mul(T a, T b) {
  const float x = float(a);
  return T(x / (1.0f + expf(-x)) * float(b));
}"""
JITERATOR_GELU = """
template <typename T> T gelu_mul(T a, T b) {
  const float x = float(a);
  return T(0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)) * float(b));
}"""


def make_jiterator_img2gray():
    fn = torch.cuda.jiterator._create_jit_fn(JITERATOR_IMG2GRAY)
    return lambda image: fn(image[..., 0], image[..., 1], image[..., 2])


def make_jiterator_act(code):
    fn = torch.cuda.jiterator._create_jit_fn(code)

    def run(x):
        d = x.shape[-1] // 2
        return fn(x[..., :d], x[..., d:])

    return run

