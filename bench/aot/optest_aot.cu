// The peers of kjit's real-op features: the test package optest's kernels in an ahead-of-time torch
// extension built with nvcc (TORCH_LIBRARY + CUDA impls launching on torch's current stream, with
// the same checks as the manifest), and raw launch loops for the per-launch cost. Benchmarks only.
//   aot_optest::add_rms_(x!, residual!, weight, eps) -> ()   in place; BLOCK chosen at run time
//   aot_optest::bias_act(x, bias?, mode) -> Tensor          the optional bias compiled in or out
//   aot_optest::touch_(x!, n) -> ()                         n <<<>>> launches of a tiny kernel
//   aot_optest::touch_driver_(x!, n) -> ()                  n raw cuLaunchKernel calls of it
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <torch/library.h>

#include "../../tests/packages/optest/optest.cu"
#include "../packages/launches/launches.cu"

namespace {

int next_pow2(int v) {
  int p = 1;
  while (p < v) {
    p *= 2;
  }
  return p;
}

template <int BLOCK>
void launch_add_rms(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, float eps) {
  const int hidden = static_cast<int>(x.size(1));
  add_rms_kernel<BLOCK>
    <<<static_cast<unsigned>(x.size(0)), BLOCK, 0, at::cuda::getCurrentCUDAStream()>>>(
      static_cast<float*>(x.data_ptr()), static_cast<float*>(residual.data_ptr()),
      static_cast<const float*>(weight.data_ptr()), eps, hidden);
}

void add_rms_(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && residual.dim() == 2 && weight.dim() == 1, "add_rms_: dims");
  TORCH_CHECK(x.size(0) == residual.size(0) && x.size(1) == residual.size(1) &&
                weight.size(0) == x.size(1),
              "add_rms_: sizes");
  TORCH_CHECK(x.scalar_type() == at::kFloat && residual.scalar_type() == at::kFloat &&
                weight.scalar_type() == at::kFloat,
              "add_rms_: float32");
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous() && weight.is_contiguous(),
              "add_rms_: contiguous");
  const c10::cuda::CUDAGuard guard(x.device());
  if (x.size(0) == 0) {
    return;
  }
  const auto e = static_cast<float>(eps);
  switch (std::min(next_pow2(static_cast<int>(x.size(1))), 1024)) {
  case 1:
    launch_add_rms<1>(x, residual, weight, e);
    break;
  case 2:
    launch_add_rms<2>(x, residual, weight, e);
    break;
  case 4:
    launch_add_rms<4>(x, residual, weight, e);
    break;
  case 8:
    launch_add_rms<8>(x, residual, weight, e);
    break;
  case 16:
    launch_add_rms<16>(x, residual, weight, e);
    break;
  case 32:
    launch_add_rms<32>(x, residual, weight, e);
    break;
  case 64:
    launch_add_rms<64>(x, residual, weight, e);
    break;
  case 128:
    launch_add_rms<128>(x, residual, weight, e);
    break;
  case 256:
    launch_add_rms<256>(x, residual, weight, e);
    break;
  case 512:
    launch_add_rms<512>(x, residual, weight, e);
    break;
  default:
    launch_add_rms<1024>(x, residual, weight, e);
    break;
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <bool HAS_BIAS, int MODE>
void launch_bias_act(at::Tensor& out, const at::Tensor& x, const float* bias) {
  const long long n = x.numel();
  bias_act_kernel<HAS_BIAS, MODE>
    <<<static_cast<unsigned>((n + 255) / 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      static_cast<float*>(out.data_ptr()), static_cast<const float*>(x.data_ptr()), bias, n,
      static_cast<int>(x.size(-1)));
}

at::Tensor bias_act(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                    c10::string_view mode) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() >= 1, "bias_act: x");
  const bool has_bias = bias.has_value();
  TORCH_CHECK(!has_bias || (bias->dim() == 1 && bias->size(0) == x.size(-1) &&
                            bias->scalar_type() == at::kFloat),
              "bias_act: bias");
  int m = 0;
  if (mode == "relu") {
    m = 0;
  } else if (mode == "identity") {
    m = 1;
  } else {
    TORCH_CHECK(false, "bias_act: mode must be relu or identity");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty_like(x);
  if (x.numel() == 0) {
    return out;
  }
  const float* b = has_bias ? static_cast<const float*>(bias->data_ptr()) : nullptr;
  if (has_bias) {
    m == 0 ? launch_bias_act<true, 0>(out, x, b) : launch_bias_act<true, 1>(out, x, b);
  } else {
    m == 0 ? launch_bias_act<false, 0>(out, x, b) : launch_bias_act<false, 1>(out, x, b);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

void touch_(at::Tensor& x, int64_t n) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.numel() >= 1, "touch_: float32, not empty");
  const c10::cuda::CUDAGuard guard(x.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  auto* p = static_cast<float*>(x.data_ptr());
  for (int64_t i = 0; i < n; ++i) {
    touch_kernel<<<1, 32, 0, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The driver's cuLaunchKernel, reached through the runtime (no link to libcuda).
using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void**, void**);

struct Driver {
  LaunchFn launch = nullptr;
  CUfunction touch = nullptr;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    C10_CUDA_CHECK(
      cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fn, 12000, cudaEnableDefault, &found));
    TORCH_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr, "no cuLaunchKernel");
    r.launch = reinterpret_cast<LaunchFn>(fn);
    cudaFunction_t f = nullptr;
    C10_CUDA_CHECK(cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(&touch_kernel)));
    r.touch = reinterpret_cast<CUfunction>(f);
    return r;
  }();
  return d;
}

void touch_driver_(at::Tensor& x, int64_t n) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.numel() >= 1, "touch_driver_: float32");
  const c10::cuda::CUDAGuard guard(x.device());
  const Driver& d = driver();
  const auto stream = reinterpret_cast<CUstream>(at::cuda::getCurrentCUDAStream().stream());
  void* p = x.data_ptr();
  void* args[] = {&p};
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(d.launch(d.touch, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr) == CUDA_SUCCESS,
                "cuLaunchKernel failed");
  }
}

} // namespace

TORCH_LIBRARY(aot_optest, m) {
  m.def("add_rms_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps=1e-6) -> ()");
  m.def("bias_act(Tensor x, Tensor? bias=None, str mode=\"relu\") -> Tensor");
  m.def("touch_(Tensor(a!) x, int n) -> ()");
  m.def("touch_driver_(Tensor(a!) x, int n) -> ()");
}

TORCH_LIBRARY_IMPL(aot_optest, CUDA, m) {
  m.impl("add_rms_", &add_rms_);
  m.impl("bias_act", &bias_act);
  m.impl("touch_", &touch_);
  m.impl("touch_driver_", &touch_driver_);
}
