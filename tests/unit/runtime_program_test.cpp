#include <kjit/error.hpp>
#include <kjit/program.hpp>

#include "support/test_support.hpp"

#include <catch2/catch.hpp>

using kjit::CompileOptions;
using kjit::Program;

TEST_CASE("options are canonical: spelling and independent order do not matter", "[program]") {
  Program a("k.cu", "", CompileOptions{.options = {"-D", "A=1", "--std=c++17", "-DB"}});
  Program b("k.cu", "", CompileOptions{.options = {"-DB", "-std=c++17", "--define-macro=A=1"}});
  CHECK(a.canonical_options() == b.canonical_options());
  CHECK(a.digest() == b.digest());
  CHECK(a.canonical_options() == std::vector<std::string>{"-DA=1", "-DB", "-std=c++17"});
}

TEST_CASE("the order of definitions of one macro is kept", "[program]") {
  Program a("k.cu", "", CompileOptions{.options = {"-DX=1", "-UX"}});
  Program b("k.cu", "", CompileOptions{.options = {"-UX", "-DX=1"}});
  CHECK(a.digest() != b.digest());
}

TEST_CASE("arch options are refused: the runtime picks the target", "[program]") {
  CHECK_THROWS_WITH(Program("k.cu", "", CompileOptions{.options = {"-arch=sm_90"}}),
                    Catch::Contains("the runtime chooses the target"));
  CHECK_THROWS_AS(Program("k.cu", "", CompileOptions{.options = {"--gpu-architecture", "x"}}),
                  kjit::Error);
  CHECK_THROWS_WITH(Program("k.cu", "", CompileOptions{.options = {"-D"}}),
                    Catch::Contains("needs a value"));
}

TEST_CASE("headers are found recursively, through cycles, and hashed by content", "[program]") {
  kjit::test::TempDir dir;
  kjit::test::write_text(dir / "main.cu", "#include \"a.cuh\"\n#include <cuda_fp16.h>\n");
  kjit::test::write_text(dir / "a.cuh", "#pragma once\n  #  include \"sub/b.cuh\"\n");
  kjit::test::write_text(dir / "sub/b.cuh", "#pragma once\n#include \"../a.cuh\"\nint b;\n");
  const auto first = Program::from_file(dir / "main.cu");
  REQUIRE(first.headers().size() == 2);
  CHECK(first.headers()[0].include_name == "a.cuh");
  CHECK(first.headers()[1].include_name == "sub/b.cuh");
  CHECK(first.name() == "main.cu");

  kjit::test::write_text(dir / "sub/b.cuh", "#pragma once\n#include \"../a.cuh\"\nint c;\n");
  const auto second = Program::from_file(dir / "main.cu");
  CHECK(first.digest() != second.digest());
}

TEST_CASE("include dirs are searched, and their paths do not enter the digest", "[program]") {
  kjit::test::TempDir one;
  kjit::test::TempDir two;
  for (const auto* dir : {&one, &two}) {
    kjit::test::write_text(*dir / "inc/common.cuh", "#define N 4\n");
  }
  const std::string source = "#include <common.cuh>\n";
  Program a("k.cu", source, CompileOptions{.include_dirs = {one / "inc"}});
  Program b("k.cu", source, CompileOptions{.options = {"-I" + (two / "inc").string()}});
  REQUIRE(a.headers().size() == 1);
  REQUIRE(b.headers().size() == 1);
  CHECK(a.digest() == b.digest());
}

TEST_CASE("every digest input changes the digest", "[program]") {
  const Program base("k.cu", "x",
                     CompileOptions{.options = {"-DA"}, .name_expressions = {"f<int>"}});
  CHECK(Program("j.cu", "x", base.options()).digest() != base.digest());
  CHECK(Program("k.cu", "y", base.options()).digest() != base.digest());
  CHECK(Program("k.cu", "x", CompileOptions{.options = {"-DB"}, .name_expressions = {"f<int>"}})
          .digest() != base.digest());
  CHECK(Program("k.cu", "x", CompileOptions{.options = {"-DA"}, .name_expressions = {"f<long>"}})
          .digest() != base.digest());
}

TEST_CASE("a missing source file is an error naming it", "[program]") {
  CHECK_THROWS_WITH(Program::from_file("/nonexistent/k.cu"),
                    Catch::Contains("cannot read kernel source '/nonexistent/k.cu'"));
}
