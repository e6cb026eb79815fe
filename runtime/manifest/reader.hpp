// The manifest reader's tools: one ManifestReader per kernel.toml turns every mistake into a
// ManifestError with its place (file, key, line, column); read_op reads one [op.NAME] table.
#pragma once

#include <kjit/error.hpp>
#include <kjit/package.hpp>

#include "runtime/manifest/op_spec.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace kjit::detail {

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

// Whether `name` is a C identifier.
bool is_identifier(std::string_view name);

// The placeholders "{T}" of an entry, in order of first use.
std::vector<std::string> placeholders(std::string_view entry);

// Reads one launch's keys: a [[op.NAME.launch]] table's or the op's own (decl_reader.cpp).
LaunchDecl read_launch_decl(const ManifestReader& reader, const toml::table& t,
                            const std::string& where);

// Reads one entry of an op's `outputs` (decl_reader.cpp).
OutputDecl read_output_decl(const ManifestReader& reader, const toml::node& node,
                            const std::string& out_where);

// Reads the tune keys of op table `o` (at `where`) into `decl` (runtime/manifest/tune_reader.cpp).
void read_tune_decl(const ManifestReader& reader, const toml::table& o, const std::string& where,
                    OpDecl& decl);

// Reads the op table `table` (at `key`) of package `ns` whose kernels are `kernels`.
std::pair<OpDecl, std::shared_ptr<OpSpec>> read_op(const ManifestReader& reader,
                                                   const std::string& ns, std::string_view key,
                                                   const toml::node& table,
                                                   const std::vector<KernelDecl>& kernels);

// Links each op's `backward` to the op it names (all of `decls`, read from the table `ops`, with
// their `specs`), checking the arguments given to it and the gradients it returns.
void link_backwards(const ManifestReader& reader, const toml::table& ops,
                    const std::vector<OpDecl>& decls,
                    const std::vector<std::shared_ptr<OpSpec>>& specs);

} // namespace kjit::detail
