// The persistent cubin store: one SQLite file per cache directory.
//
// Note [Store]: WAL, synchronous=NORMAL, a busy timeout, and `BEGIN IMMEDIATE` write
// transactions. A row holds the binary, a checksum over key, kind, binary and lowered names
// (verified on every read: a mismatch is a miss that is recompiled and replaced), and what made
// it. Hit counts and last-used times are kept in memory and written with the next write or at
// `flush()`, so a hit costs no write. The store never throws on a cache problem: it warns once and
// behaves as a miss (reads) or keeps the result in memory only (writes).
#pragma once

#include <kjit/cache.hpp>

#include "cache/sqlite.hpp"
#include "runtime/util/file_lock.hpp"

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kjit::detail {

inline constexpr int k_store_schema_version = 1;
inline constexpr std::uint64_t k_default_max_size = 2ULL << 30;

struct StoredBinary {
  std::string kind;          // "cubin" or "ptx"
  std::string arch;          // "sm_90"
  std::string name;          // program name
  std::string nvrtc_version; // "13.0"
  std::int64_t driver_version = 0;
  std::string options; // canonical, space separated
  std::vector<std::pair<std::string, std::string>> lowered_names;
  std::string blob;
  double compile_ms = 0;
  std::string log;
  // Note [Provenance]: encoded origin and key fields; `get` fills the origin only.
  std::string origin;
  std::string fields;
};

// The default cache directory: `$KJIT_CACHE_DIR`, else `$XDG_CACHE_HOME/kjit`, else
// `$HOME/.cache/kjit`.
std::filesystem::path default_cache_dir();

// `$XDG_CACHE_HOME/kjit`, else `$HOME/.cache/kjit` (the default without `KJIT_CACHE_DIR`).
std::filesystem::path per_user_cache_dir();

// The database file in `dir`.
std::filesystem::path store_file(const std::filesystem::path& dir);

class SqliteStore {
public:
  enum class Lookup { hit, miss, corrupt };

  // Opens (creating) the store in `dir`. Returns nullptr, after one warning, when no store can be
  // used there: compiling then goes on without one.
  // With `read_only`, the store is never written even where it could be.
  static std::unique_ptr<SqliteStore> open(const std::filesystem::path& dir, std::uint64_t max_size,
                                           bool read_only = false);
  // Opens the store file `file` read-only (a baked store); nullptr after a warning when it cannot.
  // `why`: where the reason a store cannot be used goes (else it is logged as a warning).
  static std::unique_ptr<SqliteStore> open_file_read_only(const std::filesystem::path& file,
                                                          std::string* why = nullptr);
  ~SqliteStore();
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  // Looks `key` up. A hit fills `out` and counts a store hit. A miss or a corrupt row (checksum
  // mismatch) is not counted here: the caller counts it once (`count_miss()`, `count_corrupt()`)
  // after looking again under the key's lock, since another process may store the key meanwhile.
  // Never throws.
  Lookup get(const std::string& key, StoredBinary& out);

  // Stores `value` under `key` (replacing a corrupt row when `replace`) and counts the compile
  // (unless `count_compile` is false: an entry from the remote tier). Evicts least recently used
  // rows above the size limit. Never throws.
  void put(const std::string& key, const StoredBinary& value, bool replace,
           bool count_compile = true);

  // The tuned configuration stored under `key` (Note [Tuner]), or nothing (also for a damaged
  // row); stores it (replacing one). Never throw.
  std::optional<TunedEntryInfo> get_tuned(const std::string& key) const;
  void put_tuned(const TunedEntryInfo& entry) noexcept;
  std::vector<TunedEntryInfo> tuned_entries() const;                // throws CacheError
  std::uint64_t remove_tuned(const std::vector<std::string>& keys); // throws CacheError

  // Records (with the next write) the origin and key fields of an entry found by a lookup whose
  // program has another origin than the one stored (Note [Provenance]). Never throws.
  void note_provenance(const std::string& key, std::string origin, std::string fields) noexcept;

  void count_miss() noexcept;
  // Counts (and reports, once) a row of `key` that failed its checksum.
  void count_corrupt(const std::string& key) noexcept;
  void count_memory(std::uint64_t hits, std::uint64_t misses) noexcept;
  // Adds a process's remote-tier counters to the persistent statistics.
  void count_remote(const RemoteStats& remote) noexcept;

  // Serializes compiles of `id` across processes (and across stores of this process): blocks
  // until held. An empty guard when the store cannot lock (read-only).
  LockGuard lock_key(std::uint64_t id) const;

  // A value of the meta table (kjit's bookkeeping, e.g. Note [NVRTC identity]); nothing when
  // absent or unreadable. `set_meta` writes one (not on a read-only store). Never throw.
  std::optional<std::string> meta(const std::string& name) const noexcept;
  void set_meta(const std::string& name, const std::string& value) noexcept;

  // Writes pending counters and hit metadata. Never throws.
  void flush() noexcept;

  CacheStats stats() const;
  // Cache management (kjit cache ...); these throw CacheError.
  VerifyReport verify(bool fix);
  std::uint64_t prune(std::optional<std::uint64_t> max_size,
                      std::optional<std::int64_t> older_than_seconds);
  void clear();
  std::uint64_t export_to(const std::filesystem::path& file, const std::vector<std::string>& archs);
  std::uint64_t import_from(const std::filesystem::path& file);
  std::vector<CacheEntryInfo> entries() const;
  // Removes the entries of `keys` (absent ones are skipped); returns how many were removed.
  std::uint64_t remove(const std::vector<std::string>& keys);
  bool read_only() const noexcept { return m_read_only; }
  const std::filesystem::path& path() const noexcept { return m_path; }

private:
  SqliteStore(std::filesystem::path path, Database db, bool read_only, std::uint64_t max_size);
  void prepare();
  bool ready() const; // WAL mode and the schema are in place
  template <class F>
  void with_busy_retry(F&& work);
  void write_pending();                         // inside a write transaction; m_mutex held
  std::uint64_t evict(const std::string& keep); // returns the number removed
  bool remove_row(const std::string& key);      // in a write transaction; m_mutex held
  void write_pending_transaction();
  void warn_write_failure(const SqliteFailure& failure);
  void require_writable(const char* what) const;
  [[noreturn]] void fail(const char* what, const SqliteFailure& failure) const;

  std::filesystem::path m_path;
  Database m_db;
  bool m_read_only;
  bool m_has_provenance = false; // the store has the provenance table (Note [Provenance])
  bool m_has_tuning = false;     // and the tuning table (Note [Tuner])
  std::uint64_t m_max_size;
  std::unique_ptr<LockFile> m_locks;

  mutable std::mutex m_mutex; // guards everything below and every use of m_db
  Statement m_get;
  bool m_writes_failed = false;
  bool m_warned_read_only = false;
  std::string m_moved_aside; // the damaged file open() moved aside, if it did
  CacheStats m_pending;      // counter deltas not yet written
  std::map<std::string, std::pair<std::uint64_t, std::int64_t>> m_pending_hits;    // hits, last ms
  std::map<std::string, std::pair<std::string, std::string>> m_pending_provenance; // origin, fields
};

} // namespace kjit::detail
