#include <kjit/error.hpp>
#include <kjit/runtime.hpp>

#include "runtime/compile/nvrtc_compiler.hpp"
#include "runtime/cuda/nvrtc.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

namespace fs = std::filesystem;

namespace {

void touch(const fs::path& path, const std::string& content = "x") {
  fs::create_directories(path.parent_path());
  kjit::test::write_text(path, content);
}

} // namespace

TEST_CASE("a toolkit's NVRTC is given the toolkit's include and include/cccl", "[nvrtc]") {
  kjit::test::TempDir dir;
  const fs::path root = dir.path() / "cuda-13.0";
  touch(root / "lib64/libnvrtc.so.13");
  touch(root / "include/cuda_fp16.h");
  fs::create_directories(root / "include/cccl/cuda/std");
  const auto dirs = kjit::detail::cuda_include_dirs_for((root / "lib64/libnvrtc.so.13").string());
  REQUIRE(dirs.size() == 2);
  CHECK(dirs[0] == (root / "include").string());
  CHECK(dirs[1] == (root / "include/cccl").string());
}

TEST_CASE("a CUDA 13 wheel's NVRTC is given nvidia/cu13/include, and cccl when installed",
          "[nvrtc]") {
  kjit::test::TempDir dir;
  const fs::path cu13 = dir.path() / "site-packages/nvidia/cu13";
  touch(cu13 / "lib/libnvrtc.so.13");
  touch(cu13 / "include/cuda_fp16.h");
  const auto library = (cu13 / "lib/libnvrtc.so.13").string();
  CHECK(kjit::detail::cuda_include_dirs_for(library) ==
        std::vector<std::string>{(cu13 / "include").string()});
  fs::create_directories(cu13 / "include/cccl/cuda/std"); // pip install nvidia-cuda-cccl
  CHECK(kjit::detail::cuda_include_dirs_for(library) ==
        std::vector<std::string>{(cu13 / "include").string(), (cu13 / "include/cccl").string()});
}

TEST_CASE("a CUDA 12 wheel's NVRTC is given the headers of its sibling wheels", "[nvrtc]") {
  kjit::test::TempDir dir;
  const fs::path nvidia = dir.path() / "site-packages/nvidia";
  touch(nvidia / "cuda_nvrtc/lib/libnvrtc.so.12");
  touch(nvidia / "cuda_nvrtc/include/nvrtc.h");
  touch(nvidia / "cuda_runtime/include/cuda_fp16.h");
  touch(nvidia / "cuda_cccl/include/cuda/std/type_traits");
  const auto dirs =
    kjit::detail::cuda_include_dirs_for((nvidia / "cuda_nvrtc/lib/libnvrtc.so.12").string());
  CHECK(dirs == std::vector<std::string>{(nvidia / "cuda_runtime/include").string(),
                                         (nvidia / "cuda_cccl/include").string(),
                                         (nvidia / "cuda_nvrtc/include").string()});
}

TEST_CASE("an NVRTC with no headers beside it gets none (NVRTC's built-in headers only)",
          "[nvrtc]") {
  kjit::test::TempDir dir;
  touch(dir.path() / "lib/libnvrtc.so.13");
  CHECK(kjit::detail::cuda_include_dirs_for((dir.path() / "lib/libnvrtc.so.13").string()).empty());
}

TEST_CASE("the CUDA headers' identity follows their versions, not their folder", "[nvrtc]") {
  kjit::test::TempDir a;
  kjit::test::TempDir b;
  for (const auto* dir : {&a, &b}) {
    touch(dir->path() / "include/cuda_fp16.hpp", "fp16 of 13.0");
    touch(dir->path() / "include/cccl/cuda/std/__cccl/version.h", "#define CCCL_VERSION 3000000");
  }
  auto dirs = [](const kjit::test::TempDir& d) {
    return std::vector<std::string>{(d.path() / "include").string(),
                                    (d.path() / "include/cccl").string()};
  };
  const auto digest = kjit::detail::cuda_headers_digest(dirs(a));
  CHECK(digest == kjit::detail::cuda_headers_digest(dirs(b))); // stores move between machines

  touch(b.path() / "include/cccl/cuda/std/__cccl/version.h", "#define CCCL_VERSION 3010000");
  CHECK(kjit::detail::cuda_headers_digest(dirs(b)) != digest); // another CCCL
  touch(b.path() / "include/cccl/cuda/std/__cccl/version.h", "#define CCCL_VERSION 3000000");
  CHECK(kjit::detail::cuda_headers_digest(dirs(b)) == digest);
  touch(b.path() / "include/cuda_fp16.hpp", "fp16 of 13.1, longer");
  CHECK(kjit::detail::cuda_headers_digest(dirs(b)) != digest); // another CUDA's headers
  CHECK(kjit::detail::cuda_headers_digest({}) != digest);      // none at all
}

TEST_CASE("kjit::nvrtc_info says which NVRTC was loaded, from where and with which headers",
          "[nvrtc]") {
  const kjit::NvrtcInfo info = kjit::nvrtc_info();
  REQUIRE(info.found); // the unit tests compile: this machine has an NVRTC
  CHECK(info.error.empty());
  CHECK(fs::path(info.library).is_absolute());
  CHECK(fs::path(info.library).filename().string().starts_with("libnvrtc.so."));
  CHECK_FALSE(info.how.empty());
  CHECK(info.major >= 12);
  CHECK(kjit::nvrtc_version() == std::pair<int, int>{info.major, info.minor});
  for (const auto& dir : info.include_dirs) {
    CHECK(fs::is_directory(dir));
  }
}

namespace {
std::vector<std::string> g_seen_options;
} // namespace

TEST_CASE("an NVRTC older than 12.8 (no PCH entry point) is never asked for -pch", "[nvrtc]") {
  kjit::detail::NvrtcApi table = kjit::detail::nvrtc();
  table.nvrtcGetPCHCreateStatus = nullptr;
  static const kjit::detail::NvrtcApi* real = &kjit::detail::nvrtc();
  table.nvrtcCompileProgram = [](nvrtcProgram program, int count, const char* const* options) {
    g_seen_options.assign(options, options + count);
    return real->nvrtcCompileProgram(program, count, options);
  };
  kjit::detail::NvrtcOverride injected(table);
  kjit::detail::CompileRequest request;
  request.name = "k.cu";
  request.source = "extern \"C\" __global__ void k(int* x) { *x = 1; }";
  request.target = kjit::Target{kjit::Arch{9, 0}, kjit::OutputKind::cubin};
  request.auto_pch = true;
  const auto result = kjit::detail::nvrtc_compile(request);
  CHECK_FALSE(result.binary.empty());
  CHECK_FALSE(result.pch_created);
  CHECK(std::find(g_seen_options.begin(), g_seen_options.end(), "-pch") == g_seen_options.end());
}

TEST_CASE("a store hit in a new process does not load NVRTC; a new NVRTC file does", "[nvrtc]") {
  kjit::test::TempDir dir;
  const auto source = (dir.path() / "k.cu").string();
  kjit::test::write_text(source, "extern \"C\" __global__ void k(int* x) { *x = 7; }\n");
  const auto cache = (dir.path() / "cache").string();
  auto run = [&](const std::vector<std::string>& env = {}) {
    return kjit::test::run_process({kjit::test::helper_path(), "compile", cache, source, "sm_90"},
                                   env);
  };
  const auto first = run();
  REQUIRE(first.exit_code == 0);
  CHECK(first.values.at("compiles") == "1");
  CHECK(first.values.at("nvrtc_mapped") == "1");
  const auto second = run();
  REQUIRE(second.exit_code == 0);
  CHECK(second.values.at("store_hits") == "1");
  CHECK(second.values.at("key") == first.values.at("key"));
  CHECK(second.values.at("nvrtc_mapped") == "0"); // its version came from the store
  // Another NVRTC file (a copy elsewhere): not remembered, so it is loaded once.
  const auto info = kjit::nvrtc_info();
  const auto copy = dir.path() / "nvrtc-copy" / fs::path(info.library).filename();
  fs::create_directories(copy.parent_path());
  fs::copy_file(info.library, copy);
  const auto third = run({"KJIT_NVRTC_LIBRARY=" + copy.string()});
  REQUIRE(third.exit_code == 0);
  CHECK(third.values.at("nvrtc_mapped") == "1"); // a file it has not seen: loaded once
  // No CUDA headers beside the copy: another header identity, so another key (Note [CUDA headers]).
  CHECK(third.values.at("compiles") == "1");
  CHECK(third.values.at("key") != first.values.at("key"));
}
