// libFuzzer target: the expression parser and evaluator must reject or evaluate any input
// without crashing or undefined behaviour (built with ASan and UBSan).
#include "runtime/manifest/expr.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace {

using kjit::detail::DType;
using kjit::detail::Kind;

struct Env {
  using Int = std::int64_t;
  Int size(int, std::int64_t d) const { return 3 + d; }
  Int stride(int, std::int64_t d) const { return 1 << (2 * d); }
  Int numel(int) const { return 60; }
  std::int64_t dim(int) const { return 3; }
  DType dtype(int) const { return DType::bfloat16; }
  bool is_contiguous(int) const { return true; }
  Int int_value(int) const { return -7; }
  double float_value(int) const { return 1.5; }
  bool bool_value(int) const { return false; }
  bool present(int s) const { return s % 2 == 0; }
  Int list_item(int, std::int64_t i) const { return 4 - i; }
  std::int64_t list_len(int) const { return 4; }
  bool aligned(int, std::int64_t bytes) const { return bytes % 2 == 0; }
  std::int64_t device_prop(kjit::detail::DeviceProp) const { return 132; }
  static Int min(Int a, Int b) { return a < b ? a : b; }
  static Int max(Int a, Int b) { return a < b ? b : a; }
  static bool truth(bool v) { return v; }
};

const std::vector<kjit::detail::Symbol> k_symbols{
  {"x", Kind::tensor},          {"y", Kind::tensor},      {"n", Kind::int_},
  {"eps", Kind::float_},        {"flag", Kind::bool_},    {"t", Kind::dtype},
  {"bias", Kind::tensor, true}, {"dims", Kind::int_list}, {"s", Kind::float_, true}};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto expr = kjit::detail::Expr::parse(text, k_symbols);
    const Env env;
    kjit::detail::Evaluator evaluator(expr, env);
    switch (expr.kind()) {
    case Kind::int_:
      (void)evaluator.integer();
      break;
    case Kind::float_:
      (void)evaluator.number();
      break;
    case Kind::bool_:
      (void)evaluator.boolean();
      break;
    case Kind::dtype:
      (void)evaluator.dtype();
      break;
    case Kind::tensor:
      break;
    }
  } catch (const kjit::detail::ExprError&) {
  } catch (const kjit::detail::EvalError&) {
  }
  return 0;
}
