#include <kjit/error.hpp>
#include <kjit/package.hpp>

#include "runtime/manifest/op_spec.hpp"
#include "support/test_support.hpp"

#define TOML_HEADER_ONLY 1
#include <toml++/toml.h>

#include <catch2/catch.hpp>

namespace {

const char* k_manifest = R"toml([package]
name = "p"
version = "1.2.3"
description = "caf\\u00e9, \u4e2d\u6587: non-ASCII in strings is fine"  # and in comments: \u4e2d

[kernel.k]
source = "k.cu"
entry = "k<{T}>"

[op.f]
schema = "f(Tensor x, int n) -> Tensor"
kernel = "k"
outputs = [{ like = "x" }]
args = ["out0", "x", "n"]
grid = ["cdiv(x.numel(), 256)"]
block = [256]
specialize = { T = "x.dtype" }
warm = { T = ["float16", "float32"] }
)toml";

kjit::Package load(const kjit::test::TempDir& dir, const std::string& manifest) {
  kjit::test::write_text(dir / "kernel.toml", manifest);
  kjit::test::write_text(dir / "k.cu",
                         "template <typename T> __global__ void k(T* o, const T* x, int n) {}\n");
  return kjit::Package::load(dir.path());
}

} // namespace

TEST_CASE("a package loads with its ops and warm list", "[package]") {
  kjit::test::TempDir dir;
  const auto package = load(dir, k_manifest);
  CHECK(package.name() == "p");
  CHECK(package.version() == "1.2.3");
  REQUIRE(package.ops().size() == 1);
  CHECK(package.ops()[0].schema == "f(Tensor x, int n) -> Tensor");
  const auto warm = package.warm_list();
  REQUIRE(warm.size() == 2);
  CHECK(warm[0].kernel == "k<__half>");
  CHECK(warm[1].kernel == "k<float>");
  CHECK(warm[0].program.options().name_expressions == std::vector<std::string>{"k<__half>"});
}

TEST_CASE("warm values default to the dtypes the checks allow; what cannot be warmed is said",
          "[package]") {
  kjit::test::TempDir dir;
  std::string manifest = k_manifest;
  const std::string warm_line = "warm = { T = [\"float16\", \"float32\"] }\n";
  manifest.replace(
    manifest.find(warm_line), warm_line.size(),
    "checks = [\"x.dtype == bfloat16 || x.dtype == float32\", \"x.dtype != int8\"]\n");
  manifest += R"toml(
[op.g]
schema = "g(Tensor x) -> Tensor"
kernel = "k"
outputs = [{ like = "x" }]
args = ["out0", "x", "x.numel()"]
grid = [1]
block = [32]
specialize = { T = "x.size(0) > 4 ? x.dtype : x.dtype" }
)toml";
  const auto package = load(dir, manifest);
  const auto warm = package.warm_list();
  REQUIRE(warm.size() == 2); // f from its checks: bfloat16 and float32 (not the != int8)
  CHECK(warm[0].kernel == "k<__nv_bfloat16>");
  CHECK(warm[1].kernel == "k<float>");
  const auto gaps = package.warm_gaps();
  REQUIRE(gaps.size() == 1); // g's T is not a plain tensor dtype: no default
  CHECK(gaps[0].op == "g");
  CHECK(gaps[0].kernel == "k");
  CHECK(gaps[0].needs == std::vector<std::string>{"T"});
  CHECK(gaps[0].fix == "add warm = { T = [...] } to [op.g] (the values of \"T\" to pre-compile)");
  CHECK(load(dir, k_manifest).warm_gaps().empty());
}

TEST_CASE("several warm tables: the union of their products, each specialization once",
          "[package]") {
  kjit::test::TempDir dir;
  std::string manifest = k_manifest;
  const std::string entry = "entry = \"k<{T}>\"";
  manifest.replace(manifest.find(entry), entry.size(), "entry = \"k<{T}, {V}>\"");
  const std::string specialize = "specialize = { T = \"x.dtype\" }";
  manifest.replace(manifest.find(specialize), specialize.size(),
                   "specialize = { T = \"x.dtype\", V = \"x.dtype == float32 ? 4 : 8\" }");
  const std::string warm_line = "warm = { T = [\"float16\", \"float32\"] }";
  manifest.replace(manifest.find(warm_line), warm_line.size(),
                   "warm = [{ T = [\"float32\"], V = [4] }, { T = [\"float16\", \"bfloat16\"], V = "
                   "[8] }, { T = [\"float32\"], V = [4, 1] }]");
  kjit::test::write_text(dir / "k.cu", "template <typename T, int V> __global__ void k(T* o, "
                                       "const T* x, int n) {}\n");
  kjit::test::write_text(dir / "kernel.toml", manifest);
  const auto package = kjit::Package::load(dir.path());
  std::vector<std::string> kernels;
  for (const auto& item : package.warm_list()) {
    kernels.push_back(item.kernel);
  }
  // Not the 3 x 3 product of one table: float32 with 4 (once, though two tables give it) or 1,
  // the 16-bit types with 8.
  CHECK(kernels == std::vector<std::string>{"k<float, 4>", "k<__half, 8>", "k<__nv_bfloat16, 8>",
                                            "k<float, 1>"});
  CHECK(package.warm_gaps().empty());

  // A table that leaves a placeholder without values is a gap, named as for one table.
  std::string gap = manifest;
  const std::string second = "{ T = [\"float16\", \"bfloat16\"], V = [8] }";
  gap.replace(gap.find(second), second.size(), "{ T = [\"float16\"] }");
  kjit::test::write_text(dir / "kernel.toml", gap);
  const auto gaps = kjit::Package::load(dir.path()).warm_gaps();
  REQUIRE(gaps.size() == 1);
  CHECK(gaps[0].needs == std::vector<std::string>{"V"});

  auto error_of = [&](const std::string& warm) -> std::string {
    std::string text = k_manifest;
    text.replace(text.find(warm_line), warm_line.size(), warm);
    try {
      load(dir, text);
    } catch (const kjit::ManifestError& e) {
      return e.location() + ": " + e.what();
    }
    return "no error";
  };
  CHECK_THAT(error_of("warm = [{ T = [\"float16\"] }, [\"float32\"]]"),
             Catch::Contains("op.f.warm[1]") && Catch::Contains("expected a table"));
  CHECK_THAT(error_of("warm = []"),
             Catch::Contains("op.f.warm") && Catch::Contains("non-empty array"));
  CHECK_THAT(error_of("warm = [{ T = [\"float16\"] }, { U = [1] }]"),
             Catch::Contains("op.f.warm[1].U") && Catch::Contains("not a placeholder"));
  CHECK_THAT(error_of("warm = [{ T = [\"float16\"] }, { T = [\"x\"] }]"),
             Catch::Contains("op.f.warm[1].T[0]"));
}

TEST_CASE("characters the TOML parser mishandles, and invalid UTF-8, are refused with the line",
          "[package]") {
  kjit::test::TempDir dir;
  // A bare Greek letter, the same as an escape, an accented letter in a string, invalid UTF-8.
  for (const char* bad :
       {"\xcf\x85 = 1\n", "x = \"\\\xcf\x85\"\n", "y = \"caf\xc3\xa9\"\n", "z = \"\xff\"\n"}) {
    CAPTURE(bad);
    std::string manifest = k_manifest;
    manifest.insert(manifest.find("[kernel.k]"), bad);
    try {
      load(dir, manifest);
      FAIL("expected a ManifestError");
    } catch (const kjit::ManifestError& e) {
      CHECK(e.line() == 6); // the inserted line, after a description and a comment in UTF-8
      CHECK_THAT(std::string(e.what()), Catch::Contains("UTF-8") || Catch::Contains("\\u"));
    }
  }
}

TEST_CASE("manifest mistakes name the key and line", "[package]") {
  kjit::test::TempDir dir;
  auto error_of = [&](const std::string& manifest) -> std::string {
    try {
      load(dir, manifest);
    } catch (const kjit::ManifestError& e) {
      return e.location() + " @" + std::to_string(e.line()) + ": " + e.what();
    }
    return "no error";
  };
  const std::string m = k_manifest;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = m;
    REQUIRE(text.find(from) != std::string::npos);
    return text.replace(text.find(from), from.size(), to);
  };
  CHECK_THAT(error_of(with("version = \"1.2.3\"", "version = \"1.2\"")),
             Catch::Contains("package.version") && Catch::Contains("not a semantic version"));
  CHECK_THAT(error_of(with("block = [256]", "block = [1, 2, 3, 4]")),
             Catch::Contains("op.f.block") && Catch::Contains("1 to 3 values"));
  CHECK_THAT(error_of(with("\"float16\", ", "\"x\", ")), Catch::Contains("op.f.warm.T[0]"));
  CHECK_THAT(error_of(m + "\n[op.g]\nschema = \"g(Tensor[] xs) -> Tensor\"\nkernel = \"k\"\n"
                          "args = [\"out0\"]\ngrid = [1]\nblock = [1]\n"
                          "outputs = [{ shape = [\"1\"], dtype = \"uint8\" }]\n"),
             Catch::Contains("op.g.schema") && Catch::Contains("Tensor[]"));
  CHECK_THAT(error_of(with("args = [\"out0\", \"x\", \"n\"]", "args = [\"out0\", \"x.dtype\"]")),
             Catch::Contains("op.f.args[1]") && Catch::Contains("is dtype"));
  CHECK_THAT(error_of(with("{ like = \"x\" }", "{ like = \"x\", layout = \"channels_last\" }")),
             Catch::Contains("op.f.outputs[0].layout") && Catch::Contains("\"preserve\""));
  CHECK_THAT(error_of(with("{ like = \"x\" }",
                           "{ shape = [\"1\"], dtype = \"uint8\", layout = \"preserve\" }")),
             Catch::Contains("op.f.outputs[0].layout") && Catch::Contains("needs 'like'"));
}

TEST_CASE("an output's layout: contiguous by default, like's strides with preserve", "[package]") {
  kjit::test::TempDir dir;
  std::string m = k_manifest;
  const std::string from = "outputs = [{ like = \"x\" }]";
  m.replace(m.find(from), from.size(),
            "outputs = [{ like = \"x\" }, { like = \"x\", layout = \"preserve\" }, "
            "{ like = \"x\", layout = \"contiguous\" }]");
  const std::string schema = "-> Tensor\"";
  m.replace(m.find(schema), schema.size(), "-> (Tensor, Tensor, Tensor)\"");
  const auto package = load(dir, m);
  const auto& outputs = package.op_specs().at(0)->outputs;
  REQUIRE(outputs.size() == 3);
  CHECK_FALSE(outputs[0].preserve_layout);
  CHECK(outputs[1].preserve_layout);
  CHECK_FALSE(outputs[2].preserve_layout);
}

TEST_CASE("every code point a manifest may hold is safe for toml++'s classifiers", "[package]") {
  // Exhaustive: under UBSan (scripts/dev sanitize) a code point reaching toml++'s unreachable
  // branches aborts this test.
  std::uint32_t accepted = 0;
  for (char32_t c = 0x80; c <= 0x10FFFF; ++c) {
    if (kjit::detail::manifest_code_point_ok(c)) {
      ++accepted;
      (void)toml::impl::is_non_ascii_horizontal_whitespace(c);
      (void)toml::impl::is_non_ascii_vertical_whitespace(c);
    }
  }
  CHECK(accepted > 1000000);
}

namespace {

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

} // namespace

TEST_CASE("torch's and kjit's namespaces are refused as package names", "[package][adversarial]") {
  kjit::test::TempDir dir;
  for (const char* name : {"aten", "prim", "torch", "kjit", "kjit_cpu", "_c10d_functional"}) {
    CHECK_THROWS_WITH(
      load(dir, replaced(k_manifest, "name = \"p\"", std::string("name = \"") + name + "\"")),
      Catch::Contains("reserved namespace") && Catch::Contains("package.name"));
  }
  CHECK_THROWS_WITH(
    load(dir, replaced(k_manifest, "name = \"p\"", "name = \"" + std::string(65, 'a') + "\"")),
    Catch::Contains("at most 64 characters"));
}

TEST_CASE("sources, include dirs and headers outside the package folder are refused",
          "[package][adversarial]") {
  kjit::test::TempDir outside;
  kjit::test::write_text(outside / "secret.cuh", "private key\n");
  kjit::test::write_text(outside / "k.cu", "__global__ void k() {}\n");
  kjit::test::TempDir dir;
  const std::string up = outside.path().string();
  CHECK_THROWS_WITH(
    load(dir, replaced(k_manifest, "source = \"k.cu\"", "source = \"" + up + "/k.cu\"")),
    Catch::Contains("kernel.k.source") && Catch::Contains("lies outside the package folder"));
  CHECK_THROWS_WITH(load(dir, replaced(k_manifest, "entry = \"k<{T}>\"",
                                       "entry = \"k<{T}>\"\ninclude_dirs = [\"..\"]")),
                    Catch::Contains("include dir") && Catch::Contains("lies outside"));
  // A header included by absolute path, and one reached through a symbolic link.
  kjit::test::write_text(dir / "kernel.toml", k_manifest);
  kjit::test::write_text(dir / "k.cu", "#include \"" + up + "/secret.cuh\"\n");
  CHECK_THROWS_WITH(kjit::Package::load(dir.path()),
                    Catch::Contains("header") && Catch::Contains("lies outside"));
  std::filesystem::create_symlink(outside / "secret.cuh", dir / "link.cuh");
  kjit::test::write_text(dir / "k.cu", "#include \"link.cuh\"\n");
  CHECK_THROWS_WITH(kjit::Package::load(dir.path()), Catch::Contains("lies outside"));
  std::filesystem::remove(dir / "link.cuh");
  std::filesystem::create_symlink(outside.path(), dir / "sub");
  kjit::test::write_text(dir / "k.cu", "__global__ void k() {}\n");
  CHECK_THROWS_WITH(load(dir, replaced(k_manifest, "source = \"k.cu\"", "source = \"sub/k.cu\"")),
                    Catch::Contains("lies outside"));
}

TEST_CASE("a package's programs carry its namespace as their store scope", "[package]") {
  kjit::test::TempDir dir;
  CHECK(load(dir, k_manifest).warm_list()[0].program.options().scope == "p");
  const auto v3 = load(dir, replaced(k_manifest, "1.2.3", "3.0.0"));
  CHECK(v3.scope() == "p_v3");
  CHECK(v3.warm_list()[0].program.options().scope == "p_v3");
}
