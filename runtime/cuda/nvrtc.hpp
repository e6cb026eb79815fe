// NVRTC, found and loaded with dlopen at first need through one function table; never linked.
//
// Note [NVRTC table]: every NVRTC call goes through `nvrtc()`, a table of pointers resolved once
// by name, so that tests can inject failures (`NvrtcOverride`), as with the driver (Note [Driver
// table]). A missing NVRTC is an `NvrtcError` raised by `nvrtc()` that names every place searched
// and what to install; everything that never compiles (stores, manifests, the CLI's cache
// commands) works without one.
//
// Note [Finding NVRTC]: the first hit wins, in this order:
//   1. `KJIT_NVRTC_LIBRARY`, a library file (an error if it cannot be loaded: no fallback);
//   2. a libnvrtc already mapped into the process (torch's own, once torch has loaded it);
//   3. the pip wheels (`nvidia/cu13/lib/libnvrtc.so.13`, `nvidia/cuda_nvrtc/lib/libnvrtc.so.12`)
//      in the Python path given by `set_python_paths`, in the folders above kjit's own binary
//      (site-packages of the module or the console script's environment), and under
//      `$VIRTUAL_ENV`;
//   4. `$CONDA_PREFIX/lib`;
//   5. the loader's path (`libnvrtc.so.13`, then `.12`);
//   6. `$CUDA_HOME`, `$CUDA_PATH`, then `/usr/local/cuda` (`lib64`, `lib`).
// A wheel's NVRTC has no RPATH, so the builtins library beside it is loaded first, by absolute
// path. The headers NVRTC is given come from the same root as the library (Note [CUDA headers]).
#pragma once

#include "runtime/cuda/nvrtc_api.hpp"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kjit::detail {

#define KJIT_NVRTC_FUNCTIONS(X)                                                                    \
  X(nvrtcGetErrorString)                                                                           \
  X(nvrtcVersion)                                                                                  \
  X(nvrtcGetNumSupportedArchs)                                                                     \
  X(nvrtcGetSupportedArchs)                                                                        \
  X(nvrtcCreateProgram)                                                                            \
  X(nvrtcDestroyProgram)                                                                           \
  X(nvrtcCompileProgram)                                                                           \
  X(nvrtcGetProgramLogSize)                                                                        \
  X(nvrtcGetProgramLog)                                                                            \
  X(nvrtcGetCUBINSize)                                                                             \
  X(nvrtcGetCUBIN)                                                                                 \
  X(nvrtcGetPTXSize)                                                                               \
  X(nvrtcGetPTX)                                                                                   \
  X(nvrtcAddNameExpression)                                                                        \
  X(nvrtcGetLoweredName)

// Functions that older NVRTCs lack; their entries may be null.
#define KJIT_NVRTC_OPTIONAL_FUNCTIONS(X) X(nvrtcGetPCHCreateStatus) /* 12.8 */

struct NvrtcApi {
#define KJIT_NVRTC_MEMBER(name) decltype(&::name) name = nullptr;
  KJIT_NVRTC_FUNCTIONS(KJIT_NVRTC_MEMBER)
  KJIT_NVRTC_OPTIONAL_FUNCTIONS(KJIT_NVRTC_MEMBER)
#undef KJIT_NVRTC_MEMBER
  int version_major = 0;
  int version_minor = 0;
  // The include dirs of CUDA's headers from the library's root (Note [CUDA headers]), and a
  // digest of what identifies them, which enters every cache key.
  std::vector<std::string> include_dirs;
  std::array<std::uint64_t, 2> headers_digest{};
};

// The NVRTC table, finding and loading NVRTC on first use (thread-safe). Throws `NvrtcError`
// when none is found; later calls throw the same error again without searching again.
const NvrtcApi& nvrtc();

// Note [NVRTC identity]: a cache key holds NVRTC's version, and loading NVRTC (a 100 MB library)
// takes about 7 ms, more than a whole warm first use. So a lookup does not load it: the library
// file is located by stat calls alone (`nvrtc_location`), and its version is remembered in the
// store, keyed by the file's path, size and modification time (Runtime). NVRTC is loaded when a
// kernel is compiled, or once per new NVRTC file to learn its version.
struct NvrtcLocation {
  std::string library; // real path
  std::string how;
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::vector<std::string> include_dirs;
  std::array<std::uint64_t, 2> headers_digest{};
};
// The NVRTC file the search would load first, found without loading anything; nothing when no
// candidate exists. Memoized.
const std::optional<NvrtcLocation>& nvrtc_location();
// Whether `nvrtc()` is cheap now: its table loaded, or overridden. An NVRTC that is only mapped
// into the process (torch's) is not: building the table and asking it for its archs costs ~2 ms,
// the most of a warm first launch, where the store remembers the same answers.
bool nvrtc_loaded() noexcept;

// Where NVRTC was found and why, or why not: what `kjit info` reports. Never throws; searches
// (and loads) on first call, as `nvrtc()` does.
struct NvrtcSearch {
  std::string library;               // the file loaded, empty when none
  std::string how;                   // "KJIT_NVRTC_LIBRARY", "already loaded", "pip wheel", ...
  std::vector<std::string> searched; // every candidate tried, in order, with why it failed
  std::string error;                 // empty when loaded
};
const NvrtcSearch& nvrtc_search();

// The folders of Python's `sys.path`, given by the Python module at import, so that NVRTC is found
// in any site-packages (Note [Finding NVRTC]). Takes effect only before NVRTC is first loaded.
void set_python_paths(std::vector<std::string> paths);

// The include dirs of CUDA's headers for an NVRTC library file at `library` (a real path): its
// root's `include` (and `include/cccl`), or for CUDA 12 wheels the `include` of the sibling
// `nvidia/cuda_runtime`, `cuda_cccl` and `cuda_crt` wheels. Exposed for tests.
std::vector<std::string> cuda_include_dirs_for(const std::string& library);

// What identifies CUDA's headers in `include_dirs` (Note [CUDA headers]). Exposed for tests.
std::array<std::uint64_t, 2> cuda_headers_digest(const std::vector<std::string>& include_dirs);

// Tests only: swaps the table for `table` while the object lives.
class NvrtcOverride {
public:
  explicit NvrtcOverride(const NvrtcApi& table);
  ~NvrtcOverride();
  NvrtcOverride(const NvrtcOverride&) = delete;
  NvrtcOverride& operator=(const NvrtcOverride&) = delete;

private:
  const NvrtcApi* m_previous;
};

} // namespace kjit::detail
