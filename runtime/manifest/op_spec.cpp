// The parts of torch's schema language kjit reads, and small helpers of the op specs.
#include "runtime/manifest/op_spec.hpp"

#include <fmt/format.h>

#include <cctype>
#include <stdexcept>

namespace kjit::detail {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) {
    s.remove_prefix(1);
  }
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) {
    s.remove_suffix(1);
  }
  return s;
}

// Splits at top-level commas (not inside brackets, parentheses or quotes).
std::vector<std::string_view> split(std::string_view list) {
  std::vector<std::string_view> items;
  int depth = 0;
  char quote = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (quote != 0) {
      quote = c == quote ? 0 : quote;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '(' || c == '[') {
      ++depth;
    } else if (c == ')' || c == ']') {
      --depth;
    } else if (c == ',' && depth == 0) {
      items.push_back(trim(list.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (!trim(list.substr(start)).empty() || !items.empty()) {
    items.push_back(trim(list.substr(start)));
  }
  return items;
}

// "Tensor(a!)" -> base "Tensor", alias "a", write; "Tensor!" -> write, no set name.
struct TypeText {
  std::string_view base;
  std::string alias;
  bool annotated = false;
  bool write = false;
  bool optional = false;
  bool list = false;
};

TypeText parse_type(std::string_view type) {
  TypeText t;
  if (type.ends_with('?')) {
    t.optional = true;
    type = trim(type.substr(0, type.size() - 1));
  }
  if (type.ends_with(']')) {
    const auto open = type.rfind('[');
    if (open == std::string_view::npos) {
      throw std::invalid_argument(fmt::format("cannot read the type '{}'", type));
    }
    t.list = true;
    type = trim(type.substr(0, open));
  }
  if (type.ends_with('!')) {
    t.annotated = t.write = true;
    type = trim(type.substr(0, type.size() - 1));
  } else if (type.ends_with(')')) {
    const auto open = type.find('(');
    if (open == std::string_view::npos) {
      throw std::invalid_argument(fmt::format("cannot read the type '{}'", type));
    }
    std::string_view set = trim(type.substr(open + 1, type.size() - open - 2));
    t.annotated = true;
    if (set.ends_with('!')) {
      t.write = true;
      set = trim(set.substr(0, set.size() - 1));
    }
    t.alias = std::string(set);
    type = trim(type.substr(0, open));
  }
  t.base = type;
  return t;
}

bool is_name(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name.front()))) {
    return false;
  }
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') {
      return false;
    }
  }
  return true;
}

} // namespace

SchemaInfo parse_schema(std::string_view schema) {
  SchemaInfo info;
  const auto open = schema.find('(');
  const auto arrow = schema.rfind("->");
  if (open == std::string_view::npos || arrow == std::string_view::npos) {
    throw std::invalid_argument("expected 'name(Type arg, ...) -> Tensor'");
  }
  info.name = std::string(trim(schema.substr(0, open)));
  const auto close = schema.rfind(')', arrow);
  if (close == std::string_view::npos || close < open) {
    throw std::invalid_argument("unbalanced parentheses");
  }
  for (std::string_view item : split(schema.substr(open + 1, close - open - 1))) {
    if (item == "*") {
      continue; // keyword-only arguments follow
    }
    std::string_view default_text;
    if (const auto eq = item.find('='); eq != std::string_view::npos) {
      default_text = trim(item.substr(eq + 1));
      item = trim(item.substr(0, eq));
    }
    const auto space = item.rfind(' ');
    if (space == std::string_view::npos) {
      throw std::invalid_argument(fmt::format("argument '{}' has no type or no name", item));
    }
    const std::string name(trim(item.substr(space + 1)));
    if (!is_name(name)) {
      throw std::invalid_argument(fmt::format("'{}' is not an argument name", name));
    }
    const std::string_view type_text = trim(item.substr(0, space));
    const TypeText type = parse_type(type_text);
    SchemaArg arg;
    arg.symbol.name = name;
    arg.spec.optional = type.optional;
    arg.spec.default_text = std::string(default_text);
    const bool integer = type.base == "int" || type.base == "SymInt";
    if (type.list) {
      if (!integer || type.optional || type.annotated) {
        throw std::invalid_argument(fmt::format(
          "argument '{}' has type '{}': kjit ops take lists of int (int[], SymInt[]) only", name,
          type_text));
      }
      arg.spec.type = ArgType::int_list;
      arg.symbol.kind = Kind::int_list;
    } else if (type.base == "Tensor") {
      arg.spec.type = ArgType::tensor;
      arg.symbol.kind = Kind::tensor;
    } else if (integer) {
      arg.spec.type = ArgType::int_;
      arg.symbol.kind = Kind::int_;
    } else if (type.base == "float") {
      arg.spec.type = ArgType::float_;
      arg.symbol.kind = Kind::float_;
    } else if (type.base == "bool") {
      arg.spec.type = ArgType::bool_;
      arg.symbol.kind = Kind::bool_;
    } else if (type.base == "ScalarType") {
      arg.spec.type = ArgType::dtype;
      arg.symbol.kind = Kind::dtype;
    } else if (type.base == "str") {
      if (type.optional) {
        throw std::invalid_argument(fmt::format(
          "argument '{}': kjit ops take str, not str? (give it a default instead)", name));
      }
      arg.spec.type = ArgType::str;
      arg.symbol.kind = Kind::int_; // expressions see the integer the manifest maps it to
    } else {
      throw std::invalid_argument(fmt::format(
        "argument '{}' has type '{}': kjit ops take Tensor (also Tensor?, Tensor(a!), Tensor!), "
        "int, SymInt, float, bool, ScalarType (each also optional, T?), str and int[] arguments",
        name, type_text));
    }
    if (type.annotated) {
      if (arg.spec.type != ArgType::tensor) {
        throw std::invalid_argument(
          fmt::format("argument '{}': only tensors take alias annotations", name));
      }
      if (!type.write) {
        throw std::invalid_argument(fmt::format(
          "argument '{}' has type '{}': a read-only alias annotation declares a view, and kjit "
          "ops make no views; write Tensor, or Tensor(a!) if the op writes it",
          name, type_text));
      }
      arg.spec.is_mutable = true;
      arg.spec.alias = type.alias;
    }
    arg.symbol.optional = type.optional;
    info.arguments.push_back(std::move(arg));
  }
  std::string_view returns = trim(schema.substr(arrow + 2));
  std::vector<std::string_view> items;
  if (returns.size() >= 2 && returns.front() == '(' && returns.back() == ')') {
    items = split(returns.substr(1, returns.size() - 2));
  } else {
    items.push_back(returns);
  }
  for (std::string_view item : items) {
    // A return may be named: "Tensor(a!) out".
    if (const auto space = item.rfind(' '); space != std::string_view::npos &&
                                            is_name(trim(item.substr(space + 1))) &&
                                            item.substr(space + 1) != "Tensor") {
      item = trim(item.substr(0, space));
    }
    const TypeText type = parse_type(item);
    if (type.base != "Tensor" || type.optional || type.list) {
      throw std::invalid_argument(
        fmt::format("return '{}': kjit ops return Tensor, Tensor(a!) (a mutated argument), a "
                    "tuple of them, or ()",
                    item));
    }
    if (type.annotated && (!type.write || type.alias.empty())) {
      throw std::invalid_argument(fmt::format(
        "return '{}': a returned alias names the mutated argument's set, as Tensor(a!)", item));
    }
    info.returns.push_back(SchemaReturn{type.alias});
  }
  return info;
}

std::optional<std::int64_t> literal_value(const Expr& expr) {
  const Node& root = expr.nodes()[expr.root()];
  switch (root.op) {
  case NodeOp::int_literal:
  case NodeOp::bool_literal:
  case NodeOp::dtype_literal:
    return root.value;
  case NodeOp::neg:
    if (expr.nodes()[root.a].op == NodeOp::int_literal) {
      return -expr.nodes()[root.a].value;
    }
    break;
  default:
    break;
  }
  return std::nullopt;
}

std::string specialization_text(Kind kind, std::int64_t value) {
  if (kind == Kind::dtype) {
    return std::string(dtype_cpp_type(static_cast<DType>(value)));
  }
  if (kind == Kind::bool_) {
    return value != 0 ? "true" : "false";
  }
  return std::to_string(value);
}

} // namespace kjit::detail
