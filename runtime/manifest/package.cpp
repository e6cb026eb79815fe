// Kernel packages: the manifest reader (one pass over the TOML, every key checked and every
// expression parsed with its place) and the checks on what a package may read. Over 600 lines:
// the reader is one state machine over one file format; it is split by manifest table (schema,
// ops, kernels) when the manifest language grows its own folder.
#include <kjit/error.hpp>
#include <kjit/package.hpp>

#include "runtime/op_spec.hpp"
#include "runtime/util/file.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <set>

namespace kjit {

struct Package::Impl {
  std::string name;
  std::string scope;
  std::string version;
  std::string description;
  std::filesystem::path dir;
  std::filesystem::path manifest;
  std::vector<KernelDecl> kernels;
  std::vector<OpDecl> ops;
  std::vector<std::shared_ptr<const detail::OpSpec>> specs;
};

namespace detail {

SchemaInfo parse_schema(std::string_view schema) {
  SchemaInfo info;
  const auto open = schema.find('(');
  const auto arrow = schema.rfind("->");
  if (open == std::string_view::npos || arrow == std::string_view::npos) {
    throw std::invalid_argument("expected 'name(Type arg, ...) -> Tensor'");
  }
  auto trim = [](std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) {
      s.remove_prefix(1);
    }
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) {
      s.remove_suffix(1);
    }
    return s;
  };
  info.name = std::string(trim(schema.substr(0, open)));
  const auto close = schema.rfind(')', arrow);
  if (close == std::string_view::npos || close < open) {
    throw std::invalid_argument("unbalanced parentheses");
  }
  std::string_view arguments = schema.substr(open + 1, close - open - 1);
  while (!trim(arguments).empty()) {
    const auto comma = arguments.find(',');
    std::string_view item = trim(arguments.substr(0, comma));
    arguments = comma == std::string_view::npos ? std::string_view() : arguments.substr(comma + 1);
    if (item == "*") {
      continue;
    }
    item = trim(item.substr(0, item.find('=')));
    const auto space = item.rfind(' ');
    if (space == std::string_view::npos) {
      throw std::invalid_argument(fmt::format("argument '{}' has no type or no name", item));
    }
    const std::string_view type = trim(item.substr(0, space));
    const std::string name(trim(item.substr(space + 1)));
    Kind kind{};
    if (type == "Tensor") {
      kind = Kind::tensor;
    } else if (type == "int" || type == "SymInt") {
      kind = Kind::int_;
    } else if (type == "float") {
      kind = Kind::float_;
    } else if (type == "bool") {
      kind = Kind::bool_;
    } else if (type == "ScalarType") {
      kind = Kind::dtype;
    } else {
      throw std::invalid_argument(fmt::format(
        "argument '{}' has type '{}': kjit ops take Tensor, int, SymInt, float, bool and "
        "ScalarType arguments",
        name, type));
    }
    info.arguments.push_back(Symbol{name, kind});
  }
  const std::string_view returns = trim(schema.substr(arrow + 2));
  if (returns == "Tensor") {
    info.returns = 1;
  } else if (returns.size() >= 2 && returns.front() == '(' && returns.back() == ')') {
    std::string_view list = returns.substr(1, returns.size() - 2);
    while (!trim(list).empty()) {
      const auto comma = list.find(',');
      if (trim(list.substr(0, comma)) != "Tensor") {
        throw std::invalid_argument("kjit ops return Tensor or a tuple of Tensors");
      }
      ++info.returns;
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    }
  } else {
    throw std::invalid_argument("kjit ops return Tensor or a tuple of Tensors");
  }
  return info;
}

bool manifest_code_point_ok(char32_t c) noexcept {
  // See Note [toml++ and non-ASCII].
  const bool mishandled =
    c != 0xA0 && c != 0x3000 && c != 0xFEFF &&
    ((c >= 0xA1 && c <= 0x499) || (c >= 0x2C5E && c <= 0x3057) || (c >= 0xFB26 && c <= 0xFEFE));
  return !mishandled && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF);
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

} // namespace detail

namespace {

using detail::Expr;
using detail::ExprError;
using detail::Kind;

// Reads one manifest, turning every mistake into a ManifestError with its place.
class ManifestReader {
public:
  explicit ManifestReader(std::filesystem::path file) : m_file(std::move(file)) {}

  [[noreturn]] void fail(const std::string& location, const toml::node* node,
                         const std::string& message, int column = 0) const {
    const int line = node != nullptr ? static_cast<int>(node->source().begin.line) : 0;
    throw ManifestError(m_file.string(), location, line, column, message);
  }

  void check_keys(const toml::table& table, const std::string& location,
                  std::initializer_list<std::string_view> known) const {
    for (const auto& [key, value] : table) {
      if (std::find(known.begin(), known.end(), key.str()) == known.end()) {
        std::string list;
        for (auto k : known) {
          list += (list.empty() ? "" : ", ") + std::string(k);
        }
        fail(location + "." + std::string(key.str()), &value,
             fmt::format("unknown key '{}' (known: {})", key.str(), list));
      }
    }
  }

  std::string string(const toml::table& table, std::string_view key, const std::string& location,
                     bool required, std::string fallback = {}) const {
    const toml::node* node = table.get(key);
    if (node == nullptr) {
      if (required) {
        fail(location + "." + std::string(key), &table, fmt::format("missing key '{}'", key));
      }
      return fallback;
    }
    if (const auto* s = node->as_string()) {
      return s->get();
    }
    fail(location + "." + std::string(key), node, "expected a string");
  }

  // A string, or an integer written as a number; used for expressions.
  std::string expression_text(const toml::node& node, const std::string& location) const {
    if (const auto* s = node.as_string()) {
      return s->get();
    }
    if (const auto* i = node.as_integer()) {
      return std::to_string(i->get());
    }
    fail(location, &node, "expected an expression (a string) or an integer");
  }

  std::vector<std::string> list(const toml::table& table, std::string_view key,
                                const std::string& location, bool expressions,
                                bool required = false) const {
    const toml::node* node = table.get(key);
    const std::string where = location + "." + std::string(key);
    if (node == nullptr) {
      if (required) {
        fail(where, &table, fmt::format("missing key '{}'", key));
      }
      return {};
    }
    const auto* array = node->as_array();
    if (array == nullptr) {
      fail(where, node, "expected an array");
    }
    std::vector<std::string> values;
    for (std::size_t i = 0; i < array->size(); ++i) {
      const toml::node& item = *array->get(i);
      const std::string item_where = fmt::format("{}[{}]", where, i);
      if (expressions) {
        values.push_back(expression_text(item, item_where));
      } else if (const auto* s = item.as_string()) {
        values.push_back(s->get());
      } else {
        fail(item_where, &item, "expected a string");
      }
    }
    return values;
  }

  Expr expression(const std::string& text, const std::vector<detail::Symbol>& symbols,
                  const std::string& location, const toml::node* node,
                  std::initializer_list<Kind> kinds) const {
    Expr expr;
    try {
      expr = Expr::parse(text, symbols);
    } catch (const ExprError& e) {
      fail(location, node, fmt::format("{} in '{}'", e.what(), text), static_cast<int>(e.column()));
    }
    if (std::find(kinds.begin(), kinds.end(), expr.kind()) == kinds.end()) {
      std::string wanted;
      for (Kind k : kinds) {
        wanted += (wanted.empty() ? "" : " or ") + std::string(detail::kind_name(k));
      }
      fail(location, node,
           fmt::format("'{}' is {}, expected {}", text, detail::kind_name(expr.kind()), wanted));
    }
    return expr;
  }

  const std::filesystem::path& file() const { return m_file; }

private:
  std::filesystem::path m_file;
};

bool is_identifier(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name.front()))) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

bool is_semver(std::string_view version) {
  int parts = 0;
  std::size_t i = 0;
  while (parts < 3) {
    const std::size_t start = i;
    while (i < version.size() && std::isdigit(static_cast<unsigned char>(version[i]))) {
      ++i;
    }
    if (i == start) {
      return false;
    }
    ++parts;
    if (parts < 3) {
      if (i >= version.size() || version[i] != '.') {
        return false;
      }
      ++i;
    }
  }
  // A pre-release or build suffix may follow.
  return i == version.size() || version[i] == '-' || version[i] == '+';
}

// The placeholders "{T}" of an entry, in order of first use.
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

// Note [toml++ and non-ASCII]: toml++ 3.3 (Debian 12's) reaches __builtin_unreachable when it
// asks whether some non-ASCII characters are whitespace: its lookup table misses the blocks
// U+00A1..U+0499, U+2C5E..U+3057 and U+FB26..U+FEFE (found by tests/fuzz/manifest_fuzzer.cpp
// under UBSan, from a bare 'υ' and from '\υ' in a string). Manifests holding such characters, or
// invalid UTF-8, are refused before toml++ reads them; in strings they can be written as \uXXXX
// escapes.
struct TextProblem {
  int line = 0;
  std::string what;
};

TextProblem unsafe_text(std::string_view text) {
  int line = 1;
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {
      line += byte == '\n';
      ++i;
      continue;
    }
    const int length = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 0;
    char32_t c = length == 4 ? byte & 0x07 : length == 3 ? byte & 0x0F : byte & 0x1F;
    bool valid = length > 0 && byte <= 0xF4 && i + length <= text.size();
    for (int k = 1; valid && k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xC0) == 0x80;
      c = (c << 6) | (next & 0x3F);
    }
    if (!valid) {
      return {line, "the manifest is not valid UTF-8"};
    }
    const bool unsafe = !detail::manifest_code_point_ok(c);
    if (unsafe) {
      return {line, fmt::format("character U+{:04X} is not accepted by the TOML parser kjit uses; "
                                "write it as \\u{:04X} in a string",
                                static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(c))};
    }
    i += static_cast<std::size_t>(length);
  }
  return {};
}

std::filesystem::path resolve(const std::filesystem::path& dir, const std::string& path) {
  return std::filesystem::weakly_canonical(dir / path);
}

bool is_inside(const std::filesystem::path& root, const std::filesystem::path& path) {
  const auto relative = path.lexically_relative(root);
  return !relative.empty() && *relative.begin() != "..";
}

} // namespace

const std::vector<std::string>& reserved_namespaces() {
  static const std::vector<std::string> names{"aten",
                                              "prim",
                                              "prims",
                                              "torch",
                                              "c10",
                                              "c10d",
                                              "_c10d_functional",
                                              "_c10d_functional_autograd",
                                              "_dtensor",
                                              "cuda",
                                              "quantized",
                                              "_quantized",
                                              "quantized_decomposed",
                                              "sparse",
                                              "nvprims",
                                              "debugprims",
                                              "rngprims",
                                              "higher_order",
                                              "inductor",
                                              "_inductor_test",
                                              "mkldnn",
                                              "mkl",
                                              "onednn",
                                              "profiler",
                                              "_test",
                                              "test",
                                              "fbgemm",
                                              "onnx",
                                              "export",
                                              "_export",
                                              "triton",
                                              "xla",
                                              "autograd",
                                              "caffe2",
                                              "_caffe2",
                                              "torchvision",
                                              "torchaudio",
                                              "torchao",
                                              "ops",
                                              "kjit"};
  return names;
}

Package Package::load(const std::filesystem::path& path) {
  std::error_code ec;
  const auto manifest = std::filesystem::is_directory(path, ec) ? path / "kernel.toml" : path;
  ManifestReader reader(manifest);
  toml::table root;
  std::string read_error;
  const auto manifest_text = detail::read_file(manifest, &read_error);
  if (!manifest_text) {
    throw ManifestError(manifest.string(), "(file)", 0, 0,
                        fmt::format("cannot read the manifest: {}", read_error));
  }
  if (const TextProblem problem = unsafe_text(*manifest_text); problem.line > 0) {
    throw ManifestError(manifest.string(), "(file)", problem.line, 0, problem.what);
  }
  try {
    root = toml::parse(*manifest_text, manifest.string());
  } catch (const toml::parse_error& e) {
    throw ManifestError(manifest.string(), "(file)", static_cast<int>(e.source().begin.line),
                        static_cast<int>(e.source().begin.column), std::string(e.description()));
  } catch (const std::exception& e) {
    throw ManifestError(manifest.string(), "(file)", 0, 0, e.what());
  }

  auto impl = std::make_shared<Impl>();
  impl->manifest = std::filesystem::absolute(manifest);
  impl->dir = impl->manifest.parent_path();
  reader.check_keys(root, "(top level)", {"package", "kernel", "op"});

  const auto* package = root.get_as<toml::table>("package");
  if (package == nullptr) {
    reader.fail("package", root.get("package"), "missing table [package]");
  }
  reader.check_keys(*package, "package", {"name", "version", "description"});
  impl->name = reader.string(*package, "name", "package", true);
  if (!is_identifier(impl->name) || impl->name.size() > 64) {
    reader.fail("package.name", package->get("name"),
                fmt::format("'{}' is not an identifier of at most 64 characters (it names the op "
                            "namespace)",
                            impl->name));
  }
  const auto& reserved = reserved_namespaces();
  if (std::find(reserved.begin(), reserved.end(), impl->name) != reserved.end() ||
      impl->name.starts_with("kjit_")) {
    reader.fail("package.name", package->get("name"),
                fmt::format("'{}' is a reserved namespace (torch's or kjit's): choose another "
                            "package name",
                            impl->name));
  }
  impl->version = reader.string(*package, "version", "package", true);
  if (!is_semver(impl->version)) {
    reader.fail("package.version", package->get("version"),
                fmt::format("'{}' is not a semantic version (MAJOR.MINOR.PATCH)", impl->version));
  }
  impl->description = reader.string(*package, "description", "package", false);
  const int major =
    std::stoi(impl->version.substr(0, std::min<std::size_t>(impl->version.find('.'), 9)));
  impl->scope = major <= 1 ? impl->name : fmt::format("{}_v{}", impl->name, major);
  // Sources, include dirs and included headers must stay inside the package (links resolved):
  // a lock covers the package folder, and a fetched package must not read the user's files.
  const auto package_root = std::filesystem::weakly_canonical(impl->dir, ec);
  auto inside_root = [&](const std::filesystem::path& file, const std::string& where,
                         const toml::node* node, std::string_view what) {
    if (!is_inside(package_root, std::filesystem::weakly_canonical(file, ec))) {
      reader.fail(where, node,
                  fmt::format("{} '{}' lies outside the package folder '{}': a package may read "
                              "only its own files (copy what it needs into it)",
                              what, file.string(), package_root.string()));
    }
  };

  if (const toml::node* kernels = root.get("kernel")) {
    const auto* table = kernels->as_table();
    if (table == nullptr) {
      reader.fail("kernel", kernels, "expected tables [kernel.NAME]");
    }
    for (const auto& [key, value] : *table) {
      const std::string where = "kernel." + std::string(key.str());
      const auto* k = value.as_table();
      if (k == nullptr) {
        reader.fail(where, &value, "expected a table");
      }
      reader.check_keys(*k, where, {"source", "entry", "options", "include_dirs"});
      KernelDecl decl;
      decl.name = std::string(key.str());
      decl.source = resolve(impl->dir, reader.string(*k, "source", where, true));
      inside_root(decl.source, where + ".source", k->get("source"), "source");
      if (!std::filesystem::is_regular_file(decl.source, ec)) {
        reader.fail(where + ".source", k->get("source"),
                    fmt::format("source file '{}' does not exist or is not a regular file",
                                decl.source.string()));
      }
      decl.entry = reader.string(*k, "entry", where, true);
      decl.options = reader.list(*k, "options", where, false);
      for (const auto& dir : reader.list(*k, "include_dirs", where, false)) {
        decl.include_dirs.push_back(resolve(impl->dir, dir));
        inside_root(decl.include_dirs.back(), where + ".include_dirs", k->get("include_dirs"),
                    "include dir");
      }
      // The program as it will be compiled: its options are checked and every header it includes
      // is found now, so a source reaching outside the package fails at load, not at first call.
      try {
        const Program program = Program::from_file(
          decl.source, CompileOptions{decl.options, decl.include_dirs, {}, impl->scope});
        for (const auto& header : program.headers()) {
          inside_root(header.path, where + ".source", k->get("source"), "header");
        }
      } catch (const ManifestError&) {
        throw;
      } catch (const Error& e) {
        reader.fail(where, k, e.what());
      }
      impl->kernels.push_back(std::move(decl));
    }
  }

  if (const toml::node* ops = root.get("op")) {
    const auto* table = ops->as_table();
    if (table == nullptr) {
      reader.fail("op", ops, "expected tables [op.NAME]");
    }
    for (const auto& [key, value] : *table) {
      const std::string where = "op." + std::string(key.str());
      const auto* o = value.as_table();
      if (o == nullptr) {
        reader.fail(where, &value, "expected a table");
      }
      reader.check_keys(*o, where,
                        {"schema", "kernel", "doc", "checks", "outputs", "args", "grid", "block",
                         "shared_mem", "specialize", "warm", "cpu"});
      OpDecl decl;
      decl.name = std::string(key.str());
      decl.schema = reader.string(*o, "schema", where, true);
      decl.kernel = reader.string(*o, "kernel", where, true);
      decl.doc = reader.string(*o, "doc", where, false);
      decl.cpu = reader.string(*o, "cpu", where, false);
      decl.checks = reader.list(*o, "checks", where, true);
      decl.args = reader.list(*o, "args", where, true, true);
      decl.grid = reader.list(*o, "grid", where, true, true);
      decl.block = reader.list(*o, "block", where, true, true);
      if (const toml::node* smem = o->get("shared_mem")) {
        decl.shared_mem = reader.expression_text(*smem, where + ".shared_mem");
      }
      if (const toml::node* outputs = o->get("outputs")) {
        const auto* array = outputs->as_array();
        if (array == nullptr) {
          reader.fail(where + ".outputs", outputs, "expected an array of tables");
        }
        for (std::size_t i = 0; i < array->size(); ++i) {
          const std::string out_where = fmt::format("{}.outputs[{}]", where, i);
          const auto* t = array->get(i)->as_table();
          if (t == nullptr) {
            reader.fail(out_where, array->get(i), "expected a table {shape = [...], dtype = ...}");
          }
          reader.check_keys(*t, out_where, {"shape", "like", "dims", "dtype"});
          OutputDecl out;
          out.shape = reader.list(*t, "shape", out_where, true);
          out.like = reader.string(*t, "like", out_where, false);
          out.dtype = reader.string(*t, "dtype", out_where, false);
          if (const toml::node* dims = t->get("dims")) {
            const auto* dims_table = dims->as_table();
            if (dims_table == nullptr) {
              reader.fail(out_where + ".dims", dims, "expected a table {\"-1\" = \"expr\"}");
            }
            for (const auto& [dim, expr] : *dims_table) {
              std::int64_t index = 0;
              try {
                std::size_t used = 0;
                index = std::stoll(std::string(dim.str()), &used);
                if (used != dim.str().size()) {
                  throw std::invalid_argument("trailing text");
                }
              } catch (const std::exception&) {
                reader.fail(out_where + ".dims." + std::string(dim.str()), &expr,
                            "a dimension key must be an integer such as \"-1\"");
              }
              out.dims.emplace_back(
                index, reader.expression_text(expr, out_where + ".dims." + std::string(dim.str())));
            }
          }
          decl.outputs.push_back(std::move(out));
        }
      }
      if (const toml::node* specialize = o->get("specialize")) {
        const auto* t = specialize->as_table();
        if (t == nullptr) {
          reader.fail(where + ".specialize", specialize, "expected a table {T = \"x.dtype\"}");
        }
        for (const auto& [name, expr] : *t) {
          decl.specialize.emplace_back(
            std::string(name.str()),
            reader.expression_text(expr, where + ".specialize." + std::string(name.str())));
        }
      }
      if (const toml::node* warm = o->get("warm")) {
        const auto* t = warm->as_table();
        if (t == nullptr) {
          reader.fail(where + ".warm", warm, "expected a table {T = [\"float16\", ...]}");
        }
        for (const auto& [name, values] : *t) {
          const auto* array = values.as_array();
          if (array == nullptr) {
            reader.fail(where + ".warm." + std::string(name.str()), &values, "expected an array");
          }
          std::vector<std::string> texts;
          for (std::size_t i = 0; i < array->size(); ++i) {
            texts.push_back(reader.expression_text(
              *array->get(i), fmt::format("{}.warm.{}[{}]", where, name.str(), i)));
          }
          decl.warm.emplace_back(std::string(name.str()), std::move(texts));
        }
      }

      // Parse every expression now, so mistakes surface when the package loads.
      auto spec = std::make_shared<detail::OpSpec>();
      spec->ns = impl->name;
      spec->name = decl.name;
      spec->schema = decl.schema;
      detail::SchemaInfo schema;
      try {
        schema = detail::parse_schema(decl.schema);
      } catch (const std::invalid_argument& e) {
        reader.fail(where + ".schema", o->get("schema"), e.what());
      }
      if (schema.name != decl.name) {
        reader.fail(
          where + ".schema", o->get("schema"),
          fmt::format("the schema names op '{}', the table '{}'", schema.name, decl.name));
      }
      const auto kernel_it =
        std::find_if(impl->kernels.begin(), impl->kernels.end(),
                     [&](const KernelDecl& k) { return k.name == decl.kernel; });
      if (kernel_it == impl->kernels.end()) {
        reader.fail(where + ".kernel", o->get("kernel"),
                    fmt::format("no [kernel.{}] in this package", decl.kernel));
      }
      spec->kernel = static_cast<std::size_t>(kernel_it - impl->kernels.begin());
      if (decl.outputs.size() != schema.returns) {
        reader.fail(where + ".outputs", o->get("outputs"),
                    fmt::format("the schema returns {} tensor(s) but {} output(s) are declared",
                                schema.returns, decl.outputs.size()));
      }
      spec->symbols = schema.arguments;
      spec->num_inputs = schema.arguments.size();
      std::vector<detail::Symbol> input_symbols = spec->symbols;
      for (std::size_t i = 0; i < decl.outputs.size(); ++i) {
        spec->symbols.push_back(detail::Symbol{fmt::format("out{}", i), Kind::tensor});
      }
      auto node_of = [&](std::string_view field) { return o->get(field); };
      for (std::size_t i = 0; i < decl.checks.size(); ++i) {
        spec->checks.push_back(reader.expression(decl.checks[i], input_symbols,
                                                 fmt::format("{}.checks[{}]", where, i),
                                                 node_of("checks"), {Kind::bool_}));
      }
      for (std::size_t i = 0; i < decl.outputs.size(); ++i) {
        const OutputDecl& out = decl.outputs[i];
        const std::string out_where = fmt::format("{}.outputs[{}]", where, i);
        detail::OutputSpec output;
        if (out.like.empty() == out.shape.empty()) {
          reader.fail(out_where, node_of("outputs"), "give either 'shape' or 'like'");
        }
        if (!out.like.empty()) {
          const auto symbol = std::find_if(input_symbols.begin(), input_symbols.end(),
                                           [&](const auto& s) { return s.name == out.like; });
          if (symbol == input_symbols.end() || symbol->kind != Kind::tensor) {
            reader.fail(out_where + ".like", node_of("outputs"),
                        fmt::format("'{}' is not a Tensor argument", out.like));
          }
          output.like = static_cast<std::int32_t>(symbol - input_symbols.begin());
        } else if (!out.dims.empty()) {
          reader.fail(out_where + ".dims", node_of("outputs"), "'dims' needs 'like'");
        }
        for (std::size_t d = 0; d < out.shape.size(); ++d) {
          output.shape.push_back(reader.expression(out.shape[d], input_symbols,
                                                   fmt::format("{}.shape[{}]", out_where, d),
                                                   node_of("outputs"), {Kind::int_}));
        }
        for (const auto& [dim, text] : out.dims) {
          output.dims.emplace_back(dim, reader.expression(text, input_symbols,
                                                          fmt::format("{}.dims.{}", out_where, dim),
                                                          node_of("outputs"), {Kind::int_}));
        }
        if (!out.dtype.empty()) {
          output.dtype = reader.expression(out.dtype, input_symbols, out_where + ".dtype",
                                           node_of("outputs"), {Kind::dtype});
        } else if (out.like.empty()) {
          reader.fail(out_where, node_of("outputs"), "an output with 'shape' needs a 'dtype'");
        }
        spec->outputs.push_back(std::move(output));
      }
      auto expressions = [&](const std::vector<std::string>& texts, std::string_view field,
                             std::initializer_list<Kind> kinds, std::size_t max) {
        if (texts.empty() || texts.size() > max) {
          reader.fail(where + "." + std::string(field), node_of(field),
                      fmt::format("expected 1 to {} values", max));
        }
        std::vector<Expr> result;
        for (std::size_t i = 0; i < texts.size(); ++i) {
          result.push_back(reader.expression(texts[i], spec->symbols,
                                             fmt::format("{}.{}[{}]", where, field, i),
                                             node_of(field), kinds));
        }
        return result;
      };
      spec->args =
        expressions(decl.args, "args", {Kind::tensor, Kind::int_, Kind::float_, Kind::bool_}, 256);
      spec->grid = expressions(decl.grid, "grid", {Kind::int_}, 3);
      spec->block = expressions(decl.block, "block", {Kind::int_}, 3);
      spec->shared_mem = reader.expression(decl.shared_mem, input_symbols, where + ".shared_mem",
                                           node_of("shared_mem"), {Kind::int_});
      for (const auto& [name, text] : decl.specialize) {
        spec->specialize.push_back(detail::SpecParam{
          name, reader.expression(text, input_symbols, where + ".specialize." + name,
                                  node_of("specialize"), {Kind::dtype, Kind::int_, Kind::bool_})});
      }
      const auto wanted = placeholders(kernel_it->entry);
      for (const auto& name : wanted) {
        if (std::none_of(decl.specialize.begin(), decl.specialize.end(),
                         [&](const auto& s) { return s.first == name; })) {
          reader.fail(where + ".specialize", node_of("specialize"),
                      fmt::format("the entry '{}' of kernel '{}' uses {{{}}}: give it a value "
                                  "here, e.g. {} = \"x.dtype\"",
                                  kernel_it->entry, kernel_it->name, name, name));
        }
      }
      for (const auto& [name, text] : decl.specialize) {
        if (std::find(wanted.begin(), wanted.end(), name) == wanted.end()) {
          reader.fail(
            where + ".specialize." + name, node_of("specialize"),
            fmt::format("the entry '{}' has no placeholder {{{}}}", kernel_it->entry, name));
        }
      }
      for (const auto& warm_entry : decl.warm) {
        const std::string& name = warm_entry.first;
        const auto& values = warm_entry.second;
        const auto param = std::find_if(spec->specialize.begin(), spec->specialize.end(),
                                        [&](const auto& s) { return s.name == name; });
        if (param == spec->specialize.end()) {
          reader.fail(where + ".warm." + name, node_of("warm"),
                      fmt::format("'{}' is not a placeholder of 'specialize'", name));
        }
        for (std::size_t i = 0; i < values.size(); ++i) {
          const std::string value_where = fmt::format("{}.warm.{}[{}]", where, name, i);
          const Expr literal =
            reader.expression(values[i], {}, value_where, node_of("warm"), {param->expr.kind()});
          if (!detail::literal_value(literal)) {
            reader.fail(value_where, node_of("warm"),
                        fmt::format("'{}' is not a literal value", values[i]));
          }
        }
      }
      spec->cpu = decl.cpu;
      impl->specs.push_back(std::move(spec));
      impl->ops.push_back(std::move(decl));
    }
  }
  Package result;
  result.m_impl = std::move(impl);
  return result;
}

const std::string& Package::name() const noexcept {
  return m_impl->name;
}

const std::string& Package::scope() const noexcept {
  return m_impl->scope;
}

const std::string& Package::version() const noexcept {
  return m_impl->version;
}

const std::string& Package::description() const noexcept {
  return m_impl->description;
}

const std::filesystem::path& Package::dir() const noexcept {
  return m_impl->dir;
}

const std::filesystem::path& Package::manifest() const noexcept {
  return m_impl->manifest;
}

const std::vector<KernelDecl>& Package::kernels() const noexcept {
  return m_impl->kernels;
}

const std::vector<OpDecl>& Package::ops() const noexcept {
  return m_impl->ops;
}

const std::vector<std::shared_ptr<const detail::OpSpec>>& Package::op_specs() const noexcept {
  return m_impl->specs;
}

const KernelDecl& Package::kernel(std::string_view name) const {
  for (const auto& k : m_impl->kernels) {
    if (k.name == name) {
      return k;
    }
  }
  throw Error(fmt::format("package '{}' has no kernel '{}'", m_impl->name, name));
}

std::pair<Program, std::string>
Package::specialize(const KernelDecl& kernel,
                    const std::vector<std::pair<std::string, std::string>>& values) const {
  std::string entry = kernel.entry;
  for (const auto& name : placeholders(kernel.entry)) {
    const auto value =
      std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == name; });
    if (value == values.end()) {
      throw ManifestError(m_impl->manifest.string(), "kernel." + kernel.name + ".entry", 0, 0,
                          fmt::format("no value for placeholder {{{}}}", name));
    }
    const std::string token = "{" + name + "}";
    for (auto at = entry.find(token); at != std::string::npos; at = entry.find(token)) {
      entry.replace(at, token.size(), value->second);
    }
  }
  CompileOptions options{kernel.options, kernel.include_dirs, {}, m_impl->scope};
  if (entry != kernel.entry) {
    options.name_expressions.push_back(entry);
  }
  return {Program::from_file(kernel.source, std::move(options)), entry};
}

std::vector<WarmItem> Package::warm_list() const {
  std::vector<WarmItem> items;
  std::set<std::string> seen; // programs shared by several ops are warmed once
  for (std::size_t o = 0; o < m_impl->ops.size(); ++o) {
    const OpDecl& op = m_impl->ops[o];
    const auto& spec = *m_impl->specs[o];
    const KernelDecl& kernel = m_impl->kernels[spec.kernel];
    // The cartesian product of the warm lists, in declaration order.
    std::vector<std::vector<std::pair<std::string, std::string>>> combos{{}};
    for (const auto& param : spec.specialize) {
      const auto warm = std::find_if(op.warm.begin(), op.warm.end(),
                                     [&](const auto& w) { return w.first == param.name; });
      if (warm == op.warm.end()) {
        combos.clear(); // a placeholder without warm values: nothing to pre-compile
        break;
      }
      std::vector<std::vector<std::pair<std::string, std::string>>> next;
      for (const auto& combo : combos) {
        for (const auto& text : warm->second) {
          const Expr value = Expr::parse(text, {});
          auto extended = combo;
          extended.emplace_back(
            param.name, detail::specialization_text(value.kind(), *detail::literal_value(value)));
          next.push_back(std::move(extended));
        }
      }
      combos = std::move(next);
    }
    for (const auto& combo : combos) {
      auto [program, name] = specialize(kernel, combo);
      if (seen.insert(kernel.name + "\n" + name).second) {
        items.push_back(WarmItem{op.name, std::move(program), std::move(name)});
      }
    }
  }
  return items;
}

} // namespace kjit
