#include "runtime/util/hash.hpp"

#include "runtime/util/assert.hpp"

#include <fmt/format.h>

namespace kjit::detail {

std::string to_hex(const Digest& digest) {
  return fmt::format("{:016x}{:016x}", digest[0], digest[1]);
}

Hasher::Hasher() {
  KJIT_ASSERT(XXH3_128bits_reset(&m_state) == XXH_OK);
}

void Hasher::update(const void* data, std::size_t size) {
  KJIT_ASSERT(XXH3_128bits_update(&m_state, data, size) == XXH_OK);
}

Hasher& Hasher::field(std::string_view tag, std::string_view value) {
  const std::uint64_t tag_size = tag.size();
  const std::uint64_t value_size = value.size();
  update(&tag_size, sizeof tag_size);
  update(tag.data(), tag.size());
  update(&value_size, sizeof value_size);
  update(value.data(), value.size());
  return *this;
}

Hasher& Hasher::field(std::string_view tag, std::int64_t value) {
  // Decimal text, so keys do not depend on the host's byte order.
  const fmt::format_int text(value);
  return field(tag, std::string_view(text.data(), text.size()));
}

Hasher& Hasher::field(std::string_view tag, const Digest& value) {
  // Big-endian bytes, so keys do not depend on the host's byte order.
  char bytes[16];
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<char>(value[0] >> (56 - 8 * i));
    bytes[8 + i] = static_cast<char>(value[1] >> (56 - 8 * i));
  }
  return field(tag, std::string_view(bytes, sizeof bytes));
}

Digest Hasher::digest() const {
  const XXH128_hash_t h = XXH3_128bits_digest(&m_state);
  return {h.high64, h.low64};
}

std::uint64_t checksum64(std::string_view data) noexcept {
  return XXH3_64bits(data.data(), data.size());
}

} // namespace kjit::detail
