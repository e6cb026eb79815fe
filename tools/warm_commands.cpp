// kjit warm and kjit check: compile packages' kernels into the cache, and check their launches.
#include "tools/cli.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <unistd.h>

namespace fs = std::filesystem;

namespace kjit_cli {
namespace {

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

} // namespace

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

int run_check(const std::vector<std::string>& names, const std::string& arch, bool as_json) {
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
  nlohmann::json reports = nlohmann::json::array();
  for (const auto& name : names) {
    const kjit::Package package = kjit::Package::load(kjit::find_package(name, search));
    const kjit::CheckReport report = kjit::check_package(runtime, package, targets);
    ok = ok && report.problems.empty() && report.gaps.empty();
    if (as_json) {
      nlohmann::json problems = nlohmann::json::array();
      for (const auto& p : report.problems) {
        problems.push_back(
          {{"op", p.op}, {"kernel", p.kernel}, {"target", p.target}, {"what", p.what}});
      }
      nlohmann::json gaps = nlohmann::json::array();
      for (const auto& gap : report.gaps) {
        gaps.push_back(
          {{"op", gap.op}, {"kernel", gap.kernel}, {"needs", gap.needs}, {"fix", gap.fix}});
      }
      reports.push_back({{"package", package.name()},
                         {"version", package.version()},
                         {"checked", report.checked},
                         {"compiled_only", report.unreadable},
                         {"problems", problems},
                         {"not_checked", gaps}});
      continue;
    }
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
  }
  if (as_json) {
    std::cout << reports.dump(2) << "\n";
  }
  return ok ? 0 : 1;
}

} // namespace kjit_cli
