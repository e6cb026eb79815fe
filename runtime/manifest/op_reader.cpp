// The reader of one [op.NAME] table: schema, checks, outputs, workspaces, tune parameters,
// launches, warm values. Every expression is parsed here, with the symbols its place may use,
// so that a mistake is a ManifestError at load.
#include "runtime/manifest/reader.hpp"

#include <set>

namespace kjit::detail {
namespace {

// What the reader of one op shares between its parts.
struct OpReader {
  const ManifestReader& reader;
  const toml::table& o;
  const std::string& where;
  OpSpec& spec;
  std::vector<Symbol> input_symbols;

  const toml::node* node_of(std::string_view field) const { return o.get(field); }

  // `device.*` and `aligned()` need a launch: checks and output shapes also serve fake tensors
  // and CPU calls, which have neither.
  Expr parse(const std::string& text, const std::vector<Symbol>& symbols, const std::string& at,
             const toml::node* node, std::initializer_list<Kind> kinds, bool launch_time) const {
    Expr expr = reader.expression(text, symbols, at, node, kinds);
    if (expr.uses_device()) {
      if (!launch_time) {
        reader.fail(at, node,
                    fmt::format("'{}' reads device.* or aligned(), which only a launch knows "
                                "(not a fake tensor or a CPU call): use them in launches, "
                                "specializations and workspaces",
                                text));
      }
      spec.uses_device = true;
    }
    return expr;
  }

  std::vector<Expr> list(const std::vector<std::string>& texts, const std::string& at,
                         const toml::node* node, std::initializer_list<Kind> kinds,
                         std::size_t max) const {
    if (texts.empty() || texts.size() > max) {
      reader.fail(at, node, fmt::format("expected 1 to {} values", max));
    }
    std::vector<Expr> result;
    for (std::size_t i = 0; i < texts.size(); ++i) {
      result.push_back(
        parse(texts[i], spec.symbols, fmt::format("{}[{}]", at, i), node, kinds, true));
    }
    return result;
  }
};

} // namespace

std::vector<std::string> placeholders(std::string_view entry) {
  std::vector<std::string> names;
  for (std::size_t open = entry.find('{'); open != std::string_view::npos;
       open = entry.find('{', open + 1)) {
    const auto close = entry.find('}', open);
    if (close == std::string_view::npos) {
      break;
    }
    std::string name(entry.substr(open + 1, close - open - 1));
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(std::move(name));
    }
  }
  return names;
}

std::pair<OpDecl, std::shared_ptr<OpSpec>> read_op(const ManifestReader& reader,
                                                   const std::string& ns, std::string_view key,
                                                   const toml::node& value,
                                                   const std::vector<KernelDecl>& kernels) {
  const std::string where = "op." + std::string(key);
  const auto* o = value.as_table();
  if (o == nullptr) {
    reader.fail(where, &value, "expected a table");
  }
  reader.check_keys(*o, where,
                    {"schema",     "doc",        "checks",     "outputs",  "workspaces",
                     "launch",     "kernel",     "args",       "grid",     "block",
                     "shared_mem", "specialize", "warm",       "strings",  "cpu",
                     "backward",   "tune",       "tune_valid", "tune_key", "tune_default"});
  OpDecl decl;
  decl.name = std::string(key);
  if (decl.name.starts_with("_kjit_")) {
    reader.fail(where, &value, "op names starting with '_kjit_' are kjit's own");
  }
  decl.schema = reader.string(*o, "schema", where, true);
  decl.doc = reader.string(*o, "doc", where, false);
  decl.cpu = reader.string(*o, "cpu", where, false);
  decl.checks = reader.list(*o, "checks", where, true);
  if (const toml::node* backward = o->get("backward")) {
    const std::string at = where + ".backward";
    const auto* t = backward->as_table();
    if (t == nullptr) {
      reader.fail(at, backward,
                  "expected a table {op = \"NAME\", args = [...], gradients = [...]}");
    }
    reader.check_keys(*t, at, {"op", "args", "gradients"});
    decl.backward =
      BackwardDecl{reader.string(*t, "op", at, true), reader.list(*t, "args", at, false, true),
                   reader.list(*t, "gradients", at, false, true)};
  }

  if (const toml::node* launches = o->get("launch")) {
    for (std::string_view own : {"kernel", "args", "grid", "block", "shared_mem", "specialize"}) {
      if (o->get(own) != nullptr) {
        reader.fail(
          where + "." + std::string(own), o->get(own),
          fmt::format("an op with [[{}.launch]] tables gives '{}' in each of them", where, own));
      }
    }
    const auto* array = launches->as_array();
    if (array == nullptr || array->empty() || array->size() > 16) {
      reader.fail(where + ".launch", launches,
                  "expected 1 to 16 tables [[op.NAME.launch]] (kernel, args, grid, block, ...)");
    }
    for (std::size_t i = 0; i < array->size(); ++i) {
      const std::string at = fmt::format("{}.launch[{}]", where, i);
      const auto* t = array->get(i)->as_table();
      if (t == nullptr) {
        reader.fail(at, array->get(i), "expected a table");
      }
      reader.check_keys(*t, at,
                        {"kernel", "when", "args", "grid", "block", "shared_mem", "specialize"});
      decl.launches.push_back(read_launch_decl(reader, *t, at));
    }
  } else {
    if (o->get("when") != nullptr) {
      reader.fail(where + ".when", o->get("when"), "'when' belongs to a [[op.NAME.launch]]");
    }
    decl.launches.push_back(read_launch_decl(reader, *o, where));
  }
  if (const toml::node* outputs = o->get("outputs")) {
    const auto* array = outputs->as_array();
    if (array == nullptr) {
      reader.fail(where + ".outputs", outputs, "expected an array of tables");
    }
    for (std::size_t i = 0; i < array->size(); ++i) {
      decl.outputs.push_back(
        read_output_decl(reader, *array->get(i), fmt::format("{}.outputs[{}]", where, i)));
    }
  }
  if (const toml::node* workspaces = o->get("workspaces")) {
    const auto* array = workspaces->as_array();
    if (array == nullptr) {
      reader.fail(where + ".workspaces", workspaces, "expected an array of tables");
    }
    for (std::size_t i = 0; i < array->size(); ++i) {
      const std::string at = fmt::format("{}.workspaces[{}]", where, i);
      const auto* t = array->get(i)->as_table();
      if (t == nullptr) {
        reader.fail(at, array->get(i),
                    "expected a table {name = ..., shape = [...], dtype = ..., zero = false}");
      }
      reader.check_keys(*t, at, {"name", "shape", "dtype", "zero"});
      WorkspaceDecl w;
      w.name = reader.string(*t, "name", at, true);
      w.shape = reader.list(*t, "shape", at, true, true);
      w.dtype = reader.string(*t, "dtype", at, true);
      if (const toml::node* zero = t->get("zero")) {
        if (!zero->is_boolean()) {
          reader.fail(at + ".zero", zero, "expected true or false");
        }
        w.zero = zero->as_boolean()->get();
      }
      decl.workspaces.push_back(std::move(w));
    }
  }
  if (const toml::node* strings = o->get("strings")) {
    const auto* t = strings->as_table();
    if (t == nullptr) {
      reader.fail(where + ".strings", strings,
                  "expected a table {ARG = {\"value\" = 0, ...}} for each str argument");
    }
    for (const auto& [arg, values] : *t) {
      const std::string at = where + ".strings." + std::string(arg.str());
      const auto* map = values.as_table();
      if (map == nullptr || map->empty()) {
        reader.fail(at, &values, "expected a table {\"value\" = 0, ...}");
      }
      std::vector<std::pair<std::string, std::int64_t>> entries;
      for (const auto& [text, number] : *map) {
        if (!number.is_integer()) {
          reader.fail(at + "." + std::string(text.str()), &number, "expected an integer");
        }
        entries.emplace_back(std::string(text.str()), number.as_integer()->get());
      }
      decl.strings.emplace_back(std::string(arg.str()), std::move(entries));
    }
  }
  read_tune_decl(reader, *o, where, decl);
  if (const toml::node* warm = o->get("warm")) {
    // A table, or an array of tables (each one a cartesian product; the warm list their union).
    std::vector<std::pair<const toml::table*, std::string>> tables; // with its location
    if (const auto* t = warm->as_table()) {
      tables.emplace_back(t, where + ".warm");
    } else if (const auto* list = warm->as_array(); list != nullptr && !list->empty()) {
      for (std::size_t i = 0; i < list->size(); ++i) {
        const auto* item = list->get(i)->as_table();
        if (item == nullptr) {
          reader.fail(fmt::format("{}.warm[{}]", where, i), list->get(i),
                      "expected a table {T = [\"float16\", ...]}");
        }
        tables.emplace_back(item, fmt::format("{}.warm[{}]", where, i));
      }
    } else {
      reader.fail(where + ".warm", warm,
                  "expected a table {T = [\"float16\", ...]} or a non-empty array of such tables");
    }
    for (const auto& [t, at] : tables) {
      OpDecl::WarmTable table;
      for (const auto& [name, values] : *t) {
        const auto* array = values.as_array();
        if (array == nullptr) {
          reader.fail(at + "." + std::string(name.str()), &values, "expected an array");
        }
        std::vector<std::string> texts;
        for (std::size_t i = 0; i < array->size(); ++i) {
          texts.push_back(
            reader.expression_text(*array->get(i), fmt::format("{}.{}[{}]", at, name.str(), i)));
        }
        table.emplace_back(std::string(name.str()), std::move(texts));
      }
      decl.warm.push_back(std::move(table));
    }
  }

  // The schema: arguments, what the op writes, what it returns.
  auto spec = std::make_shared<OpSpec>();
  spec->ns = ns;
  spec->name = decl.name;
  spec->schema = decl.schema;
  const toml::node* schema_node = o->get("schema");
  SchemaInfo schema;
  try {
    schema = parse_schema(decl.schema);
  } catch (const std::invalid_argument& e) {
    reader.fail(where + ".schema", schema_node, e.what());
  }
  if (schema.name != decl.name) {
    reader.fail(where + ".schema", schema_node,
                fmt::format("the schema names op '{}', the table '{}'", schema.name, decl.name));
  }
  std::set<std::string> names;
  std::set<std::string> alias_sets;
  bool writes = false;
  for (const auto& arg : schema.arguments) {
    if (!names.insert(arg.symbol.name).second) {
      reader.fail(where + ".schema", schema_node,
                  fmt::format("two arguments are named '{}'", arg.symbol.name));
    }
    if (!arg.spec.alias.empty() && !alias_sets.insert(arg.spec.alias).second) {
      reader.fail(where + ".schema", schema_node,
                  fmt::format("two arguments share the alias set '{}': give each written "
                              "tensor its own (a!, b!, ...)",
                              arg.spec.alias));
    }
    writes = writes || arg.spec.is_mutable;
    spec->symbols.push_back(arg.symbol);
    spec->inputs.push_back(arg.spec);
  }
  spec->num_inputs = schema.arguments.size();
  std::size_t new_outputs = 0;
  for (const auto& ret : schema.returns) {
    ReturnSpec r;
    if (ret.alias.empty()) {
      r.output = static_cast<std::int32_t>(new_outputs++);
    } else {
      for (std::size_t i = 0; i < spec->inputs.size(); ++i) {
        if (spec->inputs[i].alias == ret.alias) {
          r.alias = static_cast<std::int32_t>(i);
        }
      }
      if (r.alias < 0) {
        reader.fail(where + ".schema", schema_node,
                    fmt::format("the return Tensor({}!) names no argument of alias set '{}'",
                                ret.alias, ret.alias));
      }
      if (spec->inputs[r.alias].optional) {
        reader.fail(where + ".schema", schema_node,
                    fmt::format("the return Tensor({}!) aliases an optional argument, which may "
                                "be None",
                                ret.alias));
      }
    }
    spec->returns.push_back(r);
  }
  if (schema.returns.empty() && !writes) {
    reader.fail(where + ".schema", schema_node,
                "the op returns nothing and writes no argument, so torch.compile would drop it: "
                "declare each tensor the kernel writes as Tensor(a!) (or Tensor!), or return "
                "the new tensors");
  }
  std::size_t returned = 0; // outputs before the first hidden one
  while (returned < decl.outputs.size() && !decl.outputs[returned].hidden) {
    ++returned;
  }
  for (std::size_t i = returned; i < decl.outputs.size(); ++i) {
    const std::string at = fmt::format("{}.outputs[{}]", where, i);
    if (!decl.outputs[i].hidden) {
      reader.fail(at, o->get("outputs"),
                  "hidden outputs come after the returned ones: move this one before them");
    }
    if (!decl.backward) {
      reader.fail(at + ".hidden", o->get("outputs"),
                  "a hidden output is saved for the backward, and the op declares none: give "
                  "it a 'backward' or drop the output");
    }
  }
  if (returned != new_outputs) {
    reader.fail(where + ".outputs", o->get("outputs"),
                fmt::format("the schema returns {} new tensor(s) but {} output(s) are declared{}",
                            new_outputs, returned,
                            returned == decl.outputs.size() ? "" : " (hidden ones not counted)"));
  }
  if (decl.backward && writes) {
    reader.fail(where + ".backward", o->get("backward"),
                "an op that writes its arguments cannot be differentiable (torch refuses "
                "autograd for mutating custom ops): make it functional, or drop 'backward'");
  }
  // str arguments and their integers.
  for (const auto& [arg, entries] : decl.strings) {
    const auto it = std::find_if(schema.arguments.begin(), schema.arguments.end(),
                                 [&arg = arg](const auto& a) { return a.symbol.name == arg; });
    if (it == schema.arguments.end() || it->spec.type != ArgType::str) {
      reader.fail(where + ".strings." + arg, o->get("strings"),
                  fmt::format("'{}' is not a str argument of the schema", arg));
    }
    spec->inputs[static_cast<std::size_t>(it - schema.arguments.begin())].strings = entries;
  }
  for (std::size_t i = 0; i < spec->inputs.size(); ++i) {
    if (spec->inputs[i].type == ArgType::str && spec->inputs[i].strings.empty()) {
      reader.fail(where + ".strings", o,
                  fmt::format("str argument '{}' needs its values: strings = {{ {} = {{ "
                              "\"name\" = 0, ... }} }}",
                              spec->symbols[i].name, spec->symbols[i].name));
    }
  }

  OpReader r{reader, *o, where, *spec, spec->symbols};
  for (std::size_t i = 0; i < decl.checks.size(); ++i) {
    spec->checks.push_back(r.parse(decl.checks[i], r.input_symbols,
                                   fmt::format("{}.checks[{}]", where, i), r.node_of("checks"),
                                   {Kind::bool_}, false));
  }
  for (std::size_t i = 0; i < decl.outputs.size(); ++i) {
    const OutputDecl& out = decl.outputs[i];
    const std::string out_where = fmt::format("{}.outputs[{}]", where, i);
    const toml::node* node = r.node_of("outputs");
    OutputSpec output;
    output.hidden = out.hidden;
    if (out.like.empty() != out.has_shape) {
      reader.fail(out_where, node, "give either 'shape' or 'like'");
    }
    if (!out.like.empty()) {
      const auto symbol = std::find_if(r.input_symbols.begin(), r.input_symbols.end(),
                                       [&](const auto& s) { return s.name == out.like; });
      if (symbol == r.input_symbols.end() || symbol->kind != Kind::tensor) {
        reader.fail(out_where + ".like", node,
                    fmt::format("'{}' is not a Tensor argument", out.like));
      }
      if (symbol->optional) {
        reader.fail(
          out_where + ".like", node,
          fmt::format("'{}' is optional (it may be None): an output cannot be like it", out.like));
      }
      output.like = static_cast<std::int32_t>(symbol - r.input_symbols.begin());
    } else if (!out.dims.empty()) {
      reader.fail(out_where + ".dims", node, "'dims' needs 'like'");
    }
    if (out.preserve_layout && (out.like.empty() || !out.dims.empty())) {
      reader.fail(out_where + ".layout", node,
                  "layout = \"preserve\" needs 'like' and no 'dims' (the output takes like's "
                  "shape and strides)");
    }
    output.preserve_layout = out.preserve_layout;
    for (std::size_t d = 0; d < out.shape.size(); ++d) {
      output.shape.push_back(r.parse(out.shape[d], r.input_symbols,
                                     fmt::format("{}.shape[{}]", out_where, d), node, {Kind::int_},
                                     false));
    }
    for (const auto& [dim, text] : out.dims) {
      output.dims.emplace_back(dim, r.parse(text, r.input_symbols,
                                            fmt::format("{}.dims.{}", out_where, dim), node,
                                            {Kind::int_}, false));
    }
    if (!out.dtype.empty()) {
      output.dtype =
        r.parse(out.dtype, r.input_symbols, out_where + ".dtype", node, {Kind::dtype}, false);
    } else if (out.like.empty()) {
      reader.fail(out_where, node, "an output with 'shape' needs a 'dtype'");
    }
    spec->outputs.push_back(std::move(output));
    spec->symbols.push_back(Symbol{fmt::format("out{}", i), Kind::tensor});
  }
  for (std::size_t i = 0; i < decl.workspaces.size(); ++i) {
    const WorkspaceDecl& w = decl.workspaces[i];
    const std::string at = fmt::format("{}.workspaces[{}]", where, i);
    const toml::node* node = r.node_of("workspaces");
    const bool taken = std::any_of(spec->symbols.begin(), spec->symbols.end(),
                                   [&](const Symbol& s) { return s.name == w.name; });
    if (!is_identifier(w.name) || taken || w.name == "device") {
      reader.fail(at + ".name", node,
                  fmt::format("'{}' is not a new identifier (arguments, out0.., earlier "
                              "workspaces and 'device' are taken)",
                              w.name));
    }
    WorkspaceSpec ws;
    ws.name = w.name;
    ws.zero = w.zero;
    if (w.shape.size() > 8) {
      reader.fail(at + ".shape", node, "a workspace has at most 8 dimensions");
    }
    for (std::size_t d = 0; d < w.shape.size(); ++d) {
      ws.shape.push_back(r.parse(w.shape[d], r.input_symbols, fmt::format("{}.shape[{}]", at, d),
                                 node, {Kind::int_}, true));
    }
    ws.dtype = r.parse(w.dtype, r.input_symbols, at + ".dtype", node, {Kind::dtype}, true);
    spec->workspaces.push_back(std::move(ws));
    spec->symbols.push_back(Symbol{w.name, Kind::tensor});
  }

  // The tunable parameters (Note [Tuning]): int symbols after the workspaces. Specializations,
  // `when` and tune_valid see the arguments and them; args, grid, block and shared memory every
  // symbol.
  std::vector<Symbol> launch_symbols = r.input_symbols;
  if (!decl.tune.empty()) {
    launch_symbols = spec->symbols;
    for (std::size_t i = spec->num_inputs; i < launch_symbols.size(); ++i) {
      launch_symbols[i].name.clear(); // outputs and workspaces: not visible there
    }
  }
  for (const auto& [name, values] : decl.tune) {
    const std::string at = where + ".tune." + name;
    if (name == "device" ||
        std::any_of(spec->symbols.begin(), spec->symbols.end(),
                    [&name = name](const Symbol& s) { return s.name == name; })) {
      reader.fail(
        at, r.node_of("tune"),
        fmt::format("'{}' is taken (an argument, output or workspace, or 'device')", name));
    }
    TuneParam param;
    param.name = name;
    param.values = values;
    param.symbol = static_cast<std::int32_t>(spec->symbols.size());
    const auto text = std::find_if(decl.tune_default.begin(), decl.tune_default.end(),
                                   [&name = name](const auto& p) { return p.first == name; });
    param.default_value = r.parse(text->second, r.input_symbols, where + ".tune_default." + name,
                                  r.node_of("tune_default"), {Kind::int_}, true);
    spec->symbols.push_back(Symbol{name, Kind::int_});
    launch_symbols.push_back(Symbol{name, Kind::int_});
    spec->tune.params.push_back(std::move(param));
  }
  if (!decl.tune_valid.empty()) {
    spec->tune.valid = r.parse(decl.tune_valid, launch_symbols, where + ".tune_valid",
                               r.node_of("tune_valid"), {Kind::bool_}, true);
  }
  for (std::size_t i = 0; i < decl.tune_key.size(); ++i) {
    spec->tune.key.push_back(r.parse(decl.tune_key[i], r.input_symbols,
                                     fmt::format("{}.tune_key[{}]", where, i),
                                     r.node_of("tune_key"), {Kind::int_}, true));
  }

  // The launches, with the symbols of everything above.
  std::vector<std::pair<std::string, Kind>> params; // every placeholder, with its kind
  for (std::size_t l = 0; l < decl.launches.size(); ++l) {
    const LaunchDecl& launch = decl.launches[l];
    const bool own = o->get("launch") == nullptr;
    const std::string at = own ? where : fmt::format("{}.launch[{}]", where, l);
    const toml::node* node =
      own ? static_cast<const toml::node*>(o) : o->get("launch")->as_array()->get(l);
    const auto& t = *node->as_table();
    auto node_of = [&](std::string_view field) {
      const toml::node* n = t.get(field);
      return n != nullptr ? n : node;
    };
    LaunchSpec ls;
    const auto kernel_it = std::find_if(
      kernels.begin(), kernels.end(), [&](const KernelDecl& k) { return k.name == launch.kernel; });
    if (kernel_it == kernels.end()) {
      reader.fail(at + ".kernel", node_of("kernel"),
                  fmt::format("no [kernel.{}] in this package", launch.kernel));
    }
    ls.kernel = static_cast<std::size_t>(kernel_it - kernels.begin());
    if (!launch.when.empty()) {
      ls.when =
        r.parse(launch.when, launch_symbols, at + ".when", node_of("when"), {Kind::bool_}, true);
    }
    ls.args = r.list(launch.args, at + ".args", node_of("args"),
                     {Kind::tensor, Kind::int_, Kind::float_, Kind::bool_}, 256);
    ls.grid = r.list(launch.grid, at + ".grid", node_of("grid"), {Kind::int_}, 3);
    ls.block = r.list(launch.block, at + ".block", node_of("block"), {Kind::int_}, 3);
    ls.shared_mem = r.parse(launch.shared_mem, spec->symbols, at + ".shared_mem",
                            node_of("shared_mem"), {Kind::int_}, true);
    for (const auto& [name, text] : launch.specialize) {
      ls.specialize.push_back(SpecParam{
        name, r.parse(text, launch_symbols, at + ".specialize." + name, node_of("specialize"),
                      {Kind::dtype, Kind::int_, Kind::bool_}, true)});
      params.emplace_back(name, ls.specialize.back().expr.kind());
    }
    const auto wanted = placeholders(kernel_it->entry);
    for (const auto& name : wanted) {
      if (std::none_of(launch.specialize.begin(), launch.specialize.end(),
                       [&](const auto& s) { return s.first == name; })) {
        reader.fail(at + ".specialize", node_of("specialize"),
                    fmt::format("the entry '{}' of kernel '{}' uses {{{}}}: give it a value "
                                "here, e.g. {} = \"x.dtype\"",
                                kernel_it->entry, kernel_it->name, name, name));
      }
    }
    for (const auto& [name, text] : launch.specialize) {
      if (std::find(wanted.begin(), wanted.end(), name) == wanted.end()) {
        reader.fail(
          at + ".specialize." + name, node_of("specialize"),
          fmt::format("the entry '{}' has no placeholder {{{}}}", kernel_it->entry, name));
      }
    }
    spec->launches.push_back(std::move(ls));
  }
  for (std::size_t w = 0; w < decl.warm.size(); ++w) {
    const toml::node* node = r.node_of("warm");
    const std::string at =
      node != nullptr && node->is_array() ? fmt::format("{}.warm[{}]", where, w) : where + ".warm";
    for (const auto& [name, values] : decl.warm[w]) {
      const auto param = std::find_if(params.begin(), params.end(),
                                      [&name = name](const auto& p) { return p.first == name; });
      if (param == params.end()) {
        reader.fail(at + "." + name, node,
                    fmt::format("'{}' is not a placeholder of 'specialize'", name));
      }
      for (const auto& other : params) {
        if (other.first == name && other.second != param->second) {
          reader.fail(at + "." + name, node,
                      fmt::format("placeholder '{}' is {} in one launch and {} in another: warm "
                                  "values serve both",
                                  name, kind_name(param->second), kind_name(other.second)));
        }
      }
      for (std::size_t i = 0; i < values.size(); ++i) {
        const std::string value_where = fmt::format("{}.{}[{}]", at, name, i);
        const Expr literal = reader.expression(values[i], {}, value_where, node, {param->second});
        if (!literal_value(literal)) {
          reader.fail(value_where, node, fmt::format("'{}' is not a literal value", values[i]));
        }
      }
    }
  }
  spec->cpu = decl.cpu;
  return {std::move(decl), std::move(spec)};
}

} // namespace kjit::detail
