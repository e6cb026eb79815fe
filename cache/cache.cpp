#include <kjit/cache.hpp>

#include "cache/sqlite_store.hpp"

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

void Cache::flush() {
  if (m_store != nullptr) {
    m_store->flush();
  }
}

} // namespace kjit
