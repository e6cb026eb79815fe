// The readers of an op's launch tables and output tables as written (LaunchDecl, OutputDecl):
// keys, types and the shape of their values; op_reader parses their expressions with the op's
// symbols.
#include "runtime/manifest/reader.hpp"

#include <stdexcept>

namespace kjit::detail {

// Reads the keys of one launch: those of a [[op.NAME.launch]] table or the op's own.
LaunchDecl read_launch_decl(const ManifestReader& reader, const toml::table& t,
                            const std::string& where) {
  LaunchDecl decl;
  decl.kernel = reader.string(t, "kernel", where, true);
  decl.when = reader.string(t, "when", where, false);
  decl.args = reader.list(t, "args", where, true, true);
  decl.grid = reader.list(t, "grid", where, true, true);
  decl.block = reader.list(t, "block", where, true, true);
  if (const toml::node* smem = t.get("shared_mem")) {
    decl.shared_mem = reader.expression_text(*smem, where + ".shared_mem");
  }
  if (const toml::node* specialize = t.get("specialize")) {
    const auto* table = specialize->as_table();
    if (table == nullptr) {
      reader.fail(where + ".specialize", specialize, "expected a table {T = \"x.dtype\"}");
    }
    for (const auto& [name, expr] : *table) {
      decl.specialize.emplace_back(
        std::string(name.str()),
        reader.expression_text(expr, where + ".specialize." + std::string(name.str())));
    }
  }
  return decl;
}

OutputDecl read_output_decl(const ManifestReader& reader, const toml::node& node,
                            const std::string& out_where) {
  const auto* t = node.as_table();
  if (t == nullptr) {
    reader.fail(out_where, &node, "expected a table {shape = [...], dtype = ...}");
  }
  reader.check_keys(*t, out_where, {"shape", "like", "dims", "dtype", "hidden", "layout"});
  OutputDecl out;
  out.shape = reader.list(*t, "shape", out_where, true);
  out.has_shape = t->contains("shape");
  out.like = reader.string(*t, "like", out_where, false);
  out.dtype = reader.string(*t, "dtype", out_where, false);
  if (const toml::node* hidden = t->get("hidden")) {
    if (!hidden->is_boolean()) {
      reader.fail(out_where + ".hidden", hidden, "expected true or false");
    }
    out.hidden = hidden->as_boolean()->get();
  }
  if (const toml::node* layout = t->get("layout")) {
    const auto* text = layout->as_string();
    if (text == nullptr || (text->get() != "preserve" && text->get() != "contiguous")) {
      reader.fail(out_where + ".layout", layout,
                  "expected \"contiguous\" (the default) or \"preserve\" (like's strides, as "
                  "torch.empty_like)");
    }
    out.preserve_layout = text->get() == "preserve";
  }
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
  return out;
}

} // namespace kjit::detail
