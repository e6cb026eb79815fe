// Autotuning of an op's launch parameters (Note [Tuning] in runtime/manifest/op_spec.hpp): the
// candidates, the choice among them, and the tuned configurations kept in the store.
//
// Note [Tuner]: for one key (package source, op, candidate set, device, dtypes, bucket), every
// candidate the predicate keeps is timed, the default first (so the result is never slower than
// it, also when the budget stops the tuner; the default is timed even when its value, an
// expression of the arguments, is not among the candidates), and another candidate displaces the
// default only when it is more than 1% faster (a tie is noise, and keeps the package's rule); a
// candidate that fails (does not compile, does not launch, takes too much shared memory)
// counts as infinitely slow; no new candidate starts once the time budget is spent. The fastest
// is kept with every timing in the store's `tuning` table, so a later process, or a host that
// imports the store, pays nothing. One process tunes a key at a time: the key's lock in the
// store's lock file (as compiles), the others wait and then read what it stored. The timer and
// the clock are given by the caller: CUDA events on a device, a fake in the tests.
#pragma once

#include <kjit/cache.hpp>
#include <kjit/package.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kjit::detail {

class SqliteStore;
class RemoteStore;
struct StoredBinary;
struct OpSpec;

using TuneValues = std::vector<std::int64_t>; // one value per tune parameter, in order

// Every combination of the parameters' values, the first parameter varying slowest.
std::vector<TuneValues> tune_candidates(const std::vector<std::vector<std::int64_t>>& lists);

struct TuneHooks {
  std::function<bool(const TuneValues&)> valid; // false: pruned, never timed; may be empty
  // Median milliseconds of the candidate; throws (any std::exception) when it fails.
  std::function<double(const TuneValues&)> time_ms;
  std::function<double()> now_s; // a monotonic clock in seconds
};

// Tunes `candidates` (`fallback`, the default configuration, is timed first).
TunedConfig run_tuner(const std::vector<std::string>& names,
                      const std::vector<TuneValues>& candidates, const TuneValues& fallback,
                      const TuneHooks& hooks, double budget_s);

// The key of a tuned configuration: XXH3-128 hex of its inputs (Note [Tuner]).
struct TuneKeyInputs {
  std::string package;        // the op's namespace
  std::string package_digest; // of the package's sources and manifest
  std::string op;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> candidates; // names and values
  std::string device; // name, compute capability and SM count
  std::vector<std::string> dtypes;
  std::vector<std::int64_t> bucket;
};
std::string tune_key(const TuneKeyInputs& inputs);

// The configuration stored under `entry.key`, or one tuned now by `tune` and stored as `entry`
// (op, bucket and device describe it), under the key's lock: a process that finds the lock held
// waits, then reads what the holder stored. Without a store, `tune` runs and nothing is kept.
// With the fleet's `remote` tier, it is asked after the store (a hit is copied into the store),
// one host tunes a key at a time under the tier's lock (the others wait for its entry), and what
// is tuned is written there too.
TunedConfig obtain_tuned(SqliteStore* store, TunedEntryInfo entry,
                         const std::function<TunedConfig()>& tune, RemoteStore* remote = nullptr);

// The configuration stored under `key` in the writable store, else in the first read-only store
// that serves `scope` (a package's op namespace; Cache::add_read_only_path), or nothing.
std::optional<TunedConfig> find_tuned(const Cache& cache, const std::string& scope,
                                      const std::string& key);

// find_tuned, then the remote tier; else, when `tune` is given, obtain_tuned on the writable
// store (tuning without keeping the result when there is none), else nothing.
std::optional<TunedConfig> obtain_tuned(const Cache& cache, const std::string& scope,
                                        TunedEntryInfo entry,
                                        const std::function<TunedConfig()>& tune,
                                        RemoteStore* remote = nullptr);

// A tuned configuration as a remote-tier entry (kind "tuned"; Note [Remote blob] signs and
// checks it as any entry), and back: nothing for an entry of another kind or a damaged one.
StoredBinary tuned_binary(const TunedEntryInfo& entry);
std::optional<TunedEntryInfo> tuned_from_binary(const std::string& key, const StoredBinary& value);

// The digest that stands for an op's sources in its tuning key: the package's manifest and the
// programs (sources, headers, options) of the kernels the op launches. Throws what loading a
// program throws.
std::string op_source_digest(const Package& package, const OpSpec& op);

} // namespace kjit::detail
