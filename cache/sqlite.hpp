// Move-only owners of SQLite handles, and KJIT_SQLITE_CHECK.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace kjit::detail {

// An SQLite failure: `code` is the (extended) result code. Internal to the cache: the store turns
// these into warnings or `CacheError`s at its boundary.
struct SqliteFailure {
  int code;
  std::string message;
};

// Owning `sqlite3*`; closes on destruction.
class Database {
public:
  Database() = default;
  explicit Database(sqlite3* db) noexcept : m_db(db) {}
  ~Database();
  Database(Database&& other) noexcept : m_db(other.release()) {}
  Database& operator=(Database&& other) noexcept;
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  sqlite3* get() const noexcept { return m_db; }
  sqlite3* release() noexcept { return std::exchange(m_db, nullptr); }
  explicit operator bool() const noexcept { return m_db != nullptr; }

  // Runs `sql` (no results); throws SqliteFailure.
  void exec(const char* sql) const;

private:
  sqlite3* m_db = nullptr;
};

// Owning `sqlite3_stmt*`; finalizes on destruction. `reset()` makes it reusable.
class Statement {
public:
  Statement() = default;
  // Prepares `sql` on `db`; throws SqliteFailure.
  Statement(const Database& db, const char* sql);
  // Owns an already prepared statement.
  explicit Statement(sqlite3_stmt* stmt) noexcept : m_stmt(stmt) {}
  ~Statement();
  Statement(Statement&& other) noexcept : m_stmt(other.release()) {}
  Statement& operator=(Statement&& other) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  sqlite3_stmt* get() const noexcept { return m_stmt; }
  sqlite3_stmt* release() noexcept { return std::exchange(m_stmt, nullptr); }

  Statement& bind(int index, std::string_view text);
  Statement& bind_blob(int index, std::string_view bytes);
  Statement& bind(int index, std::int64_t value);
  Statement& bind(int index, double value);
  // Steps once: true for a row, false when done; throws SqliteFailure.
  bool step();
  // Runs to completion and resets.
  void run();
  void reset() noexcept;

  std::int64_t column_int(int index) const;
  double column_double(int index) const;
  std::string column_text(int index) const;
  std::string column_blob(int index) const;

private:
  sqlite3_stmt* m_stmt = nullptr;
};

} // namespace kjit::detail

// Runs an sqlite3_* call returning a result code; throws `SqliteFailure` with SQLite's message
// (what a user can act on: "file is not a database", "database or disk is full"; not the call)
// unless it returned one of SQLITE_OK, SQLITE_ROW, SQLITE_DONE.
#define KJIT_SQLITE_CHECK(db, call)                                                                \
  do {                                                                                             \
    const int kjit_rc_ = (call);                                                                   \
    if (kjit_rc_ != SQLITE_OK && kjit_rc_ != SQLITE_ROW && kjit_rc_ != SQLITE_DONE) {              \
      throw ::kjit::detail::SqliteFailure{                                                         \
        kjit_rc_, std::string("SQLite: ") +                                                        \
                    ((db) != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(kjit_rc_))};            \
    }                                                                                              \
  } while (false)
