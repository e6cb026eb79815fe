// Note [Tuning], Note [Tuner]: the manifest's tune keys, and the tuner with a fake timer and
// clock: the choice, pruning, failures, the budget, the store round trip and the key's lock.
#include <kjit/error.hpp>
#include <kjit/package.hpp>
#include <kjit/runtime.hpp>

#include "cache/sqlite_store.hpp"
#include "runtime/manifest/op_spec.hpp"
#include "runtime/tune/tuner.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <stdexcept>
#include <thread>

using kjit::detail::TuneValues;
using kjit::test::TempDir;

namespace {

kjit::Package tuned_package(const std::filesystem::path& dir) {
  kjit::test::write_text(dir / "kernel.toml", R"toml([package]
name = "tuned"
version = "1.0.0"

[kernel.k]
source = "k.cu"
entry = "k<{T}, {BLOCK}, {ROWS}>"

[op.f]
schema = "f(Tensor x) -> Tensor"
kernel = "k"
checks = ["x.dtype == float32 || x.dtype == float16"]
outputs = [{ like = "x" }]
args = ["out0", "x", "x.size(-1)"]
grid = ["cdiv(x.numel() / x.size(-1), ROWS)"]
block = ["BLOCK"]
shared_mem = "BLOCK * ROWS * 4"
specialize = { T = "x.dtype", BLOCK = "BLOCK", ROWS = "ROWS" }
tune = { BLOCK = [128, 256, 512], ROWS = [1, 2] }
tune_valid = "x.size(-1) % BLOCK == 0 && BLOCK * ROWS * 4 <= device.max_shared_mem"
tune_key = ["min(next_pow2(x.numel() / x.size(-1)), 65536)", "x.size(-1)"]
tune_default = { BLOCK = "256", ROWS = "1" }
)toml");
  kjit::test::write_text(dir / "k.cu", R"(#include <cuda_fp16.h>
template <typename T, int BLOCK, int ROWS> __global__ void k(T* out, const T* x, long long n) {}
)");
  return kjit::Package::load(dir);
}

// A clock that a timed candidate advances.
struct FakeClock {
  double now = 0;
};

kjit::detail::TuneHooks hooks(FakeClock& clock, std::map<TuneValues, double> ms,
                              std::function<bool(const TuneValues&)> valid = {}) {
  return kjit::detail::TuneHooks{std::move(valid),
                                 [&clock, ms](const TuneValues& v) {
                                   clock.now += 1; // each candidate takes a second of tuning
                                   const auto it = ms.find(v);
                                   if (it == ms.end()) {
                                     throw std::runtime_error(
                                       "too many resources requested for launch");
                                   }
                                   return it->second;
                                 },
                                 [&clock] { return clock.now; }};
}

} // namespace

TEST_CASE("tune keys parse into int symbols; warm compiles every candidate", "[tune]") {
  TempDir dir;
  const auto package = tuned_package(dir.path());
  const auto& spec = *package.op_specs().at(0);
  REQUIRE(spec.tune.params.size() == 2);
  CHECK(spec.tune.params[0].name == "BLOCK");
  CHECK(spec.tune.params[0].values == std::vector<std::int64_t>{128, 256, 512});
  CHECK(spec.symbols.at(static_cast<std::size_t>(spec.tune.params[1].symbol)).name == "ROWS");
  CHECK(spec.tune.valid.has_value());
  CHECK(spec.tune.key.size() == 2);
  CHECK(spec.uses_device); // tune_valid reads device.max_shared_mem
  std::vector<std::string> kernels;
  for (const auto& item : package.warm_list()) {
    kernels.push_back(item.kernel);
  }
  CHECK(kernels.size() == 2 * 3 * 2); // float32 and float16 (the checks) x BLOCK x ROWS
  CHECK(std::find(kernels.begin(), kernels.end(), "k<__half, 512, 2>") != kernels.end());
  CHECK(package.warm_gaps().empty());
}

TEST_CASE("the tuner picks the fastest valid candidate, the default timed first", "[tune]") {
  const auto candidates = kjit::detail::tune_candidates({{128, 256, 512}, {1, 2}});
  REQUIRE(candidates.size() == 6);
  CHECK(candidates.front() == TuneValues{128, 1});
  CHECK(candidates.back() == TuneValues{512, 2});
  FakeClock clock;
  const std::map<TuneValues, double> ms{
    {{128, 1}, 3.0}, {{128, 2}, 2.5}, {{256, 1}, 2.0}, {{256, 2}, 1.0}, {{512, 1}, 1.5}};
  // 512 x 2 fails (not in the map); 128 x 2 is pruned.
  const auto config = kjit::detail::run_tuner({"BLOCK", "ROWS"}, candidates, {256, 1},
                                              hooks(clock, ms,
                                                    [](const TuneValues& v) {
                                                      return v != TuneValues{128, 2};
                                                    }),
                                              60.0);
  CHECK(config.best == TuneValues{256, 2});
  CHECK(config.pruned == 1);
  REQUIRE(config.timings.size() == 5);
  CHECK(config.timings.front().values == TuneValues{256, 1}); // the default first
  const auto failed = std::find_if(config.timings.begin(), config.timings.end(), [](const auto& t) {
    return t.values == TuneValues{512, 2};
  });
  REQUIRE(failed != config.timings.end());
  CHECK(std::isinf(failed->ms));
  CHECK(failed->error.find("too many resources") != std::string::npos);
  CHECK_FALSE(config.budget_exhausted);
  CHECK(config.seconds == 5.0);
}

TEST_CASE("the budget stops the tuner, which is never slower than the default", "[tune]") {
  FakeClock clock;
  const auto candidates = kjit::detail::tune_candidates({{1, 2, 3, 4, 5, 6}});
  const std::map<TuneValues, double> ms{{{1}, 5.0}, {{2}, 4.0}, {{3}, 9.0},
                                        {{4}, 3.0}, {{5}, 1.0}, {{6}, 0.5}};
  const auto config =
    kjit::detail::run_tuner({"B"}, candidates, {3}, hooks(clock, ms), /*budget_s=*/2.5);
  CHECK(config.budget_exhausted);
  CHECK(config.timings.size() == 3); // the default, then 1 and 2, then the budget is spent
  CHECK(config.best == TuneValues{2});
  // Every candidate failing keeps the default.
  FakeClock again;
  const auto none = kjit::detail::run_tuner({"B"}, candidates, {3}, hooks(again, {}), 60.0);
  CHECK(none.best == TuneValues{3});
  CHECK(none.timings.size() == 6);
  CHECK(std::all_of(none.timings.begin(), none.timings.end(),
                    [](const auto& t) { return std::isinf(t.ms) && !t.error.empty(); }));
}

TEST_CASE("tuned configurations round-trip through the store, export and import", "[tune]") {
  TempDir dir;
  kjit::TunedConfig config;
  config.names = {"BLOCK", "ROWS"};
  config.best = {256, 2};
  config.timings = {{{256, 1}, 2.0, ""},
                    {{256, 2}, 1.0, ""},
                    {{512, 2}, std::numeric_limits<double>::infinity(), "no | good"}};
  config.pruned = 1;
  config.seconds = 0.75;
  const std::string key = kjit::detail::tune_key({"tuned",
                                                  "digest",
                                                  "f",
                                                  {{"BLOCK", {256, 512}}, {"ROWS", {1, 2}}},
                                                  "H200 (sm_90, 132 SMs)",
                                                  {"float16"},
                                                  {4096, 4096}});
  CHECK(key.size() == 32);
  CHECK(key != kjit::detail::tune_key({"tuned",
                                       "digest",
                                       "f",
                                       {{"BLOCK", {256, 512}}},
                                       "H200 (sm_90, 132 SMs)",
                                       {"float16"},
                                       {4096, 4096}}));
  {
    kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "cache"});
    runtime.cache().store()->put_tuned(
      {key, "tuned::f", "4096 x 4096 float16", "H200 (sm_90, 132 SMs)", config, 0, {}});
    CHECK(runtime.cache().export_to(dir / "baked.sqlite", {}) == 0); // no kernels, one tuning
  }
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "cache"});
  const auto found = runtime.cache().store()->get_tuned(key);
  REQUIRE(found.has_value());
  CHECK(found->op == "tuned::f");
  CHECK(found->config.best == config.best);
  CHECK(found->config.names == config.names);
  REQUIRE(found->config.timings.size() == 3);
  CHECK(std::isinf(found->config.timings[2].ms));
  CHECK(found->config.timings[2].error == "no | good");
  CHECK(found->config.pruned == 1);
  CHECK(found->config.seconds == 0.75);
  CHECK_FALSE(runtime.cache().store()->get_tuned(std::string(32, '0')).has_value());

  TempDir other;
  kjit::Runtime fresh(kjit::RuntimeOptions{.cache_dir = other / "cache"});
  fresh.cache().import_from(dir / "baked.sqlite");
  const auto imported = fresh.cache().tuned_entries();
  REQUIRE(imported.size() == 1);
  CHECK(imported[0].config.best == config.best);
  TempDir reader;
  kjit::Runtime baked(kjit::RuntimeOptions{
    .cache_dir = reader / "cache",
    .read_only_caches = std::vector<std::filesystem::path>{dir / "baked.sqlite"}});
  const auto listed = baked.cache().tuned_entries();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].store == (dir / "baked.sqlite").string());
  fresh.cache().clear();
  CHECK(fresh.cache().tuned_entries().empty());
}

TEST_CASE("one process tunes a key at a time; the others wait and read its result", "[tune]") {
  TempDir dir;
  const std::string key =
    kjit::detail::tune_key({"tuned", "d", "f", {{"B", {1, 2}}}, "dev", {}, {1}});
  std::atomic<int> tunings{0};
  auto tune = [&] {
    ++tunings;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kjit::TunedConfig config;
    config.names = {"B"};
    config.best = {2};
    config.timings = {{{1}, 2.0, ""}, {{2}, 1.0, ""}};
    return config;
  };
  std::vector<std::vector<std::int64_t>> results(4);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&, i] {
      // A runtime each: its own store connection and lock file, as separate processes have.
      kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "cache"});
      results[i] = kjit::detail::obtain_tuned(runtime.cache().store(),
                                              {key, "tuned::f", "1", "dev", {}, 0, {}}, tune)
                     .best;
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  CHECK(tunings == 1);
  for (const auto& r : results) {
    CHECK(r == std::vector<std::int64_t>{2});
  }
  // Without a store the tuner runs each time and keeps nothing.
  CHECK(kjit::detail::obtain_tuned(nullptr, {key, "tuned::f", "1", "dev", {}, 0, {}}, tune).best ==
        std::vector<std::int64_t>{2});
  CHECK(tunings == 2);
}

TEST_CASE("the default is timed even outside the candidates, and keeps a tie", "[tune]") {
  const auto candidates = kjit::detail::tune_candidates({{128, 256}});
  FakeClock clock;
  // The default rule said 192, which no list names; 256 is 0.5% faster: noise, the default stays.
  auto tie = kjit::detail::run_tuner(
    {"B"}, candidates, {192}, hooks(clock, {{{192}, 1.0}, {{128}, 2.0}, {{256}, 0.995}}), 60.0);
  REQUIRE(tie.timings.size() == 3);
  CHECK(tie.timings.front().values == TuneValues{192});
  CHECK(tie.best == TuneValues{192});
  // 2% faster displaces it; among the others the plain fastest wins.
  FakeClock again;
  auto win = kjit::detail::run_tuner(
    {"B"}, candidates, {192}, hooks(again, {{{192}, 1.0}, {{128}, 0.98}, {{256}, 0.975}}), 60.0);
  CHECK(win.best == TuneValues{256});
  // A default that fails gives way to any candidate that runs.
  FakeClock third;
  auto failed =
    kjit::detail::run_tuner({"B"}, candidates, {192}, hooks(third, {{{256}, 3.0}}), 60.0);
  CHECK(failed.best == TuneValues{256});
}

TEST_CASE("tuned configurations are found in the writable store, then in read-only stores of "
          "the package's scope",
          "[tune]") {
  TempDir dir;
  const std::string key =
    kjit::detail::tune_key({"tuned", "d", "f", {{"B", {1, 2}}}, "dev", {}, {7}});
  kjit::TunedConfig shipped;
  shipped.names = {"B"};
  shipped.best = {1};
  {
    kjit::Runtime maker(kjit::RuntimeOptions{.cache_dir = dir / "maker"});
    maker.cache().store()->put_tuned({key, "tuned::f", "7", "dev", shipped, 0, {}});
    REQUIRE(maker.cache().export_to(dir / "shipped.sqlite", {}) == 0);
  }
  int tunings = 0;
  auto tune = [&] {
    ++tunings;
    kjit::TunedConfig config;
    config.names = {"B"};
    config.best = {2};
    return config;
  };
  {
    // A store shipped for another package does not serve this one: tuned here.
    kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "a"});
    REQUIRE(runtime.cache().add_read_only_path(dir / "shipped.sqlite", "other"));
    CHECK_FALSE(kjit::detail::find_tuned(runtime.cache(), "tuned", key).has_value());
    CHECK(kjit::detail::obtain_tuned(runtime.cache(), "tuned",
                                     {key, "tuned::f", "7", "dev", {}, 0, {}}, tune)
            ->best == std::vector<std::int64_t>{2});
    CHECK(tunings == 1);
    // Now the writable store has it.
    CHECK(kjit::detail::find_tuned(runtime.cache(), "tuned", key)->best ==
          std::vector<std::int64_t>{2});
  }
  // The package's own shipped store serves it: nothing is tuned.
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "b"});
  REQUIRE(runtime.cache().add_read_only_path(dir / "shipped.sqlite", "tuned"));
  CHECK(kjit::detail::obtain_tuned(runtime.cache(), "tuned",
                                   {key, "tuned::f", "7", "dev", {}, 0, {}}, tune)
          ->best == std::vector<std::int64_t>{1});
  CHECK(tunings == 1);
}

TEST_CASE("an op's source digest changes with its kernel's source and its manifest", "[tune]") {
  TempDir dir;
  auto package = tuned_package(dir.path());
  const std::string first = kjit::detail::op_source_digest(package, *package.op_specs().at(0));
  CHECK(first.size() == 32);
  CHECK(first == kjit::detail::op_source_digest(package, *package.op_specs().at(0)));
  kjit::test::write_text(dir.path() / "k.cu", R"(#include <cuda_fp16.h>
template <typename T, int BLOCK, int ROWS> __global__ void k(T* out, const T* x, long long n) {
  // changed
}
)");
  const std::string edited = kjit::detail::op_source_digest(package, *package.op_specs().at(0));
  CHECK(edited != first);
  std::ifstream in(dir.path() / "kernel.toml");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  kjit::test::write_text(dir.path() / "kernel.toml", text + "\n# a comment\n");
  const auto reloaded = kjit::Package::load(dir.path());
  CHECK(kjit::detail::op_source_digest(reloaded, *reloaded.op_specs().at(0)) != edited);
}

TEST_CASE("cache rm's filters remove tuned configurations by package, op, arch and key", "[tune]") {
  TempDir dir;
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "cache"});
  kjit::TunedConfig config;
  config.names = {"B"};
  config.best = {1};
  auto put = [&](const std::string& key, const std::string& op, const std::string& device) {
    runtime.cache().store()->put_tuned({key, op, "1", device, config, 0, {}});
  };
  put(std::string(32, 'a'), "norm::rms_norm", "NVIDIA H200 (sm_90, 132 SMs)");
  put(std::string(32, 'b'), "norm::layer_norm", "NVIDIA H200 (sm_90, 132 SMs)");
  put(std::string(32, 'c'), "norm_v2::rms_norm", "NVIDIA A100 (sm_80, 108 SMs)");
  put(std::string(32, 'd'), "rotary::apply_rotary", "NVIDIA H200 (sm_90, 132 SMs)");
  CHECK(runtime.cache().remove({.package = "norm", .version = "1.0.0"}) == 0); // never by version
  CHECK(runtime.cache().remove({.package = "norm", .op = "rms_norm", .arch = "sm_80"}) == 1);
  CHECK(runtime.cache().remove({.key = "bbbb"}) == 1);
  CHECK(runtime.cache().remove({.package = "norm"}) == 1);
  const auto left = runtime.cache().tuned_entries();
  REQUIRE(left.size() == 1);
  CHECK(left[0].op == "rotary::apply_rotary");
}
