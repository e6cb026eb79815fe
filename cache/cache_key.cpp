#include "cache/cache_key.hpp"

namespace kjit::detail {

Digest cache_key(const KeyInputs& inputs) {
  // Numbers and fixed strings only: computing a key allocates nothing (an in-process lookup
  // computes one).
  const char suffix = inputs.target.arch.suffix;
  Hasher hasher;
  hasher.field("key_schema", k_key_schema_version)
    .field("program", inputs.program_digest)
    .field("arch", inputs.target.arch.number())
    .field("arch_suffix", std::string_view(&suffix, suffix == '\0' ? 0 : 1))
    .field("output", to_string(inputs.target.kind))
    .field("nvrtc_major", inputs.nvrtc_major)
    .field("nvrtc_minor", inputs.nvrtc_minor)
    .field("driver", inputs.driver_version)
    .field("cuda_headers", inputs.cuda_headers);
  return hasher.digest();
}

} // namespace kjit::detail
