// The CUDA kernels of kjit ops, on torch's stable ABI (Note [Op registration]). Over 600 lines:
// one op's call path (binding, checks, outputs, workspaces, kernel slots, packing, launches) is
// one class whose steps share the per-call environment.
#include "ops.hpp"

#include "abi.hpp"
#include "call_env.hpp"

#include <kjit/error.hpp>

#include "runtime/cuda/driver.hpp"
#include "runtime/logging.hpp"
#include "runtime/manifest/op_spec.hpp"

#include <fmt/format.h>

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

// A value error (torch raises ValueError for std::invalid_argument) naming the op.
[[noreturn]] void value_error(const std::string& message) {
  throw std::invalid_argument(message);
}

[[noreturn]] void runtime_error(const std::string& message) {
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

// One op's CUDA path. `returns_outputs_only`: the twin of an op whose returns alias its
// arguments (Note [Aliasing returns]), which returns its new outputs alone.
class OpState {
public:
  OpState(Package package, std::shared_ptr<const OpSpec> spec, std::string ns, std::string name,
          bool outputs_only)
    : m_package(std::move(package)), m_spec(std::move(spec)), m_ns(std::move(ns)),
      m_qualified(m_ns + "::" + name), m_outputs_only(outputs_only) {}

  const std::string& qualified() const { return m_qualified; }

  // The boxed kernel: arguments on `stack`, results written back to its front.
  void run(StableIValue* stack, std::uint64_t num_args, std::uint64_t num_returns) {
    const TorchApi& api = torch_api();
    const OpSpec& spec = *m_spec;
    Handles owned(api);
    CallEnv env;
    env.api = &api;
    bind_inputs(api, stack, num_args, env, owned);
    const std::size_t expected = m_outputs_only ? spec.outputs.size() : spec.returns.size();
    if (num_returns != expected) {
      runtime_error(fmt::format("{}: torch passes {} returns, the manifest declares {}",
                                m_qualified, num_returns, expected));
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
    for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
      std::array<std::int64_t, k_max_rank> shape; // written before read
      std::size_t rank = 0;
      DType dtype{};
      output_shape(o, env, shape, rank, dtype);
      bool this_empty = false;
      for (std::size_t d = 0; d < rank; ++d) {
        this_empty = this_empty || shape[d] == 0;
      }
      empty = empty && this_empty;
      allocate(api, env, owned, spec.num_inputs + o, shape, rank, dtype, device);
    }
    if (!empty || spec.outputs.empty()) {
      launch_all(api, env, owned, device);
    }
    if (m_outputs_only) {
      for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
        stack[o] = reinterpret_cast<StableIValue>(owned.release(spec.num_inputs + o));
      }
      return;
    }
    for (std::size_t r = 0; r < spec.returns.size(); ++r) {
      const auto& ret = spec.returns[r];
      const std::size_t symbol =
        ret.alias >= 0 ? static_cast<std::size_t>(ret.alias) : spec.num_inputs + ret.output;
      stack[r] = reinterpret_cast<StableIValue>(owned.release(symbol));
    }
  }

private:
  // Takes every reference of the stack first (nothing throws before all are owned), then reads
  // them: optionals unwrapped (torch boxes a present one in a heap StableIValue), strings mapped
  // to the manifest's integers, int lists copied into the call's pool.
  void bind_inputs(const TorchApi& api, const StableIValue* stack, std::uint64_t num_args,
                   CallEnv& env, Handles& owned) const {
    const OpSpec& spec = *m_spec;
    const std::size_t n = spec.num_inputs;
    if (num_args != n) {
      runtime_error(fmt::format("{}: torch passes {} arguments, the manifest declares {}",
                                m_qualified, num_args, n));
    }
    std::array<StableIValue, k_max_symbols> values;
    for (std::size_t i = 0; i < n; ++i) {
      StableIValue value = stack[i];
      if (spec.inputs[i].optional) {
        auto* boxed = reinterpret_cast<StableIValue*>(value);
        if (boxed == nullptr) {
          env.absent |= std::uint64_t(1) << i;
          env.tensors[i].handle = nullptr;
          values[i] = 0;
          continue;
        }
        value = *boxed;
        delete boxed;
      }
      values[i] = value;
      switch (spec.inputs[i].type) {
      case ArgType::tensor:
        owned.own(i, reinterpret_cast<AtenTensorHandle>(value));
        break;
      case ArgType::str:
        owned.own(i, reinterpret_cast<StringHandle>(value));
        break;
      case ArgType::int_list:
        owned.own(i, reinterpret_cast<StableListHandle>(value));
        break;
      default:
        break;
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!env.present(static_cast<int>(i))) {
        continue;
      }
      const StableIValue value = values[i];
      switch (spec.inputs[i].type) {
      case ArgType::tensor:
        env.tensors[i] = read_tensor(api, reinterpret_cast<AtenTensorHandle>(value));
        break;
      case ArgType::int_:
        std::memcpy(&env.ints[i], &value, sizeof(std::int64_t));
        break;
      case ArgType::float_:
        std::memcpy(&env.floats[i], &value, sizeof(double));
        break;
      case ArgType::bool_: {
        bool b = false;
        std::memcpy(&b, &value, sizeof b);
        env.ints[i] = b;
        break;
      }
      case ArgType::dtype: {
        std::int32_t code = 0;
        std::memcpy(&code, &value, sizeof code);
        env.ints[i] = code;
        break;
      }
      case ArgType::str:
        env.ints[i] = string_value(api, i, reinterpret_cast<StringHandle>(value));
        break;
      case ArgType::int_list:
        read_list(api, i, reinterpret_cast<StableListHandle>(value), env);
        break;
      }
    }
  }

  std::int64_t string_value(const TorchApi& api, std::size_t i, StringHandle handle) const {
    const char* data = nullptr;
    size_t length = 0;
    check(api.torch_string_c_str(handle, &data), "torch_string_c_str", m_qualified.c_str());
    check(api.torch_string_length(handle, &length), "torch_string_length", m_qualified.c_str());
    const std::string_view text(data, length);
    std::string known;
    for (const auto& [name, number] : m_spec->inputs[i].strings) {
      if (name == text) {
        return number;
      }
      known += fmt::format("{}'{}'", known.empty() ? "" : ", ", name);
    }
    value_error(fmt::format("{}: argument '{}' is '{}'; expected one of {}", m_qualified,
                            m_spec->symbols[i].name, text, known));
  }

  void read_list(const TorchApi& api, std::size_t i, StableListHandle list, CallEnv& env) const {
    size_t size = 0;
    check(api.torch_list_size(list, &size), "torch_list_size", m_qualified.c_str());
    if (env.list_used + size > k_max_list_items) {
      value_error(fmt::format("{}: argument '{}' has {} items; a kjit op takes at most {} list "
                              "items in all",
                              m_qualified, m_spec->symbols[i].name, size, k_max_list_items));
    }
    env.list_begin[i] = static_cast<std::uint16_t>(env.list_used);
    env.list_size[i] = static_cast<std::uint16_t>(size);
    for (size_t k = 0; k < size; ++k) {
      StableIValue item = 0;
      check(api.torch_list_get_item(list, k, &item), "torch_list_get_item", m_qualified.c_str());
      std::memcpy(&env.list_items[env.list_used++], &item, sizeof(std::int64_t));
    }
  }

  // The CUDA device all present tensor arguments share; throws ValueError naming the odd one out.
  int32_t common_device(const TorchApi& api, const CallEnv& env) const {
    const OpSpec& spec = *m_spec;
    int first = -1;
    for (std::size_t i = 0; i < spec.num_inputs; ++i) {
      if (spec.symbols[i].kind != Kind::tensor || env.tensors[i].handle == nullptr) {
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

  // A new contiguous tensor as symbol `symbol` (an output or a workspace), owned by the call;
  // what torch would answer of it is known but for where it keeps the sizes and strides.
  void allocate(const TorchApi& api, CallEnv& env, Handles& owned, std::size_t symbol,
                const std::array<std::int64_t, k_max_rank>& shape, std::size_t rank, DType dtype,
                int32_t device) const {
    std::array<std::int64_t, k_max_rank> strides;
    std::int64_t step = 1;
    for (std::size_t d = rank; d-- > 0;) {
      strides[d] = step;
      step *= std::max<std::int64_t>(shape[d], 1);
    }
    AtenTensorHandle out = nullptr;
    check(api.aoti_torch_empty_strided(static_cast<int64_t>(rank), shape.data(), strides.data(),
                                       static_cast<int32_t>(dtype), api.cuda, device, &out),
          "aoti_torch_empty_strided", m_qualified.c_str());
    owned.own(symbol, out);
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

  // The workspaces, from torch's caching allocator (stream-ordered: freed when the call
  // returns, reused only by work queued after it on the stream), zeroed on the stream.
  void make_workspaces(const TorchApi& api, CallEnv& env, Handles& owned, int32_t device,
                       void* stream) const {
    const OpSpec& spec = *m_spec;
    const std::size_t first = spec.num_inputs + spec.outputs.size();
    for (std::size_t w = 0; w < spec.workspaces.size(); ++w) {
      const detail::WorkspaceSpec& ws = spec.workspaces[w];
      std::array<std::int64_t, k_max_rank> shape;
      DType dtype{};
      std::int64_t numel = 1;
      try {
        for (std::size_t d = 0; d < ws.shape.size(); ++d) {
          shape[d] = Evaluator(ws.shape[d], env).integer();
          if (shape[d] < 0) {
            value_error(fmt::format("{}: workspace '{}' would have size {} in dimension {}",
                                    m_qualified, ws.name, shape[d], d));
          }
          if (__builtin_mul_overflow(numel, shape[d], &numel)) {
            value_error(
              fmt::format("{}: the size of workspace '{}' overflows", m_qualified, ws.name));
          }
        }
        dtype = Evaluator(ws.dtype, env).dtype();
      } catch (const detail::EvalError& e) {
        value_error(
          fmt::format("{}: cannot compute workspace '{}': {}", m_qualified, ws.name, e.what()));
      }
      std::int64_t bytes = 0;
      if (__builtin_mul_overflow(numel, static_cast<std::int64_t>(element_size(int32_t(dtype))),
                                 &bytes)) {
        value_error(fmt::format("{}: the size of workspace '{}' overflows", m_qualified, ws.name));
      }
      allocate(api, env, owned, first + w, shape, ws.shape.size(), dtype, device);
      if (ws.zero && bytes > 0) {
        void* ptr = nullptr;
        check(api.aoti_torch_get_data_ptr(env.tensors[first + w].handle, &ptr),
              "aoti_torch_get_data_ptr", m_qualified.c_str());
        const CUresult result = detail::driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(ptr),
                                                                 0, static_cast<std::size_t>(bytes),
                                                                 static_cast<CUstream>(stream));
        if (result != CUDA_SUCCESS) {
          runtime_error(fmt::format("{}: cannot zero workspace '{}' ({} bytes): {}", m_qualified,
                                    ws.name, bytes, detail::driver_error_text(result)));
        }
      }
    }
  }

  // The kernel slot of launch `l` for this call's specialization values on `device` (compiled or
  // fetched once). The slot of the launch's previous call is checked first, without a lock: a
  // stream of calls with the same dtypes pays one comparison. Slots live in a deque, so the
  // reference stays valid.
  KernelSlot& kernel(std::size_t l, const CallEnv& env, int device) {
    const detail::LaunchSpec& launch = m_spec->launches[l];
    std::array<std::int64_t, k_max_spec> values{};
    for (std::size_t i = 0; i < launch.specialize.size(); ++i) {
      const Expr& expr = launch.specialize[i].expr;
      try {
        values[i] = expr.kind() == Kind::dtype
                      ? static_cast<std::int64_t>(Evaluator(expr, env).dtype())
                    : expr.kind() == Kind::bool_ ? std::int64_t(Evaluator(expr, env).boolean())
                                                 : Evaluator(expr, env).integer();
      } catch (const detail::EvalError& e) {
        value_error(fmt::format("{}: cannot compute specialization {}: {}", m_qualified,
                                launch.specialize[i].name, e.what()));
      }
    }
    KernelSlot* last = m_last[l].load(std::memory_order_acquire);
    if (last != nullptr && last->device == device && last->values == values) {
      return *last;
    }
    std::lock_guard lock(m_mutex);
    for (KernelSlot& slot : m_kernels) {
      if (slot.launch == l && slot.device == device && slot.values == values) {
        m_last[l].store(&slot, std::memory_order_release);
        return slot;
      }
    }
    std::vector<std::pair<std::string, std::string>> texts;
    for (std::size_t i = 0; i < launch.specialize.size(); ++i) {
      const auto& param = launch.specialize[i];
      texts.emplace_back(param.name, detail::specialization_text(param.expr.kind(), values[i]));
    }
    const auto start = std::chrono::steady_clock::now();
    const KernelDecl& decl = m_package.kernels()[launch.kernel];
    auto [program, name] = m_package.specialize(decl, texts);
    const auto specialized = std::chrono::steady_clock::now();
    Kernel kernel = runtime().kernel(program, name);
    using Ms = std::chrono::duration<double, std::milli>;
    detail::log(LogLevel::debug,
                "{}: kernel '{}' for cuda:{} ready in {:.2f} ms (program {:.2f} ms)", m_qualified,
                name, device, Ms(std::chrono::steady_clock::now() - start).count(),
                Ms(specialized - start).count());
    KernelSlot& slot = m_kernels.emplace_back();
    slot.launch = l;
    slot.values = values;
    slot.device = device;
    slot.kernel = std::move(kernel);
    m_last[l].store(&slot, std::memory_order_release);
    return slot;
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
  // An absent optional tensor is a null pointer.
  std::size_t pack(const TorchApi& api, const Expr& expr, const CallEnv& env,
                   std::size_t param_size, std::uint64_t& slot, std::size_t index) const {
    switch (expr.kind()) {
    case Kind::tensor: {
      const auto symbol = expr.nodes()[expr.root()].a;
      void* ptr = nullptr;
      if (env.tensors[symbol].handle != nullptr) {
        check(api.aoti_torch_get_data_ptr(env.tensors[symbol].handle, &ptr),
              "aoti_torch_get_data_ptr", m_qualified.c_str());
      }
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
    case Kind::int_list:
      break;
    }
    runtime_error(fmt::format("{}: kernel argument {} ('{}') is a {}", m_qualified, index,
                              expr.text(), detail::kind_name(expr.kind())));
  }

  void launch_all(const TorchApi& api, CallEnv& env, Handles& owned, int32_t device) {
    const OpSpec& spec = *m_spec;
    if (spec.uses_device) {
      env.props = &device_props(device);
    }
    if (api.get_current_cuda_stream == nullptr) {
      runtime_error(m_qualified + ": this torch has no CUDA (libtorch_cuda is not loaded)");
    }
    void* stream = nullptr;
    check(api.get_current_cuda_stream(device, &stream), "aoti_torch_get_current_cuda_stream",
          m_qualified.c_str());
    make_workspaces(api, env, owned, device, stream);
    if (!spec.tune.empty()) {
      tune_values(env);
    }
    for (std::size_t l = 0; l < spec.launches.size(); ++l) {
      launch(api, env, l, device, stream);
    }
  }

  // Note [Tuning]: the values of the tune parameters for this call: the defaults (the tuned
  // configuration of the call's bucket is looked up here once the tuner runs on a device).
  void tune_values(CallEnv& env) const {
    const detail::TuneSpec& tune = m_spec->tune;
    try {
      for (const auto& param : tune.params) {
        env.ints[static_cast<std::size_t>(param.symbol)] =
          Evaluator(param.default_value, env).integer();
      }
      if (tune.valid && !Evaluator(*tune.valid, env).boolean()) {
        std::string values;
        for (const auto& param : tune.params) {
          values += fmt::format("{}{} = {}", values.empty() ? "" : ", ", param.name,
                                env.ints[static_cast<std::size_t>(param.symbol)]);
        }
        value_error(fmt::format("{}: the default configuration ({}) fails tune_valid '{}' for "
                                "these arguments",
                                m_qualified, values, tune.valid->text()));
      }
    } catch (const detail::EvalError& e) {
      value_error(fmt::format("{}: cannot compute the tune parameters: {}", m_qualified, e.what()));
    }
  }

  void launch(const TorchApi& api, const CallEnv& env, std::size_t l, int32_t device,
              void* stream) {
    const detail::LaunchSpec& spec = m_spec->launches[l];
    Dim3 grid;
    Dim3 block;
    unsigned shared_mem = 0;
    unsigned* grid_dims[] = {&grid.x, &grid.y, &grid.z};
    unsigned* block_dims[] = {&block.x, &block.y, &block.z};
    const std::string which =
      m_spec->launches.size() > 1 ? fmt::format(" (launch {})", l) : std::string();
    try {
      if (spec.when && !Evaluator(*spec.when, env).boolean()) {
        return;
      }
      for (std::size_t i = 0; i < spec.grid.size(); ++i) {
        *grid_dims[i] = launch_dim(spec.grid[i], env, "grid size");
      }
      for (std::size_t i = 0; i < spec.block.size(); ++i) {
        *block_dims[i] = launch_dim(spec.block[i], env, "block size");
      }
      if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
        return; // nothing to do (zero-size work)
      }
      shared_mem = launch_dim(spec.shared_mem, env, "shared memory size");
    } catch (const detail::EvalError& e) {
      value_error(
        fmt::format("{}: cannot compute the launch geometry{}: {}", m_qualified, which, e.what()));
    }
    KernelSlot& slot = this->kernel(l, env, device);
    const Kernel& kernel = slot.kernel;
    if (shared_mem > slot.shared_set.load(std::memory_order_relaxed)) {
      allow_shared_memory(slot, shared_mem, device, which);
    }

    const auto params = kernel.param_sizes();
    if (!params.empty() && params.size() != spec.args.size()) {
      runtime_error(fmt::format("{}{}: the manifest passes {} arguments but kernel '{}' takes {}",
                                m_qualified, which, spec.args.size(), kernel.name(),
                                params.size()));
    }
    // Only the first args.size() entries are used: not zero-initialized (6 KiB per call).
    std::array<std::uint64_t, 256> slots;
    std::array<void*, 256> values;
    std::array<std::size_t, 256> sizes;
    try {
      for (std::size_t i = 0; i < spec.args.size(); ++i) {
        const std::size_t want = params.empty() ? 0 : params[i];
        slots[i] = 0;
        sizes[i] = pack(api, spec.args[i], env, want, slots[i], i);
        values[i] = &slots[i];
      }
    } catch (const detail::EvalError& e) {
      value_error(
        fmt::format("{}: cannot compute the kernel arguments{}: {}", m_qualified, which, e.what()));
    }
    kernel.launch_packed(grid, block, shared_mem, static_cast<StreamHandle>(stream),
                         std::span(values.data(), spec.args.size()),
                         std::span(sizes.data(), spec.args.size()));
  }

  // Dynamic shared memory above 48 KiB needs the kernel's opt-in, up to the device's limit.
  void allow_shared_memory(KernelSlot& slot, unsigned bytes, int32_t device,
                           const std::string& which) const {
    const DeviceProps& props = device_props(device);
    if (bytes > props.max_shared_mem) {
      value_error(fmt::format("{}{}: the launch asks {} bytes of dynamic shared memory; cuda:{} "
                              "allows at most {} per block",
                              m_qualified, which, bytes, device, props.max_shared_mem));
    }
    CUdevice dev = 0;
    const detail::DriverApi& d = detail::driver();
    CUresult result = d.cuDeviceGet(&dev, device);
    if (result == CUDA_SUCCESS) {
      result = d.cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      static_cast<int>(bytes),
                                      static_cast<CUkernel>(slot.kernel.handle()), dev);
    }
    if (result != CUDA_SUCCESS) {
      runtime_error(fmt::format("{}{}: cannot allow kernel '{}' {} bytes of dynamic shared "
                                "memory: {}",
                                m_qualified, which, slot.kernel.name(), bytes,
                                detail::driver_error_text(result)));
    }
    slot.shared_set.store(bytes, std::memory_order_relaxed);
  }

  Package m_package;
  std::shared_ptr<const OpSpec> m_spec;
  std::string m_ns;
  std::string m_qualified;
  bool m_outputs_only;
  std::mutex m_mutex;
  std::deque<KernelSlot> m_kernels; // guarded by m_mutex; elements never move
  std::array<std::atomic<KernelSlot*>, k_max_launches> m_last{}; // each launch's latest slot
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
    // Note [Backward ops]: the twin alone; Note [Aliasing returns]: the op and its twin.
    needed += spec->backward ? 1 : spec->aliasing_returns() ? 2 : 1;
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
    if (!spec->backward) { // Note [Backward ops]: the op itself is the twin and its outputs
      add(spec, spec->name, false);
    }
    if (spec->has_twin()) {
      add(spec, twin_name(spec->name), true); // Note [Aliasing returns]
    }
  }
  // The library handle is never deleted: deleting it would remove the kernels.
}

} // namespace kjit::torch_layer
