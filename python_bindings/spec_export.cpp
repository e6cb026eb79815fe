#include "spec_export.hpp"

#include <pybind11/stl.h>

namespace py = pybind11;

namespace kjit::python {
namespace {

using detail::Expr;
using detail::NodeOp;

const char* op_name(NodeOp op) {
  switch (op) {
  case NodeOp::int_literal:
    return "int";
  case NodeOp::float_literal:
    return "float";
  case NodeOp::bool_literal:
    return "bool";
  case NodeOp::dtype_literal:
    return "dtype";
  case NodeOp::symbol:
    return "symbol";
  case NodeOp::neg:
    return "neg";
  case NodeOp::not_:
    return "not";
  case NodeOp::add:
    return "add";
  case NodeOp::sub:
    return "sub";
  case NodeOp::mul:
    return "mul";
  case NodeOp::div:
    return "div";
  case NodeOp::mod:
    return "mod";
  case NodeOp::eq:
    return "eq";
  case NodeOp::ne:
    return "ne";
  case NodeOp::lt:
    return "lt";
  case NodeOp::le:
    return "le";
  case NodeOp::gt:
    return "gt";
  case NodeOp::ge:
    return "ge";
  case NodeOp::and_:
    return "and";
  case NodeOp::or_:
    return "or";
  case NodeOp::cdiv:
    return "cdiv";
  case NodeOp::min:
    return "min";
  case NodeOp::max:
    return "max";
  case NodeOp::size:
    return "size";
  case NodeOp::stride:
    return "stride";
  case NodeOp::numel:
    return "numel";
  case NodeOp::dim:
    return "dim";
  case NodeOp::dtype_of:
    return "dtype_of";
  case NodeOp::is_contiguous:
    return "is_contiguous";
  case NodeOp::gcd:
    return "gcd";
  case NodeOp::next_pow2:
    return "next_pow2";
  case NodeOp::present:
    return "present";
  case NodeOp::aligned:
    return "aligned";
  case NodeOp::len:
    return "len";
  case NodeOp::select:
    return "select";
  case NodeOp::item:
    return "item";
  case NodeOp::device_prop:
    return "device_prop";
  }
  return "unknown";
}

py::dict export_expr(const Expr& expr) {
  py::list nodes;
  for (const auto& n : expr.nodes()) {
    nodes.append(py::make_tuple(op_name(n.op), std::string(detail::kind_name(n.kind)), n.a, n.b,
                                n.value, n.number, n.c, n.column));
  }
  py::dict d;
  d["text"] = expr.text();
  d["kind"] = std::string(detail::kind_name(expr.kind()));
  d["root"] = expr.root();
  d["nodes"] = nodes;
  return d;
}

struct IntEnv {
  using Int = std::int64_t;
  const std::vector<std::int64_t>& values;
  Int size(int, std::int64_t) const { return 0; }
  Int stride(int, std::int64_t) const { return 0; }
  Int numel(int) const { return 0; }
  std::int64_t dim(int) const { return 0; }
  detail::DType dtype(int) const { return detail::DType::float32; }
  bool is_contiguous(int) const { return true; }
  Int int_value(int s) const { return values[s]; }
  double float_value(int) const { return 0; }
  bool bool_value(int s) const { return values[s] != 0; }
  bool present(int) const { return true; }
  Int list_item(int, std::int64_t) const { return 0; }
  std::int64_t list_len(int) const { return 0; }
  bool aligned(int, std::int64_t) const { return true; }
  std::int64_t device_prop(detail::DeviceProp) const { return 0; }
  static Int min(Int a, Int b) { return std::min(a, b); }
  static Int max(Int a, Int b) { return std::max(a, b); }
  static bool truth(bool value) { return value; }
  static std::optional<std::int64_t> concrete(Int value) { return value; }
};

} // namespace

py::tuple evaluate_expr(const std::string& text, const std::vector<std::string>& names,
                        const std::vector<std::int64_t>& values) {
  std::vector<detail::Symbol> symbols;
  for (const auto& name : names) {
    symbols.push_back({name, detail::Kind::int_});
  }
  const Expr expr = Expr::parse(text, symbols);
  const IntEnv env{values};
  const detail::Evaluator evaluator(expr, env);
  py::object value;
  try {
    switch (expr.kind()) {
    case detail::Kind::int_:
      value = py::int_(evaluator.integer());
      break;
    case detail::Kind::float_:
      value = py::float_(evaluator.number());
      break;
    case detail::Kind::bool_:
      value = py::bool_(evaluator.boolean());
      break;
    default:
      value = py::int_(static_cast<int>(evaluator.dtype()));
      break;
    }
  } catch (const detail::EvalError& e) {
    value = py::str(e.what());
  }
  return py::make_tuple(export_expr(expr), value);
}

py::dict export_op(const detail::OpSpec& spec) {
  py::list symbols;
  for (const auto& s : spec.symbols) {
    symbols.append(py::make_tuple(s.name, std::string(detail::kind_name(s.kind)), s.optional));
  }
  py::list inputs;
  for (const auto& a : spec.inputs) {
    py::dict i;
    i["mutable"] = a.is_mutable;
    i["optional"] = a.optional;
    i["str"] = a.type == detail::ArgType::str;
    py::dict strings;
    for (const auto& [text, number] : a.strings) {
      strings[py::str(text)] = number;
    }
    i["strings"] = strings;
    inputs.append(i);
  }
  py::list returns;
  for (const auto& r : spec.returns) {
    returns.append(py::make_tuple(r.output, r.alias));
  }
  py::list checks;
  for (const auto& c : spec.checks) {
    checks.append(export_expr(c));
  }
  py::list outputs;
  for (const auto& out : spec.outputs) {
    py::dict o;
    py::list shape;
    for (const auto& e : out.shape) {
      shape.append(export_expr(e));
    }
    py::list dims;
    for (const auto& [dim, e] : out.dims) {
      dims.append(py::make_tuple(dim, export_expr(e)));
    }
    o["shape"] = shape;
    o["like"] = out.like;
    o["dims"] = dims;
    o["dtype"] = out.dtype ? py::object(export_expr(*out.dtype)) : py::none();
    o["hidden"] = out.hidden;
    o["preserve_layout"] = out.preserve_layout;
    outputs.append(o);
  }
  py::dict d;
  d["name"] = spec.name;
  d["symbols"] = symbols;
  d["num_inputs"] = spec.num_inputs;
  d["inputs"] = inputs;
  d["returns"] = returns;
  d["checks"] = checks;
  d["outputs"] = outputs;
  py::list tune; // Note [Tuning]: (name, candidate values) per parameter, for kjit.tuning
  for (const auto& param : spec.tune.params) {
    tune.append(py::make_tuple(param.name, param.values));
  }
  d["tune"] = tune;
  d["tune_valid"] = spec.tune.valid ? spec.tune.valid->text() : std::string();
  py::list tune_key;
  for (const auto& key : spec.tune.key) {
    tune_key.append(key.text());
  }
  d["tune_key"] = tune_key;
  if (spec.backward) {
    py::list args;
    for (const auto& arg : spec.backward->args) {
      const char* source = arg.source == detail::BackwardArg::Source::input    ? "input"
                           : arg.source == detail::BackwardArg::Source::output ? "output"
                                                                               : "grad";
      args.append(py::make_tuple(source, arg.index));
    }
    py::dict backward;
    backward["op"] = spec.backward->op;
    backward["args"] = args;
    backward["gradients"] = py::cast(spec.backward->gradients);
    d["backward"] = backward;
  } else {
    d["backward"] = py::none();
  }
  return d;
}

} // namespace kjit::python
