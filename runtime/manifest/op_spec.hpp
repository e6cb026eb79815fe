// An op of a kernel package with every expression parsed: what the torch layer evaluates per call.
#pragma once

#include <kjit/package.hpp>

#include "runtime/expr.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kjit::detail {

struct OutputSpec {
  std::vector<Expr> shape;                         // or empty with `like`
  std::int32_t like = -1;                          // symbol index of a tensor argument
  std::vector<std::pair<std::int64_t, Expr>> dims; // with `like`
  std::optional<Expr> dtype;                       // else like's dtype
};

struct SpecParam {
  std::string name; // the placeholder, "T"
  Expr expr;        // kind dtype, int or bool
};

struct OpSpec {
  std::string ns; // the package name: torch.ops.<ns>.<name>
  std::string name;
  std::string schema;
  std::size_t kernel = 0;      // index into Package::kernels()
  std::vector<Symbol> symbols; // the schema's arguments, then out0, out1, ...
  std::size_t num_inputs = 0;
  std::vector<Expr> checks;
  std::vector<OutputSpec> outputs;
  std::vector<Expr> args;
  std::vector<Expr> grid;
  std::vector<Expr> block;
  Expr shared_mem;
  std::vector<SpecParam> specialize;
  std::string cpu;
};

// The argument names and kinds of a torch schema string, "name(Tensor x, int n) -> Tensor".
struct SchemaInfo {
  std::string name;
  std::vector<Symbol> arguments;
  std::size_t returns = 0; // the number of returned tensors
};

// Parses the parts of `schema` kjit needs; throws std::invalid_argument saying what is wrong
// (torch parses the whole schema when the op is registered).
SchemaInfo parse_schema(std::string_view schema);

// The value of a literal expression ("float16", "128", "-1", "true"), or nullopt when `expr` is
// not a literal.
std::optional<std::int64_t> literal_value(const Expr& expr);

// Whether a manifest may hold code point `c` (see Note [toml++ and non-ASCII]).
bool manifest_code_point_ok(char32_t c) noexcept;

// The C++ text a specialization value stands for in an entry ("__half", "128", "true").
std::string specialization_text(Kind kind, std::int64_t value);

} // namespace kjit::detail
