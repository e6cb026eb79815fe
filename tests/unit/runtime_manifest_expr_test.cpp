#include "runtime/manifest/expr.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <vector>

using kjit::detail::DType;
using kjit::detail::EvalError;
using kjit::detail::Evaluator;
using kjit::detail::Expr;
using kjit::detail::ExprError;
using kjit::detail::Kind;
using kjit::detail::Symbol;

namespace {

// x: a [4, 6, 3] float16 tensor (contiguous); n = 10; a = 0.5; f = true; see k_symbols.
struct FakeEnv {
  using Int = std::int64_t;
  std::vector<std::int64_t> sizes{4, 6, 3};
  Int size(int, std::int64_t d) const { return sizes[d]; }
  Int stride(int, std::int64_t d) const { return d == 0 ? 18 : d == 1 ? 3 : 1; }
  Int numel(int) const { return 72; }
  std::int64_t dim(int) const { return 3; }
  DType dtype(int) const { return DType::float16; }
  bool is_contiguous(int) const { return true; }
  Int int_value(int) const { return 10; }
  double float_value(int) const { return 0.5; }
  bool bool_value(int) const { return true; }
  bool present(int s) const { return s != 4; } // b is None
  Int list_item(int, std::int64_t i) const { return std::array<Int, 3>{2, 5, 7}[i]; }
  std::int64_t list_len(int) const { return 3; }
  bool aligned(int, std::int64_t bytes) const { return bytes <= 16; }
  std::int64_t device_prop(kjit::detail::DeviceProp p) const {
    using kjit::detail::DeviceProp;
    return p == DeviceProp::sm_count         ? 132
           : p == DeviceProp::max_shared_mem ? 232448
           : p == DeviceProp::cc             ? 90
                                             : 32;
  }
  static Int min(Int a, Int b) { return std::min(a, b); }
  static Int max(Int a, Int b) { return std::max(a, b); }
  static bool truth(bool v) { return v; }
};

// b: an absent Tensor?; dims = [2, 5, 7]; k: an int? (present, 10).
const std::vector<Symbol> k_symbols{
  {"x", Kind::tensor},       {"n", Kind::int_},        {"a", Kind::float_},    {"f", Kind::bool_},
  {"b", Kind::tensor, true}, {"dims", Kind::int_list}, {"k", Kind::int_, true}};

Expr parse(const char* text) {
  return Expr::parse(text, k_symbols);
}

std::int64_t integer(const char* text) {
  const Expr e = parse(text);
  return Evaluator(e, FakeEnv{}).integer();
}

bool boolean(const char* text) {
  const Expr e = parse(text);
  return Evaluator(e, FakeEnv{}).boolean();
}

} // namespace

TEST_CASE("integer expressions", "[expr]") {
  CHECK(integer("x.size(0) * x.size(1)") == 24);
  CHECK(integer("x.size(-1)") == 3);
  CHECK(integer("cdiv(x.size(1), 4)") == 2);
  CHECK(integer("cdiv(-7, 2)") == -3);
  CHECK(integer("min(x.numel(), 65535) + max(1, n)") == 82);
  CHECK(integer("(n - 3) * 2 % 5") == 4);
  CHECK(integer("-n + x.stride(0)") == 8);
  CHECK(integer("x.dim()") == 3);
}

TEST_CASE("boolean expressions and precedence", "[expr]") {
  CHECK(boolean("x.dim() == 3 && x.size(2) == 3"));
  CHECK(boolean("x.dtype == float16 || x.dtype == bfloat16"));
  CHECK_FALSE(boolean("x.dtype == uint8"));
  CHECK(boolean("x.is_contiguous() && f"));
  CHECK(boolean("!(n < 3) && a < 1"));
  CHECK(boolean("1 + 2 * 3 == 7"));
  CHECK(boolean("n >= 10 && n <= 10 && n != 9"));
}

TEST_CASE("parse errors point at the column", "[expr]") {
  auto column = [](const char* text) {
    try {
      parse(text);
    } catch (const ExprError& e) {
      return static_cast<int>(e.column());
    }
    return -1;
  };
  CHECK(column("x.size(0) +") == 12);
  CHECK(column("cdiv(n, )") == 9);
  CHECK(column("y + 1") == 1);
  CHECK(column("x.shape(0)") == 3);
  CHECK(column("n $ 2") == 3);
  CHECK(column("x.dtype == 3") == 9);
  CHECK(column("x + 1") == 3);
  CHECK_THROWS_WITH(parse("x.sizes(0)"), Catch::Contains("unknown tensor property 'sizes'"));
  CHECK_THROWS_WITH(parse("nope"),
                    Catch::Contains("arguments and outputs: x, n, a, f, b, dims, k"));
  CHECK_THROWS_AS(parse(std::string(5000, '(').c_str()), ExprError);
  CHECK_THROWS_WITH(parse((std::string(1000, '(') + "1" + std::string(1000, ')')).c_str()),
                    Catch::Contains("nested deeper than"));
  CHECK_THROWS_WITH(parse((std::string(1000, '-') + "1").c_str()),
                    Catch::Contains("nested deeper than"));
}

TEST_CASE("evaluation errors are errors, never undefined behaviour", "[expr]") {
  CHECK_THROWS_WITH(integer("n / (n - 10)"), Catch::Contains("division by zero"));
  CHECK_THROWS_WITH(integer("n % 0"), Catch::Contains("division by zero"));
  CHECK_THROWS_WITH(integer("9223372036854775807 + 1"), Catch::Contains("integer overflow"));
  CHECK_THROWS_WITH(integer("4611686018427387904 * 4"), Catch::Contains("integer overflow"));
  CHECK_THROWS_WITH(integer("(-9223372036854775807 - 1) / -1"), Catch::Contains("overflow"));
  CHECK_THROWS_WITH(integer("x.size(3)"), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(integer("x.size(-4)"), Catch::Contains("out of range"));
}

TEST_CASE("conditionals, computed constants, optionals, lists and device properties", "[expr]") {
  CHECK(integer("f ? 8 : 1") == 8);
  CHECK(integer("n > 20 ? 1 : n > 5 ? 2 : 3") == 2);
  CHECK(integer("present(b) ? b.size(0) : 0") == 0); // the branch not taken is not evaluated
  CHECK(integer("present(k) ? k : 1") == 10);
  CHECK(integer("next_pow2(x.size(1))") == 8);
  CHECK(integer("next_pow2(1) + next_pow2(0) + next_pow2(-5)") == 3);
  CHECK(integer("next_pow2(1024)") == 1024);
  CHECK(integer("min(next_pow2(n * 100), 512)") == 512);
  CHECK(integer("gcd(x.numel(), 48)") == 24);
  CHECK(integer("gcd(-12, 18) + gcd(0, 0)") == 6);
  CHECK(integer("dims[0] * dims[-1] + len(dims)") == 17);
  CHECK(integer("device.sm_count * 2") == 264);
  CHECK(integer("device.max_shared_mem / 1024 + device.cc + device.warp_size") == 349);
  CHECK(integer("aligned(x, 16) && x.size(-1) % 8 == 0 ? 8 : 1") == 1);
  CHECK(integer("aligned(x, 16) ? 8 : 1") == 8);
  CHECK(Evaluator(parse("f ? a : 2"), FakeEnv{}).number() == 0.5);
  CHECK(parse("f ? a : 2").kind() == Kind::float_);
  CHECK(parse("f ? x.dtype : float32").kind() == Kind::dtype);
  CHECK(parse("device.sm_count").uses_device());
  CHECK(parse("aligned(x, 4)").uses_device());
  CHECK_FALSE(parse("present(b) && n > 1").uses_device());

  CHECK_THROWS_WITH(integer("b.size(0)"),
                    Catch::Contains("'b' is None") && Catch::Contains("present(b)"));
  CHECK_THROWS_WITH(integer("dims[3]"), Catch::Contains("index 3 is out of range"));
  CHECK_THROWS_WITH(integer("next_pow2(4611686018427387905)"), Catch::Contains("overflow"));
  CHECK_THROWS_WITH(parse("present(n)"), Catch::Contains("optional argument"));
  CHECK_THROWS_WITH(parse("len(n)"), Catch::Contains("int[]"));
  CHECK_THROWS_WITH(parse("n[0]"), Catch::Contains("indexes an int[]"));
  CHECK_THROWS_WITH(parse("n ? 1 : 2"), Catch::Contains("bool condition"));
  CHECK_THROWS_WITH(parse("f ? 1 : x"), Catch::Contains("branches"));
  CHECK_THROWS_WITH(parse("f ? 1"), Catch::Contains("':'"));
  CHECK_THROWS_WITH(parse("device.nope"), Catch::Contains("unknown device property 'nope'"));
  CHECK_THROWS_WITH(parse("gcd(a, 2)"), Catch::Contains("int arguments"));
  CHECK_THROWS_WITH(parse("foo(1)"), Catch::Contains("unknown function 'foo'"));
  CHECK_THROWS_WITH(parse("aligned(n, 16)"), Catch::Contains("tensor argument"));
}
