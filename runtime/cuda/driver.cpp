#include "runtime/cuda/driver.hpp"

#include "runtime/logging.hpp"
#include "runtime/util/env.hpp"

#include <fmt/format.h>

#include <atomic>
#include <dlfcn.h>
#include <mutex>
#include <optional>

namespace kjit::detail {
namespace {

#define KJIT_STRINGIFY_EXPANDED(name) KJIT_STRINGIFY(name)
#define KJIT_STRINGIFY(name) #name

struct LoadResult {
  DriverApi table;
  std::optional<DriverError> error;
};

LoadResult load_driver() {
  LoadResult result;
  const std::string library = getenv_nonempty("KJIT_CUDA_DRIVER").value_or("libcuda.so.1");
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace; the handle is never
  // closed, since kernels and contexts live until the process ends.
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    result.error.emplace(
      fmt::format("no CUDA driver found: cannot load '{}' ({}); compiling and caching work "
                  "without a driver, launching kernels needs one",
                  library, why != nullptr ? why : "unknown error"),
      0, "no driver");
    return result;
  }
  DriverApi& t = result.table;
#define KJIT_RESOLVE(name)                                                                         \
  t.name = reinterpret_cast<decltype(t.name)>(::dlsym(handle, KJIT_STRINGIFY_EXPANDED(name)));     \
  if (t.name == nullptr) {                                                                         \
    result.error.emplace(fmt::format("CUDA driver '{}' has no symbol '{}': it is older than "      \
                                     "CUDA 12.0, which kjit needs",                                \
                                     library, KJIT_STRINGIFY_EXPANDED(name)),                      \
                         0, "missing symbol");                                                     \
    return result;                                                                                 \
  }
  KJIT_DRIVER_FUNCTIONS(KJIT_RESOLVE)
#undef KJIT_RESOLVE
#define KJIT_RESOLVE_OPTIONAL(name)                                                                \
  t.name = reinterpret_cast<decltype(t.name)>(::dlsym(handle, KJIT_STRINGIFY_EXPANDED(name)));
  KJIT_DRIVER_OPTIONAL_FUNCTIONS(KJIT_RESOLVE_OPTIONAL)
#undef KJIT_RESOLVE_OPTIONAL

  const CUresult init = t.cuInit(0);
  if (init != CUDA_SUCCESS) {
    const char* name = nullptr;
    const char* text = nullptr;
    t.cuGetErrorName(init, &name);
    t.cuGetErrorString(init, &text);
    result.error.emplace(fmt::format("no usable CUDA driver: cuInit failed: {}: {}",
                                     name != nullptr ? name : "?", text != nullptr ? text : "?"),
                         static_cast<int>(init), name != nullptr ? name : "?");
    return result;
  }
  t.cuDriverGetVersion(&t.version);
  log(LogLevel::debug, "loaded CUDA driver '{}', version {}", library, t.version);
  return result;
}

const LoadResult& loaded() {
  static const LoadResult result = load_driver();
  return result;
}

std::atomic<const DriverApi*> g_override{nullptr};

} // namespace

const DriverApi& driver() {
  if (const DriverApi* table = g_override.load(std::memory_order_acquire)) {
    return *table;
  }
  const LoadResult& result = loaded();
  if (result.error) {
    throw *result.error;
  }
  return result.table;
}

bool driver_loaded() noexcept {
  if (g_override.load(std::memory_order_acquire) != nullptr) {
    return true;
  }
  try {
    return !loaded().error.has_value();
  } catch (...) {
    return false;
  }
}

std::string driver_error_text(CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  try {
    const DriverApi& d = driver();
    d.cuGetErrorName(result, &name);
    d.cuGetErrorString(result, &text);
  } catch (const Error&) {
    // Without a driver there are no names: the number still identifies the error.
  }
  return fmt::format("{}: {}", name != nullptr ? name : fmt::format("CUresult {}", int(result)),
                     text != nullptr ? text : "unknown error");
}

void throw_driver_error(CUresult result, const char* call, const std::string& what) {
  const char* name = nullptr;
  try {
    driver().cuGetErrorName(result, &name);
  } catch (const Error&) {
  }
  throw DriverError(fmt::format("{}: {} failed: {}", what, call, driver_error_text(result)),
                    static_cast<int>(result), name != nullptr ? name : "?");
}

DriverOverride::DriverOverride(const DriverApi& table)
  : m_previous(g_override.exchange(&table, std::memory_order_acq_rel)) {}

DriverOverride::~DriverOverride() {
  g_override.store(m_previous, std::memory_order_release);
}

CUcontext ensure_context(CUstream stream) {
  const DriverApi& d = driver();
  CUcontext context = nullptr;
  KJIT_CU_CHECK(d.cuCtxGetCurrent(&context), "cannot query the current CUDA context");
  if (context != nullptr) {
    return context;
  }
  if (stream != nullptr) {
    KJIT_CU_CHECK(d.cuStreamGetCtx(stream, &context), "cannot find the context of stream {}",
                  static_cast<void*>(stream));
  } else {
    CUdevice device = 0;
    KJIT_CU_CHECK(d.cuDeviceGet(&device, 0), "cannot get CUDA device 0");
    // The primary context is what the CUDA runtime and PyTorch use; it is retained for the life of
    // the process, as they do.
    KJIT_CU_CHECK(d.cuDevicePrimaryCtxRetain(&context, device),
                  "cannot retain the primary context of CUDA device 0");
  }
  KJIT_CU_CHECK(d.cuCtxSetCurrent(context), "cannot make a CUDA context current");
  return context;
}

} // namespace kjit::detail
