// Note [Device timer]: CUDA-event timing of enqueued work on a real device.
#include <kjit/kjit.hpp>

#include "runtime/tune/device_timer.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <stdexcept>
#include <vector>

namespace {

constexpr const char* k_source = R"(
extern "C" __global__ void spin(float* out, int iterations) {
  float v = threadIdx.x;
  for (int i = 0; i < iterations; ++i) {
    v = v * 1.0000001f + 0.5f;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
)";

} // namespace

TEST_CASE("the device timer measures kernels, longer ones longer, through a captured graph",
          "[gpu]") {
  kjit::test::TempDir dir;
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir.path()});
  const auto kernel = runtime.kernel(kjit::Program("spin.cu", k_source), "spin");
  kjit::DeviceBuffer out(132 * 256 * sizeof(float));
  auto timed = [&](int iterations, bool graphs) {
    int runs = 0;
    const auto timing = kjit::detail::time_on_device(
      nullptr,
      [&](CUstream stream) {
        ++runs;
        kernel.launch({132}, {256}, 0, reinterpret_cast<kjit::StreamHandle>(stream), out.get(),
                      iterations);
      },
      kjit::detail::DeviceTimerOptions{.batch_ms = 0.5, .repeats = 5, .graphs = graphs});
    CHECK(timing.ms > 0);
    CHECK(timing.batch >= 1);
    CHECK(timing.graph == graphs);
    // The first run, the estimate, then (with graphs) one captured batch, else 5 batches.
    CHECK(runs == 2 + (graphs ? timing.batch : 5 * timing.batch));
    return timing.ms;
  };
  const double short_ms = timed(100, true);
  const double long_ms = timed(100000, true);
  CHECK(long_ms > 20 * short_ms);
  CHECK(timed(100000, false) == Approx(long_ms).epsilon(0.2));
}

TEST_CASE("the device timer passes on the work's errors and leaves no capture behind", "[gpu]") {
  kjit::test::TempDir dir;
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir.path()});
  const auto kernel = runtime.kernel(kjit::Program("spin.cu", k_source), "spin");
  kjit::DeviceBuffer out(1024 * sizeof(float));
  // 2048 threads a block: the launch fails, and says so.
  CHECK_THROWS_AS(kjit::detail::time_on_device(
                    nullptr,
                    [&](CUstream stream) {
                      kernel.launch({1}, {2048}, 0, reinterpret_cast<kjit::StreamHandle>(stream),
                                    out.get(), 1);
                    }),
                  kjit::LaunchError);
  // An enqueue that throws while being captured: the capture is ended, the next timing works.
  int calls = 0;
  CHECK_THROWS_AS(kjit::detail::time_on_device(
                    nullptr,
                    [&](CUstream stream) {
                      if (++calls > 2) {
                        throw std::runtime_error("no");
                      }
                      kernel.launch({1}, {256}, 0, reinterpret_cast<kjit::StreamHandle>(stream),
                                    out.get(), 1);
                    }),
                  std::runtime_error);
  const auto timing = kjit::detail::time_on_device(nullptr, [&](CUstream stream) {
    kernel.launch({1}, {256}, 0, reinterpret_cast<kjit::StreamHandle>(stream), out.get(), 1);
  });
  CHECK(timing.ms > 0);
  CHECK_FALSE(kjit::detail::stream_capturing(nullptr));
}

TEST_CASE("with an L2 flush, the flush's own time is not counted", "[gpu]") {
  kjit::test::TempDir dir;
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir.path()});
  const auto kernel = runtime.kernel(kjit::Program("spin.cu", k_source), "spin");
  kjit::DeviceBuffer out(132 * 256 * sizeof(float));
  auto enqueue = [&](CUstream stream) {
    kernel.launch({132}, {256}, 0, reinterpret_cast<kjit::StreamHandle>(stream), out.get(), 20000);
  };
  const auto warm = kjit::detail::time_on_device(nullptr, enqueue);
  REQUIRE(kjit::detail::l2_cache_bytes() > 0);
  const auto cold = kjit::detail::time_on_device(
    nullptr, enqueue,
    kjit::detail::DeviceTimerOptions{.flush_bytes = 2 * kjit::detail::l2_cache_bytes()});
  // A compute-bound kernel: the same time either way, though each cold run memsets ~100 MB.
  CHECK(cold.ms == Approx(warm.ms).epsilon(0.15));
}
