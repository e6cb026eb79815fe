#include "call_env.hpp"

#include <kjit/device.hpp>

#include "runtime/manifest/expr.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <mutex>
#include <span>
#include <stdexcept>

namespace kjit::torch_layer {

TensorRef read_tensor(const TorchApi& api, AtenTensorHandle handle) {
  TensorRef t{};
  t.handle = handle;
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
  const bool ok = api.aoti_torch_get_dim(handle, &t.dim) == AOTI_TORCH_SUCCESS &&
                  api.aoti_torch_get_sizes(handle, &sizes) == AOTI_TORCH_SUCCESS &&
                  api.aoti_torch_get_strides(handle, &strides) == AOTI_TORCH_SUCCESS &&
                  api.aoti_torch_get_dtype(handle, &t.dtype) == AOTI_TORCH_SUCCESS &&
                  api.aoti_torch_get_device_type(handle, &t.device_type) == AOTI_TORCH_SUCCESS &&
                  api.aoti_torch_get_device_index(handle, &t.device_index) == AOTI_TORCH_SUCCESS;
  if (!ok) {
    throw_failed("tensor metadata call", "kjit op");
  }
  t.sizes = sizes;
  t.strides = strides;
  return t;
}

std::string device_text(const TorchApi& api, const TensorRef& t) {
  if (t.device_type == api.cuda) {
    return fmt::format("cuda:{}", t.device_index);
  }
  if (t.device_type == api.cpu) {
    return "cpu";
  }
  return fmt::format("device type {}", t.device_type);
}

std::string describe(const TorchApi& api, const std::string& name, const CallEnv& env, int i) {
  const TensorRef& t = env.tensors[i];
  if (t.handle == nullptr) {
    return fmt::format("'{}' is None", name);
  }
  const auto dtype = detail::dtype_name(static_cast<detail::DType>(t.dtype));
  return fmt::format("'{}' has shape [{}], dtype {}, device {}{}", name,
                     fmt::join(std::span(t.sizes, static_cast<std::size_t>(t.dim)), ", "),
                     dtype != "unknown" ? std::string(dtype) : fmt::format("code {}", t.dtype),
                     device_text(api, t), env.is_contiguous(i) ? "" : ", not contiguous");
}

std::size_t element_size(int32_t dtype) noexcept {
  switch (static_cast<detail::DType>(dtype)) {
  case detail::DType::uint8:
  case detail::DType::int8:
  case detail::DType::bool_:
    return 1;
  case detail::DType::int16:
  case detail::DType::float16:
  case detail::DType::bfloat16:
    return 2;
  case detail::DType::int32:
  case detail::DType::float32:
    return 4;
  case detail::DType::int64:
  case detail::DType::float64:
    return 8;
  }
  return 0;
}

bool CallEnv::aligned(int t, std::int64_t bytes) const {
  void* ptr = nullptr;
  check(api->aoti_torch_get_data_ptr(tensors[t].handle, &ptr), "aoti_torch_get_data_ptr",
        "aligned()");
  return reinterpret_cast<std::uintptr_t>(ptr) % static_cast<std::uintptr_t>(bytes) == 0;
}

std::int64_t CallEnv::device_prop(detail::DeviceProp prop) const {
  if (props == nullptr) {
    throw detail::EvalError("device.* is known only at a launch");
  }
  switch (prop) {
  case detail::DeviceProp::sm_count:
    return props->sm_count;
  case detail::DeviceProp::max_shared_mem:
    return props->max_shared_mem;
  case detail::DeviceProp::cc:
    return props->cc;
  case detail::DeviceProp::warp_size:
    return props->warp_size;
  }
  return 0;
}

namespace {
constexpr int k_max_devices = 64;
std::array<DeviceProps, k_max_devices> g_props;
std::array<std::once_flag, k_max_devices> g_props_once;
} // namespace

const DeviceProps& device_props(int device) {
  if (device < 0 || device >= k_max_devices) {
    throw std::invalid_argument(
      fmt::format("kjit ops run on CUDA devices 0 to {}, not {}", k_max_devices - 1, device));
  }
  std::call_once(g_props_once[device], [device] {
    const DeviceInfo info = device_info(device);
    g_props[device] =
      DeviceProps{info.sm_count, info.max_shared_mem_optin, info.arch.major * 10 + info.arch.minor,
                  info.warp_size, info.name};
  });
  return g_props[device];
}

} // namespace kjit::torch_layer
