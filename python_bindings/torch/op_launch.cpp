#include "op_state.hpp"
#include "ops.hpp"

#include <kjit/error.hpp>

#include "runtime/cuda/driver.hpp"
#include "runtime/logging.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstring>

namespace kjit::torch_layer {

// The kernel slot of launch `l` for this call's specialization values on `device` (compiled or
// fetched once). The slot of the launch's previous call is checked first, without a lock: a
// stream of calls with the same dtypes pays one comparison. Slots live in a deque, so the
// reference stays valid.
std::array<std::int64_t, k_max_spec> OpState::spec_values(const detail::LaunchSpec& launch,
                                                          const CallEnv& env) const {
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
  return values;
}

std::pair<Program, std::string>
OpState::specialized(const detail::LaunchSpec& launch,
                     const std::array<std::int64_t, k_max_spec>& values) const {
  std::vector<std::pair<std::string, std::string>> texts;
  for (std::size_t i = 0; i < launch.specialize.size(); ++i) {
    const auto& param = launch.specialize[i];
    texts.emplace_back(param.name, detail::specialization_text(param.expr.kind(), values[i]));
  }
  return m_package.specialize(m_package.kernels()[launch.kernel], texts);
}

KernelSlot& OpState::kernel(std::size_t l, const CallEnv& env, int device) {
  const detail::LaunchSpec& launch = m_spec->launches[l];
  const std::array<std::int64_t, k_max_spec> values = spec_values(launch, env);
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
  const auto start = std::chrono::steady_clock::now();
  auto [program, name] = specialized(launch, values);
  const auto specialized = std::chrono::steady_clock::now();
  Kernel kernel = runtime().kernel(program, name);
  using Ms = std::chrono::duration<double, std::milli>;
  detail::log(LogLevel::debug, "{}: kernel '{}' for cuda:{} ready in {:.2f} ms (program {:.2f} ms)",
              m_qualified, name, device, Ms(std::chrono::steady_clock::now() - start).count(),
              Ms(specialized - start).count());
  KernelSlot& slot = m_kernels.emplace_back();
  slot.launch = l;
  slot.values = values;
  slot.device = device;
  slot.kernel = std::move(kernel);
  m_last[l].store(&slot, std::memory_order_release);
  return slot;
}

unsigned OpState::launch_dim(const Expr& expr, const CallEnv& env, const char* what) const {
  const std::int64_t value = Evaluator(expr, env).integer();
  if (value < 0 || value > INT32_MAX) {
    value_error(
      fmt::format("{}: {} '{}' is {}, outside [0, 2^31)", m_qualified, what, expr.text(), value));
  }
  return static_cast<unsigned>(value);
}

// Packs one kernel argument into `slot` as the kernel's parameter `size` asks; returns its size.
// An absent optional tensor is a null pointer.
std::size_t OpState::pack(const TorchApi& api, const Expr& expr, const CallEnv& env,
                          std::size_t param_size, std::uint64_t& slot, std::size_t index) const {
  switch (expr.kind()) {
  case Kind::tensor: {
    const auto symbol = expr.nodes()[expr.root()].a;
    void* ptr = env.scratch != nullptr ? (*env.scratch)[symbol] : nullptr;
    if (ptr == nullptr && env.tensors[symbol].handle != nullptr) {
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

void OpState::launch_all(const TorchApi& api, CallEnv& env, Handles& owned, int32_t device) {
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
    tune_values(api, env, device, stream);
  }
  for (std::size_t l = 0; l < spec.launches.size(); ++l) {
    launch(api, env, l, device, stream);
  }
}

void OpState::launch(const TorchApi& api, const CallEnv& env, std::size_t l, int32_t device,
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
                              m_qualified, which, spec.args.size(), kernel.name(), params.size()));
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
void OpState::allow_shared_memory(KernelSlot& slot, unsigned bytes, int32_t device,
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

} // namespace kjit::torch_layer
