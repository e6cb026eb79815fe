#include "runtime/tune/tuner.hpp"

#include "cache/sqlite_store.hpp"
#include "runtime/logging.hpp"
#include "runtime/util/hash.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <limits>

namespace kjit::detail {

std::vector<TuneValues> tune_candidates(const std::vector<std::vector<std::int64_t>>& lists) {
  std::vector<TuneValues> all{{}};
  for (const auto& list : lists) {
    std::vector<TuneValues> next;
    next.reserve(all.size() * list.size());
    for (const auto& prefix : all) {
      for (const std::int64_t value : list) {
        TuneValues extended = prefix;
        extended.push_back(value);
        next.push_back(std::move(extended));
      }
    }
    all = std::move(next);
  }
  return all;
}

TunedConfig run_tuner(const std::vector<std::string>& names,
                      const std::vector<TuneValues>& candidates, const TuneValues& fallback,
                      const TuneHooks& hooks, double budget_s) {
  TunedConfig config;
  config.names = names;
  const double start = hooks.now_s();
  // The default first: the choice is never slower than it, also when the budget stops early.
  std::vector<TuneValues> order;
  if (std::find(candidates.begin(), candidates.end(), fallback) != candidates.end()) {
    order.push_back(fallback);
  }
  for (const auto& c : candidates) {
    if (c != fallback) {
      order.push_back(c);
    }
  }
  double best_ms = std::numeric_limits<double>::infinity();
  for (const auto& values : order) {
    if (hooks.valid && !hooks.valid(values)) {
      ++config.pruned;
      continue;
    }
    if (!config.timings.empty() && hooks.now_s() - start >= budget_s) {
      config.budget_exhausted = true;
      break;
    }
    TuneTiming timing{values, std::numeric_limits<double>::infinity(), {}};
    try {
      timing.ms = hooks.time_ms(values);
    } catch (const std::exception& e) {
      timing.error = e.what();
    }
    if (timing.ms < best_ms) {
      best_ms = timing.ms;
      config.best = values;
    }
    config.timings.push_back(std::move(timing));
  }
  if (config.best.empty()) {
    config.best = fallback; // every candidate failed (or was pruned): the default stands
  }
  config.seconds = hooks.now_s() - start;
  return config;
}

std::string tune_key(const TuneKeyInputs& in) {
  Hasher hasher;
  hasher.field("tune_key", 1)
    .field("package", in.package)
    .field("package_digest", in.package_digest)
    .field("op", in.op)
    .field("device", in.device);
  for (const auto& [name, values] : in.candidates) {
    hasher.field("param", name);
    for (const std::int64_t v : values) {
      hasher.field("value", v);
    }
  }
  for (const auto& dtype : in.dtypes) {
    hasher.field("dtype", dtype);
  }
  for (const std::int64_t b : in.bucket) {
    hasher.field("bucket", b);
  }
  return to_hex(hasher.digest());
}

TunedConfig obtain_tuned(SqliteStore* store, TunedEntryInfo entry,
                         const std::function<TunedConfig()>& tune) {
  if (store == nullptr) {
    return tune();
  }
  if (auto found = store->get_tuned(entry.key)) {
    return found->config;
  }
  // One process tunes a key at a time: the others wait here, then find its result.
  const std::uint64_t id = std::stoull(entry.key.substr(16), nullptr, 16);
  LockGuard guard = store->lock_key(id);
  if (auto found = store->get_tuned(entry.key)) {
    log(LogLevel::debug, "tuned configuration {} found after waiting for its tuner", entry.key);
    return found->config;
  }
  entry.config = tune();
  log(LogLevel::info, "tuned {} for {} ({}) in {:.2f} s: {} of {} candidates timed{}", entry.op,
      entry.bucket, entry.device, entry.config.seconds, entry.config.timings.size(),
      entry.config.timings.size() + entry.config.pruned,
      entry.config.budget_exhausted ? ", the time budget spent" : "");
  store->put_tuned(entry);
  return entry.config;
}

} // namespace kjit::detail
