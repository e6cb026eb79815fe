#include "runtime/library.hpp"

#include "runtime/logging.hpp"

#include <fmt/format.h>

namespace kjit::detail {
namespace {

// Parameter layouts have no practical limit below this; it bounds the probing loop.
constexpr std::size_t k_max_params = 4096;

} // namespace

void KernelRecord::resolve_params(CUstream stream) const {
  if (params_ready.load(std::memory_order_acquire)) {
    return; // every launch after the first: no call_once (it sets thread-locals each time)
  }
  std::call_once(params_once, [&] {
    const DriverApi& d = driver();
    if (d.cuKernelGetParamInfo == nullptr) {
      return; // a driver before CUDA 12.4: launches are not size-checked
    }
    ensure_context(stream);
    std::size_t offset = 0;
    std::size_t size = 0;
    CUresult result = CUDA_SUCCESS;
    while (param_sizes.size() < k_max_params) {
      result = d.cuKernelGetParamInfo(handle, param_sizes.size(), &offset, &size);
      if (result != CUDA_SUCCESS) {
        break;
      }
      param_sizes.push_back(size);
    }
    // Past the last parameter the driver answers CUDA_ERROR_INVALID_VALUE; anything else means
    // it could not tell, and launches go unchecked rather than wrongly refused.
    params_known = result == CUDA_ERROR_INVALID_VALUE;
    if (!params_known) {
      log(LogLevel::debug, "no parameter layout for kernel '{}': {}", name,
          driver_error_text(result));
      param_sizes.clear();
    }
    params_ready.store(true, std::memory_order_release);
  });
}

std::shared_ptr<Library> Library::load(std::string_view image, const std::string& what) {
  const DriverApi& d = driver();
  CUlibrary handle = nullptr;
  KJIT_CU_CHECK(
    d.cuLibraryLoadData(&handle, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
    "cannot load the binary of {}", what);
  return std::shared_ptr<Library>(new Library(handle, what));
}

Library::~Library() {
  try {
    const CUresult result = driver().cuLibraryUnload(m_handle);
    // At process exit the driver may be torn down first; that is not worth a warning.
    if (result != CUDA_SUCCESS && result != CUDA_ERROR_DEINITIALIZED) {
      log(LogLevel::warning, "cannot unload the library of {}: {}", m_what,
          driver_error_text(result));
    }
  } catch (...) {
    // No driver: nothing was loaded through it.
  }
}

std::shared_ptr<const KernelRecord> Library::kernel(const std::string& name,
                                                    const std::string& lowered_name) {
  std::lock_guard lock(m_mutex);
  auto it = m_kernels.find(name);
  if (it == m_kernels.end()) {
    const DriverApi& d = driver();
    auto record = std::make_unique<KernelRecord>();
    record->library = this;
    record->name = name;
    record->lowered_name = lowered_name;
    const CUresult result = d.cuLibraryGetKernel(&record->handle, m_handle, lowered_name.c_str());
    if (result == CUDA_ERROR_NOT_FOUND) {
      throw LaunchError(fmt::format(
        "{} has no kernel '{}'{}: give an extern \"C\" __global__ function's name or one of the "
        "program's name expressions",
        m_what, name, lowered_name == name ? "" : fmt::format(" (lowered '{}')", lowered_name)));
    }
    KJIT_CU_CHECK(result, "cannot get kernel '{}' of {}", name, m_what);
    it = m_kernels.emplace(name, std::move(record)).first;
  }
  // Aliasing: the pointer is the record, the ownership the library's.
  return std::shared_ptr<const KernelRecord>(shared_from_this(), it->second.get());
}

} // namespace kjit::detail
