// Pre-warming: compile every kernel of kernel packages for a list of targets, in parallel, into
// the cache, so that processes on the GPU machines find them there (no GPU needed here).
//
// **Example**
//
//   kjit::Runtime runtime(kjit::RuntimeOptions{.driver_version = 13000});
//   auto packages = {kjit::Package::load("kernels_src/img2gray")};
//   kjit::WarmOptions options{.targets = {kjit::Target{kjit::Arch::parse("sm_90")}}};
//   kjit::WarmSummary summary = kjit::warm(runtime, packages, options);
//   // summary.compiled, summary.cached, summary.failed
#pragma once

#include <kjit/arch.hpp>
#include <kjit/package.hpp>
#include <kjit/runtime.hpp>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kjit {

// One compile of a warm run.
struct WarmJob {
  std::string package;
  std::string op;
  std::string kernel; // the name asked for (a name expression for templates)
  Program program;
  Target target;
};

struct WarmResult {
  const WarmJob* job = nullptr;
  bool ok = false;
  bool cached = false; // found in the cache, not compiled
  double ms = 0;       // wall time of this job
  std::string error;   // the compile error, with the NVRTC log, when !ok
};

struct WarmOptions {
  std::vector<Target> targets;
  // Parallel compiles; 0 means one per core.
  unsigned jobs = 0;
  // Called after each job, one at a time, with the count done so far.
  std::function<void(const WarmResult&, std::size_t done, std::size_t total)> on_result;
  // Compile in `jobs` worker processes (POSIX fork) instead of threads, each with a Runtime of
  // these options (so the same store). Compiles in one process contend on its address space
  // (NVRTC allocates and frees hundreds of MB a compile): processes scale further with jobs
  // (bench/RESULTS.md). For tools: the caller must be single-threaded when warm() forks. A
  // worker that dies fails its job; the others take the remaining jobs.
  std::optional<RuntimeOptions> processes;
};

struct WarmSummary {
  std::size_t compiled = 0;
  std::size_t cached = 0;
  std::size_t failed = 0;
  double seconds = 0;
  unsigned jobs = 0;
  std::vector<WarmJob> all;         // every job, in order
  std::vector<WarmResult> failures; // with `job` pointing into `all`
};

// The jobs of `packages` (each op's warm list) for every target.
std::vector<WarmJob> warm_jobs(const std::vector<Package>& packages,
                               const std::vector<Target>& targets);

// Compiles every job through `runtime` (memo, store, per-key locks), `options.jobs` at a time.
// Never throws for a failed compile: failures are counted and returned.
WarmSummary warm(Runtime& runtime, const std::vector<Package>& packages,
                 const WarmOptions& options);

// The folders of the packages installed with kjit: `KJIT_BUILTIN_PACKAGES` when set, and the
// first that exists of, relative to the file holding kjit's library code (libkjit, or the app it
// is linked into), `../share/kjit/kernels` (a `cmake --install` tree), `kernels` and
// `../kernels` (the Python package), then the install tree this kjit was configured for.
std::vector<std::filesystem::path> installed_package_dirs();

// Where packages are found by name: the `KJIT_PATH` folders (':'-separated), then `builtin`.
std::vector<std::filesystem::path>
package_search_path(const std::vector<std::filesystem::path>& builtin = installed_package_dirs());

// The package folders (holding a kernel.toml) directly under each folder of `search_path`.
std::vector<std::filesystem::path>
find_packages(const std::vector<std::filesystem::path>& search_path);

// A folder (or kernel.toml) path as is, else the first package named `name` on `search_path`.
// Throws `kjit::Error` naming the folders searched.
//
//   kjit::Package img2gray = kjit::Package::load(kjit::find_package("img2gray"));
std::filesystem::path
find_package(std::string_view name,
             const std::vector<std::filesystem::path>& search_path = package_search_path());

} // namespace kjit
