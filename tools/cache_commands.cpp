// kjit cache ...: statistics, listings (by package, op, arch), verification, removal, and why a
// lookup misses.
#include "tools/cli.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iostream>

using nlohmann::json;

namespace kjit_cli {

int run_cache_stats(kjit::Runtime& runtime, bool as_json) {
  kjit::Cache& cache = runtime.cache();
  const auto stats = cache.stats();
  if (as_json) {
    std::cout << json{{"path", cache.path().string()},
                      {"read_only", cache.read_only()},
                      {"enabled", cache.enabled()},
                      {"stats", stats_json(stats)}}
                   .dump(2)
              << "\n";
    return 0;
  }
  if (!cache.enabled()) {
    std::cout << "kernel cache: disabled\n";
    return 0;
  }
  const double saved_ms = stats.compiles > 0
                            ? stats.compile_ms / static_cast<double>(stats.compiles) *
                                static_cast<double>(stats.store_hits)
                            : 0;
  std::cout << fmt::format("kernel cache   {}{}\n", cache.path().string(),
                           cache.read_only() ? " (read-only)" : "")
            << fmt::format("entries        {} ({})\n", stats.entries, size_text(stats.size_bytes))
            << fmt::format("store hits     {}\n", stats.store_hits)
            << fmt::format("store misses   {}\n", stats.store_misses)
            << fmt::format("memory hits    {}\n", stats.memory_hits)
            << fmt::format("compiles       {} ({:.1f} s of NVRTC)\n", stats.compiles,
                           stats.compile_ms / 1000)
            << fmt::format("time saved     ~{:.1f} s (hits x mean compile time)\n", saved_ms / 1000)
            << fmt::format("corrupt        {}\n", stats.corrupt)
            << fmt::format("evictions      {}\n", stats.evictions);
  const auto& r = stats.remote;
  if (runtime.remote_cache() || r.hits + r.misses + r.errors + r.timeouts + r.writes > 0) {
    std::cout << fmt::format("remote         {}\n",
                             runtime.remote_cache().value_or("(not set now)"))
              << fmt::format("remote hits    {} ({}, ~{:.1f} s of compiles saved)\n", r.hits,
                             size_text(r.bytes_read), r.saved_ms / 1000)
              << fmt::format("remote misses  {} ({} waited for another host)\n", r.misses,
                             r.lock_waits)
              << fmt::format("remote writes  {} ({}), {} dropped\n", r.writes,
                             size_text(r.bytes_written), r.dropped)
              << fmt::format("remote faults  {} errors, {} timeouts, {} bad entries deleted\n",
                             r.errors, r.timeouts, r.bad_entries);
  }
  return 0;
}

namespace {

std::string joined(const std::vector<std::string>& items, const char* separator = ", ") {
  std::string text;
  for (const auto& item : items) {
    text += (text.empty() ? "" : separator) + item;
  }
  return text;
}

// What an entry is: its package, kernel and specialization where recorded, else its program.
std::string entry_label(const kjit::CacheEntryInfo& e) {
  if (!e.package.empty()) {
    return fmt::format("{} {} {}", e.package, e.package_version,
                       e.specialization.empty() ? e.kernel : e.specialization);
  }
  return e.kernels.empty() ? e.name : e.name + " " + e.kernels.front();
}

} // namespace

int run_cache_ls(kjit::Runtime& runtime, const kjit::EntryFilter& filter, bool as_json) {
  std::vector<kjit::CacheEntryInfo> entries;
  std::size_t in_read_only = 0;
  for (auto& e : runtime.cache().entries()) {
    if (filter.matches(e)) {
      entries.push_back(std::move(e));
    }
  }
  for (auto& e : runtime.cache().read_only_entries()) {
    if (filter.matches(e)) {
      entries.push_back(std::move(e));
      ++in_read_only;
    }
  }
  std::vector<kjit::TunedEntryInfo> tuned;
  for (auto& t : runtime.cache().tuned_entries()) {
    if (filter.matches(t)) {
      tuned.push_back(std::move(t));
    }
  }
  if (as_json) {
    json list = json::array();
    for (const auto& t : tuned) {
      json timings = json::array();
      for (const auto& timing : t.config.timings) {
        timings.push_back({{"values", timing.values},
                           {"ms", std::isinf(timing.ms) ? json(nullptr) : json(timing.ms)},
                           {"error", timing.error}});
      }
      list.push_back({{"key", t.key},
                      {"kind", "tuned"},
                      {"store", t.store.empty() ? json(nullptr) : json(t.store)},
                      {"op", t.op},
                      {"bucket", t.bucket},
                      {"device", t.device},
                      {"parameters", t.config.names},
                      {"best", t.config.best},
                      {"timings", timings},
                      {"pruned", t.config.pruned},
                      {"budget_exhausted", t.config.budget_exhausted},
                      {"seconds", t.config.seconds},
                      {"created", t.created}});
    }
    for (const auto& e : entries) {
      list.push_back(
        {{"key", e.key},
         {"store", e.store.empty() ? json(nullptr) : json(e.store)},
         {"name", e.name},
         {"kernels", e.kernels},
         {"package", e.package.empty() ? json(nullptr) : json(e.package)},
         {"version", e.package.empty() ? json(nullptr) : json(e.package_version)},
         {"kernel", e.package.empty() ? json(nullptr) : json(e.kernel)},
         {"ops", e.ops},
         {"specialization", e.package.empty() ? json(nullptr) : json(e.specialization)},
         {"kind", e.kind},
         {"arch", e.arch},
         {"size", e.size},
         {"nvrtc", e.nvrtc_version},
         {"driver", e.driver_version},
         {"options", e.options},
         {"compile_ms", e.compile_ms},
         {"created", e.created},
         {"last_used", e.last_used},
         {"hits", e.hits}});
    }
    std::cout << list.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("{:<12} {:<52} {:<11} {:>10} {:<16} {:>5}\n", "key", "kernel", "arch",
                           "size", "last used", "hits");
  std::string store;
  for (const auto& e : entries) {
    if (e.store != store) {
      store = e.store;
      std::cout << fmt::format("read-only store {}:\n", store);
    }
    std::string label = entry_label(e);
    if (label.size() > 52) {
      label = label.substr(0, 51) + "~";
    }
    std::cout << fmt::format("{:<12} {:<52} {:<11} {:>10} {:<16} {:>5}\n", e.key.substr(0, 12),
                             label, e.arch, size_text(e.size), human_time(e.last_used), e.hits);
  }
  if (!tuned.empty()) {
    std::cout << "tuned configurations:\n";
  }
  for (const auto& t : tuned) {
    std::string best;
    for (std::size_t i = 0; i < t.config.names.size() && i < t.config.best.size(); ++i) {
      best += fmt::format("{}{}={}", best.empty() ? "" : " ", t.config.names[i], t.config.best[i]);
    }
    double best_ms = 0;
    for (const auto& timing : t.config.timings) {
      best_ms = timing.values == t.config.best ? timing.ms : best_ms;
    }
    std::cout << fmt::format("{:<12} {} [{}] on {}: {} ({:.4f} ms; {} timed, {} pruned, {:.2f} s "
                             "to tune){}\n",
                             t.key.substr(0, 12), t.op, t.bucket, t.device, best, best_ms,
                             t.config.timings.size(), t.config.pruned, t.config.seconds,
                             t.store.empty() ? "" : " in " + t.store);
  }
  std::cout << fmt::format(
    "{} entries{}{}\n", entries.size(),
    in_read_only == 0 ? std::string() : fmt::format(" ({} in read-only stores)", in_read_only),
    filter.empty() ? "" : " matching");
  return 0;
}

int run_cache_rm(kjit::Runtime& runtime, const std::vector<std::string>& keys,
                 kjit::EntryFilter filter) {
  if (keys.empty() && filter.empty()) {
    throw UsageError("name what to remove: keys (or key prefixes), or --package, --version, "
                     "--op, --arch");
  }
  if (!filter.version.empty() && filter.package.empty()) {
    throw UsageError("--version needs --package");
  }
  std::uint64_t removed = 0;
  if (keys.empty()) {
    removed = runtime.cache().remove(filter);
  }
  for (const auto& key : keys) {
    if (key.size() < 4 || key.find_first_not_of("0123456789abcdef") != std::string::npos) {
      throw UsageError(fmt::format("'{}' is not a key or key prefix (4 to 32 hex digits, as kjit "
                                   "cache ls shows)",
                                   key));
    }
    kjit::EntryFilter one = filter;
    one.key = key;
    removed += runtime.cache().remove(one);
  }
  std::cout << fmt::format("removed {} entries from {}\n", removed,
                           runtime.cache().path().string());
  return 0;
}

int run_cache_why(const WhyArgs& args) {
  const auto search = kjit::package_search_path(builtin_package_dirs());
  const kjit::Package package = kjit::Package::load(kjit::find_package(args.package, search));
  if (!args.op.empty() &&
      std::none_of(package.ops().begin(), package.ops().end(),
                   [&](const kjit::OpDecl& op) { return op.name == args.op; })) {
    std::vector<std::string> names;
    for (const auto& op : package.ops()) {
      names.push_back(op.name);
    }
    throw UsageError(fmt::format("package '{}' has no op '{}' (its ops: {})", package.name(),
                                 args.op, joined(names)));
  }
  kjit::RuntimeOptions options;
  options.driver_version = args.driver_version;
  kjit::Runtime runtime(options);
  std::vector<kjit::Target> targets;
  if (!args.arch.empty()) {
    for (const auto& arch : kjit::Arch::parse_list(args.arch)) {
      targets.push_back(kjit::Target{arch});
    }
  } else if (kjit::device_count() > 0) {
    targets.push_back(runtime.default_target());
  } else {
    targets.push_back(kjit::Target{kjit::Arch::parse("sm_90")});
  }
  json items = json::array();
  std::size_t hits = 0;
  std::size_t total = 0;
  if (!args.as_json) {
    std::cout << fmt::format(
      "{} {} for {} (NVRTC {}.{}, driver version {}):\n", package.name(), package.version(),
      [&] {
        std::vector<std::string> names;
        for (const auto& t : targets) {
          names.push_back(t.name());
        }
        return joined(names);
      }(),
      kjit::nvrtc_version().first, kjit::nvrtc_version().second, runtime.driver_version());
  }
  for (const auto& item : package.warm_list(/*every_launch=*/true)) {
    if (!args.op.empty() && item.op != args.op) {
      continue;
    }
    for (const auto& target : targets) {
      const kjit::LookupExplanation why = runtime.explain(item.program, target);
      ++total;
      hits += why.hit ? 1 : 0;
      if (args.as_json) {
        items.push_back({{"op", item.op},
                         {"launch", item.launch},
                         {"kernel", item.kernel},
                         {"target", target.name()},
                         {"key", why.key},
                         {"hit", why.hit},
                         {"store", why.store.empty() ? json(nullptr) : json(why.store)},
                         {"candidates", why.candidates},
                         {"nearest", why.nearest.empty() ? json(nullptr) : json(why.nearest)},
                         {"recorded", why.recorded},
                         {"differences", why.differences}});
        continue;
      }
      std::cout << fmt::format("  {} launch {} {} for {}: ", item.op, item.launch, item.kernel,
                               target.name());
      if (why.hit) {
        std::cout << fmt::format("hit (key {}, {})\n", why.key.substr(0, 12), why.store);
      } else if (why.nearest.empty()) {
        std::cout << fmt::format("miss: no entry of {} in the stores (never compiled with this "
                                 "store, or removed)\n",
                                 item.program.name());
      } else {
        std::cout << fmt::format("miss: the nearest of {} entries of {} is {} ({}):\n",
                                 why.candidates, item.program.name(), why.nearest.substr(0, 12),
                                 why.store);
        for (const auto& difference : why.differences) {
          std::cout << "      " << difference << "\n";
        }
        if (!why.recorded) {
          std::cout << "      (made by an older kjit: its sources and headers were not "
                       "recorded, only arch, versions and options compared)\n";
        } else if (why.differences.empty()) {
          std::cout << "      every recorded input agrees (another kjit's key?)\n";
        }
      }
    }
  }
  const auto gaps = package.warm_gaps();
  if (args.as_json) {
    json gap_list = json::array();
    for (const auto& gap : gaps) {
      if (args.op.empty() || gap.op == args.op) {
        gap_list.push_back({{"op", gap.op}, {"kernel", gap.kernel}, {"fix", gap.fix}});
      }
    }
    std::cout << json{{"package", package.name()},
                      {"version", package.version()},
                      {"lookups", items},
                      {"not_explained", gap_list}}
                   .dump(2)
              << "\n";
    return 0;
  }
  for (const auto& gap : gaps) {
    if (args.op.empty() || gap.op == args.op) {
      std::cout << fmt::format("  {} kernel '{}': not explained, no warm values; {}\n", gap.op,
                               gap.kernel, gap.fix);
    }
  }
  std::cout << fmt::format("{} of {} lookups hit\n", hits, total);
  return 0;
}

int run_cache_verify(kjit::Runtime& runtime, bool fix, bool as_json) {
  const kjit::VerifyReport report = runtime.cache().verify(fix);
  if (as_json) {
    std::cout << json{{"checked", report.checked},         {"bad_entries", report.bad_entries},
                      {"integrity", report.integrity},     {"removed", report.removed},
                      {"moved_aside", report.moved_aside}, {"ok", report.ok()}}
                   .dump(2)
              << "\n";
  } else {
    std::cout << fmt::format("checked {} entries of {}\n", report.checked,
                             runtime.cache().path().string());
    for (const auto& key : report.bad_entries) {
      std::cout << "bad checksum: " << key << (fix ? " (removed)" : "") << "\n";
    }
    for (const auto& line : report.integrity) {
      std::cout << "integrity: " << line << "\n";
    }
    for (const auto& file : report.moved_aside) {
      std::cout << "the store was not a valid database: moved it to '" << file
                << "' and started an empty one\n";
    }
    std::cout << (report.ok() ? "ok\n"
                  : fix && report.integrity.empty()
                    ? fmt::format("{} bad entries removed\n", report.removed)
                    : fmt::format("{} bad entries{}\n", report.bad_entries.size(),
                                  fix || report.bad_entries.empty()
                                    ? ""
                                    : "; run 'kjit cache verify --fix' to remove them"));
  }
  // Exit 0 only for a store found sound: a repair (--fix, or a damaged file moved aside) is
  // reported as a failure, so scripts notice that entries were lost.
  return report.ok() ? 0 : 1;
}

} // namespace kjit_cli
