// Timing work on a device with CUDA events, for the tuner (Note [Tuner]).
//
// Note [Device timer]: the work (one run of an op's launches) is enqueued by the caller on a
// stream the timer owns, after the caller's stream has drained, so the inputs are ready and the
// timer's launches queue behind nothing else. One run outside any measurement compiles, loads and
// surfaces launch errors (they throw: the tuner counts the candidate as infinitely slow); one more
// between events estimates the time of a run, from which a batch of runs filling about
// `batch_ms` is sized. With `graphs`, the batch is captured once into a CUDA graph and the graph
// is replayed, so that the host's launch overhead does not hide the kernel time of microsecond
// kernels; work that cannot be captured is timed as direct launches instead. The result is the
// median over `repeats` batches of the time per run. By default the L2 cache is left as the runs
// leave it (warm for inputs smaller than it, as an op's inputs often are when the op before
// wrote them), the same for every candidate; with `flush_bytes`, every run is preceded by a
// memset of that many bytes of a buffer of the timer's (twice the L2: it evicts the work's data,
// as Triton's do_bench does), and the memsets' own time, measured alone the same way, is
// subtracted. Everything the timer created is gone when it returns or throws, and its stream
// has drained.
#pragma once

#include "runtime/cuda/driver_api.hpp"

#include <functional>

namespace kjit::detail {

struct DeviceTimerOptions {
  double batch_ms = 1.0;       // about this long per measured batch
  int repeats = 10;            // batches measured; the median is taken
  int max_batch = 1000;        // runs per batch at most
  bool graphs = true;          // replay a captured graph of the batch where the work allows
  std::size_t flush_bytes = 0; // > 0: evict the L2 before every run (see above)
};

struct DeviceTiming {
  double ms = 0;       // median per run
  int batch = 0;       // runs per measured batch
  bool graph = false;  // replayed from a captured graph
  double first_ms = 0; // the first (unmeasured) run, host side: compiles and loads included
};

// Times `enqueue` (one run of the work, enqueued on the stream it is given) after draining
// `origin`, in the current context. Throws `DriverError` (and whatever `enqueue` throws).
DeviceTiming time_on_device(CUstream origin, const std::function<void(CUstream)>& enqueue,
                            const DeviceTimerOptions& options = {});

// The L2 cache of the current context's device, bytes (0 when the driver cannot say).
std::size_t l2_cache_bytes() noexcept;

// Whether `stream` is being captured into a CUDA graph (no timing, no synchronization may run
// on it then). False when the driver cannot say.
bool stream_capturing(CUstream stream) noexcept;

} // namespace kjit::detail
