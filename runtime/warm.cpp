#include <kjit/error.hpp>
#include <kjit/warm.hpp>

#include "runtime/util/env.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace kjit {

std::vector<WarmJob> warm_jobs(const std::vector<Package>& packages,
                               const std::vector<Target>& targets) {
  std::vector<WarmJob> jobs;
  for (const auto& package : packages) {
    for (const auto& item : package.warm_list()) {
      for (const auto& target : targets) {
        jobs.push_back(WarmJob{package.name(), item.op, item.kernel, item.program, target});
      }
    }
  }
  return jobs;
}

WarmSummary warm(Runtime& runtime, const std::vector<Package>& packages,
                 const WarmOptions& options) {
  WarmSummary summary;
  summary.all = warm_jobs(packages, options.targets);
  const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
  summary.jobs = std::max(1U, std::min<unsigned>(options.jobs == 0 ? cores : options.jobs,
                                                 static_cast<unsigned>(summary.all.size())));
  const auto start = std::chrono::steady_clock::now();
  std::atomic<std::size_t> next{0};
  std::mutex mutex; // guards the summary and serializes on_result
  std::size_t done = 0;
  auto worker = [&] {
    for (std::size_t i = next++; i < summary.all.size(); i = next++) {
      const WarmJob& job = summary.all[i];
      WarmResult result;
      result.job = &job;
      const auto job_start = std::chrono::steady_clock::now();
      try {
        const Binary binary = runtime.compile(job.program, job.target);
        result.ok = true;
        result.cached = binary.cached;
      } catch (const std::exception& e) {
        result.error = e.what();
      }
      result.ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - job_start)
          .count();
      std::lock_guard lock(mutex);
      ++done;
      if (!result.ok) {
        ++summary.failed;
        summary.failures.push_back(result);
      } else if (result.cached) {
        ++summary.cached;
      } else {
        ++summary.compiled;
      }
      if (options.on_result) {
        options.on_result(result, done, summary.all.size());
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < summary.jobs; ++t) {
    threads.emplace_back(worker);
  }
  worker();
  for (auto& thread : threads) {
    thread.join();
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

std::vector<std::filesystem::path>
package_search_path(const std::vector<std::filesystem::path>& builtin) {
  std::vector<std::filesystem::path> path = detail::env_paths("KJIT_PATH");
  for (const auto& dir : builtin) {
    if (std::find(path.begin(), path.end(), dir) == path.end()) {
      path.push_back(dir);
    }
  }
  return path;
}

std::vector<std::filesystem::path>
find_packages(const std::vector<std::filesystem::path>& search_path) {
  std::vector<std::filesystem::path> found;
  for (const auto& root : search_path) {
    std::error_code ec;
    std::vector<std::filesystem::path> here;
    for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
      if (std::filesystem::is_regular_file(entry.path() / "kernel.toml", ec)) {
        here.push_back(entry.path());
      }
    }
    std::sort(here.begin(), here.end());
    found.insert(found.end(), here.begin(), here.end());
  }
  return found;
}

std::filesystem::path find_package(std::string_view name,
                                   const std::vector<std::filesystem::path>& search_path) {
  std::error_code ec;
  const std::filesystem::path as_path(name);
  if (std::filesystem::is_regular_file(as_path / "kernel.toml", ec) ||
      (as_path.filename() == "kernel.toml" && std::filesystem::is_regular_file(as_path, ec))) {
    return as_path;
  }
  std::string searched;
  for (const auto& root : search_path) {
    if (std::filesystem::is_regular_file(root / name / "kernel.toml", ec)) {
      return root / name;
    }
    searched += (searched.empty() ? "" : ", ") + root.string();
  }
  throw Error(fmt::format("no kernel package '{}': not a folder with a kernel.toml, and not in "
                          "the search path ({}); set KJIT_PATH to add folders",
                          name, searched.empty() ? "empty" : searched));
}

} // namespace kjit
