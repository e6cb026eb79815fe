#include <kjit/error.hpp>
#include <kjit/runtime.hpp>

#include "runtime/nvrtc_compiler.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

namespace {

kjit::RuntimeOptions memory_only() {
  return kjit::RuntimeOptions{.disable_cache = true};
}

const kjit::Target k_sm90{kjit::Arch{9, 0}, kjit::OutputKind::cubin};

} // namespace

TEST_CASE("a kernel compiles to an ELF cubin without a GPU", "[nvrtc]") {
  kjit::Runtime runtime(memory_only());
  const auto program =
    kjit::Program::from_file(kjit::test::source_dir() / "kernels_src/img2gray/img2gray.cu");
  const auto binary = runtime.compile(program, k_sm90);
  REQUIRE(binary.data.size() > 4);
  CHECK(binary.data.substr(0, 4) == "\x7f"
                                    "ELF");
  CHECK(binary.compile_ms > 0);
  CHECK(binary.key.size() == 32);
  CHECK(runtime.stats().compiles == 1);
}

TEST_CASE("PTX output for a virtual arch", "[nvrtc]") {
  kjit::Runtime runtime(memory_only());
  kjit::Program program("k.cu", "extern \"C\" __global__ void k(int* x) { *x = 1; }");
  const auto ptx = runtime.compile(program, kjit::Target{kjit::Arch{9, 0}, kjit::OutputKind::ptx});
  CHECK(ptx.data.find(".target sm_90") != std::string::npos);
  CHECK(ptx.data.find(".entry k(") != std::string::npos);
}

TEST_CASE("a compile error carries the log naming the line, the options and the arch", "[nvrtc]") {
  kjit::Runtime runtime(memory_only());
  kjit::Program program("broken.cu",
                        "__global__ void k() {\n  int x = 1;\n  undefined_thing(x);\n}\n",
                        {.options = {"-DFOO=1"}});
  try {
    runtime.compile(program, k_sm90);
    FAIL("expected a CompileError");
  } catch (const kjit::CompileError& e) {
    CHECK(e.result_name() == "NVRTC_ERROR_COMPILATION");
    CHECK_THAT(e.log(), Catch::Contains("broken.cu(3)") && Catch::Contains("undefined_thing"));
    CHECK(e.arch() == "sm_90");
    CHECK(e.program_name() == "broken.cu");
    CHECK(std::find(e.options().begin(), e.options().end(), "-DFOO=1") != e.options().end());
    CHECK_THAT(std::string(e.what()), Catch::Contains("cannot compile 'broken.cu' for sm_90") &&
                                        Catch::Contains("broken.cu(3)"));
  }
  // A failed compile is not memoized: it is tried again (and fails again).
  CHECK_THROWS_AS(runtime.compile(program, k_sm90), kjit::CompileError);
  CHECK(runtime.stats().compiles == 0);
}

TEST_CASE("templates: name expressions give lowered names stored with the binary", "[nvrtc]") {
  kjit::Runtime runtime(memory_only());
  kjit::Program program("scale.cu", R"(
    template <typename T> __global__ void scale(T* x, T a, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) x[i] *= a;
    })",
                        {.name_expressions = {"scale<float>", "scale<double>"}});
  const auto binary = runtime.compile(program, k_sm90);
  REQUIRE(binary.lowered_names.size() == 2);
  CHECK(binary.lowered_names[0].first == "scale<float>");
  CHECK(binary.lowered_names[0].second == "_Z5scaleIfEvPT_S0_i");
  CHECK(binary.lowered_names[1].second == "_Z5scaleIdEvPT_S0_i");
}

TEST_CASE("a missing header is a compile error naming it", "[nvrtc]") {
  kjit::Runtime runtime(memory_only());
  kjit::Program program("k.cu", "#include \"not_there.cuh\"\n__global__ void k() {}\n");
  CHECK_THROWS_WITH(runtime.compile(program, k_sm90), Catch::Contains("not_there.cuh"));
}

TEST_CASE("headers from include dirs compile from the content that was hashed", "[nvrtc]") {
  kjit::test::TempDir dir;
  kjit::test::write_text(dir / "inc/value.cuh", "#define VALUE 7\n");
  kjit::Runtime runtime(memory_only());
  kjit::Program program("k.cu",
                        "#include <value.cuh>\nextern \"C\" __global__ void k(int* x) { *x = "
                        "VALUE; }\n",
                        {.include_dirs = {dir / "inc"}});
  kjit::test::write_text(dir / "inc/value.cuh", "#error edited after hashing\n");
  CHECK_NOTHROW(runtime.compile(program, k_sm90));
}

TEST_CASE("an NVRTC failure before compiling is a CompileError naming the call", "[nvrtc]") {
  kjit::detail::NvrtcApi table = kjit::detail::nvrtc();
  table.nvrtcCreateProgram = [](nvrtcProgram*, const char*, const char*, int, const char* const*,
                                const char* const*) { return NVRTC_ERROR_OUT_OF_MEMORY; };
  kjit::detail::NvrtcOverride injected(table);
  kjit::Runtime runtime(memory_only());
  try {
    runtime.compile(kjit::Program("k.cu", "__global__ void k() {}"), k_sm90);
    FAIL("expected a CompileError");
  } catch (const kjit::CompileError& e) {
    CHECK(e.result_name() == "NVRTC_ERROR_OUT_OF_MEMORY");
    CHECK_THAT(std::string(e.what()), Catch::Contains("nvrtcCreateProgram"));
  }
}
