#include <kjit/cache.hpp>

#include "cache/sqlite_store.hpp"
#include "runtime/util/env.hpp"

#include <algorithm>

#include <kjit/error.hpp>

namespace kjit {

Cache::Cache(std::unique_ptr<detail::SqliteStore> store) : m_store(std::move(store)) {}

Cache::~Cache() = default;

bool Cache::enabled() const noexcept {
  return m_store != nullptr;
}

bool Cache::read_only() const noexcept {
  return m_store != nullptr && m_store->read_only();
}

std::filesystem::path Cache::path() const {
  return m_store != nullptr ? m_store->path() : std::filesystem::path();
}

CacheStats Cache::stats() const {
  return m_store != nullptr ? m_store->stats() : CacheStats{};
}

std::vector<CacheEntryInfo> Cache::entries() const {
  return m_store != nullptr ? m_store->entries() : std::vector<CacheEntryInfo>{};
}

std::vector<CacheEntryInfo> Cache::read_only_entries() const {
  std::vector<CacheEntryInfo> all;
  for (const auto& read_only : read_only_stores()) {
    for (auto& entry : read_only.store->entries()) {
      entry.store = read_only.store->path().string();
      all.push_back(std::move(entry));
    }
  }
  return all;
}

std::vector<TunedEntryInfo> Cache::tuned_entries() const {
  std::vector<TunedEntryInfo> all =
    m_store != nullptr ? m_store->tuned_entries() : std::vector<TunedEntryInfo>{};
  for (const auto& read_only : read_only_stores()) {
    for (auto& entry : read_only.store->tuned_entries()) {
      entry.store = read_only.store->path().string();
      all.push_back(std::move(entry));
    }
  }
  return all;
}

void Cache::flush() {
  if (m_store != nullptr) {
    m_store->flush();
  }
}

detail::SqliteStore& Cache::require() const {
  if (m_store == nullptr) {
    throw CacheError("no kernel cache is in use (KJIT_DISABLE_CACHE, or the cache directory "
                     "could not be used: see the warning above)");
  }
  return *m_store;
}

VerifyReport Cache::verify(bool fix) {
  return require().verify(fix);
}

std::uint64_t Cache::prune(std::optional<std::uint64_t> max_size,
                           std::optional<std::int64_t> older_than_seconds) {
  return require().prune(max_size, older_than_seconds);
}

void Cache::clear() {
  require().clear();
}

bool EntryFilter::matches(const CacheEntryInfo& entry) const {
  return (package.empty() || entry.package == package) &&
         (version.empty() || entry.package_version == version) &&
         (op.empty() || std::find(entry.ops.begin(), entry.ops.end(), op) != entry.ops.end()) &&
         (arch.empty() || entry.arch == arch) && (key.empty() || entry.key.starts_with(key));
}

bool EntryFilter::matches(const TunedEntryInfo& entry) const {
  const auto sep = entry.op.find("::");
  const std::string ns = entry.op.substr(0, sep);
  const std::string name = sep == std::string::npos ? entry.op : entry.op.substr(sep + 2);
  return (package.empty() || ns == package || ns.starts_with(package + "_v")) && version.empty() &&
         (op.empty() || name == op) &&
         (arch.empty() || entry.device.find("(" + arch + ",") != std::string::npos) &&
         (key.empty() || entry.key.starts_with(key));
}

std::uint64_t Cache::remove(const EntryFilter& filter) {
  if (filter.empty()) {
    throw CacheError("name the entries to remove (a package, version, op, arch or key); "
                     "`kjit cache clear` removes them all");
  }
  detail::SqliteStore& store = require();
  std::vector<std::string> keys;
  for (const auto& entry : store.entries()) {
    if (filter.matches(entry)) {
      keys.push_back(entry.key);
    }
  }
  std::vector<std::string> tuned;
  for (const auto& entry : store.tuned_entries()) {
    if (filter.matches(entry)) {
      tuned.push_back(entry.key);
    }
  }
  return (keys.empty() ? 0 : store.remove(keys)) + (tuned.empty() ? 0 : store.remove_tuned(tuned));
}

std::uint64_t Cache::export_to(const std::filesystem::path& file,
                               const std::vector<std::string>& archs) {
  return require().export_to(file, archs);
}

std::uint64_t Cache::import_from(const std::filesystem::path& file) {
  return require().import_from(file);
}

std::vector<std::filesystem::path> Cache::read_only_paths() const {
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : read_only_stores()) {
    paths.push_back(entry.store->path());
  }
  return paths;
}

std::optional<std::uint64_t> parse_size(std::string_view text) {
  return detail::parse_size(text);
}

bool Cache::ReadOnlyStore::serves(const std::string& scope) const {
  return scopes.empty() || std::find(scopes.begin(), scopes.end(), scope) != scopes.end();
}

std::vector<Cache::ReadOnlyStore> Cache::read_only_stores() const {
  std::lock_guard lock(m_read_only_mutex);
  return m_read_only;
}

bool Cache::add_read_only_path(const std::filesystem::path& path, const std::string& scope) {
  std::error_code ec;
  const auto file = std::filesystem::is_directory(path, ec) ? detail::store_file(path) : path;
  {
    std::lock_guard lock(m_read_only_mutex);
    for (auto& entry : m_read_only) {
      if (std::filesystem::equivalent(entry.store->path(), file, ec)) {
        if (!entry.scopes.empty() && !scope.empty() && !entry.serves(scope)) {
          entry.scopes.push_back(scope);
        } else if (scope.empty()) {
          entry.scopes.clear();
        }
        return true;
      }
    }
  }
  auto store = detail::SqliteStore::open_file_read_only(file);
  if (!store) {
    return false;
  }
  std::lock_guard lock(m_read_only_mutex);
  m_read_only.push_back(ReadOnlyStore{std::move(store), {}});
  if (!scope.empty()) {
    m_read_only.back().scopes.push_back(scope);
  }
  return true;
}

} // namespace kjit
