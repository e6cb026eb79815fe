#include "runtime/tune/device_timer.hpp"

#include "runtime/cuda/driver.hpp"
#include "runtime/logging.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace kjit::detail {
namespace {

// What the timer creates, destroyed on every way out (errors on the way out are not reported:
// the timing's own error, if any, is the one that matters).
struct Resources {
  const DriverApi& d;
  CUstream stream = nullptr;
  CUevent start = nullptr;
  CUevent stop = nullptr;
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  CUdeviceptr flush = 0;
  bool capturing = false;

  explicit Resources(const DriverApi& api) : d(api) {}
  ~Resources() {
    if (capturing) {
      CUgraph abandoned = nullptr;
      d.cuStreamEndCapture(stream, &abandoned);
      if (abandoned != nullptr) {
        d.cuGraphDestroy(abandoned);
      }
    }
    if (stream != nullptr) {
      d.cuStreamSynchronize(stream);
    }
    if (exec != nullptr) {
      d.cuGraphExecDestroy(exec);
    }
    if (graph != nullptr) {
      d.cuGraphDestroy(graph);
    }
    if (start != nullptr) {
      d.cuEventDestroy(start);
    }
    if (stop != nullptr) {
      d.cuEventDestroy(stop);
    }
    if (stream != nullptr) {
      d.cuStreamDestroy(stream);
    }
    if (flush != 0) {
      d.cuMemFree(flush);
    }
  }
  Resources(const Resources&) = delete;
  Resources& operator=(const Resources&) = delete;

  // Milliseconds between the events, after waiting for the second.
  double elapsed() const {
    KJIT_CU_CHECK(d.cuEventSynchronize(stop), "timing on the device");
    float ms = 0;
    KJIT_CU_CHECK(d.cuEventElapsedTime(&ms, start, stop), "timing on the device");
    return ms;
  }
};

// Captures `batch` runs into an instantiated graph; false (nothing left behind) when the work
// cannot be captured. Errors of the work itself still throw.
bool capture(Resources& r, const std::function<void(CUstream)>& enqueue, int batch) {
  if (r.d.cuStreamBeginCapture(r.stream, CU_STREAM_CAPTURE_MODE_RELAXED) != CUDA_SUCCESS) {
    return false;
  }
  r.capturing = true;
  for (int i = 0; i < batch; ++i) {
    enqueue(r.stream);
  }
  r.capturing = false;
  const CUresult ended = r.d.cuStreamEndCapture(r.stream, &r.graph);
  if (ended != CUDA_SUCCESS || r.graph == nullptr) {
    log(LogLevel::debug,
        "the work cannot be captured into a CUDA graph ({}); timing direct "
        "launches",
        driver_error_text(ended));
    return false;
  }
  const CUresult made = r.d.cuGraphInstantiate(&r.exec, r.graph, 0);
  if (made != CUDA_SUCCESS) {
    log(LogLevel::debug, "cannot instantiate the captured graph ({}); timing direct launches",
        driver_error_text(made));
    r.exec = nullptr;
    return false;
  }
  return true;
}

} // namespace

bool stream_capturing(CUstream stream) noexcept {
  try {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return driver().cuStreamIsCapturing(stream, &status) == CUDA_SUCCESS &&
           status != CU_STREAM_CAPTURE_STATUS_NONE;
  } catch (const Error&) {
    return false;
  }
}

namespace {

// The median per run of `enqueue` (already run once), batches sized from `estimate_ms`.
double measure(Resources& r, const std::function<void(CUstream)>& enqueue,
               const DeviceTimerOptions& options, double estimate_ms, DeviceTiming& timing) {
  const DriverApi& d = r.d;
  timing.batch =
    std::clamp(static_cast<int>(std::lround(options.batch_ms / std::max(estimate_ms, 1e-4))), 1,
               options.max_batch);
  if (r.exec != nullptr) { // a graph of an earlier measurement
    d.cuGraphExecDestroy(r.exec);
    r.exec = nullptr;
  }
  if (r.graph != nullptr) {
    d.cuGraphDestroy(r.graph);
    r.graph = nullptr;
  }
  timing.graph = options.graphs && capture(r, enqueue, timing.batch);
  if (timing.graph) {
    KJIT_CU_CHECK(d.cuGraphLaunch(r.exec, r.stream), "replaying the captured work"); // warm-up
  }
  std::vector<double> per_run;
  per_run.reserve(static_cast<std::size_t>(std::max(options.repeats, 1)));
  for (int rep = 0; rep < std::max(options.repeats, 1); ++rep) {
    KJIT_CU_CHECK(d.cuEventRecord(r.start, r.stream), "timing on the device");
    if (timing.graph) {
      KJIT_CU_CHECK(d.cuGraphLaunch(r.exec, r.stream), "replaying the captured work");
    } else {
      for (int i = 0; i < timing.batch; ++i) {
        enqueue(r.stream);
      }
    }
    KJIT_CU_CHECK(d.cuEventRecord(r.stop, r.stream), "timing on the device");
    per_run.push_back(r.elapsed() / timing.batch);
  }
  std::sort(per_run.begin(), per_run.end());
  const std::size_t n = per_run.size();
  return n % 2 == 1 ? per_run[n / 2] : (per_run[n / 2 - 1] + per_run[n / 2]) / 2;
}

} // namespace

std::size_t l2_cache_bytes() noexcept {
  try {
    const DriverApi& d = driver();
    CUdevice device = 0;
    int bytes = 0;
    if (d.cuCtxGetDevice(&device) == CUDA_SUCCESS &&
        d.cuDeviceGetAttribute(&bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device) == CUDA_SUCCESS &&
        bytes > 0) {
      return static_cast<std::size_t>(bytes);
    }
  } catch (const Error&) {
  }
  return 0;
}

DeviceTiming time_on_device(CUstream origin, const std::function<void(CUstream)>& enqueue,
                            const DeviceTimerOptions& options) {
  const DriverApi& d = driver();
  DeviceTiming timing;
  KJIT_CU_CHECK(d.cuStreamSynchronize(origin), "waiting for the work before timing");
  Resources r(d);
  KJIT_CU_CHECK(d.cuStreamCreate(&r.stream, CU_STREAM_NON_BLOCKING), "timing on the device");
  KJIT_CU_CHECK(d.cuEventCreate(&r.start, CU_EVENT_DEFAULT), "timing on the device");
  KJIT_CU_CHECK(d.cuEventCreate(&r.stop, CU_EVENT_DEFAULT), "timing on the device");
  std::function<void(CUstream)> flush_only;
  std::function<void(CUstream)> run = enqueue;
  if (options.flush_bytes > 0) {
    KJIT_CU_CHECK(d.cuMemAlloc(&r.flush, options.flush_bytes), "the tuner's L2 flush buffer");
    flush_only = [&](CUstream s) {
      KJIT_CU_CHECK(d.cuMemsetD8Async(r.flush, 0, options.flush_bytes, s), "flushing the L2");
    };
    run = [&](CUstream s) {
      flush_only(s);
      enqueue(s);
    };
  }

  const auto first = std::chrono::steady_clock::now();
  run(r.stream); // compiles, loads, raises shared memory limits: never measured
  KJIT_CU_CHECK(d.cuStreamSynchronize(r.stream), "the first run of the work");
  timing.first_ms =
    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first).count();

  KJIT_CU_CHECK(d.cuEventRecord(r.start, r.stream), "timing on the device");
  run(r.stream);
  KJIT_CU_CHECK(d.cuEventRecord(r.stop, r.stream), "timing on the device");
  const double estimate = r.elapsed();
  timing.ms = measure(r, run, options, estimate, timing);
  if (flush_only) {
    DeviceTiming alone;
    const double flush_ms = measure(r, flush_only, options, estimate, alone);
    timing.ms = std::max(timing.ms - flush_ms, 0.0);
  }
  return timing;
}

} // namespace kjit::detail
