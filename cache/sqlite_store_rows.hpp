// What the store's two source files share (sqlite_store.cpp: opening, reads, writes;
// sqlite_store_admin.cpp: statistics and the management commands): the schema, the row
// encodings and the remote counters' names.
#pragma once

#include <kjit/cache.hpp>

#include "cache/sqlite.hpp"

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kjit::detail::rows {

extern const char* const k_schema;

// Times are stored in milliseconds, so least-recently-used order holds within a second.
std::int64_t now_ms();
// Lowered names are kept as provenance fields are (encode_fields in cache/provenance.hpp).
// Over key, kind, lowered names and binary: verified on every read.
std::int64_t checksum(std::string_view key, std::string_view kind, std::string_view lowered,
                      std::string_view blob);
// A store file, read-write (created) or read-only (immutable: a file whose folder cannot hold
// -wal/-shm files).
Database open_database(const std::filesystem::path& file, bool writable, bool immutable);
bool has_table(const Database& db, const char* name);

// The remote tier's counters, by their name in the stats table.
inline constexpr std::pair<const char*, std::uint64_t RemoteStats::*> k_remote_counters[] = {
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

inline void add_remote(RemoteStats& to, const RemoteStats& from) {
  for (const auto& [name, member] : k_remote_counters) {
    to.*member += from.*member;
  }
  to.saved_ms += from.saved_ms;
}

} // namespace kjit::detail::rows
