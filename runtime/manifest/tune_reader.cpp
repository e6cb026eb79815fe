// The reader of an op's tune keys (Note [Tuning] in op_spec.hpp): tune, tune_valid, tune_key and
// tune_default as written; op_reader parses their expressions with the op's symbols.
#include "runtime/manifest/reader.hpp"

#include <algorithm>

namespace kjit::detail {

void read_tune_decl(const ManifestReader& reader, const toml::table& o, const std::string& where,
                    OpDecl& decl) {
  const toml::node* tune = o.get("tune");
  if (tune == nullptr) {
    for (const char* key : {"tune_valid", "tune_key", "tune_default"}) {
      if (o.get(key) != nullptr) {
        reader.fail(where + "." + key, o.get(key), fmt::format("'{}' needs 'tune'", key));
      }
    }
    return;
  }
  const auto* t = tune->as_table();
  if (t == nullptr || t->empty()) {
    reader.fail(where + ".tune", tune, "expected a table {NAME = [values], ...}");
  }
  if (t->size() > k_max_tune_params) { // the torch layer keeps a call's values in fixed arrays
    reader.fail(
      where + ".tune", tune,
      fmt::format("{} tune parameters; an op has at most {}", t->size(), k_max_tune_params));
  }
  for (const auto& [name, values] : *t) {
    const std::string at = where + ".tune." + std::string(name.str());
    const auto* array = values.as_array();
    if (array == nullptr || array->empty() || array->size() > 64) {
      reader.fail(at, &values, "expected an array of 1 to 64 integers");
    }
    std::vector<std::int64_t> list;
    for (std::size_t i = 0; i < array->size(); ++i) {
      const auto* value = array->get(i)->as_integer();
      if (value == nullptr) {
        reader.fail(fmt::format("{}[{}]", at, i), array->get(i), "expected an integer");
      }
      if (std::find(list.begin(), list.end(), value->get()) != list.end()) {
        reader.fail(fmt::format("{}[{}]", at, i), array->get(i),
                    fmt::format("{} is listed twice", value->get()));
      }
      list.push_back(value->get());
    }
    decl.tune.emplace_back(std::string(name.str()), std::move(list));
  }
  decl.tune_valid = reader.string(o, "tune_valid", where, false);
  decl.tune_key = reader.list(o, "tune_key", where, true);
  if (decl.tune_key.size() > k_max_tune_key) {
    reader.fail(
      where + ".tune_key", o.get("tune_key"),
      fmt::format("{} bucket expressions; at most {}", decl.tune_key.size(), k_max_tune_key));
  }
  const toml::node* defaults = o.get("tune_default");
  const auto* d = defaults != nullptr ? defaults->as_table() : nullptr;
  if (d == nullptr) {
    reader.fail(where + ".tune_default", defaults != nullptr ? defaults : tune,
                "an op with 'tune' needs tune_default = { NAME = \"expression\", ... }: the "
                "configuration used where none was tuned (CUDA graph capture, KJIT_AUTOTUNE=0)");
  }
  for (const auto& [name, value] : *d) {
    const std::string at = where + ".tune_default." + std::string(name.str());
    if (std::none_of(decl.tune.begin(), decl.tune.end(),
                     [&name = name](const auto& p) { return p.first == name.str(); })) {
      reader.fail(at, &value, fmt::format("'{}' is not a parameter of 'tune'", name.str()));
    }
    decl.tune_default.emplace_back(std::string(name.str()), reader.expression_text(value, at));
  }
  for (const auto& [name, values] : decl.tune) {
    if (std::none_of(decl.tune_default.begin(), decl.tune_default.end(),
                     [&name = name](const auto& p) { return p.first == name; })) {
      reader.fail(where + ".tune_default", defaults,
                  fmt::format("no default for tune parameter '{}'", name));
    }
  }
}

} // namespace kjit::detail
