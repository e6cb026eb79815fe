#include "op_state.hpp"

#include <kjit/error.hpp>

#include "runtime/cuda/driver.hpp"
#include "runtime/logging.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace kjit::torch_layer {
namespace {

// Whether t's elements fill a dense block of memory, each once, in some order of its dimensions
// (c10's is_non_overlapping_and_dense): torch.empty_like keeps the strides of such a tensor.
bool non_overlapping_and_dense(const TensorRef& t) {
  const auto rank = static_cast<std::size_t>(t.dim);
  if (rank == 1) {
    return t.sizes[0] < 2 || t.strides[0] == 1;
  }
  std::array<std::size_t, k_max_rank> perm;
  for (std::size_t d = 0; d < rank; ++d) {
    perm[d] = d;
  }
  // Dimensions of size 0 or 1 last (their stride does not matter), the others by stride.
  std::sort(perm.begin(), perm.begin() + rank, [&](std::size_t a, std::size_t b) {
    if (t.sizes[a] < 2) {
      return false;
    }
    if (t.sizes[b] < 2) {
      return true;
    }
    return t.strides[a] < t.strides[b];
  });
  std::int64_t want = 1;
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t size = t.sizes[perm[i]];
    if (size < 2) {
      return true;
    }
    if (t.strides[perm[i]] != want) {
      return false;
    }
    want *= size;
  }
  return true;
}

} // namespace

// The boxed kernel: arguments on `stack`, results written back to its front.
void OpState::run(StableIValue* stack, std::uint64_t num_args, std::uint64_t num_returns) {
  const TorchApi& api = torch_api();
  const OpSpec& spec = *m_spec;
  Handles owned(api);
  CallEnv env;
  env.api = &api;
  bind_inputs(api, stack, num_args, env, owned);
  const std::size_t expected = m_outputs_only ? spec.outputs.size() : spec.returns.size();
  if (num_returns != expected) {
    runtime_error(fmt::format("{}: torch passes {} returns, the manifest declares {}", m_qualified,
                              num_returns, expected));
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
    const detail::OutputSpec& out = spec.outputs[o];
    const int64_t* strides = nullptr; // contiguous
    if (out.preserve_layout && non_overlapping_and_dense(env.tensors[out.like])) {
      strides = env.tensors[out.like].strides; // the shape is like's too (no dims with preserve)
    }
    allocate(api, env, owned, spec.num_inputs + o, shape, rank, dtype, device, strides);
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

// Takes every reference of the stack first (nothing throws before all are owned), then reads
// them: optionals unwrapped (torch boxes a present one in a heap StableIValue), strings mapped
// to the manifest's integers, int lists copied into the call's pool.
void OpState::bind_inputs(const TorchApi& api, const StableIValue* stack, std::uint64_t num_args,
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

std::int64_t OpState::string_value(const TorchApi& api, std::size_t i, StringHandle handle) const {
  const char* data = nullptr;
  size_t length = 0;
  check(api.torch_string_c_str(handle, &data), "torch_string_c_str", m_qualified.c_str());
  check(api.torch_string_length(handle, &length), "torch_string_length", m_qualified.c_str());
  const std::string_view text(data, length);
  for (const auto& [name, number] : m_spec->inputs[i].strings) {
    if (name == text) {
      return number;
    }
  }
  std::string known;
  for (const auto& [name, number] : m_spec->inputs[i].strings) {
    known += fmt::format("{}'{}'", known.empty() ? "" : ", ", name);
  }
  value_error(fmt::format("{}: argument '{}' is '{}'; expected one of {}", m_qualified,
                          m_spec->symbols[i].name, text, known));
}

void OpState::read_list(const TorchApi& api, std::size_t i, StableListHandle list,
                        CallEnv& env) const {
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
int32_t OpState::common_device(const TorchApi& api, const CallEnv& env) const {
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
void OpState::check_values(const TorchApi& api, const CallEnv& env) const {
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

std::string OpState::tensors_text(const TorchApi& api, const CallEnv& env) const {
  std::string text;
  for (std::size_t i = 0; i < m_spec->num_inputs; ++i) {
    if (m_spec->symbols[i].kind == Kind::tensor) {
      text += (text.empty() ? "" : "; ") +
              describe(api, m_spec->symbols[i].name, env, static_cast<int>(i));
    }
  }
  return text;
}

void OpState::output_shape(std::size_t o, const CallEnv& env,
                           std::array<std::int64_t, k_max_rank>& shape, std::size_t& rank,
                           DType& dtype) const {
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

// A new tensor as symbol `symbol` (an output or a workspace), owned by the call: contiguous, or
// with `like_strides` (those of a non-overlapping and dense tensor of the same shape); what
// torch would answer of it is known but for where it keeps the sizes and strides.
void OpState::allocate(const TorchApi& api, CallEnv& env, Handles& owned, std::size_t symbol,
                       const std::array<std::int64_t, k_max_rank>& shape, std::size_t rank,
                       DType dtype, int32_t device, const int64_t* like_strides) const {
  std::array<std::int64_t, k_max_rank> strides;
  std::int64_t step = 1;
  for (std::size_t d = rank; d-- > 0;) {
    strides[d] = like_strides != nullptr ? like_strides[d] : step;
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
void OpState::make_workspaces(const TorchApi& api, CallEnv& env, Handles& owned, int32_t device,
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

} // namespace kjit::torch_layer
