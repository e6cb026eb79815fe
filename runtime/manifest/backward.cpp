// The `backward` of an op: another op of the same package, linked once every op is read (the
// manifest's tables come in any order). What is checked here is what the torch layer relies on
// when it registers the autograd formula (Note [Backward ops], python_bindings/torch/ops.hpp):
// the backward op exists and is functional, each of its arguments is given a value of its type,
// and each of its returns is the gradient of one tensor argument of the forward.
#include "runtime/manifest/reader.hpp"

#include <charconv>
#include <set>

namespace kjit::detail {
namespace {

std::string_view type_name(ArgType type) {
  switch (type) {
  case ArgType::tensor:
    return "Tensor";
  case ArgType::int_:
    return "int";
  case ArgType::float_:
    return "float";
  case ArgType::bool_:
    return "bool";
  case ArgType::dtype:
    return "ScalarType";
  case ArgType::str:
    return "str";
  case ArgType::int_list:
    return "int[]";
  }
  return "?";
}

// The N of "outN" after `prefix`, or -1.
std::int32_t output_number(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix) || name.size() == prefix.size()) {
    return -1;
  }
  std::int32_t n = -1;
  const auto* first = name.data() + prefix.size();
  const auto* last = name.data() + name.size();
  const auto [end, ec] = std::from_chars(first, last, n);
  return ec == std::errc() && end == last ? n : -1;
}

} // namespace

void link_backwards(const ManifestReader& reader, const toml::table& ops,
                    const std::vector<OpDecl>& decls,
                    const std::vector<std::shared_ptr<OpSpec>>& specs) {
  for (std::size_t k = 0; k < decls.size(); ++k) {
    if (!decls[k].backward) {
      continue;
    }
    const OpDecl& decl = decls[k];
    const BackwardDecl& b = *decl.backward;
    OpSpec& spec = *specs[k];
    const std::string where = "op." + decl.name + ".backward";
    const toml::node* node = ops.get(decl.name)->as_table()->get("backward");
    auto node_of = [node](std::string_view key) {
      const toml::node* n = node->as_table()->get(key);
      return n != nullptr ? n : node;
    };

    const auto it =
      std::find_if(decls.begin(), decls.end(), [&b](const OpDecl& d) { return d.name == b.op; });
    if (it == decls.end()) {
      reader.fail(where + ".op", node_of("op"), fmt::format("no [op.{}] in this package", b.op));
    }
    if (b.op == decl.name) {
      reader.fail(where + ".op", node_of("op"), "an op cannot be its own backward");
    }
    const auto index = static_cast<std::size_t>(it - decls.begin());
    const OpSpec& target = *specs[index];
    for (std::size_t i = 0; i < target.num_inputs; ++i) {
      if (target.inputs[i].is_mutable) {
        reader.fail(where + ".op", node_of("op"),
                    fmt::format("the backward op '{}' writes its argument '{}': a backward "
                                "returns the gradients as new tensors",
                                b.op, target.symbols[i].name));
      }
    }

    BackwardSpec result;
    result.op = b.op;
    result.op_index = index;
    if (b.args.size() != target.num_inputs) {
      reader.fail(where + ".args", node_of("args"),
                  fmt::format("op '{}' takes {} argument(s) and {} are given", b.op,
                              target.num_inputs, b.args.size()));
    }
    for (std::size_t i = 0; i < b.args.size(); ++i) {
      const std::string at = fmt::format("{}.args[{}]", where, i);
      const std::string& name = b.args[i];
      const ArgSpec& wanted = target.inputs[i];
      const std::string& param = target.symbols[i].name;
      BackwardArg arg;
      bool optional = false;
      ArgType type = ArgType::tensor;
      const auto input = std::find_if(spec.symbols.begin(), spec.symbols.begin() + spec.num_inputs,
                                      [&name](const Symbol& s) { return s.name == name; });
      if (input != spec.symbols.begin() + spec.num_inputs) {
        arg.index = static_cast<std::int32_t>(input - spec.symbols.begin());
        optional = spec.inputs[arg.index].optional;
        type = spec.inputs[arg.index].type;
      } else if (const std::int32_t out = output_number(name, "out");
                 out >= 0 && static_cast<std::size_t>(out) < spec.outputs.size()) {
        arg.source = BackwardArg::Source::output;
        arg.index = out;
      } else if (const std::int32_t grad = output_number(name, "grad_out");
                 grad >= 0 && static_cast<std::size_t>(grad) < spec.outputs.size()) {
        if (spec.outputs[grad].hidden) {
          reader.fail(at, node_of("args"),
                      fmt::format("out{} is hidden (not returned), so it has no gradient", grad));
        }
        arg.source = BackwardArg::Source::grad;
        arg.index = grad;
      } else {
        reader.fail(at, node_of("args"),
                    fmt::format("'{}' is none of the op's arguments, its outputs (out0..{}) or "
                                "the gradients of its returned outputs (grad_out0..)",
                                name, spec.outputs.empty() ? 0 : spec.outputs.size() - 1));
      }
      if (type != wanted.type) {
        reader.fail(at, node_of("args"),
                    fmt::format("'{}' is a {}, and argument '{}' of '{}' is a {}", name,
                                type_name(type), param, b.op, type_name(wanted.type)));
      }
      if (optional && !wanted.optional) {
        reader.fail(at, node_of("args"),
                    fmt::format("'{}' may be None, and argument '{}' of '{}' is not optional: "
                                "declare it {}?",
                                name, param, b.op, type_name(wanted.type)));
      }
      if (type == ArgType::str && wanted.strings != spec.inputs[arg.index].strings) {
        reader.fail(at, node_of("args"),
                    fmt::format("str argument '{}' maps its values to other integers than "
                                "argument '{}' of '{}': give both the same 'strings'",
                                name, param, b.op));
      }
      result.args.push_back(arg);
    }

    if (b.gradients.size() != target.returns.size()) {
      reader.fail(where + ".gradients", node_of("gradients"),
                  fmt::format("op '{}' returns {} tensor(s) and {} gradient(s) are named: its "
                              "returns are the gradients, in order",
                              b.op, target.returns.size(), b.gradients.size()));
    }
    std::set<std::string> seen;
    for (std::size_t g = 0; g < b.gradients.size(); ++g) {
      const std::string at = fmt::format("{}.gradients[{}]", where, g);
      const std::string& name = b.gradients[g];
      const auto input = std::find_if(spec.symbols.begin(), spec.symbols.begin() + spec.num_inputs,
                                      [&name](const Symbol& s) { return s.name == name; });
      if (input == spec.symbols.begin() + spec.num_inputs ||
          spec.inputs[static_cast<std::size_t>(input - spec.symbols.begin())].type !=
            ArgType::tensor) {
        reader.fail(at, node_of("gradients"),
                    fmt::format("'{}' is not a Tensor argument of '{}'", name, decl.name));
      }
      if (!seen.insert(name).second) {
        reader.fail(at, node_of("gradients"), fmt::format("'{}' is named twice", name));
      }
      result.gradients.push_back(static_cast<std::int32_t>(input - spec.symbols.begin()));
    }
    spec.backward = std::move(result);
  }
}

} // namespace kjit::detail
