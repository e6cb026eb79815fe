#include "runtime/expr.hpp"

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

// x: a [4, 6, 3] float16 tensor (contiguous); n = 10; a = 0.5; f = true.
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
  static Int min(Int a, Int b) { return std::min(a, b); }
  static Int max(Int a, Int b) { return std::max(a, b); }
  static bool truth(bool v) { return v; }
};

const std::vector<Symbol> k_symbols{
  {"x", Kind::tensor}, {"n", Kind::int_}, {"a", Kind::float_}, {"f", Kind::bool_}};

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
  CHECK_THROWS_WITH(parse("nope"), Catch::Contains("arguments and outputs: x, n, a, f"));
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
