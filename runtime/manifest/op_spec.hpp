// An op of a kernel package with every expression parsed: what the torch layer evaluates per call.
//
// Symbols (the names expressions use), in order: the schema's arguments, the new outputs
// (out0, out1, ...), the workspaces by name, then the tunable parameters (Note [Tuning]).
#pragma once

#include <kjit/package.hpp>

#include "runtime/manifest/expr.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kjit::detail {

// How a schema argument reaches the kernel: its torch type, as kjit binds it.
enum class ArgType : std::uint8_t { tensor, int_, float_, bool_, dtype, str, int_list };

struct ArgSpec {
  ArgType type = ArgType::tensor;
  bool optional = false;    // `T?`: may be None
  bool is_mutable = false;  // `Tensor(a!)` / `Tensor!`: the op writes it
  std::string alias;        // the alias set ("a"), empty for `Tensor!` and for read-only arguments
  std::string default_text; // as written after '=', or empty
  // For str arguments: the strings the manifest maps to integers (expressions see the integer).
  std::vector<std::pair<std::string, std::int64_t>> strings;
};

// One return of the schema: a new output (index into `outputs`) or a mutated argument.
struct ReturnSpec {
  std::int32_t output = -1;
  std::int32_t alias = -1; // argument index
};

struct OutputSpec {
  std::vector<Expr> shape;                         // or empty with `like`
  std::int32_t like = -1;                          // symbol index of a tensor argument
  std::vector<std::pair<std::int64_t, Expr>> dims; // with `like`
  std::optional<Expr> dtype;                       // else like's dtype
  bool hidden = false;                             // saved for the backward, not returned
  bool preserve_layout = false; // like's strides where like is non-overlapping and dense
};

// What one argument of a backward call is: an argument of the forward, one of its outputs
// (hidden ones too), or the gradient of a returned output.
struct BackwardArg {
  enum class Source : std::uint8_t { input, output, grad };
  Source source = Source::input;
  std::int32_t index = 0; // argument or output index
};

struct BackwardSpec {
  std::string op;           // an op of the same package
  std::size_t op_index = 0; // into Package::op_specs()
  std::vector<BackwardArg> args;
  std::vector<std::int32_t>
    gradients; // the forward argument each return of `op` is the gradient of
};

// A temporary tensor of one call, from torch's caching allocator on the op's stream; never
// returned, never made by the fake kernel.
struct WorkspaceSpec {
  std::string name;
  std::vector<Expr> shape;
  Expr dtype;
  bool zero = false; // cleared on the stream before the first launch
};

struct SpecParam {
  std::string name; // the placeholder, "T"
  Expr expr;        // kind dtype, int or bool
};

struct LaunchSpec {
  std::size_t kernel = 0;   // index into Package::kernels()
  std::optional<Expr> when; // skipped when false
  std::vector<Expr> args;
  std::vector<Expr> grid;
  std::vector<Expr> block;
  Expr shared_mem;
  std::vector<SpecParam> specialize;
};

// Note [Tuning]: an op's tunable parameters. Each is an int symbol (after the workspaces) that
// launch expressions read; a call takes the values of its bucket's tuned configuration, or the
// defaults. Candidates are the cartesian product of the value lists, pruned by `valid`.
constexpr std::size_t k_max_tune_params = 8; // tune parameters of one op
constexpr std::size_t k_max_tune_key = 16;   // tune_key expressions of one op

struct TuneParam {
  std::string name;
  std::vector<std::int64_t> values;
  std::int32_t symbol = -1;
  Expr default_value; // of the arguments
};
struct TuneSpec {
  std::vector<TuneParam> params;
  std::optional<Expr> valid; // of the arguments, the parameters and device.*
  std::vector<Expr> key;     // bucket expressions of the arguments (tensor dtypes are added)
  bool empty() const noexcept { return params.empty(); }
};

struct OpSpec {
  std::string ns; // the package name: torch.ops.<ns>.<name>
  std::string name;
  std::string schema;
  std::vector<Symbol> symbols; // arguments, outputs, workspaces
  std::size_t num_inputs = 0;
  std::vector<ArgSpec> inputs; // one per schema argument
  std::vector<ReturnSpec> returns;
  std::vector<Expr> checks;
  std::vector<OutputSpec> outputs;
  std::vector<WorkspaceSpec> workspaces;
  std::vector<LaunchSpec> launches;
  TuneSpec tune;
  bool uses_device = false; // some launch-time expression reads device.* or aligned()
  std::string cpu;
  std::optional<BackwardSpec> backward; // linked when the whole package is read

  // Whether a return aliases a mutated argument: torch cannot functionalize such an op, so the
  // torch layer registers a twin without those returns (Note [Aliasing returns]).
  bool aliasing_returns() const noexcept {
    for (const auto& r : returns) {
      if (r.alias >= 0) {
        return true;
      }
    }
    return false;
  }

  // Whether the torch layer registers a twin `_kjit_<name>` that returns every new output
  // (Note [Aliasing returns], Note [Backward ops]).
  bool has_twin() const noexcept { return backward.has_value() || aliasing_returns(); }
};

// The arguments and returns of a torch schema string, "name(Tensor(a!) x, int n=1) -> ()".
struct SchemaArg {
  Symbol symbol;
  ArgSpec spec;
};
struct SchemaReturn {
  std::string alias; // the alias set of `Tensor(a!)`, empty for a new tensor
};
struct SchemaInfo {
  std::string name;
  std::vector<SchemaArg> arguments;
  std::vector<SchemaReturn> returns;
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
