// The CUDA kernels of kjit ops, on torch's stable ABI (Note [Op registration]). Over 600 lines:
// one op's call path (binding, checks, outputs, kernel slots, packing, launch) is one class whose
// steps share the per-call environment.
#include "ops.hpp"

#include "abi.hpp"

#include <kjit/error.hpp>

#include "runtime/cuda/driver.hpp"
#include "runtime/logging.hpp"
#include "runtime/op_spec.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace kjit::torch_layer {
namespace {

using detail::DType;
using detail::Evaluator;
using detail::Expr;
using detail::Kind;
using detail::OpSpec;

// Symbols (arguments and outputs) an op may have; bounds the per-call arrays.
constexpr std::size_t k_max_symbols = 32;
constexpr std::size_t k_max_spec = 4;
constexpr std::size_t k_max_rank = 16; // of an output
constexpr std::size_t k_max_ops = 1024;

// A value error (torch raises ValueError for std::invalid_argument) naming the op.
[[noreturn]] void value_error(const std::string& message) {
  throw std::invalid_argument(message);
}

[[noreturn]] void runtime_error(const std::string& message) {
  throw std::runtime_error(message);
}

// What the CUDA path reads of a tensor, read once per call.
struct TensorRef {
  AtenTensorHandle handle;
  const int64_t* sizes;
  const int64_t* strides;
  int64_t dim;
  int32_t dtype;
  int32_t device_type;
  int32_t device_index;
};

TensorRef read_tensor(const TorchApi& api, AtenTensorHandle handle) {
  TensorRef t{};
  t.handle = handle;
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
  const bool ok = api.aoti_torch_get_dim(handle, &t.dim) == AOTI_TORCH_SUCCESS &&
                  api.aoti_torch_get_sizes(handle, &sizes) == AOTI_TORCH_SUCCESS &&
                  api.aoti_torch_get_strides(handle, &strides) == AOTI_TORCH_SUCCESS &&
                  api.aoti_torch_get_dtype(handle, &t.dtype) == AOTI_TORCH_SUCCESS &&
                  api.aoti_torch_get_device_type(handle, &t.device_type) == AOTI_TORCH_SUCCESS &&
                  api.aoti_torch_get_device_index(handle, &t.device_index) == AOTI_TORCH_SUCCESS;
  if (!ok) {
    throw_failed("tensor metadata call", "kjit op");
  }
  t.sizes = sizes;
  t.strides = strides;
  return t;
}

// The tensor handles of one call: the inputs (the stack's owning references, taken over) and the
// outputs until they are returned. Deleted on every way out.
class Handles {
public:
  explicit Handles(const TorchApi& api) : m_api(api) {}
  ~Handles() {
    for (std::size_t i = 0; i < m_count; ++i) {
      if (m_handles[i] != nullptr) {
        m_api.aoti_torch_delete_tensor_object(m_handles[i]);
      }
    }
  }
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;

  void own(std::size_t i, AtenTensorHandle h) {
    m_handles[i] = h;
    m_count = std::max(m_count, i + 1);
  }
  AtenTensorHandle release(std::size_t i) { return std::exchange(m_handles[i], nullptr); }

private:
  const TorchApi& m_api;
  std::array<AtenTensorHandle, k_max_symbols> m_handles{};
  std::size_t m_count = 0;
};

// The values of one call: tensors' metadata, scalars by value. No allocation.
struct CallEnv {
  using Int = std::int64_t;
  // Written by binding before any read: not zero-initialized (per-call cost).
  std::array<TensorRef, k_max_symbols> tensors;
  std::array<std::int64_t, k_max_symbols> ints;
  std::array<double, k_max_symbols> floats;

  Int size(int t, std::int64_t d) const { return tensors[t].sizes[d]; }
  Int stride(int t, std::int64_t d) const { return tensors[t].strides[d]; }
  Int numel(int t) const {
    Int n = 1;
    for (std::int64_t d = 0; d < tensors[t].dim; ++d) {
      n *= tensors[t].sizes[d];
    }
    return n;
  }
  std::int64_t dim(int t) const { return tensors[t].dim; }
  DType dtype(int t) const { return static_cast<DType>(tensors[t].dtype); }
  // As torch's default-format contiguity: row-major strides, ignoring dimensions of size 1.
  bool is_contiguous(int t) const {
    const TensorRef& r = tensors[t];
    std::int64_t expected = 1;
    for (std::int64_t d = r.dim - 1; d >= 0; --d) {
      if (r.sizes[d] == 0) {
        return true;
      }
      if (r.sizes[d] != 1) {
        if (r.strides[d] != expected) {
          return false;
        }
        expected *= r.sizes[d];
      }
    }
    return true;
  }
  Int int_value(int s) const { return ints[s]; }
  double float_value(int s) const { return floats[s]; }
  bool bool_value(int s) const { return ints[s] != 0; }
  static Int min(Int a, Int b) { return std::min(a, b); }
  static Int max(Int a, Int b) { return std::max(a, b); }
  static bool truth(bool value) { return value; }
  static std::optional<std::int64_t> concrete(Int value) { return value; }
};

std::string device_text(const TorchApi& api, const TensorRef& t) {
  if (t.device_type == api.cuda) {
    return fmt::format("cuda:{}", t.device_index);
  }
  if (t.device_type == api.cpu) {
    return "cpu";
  }
  return fmt::format("device type {}", t.device_type);
}

std::string describe(const TorchApi& api, const std::string& name, const CallEnv& env, int i) {
  const TensorRef& t = env.tensors[i];
  const auto dtype = detail::dtype_name(static_cast<DType>(t.dtype));
  return fmt::format("'{}' has shape [{}], dtype {}, device {}{}", name,
                     fmt::join(std::span(t.sizes, static_cast<std::size_t>(t.dim)), ", "),
                     dtype != "unknown" ? std::string(dtype) : fmt::format("code {}", t.dtype),
                     device_text(api, t), env.is_contiguous(i) ? "" : ", not contiguous");
}

// A compiled specialization of an op's kernel for one device.
struct KernelSlot {
  std::array<std::int64_t, k_max_spec> values{};
  int device = -1;
  Kernel kernel;
};

// One op's CUDA path.
class OpState {
public:
  OpState(Package package, std::shared_ptr<const OpSpec> spec, std::string ns)
    : m_package(std::move(package)), m_spec(std::move(spec)), m_ns(std::move(ns)),
      m_qualified(m_ns + "::" + m_spec->name) {}

  const OpSpec& spec() const { return *m_spec; }
  const std::string& qualified() const { return m_qualified; }

  // The boxed kernel: arguments on `stack`, results written back to its front.
  void run(StableIValue* stack, std::uint64_t num_args, std::uint64_t num_returns) {
    const TorchApi& api = torch_api();
    const OpSpec& spec = *m_spec;
    Handles owned(api);
    CallEnv env;
    bind_inputs(api, stack, num_args, env, owned);
    if (num_returns != spec.outputs.size()) {
      runtime_error(fmt::format("{}: torch passes {} returns, the manifest declares {} outputs",
                                m_qualified, num_returns, spec.outputs.size()));
    }
    const int32_t device = common_device(api, env);
    // A device guard only when the tensors are not on the current device (it allocates and
    // sets the device twice). The current device is the current context's, asked of the driver:
    // what torch's cudaGetDevice answers, at a quarter of the cost of
    // aoti_torch_get_current_device_index (65 vs 250 ns on the H200; it goes through
    // at::accelerator). No current context (a thread new to CUDA) takes the guard.
    CUdevice current = -1;
    if (detail::driver().cuCtxGetDevice(&current) != CUDA_SUCCESS) {
      current = -1;
    }
    DeviceGuardHandle guard = nullptr;
    if (current != device) {
      check(api.aoti_torch_create_device_guard(device, &guard), "aoti_torch_create_device_guard",
            m_qualified.c_str());
    }
    struct GuardDeleter {
      const TorchApi& api;
      DeviceGuardHandle guard;
      ~GuardDeleter() {
        if (guard != nullptr) {
          api.aoti_torch_delete_device_guard(guard);
        }
      }
    } guard_deleter{api, guard};
    check_values(api, env);

    bool empty = true;
    std::array<std::int64_t, k_max_rank> shape; // written before read
    std::array<std::int64_t, k_max_rank> strides;
    for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
      std::size_t rank = 0;
      DType dtype{};
      output_shape(o, env, shape, rank, dtype);
      std::int64_t step = 1;
      bool this_empty = false;
      for (std::size_t d = rank; d-- > 0;) {
        strides[d] = step;
        step *= std::max<std::int64_t>(shape[d], 1);
        this_empty = this_empty || shape[d] == 0;
      }
      empty = empty && this_empty;
      AtenTensorHandle out = nullptr;
      check(api.aoti_torch_empty_strided(static_cast<int64_t>(rank), shape.data(), strides.data(),
                                         static_cast<int32_t>(dtype), api.cuda, device, &out),
            "aoti_torch_empty_strided", m_qualified.c_str());
      const std::size_t symbol = spec.num_inputs + o;
      owned.own(symbol, out);
      // What torch would answer is known but for where it keeps the sizes and strides.
      TensorRef& ref = env.tensors[symbol];
      ref.handle = out;
      int64_t* sizes = nullptr;
      int64_t* out_strides = nullptr;
      check(api.aoti_torch_get_sizes(out, &sizes), "aoti_torch_get_sizes", m_qualified.c_str());
      check(api.aoti_torch_get_strides(out, &out_strides), "aoti_torch_get_strides",
            m_qualified.c_str());
      ref.sizes = sizes;
      ref.strides = out_strides;
      ref.dim = static_cast<int64_t>(rank);
      ref.dtype = static_cast<int32_t>(dtype);
      ref.device_type = api.cuda;
      ref.device_index = device;
    }
    if (!empty || spec.outputs.empty()) {
      launch(api, env, device);
    }
    for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
      stack[o] = reinterpret_cast<StableIValue>(owned.release(spec.num_inputs + o));
    }
  }

private:
  void bind_inputs(const TorchApi& api, const StableIValue* stack, std::uint64_t num_args,
                   CallEnv& env, Handles& owned) const {
    const std::size_t n = m_spec->num_inputs;
    if (num_args != n) {
      runtime_error(fmt::format("{}: torch passes {} arguments, the manifest declares {}",
                                m_qualified, num_args, n));
    }
    for (std::size_t i = 0; i < n; ++i) {
      const StableIValue value = stack[i];
      switch (m_spec->symbols[i].kind) {
      case Kind::tensor: {
        auto* handle = reinterpret_cast<AtenTensorHandle>(value);
        owned.own(i, handle);
        env.tensors[i] = read_tensor(api, handle);
        break;
      }
      case Kind::int_:
        std::memcpy(&env.ints[i], &value, sizeof(std::int64_t));
        break;
      case Kind::float_:
        std::memcpy(&env.floats[i], &value, sizeof(double));
        break;
      case Kind::bool_: {
        bool b = false;
        std::memcpy(&b, &value, sizeof b);
        env.ints[i] = b;
        break;
      }
      case Kind::dtype: {
        std::int32_t code = 0;
        std::memcpy(&code, &value, sizeof code);
        env.ints[i] = code;
        break;
      }
      }
    }
  }

  // The CUDA device all tensor arguments share; throws ValueError naming the odd one out.
  int32_t common_device(const TorchApi& api, const CallEnv& env) const {
    const OpSpec& spec = *m_spec;
    int first = -1;
    for (std::size_t i = 0; i < spec.num_inputs; ++i) {
      if (spec.symbols[i].kind != Kind::tensor) {
        continue;
      }
      const TensorRef& t = env.tensors[i];
      if (first < 0) {
        first = static_cast<int>(i);
      } else if (t.device_type != env.tensors[first].device_type ||
                 t.device_index != env.tensors[first].device_index) {
        value_error(fmt::format("{}: expected all tensors on one device, but '{}' is on {} and "
                                "'{}' is on {}",
                                m_qualified, spec.symbols[first].name,
                                device_text(api, env.tensors[first]), spec.symbols[i].name,
                                device_text(api, t)));
      }
    }
    if (first < 0) {
      value_error(m_qualified + ": no tensor argument");
    }
    if (env.tensors[first].device_type != api.cuda) {
      value_error(fmt::format("{}: expected CUDA tensors, got {}", m_qualified,
                              device_text(api, env.tensors[first])));
    }
    return env.tensors[first].device_index;
  }

  // Runs the checks; throws ValueError naming the check and the actual tensors.
  void check_values(const TorchApi& api, const CallEnv& env) const {
    for (const Expr& check : m_spec->checks) {
      bool ok = false;
      try {
        ok = Evaluator(check, env).boolean();
      } catch (const detail::EvalError& e) {
        value_error(fmt::format("{}: cannot evaluate check '{}': {}; {}", m_qualified, check.text(),
                                e.what(), tensors_text(api, env)));
      }
      if (!ok) {
        value_error(fmt::format("{}: check '{}' failed: {}", m_qualified, check.text(),
                                tensors_text(api, env)));
      }
    }
  }

  std::string tensors_text(const TorchApi& api, const CallEnv& env) const {
    std::string text;
    for (std::size_t i = 0; i < m_spec->num_inputs; ++i) {
      if (m_spec->symbols[i].kind == Kind::tensor) {
        text += (text.empty() ? "" : "; ") +
                describe(api, m_spec->symbols[i].name, env, static_cast<int>(i));
      }
    }
    return text;
  }

  void output_shape(std::size_t o, const CallEnv& env, std::array<std::int64_t, k_max_rank>& shape,
                    std::size_t& rank, DType& dtype) const {
    const detail::OutputSpec& out = m_spec->outputs[o];
    try {
      if (out.like >= 0) {
        const TensorRef& like = env.tensors[out.like];
        rank = static_cast<std::size_t>(like.dim);
        if (rank > k_max_rank) {
          value_error(fmt::format("{}: output {} would have {} dimensions; kjit ops make outputs "
                                  "of at most {}",
                                  m_qualified, o, rank, k_max_rank));
        }
        std::copy(like.sizes, like.sizes + rank, shape.begin());
        for (const auto& [dim, expr] : out.dims) {
          const auto r = static_cast<std::int64_t>(rank);
          const std::int64_t d = dim < 0 ? dim + r : dim;
          if (d < 0 || d >= r) {
            value_error(fmt::format("{}: output {} replaces dimension {} of '{}', which has {} "
                                    "dimensions",
                                    m_qualified, o, dim, m_spec->symbols[out.like].name, r));
          }
          shape[d] = Evaluator(expr, env).integer();
        }
        dtype = static_cast<DType>(like.dtype);
      } else {
        rank = out.shape.size();
        for (std::size_t d = 0; d < rank; ++d) {
          shape[d] = Evaluator(out.shape[d], env).integer();
        }
      }
      if (out.dtype) {
        dtype = Evaluator(*out.dtype, env).dtype();
      }
    } catch (const detail::EvalError& e) {
      value_error(
        fmt::format("{}: cannot compute the shape of output {}: {}", m_qualified, o, e.what()));
    }
    for (std::size_t d = 0; d < rank; ++d) {
      if (shape[d] < 0) {
        value_error(fmt::format("{}: output {} would have size {} in dimension {}", m_qualified, o,
                                shape[d], d));
      }
    }
  }

  // The kernel for this call's specialization values on `device` (compiled or fetched once).
  // The slot of the previous call is checked first, without a lock: a stream of calls with the
  // same dtypes pays one comparison. Slots live in a deque, so the reference stays valid.
  const Kernel& kernel(const CallEnv& env, int device) {
    KernelSlot key;
    key.device = device;
    for (std::size_t i = 0; i < m_spec->specialize.size(); ++i) {
      const Expr& expr = m_spec->specialize[i].expr;
      key.values[i] = expr.kind() == Kind::dtype
                        ? static_cast<std::int64_t>(Evaluator(expr, env).dtype())
                      : expr.kind() == Kind::bool_ ? std::int64_t(Evaluator(expr, env).boolean())
                                                   : Evaluator(expr, env).integer();
    }
    const KernelSlot* last = m_last.load(std::memory_order_acquire);
    if (last != nullptr && last->device == key.device && last->values == key.values) {
      return last->kernel;
    }
    std::lock_guard lock(m_mutex);
    for (const KernelSlot& slot : m_kernels) {
      if (slot.device == key.device && slot.values == key.values) {
        m_last.store(&slot, std::memory_order_release);
        return slot.kernel;
      }
    }
    std::vector<std::pair<std::string, std::string>> texts;
    for (std::size_t i = 0; i < m_spec->specialize.size(); ++i) {
      const auto& param = m_spec->specialize[i];
      texts.emplace_back(param.name, detail::specialization_text(param.expr.kind(), key.values[i]));
    }
    const auto start = std::chrono::steady_clock::now();
    const KernelDecl& decl = m_package.kernels()[m_spec->kernel];
    auto [program, name] = m_package.specialize(decl, texts);
    const auto specialized = std::chrono::steady_clock::now();
    key.kernel = runtime().kernel(program, name);
    using Ms = std::chrono::duration<double, std::milli>;
    detail::log(LogLevel::debug, "{}: kernel for cuda:{} ready in {:.2f} ms (program {:.2f} ms)",
                m_qualified, device, Ms(std::chrono::steady_clock::now() - start).count(),
                Ms(specialized - start).count());
    const KernelSlot& slot = m_kernels.emplace_back(std::move(key));
    m_last.store(&slot, std::memory_order_release);
    return slot.kernel;
  }

  unsigned launch_dim(const Expr& expr, const CallEnv& env, const char* what) const {
    const std::int64_t value = Evaluator(expr, env).integer();
    if (value < 0 || value > INT32_MAX) {
      value_error(
        fmt::format("{}: {} '{}' is {}, outside [0, 2^31)", m_qualified, what, expr.text(), value));
    }
    return static_cast<unsigned>(value);
  }

  // Packs one kernel argument into `slot` as the kernel's parameter `size` asks; returns its size.
  std::size_t pack(const TorchApi& api, const Expr& expr, const CallEnv& env,
                   std::size_t param_size, std::uint64_t& slot, std::size_t index) const {
    switch (expr.kind()) {
    case Kind::tensor: {
      const auto symbol = expr.nodes()[expr.root()].a;
      void* ptr = nullptr;
      check(api.aoti_torch_get_data_ptr(env.tensors[symbol].handle, &ptr),
            "aoti_torch_get_data_ptr", m_qualified.c_str());
      std::memcpy(&slot, &ptr, sizeof ptr);
      return sizeof ptr;
    }
    case Kind::int_: {
      const std::int64_t value = Evaluator(expr, env).integer();
      if (param_size == 8) {
        std::memcpy(&slot, &value, 8);
        return 8;
      }
      if (value < INT32_MIN || value > INT32_MAX) {
        value_error(fmt::format("{}: kernel argument {} ('{}') is {}, which does not fit the "
                                "kernel's 32-bit parameter",
                                m_qualified, index, expr.text(), value));
      }
      const auto narrow = static_cast<std::int32_t>(value);
      std::memcpy(&slot, &narrow, 4);
      return 4;
    }
    case Kind::float_: {
      const double value = Evaluator(expr, env).number();
      if (param_size == 8) {
        std::memcpy(&slot, &value, 8);
        return 8;
      }
      const auto narrow = static_cast<float>(value);
      std::memcpy(&slot, &narrow, 4);
      return 4;
    }
    case Kind::bool_: {
      const bool value = Evaluator(expr, env).boolean();
      std::memcpy(&slot, &value, 1);
      return 1;
    }
    case Kind::dtype:
      break;
    }
    runtime_error(
      fmt::format("{}: kernel argument {} ('{}') is a dtype", m_qualified, index, expr.text()));
  }

  void launch(const TorchApi& api, const CallEnv& env, int32_t device) {
    const OpSpec& spec = *m_spec;
    Dim3 grid;
    Dim3 block;
    unsigned* grid_dims[] = {&grid.x, &grid.y, &grid.z};
    unsigned* block_dims[] = {&block.x, &block.y, &block.z};
    try {
      for (std::size_t i = 0; i < spec.grid.size(); ++i) {
        *grid_dims[i] = launch_dim(spec.grid[i], env, "grid size");
      }
      for (std::size_t i = 0; i < spec.block.size(); ++i) {
        *block_dims[i] = launch_dim(spec.block[i], env, "block size");
      }
    } catch (const detail::EvalError& e) {
      value_error(fmt::format("{}: cannot compute the launch geometry: {}", m_qualified, e.what()));
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
      return; // nothing to do (zero-size work)
    }
    const unsigned shared_mem = launch_dim(spec.shared_mem, env, "shared memory size");
    const Kernel& kernel = this->kernel(env, device);

    const auto params = kernel.param_sizes();
    if (!params.empty() && params.size() != spec.args.size()) {
      runtime_error(fmt::format("{}: the manifest passes {} arguments but kernel '{}' takes {}",
                                m_qualified, spec.args.size(), kernel.name(), params.size()));
    }
    // Only the first args.size() entries are used: not zero-initialized (6 KiB per call).
    std::array<std::uint64_t, 256> slots;
    std::array<void*, 256> values;
    std::array<std::size_t, 256> sizes;
    for (std::size_t i = 0; i < spec.args.size(); ++i) {
      const std::size_t want = params.empty() ? 0 : params[i];
      slots[i] = 0;
      sizes[i] = pack(api, spec.args[i], env, want, slots[i], i);
      values[i] = &slots[i];
    }
    if (api.get_current_cuda_stream == nullptr) {
      runtime_error(m_qualified + ": this torch has no CUDA (libtorch_cuda is not loaded)");
    }
    void* stream = nullptr;
    check(api.get_current_cuda_stream(device, &stream), "aoti_torch_get_current_cuda_stream",
          m_qualified.c_str());
    kernel.launch_packed(grid, block, shared_mem, static_cast<StreamHandle>(stream),
                         std::span(values.data(), spec.args.size()),
                         std::span(sizes.data(), spec.args.size()));
  }

  Package m_package;
  std::shared_ptr<const OpSpec> m_spec;
  std::string m_ns;
  std::string m_qualified;
  std::mutex m_mutex;
  std::deque<KernelSlot> m_kernels;               // guarded by m_mutex; elements never move
  std::atomic<const KernelSlot*> m_last{nullptr}; // the slot of the latest call
};

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
    if (spec->specialize.size() > k_max_spec) {
      throw Error(fmt::format("op '{}' has {} specialization placeholders; at most {}", qualified,
                              spec->specialize.size(), k_max_spec));
    }
    if (spec->args.size() > 256) {
      throw Error(fmt::format("op '{}' passes {} kernel arguments; at most 256", qualified,
                              spec->args.size()));
    }
    for (const auto& out : spec->outputs) {
      if (out.like < 0 && out.shape.size() > k_max_rank) {
        throw Error(fmt::format("op '{}' declares an output of {} dimensions; at most {}",
                                qualified, out.shape.size(), k_max_rank));
      }
    }
  }
  std::lock_guard lock(g_register_mutex);
  if (g_used + package.op_specs().size() > k_max_ops) {
    throw Error(fmt::format("kjit's torch layer serves at most {} ops per process; {} are "
                            "registered and package '{}' brings {}",
                            k_max_ops, g_used, package.name(), package.op_specs().size()));
  }
}

void register_cuda(const Package& package, const std::string& ns) {
  check_package(package);
  const TorchApi& api = torch_api();
  std::lock_guard lock(g_register_mutex);
  TorchLibraryHandle library = nullptr;
  check(api.aoti_torch_library_init_impl(ns.c_str(), "CUDA", __FILE__, __LINE__, &library),
        "aoti_torch_library_init_impl", ns.c_str());
  for (const auto& spec : package.op_specs()) {
    auto* state = new OpState(package, spec, ns); // lives as long as the dispatcher's kernel
    g_slots[g_used].store(state, std::memory_order_release);
    check(
      api.torch_library_impl(library, spec->name.c_str(), k_trampolines[g_used], TORCH_ABI_VERSION),
      "torch_library_impl", state->qualified().c_str());
    ++g_used;
  }
  // The library handle is never deleted: deleting it would remove the kernels.
}

} // namespace kjit::torch_layer
