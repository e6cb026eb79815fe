// torch's stable C ABI, resolved at run time from the torch the process imported; never linked.
//
// Note [Stable ABI table]: the torch layer calls torch only through the C shims of its stable ABI
// (`aoti_torch_*`, `torch_*`: torch/csrc/inductor/aoti_torch/c/shim.h and
// torch/csrc/stable/c/shim.h), whose prototypes come from torch's headers at build time with
// TORCH_TARGET_VERSION = 2.11, so a call that needs a newer torch does not compile. The functions
// are looked up with dlsym in the libtorch_cpu (and, for the CUDA stream, libtorch_cuda) that
// `import torch` mapped, as the driver and NVRTC are: kjit's module has no link dependency on
// torch, and one built module serves every torch from 2.11 on (tested with 2.11 and 2.15). What
// the shims cannot do is done from Python (kjit/_torch_layer.py): schemas and tags, fake kernels
// with symbolic shapes, CPU implementations, autograd.
#pragma once

#include <torch/csrc/stable/c/shim.h>

#include <string>

namespace kjit::torch_layer {

#define KJIT_TORCH_FUNCTIONS(X)                                                                    \
  X(aoti_torch_library_init_impl)                                                                  \
  X(torch_library_impl)                                                                            \
  X(aoti_torch_delete_tensor_object)                                                               \
  X(aoti_torch_get_data_ptr)                                                                       \
  X(aoti_torch_get_dim)                                                                            \
  X(aoti_torch_get_sizes)                                                                          \
  X(aoti_torch_get_strides)                                                                        \
  X(aoti_torch_get_dtype)                                                                          \
  X(aoti_torch_get_device_type)                                                                    \
  X(aoti_torch_get_device_index)                                                                   \
  X(aoti_torch_empty_strided)                                                                      \
  X(aoti_torch_create_device_guard)                                                                \
  X(aoti_torch_delete_device_guard)                                                                \
  X(aoti_torch_device_type_cpu)                                                                    \
  X(aoti_torch_device_type_cuda)                                                                   \
  X(aoti_torch_dtype_uint8)                                                                        \
  X(aoti_torch_dtype_int32)                                                                        \
  X(aoti_torch_dtype_int64)                                                                        \
  X(aoti_torch_dtype_float16)                                                                      \
  X(aoti_torch_dtype_float32)                                                                      \
  X(aoti_torch_dtype_float64)                                                                      \
  X(aoti_torch_dtype_bool)                                                                         \
  X(aoti_torch_dtype_bfloat16)                                                                     \
  X(torch_list_size)                                                                               \
  X(torch_list_get_item)                                                                           \
  X(torch_delete_list)                                                                             \
  X(torch_string_length)                                                                           \
  X(torch_string_c_str)                                                                            \
  X(torch_delete_string)

// `aoti_torch_get_current_cuda_stream`, declared by torch only in CUDA builds of its headers.
using GetCudaStream = AOTITorchError (*)(int32_t device_index, void** stream);

struct TorchApi {
#define KJIT_TORCH_MEMBER(name) decltype(&::name) name = nullptr;
  KJIT_TORCH_FUNCTIONS(KJIT_TORCH_MEMBER)
#undef KJIT_TORCH_MEMBER
  GetCudaStream get_current_cuda_stream = nullptr; // null for a CPU-only torch
  int32_t cpu = 0;                                 // device type codes
  int32_t cuda = 0;
};

// Resolves the table from `libtorch_cpu` (a path: the library must already be loaded by `import
// torch`) and `libtorch_cuda` (empty or not loaded for a CPU-only torch). Throws kjit::Error naming
// a missing function (a torch older than 2.11) or a library that is not loaded. Idempotent.
void attach(const std::string& libtorch_cpu, const std::string& libtorch_cuda);

// The table; throws kjit::Error when `attach` has not succeeded.
const TorchApi& torch_api();

// Throws std::runtime_error "<what>: torch's <call> failed" for a non-zero shim result (before
// torch 2.13 the shim's own message is only printed to stderr).
[[noreturn]] void throw_failed(const char* call, const char* what);
inline void check(AOTITorchError result, const char* call, const char* what) {
  if (result != AOTI_TORCH_SUCCESS) [[unlikely]] {
    throw_failed(call, what);
  }
}

} // namespace kjit::torch_layer
