// The names of dtypes (as manifests write them, and the C++ types NVRTC code uses for them) and
// of expression kinds.
#include "runtime/manifest/expr.hpp"

namespace kjit::detail {
namespace {

struct DTypeName {
  std::string_view name;
  DType dtype;
};

constexpr DTypeName k_dtype_names[] = {
  {"uint8", DType::uint8},       {"int8", DType::int8},       {"int16", DType::int16},
  {"int32", DType::int32},       {"int64", DType::int64},     {"float16", DType::float16},
  {"float32", DType::float32},   {"float64", DType::float64}, {"bool", DType::bool_},
  {"bfloat16", DType::bfloat16}, {"half", DType::float16},    {"float", DType::float32},
  {"double", DType::float64},    {"bf16", DType::bfloat16},   {"fp16", DType::float16},
  {"fp32", DType::float32},      {"long", DType::int64},      {"int", DType::int32},
};

} // namespace

std::string_view dtype_name(DType dtype) noexcept {
  for (const auto& [name, value] : k_dtype_names) {
    if (value == dtype) {
      return name;
    }
  }
  return "unknown";
}

bool parse_dtype(std::string_view name, DType& out) noexcept {
  for (const auto& [known, value] : k_dtype_names) {
    if (known == name) {
      out = value;
      return true;
    }
  }
  return false;
}

std::string_view dtype_cpp_type(DType dtype) noexcept {
  switch (dtype) {
  case DType::uint8:
    return "unsigned char";
  case DType::int8:
    return "signed char";
  case DType::int16:
    return "short";
  case DType::int32:
    return "int";
  case DType::int64:
    return "long long";
  case DType::float16:
    return "__half";
  case DType::float32:
    return "float";
  case DType::float64:
    return "double";
  case DType::bool_:
    return "bool";
  case DType::bfloat16:
    return "__nv_bfloat16";
  }
  return "void";
}

std::string_view kind_name(Kind kind) noexcept {
  switch (kind) {
  case Kind::int_:
    return "int";
  case Kind::float_:
    return "float";
  case Kind::bool_:
    return "bool";
  case Kind::dtype:
    return "dtype";
  case Kind::tensor:
    return "Tensor";
  case Kind::int_list:
    return "int[]";
  }
  return "?";
}

} // namespace kjit::detail
