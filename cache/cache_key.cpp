#include "cache/cache_key.hpp"

#include <fmt/format.h>

namespace kjit::detail {

Digest cache_key(const KeyInputs& inputs) {
  Hasher hasher;
  hasher.field("key_schema", k_key_schema_version)
    .field("program", to_hex(inputs.program_digest))
    .field("arch", inputs.target.arch.name())
    .field("output", to_string(inputs.target.kind))
    .field("nvrtc", fmt::format("{}.{}", inputs.nvrtc_major, inputs.nvrtc_minor))
    .field("driver", inputs.driver_version);
  return hasher.digest();
}

} // namespace kjit::detail
