// An op's parsed manifest as Python data, for the half of the torch layer that runs in Python
// (fake kernels, CPU implementations): the expressions go over as the parser's node arrays, so
// Python evaluates what the C++ parser produced and never parses the language itself.
#pragma once

#include "runtime/manifest/op_spec.hpp"

#include <pybind11/pybind11.h>

namespace kjit::python {

// {"name", "symbols": [(name, kind)], "num_inputs", "checks": [expr], "outputs": [{"shape":
// [expr], "like": index, "dims": [(dim, expr)], "dtype": expr | None}]}, where an expr is
// {"text", "kind", "root", "nodes": [(op, kind, a, b, value, number)]} with op and kind by name.
pybind11::dict export_op(const detail::OpSpec& spec);

// For tests of the Python evaluator against the C++ one: `text` parsed with int symbols named
// `names`, exported (as above) and evaluated with `values` by kjit::detail::Evaluator; the value
// is an int, float or bool, or the EvalError's message as a str.
pybind11::tuple evaluate_expr(const std::string& text, const std::vector<std::string>& names,
                              const std::vector<std::int64_t>& values);

} // namespace kjit::python
