// The torch layer's eager path: ops registered with the dispatcher at run time, one boxed
// functor per op and dispatch key (CUDA, Meta, CPU, Autograd). Over 600 lines: binding, checks,
// outputs, launch and the CPU output checks share one per-op state and its per-call arrays.
#include "torch_ops.hpp"

#include <kjit/error.hpp>

#include "runtime/op_spec.hpp"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>

namespace kjit::torch_layer {
namespace {

using detail::DType;
using detail::Evaluator;
using detail::Expr;
using detail::Kind;
using detail::OpSpec;

static_assert(static_cast<int>(DType::uint8) == static_cast<int>(at::kByte));
static_assert(static_cast<int>(DType::int32) == static_cast<int>(at::kInt));
static_assert(static_cast<int>(DType::int64) == static_cast<int>(at::kLong));
static_assert(static_cast<int>(DType::float16) == static_cast<int>(at::kHalf));
static_assert(static_cast<int>(DType::float32) == static_cast<int>(at::kFloat));
static_assert(static_cast<int>(DType::float64) == static_cast<int>(at::kDouble));
static_assert(static_cast<int>(DType::bool_) == static_cast<int>(at::kBool));
static_assert(static_cast<int>(DType::bfloat16) == static_cast<int>(at::kBFloat16));

// Symbols (arguments and outputs) an op may have; bounds the per-call arrays.
constexpr std::size_t k_max_symbols = 32;
constexpr std::size_t k_max_spec = 4;

// The values of one call: tensors by pointer, scalars by value. No allocation.
template <class IntT>
struct CallEnv {
  using Int = IntT;
  std::array<const at::Tensor*, k_max_symbols> tensors{};
  std::array<std::int64_t, k_max_symbols> ints{};
  std::array<double, k_max_symbols> floats{};

  Int size(int t, std::int64_t d) const {
    if constexpr (std::is_same_v<Int, std::int64_t>) {
      return tensors[t]->size(d);
    } else {
      return tensors[t]->sym_size(d);
    }
  }
  Int stride(int t, std::int64_t d) const {
    if constexpr (std::is_same_v<Int, std::int64_t>) {
      return tensors[t]->stride(d);
    } else {
      return tensors[t]->sym_stride(d);
    }
  }
  Int numel(int t) const {
    if constexpr (std::is_same_v<Int, std::int64_t>) {
      return tensors[t]->numel();
    } else {
      return tensors[t]->sym_numel();
    }
  }
  std::int64_t dim(int t) const { return tensors[t]->dim(); }
  DType dtype(int t) const { return static_cast<DType>(tensors[t]->scalar_type()); }
  bool is_contiguous(int t) const { return tensors[t]->is_contiguous(); }
  Int int_value(int s) const { return Int(ints[s]); }
  double float_value(int s) const { return floats[s]; }
  bool bool_value(int s) const { return ints[s] != 0; }
  static Int min(const Int& a, const Int& b) {
    if constexpr (std::is_same_v<Int, std::int64_t>) {
      return std::min(a, b);
    } else {
      return a.min(b);
    }
  }
  static Int max(const Int& a, const Int& b) {
    if constexpr (std::is_same_v<Int, std::int64_t>) {
      return std::max(a, b);
    } else {
      return a.max(b);
    }
  }
  static bool truth(bool value) { return value; }
  // The value of a size that is not symbolic (a meta tensor's, a fake tensor's static size).
  static std::optional<std::int64_t> concrete(const Int& value) {
    if constexpr (std::is_same_v<Int, std::int64_t>) {
      return value;
    } else {
      return value.maybe_as_int();
    }
  }
};

// Messages with numbers are formatted with fmt and handed to TORCH_CHECK as one string: the
// module's own inline copies of iostream number formatting crashed where the compiler's
// libstdc++ headers are newer than the libstdc++ the process runs with (seen on the GPU image).
[[noreturn]] void value_error(const std::string& message) {
  TORCH_CHECK_VALUE(false, message);
}

[[noreturn]] void runtime_error(const std::string& message) {
  TORCH_CHECK(false, message);
}

std::string dtype_text(at::ScalarType type) {
  const auto name = detail::dtype_name(static_cast<DType>(type));
  return name != "unknown" ? std::string(name) : std::string(c10::toString(type));
}

std::string describe(const std::string& name, const at::Tensor& t) {
  return fmt::format("'{}' has shape {}, dtype {}, device {}{}", name,
                     fmt::format("[{}]", fmt::join(t.sizes(), ", ")), dtype_text(t.scalar_type()),
                     t.device().str(), t.is_contiguous() ? "" : ", not contiguous");
}

// A compiled specialization of an op's kernel for one device.
struct KernelSlot {
  std::array<std::int64_t, k_max_spec> values{};
  int device = -1;
  Kernel kernel;
};

// What every functor of one op shares.
class OpState {
public:
  OpState(Package package, std::shared_ptr<const OpSpec> spec, std::string ns)
    : m_package(std::move(package)), m_spec(std::move(spec)), m_ns(std::move(ns)),
      m_qualified(m_ns + "::" + m_spec->name) {
    if (m_spec->symbols.size() > k_max_symbols) {
      throw Error(fmt::format("op '{}' has {} arguments and outputs; kjit ops take at most {}",
                              m_qualified, m_spec->symbols.size(), k_max_symbols));
    }
    if (m_spec->specialize.size() > k_max_spec) {
      throw Error(fmt::format("op '{}' has {} specialization placeholders; at most {}", m_qualified,
                              m_spec->specialize.size(), k_max_spec));
    }
  }

  const OpSpec& spec() const { return *m_spec; }
  const std::string& qualified() const { return m_qualified; }

  // Fills `env` from the op's arguments on `stack` (the last `num_inputs` values).
  template <class Int>
  void bind_inputs(const torch::jit::Stack& stack, CallEnv<Int>& env) const {
    const std::size_t n = m_spec->num_inputs;
    const std::size_t base = stack.size() - n;
    for (std::size_t i = 0; i < n; ++i) {
      const c10::IValue& value = stack[base + i];
      switch (m_spec->symbols[i].kind) {
      case Kind::tensor:
        env.tensors[i] = &value.toTensor();
        break;
      case Kind::int_:
        env.ints[i] =
          value.isSymInt() ? value.toSymInt().guard_int(__FILE__, __LINE__) : value.toInt();
        break;
      case Kind::float_:
        env.floats[i] = value.toDouble();
        break;
      case Kind::bool_:
        env.ints[i] = value.toBool();
        break;
      case Kind::dtype:
        env.ints[i] = value.toInt();
        break;
      }
    }
  }

  // Runs the checks; throws ValueError naming the check and the actual tensors.
  void check(const CallEnv<std::int64_t>& env) const {
    for (const Expr& check : m_spec->checks) {
      bool ok = false;
      try {
        ok = Evaluator(check, env).boolean();
      } catch (const detail::EvalError& e) {
        TORCH_CHECK_VALUE(false, m_qualified, ": cannot evaluate check '", check.text(),
                          "': ", e.what(), "; ", tensors_text(env));
      }
      TORCH_CHECK_VALUE(ok, m_qualified, ": check '", check.text(),
                        "' failed: ", tensors_text(env));
    }
  }

  std::string tensors_text(const CallEnv<std::int64_t>& env) const {
    std::string text;
    for (std::size_t i = 0; i < m_spec->num_inputs; ++i) {
      if (m_spec->symbols[i].kind == Kind::tensor) {
        text += (text.empty() ? "" : "; ") + describe(m_spec->symbols[i].name, *env.tensors[i]);
      }
    }
    return text;
  }

  // The outputs' sizes and dtypes, from concrete or symbolic sizes.
  template <class Int>
  void output_shape(std::size_t o, const CallEnv<Int>& env, c10::SmallVector<Int, 8>& shape,
                    at::ScalarType& dtype) const {
    try {
      output_shape_of(o, env, shape, dtype);
    } catch (const detail::EvalError& e) {
      value_error(
        fmt::format("{}: cannot compute the shape of output {}: {}", m_qualified, o, e.what()));
    }
  }

  template <class Int>
  void output_shape_of(std::size_t o, const CallEnv<Int>& env, c10::SmallVector<Int, 8>& shape,
                       at::ScalarType& dtype) const {
    const detail::OutputSpec& out = m_spec->outputs[o];
    shape.clear();
    if (out.like >= 0) {
      const at::Tensor& like = *env.tensors[out.like];
      if constexpr (std::is_same_v<Int, std::int64_t>) {
        shape.assign(like.sizes().begin(), like.sizes().end());
      } else {
        shape.assign(like.sym_sizes().begin(), like.sym_sizes().end());
      }
      for (const auto& [dim, expr] : out.dims) {
        const auto rank = static_cast<std::int64_t>(shape.size());
        const std::int64_t d = dim < 0 ? dim + rank : dim;
        if (d < 0 || d >= rank) {
          value_error(fmt::format("{}: output {} replaces dimension {} of '{}', which has {} "
                                  "dimensions",
                                  m_qualified, o, dim, m_spec->symbols[out.like].name, rank));
        }
        shape[d] = Evaluator(expr, env).integer();
      }
      dtype = like.scalar_type();
    } else {
      for (const Expr& size : out.shape) {
        shape.push_back(Evaluator(size, env).integer());
      }
    }
    if (out.dtype) {
      dtype = static_cast<at::ScalarType>(Evaluator(*out.dtype, env).dtype());
    }
  }

  // The kernel for this call's specialization values on `device` (compiled or fetched once).
  // The slot of the previous call is checked first, without a lock: a stream of calls with the
  // same dtypes pays one comparison. Slots live in a deque, so the reference stays valid.
  const Kernel& kernel(const CallEnv<std::int64_t>& env, int device) {
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
    const KernelDecl& decl = m_package.kernels()[m_spec->kernel];
    auto [program, name] = m_package.specialize(decl, texts);
    key.kernel = runtime().kernel(program, name);
    const KernelSlot& slot = m_kernels.emplace_back(std::move(key));
    m_last.store(&slot, std::memory_order_release);
    return slot.kernel;
  }

  const c10::OperatorHandle& cpu_op() {
    std::call_once(m_cpu_once, [&] {
      m_cpu_op = c10::Dispatcher::singleton().findSchemaOrThrow(
        (m_ns + "::kjit_cpu_" + m_spec->name).c_str(), "");
    });
    return *m_cpu_op;
  }

private:
  Package m_package;
  std::shared_ptr<const OpSpec> m_spec;
  std::string m_ns;
  std::string m_qualified;
  std::mutex m_mutex;
  std::deque<KernelSlot> m_kernels;               // guarded by m_mutex; elements never move
  std::atomic<const KernelSlot*> m_last{nullptr}; // the slot of the latest call
  std::once_flag m_cpu_once;
  std::optional<c10::OperatorHandle> m_cpu_op;
};

// Note [Autograd kernel]: kjit ops have no derivatives. Called with inputs that require grad
// (in grad mode), the outputs get a `NotImplemented` node, so a backward through them fails
// naming the op, as torch's autogradNotImplementedFallback does; otherwise the call goes straight
// on to the device kernel. torch's fallback walks the schema's alias annotations and allocates on
// every call, for in-place and view ops that manifests cannot declare: that was measured as a
// tenth of an op's per-call time from Python.
void autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                     torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const std::size_t first = stack->size() - schema.arguments().size();
  c10::SmallVector<const at::Tensor*, 4> requiring_grad;
  if (at::GradMode::is_enabled()) {
    for (std::size_t i = first; i < stack->size(); ++i) {
      const c10::IValue& value = (*stack)[i];
      if (value.isTensor() && value.toTensor().requires_grad()) {
        requiring_grad.push_back(&value.toTensor());
      }
    }
  }
  std::shared_ptr<torch::autograd::NotImplemented> grad_fn;
  if (!requiring_grad.empty()) {
    grad_fn = std::shared_ptr<torch::autograd::NotImplemented>(
      new torch::autograd::NotImplemented(schema.name()), torch::autograd::deleteNode);
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(
      c10::ArrayRef<const at::Tensor*>(requiring_grad.data(), requiring_grad.size())));
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  if (grad_fn) {
    const std::size_t returns = schema.returns().size();
    for (std::size_t i = stack->size() - returns; i < stack->size(); ++i) {
      const c10::IValue& value = (*stack)[i];
      if (value.isTensor() &&
          torch::autograd::isDifferentiableType(value.toTensor().scalar_type())) {
        torch::autograd::set_history(value.toTensor(), grad_fn);
      }
    }
  }
}

// Packs one kernel argument into `slot` as the kernel's parameter `size` asks; returns its size.
std::size_t pack(const Expr& expr, const CallEnv<std::int64_t>& env, std::size_t param_size,
                 std::uint64_t& slot, const std::string& op, std::size_t index) {
  switch (expr.kind()) {
  case Kind::tensor: {
    const auto symbol = expr.nodes()[expr.root()].a;
    void* ptr = env.tensors[symbol]->data_ptr();
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
                              op, index, expr.text(), value));
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
  runtime_error(fmt::format("{}: kernel argument {} ('{}') is a dtype", op, index, expr.text()));
}

unsigned launch_dim(const Expr& expr, const CallEnv<std::int64_t>& env, const std::string& op,
                    const char* what) {
  const std::int64_t value = Evaluator(expr, env).integer();
  if (value < 0 || value > INT32_MAX) {
    value_error(fmt::format("{}: {} '{}' is {}, outside [0, 2^31)", op, what, expr.text(), value));
  }
  return static_cast<unsigned>(value);
}

enum class Mode { cuda, meta, cpu };

class OpFunctor final : public c10::OperatorKernel {
public:
  OpFunctor(std::shared_ptr<OpState> state, Mode mode) : m_state(std::move(state)), m_mode(mode) {}

  void operator()(const c10::OperatorHandle& /*op*/, c10::DispatchKeySet /*keys*/,
                  torch::jit::Stack* stack) {
    switch (m_mode) {
    case Mode::cuda:
      return run_cuda(*stack);
    case Mode::meta:
      return run_meta(*stack);
    case Mode::cpu:
      return run_cpu(*stack);
    }
  }

private:
  // Output tensors, then replace the inputs on the stack with them.
  void finish(torch::jit::Stack& stack, c10::SmallVector<at::Tensor, 4>& outputs) const {
    torch::jit::drop(stack, m_state->spec().num_inputs);
    for (auto& out : outputs) {
      torch::jit::push(stack, std::move(out));
    }
  }

  // The device all tensor arguments share; throws ValueError naming the odd one out.
  at::Device common_device(const CallEnv<std::int64_t>& env, bool want_cuda) const {
    const OpSpec& spec = m_state->spec();
    std::optional<at::Device> device;
    std::size_t first = 0;
    for (std::size_t i = 0; i < spec.num_inputs; ++i) {
      if (spec.symbols[i].kind != Kind::tensor) {
        continue;
      }
      const at::Device d = env.tensors[i]->device();
      if (!device) {
        device = d;
        first = i;
      } else {
        TORCH_CHECK_VALUE(d == *device, m_state->qualified(),
                          ": expected all tensors on one device, but '", spec.symbols[first].name,
                          "' is on ", device->str(), " and '", spec.symbols[i].name, "' is on ",
                          d.str());
      }
    }
    TORCH_CHECK_VALUE(device.has_value(), m_state->qualified(), ": no tensor argument");
    TORCH_CHECK_VALUE(!want_cuda || device->is_cuda(), m_state->qualified(),
                      ": expected CUDA tensors, got ", device->str());
    return *device;
  }

  void run_cuda(torch::jit::Stack& stack) {
    const OpSpec& spec = m_state->spec();
    CallEnv<std::int64_t> env;
    m_state->bind_inputs(stack, env);
    const at::Device device = common_device(env, true);
    c10::DeviceGuard guard(device);
    m_state->check(env);

    c10::SmallVector<at::Tensor, 4> outputs;
    bool empty = true;
    c10::SmallVector<std::int64_t, 8> shape; // no allocation per call
    for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
      at::ScalarType dtype{};
      m_state->output_shape(o, env, shape, dtype);
      outputs.push_back(at::empty(shape, at::TensorOptions().dtype(dtype).device(device)));
      empty = empty && outputs.back().numel() == 0;
      env.tensors[spec.num_inputs + o] = &outputs.back();
    }
    // Output pointers moved while the vector grew: bind them again.
    for (std::size_t o = 0; o < outputs.size(); ++o) {
      env.tensors[spec.num_inputs + o] = &outputs[o];
    }
    if (!empty || outputs.empty()) {
      launch(env, device);
    }
    finish(stack, outputs);
  }

  void launch(const CallEnv<std::int64_t>& env, at::Device device) {
    const OpSpec& spec = m_state->spec();
    Dim3 grid;
    Dim3 block;
    unsigned* grid_dims[] = {&grid.x, &grid.y, &grid.z};
    unsigned* block_dims[] = {&block.x, &block.y, &block.z};
    for (std::size_t i = 0; i < spec.grid.size(); ++i) {
      *grid_dims[i] = launch_dim(spec.grid[i], env, m_state->qualified(), "grid size");
    }
    for (std::size_t i = 0; i < spec.block.size(); ++i) {
      *block_dims[i] = launch_dim(spec.block[i], env, m_state->qualified(), "block size");
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
      return; // nothing to do (zero-size work)
    }
    const unsigned shared_mem =
      launch_dim(spec.shared_mem, env, m_state->qualified(), "shared memory size");
    const Kernel& kernel = m_state->kernel(env, device.index());

    const auto params = kernel.param_sizes();
    if (!params.empty() && params.size() != spec.args.size()) {
      runtime_error(fmt::format("{}: the manifest passes {} arguments but kernel '{}' takes {}",
                                m_state->qualified(), spec.args.size(), kernel.name(),
                                params.size()));
    }
    std::array<std::uint64_t, 256> slots{};
    std::array<void*, 256> values{};
    std::array<std::size_t, 256> sizes{};
    for (std::size_t i = 0; i < spec.args.size(); ++i) {
      const std::size_t want = params.empty() ? 0 : params[i];
      sizes[i] = pack(spec.args[i], env, want, slots[i], m_state->qualified(), i);
      values[i] = &slots[i];
    }
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    auto* stream = static_cast<StreamHandle>(impl.getStream(device).native_handle());
    kernel.launch_packed(grid, block, shared_mem, stream,
                         std::span(values.data(), spec.args.size()),
                         std::span(sizes.data(), spec.args.size()));
  }

  void run_meta(torch::jit::Stack& stack) {
    const OpSpec& spec = m_state->spec();
    CallEnv<c10::SymInt> env;
    m_state->bind_inputs(stack, env);
    c10::SmallVector<at::Tensor, 4> outputs;
    c10::SmallVector<c10::SymInt, 8> shape;
    for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
      at::ScalarType dtype{};
      m_state->output_shape(o, env, shape, dtype);
      outputs.push_back(
        at::empty_symint(shape, at::TensorOptions().dtype(dtype).device(at::kMeta)));
    }
    finish(stack, outputs);
  }

  void run_cpu(torch::jit::Stack& stack) {
    const OpSpec& spec = m_state->spec();
    CallEnv<std::int64_t> env;
    m_state->bind_inputs(stack, env);
    const at::Device device = common_device(env, false);
    TORCH_CHECK_VALUE(!device.is_cuda(), m_state->qualified(), ": unexpected ", device.str());
    TORCH_CHECK_NOT_IMPLEMENTED(!spec.cpu.empty(), m_state->qualified(),
                                " has no CPU kernel (its package gives none): move the tensors "
                                "to a CUDA device");
    m_state->check(env);
    // What the manifest declares, to hold the package's Python function to it.
    c10::SmallVector<c10::SmallVector<std::int64_t, 8>, 4> shapes(spec.outputs.size());
    c10::SmallVector<at::ScalarType, 4> dtypes(spec.outputs.size());
    for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
      m_state->output_shape(o, env, shapes[o], dtypes[o]);
    }
    m_state->cpu_op().callBoxed(stack);
    const std::size_t count = spec.outputs.size();
    if (stack.size() < count) {
      runtime_error(fmt::format("{}: the CPU implementation returned {} values, the schema "
                                "declares {} outputs",
                                m_state->qualified(), stack.size(), count));
    }
    for (std::size_t o = 0; o < count; ++o) {
      const c10::IValue& value = stack[stack.size() - count + o];
      if (!value.isTensor()) {
        runtime_error(fmt::format("{}: the CPU implementation returned a {} as output {}, not a "
                                  "tensor",
                                  m_state->qualified(), value.tagKind(), o));
      }
      const at::Tensor& t = value.toTensor();
      const bool same_shape = t.sizes() == c10::IntArrayRef(shapes[o]);
      if (!same_shape || t.scalar_type() != dtypes[o] || !t.device().is_cpu()) {
        runtime_error(fmt::format(
          "{}: the CPU implementation returned output {} of shape [{}], {} on {}; the manifest "
          "declares shape [{}], {} on cpu",
          m_state->qualified(), o, fmt::join(t.sizes(), ", "), c10::toString(t.scalar_type()),
          t.device().str(), fmt::join(shapes[o], ", "), c10::toString(dtypes[o])));
      }
    }
  }

  std::shared_ptr<OpState> m_state;
  Mode m_mode;
};

struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<torch::Library>> libraries;
  std::map<std::string, std::string> namespaces; // namespace -> manifest
};

Registry& registry() {
  static auto* r = new Registry(); // lives as long as the dispatcher's references to it
  return *r;
}

std::string hidden_schema(const OpSpec& spec) {
  return "kjit_cpu_" + spec.schema.substr(spec.schema.find(spec.name));
}

} // namespace

Runtime& runtime() {
  static auto* r = new Runtime(); // never destroyed: kernels may run during interpreter exit
  return *r;
}

std::vector<std::pair<std::string, std::string>> register_package(const Package& package,
                                                                  const std::string& ns) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const std::string manifest = package.manifest().string();
  if (auto it = r.namespaces.find(ns); it != r.namespaces.end()) {
    if (it->second != manifest) {
      throw ManifestError(
        manifest, "package.name", 0, 0,
        fmt::format("op namespace '{}' is taken by the package at '{}'", ns, it->second));
    }
  } else {
    // Every op is validated before the namespace is taken, so a failed load can be retried.
    std::vector<std::shared_ptr<OpState>> states;
    for (const auto& spec : package.op_specs()) {
      states.push_back(std::make_shared<OpState>(package, spec, ns));
    }
    auto library =
      std::make_unique<torch::Library>(torch::Library::DEF, ns, std::nullopt, __FILE__, __LINE__);
    for (const auto& state : states) {
      const OpSpec* spec = &state->spec();
      try {
        library->def(spec->schema.c_str());
      } catch (const c10::Error& e) {
        throw ManifestError(manifest, "op." + spec->name + ".schema", 0, 0,
                            e.what_without_backtrace());
      }
      auto functor = [&](Mode mode) {
        return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<OpFunctor>(state, mode));
      };
      library->impl(spec->name.c_str(),
                    torch::dispatch(c10::DispatchKey::CUDA, functor(Mode::cuda)));
      library->impl(spec->name.c_str(),
                    torch::dispatch(c10::DispatchKey::Meta, functor(Mode::meta)));
      library->impl(spec->name.c_str(), torch::dispatch(c10::DispatchKey::CPU, functor(Mode::cpu)));
      library->impl(spec->name.c_str(),
                    torch::dispatch(c10::DispatchKey::Autograd,
                                    torch::CppFunction::makeFromBoxedFunction<&autograd_kernel>()));
      if (!spec->cpu.empty()) {
        library->def(hidden_schema(*spec).c_str());
      }
    }
    r.libraries.push_back(std::move(library));
    r.namespaces.emplace(ns, manifest);
  }
  std::vector<std::pair<std::string, std::string>> hidden;
  for (const auto& spec : package.op_specs()) {
    if (!spec->cpu.empty()) {
      hidden.emplace_back(spec->name, "kjit_cpu_" + spec->name);
    }
  }
  return hidden;
}

} // namespace kjit::torch_layer
