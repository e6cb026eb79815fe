// A cache under every process of a machine: load, crashes and disk faults (see
// tests/RELIABILITY.md for the figures).
#include <kjit/kjit.hpp>

#include "cache/sqlite_store.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <random>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using kjit::test::TempDir;

namespace {

// `count` distinct small kernel sources in `dir`.
std::vector<std::string> write_sources(const TempDir& dir, int count) {
  std::vector<std::string> paths;
  for (int i = 0; i < count; ++i) {
    const auto path = dir / fmt::format("k{}.cu", i);
    kjit::test::write_text(
      path, fmt::format("extern \"C\" __global__ void k(float* x) {{ x[threadIdx.x] *= {}.0f; }}\n",
                        i + 2));
    paths.push_back(path.string());
  }
  return paths;
}

} // namespace

TEST_CASE("16 processes x 4 threads on an empty store compile each kernel once", "[reliability]") {
  TempDir dir;
  const auto sources = write_sources(dir, 4);
  const auto go = dir / "go";
  std::vector<kjit::test::Child> children;
  for (int p = 0; p < 16; ++p) {
    std::vector<std::string> argv{kjit::test::helper_path(),
                                  "compile-many",
                                  (dir / "cache").string(),
                                  "sm_90",
                                  "4",
                                  go.string()};
    argv.insert(argv.end(), sources.begin(), sources.end());
    children.push_back(kjit::test::start_process(argv));
  }
  kjit::test::write_text(go, "");
  int compiles = 0;
  for (auto& child : children) {
    const auto result = kjit::test::wait_process(child);
    REQUIRE(result.exit_code == 0);
    CHECK(result.values.at("failures") == "0");
    compiles += std::stoi(result.values.at("compiles"));
  }
  CHECK(compiles == 4);
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "cache"});
  const auto stats = runtime.cache().stats();
  CHECK(stats.compiles == 4);
  CHECK(stats.entries == 4);
  // 16 processes x 4 threads x 4 kernels: every lookup a memo or store hit but the 4 compiles.
  CHECK(stats.memory_hits + stats.memory_misses == 16 * 4 * 4);
  CHECK(runtime.cache().verify(false).ok());
}

TEST_CASE("writers killed at random moments never leave a partial entry", "[reliability]") {
  TempDir dir;
  const int k_kills = 50;
  const auto sources = write_sources(dir, k_kills);
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> delay_us(0, 60000);
  int killed = 0;
  for (int i = 0; i < k_kills; ++i) {
    auto child = kjit::test::start_process(
      {kjit::test::helper_path(), "compile", (dir / "cache").string(), sources[i], "sm_90"});
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    killed += ::kill(child.pid, SIGKILL) == 0;
    kjit::test::wait_process(child);
  }
  CHECK(killed == k_kills);
  // The store opens, holds only whole entries, and the next process finishes the work.
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "cache"});
  REQUIRE(runtime.cache().enabled());
  const auto report = runtime.cache().verify(false);
  CHECK(report.ok());
  const auto before = runtime.cache().stats().entries;
  for (const auto& source : sources) {
    const auto binary =
      runtime.compile(kjit::Program::from_file(source), kjit::Target{kjit::Arch{9, 0}});
    CHECK(binary.data.substr(1, 3) == "ELF");
  }
  CHECK(runtime.stats().compiles == k_kills - before);
  CHECK(runtime.cache().stats().entries == static_cast<std::uint64_t>(k_kills));
  CHECK(runtime.cache().verify(false).ok());
  WARN("killed " << killed << " writers; " << before << " had stored their entry first");
}

TEST_CASE("a full disk is one warning; kernels still compile", "[reliability]") {
  TempDir dir;
  const auto sources = write_sources(dir, 3);
  // A file size limit makes the store's writes fail as on a full disk (EFBIG, SIGXFSZ ignored).
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    kjit::test::LogCapture logs;
    {
      kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "cache"});
      struct rlimit limit {
        16 * 1024, 16 * 1024
      };
      ::setrlimit(RLIMIT_FSIZE, &limit);
      for (const auto& source : sources) {
        if (runtime.compile(kjit::Program::from_file(source), kjit::Target{kjit::Arch{9, 0}})
              .data.substr(1, 3) != "ELF") {
          ::_exit(3);
        }
      }
    }
    // NVRTC's precompiled headers need room in /tmp too: at most one warning says they are off.
    ::_exit(logs.count("cannot write to kernel cache") == 1 &&
                logs.count("precompiled headers") <= 1
              ? 0
              : 4);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
