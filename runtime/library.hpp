// A loaded binary (`CUlibrary`) and its kernels.
//
// Libraries are loaded with cuLibraryLoadData, so their `CUkernel` handles are
// context-independent: one load serves every device (the driver loads the module into a context
// at the first launch there).
#pragma once

#include "runtime/cuda/driver.hpp"

#include <kjit/kernel.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace kjit::detail {

class Library;

// What a `kjit::Kernel` points at: a kernel and its parameter layout. Lives inside its `Library`;
// a `Kernel` holds it through an aliasing shared_ptr that owns the library.
struct KernelRecord {
  const Library* library = nullptr;
  CUkernel handle = nullptr;
  std::string name;         // as asked for
  std::string lowered_name; // in the binary
  // The parameter layout, read at first need with a context current (the driver's
  // cuKernelGetParamInfo needs one): see `params()`.
  mutable std::once_flag params_once;
  mutable std::atomic<bool> params_ready{false}; // resolve_params' fast path (per launch)
  mutable bool params_known = false;
  mutable std::vector<std::size_t> param_sizes;

  // Reads the layout once; makes a context current first when none is (the stream's, else device
  // 0's primary context).
  void resolve_params(CUstream stream = nullptr) const;
};

// Owning `CUlibrary`; unloads on destruction (a failure is logged, never thrown).
class Library : public std::enable_shared_from_this<Library> {
public:
  // Loads `image` (a cubin, or NUL-terminated PTX that the driver compiles). `what` names it in
  // errors. Throws `DriverError`.
  static std::shared_ptr<Library> load(std::string_view image, const std::string& what);
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  CUlibrary get() const noexcept { return m_handle; }

  // The kernel with mangled name `lowered_name` (asked for as `name`), memoized. Throws
  // `LaunchError` when the binary has no such kernel.
  std::shared_ptr<const KernelRecord> kernel(const std::string& name,
                                             const std::string& lowered_name);

private:
  Library(CUlibrary handle, std::string what) : m_handle(handle), m_what(std::move(what)) {}

  CUlibrary m_handle;
  std::string m_what;
  std::mutex m_mutex;
  std::map<std::string, std::unique_ptr<KernelRecord>, std::less<>> m_kernels; // by name asked
};

} // namespace kjit::detail
