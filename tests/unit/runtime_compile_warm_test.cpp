#include <kjit/warm.hpp>

#include "support/test_support.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <csignal>
#include <fstream>
#include <string>

#include <sys/syscall.h>
#include <unistd.h>

namespace {

// Three specializations for two targets; float64 fails its static_assert on purpose.
kjit::Package package(const std::filesystem::path& dir) {
  kjit::test::write_text(dir / "kernel.toml", R"toml([package]
name = "w"
version = "1.0.0"

[kernel.k]
source = "k.cu"
entry = "k<{T}>"

[op.f]
schema = "f(Tensor x) -> Tensor"
kernel = "k"
outputs = [{ like = "x" }]
args = ["out0", "x"]
grid = [1]
block = [1]
specialize = { T = "x.dtype" }
warm = { T = ["float16", "float32", "float64"] }
)toml");
  kjit::test::write_text(dir / "k.cu", R"(#include <cuda_fp16.h>
template <typename T> __global__ void k(T* out, const T* x) {
  static_assert(sizeof(T) != 8, "no doubles here");
  out[threadIdx.x] = x[threadIdx.x];
}
)");
  return kjit::Package::load(dir);
}

kjit::Package package(const kjit::test::TempDir& dir) {
  return package(dir.path());
}

kjit::WarmOptions options(unsigned jobs, std::optional<kjit::RuntimeOptions> processes) {
  kjit::WarmOptions o;
  o.targets = {kjit::Target{kjit::Arch{8, 0}}, kjit::Target{kjit::Arch{9, 0}}};
  o.jobs = jobs;
  o.processes = std::move(processes);
  return o;
}

} // namespace

TEST_CASE("warm in worker processes: same results as threads, failures with their log", "[warm]") {
  kjit::test::TempDir dir;
  const auto packages = std::vector{package(dir)};
  const kjit::RuntimeOptions store{.cache_dir = dir / "cache"};
  kjit::Runtime runtime(store);

  std::size_t reported = 0;
  auto opts = options(3, store);
  opts.on_result = [&](const kjit::WarmResult& r, std::size_t done, std::size_t total) {
    CHECK(done == ++reported);
    CHECK(total == 6);
    CHECK(r.job != nullptr);
  };
  const auto first = kjit::warm(runtime, packages, opts);
  CHECK(first.jobs == 3);
  CHECK(first.compiled == 4);
  CHECK(first.failed == 2);
  CHECK(reported == 6);
  for (const auto& failure : first.failures) {
    CHECK(failure.job->kernel == "k<double>");
    CHECK_THAT(failure.error, Catch::Contains("no doubles here"));
  }
  // The workers wrote to the store: a second run, with threads this time, finds everything.
  const auto second = kjit::warm(runtime, packages, options(2, std::nullopt));
  CHECK(second.cached == 4);
  CHECK(second.compiled == 0);
  CHECK(second.failed == 2);
  CHECK(runtime.stats().compiles == 0); // the parent compiled nothing itself
}

TEST_CASE("warm in worker processes survives a worker killed mid-run", "[warm]") {
  kjit::test::TempDir dir;
  const auto packages = std::vector{package(dir)};
  const kjit::RuntimeOptions store{.cache_dir = dir / "cache"};
  kjit::Runtime runtime(store);
  auto opts = options(2, store);
  bool killed = false;
  opts.on_result = [&](const kjit::WarmResult&, std::size_t, std::size_t) {
    if (killed) {
      return;
    }
    // Our children are the workers: kill the first one listed.
    std::ifstream children(fmt::format("/proc/self/task/{}/children", ::syscall(SYS_gettid)));
    pid_t pid = 0;
    if (children >> pid && pid > 0) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
  };
  const auto summary = kjit::warm(runtime, packages, opts);
  REQUIRE(killed);
  // Every job is accounted for; a job lost with the worker is a failure that says so.
  CHECK(summary.compiled + summary.cached + summary.failed == 6);
  for (const auto& failure : summary.failures) {
    if (failure.job->kernel != "k<double>") {
      CHECK_THAT(failure.error, Catch::Contains("died of signal 9"));
    }
  }
  CHECK(summary.compiled >= 3);
}

TEST_CASE("packages are found by name: KJIT_PATH first, then the installed ones", "[warm]") {
  kjit::test::TempDir installed;
  kjit::test::TempDir user;
  package(installed / "w");
  package(user / "w");
  ::setenv("KJIT_BUILTIN_PACKAGES", installed.path().c_str(), 1);
  ::unsetenv("KJIT_PATH");
  const auto dirs = kjit::installed_package_dirs();
  REQUIRE_FALSE(dirs.empty());
  CHECK(dirs.front() == installed.path());
  CHECK(kjit::find_package("w") == installed / "w");
  ::setenv("KJIT_PATH", user.path().c_str(), 1);
  CHECK(kjit::find_package("w") == user / "w");
  CHECK(kjit::Package::load(kjit::find_package("w")).name() == "w");
  CHECK_THROWS_WITH(kjit::find_package("nope"), Catch::Contains("no kernel package 'nope'"));
  ::unsetenv("KJIT_PATH");
  ::unsetenv("KJIT_BUILTIN_PACKAGES");
}
