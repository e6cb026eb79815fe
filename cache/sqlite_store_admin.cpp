// The store's statistics and management commands (kjit cache ...). They throw CacheError.
#include "cache/sqlite_store.hpp"

#include <kjit/error.hpp>

#include "cache/provenance.hpp"
#include "cache/sqlite_store_rows.hpp"
#include "runtime/logging.hpp"

#include <fmt/format.h>

namespace kjit::detail {

using namespace rows;

std::uint64_t SqliteStore::remove(const std::vector<std::string>& keys) {
  require_writable("remove entries of");
  std::lock_guard lock(m_mutex);
  std::uint64_t removed = 0;
  try {
    write_pending_transaction();
    m_db.exec("BEGIN IMMEDIATE");
    for (const auto& key : keys) {
      removed += remove_row(key) ? 1 : 0;
    }
    m_db.exec("COMMIT");
  } catch (const SqliteFailure& failure) {
    sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    fail("remove entries of", failure);
  }
  return removed;
}

std::uint64_t SqliteStore::remove_tuned(const std::vector<std::string>& keys) {
  require_writable("remove tuned configurations of");
  std::lock_guard lock(m_mutex);
  if (!m_has_tuning) {
    return 0;
  }
  std::uint64_t removed = 0;
  try {
    m_db.exec("BEGIN IMMEDIATE");
    Statement remove(m_db, "DELETE FROM tuning WHERE key = ?1");
    for (const auto& key : keys) {
      remove.reset();
      remove.bind(1, key);
      remove.step();
      removed += static_cast<std::uint64_t>(sqlite3_changes(m_db.get()));
    }
    m_db.exec("COMMIT");
  } catch (const SqliteFailure& failure) {
    sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    fail("remove tuned configurations of", failure);
  }
  return removed;
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

std::vector<TunedEntryInfo> SqliteStore::tuned_entries() const {
  std::vector<TunedEntryInfo> result;
  if (!m_has_tuning) {
    return result;
  }
  std::lock_guard lock(m_mutex);
  try {
    Statement query(m_db, "SELECT key, op, bucket, device, config, created_ms FROM tuning "
                          "ORDER BY op, bucket, device");
    while (query.step()) {
      result.push_back(TunedEntryInfo{query.column_text(0),
                                      query.column_text(1),
                                      query.column_text(2),
                                      query.column_text(3),
                                      decode_tuned(query.column_text(4)),
                                      query.column_int(5) / 1000,
                                      {}});
    }
  } catch (const SqliteFailure& failure) {
    fail("list the tuned configurations of", failure);
  }
  return result;
}

std::vector<CacheEntryInfo> SqliteStore::entries() const {
  std::lock_guard lock(m_mutex);
  std::vector<CacheEntryInfo> result;
  try {
    Statement query(m_db, m_has_provenance
                            ? "SELECT e.key, e.name, e.kind, e.arch, e.nvrtc_version, "
                              "e.driver_version, e.options, e.lowered_names, e.size, e.compile_ms, "
                              "e.created_ms, e.last_used_ms, e.hits, COALESCE(p.origin, ''), "
                              "COALESCE(p.fields, '') FROM entries e LEFT JOIN provenance p "
                              "ON p.key = e.key ORDER BY e.last_used_ms DESC, e.key"
                            : "SELECT key, name, kind, arch, nvrtc_version, driver_version, "
                              "options, lowered_names, size, compile_ms, created_ms, "
                              "last_used_ms, hits, '', '' FROM entries "
                              "ORDER BY last_used_ms DESC, key");
    while (query.step()) {
      CacheEntryInfo e;
      e.key = query.column_text(0);
      e.name = query.column_text(1);
      e.kind = query.column_text(2);
      e.arch = query.column_text(3);
      e.nvrtc_version = query.column_text(4);
      e.driver_version = static_cast<int>(query.column_int(5));
      e.options = query.column_text(6);
      for (auto& [expression, lowered] : decode_fields(query.column_text(7))) {
        e.kernels.push_back(expression);
      }
      e.size = static_cast<std::uint64_t>(query.column_int(8));
      e.compile_ms = query.column_double(9);
      e.created = query.column_int(10) / 1000;
      e.last_used = query.column_int(11) / 1000;
      e.hits = static_cast<std::uint64_t>(query.column_int(12));
      std::string origin = query.column_text(13);
      e.key_fields = query.column_text(14);
      if (auto it = m_pending_hits.find(e.key); it != m_pending_hits.end()) {
        e.hits += it->second.first;
        e.last_used = std::max(e.last_used, it->second.second / 1000);
      }
      if (auto it = m_pending_provenance.find(e.key); it != m_pending_provenance.end()) {
        origin = it->second.first;
        e.key_fields = it->second.second;
      }
      ProgramOrigin decoded = decode_origin(origin);
      e.package = std::move(decoded.package);
      e.package_version = std::move(decoded.version);
      e.kernel = std::move(decoded.kernel);
      e.ops = std::move(decoded.ops);
      e.specialization = std::move(decoded.specialization);
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
      for (const auto& key : report.bad_entries) {
        report.removed += remove_row(key) ? 1 : 0;
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
      Statement old(m_db, "SELECT key FROM entries WHERE last_used_ms < ?1");
      old.bind(1, now_ms() - *older_than_seconds * 1000);
      std::vector<std::string> keys;
      while (old.step()) {
        keys.push_back(old.column_text(0));
      }
      old.reset();
      for (const auto& key : keys) {
        removed += remove_row(key) ? 1 : 0;
      }
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
    if (m_has_provenance) {
      m_db.exec("DELETE FROM provenance;");
    }
    if (m_has_tuning) {
      m_db.exec("DELETE FROM tuning;");
    }
    m_db.exec("COMMIT");
    m_db.exec("VACUUM");
    m_pending = {};
    m_pending_hits.clear();
    m_pending_provenance.clear();
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
    if (m_has_provenance) {
      std::string notes = "INSERT INTO export.provenance SELECT p.* FROM main.provenance p "
                          "JOIN main.entries e ON e.key = p.key";
      if (!archs.empty()) {
        notes += sql.substr(sql.find(" WHERE"));
        notes.replace(notes.find(" WHERE arch"), 11, " WHERE e.arch");
      }
      try {
        Statement copy(m_db, notes.c_str());
        for (std::size_t i = 0; i < archs.size(); ++i) {
          copy.bind(static_cast<int>(i + 1), archs[i]);
        }
        copy.run();
      } catch (...) {
        sqlite3_exec(m_db.get(), "DETACH DATABASE export", nullptr, nullptr, nullptr);
        throw;
      }
    }
    if (m_has_tuning) { // every tuned configuration: they are small and keyed by device
      try {
        m_db.exec("INSERT INTO export.tuning SELECT * FROM main.tuning");
      } catch (...) {
        sqlite3_exec(m_db.get(), "DETACH DATABASE export", nullptr, nullptr, nullptr);
        throw;
      }
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
    if (source->m_has_provenance && m_has_provenance) {
      Statement notes(source->m_db, "SELECT key, origin, fields FROM provenance");
      Statement note(m_db, "INSERT OR IGNORE INTO provenance SELECT ?1, ?2, ?3 "
                           "WHERE EXISTS (SELECT 1 FROM entries WHERE key = ?1)");
      while (notes.step()) {
        note.bind(1, notes.column_text(0))
          .bind(2, notes.column_text(1))
          .bind(3, notes.column_text(2));
        note.run();
      }
    }
    if (source->m_has_tuning && m_has_tuning) {
      Statement tuned(source->m_db,
                      "SELECT key, op, bucket, device, config, created_ms FROM tuning");
      Statement keep(m_db, "INSERT OR IGNORE INTO tuning VALUES(?1, ?2, ?3, ?4, ?5, ?6)");
      while (tuned.step()) {
        keep.bind(1, tuned.column_text(0))
          .bind(2, tuned.column_text(1))
          .bind(3, tuned.column_text(2))
          .bind(4, tuned.column_text(3))
          .bind(5, tuned.column_text(4))
          .bind(6, tuned.column_int(5));
        keep.run();
      }
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
    m_pending_provenance.clear();
  } catch (...) {
    sqlite3_exec(m_db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

} // namespace kjit::detail
