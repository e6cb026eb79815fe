// One kjit op's CUDA path (Note [Op registration] in ops.hpp): the state an op keeps between
// calls and the steps of a call, split over op_call.cpp (binding, checks, outputs, workspaces),
// op_launch.cpp (kernel slots, geometry, packing, launches) and op_tune.cpp (the tuned
// configuration of a call, Note [Tuning]).
#pragma once

#include "abi.hpp"
#include "call_env.hpp"

#include <kjit/package.hpp>
#include <kjit/runtime.hpp>

#include "runtime/manifest/op_spec.hpp"
#include "runtime/tune/tuner.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kjit::torch_layer {

using detail::ArgType;
using detail::DType;
using detail::Evaluator;
using detail::Expr;
using detail::Kind;
using detail::OpSpec;

constexpr std::size_t k_max_spec = 8;                // placeholders of one launch
constexpr std::size_t k_max_rank = 16;               // of an output or workspace
constexpr std::size_t k_max_ops = 1024;              // trampolines
constexpr std::size_t k_max_launches = 16;           // of one op
constexpr std::int64_t k_default_shared = 48 * 1024; // dynamic shared memory without opt-in
constexpr std::size_t k_max_tune = detail::k_max_tune_params; // tune parameters of one op
// A call's bucket: its tune_key values, then a dtype per tensor argument.
constexpr std::size_t k_max_bucket = detail::k_max_tune_key + k_max_symbols;

// A value error (torch raises ValueError for std::invalid_argument) naming the op.
[[noreturn]] inline void value_error(const std::string& message) {
  throw std::invalid_argument(message);
}

[[noreturn]] inline void runtime_error(const std::string& message) {
  throw std::runtime_error(message);
}

// The references one call owns: the stack's tensors (taken over), the outputs and workspaces
// until they are returned or dropped, and torch's string and list handles. Deleted on every way
// out.
class Handles {
public:
  explicit Handles(const TorchApi& api) : m_api(api) {}
  ~Handles() {
    for (std::size_t i = 0; i < m_count; ++i) {
      if (m_tensors[i] != nullptr) {
        m_api.aoti_torch_delete_tensor_object(m_tensors[i]);
      }
      if (m_strings[i] != nullptr) {
        m_api.torch_delete_string(m_strings[i]);
      }
      if (m_lists[i] != nullptr) {
        m_api.torch_delete_list(m_lists[i]);
      }
    }
  }
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;

  void own(std::size_t i, AtenTensorHandle h) {
    m_tensors[i] = h;
    m_count = std::max(m_count, i + 1);
  }
  void own(std::size_t i, StringHandle h) {
    m_strings[i] = h;
    m_count = std::max(m_count, i + 1);
  }
  void own(std::size_t i, StableListHandle h) {
    m_lists[i] = h;
    m_count = std::max(m_count, i + 1);
  }
  AtenTensorHandle release(std::size_t i) { return std::exchange(m_tensors[i], nullptr); }

private:
  const TorchApi& m_api;
  std::array<AtenTensorHandle, k_max_symbols> m_tensors{};
  std::array<StringHandle, k_max_symbols> m_strings{};
  std::array<StableListHandle, k_max_symbols> m_lists{};
  std::size_t m_count = 0;
};

// A compiled specialization of one launch's kernel for one device.
struct KernelSlot {
  std::size_t launch = 0;
  std::array<std::int64_t, k_max_spec> values{};
  int device = -1;
  Kernel kernel;
  std::atomic<std::int64_t> shared_set{k_default_shared}; // dynamic shared memory allowed
};

// The tuned configuration of one bucket (tune_key values, then the tensor arguments' dtypes) on
// one device (Note [Tuning]).
struct TuneSlot {
  std::uint64_t generation = 0; // OpState::m_tune_generation when it was made
  int device = -1;
  std::size_t size = 0;
  std::array<std::int64_t, k_max_bucket> bucket{};
  std::array<std::int64_t, k_max_tune> values{};
  bool use_default = false; // tuning failed, or the stored values were unusable: not retried
};

// How an op picks its tune parameters (`kjit.tuning`): tuned per bucket (the default), the
// package's default rule, or one configuration for every call (tests, benchmarks).
enum class TuneMode : std::uint8_t { tuned, defaults, fixed };

// One op's CUDA path. `returns_outputs_only`: the twin of an op whose returns alias its
// arguments (Note [Aliasing returns]), which returns its new outputs alone.
class OpState {
public:
  OpState(Package package, std::shared_ptr<const OpSpec> spec, std::string ns, std::string name,
          bool outputs_only)
    : m_package(std::move(package)), m_spec(std::move(spec)), m_ns(std::move(ns)),
      m_qualified(m_ns + "::" + name), m_outputs_only(outputs_only) {}

  const std::string& qualified() const { return m_qualified; }
  const std::string& ns() const { return m_ns; }
  const OpSpec& spec() const { return *m_spec; }

  // The boxed kernel: arguments on `stack`, results written back to its front.
  void run(StableIValue* stack, std::uint64_t num_args, std::uint64_t num_returns);

  // How later calls pick their tune parameters; `values` (one per parameter) with `fixed`.
  // Throws kjit::Error for an op without tune parameters or a wrong number of values.
  void set_tune_mode(TuneMode mode, const std::vector<std::int64_t>& values);
  // Forgets the configurations this process looked up or tuned (the store keeps them).
  void forget_tuned();

private:
  // Takes every reference of the stack first (nothing throws before all are owned), then reads
  // them: optionals unwrapped (torch boxes a present one in a heap StableIValue), strings mapped
  // to the manifest's integers, int lists copied into the call's pool.
  void bind_inputs(const TorchApi& api, const StableIValue* stack, std::uint64_t num_args,
                   CallEnv& env, Handles& owned) const;

  std::int64_t string_value(const TorchApi& api, std::size_t i, StringHandle handle) const;

  void read_list(const TorchApi& api, std::size_t i, StableListHandle list, CallEnv& env) const;

  // The CUDA device all present tensor arguments share; throws ValueError naming the odd one out.
  int32_t common_device(const TorchApi& api, const CallEnv& env) const;

  // Runs the checks; throws ValueError naming the check and the actual tensors.
  void check_values(const TorchApi& api, const CallEnv& env) const;

  std::string tensors_text(const TorchApi& api, const CallEnv& env) const;

  void output_shape(std::size_t o, const CallEnv& env, std::array<std::int64_t, k_max_rank>& shape,
                    std::size_t& rank, DType& dtype) const;

  // A new tensor as symbol `symbol` (an output or a workspace), owned by the call: contiguous,
  // or with like_strides (a non-overlapping and dense tensor's, of the same shape).
  void allocate(const TorchApi& api, CallEnv& env, Handles& owned, std::size_t symbol,
                const std::array<std::int64_t, k_max_rank>& shape, std::size_t rank, DType dtype,
                int32_t device, const int64_t* like_strides = nullptr) const;

  // The workspaces, from torch's caching allocator (stream-ordered: freed when the call
  // returns, reused only by work queued after it on the stream), zeroed on the stream.
  void make_workspaces(const TorchApi& api, CallEnv& env, Handles& owned, int32_t device,
                       void* stream) const;

  // The kernel slot of launch `l` for this call's specialization values on `device` (compiled or
  // fetched once). The slot of the launch's previous call is checked first, without a lock: a
  // stream of calls with the same dtypes pays one comparison. Slots live in a deque, so the
  // reference stays valid.
  KernelSlot& kernel(std::size_t l, const CallEnv& env, int device);
  // The values of `launch`'s specialization placeholders for this call; ValueError when one
  // cannot be computed.
  std::array<std::int64_t, k_max_spec> spec_values(const detail::LaunchSpec& launch,
                                                   const CallEnv& env) const;
  // The program and kernel name of `launch` specialized by `values`.
  std::pair<Program, std::string>
  specialized(const detail::LaunchSpec& launch,
              const std::array<std::int64_t, k_max_spec>& values) const;

  unsigned launch_dim(const Expr& expr, const CallEnv& env, const char* what) const;

  // Packs one kernel argument into `slot` as the kernel's parameter `size` asks; returns its size.
  // An absent optional tensor is a null pointer.
  std::size_t pack(const TorchApi& api, const Expr& expr, const CallEnv& env,
                   std::size_t param_size, std::uint64_t& slot, std::size_t index) const;

  void launch_all(const TorchApi& api, CallEnv& env, Handles& owned, int32_t device);

  // Note [Tuning]: sets the tune parameters of this call: its bucket's tuned configuration
  // (looked up in this process's memo, then in the stores, else tuned now on `stream`'s device),
  // the default rule where tuning must not run (the stream is being captured, KJIT_AUTOTUNE=0) or
  // where the tuned values fail tune_valid for these arguments, or the mode's.
  void tune_values(const TorchApi& api, CallEnv& env, int32_t device, void* stream);
  // The default rule's values (tune_default); throws ValueError when they fail tune_valid.
  void default_tune(CallEnv& env) const;
  // Sets the parameters to `values` and says whether tune_valid holds for them.
  bool set_tune(CallEnv& env, std::span<const std::int64_t> values) const;
  // The bucket of this call (tune_key values, then the tensor arguments' dtypes, -1 when absent).
  std::size_t tune_bucket(const CallEnv& env, std::array<std::int64_t, k_max_bucket>& bucket) const;
  // The tuned configuration of this call's bucket from the stores or, when `may_tune`, tuned now.
  std::optional<detail::TuneValues> find_or_tune(const TorchApi& api, CallEnv& env,
                                                 std::span<const std::int64_t> bucket,
                                                 int32_t device, void* stream, bool may_tune);
  // Times the candidates on the device (Note [Device timer]), their kernels compiled first, in
  // parallel; the written arguments replaced by scratch copies, zeroed workspaces re-zeroed
  // before every run.
  TunedConfig tune_now(const TorchApi& api, const CallEnv& env, int32_t device, void* stream);
  // Compiles the kernels of every valid candidate in parallel (errors resurface when timed).
  void precompile(CallEnv env, const std::vector<detail::TuneValues>& candidates);
  // Enqueues one run of the launches on `stream` (workspaces that ask for it zeroed first).
  void enqueue_run(const TorchApi& api, const CallEnv& env, int32_t device, void* stream);
  // Zeroes, on `stream`, the workspaces that ask to be zeroed.
  void zero_workspaces(const TorchApi& api, const CallEnv& env, void* stream) const;

  void launch(const TorchApi& api, const CallEnv& env, std::size_t l, int32_t device, void* stream);

  // Dynamic shared memory above 48 KiB needs the kernel's opt-in, up to the device's limit.
  void allow_shared_memory(KernelSlot& slot, unsigned bytes, int32_t device,
                           const std::string& which) const;

  Package m_package;
  std::shared_ptr<const OpSpec> m_spec;
  std::string m_ns;
  std::string m_qualified;
  bool m_outputs_only;
  std::mutex m_mutex;
  std::deque<KernelSlot> m_kernels; // guarded by m_mutex; elements never move
  std::array<std::atomic<KernelSlot*>, k_max_launches> m_last{}; // each launch's latest slot
  // Note [Tuning]: the configurations of the buckets seen, and how they are picked.
  std::mutex m_tune_mutex;
  std::deque<TuneSlot> m_tuned;                 // guarded by m_tune_mutex; elements never move
  std::atomic<TuneSlot*> m_last_tuned{nullptr}; // the latest call's
  std::atomic<TuneMode> m_tune_mode{TuneMode::tuned};
  std::atomic<std::uint64_t> m_tune_generation{0}; // forget_tuned moves on; older slots unused
  std::array<std::int64_t, k_max_tune> m_fixed{};  // with TuneMode::fixed, set before the mode
  std::string m_source_digest;                     // guarded by m_tune_mutex; empty until needed
};

} // namespace kjit::torch_layer
