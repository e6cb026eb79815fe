#include "cache/sqlite.hpp"

namespace kjit::detail {

Database::~Database() {
  // sqlite3_close_v2 defers the close until outstanding statements are finalized; it does not
  // fail on a valid handle.
  sqlite3_close_v2(m_db);
}

Database& Database::operator=(Database&& other) noexcept {
  if (this != &other) {
    sqlite3_close_v2(m_db);
    m_db = other.release();
  }
  return *this;
}

void Database::exec(const char* sql) const {
  KJIT_SQLITE_CHECK(m_db, sqlite3_exec(m_db, sql, nullptr, nullptr, nullptr));
}

Statement::Statement(const Database& db, const char* sql) {
  KJIT_SQLITE_CHECK(
    db.get(), sqlite3_prepare_v3(db.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &m_stmt, nullptr));
}

Statement::~Statement() {
  sqlite3_finalize(m_stmt);
}

Statement& Statement::operator=(Statement&& other) noexcept {
  if (this != &other) {
    sqlite3_finalize(m_stmt);
    m_stmt = other.release();
  }
  return *this;
}

Statement& Statement::bind(int index, std::string_view text) {
  KJIT_SQLITE_CHECK(
    sqlite3_db_handle(m_stmt),
    sqlite3_bind_text64(m_stmt, index, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  return *this;
}

Statement& Statement::bind_blob(int index, std::string_view bytes) {
  KJIT_SQLITE_CHECK(sqlite3_db_handle(m_stmt), sqlite3_bind_blob64(m_stmt, index, bytes.data(),
                                                                   bytes.size(), SQLITE_TRANSIENT));
  return *this;
}

Statement& Statement::bind(int index, std::int64_t value) {
  KJIT_SQLITE_CHECK(sqlite3_db_handle(m_stmt), sqlite3_bind_int64(m_stmt, index, value));
  return *this;
}

Statement& Statement::bind(int index, double value) {
  KJIT_SQLITE_CHECK(sqlite3_db_handle(m_stmt), sqlite3_bind_double(m_stmt, index, value));
  return *this;
}

bool Statement::step() {
  const int rc = sqlite3_step(m_stmt);
  if (rc == SQLITE_ROW) {
    return true;
  }
  if (rc == SQLITE_DONE) {
    return false;
  }
  const std::string message = std::string("SQLite: ") + sqlite3_errmsg(sqlite3_db_handle(m_stmt));
  sqlite3_reset(m_stmt);
  throw SqliteFailure{rc, message};
}

void Statement::run() {
  while (step()) {
  }
  reset();
}

void Statement::reset() noexcept {
  sqlite3_reset(m_stmt);
  sqlite3_clear_bindings(m_stmt);
}

std::int64_t Statement::column_int(int index) const {
  return sqlite3_column_int64(m_stmt, index);
}

double Statement::column_double(int index) const {
  return sqlite3_column_double(m_stmt, index);
}

std::string Statement::column_text(int index) const {
  const auto* text = sqlite3_column_text(m_stmt, index);
  const int size = sqlite3_column_bytes(m_stmt, index);
  return text != nullptr ? std::string(reinterpret_cast<const char*>(text), size) : std::string();
}

std::string Statement::column_blob(int index) const {
  const void* blob = sqlite3_column_blob(m_stmt, index);
  const int size = sqlite3_column_bytes(m_stmt, index);
  return blob != nullptr ? std::string(static_cast<const char*>(blob), size) : std::string();
}

} // namespace kjit::detail
