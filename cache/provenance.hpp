// What a store entry was made from, kept beside it (not part of its checksum or key).
//
// Note [Provenance]: each entry may carry two texts in the store's `provenance` table:
//   - its origin: the package, package version, kernel, ops and specialization whose program it
//     is (`ProgramOrigin`, set by `Package::specialize`), so entries can be listed and removed by
//     package (`kjit cache ls --package`, `kjit cache rm --package`);
//   - its key fields: one digest or value per input of the cache key (Note [Cache key]): the
//     source's digest, each header's, each canonical option, the name expressions, arch, output
//     kind, NVRTC version, driver version and the CUDA headers' identity. A lookup that misses is
//     explained by comparing its fields with those of the nearest entry of the same program
//     (`Runtime::explain`, `kjit cache why`).
// Both are text, one `field<TAB>value` per line, so an older or newer kjit reads what it knows and
// skips the rest. An entry a hit finds with no or another origin (made by a bare program, or by
// an earlier version of the package with the same sources) gets the new one with the next write.
#pragma once

#include <kjit/arch.hpp>
#include <kjit/cache.hpp>
#include <kjit/program.hpp>

#include <string>
#include <utility>
#include <vector>

namespace kjit::detail {

using Fields = std::vector<std::pair<std::string, std::string>>;

std::string encode_fields(const Fields& fields);
Fields decode_fields(const std::string& text);

// The origin as fields ("package", "version", "kernel", "op" once per op, "specialization"), and
// back; an empty origin encodes as "".
std::string encode_origin(const ProgramOrigin& origin);
ProgramOrigin decode_origin(const std::string& text);

// The inputs of the cache key of `program` for `target` (Note [Cache key]), as fields.
struct KeyIdentity {
  int nvrtc_major = 0;
  int nvrtc_minor = 0;
  int driver_version = 0;
  std::array<std::uint64_t, 2> cuda_headers{};
};
Fields key_fields(const Program& program, const Target& target, const KeyIdentity& identity);

// What differs between the key fields of a lookup (`wanted`) and those of a stored entry
// (`stored`), one sentence each, most telling first; empty when they agree.
std::vector<std::string> field_differences(const Fields& wanted, const Fields& stored);

// A tuned configuration as stored (the `tuning` table's config column), and back; fields
// name, best, pruned, budget, seconds and one timing per candidate ("v1 v2|ms|error").
std::string encode_tuned(const TunedConfig& config);
TunedConfig decode_tuned(const std::string& text);

// Looks `key` up in `cache`'s stores (the read-only ones that serve `scope` included) and, on a
// miss, compares `wanted` with the entries of the same program name (`Runtime::explain`).
LookupExplanation explain_lookup(const Cache& cache, const std::string& key, const Fields& wanted,
                                 const std::string& scope);

} // namespace kjit::detail
