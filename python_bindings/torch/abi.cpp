#include "abi.hpp"

#include <kjit/error.hpp>

#include <dlfcn.h>
#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <stdexcept>

namespace kjit::torch_layer {
namespace {

std::mutex g_mutex;
TorchApi g_table;
std::atomic<const TorchApi*> g_api{nullptr}; // set once, after the table is complete

void* loaded(const std::string& path) {
  return path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL);
}

} // namespace

void throw_failed(const char* call, const char* what) {
  throw std::runtime_error(
    fmt::format("{}: torch's {} failed (its message, if any, is on stderr)", what, call));
}

void attach(const std::string& libtorch_cpu, const std::string& libtorch_cuda) {
  std::lock_guard lock(g_mutex);
  if (g_api.load(std::memory_order_relaxed) != nullptr) {
    return;
  }
  void* cpu = loaded(libtorch_cpu);
  if (cpu == nullptr) {
    throw Error(fmt::format("kjit's torch layer: '{}' is not loaded in this process (import torch "
                            "first)",
                            libtorch_cpu));
  }
  TorchApi table;
#define KJIT_TORCH_RESOLVE(name)                                                                   \
  table.name = reinterpret_cast<decltype(table.name)>(dlsym(cpu, #name));                          \
  if (table.name == nullptr) {                                                                     \
    throw Error(fmt::format("kjit's torch layer needs torch 2.11 or newer: this torch ('{}') has " \
                            "no stable-ABI function {}",                                           \
                            libtorch_cpu, #name));                                                 \
  }
  KJIT_TORCH_FUNCTIONS(KJIT_TORCH_RESOLVE)
#undef KJIT_TORCH_RESOLVE
  if (void* cuda = loaded(libtorch_cuda); cuda != nullptr) {
    table.get_current_cuda_stream =
      reinterpret_cast<GetCudaStream>(dlsym(cuda, "aoti_torch_get_current_cuda_stream"));
  }
  table.cpu = table.aoti_torch_device_type_cpu();
  table.cuda = table.aoti_torch_device_type_cuda();
  // kjit's DType numbers are c10::ScalarType's, which the shims' dtype codes are too.
  const std::pair<int32_t, int> codes[] = {
    {table.aoti_torch_dtype_uint8(), 0},   {table.aoti_torch_dtype_int32(), 3},
    {table.aoti_torch_dtype_int64(), 4},   {table.aoti_torch_dtype_float16(), 5},
    {table.aoti_torch_dtype_float32(), 6}, {table.aoti_torch_dtype_float64(), 7},
    {table.aoti_torch_dtype_bool(), 11},   {table.aoti_torch_dtype_bfloat16(), 15}};
  for (const auto& [code, expected] : codes) {
    if (code != expected) {
      throw Error(fmt::format("kjit's torch layer: this torch numbers dtypes differently (code {} "
                              "where {} was expected)",
                              code, expected));
    }
  }
  g_table = table;
  g_api.store(&g_table, std::memory_order_release);
}

const TorchApi& torch_api() {
  const TorchApi* api = g_api.load(std::memory_order_acquire);
  if (api == nullptr) {
    [[unlikely]] throw Error(
      "kjit's torch layer is not attached to torch (import kjit after torch)");
  }
  return *api;
}

} // namespace kjit::torch_layer
