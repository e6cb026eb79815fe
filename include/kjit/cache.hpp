// The persistent kernel cache: statistics and entries.
//
// **Example**
//
//   kjit::Runtime runtime;
//   auto stats = runtime.cache().stats();
//   std::cout << stats.store_hits << " hits, " << stats.compiles << " compiles\n";
//   for (const auto& e : runtime.cache().entries()) {
//     std::cout << e.name << ' ' << e.arch << ' ' << e.size << '\n';
//   }
//
// The cache is one SQLite file in the cache directory: `$KJIT_CACHE_DIR`, else
// `$XDG_CACHE_HOME/kjit`, else `~/.cache/kjit`. See ARCHITECTURE.md, "Cache".
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace kjit {

namespace detail {
class SqliteStore;
} // namespace detail

// Counters, either of one `Runtime` (this process) or of a store (all processes, persistent).
struct CacheStats {
  std::uint64_t memory_hits = 0;   // kernels found in the process's memo
  std::uint64_t memory_misses = 0; // kernels not in the memo: looked up in the store
  std::uint64_t store_hits = 0;    // found in the store with a valid checksum
  std::uint64_t store_misses = 0;  // not in the store, or corrupt
  std::uint64_t compiles = 0;      // NVRTC compiles that succeeded
  double compile_ms = 0;           // time spent in them
  std::uint64_t corrupt = 0;       // entries whose checksum did not match (then recompiled)
  std::uint64_t evictions = 0;     // entries removed to keep the store under its size limit
  std::uint64_t entries = 0;       // entries in the store now (store statistics only)
  std::uint64_t size_bytes = 0;    // bytes of binaries in the store now (store statistics only)
};

// One entry of the store, without its binary.
struct CacheEntryInfo {
  std::string key;                  // 32 hex digits
  std::string name;                 // program name, e.g. "img2gray.cu"
  std::string kind;                 // "cubin" or "ptx"
  std::string arch;                 // "sm_90" or "compute_90"
  std::string nvrtc_version;        // "13.0"
  int driver_version = 0;           // e.g. 13000
  std::string options;              // canonical options, space separated
  std::vector<std::string> kernels; // lowered names stored with the binary
  std::uint64_t size = 0;           // bytes
  double compile_ms = 0;
  std::int64_t created = 0;   // unix seconds
  std::int64_t last_used = 0; // unix seconds
  std::uint64_t hits = 0;
};

// A view of a runtime's store. Owned by its `Runtime`.
class Cache {
public:
  explicit Cache(std::unique_ptr<detail::SqliteStore> store);
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // Whether a store is in use (false with `KJIT_DISABLE_CACHE=1`, or when none could be opened).
  bool enabled() const noexcept;
  // Whether the store is read-only (compiled kernels then stay in memory).
  bool read_only() const noexcept;
  // The SQLite file, or an empty path when disabled.
  std::filesystem::path path() const;
  // The persistent counters of the store (all processes) with its size; zeros when disabled.
  CacheStats stats() const;
  // Every entry, most recently used first.
  std::vector<CacheEntryInfo> entries() const;
  // Writes pending hit counts and last-used times now (also done when the runtime goes away).
  void flush();

  // Internal: the store, or nullptr.
  detail::SqliteStore* store() const noexcept { return m_store.get(); }

private:
  std::unique_ptr<detail::SqliteStore> m_store;
};

} // namespace kjit
