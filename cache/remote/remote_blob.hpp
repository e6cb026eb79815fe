// The value of one remote cache entry: a self-checking blob.
//
// Note [Remote blob]: one Redis key per entry holds everything needed to use it and to know it is
// whole and the right one:
//   "KJITRB01" | u32 format | u32 flags (1 = signed) | key (the full 32-hex-digit cache key) |
//   kind | arch | name | nvrtc version | options | log | binary | i64 driver | f64 compile ms |
//   u32 count, lowered names (expression, name) | u64 XXH3-64 of all the above |
//   [HMAC-SHA256 of all the above, with the fleet's secret, when signed]
// Strings and the binary are u32-length-prefixed, integers little-endian. `decode` refuses a
// truncated value, another format, another key, a bad checksum and, where a secret is set, an
// unsigned or wrongly signed value: each is a miss that the caller deletes and recompiles.
#pragma once

#include "cache/sqlite_store.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace kjit::detail {

inline constexpr int k_remote_format_version = 1;

// `secret`: the fleet's HMAC key; empty for unsigned blobs.
std::string encode_remote_blob(std::string_view key, const StoredBinary& value,
                               std::string_view secret);

// Fills `out` from `blob` if it is whole, for `key`, and (with a `secret`) signed with it.
// Returns the reason it is not, or nothing.
std::optional<std::string> decode_remote_blob(std::string_view blob, std::string_view key,
                                              std::string_view secret, StoredBinary& out);

// HMAC-SHA256 of `data` with `secret` (32 bytes).
std::string hmac_sha256(std::string_view secret, std::string_view data);

} // namespace kjit::detail
