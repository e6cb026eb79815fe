// Note [Tuning] on the CUDA path: which tune parameters a call takes, and the tuning of a bucket
// at its first call (Notes [Tuner] in runtime/tune/tuner.hpp, [Device timer] in
// runtime/tune/device_timer.hpp).
//
// A call's bucket is its tune_key values and its tensor arguments' dtypes; with the device they
// select a TuneSlot. The slot of the previous call is compared first without a lock (a stream
// of same-shaped calls pays the key's evaluation and one comparison), then the slots seen, then
// the stores (writable, then read-only), and only then does the tuner run: in this process,
// under the store's lock for the key, never while the stream is being captured into a CUDA graph
// or with KJIT_AUTOTUNE=0 (then the default rule serves the call, and nothing is remembered, so
// a later call may still tune). A tuned configuration is checked against tune_valid for every
// call (a bucket's members may differ in what the predicate reads, e.g. alignment); where it
// fails, the default rule serves the call.
#include "op_state.hpp"
#include "ops.hpp"

#include <kjit/error.hpp>

#include "runtime/cuda/driver.hpp"
#include "runtime/logging.hpp"
#include "runtime/tune/device_timer.hpp"
#include "runtime/util/env.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <thread>

namespace kjit::torch_layer {
namespace {

// KJIT_AUTOTUNE=0 (or false, no, off): no tuning runs; tuned configurations in the stores are
// still used.
bool autotune_enabled() {
  const auto value = detail::getenv_nonempty("KJIT_AUTOTUNE");
  if (!value) {
    return true;
  }
  std::string v = *value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  return v != "0" && v != "false" && v != "no" && v != "off";
}

// KJIT_TUNE_BUDGET: seconds of tuning per key (default 30); no new candidate starts after it.
double tune_budget_s() {
  if (const auto value = detail::getenv_nonempty("KJIT_TUNE_BUDGET")) {
    char* end = nullptr;
    const double s = std::strtod(value->c_str(), &end);
    if (end != value->c_str() && *end == '\0' && s >= 0) {
      return s;
    }
    detail::log(LogLevel::warning, "KJIT_TUNE_BUDGET='{}' is not a number of seconds; using 30",
                *value);
  }
  return 30.0;
}

// The bytes a tensor's elements span (0 when it has none).
std::int64_t span_bytes(const TensorRef& t) {
  std::int64_t last = 0; // the furthest element, in elements
  for (std::int64_t d = 0; d < t.dim; ++d) {
    if (t.sizes[d] == 0) {
      return 0;
    }
    last += (t.sizes[d] - 1) * std::max<std::int64_t>(t.strides[d], 0);
  }
  return static_cast<std::int64_t>((last + 1) * element_size(t.dtype));
}

// KJIT_TUNE_L2, the L2 before each timed run (Note [Device timer]): `cold`, evicted; `warm`, as
// the runs leave it; `auto` (the default), evicted where the call's tensors (`working_set`
// bytes) span less than twice the L2, as benchmarks time kernels (Triton's do_bench too). A call
// that moves more evicts its own data before it reads it again: there the flush would only cost
// time and add the noise of subtracting it.
detail::DeviceTimerOptions timer_options(std::int64_t working_set) {
  detail::DeviceTimerOptions options;
  std::string mode = "auto";
  if (const auto value = detail::getenv_nonempty("KJIT_TUNE_L2")) {
    if (*value == "cold" || *value == "warm" || *value == "auto") {
      mode = *value;
    } else {
      detail::log(LogLevel::warning,
                  "KJIT_TUNE_L2='{}' is none of 'auto', 'cold' and 'warm'; using auto", *value);
    }
  }
  const std::size_t l2 = detail::l2_cache_bytes();
  if (mode == "cold" ||
      (mode == "auto" && static_cast<std::uint64_t>(working_set) < 2 * std::uint64_t(l2))) {
    options.flush_bytes = 2 * l2;
  }
  return options;
}

std::string device_text(const DeviceProps& props) {
  return fmt::format("{} (sm_{}, {} SMs)", props.name, props.cc, props.sm_count);
}

// The written arguments' scratch copies while the tuner runs: bytes of torch's allocator, each
// offset as its argument's data is within 256 bytes (so that alignment tests answer the same).
class Scratch {
public:
  explicit Scratch(const TorchApi& api) : m_api(api) {}
  ~Scratch() {
    for (AtenTensorHandle h : m_owned) {
      m_api.aoti_torch_delete_tensor_object(h);
    }
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // A copy of the bytes `t` spans, enqueued on `stream`.
  void* copy(const TensorRef& t, int32_t device, void* stream, const std::string& op) {
    void* data = nullptr;
    check(m_api.aoti_torch_get_data_ptr(t.handle, &data), "aoti_torch_get_data_ptr", op.c_str());
    const std::int64_t bytes = span_bytes(t);
    if (bytes == 0) {
      return nullptr; // no elements: nothing to protect
    }
    const auto offset = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(data) % 256);
    const std::int64_t size = bytes + offset;
    const std::int64_t stride = 1;
    AtenTensorHandle h = nullptr;
    check(m_api.aoti_torch_empty_strided(1, &size, &stride, static_cast<int32_t>(DType::uint8),
                                         m_api.cuda, device, &h),
          "aoti_torch_empty_strided", op.c_str());
    m_owned.push_back(h);
    void* base = nullptr;
    check(m_api.aoti_torch_get_data_ptr(h, &base), "aoti_torch_get_data_ptr", op.c_str());
    auto* copy = static_cast<char*>(base) + offset;
    KJIT_CU_CHECK(detail::driver().cuMemcpyDtoDAsync(
                    reinterpret_cast<CUdeviceptr>(copy), reinterpret_cast<CUdeviceptr>(data),
                    static_cast<std::size_t>(bytes), static_cast<CUstream>(stream)),
                  "{}: copying a written argument for the tuner", op);
    return copy;
  }

private:
  const TorchApi& m_api;
  std::vector<AtenTensorHandle> m_owned;
};

} // namespace

void OpState::set_tune_mode(TuneMode mode, const std::vector<std::int64_t>& values) {
  const detail::TuneSpec& tune = m_spec->tune;
  if (tune.empty()) {
    throw Error(fmt::format("op '{}' has no tune parameters", m_qualified));
  }
  std::lock_guard lock(m_tune_mutex);
  if (mode == TuneMode::fixed) {
    if (values.size() != tune.params.size()) {
      throw Error(fmt::format("op '{}' has {} tune parameters; {} values given", m_qualified,
                              tune.params.size(), values.size()));
    }
    std::copy(values.begin(), values.end(), m_fixed.begin());
  }
  m_tune_mode.store(mode, std::memory_order_release);
}

void OpState::forget_tuned() {
  std::lock_guard lock(m_tune_mutex);
  // Slots stay allocated (a concurrent call may be reading one); a new generation retires them.
  m_tune_generation.fetch_add(1, std::memory_order_acq_rel);
  m_last_tuned.store(nullptr, std::memory_order_release);
}

bool OpState::set_tune(CallEnv& env, std::span<const std::int64_t> values) const {
  const detail::TuneSpec& tune = m_spec->tune;
  for (std::size_t p = 0; p < tune.params.size(); ++p) {
    env.ints[static_cast<std::size_t>(tune.params[p].symbol)] = values[p];
  }
  return !tune.valid || Evaluator(*tune.valid, env).boolean();
}

void OpState::default_tune(CallEnv& env) const {
  const detail::TuneSpec& tune = m_spec->tune;
  try {
    std::array<std::int64_t, k_max_tune> values{};
    for (std::size_t p = 0; p < tune.params.size(); ++p) {
      values[p] = Evaluator(tune.params[p].default_value, env).integer();
    }
    if (!set_tune(env, std::span(values.data(), tune.params.size()))) {
      std::string text;
      for (std::size_t p = 0; p < tune.params.size(); ++p) {
        text += fmt::format("{}{} = {}", text.empty() ? "" : ", ", tune.params[p].name, values[p]);
      }
      value_error(fmt::format("{}: the default configuration ({}) fails tune_valid '{}' for "
                              "these arguments",
                              m_qualified, text, tune.valid->text()));
    }
  } catch (const detail::EvalError& e) {
    value_error(fmt::format("{}: cannot compute the tune parameters: {}", m_qualified, e.what()));
  }
}

std::size_t OpState::tune_bucket(const CallEnv& env,
                                 std::array<std::int64_t, k_max_bucket>& bucket) const {
  const OpSpec& spec = *m_spec;
  std::size_t n = 0;
  try {
    for (const Expr& key : spec.tune.key) {
      bucket[n++] = Evaluator(key, env).integer();
    }
  } catch (const detail::EvalError& e) {
    value_error(fmt::format("{}: cannot compute the tune_key: {}", m_qualified, e.what()));
  }
  for (std::size_t i = 0; i < spec.num_inputs && n < k_max_bucket; ++i) {
    if (spec.symbols[i].kind == Kind::tensor) {
      bucket[n++] = env.tensors[i].handle != nullptr ? env.tensors[i].dtype : -1;
    }
  }
  return n;
}

void OpState::tune_values(const TorchApi& api, CallEnv& env, int32_t device, void* stream) {
  const std::size_t count = m_spec->tune.params.size();
  switch (m_tune_mode.load(std::memory_order_acquire)) {
  case TuneMode::defaults:
    default_tune(env);
    return;
  case TuneMode::fixed: {
    std::array<std::int64_t, k_max_tune> values{};
    {
      std::lock_guard lock(m_tune_mutex);
      values = m_fixed;
    }
    bool ok = false;
    try {
      ok = set_tune(env, std::span(values.data(), count));
    } catch (const detail::EvalError& e) {
      value_error(fmt::format("{}: cannot evaluate tune_valid: {}", m_qualified, e.what()));
    }
    if (!ok) {
      value_error(fmt::format("{}: the configuration set with kjit.tuning ({}) fails tune_valid "
                              "'{}' for these arguments",
                              m_qualified, fmt::join(std::span(values.data(), count), ", "),
                              m_spec->tune.valid->text()));
    }
    return;
  }
  case TuneMode::tuned:
    break;
  }
  std::array<std::int64_t, k_max_bucket> bucket;
  const std::size_t n = tune_bucket(env, bucket);
  const std::uint64_t generation = m_tune_generation.load(std::memory_order_acquire);
  auto matches = [&](const TuneSlot& slot) {
    return slot.generation == generation && slot.device == device && slot.size == n &&
           std::equal(bucket.begin(), bucket.begin() + n, slot.bucket.begin());
  };
  const TuneSlot* found = m_last_tuned.load(std::memory_order_acquire);
  if (found == nullptr || !matches(*found)) {
    found = nullptr;
    std::lock_guard lock(m_tune_mutex);
    for (const TuneSlot& slot : m_tuned) {
      if (matches(slot)) {
        found = &slot;
        break;
      }
    }
    if (found == nullptr) {
      const bool may_tune =
        autotune_enabled() && !detail::stream_capturing(static_cast<CUstream>(stream));
      const auto values =
        find_or_tune(api, env, std::span(bucket.data(), n), device, stream, may_tune);
      if (!values && !may_tune) {
        default_tune(env); // not remembered: a later call may tune
        return;
      }
      TuneSlot& slot = m_tuned.emplace_back();
      slot.generation = generation;
      slot.device = device;
      slot.size = n;
      std::copy(bucket.begin(), bucket.begin() + n, slot.bucket.begin());
      if (values) {
        std::copy(values->begin(), values->end(), slot.values.begin());
      } else {
        slot.use_default = true;
      }
      found = &slot;
    }
    m_last_tuned.store(const_cast<TuneSlot*>(found), std::memory_order_release);
  }
  bool ok = false;
  try {
    ok = !found->use_default && set_tune(env, std::span(found->values.data(), count));
  } catch (const detail::EvalError&) {
    ok = false;
  }
  if (!ok) {
    default_tune(env); // the bucket's tuned values do not fit these arguments
  }
}

std::optional<detail::TuneValues> OpState::find_or_tune(const TorchApi& api, CallEnv& env,
                                                        std::span<const std::int64_t> bucket,
                                                        int32_t device, void* stream,
                                                        bool may_tune) {
  const OpSpec& spec = *m_spec;
  const DeviceProps& props = device_props(device);
  if (m_source_digest.empty()) {
    m_source_digest = detail::op_source_digest(m_package, spec);
  }
  detail::TuneKeyInputs in;
  in.package = m_ns;
  in.package_digest = m_source_digest;
  in.op = spec.name;
  for (const auto& param : spec.tune.params) {
    in.candidates.emplace_back(param.name, param.values);
  }
  in.device = device_text(props);
  std::string text;
  for (std::size_t k = 0; k < spec.tune.key.size(); ++k) {
    in.bucket.push_back(bucket[k]);
    text += fmt::format("{}{} = {}", text.empty() ? "" : ", ", spec.tune.key[k].text(), bucket[k]);
  }
  std::string dtypes;
  for (std::size_t i = 0, b = spec.tune.key.size(); i < spec.num_inputs && b < bucket.size(); ++i) {
    if (spec.symbols[i].kind == Kind::tensor) {
      const std::string name = bucket[b] < 0
                                 ? std::string("None")
                                 : std::string(detail::dtype_name(static_cast<DType>(bucket[b])));
      in.dtypes.push_back(name);
      dtypes += fmt::format("{}{} {}", dtypes.empty() ? "" : ", ", spec.symbols[i].name, name);
      ++b;
    }
  }
  const std::string key = detail::tune_key(in);
  TunedEntryInfo entry;
  entry.key = key;
  entry.op = m_ns + "::" + spec.name;
  entry.bucket = text.empty() ? dtypes : text + "; " + dtypes;
  entry.device = in.device;
  std::optional<TunedConfig> config;
  try {
    config = runtime().tuned(
      m_package.scope(), entry,
      may_tune ? std::function<TunedConfig()>([&] { return tune_now(api, env, device, stream); })
               : std::function<TunedConfig()>());
  } catch (const std::invalid_argument&) {
    throw; // the default rule fails for these arguments: the call's own error
  } catch (const std::exception& e) {
    detail::log(LogLevel::warning,
                "{}: cannot tune {} on {}: {}; the default configuration "
                "serves the call",
                m_qualified, entry.bucket, entry.device, e.what());
    return std::nullopt;
  }
  if (!config) {
    return std::nullopt;
  }
  // A stored configuration comes from outside this process (a read-only store, the fleet's
  // tier): one value per parameter, each a candidate of its parameter, else it is not used.
  bool known = config->best.size() == spec.tune.params.size();
  for (std::size_t p = 0; known && p < spec.tune.params.size(); ++p) {
    const auto& values = spec.tune.params[p].values;
    known = std::find(values.begin(), values.end(), config->best[p]) != values.end();
  }
  if (!known && config->best.size() == spec.tune.params.size()) {
    CallEnv probe = env; // the default rule's values are always acceptable
    default_tune(probe);
    known = true;
    for (std::size_t p = 0; p < spec.tune.params.size(); ++p) {
      known = known &&
              probe.ints[static_cast<std::size_t>(spec.tune.params[p].symbol)] == config->best[p];
    }
  }
  if (!known) {
    detail::log(LogLevel::warning,
                "{}: the stored configuration {} of {} is not one of the op's "
                "candidates; the default configuration serves the call",
                m_qualified, key, entry.bucket);
    return std::nullopt;
  }
  return std::move(config->best);
}

TunedConfig OpState::tune_now(const TorchApi& api, const CallEnv& env, int32_t device,
                              void* stream) {
  const OpSpec& spec = *m_spec;
  const detail::TuneSpec& tune = spec.tune;
  std::vector<std::vector<std::int64_t>> lists;
  std::vector<std::string> names;
  for (const auto& param : tune.params) {
    lists.push_back(param.values);
    names.push_back(param.name);
  }
  const auto candidates = detail::tune_candidates(lists);
  CallEnv scratch_env = env;
  scratch_env.props = &device_props(device);
  detail::TuneValues fallback(tune.params.size());
  {
    CallEnv probe = scratch_env;
    default_tune(probe);
    for (std::size_t p = 0; p < tune.params.size(); ++p) {
      fallback[p] = probe.ints[static_cast<std::size_t>(tune.params[p].symbol)];
    }
  }
  precompile(scratch_env, candidates);

  Scratch copies(api);
  std::array<void*, k_max_symbols> pointers{};
  for (std::size_t i = 0; i < spec.num_inputs; ++i) {
    if (spec.inputs[i].is_mutable && spec.symbols[i].kind == Kind::tensor &&
        env.tensors[i].handle != nullptr) {
      pointers[i] = copies.copy(env.tensors[i], device, stream, m_qualified);
    }
  }
  scratch_env.scratch = &pointers;
  std::int64_t working_set = 0; // inputs, outputs and workspaces
  for (std::size_t i = 0; i < spec.symbols.size(); ++i) {
    if (spec.symbols[i].kind == Kind::tensor && env.tensors[i].handle != nullptr) {
      working_set += span_bytes(env.tensors[i]);
    }
  }
  const detail::DeviceTimerOptions options = timer_options(working_set);
  detail::TuneHooks hooks;
  hooks.valid = [&](const detail::TuneValues& values) {
    try {
      return set_tune(scratch_env, values);
    } catch (const detail::EvalError&) {
      return false;
    }
  };
  hooks.time_ms = [&](const detail::TuneValues& values) {
    set_tune(scratch_env, values);
    const auto timing = detail::time_on_device(
      static_cast<CUstream>(stream), [&](CUstream s) { enqueue_run(api, scratch_env, device, s); },
      options);
    detail::log(LogLevel::debug, "{}: {} = {}: {:.4f} ms ({} runs a batch{}, the L2 {})",
                m_qualified, fmt::join(names, ", "), fmt::join(values, ", "), timing.ms,
                timing.batch, timing.graph ? ", a graph" : "",
                options.flush_bytes > 0 ? "evicted" : "as left");
    return timing.ms;
  };
  hooks.now_s = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
  };
  auto config = detail::run_tuner(names, candidates, fallback, hooks, tune_budget_s());
  zero_workspaces(api, env, stream); // the call's own launches find them as a call leaves them
  return config;
}

void OpState::precompile(CallEnv env, const std::vector<detail::TuneValues>& candidates) {
  const OpSpec& spec = *m_spec;
  std::vector<std::pair<Program, std::string>> work;
  std::vector<std::pair<std::size_t, std::array<std::int64_t, k_max_spec>>> seen; // kernel, values
  for (const auto& values : candidates) {
    try {
      if (!set_tune(env, values)) {
        continue;
      }
      for (const auto& launch : spec.launches) {
        if (launch.when && !Evaluator(*launch.when, env).boolean()) {
          continue;
        }
        std::pair id{launch.kernel, spec_values(launch, env)};
        if (std::find(seen.begin(), seen.end(), id) == seen.end()) {
          work.push_back(specialized(launch, id.second));
          seen.push_back(std::move(id));
        }
      }
    } catch (const std::exception&) {
      // A candidate that cannot even be specialized fails when it is timed, with this error.
    }
  }
  Runtime& rt = runtime();
  const Target target = rt.default_target(); // this thread's device; the workers have none
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next++; i < work.size(); i = next++) {
      try {
        rt.compile(work[i].first, target);
      } catch (const std::exception&) {
        // Counted as a failure of the candidate when it is timed.
      }
    }
  };
  const auto started = std::chrono::steady_clock::now();
  const std::size_t threads =
    std::min<std::size_t>(work.size(), std::max(1U, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) {
    pool.emplace_back(worker);
  }
  worker();
  for (auto& t : pool) {
    t.join();
  }
  detail::log(LogLevel::info, "{}: {} kernels of {} candidates ready in {:.2f} s ({} threads)",
              m_qualified, work.size(), candidates.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
              std::max<std::size_t>(threads, 1));
}

void OpState::enqueue_run(const TorchApi& api, const CallEnv& env, int32_t device, void* stream) {
  zero_workspaces(api, env, stream);
  for (std::size_t l = 0; l < m_spec->launches.size(); ++l) {
    launch(api, env, l, device, stream);
  }
}

void OpState::zero_workspaces(const TorchApi& api, const CallEnv& env, void* stream) const {
  const OpSpec& spec = *m_spec;
  const std::size_t first = spec.num_inputs + spec.outputs.size();
  for (std::size_t w = 0; w < spec.workspaces.size(); ++w) {
    if (!spec.workspaces[w].zero) {
      continue;
    }
    const TensorRef& ws = env.tensors[first + w];
    const auto bytes =
      static_cast<std::size_t>(env.numel(static_cast<int>(first + w))) * element_size(ws.dtype);
    if (bytes == 0) {
      continue;
    }
    void* ptr = nullptr;
    check(api.aoti_torch_get_data_ptr(ws.handle, &ptr), "aoti_torch_get_data_ptr",
          m_qualified.c_str());
    KJIT_CU_CHECK(detail::driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(ptr), 0, bytes,
                                                   static_cast<CUstream>(stream)),
                  "{}: zeroing workspace '{}' for the tuner", m_qualified, spec.workspaces[w].name);
  }
}

} // namespace kjit::torch_layer
