// The SQLite store: opening (with recovery and the schema's later tables), reads, writes and
// the pending counters. Over 600 lines: they share its prepared statements and its one mutex;
// statistics and the management commands are in sqlite_store_admin.cpp.
#include "cache/sqlite_store.hpp"

#include "cache/provenance.hpp"
#include "cache/sqlite_store_rows.hpp"

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
namespace rows {

constexpr int k_busy_timeout_ms = 10000;

const char* const k_schema = R"sql(
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
CREATE TABLE IF NOT EXISTS provenance(key TEXT PRIMARY KEY, origin TEXT NOT NULL,
                                      fields TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tuning(key TEXT PRIMARY KEY, op TEXT NOT NULL, bucket TEXT NOT NULL,
                                  device TEXT NOT NULL, config TEXT NOT NULL,
                                  created_ms INTEGER NOT NULL);
INSERT OR IGNORE INTO meta(name, value) VALUES('schema_version', '1');
)sql";

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
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

bool has_table(const Database& db, const char* name) {
  Statement query(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1");
  query.bind(1, std::string_view(name));
  return query.step();
}

} // namespace rows

using namespace rows;

namespace {

// Lock id of the store itself (recovery of a broken file); key locks never use it (see
// lock_key).
constexpr std::uint64_t k_store_lock_id = 0;

// Note [Provenance] (cache/provenance.hpp) and Note [Tuner] (runtime/tune/tuner.hpp): tables
// stores of schema version 1 gained later; a writable store without them gets them when
// opened, a read-only one is read without them.
constexpr const char* k_provenance_schema = R"sql(
CREATE TABLE IF NOT EXISTS provenance(key TEXT PRIMARY KEY, origin TEXT NOT NULL,
                                      fields TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tuning(key TEXT PRIMARY KEY, op TEXT NOT NULL, bucket TEXT NOT NULL,
                                  device TEXT NOT NULL, config TEXT NOT NULL,
                                  created_ms INTEGER NOT NULL);
)sql";

bool is_broken_file(int code) {
  const int primary = code & 0xff;
  return primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT;
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
  m_has_provenance = has_table(m_db, "provenance");
  m_has_tuning = has_table(m_db, "tuning");
  if ((!m_has_provenance || !m_has_tuning) && !m_read_only) {
    LockGuard guard = m_locks->lock(k_store_lock_id);
    with_busy_retry([&] {
      m_db.exec("BEGIN IMMEDIATE");
      try {
        m_db.exec(k_provenance_schema);
        m_db.exec("COMMIT");
      } catch (...) {
        sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
      }
    });
    m_has_provenance = true;
    m_has_tuning = true;
  }
  m_get = Statement(m_db, m_has_provenance
                            ? "SELECT e.kind, e.arch, e.name, e.nvrtc_version, e.driver_version, "
                              "e.options, e.lowered_names, e.blob, e.checksum, e.compile_ms, "
                              "e.compile_log, COALESCE(p.origin, '') FROM entries e "
                              "LEFT JOIN provenance p ON p.key = e.key WHERE e.key = ?1"
                            : "SELECT kind, arch, name, nvrtc_version, driver_version, options, "
                              "lowered_names, blob, checksum, compile_ms, compile_log, '' "
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
    out.origin = m_get.column_text(11);
    out.fields.clear();
    m_get.reset();
    if (checksum(key, out.kind, lowered, out.blob) != stored_checksum) {
      return Lookup::corrupt;
    }
    out.lowered_names = decode_fields(lowered);
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
    const std::string lowered = encode_fields(value.lowered_names);
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
    if (!value.origin.empty() || !value.fields.empty()) {
      Statement note(m_db, replace ? "INSERT OR REPLACE INTO provenance VALUES(?1, ?2, ?3)"
                                   : "INSERT OR IGNORE INTO provenance VALUES(?1, ?2, ?3)");
      note.bind(1, key).bind(2, value.origin).bind(3, value.fields);
      note.run();
      m_pending_provenance.erase(key);
    }
    write_pending();
    evict(key);
    m_db.exec("COMMIT");
    m_pending = {};
    m_pending_hits.clear();
    m_pending_provenance.clear();
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
      p.compiles == 0 && p.corrupt == 0 && m_pending_hits.empty() && m_pending_provenance.empty()) {
    return;
  }
  try {
    m_db.exec("BEGIN IMMEDIATE");
    write_pending();
    m_db.exec("COMMIT");
    m_pending = {};
    m_pending_hits.clear();
    m_pending_provenance.clear();
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
  if (!m_pending_provenance.empty()) {
    // Only for entries still there (another process may have evicted one meanwhile).
    Statement note(m_db, "INSERT OR REPLACE INTO provenance SELECT ?1, ?2, ?3 "
                         "WHERE EXISTS (SELECT 1 FROM entries WHERE key = ?1)");
    for (const auto& [key, texts] : m_pending_provenance) {
      note.bind(1, key).bind(2, texts.first).bind(3, texts.second);
      note.run();
    }
  }
}

std::optional<TunedEntryInfo> SqliteStore::get_tuned(const std::string& key) const {
  if (!m_has_tuning) {
    return std::nullopt;
  }
  std::lock_guard lock(m_mutex);
  try {
    Statement get(m_db, "SELECT op, bucket, device, config, created_ms FROM tuning WHERE key = ?1");
    get.bind(1, key);
    if (!get.step()) {
      return std::nullopt;
    }
    TunedEntryInfo entry{key,
                         get.column_text(0),
                         get.column_text(1),
                         get.column_text(2),
                         decode_tuned(get.column_text(3)),
                         get.column_int(4) / 1000,
                         {}};
    if (entry.config.best.size() != entry.config.names.size() || entry.config.best.empty()) {
      return std::nullopt; // damaged: tuned again
    }
    return entry;
  } catch (const SqliteFailure& failure) {
    log(LogLevel::warning, "cannot read tuned configurations of '{}': {}", m_path.string(),
        failure.message);
    return std::nullopt;
  }
}

void SqliteStore::put_tuned(const TunedEntryInfo& entry) noexcept {
  if (m_read_only || !m_has_tuning) {
    return;
  }
  std::lock_guard lock(m_mutex);
  if (m_writes_failed) {
    return;
  }
  try {
    m_db.exec("BEGIN IMMEDIATE");
    Statement put(m_db, "INSERT OR REPLACE INTO tuning VALUES(?1, ?2, ?3, ?4, ?5, ?6)");
    put.bind(1, entry.key)
      .bind(2, entry.op)
      .bind(3, entry.bucket)
      .bind(4, entry.device)
      .bind(5, encode_tuned(entry.config))
      .bind(6, now_ms());
    put.run();
    m_db.exec("COMMIT");
  } catch (const SqliteFailure& failure) {
    sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    warn_write_failure(failure);
  }
}

void SqliteStore::note_provenance(const std::string& key, std::string origin,
                                  std::string fields) noexcept {
  if (m_read_only || !m_has_provenance) {
    return;
  }
  std::lock_guard lock(m_mutex);
  m_pending_provenance[key] = {std::move(origin), std::move(fields)};
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
  for (const auto& [key, size] : victims) {
    remove_row(key);
  }
  Statement add(m_db, "INSERT INTO stats(name, value) VALUES('evictions', ?1) "
                      "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value");
  add.bind(1, static_cast<double>(victims.size()));
  add.run();
  log(LogLevel::info, "evicted {} kernel cache entries to stay under {}", victims.size(),
      format_size(m_max_size));
  return victims.size();
}

bool SqliteStore::remove_row(const std::string& key) {
  Statement remove(m_db, "DELETE FROM entries WHERE key = ?1");
  remove.bind(1, key);
  remove.run();
  const bool removed = sqlite3_changes(m_db.get()) > 0;
  if (m_has_provenance) {
    Statement forget(m_db, "DELETE FROM provenance WHERE key = ?1");
    forget.bind(1, key);
    forget.run();
  }
  m_pending_hits.erase(key);
  m_pending_provenance.erase(key);
  return removed;
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

} // namespace kjit::detail
