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
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kjit {

namespace detail {
class SqliteStore;
} // namespace detail

// Counters, either of one `Runtime` (this process) or of a store (all processes, persistent).
// The fleet tier (Note [Remote tier] in cache/remote/remote_store.hpp), counted per process and
// kept in the local store's statistics.
struct RemoteStats {
  std::uint64_t hits = 0;        // entries found on the remote (and written to the local store)
  std::uint64_t misses = 0;      // not there
  std::uint64_t errors = 0;      // failed operations (refused, connection lost, out of memory)
  std::uint64_t timeouts = 0;    // operations that ran out of time
  std::uint64_t bad_entries = 0; // truncated, wrong key, bad checksum or signature: deleted
  std::uint64_t writes = 0;      // entries written
  std::uint64_t dropped = 0;     // writes dropped (queue full, server down at exit)
  std::uint64_t lock_waits = 0;  // lookups that waited for another host's compile
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  double saved_ms = 0; // compile time of the entries found there
};

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
  RemoteStats remote;
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
  std::vector<std::string> kernels; // the name expressions compiled (templates), if any
  std::uint64_t size = 0;           // bytes
  double compile_ms = 0;
  std::int64_t created = 0;   // unix seconds
  std::int64_t last_used = 0; // unix seconds
  std::uint64_t hits = 0;
  std::string store; // the read-only store file that holds it; empty: the writable store
  // Where it comes from (Note [Provenance] in cache/provenance.hpp); empty for a program made by
  // hand or an entry of an older kjit.
  std::string package;
  std::string package_version;
  std::string kernel;           // the kernel's name in the package's manifest
  std::vector<std::string> ops; // the ops that launch it
  std::string specialization;   // the entry compiled, e.g. "scale<float>"
  std::string key_fields;       // what entered its key, one "field<TAB>value" per line
};

// A tuned launch configuration (Note [Tuner] in runtime/tune/tuner.hpp): the fastest candidate
// of one op, bucket and device, with every candidate's time.
struct TuneTiming {
  std::vector<std::int64_t> values;
  double ms = 0;     // median; infinity for a candidate that failed or was not reached
  std::string error; // why it failed
};
struct TunedConfig {
  std::vector<std::string> names;  // the tune parameters
  std::vector<std::int64_t> best;  // their tuned values
  std::vector<TuneTiming> timings; // every candidate timed, in order
  std::size_t pruned = 0;          // candidates tune_valid removed
  bool budget_exhausted = false;   // some candidates were not timed
  double seconds = 0;              // the tuning's cost
};
struct TunedEntryInfo {
  std::string key;
  std::string op;     // "norm::rms_norm"
  std::string bucket; // the bucket and dtypes, as text
  std::string device; // "NVIDIA H200 (sm_90, 132 SMs)"
  TunedConfig config;
  std::int64_t created = 0; // unix seconds
  std::string store;        // the read-only store that holds it; empty: the writable store
};

// Which entries a listing or a removal is about; an empty field matches every entry.
struct EntryFilter {
  std::string package;
  std::string version; // the package's version
  std::string op;      // an op that launches the entry's kernel
  std::string arch;    // "sm_90"
  std::string key;     // a prefix of the key
  bool empty() const noexcept {
    return package.empty() && version.empty() && op.empty() && arch.empty() && key.empty();
  }
  bool matches(const CacheEntryInfo& entry) const;
  // A tuned configuration matches by its op's namespace and name, the arch in its device, and
  // its key; never with a version (it is keyed by the package's sources, not its version).
  bool matches(const TunedEntryInfo& entry) const;
};

// Why a lookup of a program hits or misses (`Runtime::explain`, `kjit cache why`).
struct LookupExplanation {
  std::string key;   // the lookup's key
  bool hit = false;  // an entry of that key is in a store that serves the program
  std::string store; // the store file that holds it (on a hit) or the nearest entry (on a miss)
  std::size_t candidates = 0; // on a miss: entries of a program of that name in the stores
  std::string nearest;        // on a miss: the key of the one that differs least, if any
  std::vector<std::string> differences; // what differs from it, one sentence each
  bool recorded = true; // false when the nearest entry's sources were not recorded (older kjit)
};

// What `Cache::verify` found.
struct VerifyReport {
  std::uint64_t checked = 0;            // entries read
  std::vector<std::string> bad_entries; // keys whose checksum did not match
  std::vector<std::string> integrity;   // problems PRAGMA integrity_check reported ("ok" = none)
  std::uint64_t removed = 0;            // bad entries removed (with `fix`)
  std::vector<std::string> moved_aside; // damaged store files this process moved aside on open
  bool ok() const noexcept {
    return bad_entries.empty() && integrity.empty() && moved_aside.empty();
  }
};

// Parses a size such as "500M", "2G", "1.5GiB" or "4096" (bytes). Nullopt for anything else,
// negative sizes and sizes of 2^63 bytes or more.
std::optional<std::uint64_t> parse_size(std::string_view text);

// A view of a runtime's store (the writable one, `KJIT_CACHE_DIR`) and of the read-only stores
// searched after it (`KJIT_CACHE_READONLY`). Owned by its `Runtime`.
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
  // Every entry of the writable store, most recently used first.
  std::vector<CacheEntryInfo> entries() const;
  // Every entry of the read-only stores, store by store in search order (`store` set).
  std::vector<CacheEntryInfo> read_only_entries() const;
  // The tuned configurations of the writable store, then of the read-only ones (`store` set).
  std::vector<TunedEntryInfo> tuned_entries() const;
  // Writes pending hit counts and last-used times now (also done when the runtime goes away).
  void flush();

  // Checks every entry's checksum and SQLite's integrity; with `fix`, removes bad entries.
  // Throws `CacheError` when the store cannot be read (or written, with `fix`).
  VerifyReport verify(bool fix);
  // Removes least recently used entries until the store is at most `max_size` bytes, and entries
  // unused for `older_than_seconds` (when given). Returns the number removed.
  std::uint64_t prune(std::optional<std::uint64_t> max_size,
                      std::optional<std::int64_t> older_than_seconds);
  // Removes every entry and resets the statistics.
  void clear();
  // Removes the writable store's entries that `filter` matches; returns how many. Throws
  // `CacheError` for an empty filter (that is `clear`) or a store that cannot be written.
  std::uint64_t remove(const EntryFilter& filter);
  // Writes the entries for `archs` (all when empty; names as in `CacheEntryInfo::arch`) into a
  // new standalone store file `file` (to bake into an image). Returns the number written.
  std::uint64_t export_to(const std::filesystem::path& file, const std::vector<std::string>& archs);
  // Merges the valid entries of the store file `file` (checksums verified; present keys kept).
  // Returns the number added.
  std::uint64_t import_from(const std::filesystem::path& file);

  // The read-only stores searched after this one, in order.
  std::vector<std::filesystem::path> read_only_paths() const;
  // Adds a read-only store (a store file, or a folder holding one) to search after the others;
  // returns false (after a warning) when it cannot be opened or is not trusted: it must belong to
  // this user or to root and be writable by neither its group nor others, nor may its folder be.
  // With a `scope` (a package's op namespace), the store serves only programs of that scope
  // (`CompileOptions::scope`): a package's shipped store serves that package alone. Adding a
  // store again adds the scope; a store added without one serves every program. Thread-safe.
  bool add_read_only_path(const std::filesystem::path& path, const std::string& scope = {});

  // Internal: the writable store, or nullptr; the read-only ones (a snapshot).
  struct ReadOnlyStore {
    std::shared_ptr<detail::SqliteStore> store;
    std::vector<std::string> scopes; // empty: serves every program
    bool serves(const std::string& scope) const;
  };
  detail::SqliteStore* store() const noexcept { return m_store.get(); }
  std::vector<ReadOnlyStore> read_only_stores() const;

private:
  detail::SqliteStore& require() const;
  std::unique_ptr<detail::SqliteStore> m_store;
  mutable std::mutex m_read_only_mutex; // guards m_read_only
  std::vector<ReadOnlyStore> m_read_only;
};

} // namespace kjit
