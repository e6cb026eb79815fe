// The cache key of a compile.
//
// Note [Cache key]: XXH3-128 over tagged, length-delimited fields (runtime/util/hash.hpp):
//   key schema version | program digest (name, source, every included header's name and content,
//   canonical options, name expressions; see Program) | target arch | output kind |
//   NVRTC major.minor | driver version | identity of the CUDA headers NVRTC is given (Note
//   [CUDA headers] in runtime/cuda/nvrtc.cpp).
// Nothing process- or machine-specific (paths, times, pids) enters it, so stores can be exported
// to other machines. Bump `k_key_schema_version` when the field list changes.
#pragma once

#include <kjit/arch.hpp>

#include "runtime/util/hash.hpp"

#include <array>
#include <cstdint>
#include <string>

namespace kjit::detail {

inline constexpr int k_key_schema_version = 2;

struct KeyInputs {
  std::array<std::uint64_t, 2> program_digest{};
  Target target;
  int nvrtc_major = 0;
  int nvrtc_minor = 0;
  int driver_version = 0;
  std::array<std::uint64_t, 2> cuda_headers{}; // Note [CUDA headers]
};

Digest cache_key(const KeyInputs& inputs);

} // namespace kjit::detail
