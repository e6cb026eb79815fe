// One call of a kjit op on the CUDA path: what it reads of its arguments, by symbol, without
// allocation; the environment the manifest's expressions are evaluated in (Evaluator's Env).
#pragma once

#include "abi.hpp"

#include "runtime/manifest/op_spec.hpp"

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace kjit::torch_layer {

// Symbols (arguments, outputs, workspaces) an op may have; bounds the per-call arrays.
constexpr std::size_t k_max_symbols = 32;
constexpr std::size_t k_max_list_items = 64; // all int[] arguments of one call together

// What the CUDA path reads of a tensor, read once per call. A null handle: an absent Tensor?.
struct TensorRef {
  AtenTensorHandle handle;
  const int64_t* sizes;
  const int64_t* strides;
  int64_t dim;
  int32_t dtype;
  int32_t device_type;
  int32_t device_index;
};

// Device facts the expressions may read (`device.*`), asked of the driver once per device.
struct DeviceProps {
  std::int64_t sm_count = 0;
  std::int64_t max_shared_mem = 0; // per block, opt-in
  std::int64_t cc = 0;
  std::int64_t warp_size = 0;
  std::string name; // "NVIDIA H200"
};
const DeviceProps& device_props(int device);

// The values of one call: tensors' metadata, scalars by value, int lists in one pool.
struct CallEnv {
  using Int = std::int64_t;
  // Written by binding before any read: not zero-initialized (per-call cost).
  std::array<TensorRef, k_max_symbols> tensors;
  std::array<std::int64_t, k_max_symbols> ints;
  std::array<double, k_max_symbols> floats;
  std::array<std::uint16_t, k_max_symbols> list_begin;
  std::array<std::uint16_t, k_max_symbols> list_size;
  std::array<std::int64_t, k_max_list_items> list_items;
  std::uint64_t absent = 0;  // bit s: symbol s is an absent optional
  std::size_t list_used = 0; // items of list_items taken
  const TorchApi* api = nullptr;
  const DeviceProps* props = nullptr; // set before launch-time expressions
  // While the tuner times candidates: the scratch copies the kernels get instead of the written
  // arguments' data (null entries: the argument's own). Null on every other call.
  const std::array<void*, k_max_symbols>* scratch = nullptr;

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
  detail::DType dtype(int t) const { return static_cast<detail::DType>(tensors[t].dtype); }
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
  bool present(int s) const { return ((absent >> s) & 1U) == 0; }
  Int list_item(int s, std::int64_t i) const { return list_items[list_begin[s] + i]; }
  std::int64_t list_len(int s) const { return list_size[s]; }
  bool aligned(int t, std::int64_t bytes) const;
  std::int64_t device_prop(detail::DeviceProp prop) const;
  static Int min(Int a, Int b) { return std::min(a, b); }
  static Int max(Int a, Int b) { return std::max(a, b); }
  static bool truth(bool value) { return value; }
  static std::optional<std::int64_t> concrete(Int value) { return value; }
};

TensorRef read_tensor(const TorchApi& api, AtenTensorHandle handle);
std::string device_text(const TorchApi& api, const TensorRef& t);
// "'x' has shape [2, 3], dtype float16, device cuda:0" (or "'x' is None").
std::string describe(const TorchApi& api, const std::string& name, const CallEnv& env, int i);
// The bytes of one element of `dtype` (0 for an unknown code).
std::size_t element_size(int32_t dtype) noexcept;

} // namespace kjit::torch_layer
