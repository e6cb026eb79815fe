// The peer of kjit's img2gray op: the same kernel in an ahead-of-time torch extension built with
// nvcc, the way kernel-builder builds kernels (TORCH_LIBRARY + a CUDA impl launching on torch's
// current stream). Used by bench_ops.py only.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

__global__ void img2gray_kernel(const unsigned char* __restrict__ rgb,
                                unsigned char* __restrict__ gray, int width, int height) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= width || y >= height) {
    return;
  }
  const size_t i = static_cast<size_t>(y) * width + x;
  const unsigned char* p = rgb + 3 * i;
  gray[i] = static_cast<unsigned char>((77u * p[0] + 150u * p[1] + 29u * p[2] + 128u) >> 8);
}

at::Tensor img2gray(const at::Tensor& image) {
  TORCH_CHECK(image.dim() == 3, "image must be H x W x 3");
  TORCH_CHECK(image.size(2) == 3, "image must be H x W x 3");
  TORCH_CHECK(image.scalar_type() == at::kByte, "image must be uint8");
  TORCH_CHECK(image.is_contiguous(), "image must be contiguous");
  const c10::cuda::CUDAGuard guard(image.device());
  auto out = at::empty({image.size(0), image.size(1)}, image.options());
  const int h = static_cast<int>(image.size(0));
  const int w = static_cast<int>(image.size(1));
  if (out.numel() == 0) {
    return out;
  }
  const dim3 block(32, 8);
  const dim3 grid((w + 31) / 32, (h + 7) / 8);
  img2gray_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
    static_cast<const unsigned char*>(image.data_ptr()), static_cast<unsigned char*>(out.data_ptr()),
    w, h);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

TORCH_LIBRARY(aot, m) {
  m.def("img2gray(Tensor image) -> Tensor");
}

TORCH_LIBRARY_IMPL(aot, CUDA, m) {
  m.impl("img2gray", &img2gray);
}
