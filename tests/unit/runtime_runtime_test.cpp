#include <kjit/kjit.hpp>

#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <thread>

TEST_CASE("threads asking for a kernel being compiled wait for that one compile", "[runtime]") {
  kjit::test::TempDir dir;
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir.path()});
  const kjit::Program program(
    "k.cu", "extern \"C\" __global__ void k(float* x, int n) { if (threadIdx.x < n) x[0] = 1; }");
  std::vector<std::thread> threads;
  std::vector<std::string> keys(16);
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      keys[i] = runtime.compile(program, kjit::Target{kjit::Arch{9, 0}}).key;
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  const auto stats = runtime.stats();
  CHECK(stats.compiles == 1);
  CHECK(stats.memory_misses == 1);
  CHECK(stats.memory_hits == 15);
  CHECK(std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return k == keys[0]; }));
}

TEST_CASE("memo statistics persist in the store when the runtime goes away", "[runtime]") {
  kjit::test::TempDir dir;
  const kjit::Program program("k.cu", "extern \"C\" __global__ void k() {}");
  {
    kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir.path()});
    for (int i = 0; i < 3; ++i) {
      runtime.compile(program, kjit::Target{kjit::Arch{8, 0}});
    }
  }
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir.path()});
  const auto stats = runtime.cache().stats();
  CHECK(stats.memory_hits == 2);
  CHECK(stats.memory_misses == 1);
  CHECK(stats.compiles == 1);
  CHECK(stats.compile_ms > 0);
}

TEST_CASE("the driver version in keys defaults to NVRTC's CUDA version without a driver",
          "[runtime]") {
  if (kjit::device_count() > 0) {
    WARN("a driver is loaded: its version is used, as it should be");
    return;
  }
  const auto [major, minor] = kjit::nvrtc_version();
  kjit::Runtime defaulted(kjit::RuntimeOptions{.disable_cache = true});
  CHECK(defaulted.driver_version() == major * 1000 + minor * 10);
  kjit::Runtime named(kjit::RuntimeOptions{.disable_cache = true, .driver_version = 12080});
  CHECK(named.driver_version() == 12080);
  const kjit::Program program("k.cu", "__global__ void k() {}");
  CHECK(named.key(program, kjit::Target{kjit::Arch{9, 0}}) !=
        defaulted.key(program, kjit::Target{kjit::Arch{9, 0}}));
}
