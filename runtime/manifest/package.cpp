// Kernel packages: the manifest's [package] and [kernel.NAME] tables (the [op.NAME] tables are
// op_reader.cpp's), the checks on what a package may read, specialization and warm lists.
#include <kjit/error.hpp>
#include <kjit/package.hpp>

#include "runtime/manifest/op_spec.hpp"
#include "runtime/manifest/reader.hpp"
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

bool manifest_code_point_ok(char32_t c) noexcept {
  // See Note [toml++ and non-ASCII].
  const bool mishandled =
    c != 0xA0 && c != 0x3000 && c != 0xFEFF &&
    ((c >= 0xA1 && c <= 0x499) || (c >= 0x2C5E && c <= 0x3057) || (c >= 0xFB26 && c <= 0xFEFE));
  return !mishandled && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF);
}

bool is_identifier(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name.front()))) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

} // namespace detail

namespace {

using detail::Expr;
using detail::is_identifier;
using detail::ManifestReader;
using detail::placeholders;

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
    std::vector<std::shared_ptr<detail::OpSpec>> specs;
    for (const auto& [key, value] : *table) {
      auto [decl, spec] = detail::read_op(reader, impl->name, key.str(), value, impl->kernels);
      specs.push_back(std::move(spec));
      impl->ops.push_back(std::move(decl));
    }
    detail::link_backwards(reader, *table, impl->ops, specs);
    impl->specs.assign(specs.begin(), specs.end());
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

namespace {

// Kernel `kernel`'s entry with its placeholders replaced by `values` (placeholder -> text).
std::string specialized_entry(const KernelDecl& kernel,
                              const std::vector<std::pair<std::string, std::string>>& values,
                              const std::filesystem::path& manifest) {
  std::string entry = kernel.entry;
  for (const auto& name : placeholders(kernel.entry)) {
    const auto value =
      std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == name; });
    if (value == values.end()) {
      throw ManifestError(manifest.string(), "kernel." + kernel.name + ".entry", 0, 0,
                          fmt::format("no value for placeholder {{{}}}", name));
    }
    const std::string token = "{" + name + "}";
    for (auto at = entry.find(token); at != std::string::npos; at = entry.find(token)) {
      entry.replace(at, token.size(), value->second);
    }
  }
  return entry;
}

} // namespace

Program Package::program(const KernelDecl& kernel, const std::string& entry) const {
  CompileOptions options{kernel.options, kernel.include_dirs, {}, m_impl->scope};
  if (entry != kernel.entry) {
    options.name_expressions.push_back(entry);
  }
  options.origin = ProgramOrigin{m_impl->name, m_impl->version, kernel.name, {}, entry};
  for (const auto& op : m_impl->ops) {
    if (std::any_of(op.launches.begin(), op.launches.end(),
                    [&](const LaunchDecl& launch) { return launch.kernel == kernel.name; })) {
      options.origin.ops.push_back(op.name);
    }
  }
  return Program::from_file(kernel.source, std::move(options));
}

std::pair<Program, std::string>
Package::specialize(const KernelDecl& kernel,
                    const std::vector<std::pair<std::string, std::string>>& values) const {
  std::string entry = specialized_entry(kernel, values, m_impl->manifest);
  return {program(kernel, entry), std::move(entry)};
}

namespace {

// The dtypes the checks of `op` compare tensor `tensor` with (`tensor.dtype == float16`), in
// order of appearance, each once.
std::vector<std::string> checked_dtypes(const OpDecl& op, const std::string& tensor) {
  std::vector<std::string> found;
  const std::string lhs = tensor + ".dtype";
  for (const auto& check : op.checks) {
    for (std::size_t at = check.find(lhs); at != std::string::npos; at = check.find(lhs, at + 1)) {
      if (at > 0 && (std::isalnum(static_cast<unsigned char>(check[at - 1])) != 0 ||
                     check[at - 1] == '_' || check[at - 1] == '.')) {
        continue; // part of a longer name
      }
      std::size_t i = at + lhs.size();
      while (i < check.size() && check[i] == ' ') {
        ++i;
      }
      if (check.compare(i, 2, "==") != 0) {
        continue;
      }
      i += 2;
      while (i < check.size() && check[i] == ' ') {
        ++i;
      }
      std::size_t end = i;
      while (end < check.size() &&
             (std::isalnum(static_cast<unsigned char>(check[end])) != 0 || check[end] == '_')) {
        ++end;
      }
      const std::string name = check.substr(i, end - i);
      detail::DType dtype{};
      if (detail::parse_dtype(name, dtype) &&
          std::find(found.begin(), found.end(), name) == found.end()) {
        found.push_back(name);
      }
    }
  }
  return found;
}

// The op's warm tables; none is one empty table, every placeholder taking its defaults.
const std::vector<OpDecl::WarmTable>& warm_tables(const OpDecl& op) {
  static const std::vector<OpDecl::WarmTable> k_defaults{{}};
  return op.warm.empty() ? k_defaults : op.warm;
}

// The warm values of placeholder `param` of `op` in one of its warm tables: the table's entry,
// else every candidate value of a tune parameter it is (Note [Tuning]: the tuner compiles them
// all), else the dtypes its checks allow when it specializes on a tensor's dtype, else none.
std::vector<std::string> warm_values(const OpDecl& op, const OpDecl::WarmTable& table,
                                     const detail::SpecParam& param) {
  const auto warm =
    std::find_if(table.begin(), table.end(), [&](const auto& w) { return w.first == param.name; });
  if (warm != table.end()) {
    return warm->second;
  }
  const std::string& text = param.expr.text();
  const auto tuned =
    std::find_if(op.tune.begin(), op.tune.end(), [&](const auto& t) { return t.first == text; });
  if (tuned != op.tune.end()) {
    std::vector<std::string> values;
    for (const std::int64_t v : tuned->second) {
      values.push_back(std::to_string(v));
    }
    return values;
  }
  const std::string suffix = ".dtype";
  if (text.size() > suffix.size() && text.ends_with(suffix)) {
    const std::string tensor = text.substr(0, text.size() - suffix.size());
    if (std::all_of(tensor.begin(), tensor.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
        })) {
      return checked_dtypes(op, tensor);
    }
  }
  return {};
}

} // namespace

std::vector<WarmItem> Package::warm_list(bool every_launch) const {
  std::vector<WarmItem> items;
  std::set<std::string> seen; // programs shared by several ops are warmed once
  for (std::size_t o = 0; o < m_impl->ops.size(); ++o) {
    const OpDecl& op = m_impl->ops[o];
    const auto& launches = m_impl->specs[o]->launches;
    for (std::size_t l = 0; l < launches.size(); ++l) {
      const auto& launch = launches[l];
      const KernelDecl& kernel = m_impl->kernels[launch.kernel];
      std::set<std::string> launch_seen; // a specialization two tables both give, once
      for (const auto& table : warm_tables(op)) {
        // The cartesian product of the table's warm lists, in declaration order.
        std::vector<std::vector<std::pair<std::string, std::string>>> combos{{}};
        for (const auto& param : launch.specialize) {
          std::vector<std::string> values = warm_values(op, table, param);
          if (values.empty()) {
            combos.clear(); // a placeholder without warm values: a gap (warm_gaps)
            break;
          }
          for (auto& text : values) {
            const Expr value = Expr::parse(text, {});
            text = detail::specialization_text(value.kind(), *detail::literal_value(value));
          }
          std::vector<std::vector<std::pair<std::string, std::string>>> next;
          for (const auto& combo : combos) {
            for (const auto& text : values) {
              auto extended = combo;
              extended.emplace_back(param.name, text);
              next.push_back(std::move(extended));
            }
          }
          combos = std::move(next);
        }
        // Names first: a program (its source read and headers scanned) only for a new one.
        for (const auto& combo : combos) {
          std::string name = specialized_entry(kernel, combo, m_impl->manifest);
          if (!launch_seen.insert(name).second) {
            continue;
          }
          if (every_launch || seen.insert(kernel.name + "\n" + name).second) {
            items.push_back(WarmItem{op.name, program(kernel, name), std::move(name), l});
          }
        }
      }
    }
  }
  return items;
}

std::vector<WarmGap> Package::warm_gaps() const {
  std::vector<WarmGap> gaps;
  for (std::size_t o = 0; o < m_impl->ops.size(); ++o) {
    const OpDecl& op = m_impl->ops[o];
    for (const auto& launch : m_impl->specs[o]->launches) {
      WarmGap gap{op.name, m_impl->kernels[launch.kernel].name, {}, {}};
      std::string example;
      const auto& tables = warm_tables(op);
      for (const auto& param : launch.specialize) {
        // A gap where some table leaves the placeholder without values (that table warms nothing).
        const bool missing = std::any_of(tables.begin(), tables.end(), [&](const auto& table) {
          return warm_values(op, table, param).empty();
        });
        if (missing) {
          gap.needs.push_back(param.name);
          example += fmt::format("{}{} = [...]", example.empty() ? "" : ", ", param.name);
        }
      }
      if (!gap.needs.empty()) {
        gap.fix =
          fmt::format("add warm = {{ {} }} to [op.{}] (the values of \"{}\" to pre-compile)",
                      example, op.name, gap.needs.front());
        gaps.push_back(std::move(gap));
      }
    }
  }
  return gaps;
}

} // namespace kjit
