#include <kjit/error.hpp>
#include <kjit/runtime.hpp>

#include "runtime/compile/nvrtc_compiler.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

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

TEST_CASE("a CCCL header that is not found is a compile error with a hint", "[nvrtc]") {
  kjit::Runtime runtime(memory_only());
  kjit::Program program("k.cu", "#include <cuda/std/no_such_header>\n__global__ void k() {}\n");
  try {
    runtime.compile(program, k_sm90);
    FAIL("expected a CompileError");
  } catch (const kjit::CompileError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("cuda/std/no_such_header") &&
                                        Catch::Contains("hint: CUDA's C++ library headers (CCCL") &&
                                        Catch::Contains("pip install 'kjit[cccl]'"));
  }
  // Any other missing header has no such hint.
  kjit::Program other("k.cu", "#include <no_such_header.h>\n__global__ void k() {}\n");
  try {
    runtime.compile(other, k_sm90);
    FAIL("expected a CompileError");
  } catch (const kjit::CompileError& e) {
    CHECK_THAT(std::string(e.what()), !Catch::Contains("hint:"));
  }
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

namespace {

// A program that starts with headers worth precompiling; `salt` makes each one a new program.
kjit::detail::CompileRequest header_heavy(int salt, bool auto_pch) {
  kjit::detail::CompileRequest request;
  request.name = "heavy.cu";
  request.source = fmt::format(R"(#include <cuda_fp16.h>
#include <cuda/std/type_traits>
#include <cuda/std/limits>
#include <cuda/std/array>

template <typename T> __global__ void heavy(T* x, int n) {{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  cuda::std::array<float, 2> bias{{{}.0f, 1.0f}};
  if (i < n) {{
    x[i] = T(float(x[i]) * bias[0] + cuda::std::numeric_limits<float>::epsilon());
  }}
}}
template __global__ void heavy<__half>(__half*, int);
)",
                               salt);
  request.options = {"-std=c++17"};
  request.target = k_sm90;
  request.auto_pch = auto_pch;
  return request;
}

// The positions where two cubins differ, each checked to lie inside an internal-linkage name
// ("_INTERNAL_<file id>_..."): NVRTC gives those a per-compile unique id.
void require_same_code(const std::string& a, const std::string& b) {
  REQUIRE(a.size() == b.size());
  std::size_t differing = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) {
      continue;
    }
    ++differing;
    const auto name = a.rfind("_INTERNAL_", i);
    INFO("byte " << i << " differs");
    REQUIRE(name != std::string::npos);
    REQUIRE(i - name < 48);
    REQUIRE(a.find('\0', name) > i);
  }
  CHECK(differing < a.size() / 100);
}

} // namespace

TEST_CASE("precompiled headers: made by the first compile, used by the next, change no code",
          "[nvrtc]") {
  // Without PCH, twice: shows what differs between two compiles of the same program.
  const auto plain = kjit::detail::nvrtc_compile(header_heavy(1, false));
  const auto plain_again = kjit::detail::nvrtc_compile(header_heavy(1, false));
  CHECK_FALSE(plain.pch_created);
  require_same_code(plain.binary, plain_again.binary);

  // With PCH: another program with the same leading includes creates it (unless an earlier
  // test of this process already did), then the program above compiles from it.
  const auto first = kjit::detail::nvrtc_compile(header_heavy(2, true));
  CHECK(first.pch_created);
  const auto with_pch = kjit::detail::nvrtc_compile(header_heavy(1, true));
  CHECK_FALSE(with_pch.pch_created); // it used the existing one
  CHECK(with_pch.log.empty());       // and said nothing about it
  require_same_code(plain.binary, with_pch.binary);
  CHECK(with_pch.lowered_names == plain.lowered_names);
}

TEST_CASE("a user's own PCH options replace the automatic ones", "[nvrtc]") {
  auto request = header_heavy(3, true);
  request.options.push_back("--pch-messages=true");
  // `--pch-messages` alone asks for no PCH: no automatic `-pch` was added, so none is created.
  const auto result = kjit::detail::nvrtc_compile(request);
  CHECK_FALSE(result.pch_created);
}
