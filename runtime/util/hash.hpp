// XXH3-128 over tagged, length-delimited fields: `field("source", text)` hashes the tag, the
// value's length and the value, so no two different field lists hash the same bytes
// (ccache's hash_delimiter idea). No project types.
#pragma once

// The whole of xxHash inline: no library to link, for kjit or for apps embedding it, and a hash
// state that lives on the stack.
#ifndef XXH_INLINE_ALL
#  define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kjit::detail {

using Digest = std::array<std::uint64_t, 2>; // {high64, low64}

// 32 lowercase hex digits, high half first.
std::string to_hex(const Digest& digest);

class Hasher {
public:
  Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  // Hashes `tag`, then `value`'s length and bytes.
  Hasher& field(std::string_view tag, std::string_view value);
  Hasher& field(std::string_view tag, std::int64_t value);
  Hasher& field(std::string_view tag, const Digest& value);
  Digest digest() const;

private:
  void update(const void* data, std::size_t size);
  XXH3_state_t m_state;
};

// XXH3-64 of `data`, for blob checksums.
std::uint64_t checksum64(std::string_view data) noexcept;

} // namespace kjit::detail
