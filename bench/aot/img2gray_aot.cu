// The peer of kjit's img2gray op: the same kernels in an ahead-of-time torch extension built with
// nvcc, the way kernel-builder builds kernels (TORCH_LIBRARY + a CUDA impl launching on torch's
// current stream, with the same checks as the manifest). Used by the benchmarks only.
//   aot::img2gray        the kernel kjit's op launches (16 pixels a thread)
//   aot::img2gray_naive  the readable one-thread-per-pixel kernel beside it
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../../kernels_src/img2gray/img2gray.cu"

namespace {

at::Tensor checked_output(const at::Tensor& image) {
  TORCH_CHECK(image.dim() == 3, "image must be H x W x 3");
  TORCH_CHECK(image.size(2) == 3, "image must be H x W x 3");
  TORCH_CHECK(image.scalar_type() == at::kByte, "image must be uint8");
  TORCH_CHECK(image.is_contiguous(), "image must be contiguous");
  return at::empty({image.size(0), image.size(1)}, image.options());
}

at::Tensor img2gray(const at::Tensor& image) {
  const c10::cuda::CUDAGuard guard(image.device());
  auto out = checked_output(image);
  const long long pixels = out.numel();
  if (pixels == 0) {
    return out;
  }
  const unsigned grid = static_cast<unsigned>((pixels + 16 * 256 - 1) / (16 * 256));
  img2gray_vec_kernel<<<grid, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
    static_cast<const unsigned char*>(image.data_ptr()),
    static_cast<unsigned char*>(out.data_ptr()), pixels);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor img2gray_naive(const at::Tensor& image) {
  const c10::cuda::CUDAGuard guard(image.device());
  auto out = checked_output(image);
  if (out.numel() == 0) {
    return out;
  }
  const int h = static_cast<int>(image.size(0));
  const int w = static_cast<int>(image.size(1));
  const dim3 block(32, 8);
  const dim3 grid((w + 31) / 32, (h + 7) / 8);
  img2gray_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
    static_cast<const unsigned char*>(image.data_ptr()),
    static_cast<unsigned char*>(out.data_ptr()), w, h);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

} // namespace

TORCH_LIBRARY(aot, m) {
  m.def("img2gray(Tensor image) -> Tensor");
  m.def("img2gray_naive(Tensor image) -> Tensor");
}

TORCH_LIBRARY_IMPL(aot, CUDA, m) {
  m.impl("img2gray", &img2gray);
  m.impl("img2gray_naive", &img2gray_naive);
}
