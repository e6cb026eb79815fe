// The registration of kjit ops' CUDA kernels on torch's stable ABI (Note [Op registration]): the
// trampoline pool and the per-process limits. The call path itself is OpState (op_state.hpp).
#include "ops.hpp"

#include "abi.hpp"
#include "op_state.hpp"

#include <kjit/error.hpp>

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <mutex>
#include <utility>

namespace kjit::torch_layer {
namespace {

// The trampoline pool: kernel I runs the op in slot I. Slots are filled once and never freed
// (the dispatcher keeps the kernels for the process).
std::array<std::atomic<OpState*>, k_max_ops> g_slots{};

template <std::size_t I>
void trampoline(StableIValue* stack, std::uint64_t num_args, std::uint64_t num_returns) {
  g_slots[I].load(std::memory_order_acquire)->run(stack, num_args, num_returns);
}

using BoxedKernel = void (*)(StableIValue*, std::uint64_t, std::uint64_t);

template <std::size_t... I>
constexpr std::array<BoxedKernel, sizeof...(I)> make_trampolines(std::index_sequence<I...>) {
  return {&trampoline<I>...};
}

constexpr auto k_trampolines = make_trampolines(std::make_index_sequence<k_max_ops>{});

std::mutex g_register_mutex;
std::size_t g_used = 0; // slots taken, guarded by g_register_mutex

} // namespace

Runtime& runtime() {
  static auto* r = new Runtime(); // never destroyed: kernels may run during interpreter exit
  return *r;
}

void check_package(const Package& package) {
  for (const auto& spec : package.op_specs()) {
    const std::string qualified = spec->ns + "::" + spec->name;
    if (spec->symbols.size() > k_max_symbols) {
      throw Error(fmt::format("op '{}' has {} arguments and outputs; kjit ops take at most {}",
                              qualified, spec->symbols.size(), k_max_symbols));
    }
    if (spec->launches.size() > k_max_launches) {
      throw Error(fmt::format("op '{}' has {} launches; at most {}", qualified,
                              spec->launches.size(), k_max_launches));
    }
    for (const auto& launch : spec->launches) {
      if (launch.specialize.size() > k_max_spec) {
        throw Error(fmt::format("op '{}' has a launch of {} specialization placeholders; at "
                                "most {}",
                                qualified, launch.specialize.size(), k_max_spec));
      }
      if (launch.args.size() > 256) {
        throw Error(fmt::format("op '{}' passes {} kernel arguments; at most 256", qualified,
                                launch.args.size()));
      }
    }
    if (spec->num_inputs > 63) {
      throw Error(fmt::format("op '{}' has {} arguments; at most 63", qualified, spec->num_inputs));
    }
    for (const auto& out : spec->outputs) {
      if (out.like < 0 && out.shape.size() > k_max_rank) {
        throw Error(fmt::format("op '{}' declares an output of {} dimensions; at most {}",
                                qualified, out.shape.size(), k_max_rank));
      }
    }
  }
  std::size_t needed = 0;
  for (const auto& spec : package.op_specs()) {
    // Note [Aliasing returns], Note [Backward ops]: the op and its twin.
    needed += spec->has_twin() ? 2 : 1;
  }
  std::lock_guard lock(g_register_mutex);
  if (g_used + needed > k_max_ops) {
    throw Error(fmt::format("kjit's torch layer serves at most {} ops per process; {} are "
                            "registered and package '{}' brings {}",
                            k_max_ops, g_used, package.name(), needed));
  }
}

void register_cuda(const Package& package, const std::string& ns) {
  check_package(package);
  const TorchApi& api = torch_api();
  std::lock_guard lock(g_register_mutex);
  TorchLibraryHandle library = nullptr;
  check(api.aoti_torch_library_init_impl(ns.c_str(), "CUDA", __FILE__, __LINE__, &library),
        "aoti_torch_library_init_impl", ns.c_str());
  auto add = [&](const std::shared_ptr<const OpSpec>& spec, const std::string& name,
                 bool outputs_only) {
    // Lives as long as the dispatcher's kernel.
    auto* state = new OpState(package, spec, ns, name, outputs_only);
    g_slots[g_used].store(state, std::memory_order_release);
    check(api.torch_library_impl(library, name.c_str(), k_trampolines[g_used], TORCH_ABI_VERSION),
          "torch_library_impl", state->qualified().c_str());
    ++g_used;
  };
  for (const auto& spec : package.op_specs()) {
    add(spec, spec->name, false);
    if (spec->has_twin()) {
      add(spec, twin_name(spec->name), true); // Note [Aliasing returns]
    }
  }
  // The library handle is never deleted: deleting it would remove the kernels.
}

namespace {

// The registered states of `ns::name`: the op's and its twin's. Throws kjit::Error when none.
std::vector<OpState*> states_of(const std::string& ns, const std::string& name) {
  std::vector<OpState*> found;
  std::lock_guard lock(g_register_mutex);
  for (std::size_t i = 0; i < g_used; ++i) {
    OpState* state = g_slots[i].load(std::memory_order_acquire);
    if (state->ns() == ns && state->spec().name == name) {
      found.push_back(state);
    }
  }
  if (found.empty()) {
    throw Error(fmt::format("no CUDA kernel of op '{}::{}' is registered (kjit.load its package "
                            "in a process whose torch has CUDA)",
                            ns, name));
  }
  return found;
}

} // namespace

void set_tune_mode(const std::string& ns, const std::string& name, const std::string& mode,
                   const std::vector<std::int64_t>& values) {
  const TuneMode m = mode == "tuned"     ? TuneMode::tuned
                     : mode == "default" ? TuneMode::defaults
                     : mode == "fixed"   ? TuneMode::fixed
                                         : throw Error(fmt::format("unknown tune mode '{}' (tuned, "
                                                                     "default, fixed)",
                                                                   mode));
  for (OpState* state : states_of(ns, name)) {
    state->set_tune_mode(m, values);
  }
}

void forget_tuned(const std::string& ns, const std::string& name) {
  for (OpState* state : states_of(ns, name)) {
    state->forget_tuned();
  }
}

} // namespace kjit::torch_layer
