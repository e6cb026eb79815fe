// The kjit runtime: compile, cache, load and launch CUDA kernels at run time.
//
// **Example**
//
//   #include <kjit/kjit.hpp>
//
//   kjit::Runtime runtime;  // default cache, driver loaded at first need
//   auto program = kjit::Program::from_file("img2gray.cu");
//   kjit::Kernel k = runtime.kernel(program, "img2gray_kernel");  // compiled or fetched once
//   k.launch({kjit::cdiv(w, 32), kjit::cdiv(h, 8)}, {32, 8}, 0, nullptr, in, out, w, h);
//
//   // No GPU needed: compile for a named arch into the cache (pre-warming).
//   kjit::Binary cubin = runtime.compile(program, kjit::Target{kjit::Arch::parse("sm_90")});
#pragma once

#include <kjit/arch.hpp>
#include <kjit/cache.hpp>
#include <kjit/kernel.hpp>
#include <kjit/program.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kjit {

// A compiled program: a cubin or PTX, and the lowered names of its name expressions.
struct Binary {
  Target target;
  std::string data;                                               // the cubin or PTX
  std::vector<std::pair<std::string, std::string>> lowered_names; // expression -> mangled name
  std::string log;                                                // NVRTC's log (warnings)
  double compile_ms = 0;                                          // time of the NVRTC compile
  std::string key;                                                // the cache key, 32 hex digits
  bool cached = false; // found in a store, not compiled by this runtime
};

// How a `Runtime` is set up. Each field left empty takes the environment's or the default value.
struct RuntimeOptions {
  // The cache directory: else `$KJIT_CACHE_DIR`, else `$XDG_CACHE_HOME/kjit`, else
  // `~/.cache/kjit`.
  std::optional<std::filesystem::path> cache_dir;
  // Use no store (memory only): else `KJIT_DISABLE_CACHE=1`.
  std::optional<bool> disable_cache;
  // Open the store read-only even where it could be written (a store baked into an image):
  // kernels found there are used, kernels compiled stay in memory.
  bool cache_read_only = false;
  // Read-only stores searched after the writable one (store files, or folders holding one): else
  // `KJIT_CACHE_READONLY` (paths separated by ':').
  std::optional<std::vector<std::filesystem::path>> read_only_caches;
  // The store's size limit in bytes: else `KJIT_CACHE_MAX_SIZE` ("2G", "500M", bytes), else 2 GiB.
  std::optional<std::uint64_t> max_cache_size;
  // The arch to compile kernels for instead of the device's.
  std::optional<Arch> arch;
  // The driver version that enters cache keys when no driver is loaded (pre-warming for a fleet):
  // default the NVRTC's CUDA version (e.g. 13000). With a driver, its version is used.
  std::optional<int> driver_version;
  // The fleet's shared cache under the local store, a redis:// URL
  // (redis://[user[:password]@]host[:port][/db][?mode=ro&prefix=...&timeout_ms=...]): else
  // `KJIT_REMOTE_CACHE`; an empty string turns it off. Entries are signed with the secret in
  // `KJIT_REMOTE_CACHE_KEY_FILE` when set (unsigned ones are then refused). A remote that is down
  // or slow costs at most its timeouts: kernels compile locally.
  std::optional<std::string> remote_cache;
};

// Owns a cache, an in-process memo of compiled and loaded programs, and the lazily loaded driver.
// Thread-safe: threads asking for a kernel that is being compiled wait for that compile. Processes
// sharing a cache directory compile each kernel once between them.
class Runtime {
public:
  Runtime();
  explicit Runtime(RuntimeOptions options);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The kernel `name` (an `extern "C"` entry name or one of the program's name expressions) of
  // `program`, compiled for the current device (the calling thread's context, else device 0) or
  // the arch given in the options, fetched from the cache when it is there, and loaded. Throws
  // `CompileError`, `DriverError` (no driver, or the load failed) or `LaunchError` (no such
  // kernel).
  Kernel kernel(const Program& program, std::string_view name);

  // Compiles `program` for `target` through the memo and the cache, loading nothing: needs no GPU
  // and no driver. Throws `CompileError`.
  Binary compile(const Program& program, const Target& target);

  // The target kernels are compiled for: from the options' arch, else the current device's arch
  // (see `target_for_device`). Throws `DriverError` when neither exists.
  Target default_target();

  // The cache key of `program` for `target`, 32 hex digits.
  std::string key(const Program& program, const Target& target);

  // Why `program` for `target` would hit or miss in the stores, and on a miss which inputs of the
  // key differ from the nearest entry of the same program (Note [Provenance]). Compiles nothing.
  LookupExplanation explain(const Program& program, const Target& target);

  // A tuned launch configuration (Note [Tuner] in runtime/tune/tuner.hpp): the one stored under
  // `entry.key` in the writable store, the read-only stores that serve `scope` (an op namespace)
  // or the remote tier; else, when `tune` is given, the one it returns, run under the key's lock
  // (this host's, and the fleet's with a remote tier: others wait for the result) and kept in the
  // writable store and the remote tier, described by `entry`'s op, bucket and device. Nothing
  // when `tune` is empty and no store holds the key. What `tune` throws passes through.
  std::optional<TunedConfig> tuned(const std::string& scope, TunedEntryInfo entry,
                                   const std::function<TunedConfig()>& tune = {});

  // The driver version that enters cache keys (see `RuntimeOptions::driver_version`).
  int driver_version();

  // This process's counters (memo and store tiers, compiles).
  CacheStats stats() const;

  // The persistent cache.
  Cache& cache() noexcept;

  const RuntimeOptions& options() const noexcept;

  // The remote tier (RuntimeOptions::remote_cache) as a URL without its password, or nothing.
  std::optional<std::string> remote_cache() const;
  // Copies every entry of the local store to the remote tier (kjit cache push) / every entry of
  // the remote tier into the local store (kjit cache pull). Return the number copied. Throw
  // `CacheError` without a remote tier or local store, or when the remote cannot be reached.
  std::uint64_t push_to_remote();
  std::uint64_t pull_from_remote();
  // Waits (at most the configured flush deadline, 2 s) for queued remote writes. The destructor
  // does this too; a runtime that lives until exit (an embedding's) calls it at exit.
  void flush_remote();

private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
};

// The NVRTC version, e.g. {13, 0}. Throws `NvrtcError` when no NVRTC is found.
std::pair<int, int> nvrtc_version();

// Which NVRTC kjit uses and why, or why none: found on first need by searching, in order,
// KJIT_NVRTC_LIBRARY, a libnvrtc already loaded in the process, the pip wheels
// (nvidia-cuda-nvrtc) in site-packages, $CONDA_PREFIX/lib, the loader's path, $CUDA_HOME,
// $CUDA_PATH and /usr/local/cuda. Never throws.
struct NvrtcInfo {
  bool found = false;
  std::string library; // the file loaded
  std::string how;     // why this one, e.g. "pip wheel beside kjit"
  int major = 0;
  int minor = 0;
  std::vector<std::string> include_dirs; // CUDA's headers from the same root, given to NVRTC
  std::vector<std::string> searched;     // candidates tried before, each with why not
  std::string error;                     // when not found: what was searched, what to install
};
NvrtcInfo nvrtc_info();

// The kjit version, e.g. "0.1.0".
std::string_view version() noexcept;

} // namespace kjit
