// The SQLite store. Over 600 lines: opening (with recovery), reads, writes, statistics and the
// management commands share its prepared statements and its one mutex.
#include "cache/sqlite_store.hpp"

#include <kjit/error.hpp>

#include "runtime/logging.hpp"
#include "runtime/util/env.hpp"
#include "runtime/util/file.hpp"
#include "runtime/util/hash.hpp"

#include <fmt/format.h>

#include <chrono>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace kjit::detail {
namespace {

constexpr int k_busy_timeout_ms = 10000;
// Lock id of the store itself (recovery of a broken file); key locks never use it (see
// lock_key).
constexpr std::uint64_t k_store_lock_id = 0;

constexpr const char* k_schema = R"sql(
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries(
  key TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  kind TEXT NOT NULL,
  arch TEXT NOT NULL,
  nvrtc_version TEXT NOT NULL,
  driver_version INTEGER NOT NULL,
  options TEXT NOT NULL,
  lowered_names TEXT NOT NULL,
  blob BLOB NOT NULL,
  checksum INTEGER NOT NULL,
  size INTEGER NOT NULL,
  compile_ms REAL NOT NULL,
  created_ms INTEGER NOT NULL,
  last_used_ms INTEGER NOT NULL,
  hits INTEGER NOT NULL DEFAULT 0,
  compile_log TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS entries_by_last_used ON entries(last_used_ms);
CREATE TABLE IF NOT EXISTS stats(name TEXT PRIMARY KEY, value REAL NOT NULL);
INSERT OR IGNORE INTO meta(name, value) VALUES('schema_version', '1');
)sql";

// Times are stored in milliseconds, so least-recently-used order holds within a second.
std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

bool is_broken_file(int code) {
  const int primary = code & 0xff;
  return primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT;
}

std::string encode_lowered(const std::vector<std::pair<std::string, std::string>>& names) {
  std::string text;
  for (const auto& [expression, lowered] : names) {
    text += expression;
    text += '\t';
    text += lowered;
    text += '\n';
  }
  return text;
}

std::vector<std::pair<std::string, std::string>> decode_lowered(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> names;
  while (!text.empty()) {
    const auto end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    const auto tab = line.find('\t');
    if (tab != std::string_view::npos) {
      names.emplace_back(std::string(line.substr(0, tab)), std::string(line.substr(tab + 1)));
    }
    if (end == std::string_view::npos) {
      break;
    }
    text.remove_prefix(end + 1);
  }
  return names;
}

std::int64_t checksum(std::string_view key, std::string_view kind, std::string_view lowered,
                      std::string_view blob) {
  Hasher hasher;
  hasher.field("key", key).field("kind", kind).field("lowered", lowered).field("blob", blob);
  return static_cast<std::int64_t>(hasher.digest()[1]);
}

Database open_database(const std::filesystem::path& file, bool writable, bool immutable) {
  sqlite3* raw = nullptr;
  int rc = SQLITE_OK;
  if (writable) {
    rc = sqlite3_open_v2(file.c_str(), &raw,
                         SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  } else {
    // A store baked into an image: no -wal/-shm can be made beside it, so it is opened immutable
    // when a plain read-only open cannot read it.
    const std::string uri =
      fmt::format("file:{}?mode=ro{}", file.string(), immutable ? "&immutable=1" : "");
    rc = sqlite3_open_v2(uri.c_str(), &raw,
                         SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, nullptr);
  }
  Database db(raw);
  if (rc != SQLITE_OK) {
    throw SqliteFailure{rc, fmt::format("cannot open '{}': {}", file.string(),
                                        raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc))};
  }
  sqlite3_busy_timeout(db.get(), k_busy_timeout_ms);
  return db;
}

// Reads the schema version; throws SqliteFailure when the file is not a store of this version.
void check_schema(const Database& db, const std::filesystem::path& file) {
  Statement version(db, "SELECT value FROM meta WHERE name = 'schema_version'");
  if (!version.step()) {
    throw SqliteFailure{SQLITE_CORRUPT, "the store has no schema version"};
  }
  const std::string found = version.column_text(0);
  if (found != std::to_string(k_store_schema_version)) {
    throw SqliteFailure{SQLITE_MISMATCH,
                        fmt::format("'{}' has store schema version {}, this kjit reads version {}",
                                    file.string(), found, k_store_schema_version)};
  }
}

std::filesystem::path move_aside(const std::filesystem::path& file, const std::string& why) {
  const auto aside = std::filesystem::path(
    fmt::format("{}.broken-{}-{}", file.string(), now_ms() / 1000, ::getpid()));
  std::error_code ec;
  std::filesystem::rename(file, aside, ec);
  for (const char* suffix : {"-wal", "-shm"}) {
    std::filesystem::remove(file.string() + suffix, ec);
  }
  log(LogLevel::warning,
      "kernel cache '{}' is not a valid database ({}); moved it to '{}' and "
      "started a new one",
      file.string(), why, aside.string());
  return aside;
}

} // namespace

std::filesystem::path default_cache_dir() {
  if (auto dir = getenv_nonempty("KJIT_CACHE_DIR")) {
    return *dir;
  }
  return per_user_cache_dir();
}

std::filesystem::path per_user_cache_dir() {
  if (auto xdg = getenv_nonempty("XDG_CACHE_HOME")) {
    return std::filesystem::path(*xdg) / "kjit";
  }
  if (auto home = getenv_nonempty("HOME")) {
    return std::filesystem::path(*home) / ".cache" / "kjit";
  }
  return std::filesystem::temp_directory_path() / fmt::format("kjit-{}", ::getuid());
}

std::filesystem::path store_file(const std::filesystem::path& dir) {
  return dir / fmt::format("kjit-v{}.sqlite", k_store_schema_version);
}

std::unique_ptr<SqliteStore> SqliteStore::open(const std::filesystem::path& dir,
                                               std::uint64_t max_size, bool read_only) {
  if (read_only) {
    std::error_code ec;
    if (!std::filesystem::exists(store_file(dir), ec)) {
      log(LogLevel::warning,
          "read-only kernel cache '{}' does not exist; compiling without a "
          "kernel cache",
          store_file(dir).string());
      return nullptr;
    }
  } else if (auto error = create_private_dirs(dir); !error.empty()) {
    log(LogLevel::warning, "{}; compiling without a kernel cache", error);
    return nullptr;
  }
  const auto file = store_file(dir);
  std::error_code ec;
  const bool exists = std::filesystem::exists(file, ec);
  const bool writable =
    !read_only && dir_writable(dir) && (!exists || ::access(file.c_str(), W_OK) == 0);
  if (!writable && !exists) {
    log(LogLevel::warning,
        "cannot create a kernel cache in '{}': the directory is not writable; compiling without "
        "a kernel cache",
        dir.string());
    return nullptr;
  }
  bool recovered = false;
  std::string moved_to;
  for (int attempt = 0; attempt < 3; ++attempt) {
    try {
      auto store = std::unique_ptr<SqliteStore>(new SqliteStore(
        file, open_database(file, writable, !writable && attempt > 0), !writable, max_size));
      store->prepare();
      store->m_moved_aside = moved_to;
      return store;
    } catch (const SqliteFailure& failure) {
      if (!writable && attempt == 0) {
        continue; // retry immutable
      }
      if (writable && !recovered && is_broken_file(failure.code)) {
        // Another process may be replacing the file too: check again under the store lock.
        LockFile locks(dir / fmt::format("kjit-v{}.locks", k_store_schema_version));
        LockGuard guard = locks.lock(k_store_lock_id);
        try {
          Database db = open_database(file, true, false);
          check_schema(db, file);
        } catch (const SqliteFailure& again) {
          if (is_broken_file(again.code)) {
            moved_to = move_aside(file, failure.message).string();
          }
        }
        recovered = true;
        continue;
      }
      log(LogLevel::warning, "cannot use kernel cache '{}': {}; compiling without a kernel cache",
          file.string(), failure.message);
      return nullptr;
    }
  }
  log(LogLevel::warning, "cannot use kernel cache '{}'; compiling without a kernel cache",
      file.string());
  return nullptr;
}

std::unique_ptr<SqliteStore> SqliteStore::open_file_read_only(const std::filesystem::path& file,
                                                              std::string* why) {
  const auto refuse = [&](std::string reason, std::string_view warning) {
    if (why != nullptr) {
      *why = std::move(reason);
    } else {
      log(LogLevel::warning, "{}", warning);
    }
    return nullptr;
  };
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    return refuse(
      "it does not exist",
      fmt::format("read-only kernel cache '{}' does not exist; skipping it", file.string()));
  }
  // The writable store's rule, except that baked stores may belong to root: a store (or its
  // folder) that another user could rewrite is a store someone else could plant binaries in.
  for (const auto& path : {file, std::filesystem::absolute(file, ec).parent_path()}) {
    if (const std::string untrusted = untrusted_reason(path, true); !untrusted.empty()) {
      return refuse(untrusted, fmt::format("not using read-only kernel cache '{}': {}",
                                           file.string(), untrusted));
    }
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      auto store = std::unique_ptr<SqliteStore>(
        new SqliteStore(file, open_database(file, false, attempt > 0), true, 0));
      store->prepare();
      return store;
    } catch (const SqliteFailure& failure) {
      if (attempt == 1) {
        return refuse(failure.message,
                      fmt::format("cannot use read-only kernel cache '{}': {}; skipping it",
                                  file.string(), failure.message));
      }
    }
  }
  return nullptr;
}

SqliteStore::SqliteStore(std::filesystem::path path, Database db, bool read_only,
                         std::uint64_t max_size)
  : m_path(std::move(path)), m_db(std::move(db)), m_read_only(read_only), m_max_size(max_size) {}

SqliteStore::~SqliteStore() {
  flush();
}

void SqliteStore::prepare() {
  if (!m_read_only) {
    m_locks = std::make_unique<LockFile>(m_path.parent_path() /
                                         fmt::format("kjit-v{}.locks", k_store_schema_version));
    m_db.exec("PRAGMA synchronous=NORMAL");
    // An existing store needs no write to open; a new one is set up under the store lock, so
    // processes starting together do not race on the switch to WAL.
    if (!ready()) {
      LockGuard guard = m_locks->lock(k_store_lock_id);
      with_busy_retry([&] {
        if (ready()) {
          return;
        }
        m_db.exec("PRAGMA journal_mode=WAL");
        m_db.exec("BEGIN IMMEDIATE");
        try {
          m_db.exec(k_schema);
          m_db.exec("COMMIT");
        } catch (...) {
          sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
          throw;
        }
      });
    }
  }
  check_schema(m_db, m_path);
  m_get = Statement(m_db, "SELECT kind, arch, name, nvrtc_version, driver_version, options, "
                          "lowered_names, blob, checksum, compile_ms, compile_log "
                          "FROM entries WHERE key = ?1");
}

bool SqliteStore::ready() const {
  Statement mode(m_db, "PRAGMA journal_mode");
  if (!mode.step() || mode.column_text(0) != "wal") {
    return false;
  }
  mode.reset();
  sqlite3_stmt* raw = nullptr;
  // "no such table" means a new file; a broken file throws (and is recovered by open()).
  const int rc = sqlite3_prepare_v2(
    m_db.get(), "SELECT value FROM meta WHERE name = 'schema_version'", -1, &raw, nullptr);
  Statement version;
  if (rc == SQLITE_OK) {
    version = Statement(raw);
  } else if ((rc & 0xff) == SQLITE_ERROR) {
    return false;
  } else {
    throw SqliteFailure{rc, sqlite3_errmsg(m_db.get())};
  }
  return version.step();
}

template <class F>
void SqliteStore::with_busy_retry(F&& work) {
  // SQLite answers SQLITE_BUSY at once (without the busy handler) where waiting could deadlock,
  // e.g. when changing the journal mode while another connection reads.
  for (int attempt = 0;; ++attempt) {
    try {
      work();
      return;
    } catch (const SqliteFailure& failure) {
      const int primary = failure.code & 0xff;
      if ((primary != SQLITE_BUSY && primary != SQLITE_LOCKED) || attempt >= 500) {
        throw;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

SqliteStore::Lookup SqliteStore::get(const std::string& key, StoredBinary& out) {
  std::lock_guard lock(m_mutex);
  try {
    m_get.bind(1, key);
    if (!m_get.step()) {
      m_get.reset();
      return Lookup::miss;
    }
    out.kind = m_get.column_text(0);
    out.arch = m_get.column_text(1);
    out.name = m_get.column_text(2);
    out.nvrtc_version = m_get.column_text(3);
    out.driver_version = m_get.column_int(4);
    out.options = m_get.column_text(5);
    const std::string lowered = m_get.column_text(6);
    out.blob = m_get.column_blob(7);
    const std::int64_t stored_checksum = m_get.column_int(8);
    out.compile_ms = m_get.column_double(9);
    out.log = m_get.column_text(10);
    m_get.reset();
    if (checksum(key, out.kind, lowered, out.blob) != stored_checksum) {
      return Lookup::corrupt;
    }
    out.lowered_names = decode_lowered(lowered);
    ++m_pending.store_hits;
    auto& [hits, last_used] = m_pending_hits[key];
    ++hits;
    last_used = now_ms();
    return Lookup::hit;
  } catch (const SqliteFailure& failure) {
    m_get.reset();
    log(LogLevel::warning, "cannot read kernel cache '{}': {}; compiling instead", m_path.string(),
        failure.message);
    return Lookup::miss;
  }
}

void SqliteStore::put(const std::string& key, const StoredBinary& value, bool replace,
                      bool count_compile) {
  std::lock_guard lock(m_mutex);
  if (count_compile) {
    ++m_pending.compiles;
    m_pending.compile_ms += value.compile_ms;
  }
  if (m_read_only) {
    if (!m_warned_read_only) {
      m_warned_read_only = true;
      log(LogLevel::warning,
          "kernel cache '{}' is read-only: kernels compiled now stay in this process's memory",
          m_path.string());
    }
    return;
  }
  if (m_writes_failed) {
    return;
  }
  try {
    m_db.exec("BEGIN IMMEDIATE");
    const std::string lowered = encode_lowered(value.lowered_names);
    const std::int64_t now = now_ms();
    Statement insert(m_db, replace ? "INSERT OR REPLACE INTO entries VALUES"
                                     "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, "
                                     "?13, 0, ?14)"
                                   : "INSERT OR IGNORE INTO entries VALUES"
                                     "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, "
                                     "?13, 0, ?14)");
    insert.bind(1, key)
      .bind(2, value.name)
      .bind(3, value.kind)
      .bind(4, value.arch)
      .bind(5, value.nvrtc_version)
      .bind(6, value.driver_version)
      .bind(7, value.options)
      .bind(8, lowered)
      .bind_blob(9, value.blob)
      .bind(10, checksum(key, value.kind, lowered, value.blob))
      .bind(11, static_cast<std::int64_t>(value.blob.size()))
      .bind(12, value.compile_ms)
      .bind(13, now)
      .bind(14, value.log);
    insert.run();
    write_pending();
    evict(key);
    m_db.exec("COMMIT");
    m_pending = {};
    m_pending_hits.clear();
  } catch (const SqliteFailure& failure) {
    sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    warn_write_failure(failure);
  }
}

void SqliteStore::count_corrupt(const std::string& key) noexcept {
  std::lock_guard lock(m_mutex);
  ++m_pending.corrupt;
  log(LogLevel::warning, "kernel cache entry {} in '{}' fails its checksum; recompiling it", key,
      m_path.string());
}

void SqliteStore::count_miss() noexcept {
  std::lock_guard lock(m_mutex);
  ++m_pending.store_misses;
}

void SqliteStore::count_memory(std::uint64_t hits, std::uint64_t misses) noexcept {
  std::lock_guard lock(m_mutex);
  m_pending.memory_hits += hits;
  m_pending.memory_misses += misses;
}

namespace {

// The remote tier's counters, by their name in the stats table.
constexpr std::pair<const char*, std::uint64_t RemoteStats::*> k_remote_counters[] = {
  {"remote_hits", &RemoteStats::hits},
  {"remote_misses", &RemoteStats::misses},
  {"remote_errors", &RemoteStats::errors},
  {"remote_timeouts", &RemoteStats::timeouts},
  {"remote_bad_entries", &RemoteStats::bad_entries},
  {"remote_writes", &RemoteStats::writes},
  {"remote_dropped", &RemoteStats::dropped},
  {"remote_lock_waits", &RemoteStats::lock_waits},
  {"remote_bytes_read", &RemoteStats::bytes_read},
  {"remote_bytes_written", &RemoteStats::bytes_written},
};

void add_remote(RemoteStats& to, const RemoteStats& from) {
  for (const auto& [name, member] : k_remote_counters) {
    to.*member += from.*member;
  }
  to.saved_ms += from.saved_ms;
}

} // namespace

std::optional<std::string> SqliteStore::meta(const std::string& name) const noexcept {
  std::lock_guard lock(m_mutex);
  try {
    Statement get(m_db, "SELECT value FROM meta WHERE name = ?1");
    get.bind(1, std::string_view(name));
    if (get.step()) {
      return get.column_text(0);
    }
  } catch (const SqliteFailure&) {
  }
  return std::nullopt;
}

void SqliteStore::set_meta(const std::string& name, const std::string& value) noexcept {
  if (m_read_only) {
    return;
  }
  std::lock_guard lock(m_mutex);
  try {
    Statement put(m_db, "INSERT INTO meta(name, value) VALUES(?1, ?2) "
                        "ON CONFLICT(name) DO UPDATE SET value = excluded.value");
    put.bind(1, std::string_view(name)).bind(2, std::string_view(value));
    put.run();
  } catch (const SqliteFailure&) {
    // Bookkeeping only: the next process loads NVRTC to learn its version again.
  }
}

void SqliteStore::count_remote(const RemoteStats& remote) noexcept {
  std::lock_guard lock(m_mutex);
  add_remote(m_pending.remote, remote);
}

LockGuard SqliteStore::lock_key(std::uint64_t id) const {
  if (!m_locks) {
    return {};
  }
  return m_locks->lock(id == k_store_lock_id ? 1 : id);
}

void SqliteStore::flush() noexcept {
  std::lock_guard lock(m_mutex);
  if (m_read_only || m_writes_failed) {
    return;
  }
  const CacheStats& p = m_pending;
  if (p.memory_hits == 0 && p.memory_misses == 0 && p.store_hits == 0 && p.store_misses == 0 &&
      p.compiles == 0 && p.corrupt == 0 && m_pending_hits.empty()) {
    return;
  }
  try {
    m_db.exec("BEGIN IMMEDIATE");
    write_pending();
    m_db.exec("COMMIT");
    m_pending = {};
    m_pending_hits.clear();
  } catch (const SqliteFailure& failure) {
    sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    warn_write_failure(failure);
  }
}

void SqliteStore::write_pending() {
  Statement add(m_db, "INSERT INTO stats(name, value) VALUES(?1, ?2) "
                      "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value");
  auto add_counter = [&](const char* name, double delta) {
    if (delta != 0) {
      add.bind(1, std::string_view(name)).bind(2, delta);
      add.run();
    }
  };
  add_counter("memory_hits", static_cast<double>(m_pending.memory_hits));
  add_counter("memory_misses", static_cast<double>(m_pending.memory_misses));
  add_counter("store_hits", static_cast<double>(m_pending.store_hits));
  add_counter("store_misses", static_cast<double>(m_pending.store_misses));
  add_counter("compiles", static_cast<double>(m_pending.compiles));
  add_counter("compile_ms", m_pending.compile_ms);
  add_counter("corrupt", static_cast<double>(m_pending.corrupt));
  add_counter("evictions", static_cast<double>(m_pending.evictions));
  for (const auto& [name, member] : k_remote_counters) {
    add_counter(name, static_cast<double>(m_pending.remote.*member));
  }
  add_counter("remote_saved_ms", m_pending.remote.saved_ms);
  Statement touch(m_db, "UPDATE entries SET hits = hits + ?1, last_used_ms = MAX(last_used_ms, ?2) "
                        "WHERE key = ?3");
  for (const auto& [key, usage] : m_pending_hits) {
    touch.bind(1, static_cast<std::int64_t>(usage.first)).bind(2, usage.second).bind(3, key);
    touch.run();
  }
}

std::uint64_t SqliteStore::evict(const std::string& keep) {
  Statement total_query(m_db, "SELECT COALESCE(SUM(size), 0) FROM entries");
  total_query.step();
  auto total = static_cast<std::uint64_t>(total_query.column_int(0));
  if (total <= m_max_size) {
    return 0;
  }
  Statement oldest(m_db, "SELECT key, size FROM entries WHERE key != ?1 "
                         "ORDER BY last_used_ms ASC, created_ms ASC");
  oldest.bind(1, keep);
  std::vector<std::pair<std::string, std::uint64_t>> victims;
  while (total > m_max_size && oldest.step()) {
    const auto size = static_cast<std::uint64_t>(oldest.column_int(1));
    victims.emplace_back(oldest.column_text(0), size);
    total -= std::min(total, size);
  }
  oldest.reset();
  Statement remove(m_db, "DELETE FROM entries WHERE key = ?1");
  for (const auto& [key, size] : victims) {
    remove.bind(1, key);
    remove.run();
    m_pending_hits.erase(key);
  }
  Statement add(m_db, "INSERT INTO stats(name, value) VALUES('evictions', ?1) "
                      "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value");
  add.bind(1, static_cast<double>(victims.size()));
  add.run();
  log(LogLevel::info, "evicted {} kernel cache entries to stay under {}", victims.size(),
      format_size(m_max_size));
  return victims.size();
}

void SqliteStore::warn_write_failure(const SqliteFailure& failure) {
  if ((failure.code & 0xff) == SQLITE_BUSY || (failure.code & 0xff) == SQLITE_LOCKED) {
    log(LogLevel::warning, "kernel cache '{}' stayed busy: {}; this result is not stored",
        m_path.string(), failure.message);
    return;
  }
  m_writes_failed = true;
  log(LogLevel::warning,
      "cannot write to kernel cache '{}': {}; kernels compiled from now on stay in this process's "
      "memory",
      m_path.string(), failure.message);
}

CacheStats SqliteStore::stats() const {
  std::lock_guard lock(m_mutex);
  CacheStats stats;
  try {
    Statement counters(m_db, "SELECT name, value FROM stats");
    while (counters.step()) {
      const std::string name = counters.column_text(0);
      const double value = counters.column_double(1);
      const auto count = static_cast<std::uint64_t>(value);
      if (name == "memory_hits") {
        stats.memory_hits = count;
      } else if (name == "memory_misses") {
        stats.memory_misses = count;
      } else if (name == "store_hits") {
        stats.store_hits = count;
      } else if (name == "store_misses") {
        stats.store_misses = count;
      } else if (name == "compiles") {
        stats.compiles = count;
      } else if (name == "compile_ms") {
        stats.compile_ms = value;
      } else if (name == "corrupt") {
        stats.corrupt = count;
      } else if (name == "evictions") {
        stats.evictions = count;
      } else if (name == "remote_saved_ms") {
        stats.remote.saved_ms = value;
      }
      for (const auto& [counter, member] : k_remote_counters) {
        if (name == counter) {
          stats.remote.*member = count;
        }
      }
    }
    Statement size(m_db, "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries");
    size.step();
    stats.entries = static_cast<std::uint64_t>(size.column_int(0));
    stats.size_bytes = static_cast<std::uint64_t>(size.column_int(1));
  } catch (const SqliteFailure& failure) {
    throw CacheError(fmt::format("cannot read statistics of kernel cache '{}': {}", m_path.string(),
                                 failure.message));
  }
  // Counters of this process not written yet.
  stats.memory_hits += m_pending.memory_hits;
  stats.memory_misses += m_pending.memory_misses;
  stats.store_hits += m_pending.store_hits;
  stats.store_misses += m_pending.store_misses;
  stats.compiles += m_pending.compiles;
  stats.compile_ms += m_pending.compile_ms;
  stats.corrupt += m_pending.corrupt;
  add_remote(stats.remote, m_pending.remote);
  return stats;
}

std::vector<CacheEntryInfo> SqliteStore::entries() const {
  std::lock_guard lock(m_mutex);
  std::vector<CacheEntryInfo> result;
  try {
    Statement query(m_db, "SELECT key, name, kind, arch, nvrtc_version, driver_version, options, "
                          "lowered_names, size, compile_ms, created_ms, last_used_ms, hits "
                          "FROM entries ORDER BY last_used_ms DESC, key");
    while (query.step()) {
      CacheEntryInfo e;
      e.key = query.column_text(0);
      e.name = query.column_text(1);
      e.kind = query.column_text(2);
      e.arch = query.column_text(3);
      e.nvrtc_version = query.column_text(4);
      e.driver_version = static_cast<int>(query.column_int(5));
      e.options = query.column_text(6);
      for (auto& [expression, lowered] : decode_lowered(query.column_text(7))) {
        e.kernels.push_back(expression);
      }
      e.size = static_cast<std::uint64_t>(query.column_int(8));
      e.compile_ms = query.column_double(9);
      e.created = query.column_int(10) / 1000;
      e.last_used = query.column_int(11) / 1000;
      e.hits = static_cast<std::uint64_t>(query.column_int(12));
      if (auto it = m_pending_hits.find(e.key); it != m_pending_hits.end()) {
        e.hits += it->second.first;
        e.last_used = std::max(e.last_used, it->second.second / 1000);
      }
      result.push_back(std::move(e));
    }
  } catch (const SqliteFailure& failure) {
    throw CacheError(
      fmt::format("cannot list kernel cache '{}': {}", m_path.string(), failure.message));
  }
  return result;
}

void SqliteStore::require_writable(const char* what) const {
  if (m_read_only) {
    throw CacheError(
      fmt::format("cannot {} kernel cache '{}': it is read-only", what, m_path.string()));
  }
}

void SqliteStore::fail(const char* what, const SqliteFailure& failure) const {
  throw CacheError(
    fmt::format("cannot {} kernel cache '{}': {}", what, m_path.string(), failure.message));
}

VerifyReport SqliteStore::verify(bool fix) {
  if (fix) {
    require_writable("fix");
  }
  std::lock_guard lock(m_mutex);
  VerifyReport report;
  if (!m_moved_aside.empty()) {
    report.moved_aside.push_back(m_moved_aside);
  }
  try {
    Statement integrity(m_db, "PRAGMA integrity_check");
    while (integrity.step()) {
      const std::string line = integrity.column_text(0);
      if (line != "ok") {
        report.integrity.push_back(line);
      }
    }
    Statement rows(m_db, "SELECT key, kind, lowered_names, blob, checksum FROM entries");
    while (rows.step()) {
      ++report.checked;
      const std::string key = rows.column_text(0);
      if (checksum(key, rows.column_text(1), rows.column_text(2), rows.column_blob(3)) !=
          rows.column_int(4)) {
        report.bad_entries.push_back(key);
      }
    }
    rows.reset();
    if (fix && !report.bad_entries.empty()) {
      m_db.exec("BEGIN IMMEDIATE");
      Statement remove(m_db, "DELETE FROM entries WHERE key = ?1");
      for (const auto& key : report.bad_entries) {
        remove.bind(1, key);
        remove.run();
        report.removed += static_cast<std::uint64_t>(sqlite3_changes(m_db.get()));
        m_pending_hits.erase(key);
      }
      m_db.exec("COMMIT");
    }
  } catch (const SqliteFailure& failure) {
    sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    fail("verify", failure);
  }
  return report;
}

std::uint64_t SqliteStore::prune(std::optional<std::uint64_t> max_size,
                                 std::optional<std::int64_t> older_than_seconds) {
  require_writable("prune");
  std::lock_guard lock(m_mutex);
  std::uint64_t removed = 0;
  try {
    write_pending_transaction();
    m_db.exec("BEGIN IMMEDIATE");
    if (older_than_seconds) {
      Statement old(m_db, "DELETE FROM entries WHERE last_used_ms < ?1");
      old.bind(1, now_ms() - *older_than_seconds * 1000);
      old.run();
      removed += static_cast<std::uint64_t>(sqlite3_changes(m_db.get()));
    }
    if (max_size) {
      const std::uint64_t saved = m_max_size;
      m_max_size = *max_size;
      removed += evict("");
      m_max_size = saved;
    }
    m_db.exec("COMMIT");
  } catch (const SqliteFailure& failure) {
    sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    fail("prune", failure);
  }
  return removed;
}

void SqliteStore::clear() {
  require_writable("clear");
  std::lock_guard lock(m_mutex);
  try {
    m_db.exec("BEGIN IMMEDIATE");
    m_db.exec("DELETE FROM entries; DELETE FROM stats;");
    m_db.exec("COMMIT");
    m_db.exec("VACUUM");
    m_pending = {};
    m_pending_hits.clear();
  } catch (const SqliteFailure& failure) {
    sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    fail("clear", failure);
  }
}

std::uint64_t SqliteStore::export_to(const std::filesystem::path& file,
                                     const std::vector<std::string>& archs) {
  std::lock_guard lock(m_mutex);
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::filesystem::remove(file.string() + suffix, ec);
  }
  try {
    {
      // A plain rollback-journal database: one self-contained file to copy into an image.
      Database target = open_database(file, true, false);
      target.exec(k_schema);
    }
    Statement attach(m_db, "ATTACH DATABASE ?1 AS export");
    attach.bind(1, file.string());
    attach.run();
    std::string sql = "INSERT INTO export.entries SELECT * FROM main.entries";
    if (!archs.empty()) {
      sql += " WHERE arch IN (";
      for (std::size_t i = 0; i < archs.size(); ++i) {
        sql += fmt::format("{}?{}", i == 0 ? "" : ", ", i + 1);
      }
      sql += ")";
    }
    std::uint64_t written = 0;
    try {
      Statement copy(m_db, sql.c_str());
      for (std::size_t i = 0; i < archs.size(); ++i) {
        copy.bind(static_cast<int>(i + 1), archs[i]);
      }
      copy.run();
      written = static_cast<std::uint64_t>(sqlite3_changes(m_db.get()));
    } catch (...) {
      sqlite3_exec(m_db.get(), "DETACH DATABASE export", nullptr, nullptr, nullptr);
      throw;
    }
    m_db.exec("DETACH DATABASE export");
    return written;
  } catch (const SqliteFailure& failure) {
    throw CacheError(fmt::format("cannot export kernel cache '{}' to '{}': {}", m_path.string(),
                                 file.string(), failure.message));
  }
}

std::uint64_t SqliteStore::import_from(const std::filesystem::path& file) {
  require_writable("import into");
  std::string why;
  auto source = open_file_read_only(file, &why);
  if (!source) {
    throw CacheError(fmt::format("cannot import '{}': {} (a kjit store of schema version {} is "
                                 "needed)",
                                 file.string(), why, k_store_schema_version));
  }
  std::lock_guard lock(m_mutex);
  std::uint64_t added = 0;
  std::uint64_t skipped = 0;
  try {
    Statement rows(source->m_db, "SELECT * FROM entries");
    m_db.exec("BEGIN IMMEDIATE");
    Statement insert(m_db, "INSERT OR IGNORE INTO entries VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
                           "?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)");
    while (rows.step()) {
      const std::string key = rows.column_text(0);
      // Columns: key name kind arch nvrtc driver options lowered blob checksum size compile_ms
      // created last_used hits log.
      if (checksum(key, rows.column_text(2), rows.column_text(7), rows.column_blob(8)) !=
          rows.column_int(9)) {
        ++skipped;
        continue;
      }
      for (int c = 0; c < 16; ++c) {
        const int type = sqlite3_column_type(rows.get(), c);
        if (type == SQLITE_INTEGER) {
          insert.bind(c + 1, rows.column_int(c));
        } else if (type == SQLITE_FLOAT) {
          insert.bind(c + 1, rows.column_double(c));
        } else if (type == SQLITE_BLOB) {
          insert.bind_blob(c + 1, rows.column_blob(c));
        } else {
          insert.bind(c + 1, rows.column_text(c));
        }
      }
      insert.run();
      added += static_cast<std::uint64_t>(sqlite3_changes(m_db.get()));
    }
    evict("");
    m_db.exec("COMMIT");
  } catch (const SqliteFailure& failure) {
    sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    throw CacheError(fmt::format("cannot import '{}' into kernel cache '{}': {}", file.string(),
                                 m_path.string(), failure.message));
  }
  if (skipped > 0) {
    log(LogLevel::warning, "skipped {} entries of '{}' that fail their checksum", skipped,
        file.string());
  }
  return added;
}

void SqliteStore::write_pending_transaction() {
  if (m_read_only || m_writes_failed) {
    return;
  }
  m_db.exec("BEGIN IMMEDIATE");
  try {
    write_pending();
    m_db.exec("COMMIT");
    m_pending = {};
    m_pending_hits.clear();
  } catch (...) {
    sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

} // namespace kjit::detail
