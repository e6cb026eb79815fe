#include "runtime/tune/tuner.hpp"

#include "cache/provenance.hpp"
#include "cache/remote/remote_store.hpp"
#include "cache/sqlite_store.hpp"
#include "runtime/logging.hpp"
#include "runtime/manifest/op_spec.hpp"
#include "runtime/util/file.hpp"
#include "runtime/util/hash.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>

namespace kjit::detail {
namespace {
constexpr double k_default_margin = 0.99;
} // namespace

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
  // The default first (also when it is not among the candidates: its value is an expression
  // of the arguments), so that the budget never stops the tuner before it.
  std::vector<TuneValues> order{fallback};
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
    // Another candidate displaces the default only when it is faster by more than the noise
    // of a measurement (k_default_margin): a tie keeps the rule the package chose.
    const double bar = config.best == fallback ? best_ms * k_default_margin : best_ms;
    if (timing.ms < bar) {
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

StoredBinary tuned_binary(const TunedEntryInfo& entry) {
  StoredBinary value;
  value.kind = "tuned";
  value.arch = entry.device;
  value.name = entry.op;
  value.options = entry.bucket;
  value.blob = encode_tuned(entry.config);
  return value;
}

std::optional<TunedEntryInfo> tuned_from_binary(const std::string& key, const StoredBinary& value) {
  if (value.kind != "tuned") {
    return std::nullopt;
  }
  TunedEntryInfo entry{key, value.name, value.options, value.arch, decode_tuned(value.blob), 0, {}};
  if (entry.config.best.empty() || entry.config.best.size() != entry.config.names.size()) {
    return std::nullopt; // damaged
  }
  entry.created = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  return entry;
}

namespace {

// The remote tier's entry of `key`, copied into the writable store.
std::optional<TunedConfig> from_remote(RemoteStore& remote, SqliteStore* store,
                                       const std::string& key, bool wait) {
  StoredBinary value;
  if ((wait ? remote.wait_for(key, value) : remote.get(key, value)) != RemoteStore::Result::hit) {
    return std::nullopt;
  }
  auto entry = tuned_from_binary(key, value);
  if (!entry) {
    return std::nullopt;
  }
  if (store != nullptr && !store->read_only()) {
    store->put_tuned(*entry);
  }
  log(LogLevel::debug, "tuned configuration {} ({} for {}) from the remote cache", key, entry->op,
      entry->bucket);
  return std::move(entry->config);
}

} // namespace

TunedConfig obtain_tuned(SqliteStore* store, TunedEntryInfo entry,
                         const std::function<TunedConfig()>& tune, RemoteStore* remote) {
  if (store != nullptr) {
    if (auto found = store->get_tuned(entry.key)) {
      return found->config;
    }
  }
  if (remote != nullptr) {
    if (auto found = from_remote(*remote, store, entry.key, false)) {
      return std::move(*found);
    }
  }
  // One process tunes a key at a time: the others wait here, then find its result.
  std::optional<LockGuard> guard;
  if (store != nullptr) {
    const std::uint64_t id = std::stoull(entry.key.substr(16), nullptr, 16);
    guard.emplace(store->lock_key(id));
    if (auto found = store->get_tuned(entry.key)) {
      log(LogLevel::debug, "tuned configuration {} found after waiting for its tuner", entry.key);
      return found->config;
    }
  }
  // One host of the fleet tunes a key at a time: the others wait for its entry.
  std::string token;
  if (remote != nullptr && !remote->config().read_only) {
    switch (remote->lock(entry.key, token)) {
    case RemoteStore::Lock::acquired:
      break;
    case RemoteStore::Lock::held_by_other:
      log(LogLevel::info, "{} for {} is being tuned by another host: waiting", entry.op,
          entry.bucket);
      if (auto found = from_remote(*remote, store, entry.key, true)) {
        return std::move(*found);
      }
      break;
    case RemoteStore::Lock::unavailable:
      break;
    }
  }
  try {
    entry.config = tune();
  } catch (...) {
    if (!token.empty()) {
      remote->unlock(entry.key, token);
    }
    throw;
  }
  log(LogLevel::info, "tuned {} for {} ({}) in {:.2f} s: {} of {} candidates timed{}", entry.op,
      entry.bucket, entry.device, entry.config.seconds, entry.config.timings.size(),
      entry.config.timings.size() + entry.config.pruned,
      entry.config.budget_exhausted ? ", the time budget spent" : "");
  if (store != nullptr) {
    store->put_tuned(entry);
  }
  if (remote != nullptr && !remote->config().read_only) {
    remote->put(entry.key, tuned_binary(entry), token);
  }
  return entry.config;
}

std::optional<TunedConfig> find_tuned(const Cache& cache, const std::string& scope,
                                      const std::string& key) {
  if (SqliteStore* store = cache.store()) {
    if (auto found = store->get_tuned(key)) {
      return std::move(found->config);
    }
  }
  for (const auto& read_only : cache.read_only_stores()) {
    if (read_only.serves(scope)) {
      if (auto found = read_only.store->get_tuned(key)) {
        return std::move(found->config);
      }
    }
  }
  return std::nullopt;
}

std::optional<TunedConfig> obtain_tuned(const Cache& cache, const std::string& scope,
                                        TunedEntryInfo entry,
                                        const std::function<TunedConfig()>& tune,
                                        RemoteStore* remote) {
  if (auto found = find_tuned(cache, scope, entry.key)) {
    return found;
  }
  SqliteStore* store = cache.store();
  SqliteStore* writable = store != nullptr && !store->read_only() ? store : nullptr;
  if (!tune) {
    return remote != nullptr ? from_remote(*remote, writable, entry.key, false) : std::nullopt;
  }
  return obtain_tuned(writable, std::move(entry), tune, remote);
}

std::string op_source_digest(const Package& package, const OpSpec& op) {
  Hasher hasher;
  hasher.field("op_source", 1)
    .field("manifest", read_file(package.manifest()).value_or(std::string()));
  std::vector<std::size_t> seen;
  for (const auto& launch : op.launches) {
    if (std::find(seen.begin(), seen.end(), launch.kernel) != seen.end()) {
      continue;
    }
    seen.push_back(launch.kernel);
    const KernelDecl& kernel = package.kernels().at(launch.kernel);
    const Program program = Program::from_file(
      kernel.source, CompileOptions{kernel.options, kernel.include_dirs, {}, package.scope()});
    const auto digest = program.digest();
    hasher.field("kernel", kernel.name).field("program", Digest(digest));
  }
  return to_hex(hasher.digest());
}

} // namespace kjit::detail
