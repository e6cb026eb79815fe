// The kjit command: pre-warm kernel caches and manage them. A thin shell over the library.
//
//   kjit warm [PACKAGE|PATH ...] [--arch sm_80,sm_90] [--driver-version V] [-j N] [--remote URL]
//   kjit cache stats|ls|verify [--fix]|prune|clear|export FILE|import FILE|push|pull [--json]
//   kjit info [--json]
//   kjit compile FILE --arch sm_90 [-o OUT] [--ptx] [--option OPT ...]
//   kjit new NAME [DIR]
//
// Exit codes: 0 success, 1 the work failed, 2 usage errors. Over 600 lines: one file per command
// would hold a screen each; they share the option parsing and the JSON/text printers.
#include <kjit/kjit.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <unistd.h>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Usage errors (exit 2) found after parsing.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

fs::path executable_dir() {
  std::error_code ec;
  const auto self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : self.parent_path();
}

// Where the packages shipped with kjit are: an installed tree (bin/../share/kjit/kernels), the
// Python package (kjit/bin/kjit -> kjit/kernels), `KJIT_BUILTIN_PACKAGES`, or the source tree of
// this build.
std::vector<fs::path> builtin_package_dirs() {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("KJIT_BUILTIN_PACKAGES"); env != nullptr && *env != '\0') {
    dirs.emplace_back(env);
  }
  const fs::path exe = executable_dir();
  std::error_code ec;
  for (const auto& candidate : {exe / ".." / "share" / "kjit" / "kernels", exe / ".." / "kernels",
                                fs::path(KJIT_SOURCE_KERNELS)}) {
    if (fs::is_directory(candidate, ec)) {
      dirs.push_back(fs::weakly_canonical(candidate, ec));
      break;
    }
  }
  return dirs;
}

std::string human_time(std::int64_t unix_seconds) {
  if (unix_seconds <= 0) {
    return "-";
  }
  const std::time_t t = unix_seconds;
  std::tm tm{};
  localtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M", &tm);
  return text;
}

std::string size_text(std::uint64_t bytes) {
  if (bytes < 1024) {
    return fmt::format("{} B", bytes);
  }
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, units[unit]);
}

// "30d", "12h", "45m", "90s" or plain seconds.
std::optional<std::int64_t> parse_duration(const std::string& text) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const std::string unit = text.substr(used);
  const std::int64_t scale = unit.empty() || unit == "s" ? 1
                             : unit == "m"               ? 60
                             : unit == "h"               ? 3600
                             : unit == "d"               ? 86400
                             : unit == "w"               ? 7 * 86400
                                                         : 0;
  std::int64_t seconds = 0;
  if (scale == 0 || value < 0 || __builtin_mul_overflow(value, scale, &seconds)) {
    return std::nullopt;
  }
  return seconds;
}

json stats_json(const kjit::CacheStats& s) {
  return {{"memory_hits", s.memory_hits},
          {"memory_misses", s.memory_misses},
          {"store_hits", s.store_hits},
          {"store_misses", s.store_misses},
          {"compiles", s.compiles},
          {"compile_ms", s.compile_ms},
          {"corrupt", s.corrupt},
          {"evictions", s.evictions},
          {"entries", s.entries},
          {"size_bytes", s.size_bytes},
          {"remote",
           {{"hits", s.remote.hits},
            {"misses", s.remote.misses},
            {"errors", s.remote.errors},
            {"timeouts", s.remote.timeouts},
            {"bad_entries", s.remote.bad_entries},
            {"writes", s.remote.writes},
            {"dropped", s.remote.dropped},
            {"lock_waits", s.remote.lock_waits},
            {"bytes_read", s.remote.bytes_read},
            {"bytes_written", s.remote.bytes_written},
            {"saved_ms", s.remote.saved_ms}}}};
}

// ---- warm -----------------------------------------------------------------------------------

struct WarmArgs {
  std::vector<std::string> packages;
  std::string arch;
  std::optional<int> driver_version;
  unsigned jobs = 0;
  std::optional<std::string> remote;
};

std::vector<kjit::Target> warm_targets(const std::string& arch_list) {
  std::vector<kjit::Target> targets;
  if (!arch_list.empty()) {
    for (const auto& arch : kjit::Arch::parse_list(arch_list)) {
      targets.push_back(kjit::Target{arch});
    }
    return targets;
  }
  const int devices = kjit::device_count();
  if (devices == 0) {
    throw UsageError("no GPU found to take the archs from: name them, e.g. --arch sm_80,sm_90");
  }
  for (int d = 0; d < devices; ++d) {
    const kjit::Target target = kjit::target_for_device(kjit::device_info(d).arch);
    if (std::find(targets.begin(), targets.end(), target) == targets.end()) {
      targets.push_back(target);
    }
  }
  std::string names;
  for (const auto& t : targets) {
    names += (names.empty() ? "" : ", ") + t.name();
  }
  std::cout << "no --arch given: using the detected GPUs' " << names << "\n";
  return targets;
}

int run_warm(const WarmArgs& args) {
  const auto search = kjit::package_search_path(builtin_package_dirs());
  std::vector<fs::path> dirs;
  if (args.packages.empty()) {
    dirs = kjit::find_packages(search);
    if (dirs.empty()) {
      throw kjit::Error("no kernel packages on the search path; name packages or set KJIT_PATH");
    }
  } else {
    for (const auto& name : args.packages) {
      dirs.push_back(kjit::find_package(name, search));
    }
  }
  const auto targets = warm_targets(args.arch);
  // A package that does not load is reported and skipped: the others are still warmed, and
  // the exit code says something failed.
  std::vector<kjit::Package> packages;
  std::size_t broken = 0;
  for (const auto& dir : dirs) {
    try {
      packages.push_back(kjit::Package::load(dir));
    } catch (const kjit::Error& e) {
      std::cerr << fmt::format("kjit: skipping the package at {}: {}\n", dir.string(), e.what());
      ++broken;
    }
  }
  if (packages.empty()) {
    throw kjit::Error(fmt::format("none of the {} package(s) loads", dirs.size()));
  }
  // Kernels that cannot be pre-compiled (a placeholder without warm values) would compile at
  // first use: said, with the fix, and the exit code says the store is not complete.
  std::size_t gaps = 0;
  for (const auto& package : packages) {
    for (const auto& gap : package.warm_gaps()) {
      std::string needs;
      for (const auto& n : gap.needs) {
        needs += (needs.empty() ? "" : ", ") + n;
      }
      std::cerr << fmt::format("kjit: cannot warm {}/{} kernel '{}': no warm values for {}; {}\n",
                               package.name(), gap.op, gap.kernel, needs, gap.fix);
      ++gaps;
    }
  }
  kjit::RuntimeOptions options;
  options.driver_version = args.driver_version;
  options.remote_cache = args.remote;
  kjit::Runtime runtime(options);

  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  kjit::WarmOptions warm_options;
  warm_options.targets = targets;
  warm_options.jobs = args.jobs;
  warm_options.processes = options; // worker processes: they scale further than threads
  warm_options.on_result = [&](const kjit::WarmResult& r, std::size_t done, std::size_t total) {
    const std::string what = fmt::format("{}/{} {} for {}", r.job->package, r.job->op,
                                         r.job->kernel, r.job->target.name());
    const char* outcome = !r.ok ? "FAILED" : r.cached ? "cached" : "compiled";
    if (tty) {
      constexpr int k_width = 30;
      const int filled = static_cast<int>(k_width * done / std::max<std::size_t>(total, 1));
      std::cout << fmt::format("\r\033[K[{}{}] {}/{} {} {}", std::string(filled, '#'),
                               std::string(k_width - filled, '.'), done, total, outcome, what)
                << std::flush;
      if (!r.ok || done == total) {
        std::cout << "\n";
      }
    } else {
      std::cout << fmt::format("[{}/{}] {} {} ({:.0f} ms)\n", done, total, outcome, what, r.ms);
    }
  };
  std::cout << fmt::format("warming {} package(s) for {} target(s), cache {}{}\n", packages.size(),
                           targets.size(),
                           runtime.cache().enabled() ? runtime.cache().path().string() : "disabled",
                           runtime.remote_cache() ? " and remote " + *runtime.remote_cache() : "");
  const kjit::WarmSummary summary = kjit::warm(runtime, packages, warm_options);
  for (const auto& failure : summary.failures) {
    std::cerr << fmt::format("\nfailed: {}/{} {} for {}:\n{}\n", failure.job->package,
                             failure.job->op, failure.job->kernel, failure.job->target.name(),
                             failure.error);
  }
  std::cout << fmt::format("{} compiled, {} already cached, {} failed, in {:.2f} s ({} jobs)\n",
                           summary.compiled, summary.cached, summary.failed, summary.seconds,
                           summary.jobs);
  if (broken > 0) {
    std::cerr << fmt::format("kjit: {} package(s) skipped: they do not load\n", broken);
  }
  if (gaps > 0) {
    std::cerr << fmt::format("kjit: {} kernel(s) not warmed: they will compile at first use\n",
                             gaps);
  }
  return summary.failed == 0 && broken == 0 && gaps == 0 ? 0 : 1;
}

// ---- check ----------------------------------------------------------------------------------

int run_check(const std::vector<std::string>& names, const std::string& arch) {
  if (names.empty()) {
    throw UsageError("name the packages to check (a name or a folder)");
  }
  const auto search = kjit::package_search_path(builtin_package_dirs());
  std::vector<kjit::Target> targets;
  for (const auto& a : kjit::Arch::parse_list(arch.empty() ? "sm_90" : arch)) {
    targets.push_back(kjit::Target{a});
  }
  kjit::Runtime runtime;
  bool ok = true;
  for (const auto& name : names) {
    const kjit::Package package = kjit::Package::load(kjit::find_package(name, search));
    const kjit::CheckReport report = kjit::check_package(runtime, package, targets);
    for (const auto& p : report.problems) {
      std::cerr << fmt::format("kjit: {}/{} {} for {}: {}\n", package.name(), p.op, p.kernel,
                               p.target, p.what);
    }
    for (const auto& gap : report.gaps) {
      std::cerr << fmt::format("kjit: {}/{} kernel '{}' not checked: no warm values; {}\n",
                               package.name(), gap.op, gap.kernel, gap.fix);
    }
    std::cout << fmt::format(
      "{} {}: {} launch(es) checked against their kernels' parameters, {} "
      "problem(s){}{}\n",
      package.name(), package.version(), report.checked, report.problems.size(),
      report.unreadable > 0 ? fmt::format(", {} compiled only (PTX)", report.unreadable)
                            : std::string(),
      report.gaps.empty() ? std::string()
                          : fmt::format(", {} kernel(s) not checked", report.gaps.size()));
    ok = ok && report.problems.empty() && report.gaps.empty();
  }
  return ok ? 0 : 1;
}

// ---- cache ----------------------------------------------------------------------------------

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

int run_cache_ls(kjit::Runtime& runtime, bool as_json) {
  auto entries = runtime.cache().entries();
  const auto read_only = runtime.cache().read_only_entries();
  entries.insert(entries.end(), read_only.begin(), read_only.end());
  if (as_json) {
    json list = json::array();
    for (const auto& e : entries) {
      list.push_back({{"key", e.key},
                      {"store", e.store.empty() ? json(nullptr) : json(e.store)},
                      {"name", e.name},
                      {"kernels", e.kernels},
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
  std::cout << fmt::format("{:<12} {:<44} {:<11} {:>10} {:<16} {:>5}\n", "key", "kernel", "arch",
                           "size", "last used", "hits");
  std::string store;
  for (const auto& e : entries) {
    if (e.store != store) {
      store = e.store;
      std::cout << fmt::format("read-only store {}:\n", store);
    }
    std::string kernel = e.name;
    if (!e.kernels.empty()) {
      kernel += " " + e.kernels.front();
    }
    if (kernel.size() > 44) {
      kernel = kernel.substr(0, 43) + "~";
    }
    std::cout << fmt::format("{:<12} {:<44} {:<11} {:>10} {:<16} {:>5}\n", e.key.substr(0, 12),
                             kernel, e.arch, size_text(e.size), human_time(e.last_used), e.hits);
  }
  std::cout << fmt::format(
    "{} entries{}\n", entries.size(),
    read_only.empty() ? std::string() : fmt::format(" ({} in read-only stores)", read_only.size()));
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

// ---- info, compile, new ---------------------------------------------------------------------

int run_info(bool as_json) {
  kjit::Runtime runtime;
  const kjit::NvrtcInfo nvrtc = kjit::nvrtc_info();
  json devices = json::array();
  for (int d = 0; d < kjit::device_count(); ++d) {
    const auto info = kjit::device_info(d);
    devices.push_back({{"index", d},
                       {"name", info.name},
                       {"arch", info.arch.name()},
                       {"memory", info.total_memory},
                       {"target", nvrtc.found ? kjit::target_for_device(info.arch).name()
                                              : std::string("? (no NVRTC)")}});
  }
  const auto search = kjit::package_search_path(builtin_package_dirs());
  json packages = json::array();
  for (const auto& dir : kjit::find_packages(search)) {
    try {
      const auto package = kjit::Package::load(dir);
      packages.push_back(
        {{"name", package.name()}, {"version", package.version()}, {"path", dir.string()}});
    } catch (const kjit::Error& e) {
      packages.push_back({{"path", dir.string()}, {"error", e.what()}});
    }
  }
  json stores = json::array();
  if (runtime.cache().enabled()) {
    const auto stats = runtime.cache().stats();
    stores.push_back({{"path", runtime.cache().path().string()},
                      {"read_only", runtime.cache().read_only()},
                      {"entries", stats.entries},
                      {"size", stats.size_bytes}});
  }
  for (const auto& path : runtime.cache().read_only_paths()) {
    stores.push_back({{"path", path.string()}, {"read_only", true}});
  }
  json search_json = json::array();
  for (const auto& dir : search) {
    search_json.push_back(dir.string());
  }
  std::string driver = "none (libcuda.so.1 not found)";
  if (kjit::driver_available()) {
    driver = fmt::format("CUDA {}.{}", runtime.driver_version() / 1000,
                         runtime.driver_version() % 1000 / 10);
  }
  std::vector<std::string> archs;
  if (nvrtc.found) {
    for (const auto& arch : kjit::nvrtc_supported_archs()) {
      archs.push_back(arch.name());
    }
  }
  json nvrtc_json = {{"found", nvrtc.found},
                     {"library", nvrtc.library},
                     {"how", nvrtc.how},
                     {"include_dirs", nvrtc.include_dirs},
                     {"searched", nvrtc.searched}};
  if (!nvrtc.found) {
    nvrtc_json["error"] = nvrtc.error;
  }
  const json info = {{"kjit", std::string(kjit::version())},
                     {"nvrtc", nvrtc.found ? fmt::format("{}.{}", nvrtc.major, nvrtc.minor) : ""},
                     {"nvrtc_library", nvrtc_json},
                     {"nvrtc_archs", archs},
                     {"driver", driver},
                     {"devices", devices},
                     {"stores", stores},
                     {"package_search_path", search_json},
                     {"packages", packages}};
  if (as_json) {
    std::cout << info.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("kjit      {}\n", kjit::version());
  if (nvrtc.found) {
    std::cout << fmt::format("NVRTC     {}.{} ({} to {}) from {} ({})\n", nvrtc.major, nvrtc.minor,
                             archs.empty() ? "?" : archs.front(),
                             archs.empty() ? "?" : archs.back(), nvrtc.library, nvrtc.how);
    std::string headers = nvrtc.include_dirs.empty() ? "NVRTC's built-in only" : "";
    for (const auto& dir : nvrtc.include_dirs) {
      headers += (headers.empty() ? "" : ", ") + dir;
    }
    std::cout << fmt::format("headers   {}\n", headers);
  } else {
    std::cout << fmt::format("NVRTC     none: {}\n", nvrtc.error);
  }
  std::cout << fmt::format("driver    {}\n", driver);
  if (devices.empty()) {
    std::cout << "devices   none\n";
  }
  for (const auto& d : devices) {
    std::cout << fmt::format("device {}  {} ({}, {}), compiles for {}\n", d["index"].get<int>(),
                             d["name"].get<std::string>(), d["arch"].get<std::string>(),
                             size_text(d["memory"].get<std::uint64_t>()),
                             d["target"].get<std::string>());
  }
  if (stores.empty()) {
    std::cout << "cache     disabled\n";
  }
  for (const auto& s : stores) {
    std::cout << fmt::format("cache     {}{}", s["path"].get<std::string>(),
                             s["read_only"].get<bool>() ? " (read-only)" : "");
    if (s.contains("entries")) {
      std::cout << fmt::format(": {} entries, {}", s["entries"].get<std::uint64_t>(),
                               size_text(s["size"].get<std::uint64_t>()));
    }
    std::cout << "\n";
  }
  for (const auto& dir : search) {
    std::cout << "packages  " << dir.string() << "\n";
  }
  for (const auto& p : packages) {
    if (p.contains("error")) {
      std::cout << "  (broken) " << p["error"].get<std::string>() << "\n";
    } else {
      std::cout << fmt::format("  {} {}\n", p["name"].get<std::string>(),
                               p["version"].get<std::string>());
    }
  }
  return 0;
}

struct CompileArgs {
  std::string file;
  std::string arch;
  std::string output;
  bool ptx = false;
  std::vector<std::string> options;
  std::vector<std::string> include_dirs;
};

int run_compile(const CompileArgs& args) {
  kjit::CompileOptions options;
  options.options = args.options;
  for (const auto& dir : args.include_dirs) {
    options.include_dirs.emplace_back(dir);
  }
  const auto program = kjit::Program::from_file(args.file, options);
  const kjit::Target target{kjit::Arch::parse(args.arch),
                            args.ptx ? kjit::OutputKind::ptx : kjit::OutputKind::cubin};
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  const kjit::Binary binary = runtime.compile(program, target);
  fs::path out = args.output;
  if (out.empty()) {
    out = fs::path(args.file).filename();
    out.replace_extension(args.ptx ? ".ptx" : ".cubin");
  }
  std::ofstream file(out, std::ios::binary);
  file.write(binary.data.data(), static_cast<std::streamsize>(binary.data.size()));
  if (!file) {
    throw kjit::Error(fmt::format("cannot write '{}'", out.string()));
  }
  if (!binary.log.empty()) {
    std::cerr << binary.log << "\n";
  }
  std::cout << fmt::format("{}: {} for {}, {} bytes, {:.1f} ms\n", out.string(),
                           args.ptx ? "PTX" : "cubin", target.name(), binary.data.size(),
                           binary.compile_ms);
  return 0;
}

int run_new(const std::string& name, const std::string& dir_arg) {
  const bool identifier =
    !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
    std::all_of(name.begin(), name.end(),
                [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  if (!identifier) {
    throw UsageError(
      fmt::format("'{}' is not a valid package name: use letters, digits and _", name));
  }
  const fs::path dir = dir_arg.empty() ? fs::path(name) : fs::path(dir_arg);
  std::error_code ec;
  if (fs::exists(dir / "kernel.toml", ec)) {
    throw kjit::Error(fmt::format("'{}' already holds a kernel package", dir.string()));
  }
  fs::create_directories(dir, ec);
  if (ec) {
    throw kjit::Error(fmt::format("cannot create '{}': {}", dir.string(), ec.message()));
  }
  auto write = [&](const std::string& file, const std::string& text) {
    std::ofstream out(dir / file);
    out << text;
    if (!out) {
      throw kjit::Error(fmt::format("cannot write '{}'", (dir / file).string()));
    }
  };
  write("kernel.toml", fmt::format(R"~([package]
name = "{0}"
version = "0.1.0"
description = "y = a * x + b, elementwise (a kjit kernel package)"

[kernel.{0}]
source = "{0}.cu"
entry = "{0}_kernel<{{T}}>"

[op.{0}]
schema = "{0}(Tensor x, float a, float b) -> Tensor"
doc = "a * x + b for float32 tensors"
kernel = "{0}"
checks = ["x.dtype == float32 || x.dtype == float64", "x.is_contiguous()"]
outputs = [{{ like = "x" }}]
args = ["out0", "x", "a", "b", "x.numel()"]
grid = ["cdiv(x.numel(), 256)"]
block = [256]
specialize = {{ T = "x.dtype" }}
warm = {{ T = ["float32", "float64"] }}
cpu = "{0}_cpu"
)~",
                                   name));
  write(name + ".cu", fmt::format(R"~(// y = a * x + b, one thread per element.
template <typename T>
__global__ void {0}_kernel(T* __restrict__ y, const T* __restrict__ x, float a, float b,
                           long long n) {{
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {{
    y[i] = static_cast<T>(a) * x[i] + static_cast<T>(b);
  }}
}}
)~",
                                  name));
  write("__init__.py", fmt::format(R"~("""CPU kernel of the {0} package."""

import torch


def {0}_cpu(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    return a * x + b
)~",
                                   name));
  write(fmt::format("test_{}.py", name), fmt::format(R"~(import pathlib
import subprocess
import sys

import pytest
import torch

import kjit

HERE = pathlib.Path(__file__).resolve().parent
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_torch(device, dtype):
    module = kjit.load(HERE)
    x = torch.randn(1000, 3, device=device, dtype=dtype)
    torch.testing.assert_close(module.{0}(x, 2.0, -1.0), 2.0 * x - 1.0)


def test_opcheck():
    kjit.load(HERE)
    torch.library.opcheck(torch.ops.{0}.{0}.default, (torch.randn(8), 2.0, 1.0))


def test_every_launch_matches_its_kernel():
    """Compiles every specialization and checks the launches' arguments against the kernels'
    parameters (no GPU needed): a wrong `args` list fails here, not on a GPU."""
    result = subprocess.run([sys.executable, "-m", "kjit", "check", str(HERE), "--arch", "sm_90"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
)~",
                                                     name));
  std::cout << fmt::format("created kernel package '{}' in {}\n"
                           "  kernel.toml, {}.cu, __init__.py (CPU kernel), test_{}.py\n"
                           "next: kjit warm {} --arch sm_90; python -m pytest {}\n",
                           name, dir.string(), name, name, dir.string(), dir.string());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"kjit: pre-warm and manage just-in-time CUDA kernel caches", "kjit"};
  app.require_subcommand(1);
  // Run by the Python package's `kjit` command, which serves these itself (python_bindings/kjit/
  // _cli.py): listed here so that one `kjit --help` names every subcommand.
  if (const char* python = std::getenv("KJIT_PYTHON_CLI"); python != nullptr && *python != '\0') {
    app.footer(
      "Package distribution (the Python package's, kjit COMMAND --help for each):\n"
      "  fetch URL           fetch a package from a git repository into the package store\n"
      "  lock [PROJECT]      resolve [tool.kjit.dependencies] of pyproject.toml into kjit.lock\n"
      "  sync                fetch and verify what kjit.lock names (then works offline)\n"
      "  bundle OUT          copy the locked packages and a pre-warmed store into a folder\n"
      "  wheel PACKAGE       build a py3-none-any wheel of a kernel package\n"
      "  versions NAME       the installed versions of a package\n"
      "  info NAME           a package: version, ops with schemas, kernels, source hash\n");
  }
  app.set_version_flag("--version", std::string(kjit::version()));

  WarmArgs warm_args;
  auto* warm = app.add_subcommand("warm", "compile kernel packages for archs into the cache");
  warm->add_option("packages", warm_args.packages,
                   "package names or folders (default: every package on the search path)");
  warm->add_option("--arch", warm_args.arch, "archs, e.g. sm_80,sm_90 (default: detected GPUs)");
  warm->add_option("--driver-version", warm_args.driver_version,
                   "driver version that enters cache keys without a driver (e.g. 13000)");
  warm->add_option("-j,--jobs", warm_args.jobs, "parallel compiles (default: one per core)");
  warm->add_option("--remote", warm_args.remote,
                   "also fill this remote cache, e.g. redis://host:6379 (default: "
                   "KJIT_REMOTE_CACHE)");

  std::vector<std::string> check_packages;
  std::string check_arch;
  auto* check = app.add_subcommand(
    "check", "compile every specialization of packages and check each launch's arguments "
             "against the kernel's parameters (no GPU needed)");
  check->add_option("packages", check_packages, "package names or folders")->required();
  check->add_option("--arch", check_arch, "archs to compile for (default: sm_90)");

  auto* cache = app.add_subcommand("cache", "inspect and manage the kernel cache");
  cache->require_subcommand(1);
  bool as_json = false;
  auto* stats = cache->add_subcommand("stats", "hits, misses, compiles, size");
  stats->add_flag("--json", as_json, "print JSON");
  auto* ls = cache->add_subcommand("ls", "list entries, most recently used first");
  ls->add_flag("--json", as_json, "print JSON");
  bool fix = false;
  auto* verify = cache->add_subcommand("verify", "check every checksum and SQLite's integrity");
  verify->add_flag("--fix", fix, "remove bad entries");
  verify->add_flag("--json", as_json, "print JSON");
  std::string max_size;
  std::string older_than;
  auto* prune = cache->add_subcommand("prune", "remove least recently used or old entries");
  prune->add_option("--max-size", max_size, "shrink to this size, e.g. 500M, 2G");
  prune->add_option("--older-than", older_than, "remove entries unused for this long, e.g. 30d");
  auto* clear = cache->add_subcommand("clear", "remove every entry and the statistics");
  std::string file;
  std::string export_arch;
  auto* export_cmd = cache->add_subcommand("export", "write entries into a standalone store");
  export_cmd->add_option("file", file, "the store file to write")->required();
  export_cmd->add_option("--arch", export_arch, "only these archs, e.g. sm_80,sm_90");
  auto* import_cmd = cache->add_subcommand("import", "merge a store file into the cache");
  import_cmd->add_option("file", file, "the store file to read")
    ->required()
    ->check(CLI::ExistingFile);

  std::optional<std::string> remote_url;
  auto* push = cache->add_subcommand("push", "copy every entry to the remote cache");
  push->add_option("--remote", remote_url, "redis://host:port (default: KJIT_REMOTE_CACHE)");
  auto* pull = cache->add_subcommand("pull", "copy every entry of the remote cache here");
  pull->add_option("--remote", remote_url, "redis://host:port (default: KJIT_REMOTE_CACHE)");

  auto* info = app.add_subcommand("info", "versions, devices, caches and packages");
  info->add_flag("--json", as_json, "print JSON");

  CompileArgs compile_args;
  auto* compile = app.add_subcommand("compile", "compile one .cu file (no cache)");
  compile->add_option("file", compile_args.file, "CUDA source")
    ->required()
    ->check(CLI::ExistingFile);
  compile->add_option("--arch", compile_args.arch, "target, e.g. sm_90")->required();
  compile->add_option("-o,--output", compile_args.output, "output file");
  compile->add_flag("--ptx", compile_args.ptx, "PTX instead of a cubin");
  compile->add_option("--option", compile_args.options, "an NVRTC option, e.g. -DN=4")
    ->allow_extra_args(false);
  compile->add_option("-I,--include", compile_args.include_dirs, "an include folder")
    ->allow_extra_args(false);

  std::string new_name;
  std::string new_dir;
  auto* create = app.add_subcommand("new", "create a kernel package to start from");
  create->add_option("name", new_name, "package (and op) name")->required();
  create->add_option("dir", new_dir, "folder (default: NAME)");

  if (argc >= 2 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      found = found || sub->get_name() == argv[1];
      known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (const char* python = std::getenv("KJIT_PYTHON_CLI"); python != nullptr && *python != '\0') {
      known += ", fetch, lock, sync, bundle, wheel, versions";
    }
    if (!found) {
      std::cerr << fmt::format("kjit: unknown command '{}' (commands: {}; kjit --help)\n", argv[1],
                               known);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  try {
    if (warm->parsed()) {
      return run_warm(warm_args);
    }
    if (check->parsed()) {
      return run_check(check_packages, check_arch);
    }
    if (info->parsed()) {
      return run_info(as_json);
    }
    if (compile->parsed()) {
      return run_compile(compile_args);
    }
    if (create->parsed()) {
      return run_new(new_name, new_dir);
    }
    if (push->parsed() || pull->parsed()) {
      kjit::Runtime runtime(kjit::RuntimeOptions{.remote_cache = remote_url});
      if (push->parsed()) {
        const auto n = runtime.push_to_remote();
        std::cout << fmt::format("pushed {} entries to {}\n", n, *runtime.remote_cache());
      } else {
        const auto n = runtime.pull_from_remote();
        std::cout << fmt::format("pulled {} entries from {} into {}\n", n, *runtime.remote_cache(),
                                 runtime.cache().path().string());
      }
      return 0;
    }
    kjit::Runtime runtime;
    if (stats->parsed()) {
      return run_cache_stats(runtime, as_json);
    }
    if (ls->parsed()) {
      return run_cache_ls(runtime, as_json);
    }
    if (verify->parsed()) {
      return run_cache_verify(runtime, fix, as_json);
    }
    if (prune->parsed()) {
      std::optional<std::uint64_t> size;
      std::optional<std::int64_t> age;
      if (!max_size.empty() && !(size = kjit::parse_size(max_size))) {
        throw UsageError(fmt::format("--max-size '{}' is not a size like 500M or 2G", max_size));
      }
      if (!older_than.empty() && !(age = parse_duration(older_than))) {
        throw UsageError(
          fmt::format("--older-than '{}' is not a duration like 30d, 12h or 90s", older_than));
      }
      if (!size && !age) {
        throw UsageError("give --max-size and/or --older-than");
      }
      const auto removed = runtime.cache().prune(size, age);
      std::cout << fmt::format("removed {} entries; {} left ({})\n", removed,
                               runtime.cache().stats().entries,
                               size_text(runtime.cache().stats().size_bytes));
      return 0;
    }
    if (clear->parsed()) {
      const auto before = runtime.cache().stats().entries;
      runtime.cache().clear();
      std::cout << fmt::format("removed {} entries from {}\n", before,
                               runtime.cache().path().string());
      return 0;
    }
    if (export_cmd->parsed()) {
      std::vector<std::string> archs;
      for (const auto& arch : kjit::Arch::parse_list(export_arch)) {
        archs.push_back(arch.name());
        archs.push_back(arch.virtual_name());
      }
      const auto written = runtime.cache().export_to(file, archs);
      std::cout << fmt::format("exported {} entries to {}\n", written, file);
      return 0;
    }
    if (import_cmd->parsed()) {
      const auto added = runtime.cache().import_from(file);
      std::cout << fmt::format("imported {} new entries into {}\n", added,
                               runtime.cache().path().string());
      return 0;
    }
  } catch (const UsageError& e) {
    // The usage of the innermost subcommand given.
    const CLI::App* used = &app;
    while (!used->get_subcommands().empty()) {
      used = used->get_subcommands().front();
    }
    std::cerr << "kjit: " << e.what() << "\n\n" << used->help() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kjit: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
