// The CUDA driver, loaded with dlopen at first need through one function table; never linked.
//
// Note [Driver table]: every driver call goes through `driver()`, a table of pointers resolved once
// by name (the versioned names that cuda.h maps them to, e.g. cuMemAlloc_v2). Tests replace
// entries to inject failures (`DriverOverride`). A missing driver is a `DriverError` raised by
// `driver()`, so everything that never calls it (compiling, caching) works without one.
#pragma once

#include <kjit/error.hpp>

#include "runtime/cuda/driver_api.hpp"

#include <string>

namespace kjit::detail {

// Functions every supported driver has (CUDA 12.0+: the cuLibrary API).
#define KJIT_DRIVER_FUNCTIONS(X)                                                                   \
  X(cuInit)                                                                                        \
  X(cuDriverGetVersion)                                                                            \
  X(cuGetErrorName)                                                                                \
  X(cuGetErrorString)                                                                              \
  X(cuDeviceGet)                                                                                   \
  X(cuDeviceGetCount)                                                                              \
  X(cuDeviceGetAttribute)                                                                          \
  X(cuDeviceGetName)                                                                               \
  X(cuDeviceTotalMem)                                                                              \
  X(cuDevicePrimaryCtxRetain)                                                                      \
  X(cuCtxGetCurrent)                                                                               \
  X(cuCtxSetCurrent)                                                                               \
  X(cuCtxGetDevice)                                                                                \
  X(cuCtxSynchronize)                                                                              \
  X(cuStreamGetCtx)                                                                                \
  X(cuLibraryLoadData)                                                                             \
  X(cuLibraryUnload)                                                                               \
  X(cuLibraryGetKernel)                                                                            \
  X(cuKernelSetAttribute)                                                                          \
  X(cuLaunchKernel)                                                                                \
  X(cuMemAlloc)                                                                                    \
  X(cuMemFree)                                                                                     \
  X(cuMemcpyHtoD)                                                                                  \
  X(cuMemcpyDtoH)                                                                                  \
  X(cuMemsetD8)                                                                                    \
  X(cuMemsetD8Async)                                                                               \
  X(cuMemcpyDtoDAsync)                                                                             \
  X(cuStreamCreate)                                                                                \
  X(cuStreamDestroy)                                                                               \
  X(cuStreamSynchronize)                                                                           \
  X(cuStreamIsCapturing)                                                                           \
  X(cuStreamBeginCapture)                                                                          \
  X(cuStreamEndCapture)                                                                            \
  X(cuGraphInstantiate)                                                                            \
  X(cuGraphLaunch)                                                                                 \
  X(cuGraphExecDestroy)                                                                            \
  X(cuGraphDestroy)                                                                                \
  X(cuEventCreate)                                                                                 \
  X(cuEventDestroy)                                                                                \
  X(cuEventRecord)                                                                                 \
  X(cuEventSynchronize)                                                                            \
  X(cuEventElapsedTime)

// Functions that older drivers lack; their entries may be null.
#define KJIT_DRIVER_OPTIONAL_FUNCTIONS(X) X(cuKernelGetParamInfo) /* CUDA 12.4 */

struct DriverApi {
#define KJIT_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  KJIT_DRIVER_FUNCTIONS(KJIT_DRIVER_MEMBER)
  KJIT_DRIVER_OPTIONAL_FUNCTIONS(KJIT_DRIVER_MEMBER)
#undef KJIT_DRIVER_MEMBER
  int version = 0; // cuDriverGetVersion, e.g. 13000
};

// The driver table, loading and initializing the driver on first use (thread-safe). Throws
// `DriverError` ("no CUDA driver found ...") when libcuda.so.1 cannot be loaded or cuInit fails;
// later calls throw the same error again without retrying. `KJIT_CUDA_DRIVER` names another
// library file to load.
const DriverApi& driver();

// Whether `driver()` succeeds. Never throws.
bool driver_loaded() noexcept;

// "CUDA_ERROR_OUT_OF_MEMORY: out of memory" for `result`.
std::string driver_error_text(CUresult result);

// Throws `DriverError` for a failed `call`: "<what>: <call> failed: <name>: <text>".
[[noreturn]] void throw_driver_error(CUresult result, const char* call, const std::string& what);

// Tests only: swaps the live table for `table` while the object lives (loading the driver first
// is not needed: a table may be complete fakes).
class DriverOverride {
public:
  explicit DriverOverride(const DriverApi& table);
  ~DriverOverride();
  DriverOverride(const DriverOverride&) = delete;
  DriverOverride& operator=(const DriverOverride&) = delete;

private:
  const DriverApi* m_previous;
};

// Makes a context current on the calling thread when none is: the context of `stream` if it is
// not null, else device 0's primary context. Returns the current context.
CUcontext ensure_context(CUstream stream = nullptr);

} // namespace kjit::detail

// Calls `call` (an expression through `driver()`) and throws `DriverError` naming it and `what`
// (an fmt-formatted description of the work) when it fails.
#define KJIT_CU_CHECK(call, ...)                                                                   \
  do {                                                                                             \
    const CUresult kjit_result_ = (call);                                                          \
    if (kjit_result_ != CUDA_SUCCESS) {                                                            \
      ::kjit::detail::throw_driver_error(kjit_result_, #call, ::fmt::format(__VA_ARGS__));         \
    }                                                                                              \
  } while (false)
