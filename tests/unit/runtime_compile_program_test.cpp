#include <kjit/error.hpp>
#include <kjit/program.hpp>

#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <sys/stat.h>

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
  REQUIRE(first.headers().size() == 3); // the includes, then the rest of the include dir
  CHECK(first.headers()[0].include_name == "a.cuh");
  CHECK(first.headers()[1].include_name == "sub/b.cuh");
  CHECK(first.headers()[2].include_name == "main.cu");
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

TEST_CASE("a header included through a macro enters the digest", "[program]") {
  kjit::test::TempDir dir;
  kjit::test::write_text(dir / "k.cu", "#define HEADER \"impl.cuh\"\n#include HEADER\n");
  kjit::test::write_text(dir / "impl.cuh", "int x = 1;\n");
  kjit::test::write_text(dir / "kernels.sqlite", "a shipped store");
  const auto before = Program::from_file(dir / "k.cu");
  kjit::test::write_text(dir / "impl.cuh", "int x = 2;\n");
  const auto after = Program::from_file(dir / "k.cu");
  CHECK(before.digest() != after.digest());
  // Files that are not headers do not: a package's own store lives beside its sources.
  kjit::test::write_text(dir / "kernels.sqlite", "another shipped store");
  kjit::test::write_text(dir / ".hidden.cuh", "hidden");
  CHECK(Program::from_file(dir / "k.cu").digest() == after.digest());
}

TEST_CASE("pre-included headers enter the digest; paths outside the include dirs are refused",
          "[program]") {
  kjit::test::TempDir dir;
  kjit::test::write_text(dir / "inc/pre.cuh", "#include \"deep.cuh\"\n");
  kjit::test::write_text(dir / "inc/deep.cuh", "int a;\n");
  const CompileOptions options{.options = {"-include", "pre.cuh"}, .include_dirs = {dir / "inc"}};
  const Program first("k.cu", "", options);
  CHECK(first.canonical_options() == std::vector<std::string>{"--pre-include=pre.cuh"});
  REQUIRE(first.headers().size() == 2);
  CHECK(first.headers()[0].include_name == "pre.cuh");
  CHECK(first.headers()[1].include_name == "deep.cuh");
  kjit::test::write_text(dir / "inc/deep.cuh", "int b;\n");
  CHECK(Program("k.cu", "", options).digest() != first.digest());
  for (const char* bad : {"--pre-include=/etc/hostname", "-include=../secret.h"}) {
    CHECK_THROWS_WITH(Program("k.cu", "", CompileOptions{.options = {bad}}),
                      Catch::Contains("not a path outside them"));
  }
}

TEST_CASE("sources that are not regular files are refused without blocking", "[program]") {
  kjit::test::TempDir dir;
  const auto fifo = dir / "k.cu";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(Program::from_file(fifo), Catch::Contains("not a regular file"));
  CHECK_THROWS_WITH(Program::from_file("/dev/zero"), Catch::Contains("not a regular file"));
  CHECK_THROWS_WITH(Program::from_file(dir.path()), Catch::Contains("not a regular file"));
}
