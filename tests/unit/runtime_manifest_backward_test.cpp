#include <kjit/error.hpp>
#include <kjit/package.hpp>

#include "runtime/manifest/op_spec.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

namespace {

// The backward is written before the op it serves: tables link in any order.
const char* k_manifest = R"toml([package]
name = "p"
version = "1.0.0"

[kernel.k]
source = "k.cu"
entry = "k"

[op.a_backward]
schema = "a_backward(Tensor grad, Tensor x, Tensor? bias, Tensor rstd, float eps) -> (Tensor, Tensor)"
kernel = "k"
outputs = [{ like = "x" }, { like = "x" }]
args = ["out0", "x"]
grid = [1]
block = [1]

[op.a]
schema = "a(Tensor x, Tensor? bias=None, float eps=1e-6) -> Tensor"
kernel = "k"
outputs = [{ like = "x" }, { shape = ["x.size(0)"], dtype = "float32", hidden = true }]
args = ["out0", "x"]
grid = [1]
block = [1]
backward = { op = "a_backward", args = ["grad_out0", "x", "bias", "out1", "eps"], gradients = ["bias", "x"] }
)toml";

} // namespace

TEST_CASE("a backward links to its op: arguments by source, gradients by argument",
          "[package][backward]") {
  kjit::test::TempDir dir;
  kjit::test::write_text(dir / "kernel.toml", k_manifest);
  kjit::test::write_text(dir / "k.cu",
                         "extern \"C\" __global__ void k(float* o, const float* x) {}\n");
  const auto package = kjit::Package::load(dir.path());
  REQUIRE(package.op_specs().size() == 2);
  // Ops come in the order of the table's keys: "a", then "a_backward".
  const auto& a = *package.op_specs()[0];
  REQUIRE(a.name == "a");
  REQUIRE(a.backward.has_value());
  CHECK(a.backward->op == "a_backward");
  CHECK(a.backward->op_index == 1);
  using Source = kjit::detail::BackwardArg::Source;
  const std::vector<std::pair<Source, std::int32_t>> want{{Source::grad, 0},
                                                          {Source::input, 0},
                                                          {Source::input, 1},
                                                          {Source::output, 1},
                                                          {Source::input, 2}};
  REQUIRE(a.backward->args.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CHECK(a.backward->args[i].source == want[i].first);
    CHECK(a.backward->args[i].index == want[i].second);
  }
  CHECK(a.backward->gradients == std::vector<std::int32_t>{1, 0});
  CHECK(a.has_twin());
  CHECK(a.outputs[1].hidden);
  CHECK(a.returns.size() == 1);
  CHECK_FALSE(package.op_specs()[1]->backward.has_value());
}

TEST_CASE("an optional argument goes only to an optional parameter of the backward",
          "[package][backward]") {
  std::string manifest = k_manifest;
  const std::string from = "Tensor? bias, Tensor rstd";
  manifest.replace(manifest.find(from), from.size(), "Tensor bias, Tensor rstd");
  kjit::test::TempDir dir;
  kjit::test::write_text(dir / "kernel.toml", manifest);
  kjit::test::write_text(dir / "k.cu",
                         "extern \"C\" __global__ void k(float* o, const float* x) {}\n");
  try {
    (void)kjit::Package::load(dir.path());
    FAIL("loaded");
  } catch (const kjit::ManifestError& e) {
    CHECK(e.location() == "op.a.backward.args[2]");
    CHECK_THAT(e.what(),
               Catch::Matchers::Contains("'bias' may be None, and argument 'bias' of "
                                         "'a_backward' is not optional: declare it Tensor?"));
  }
}
