// A CUDA program to compile: source, options, include dirs and template instantiations.
//
// **Example**
//
//   auto program = kjit::Program::from_file("kernels_src/img2gray/img2gray.cu");
//   kjit::Program scale("scale.cu", R"(
//     template <typename T> __global__ void scale(T* x, T a, int n) {
//       int i = blockIdx.x * blockDim.x + threadIdx.x;
//       if (i < n) x[i] *= a;
//     })", {.name_expressions = {"scale<float>"}});
//
// A `Program` is immutable: its content digest (source, the content of every header it includes
// from its include dirs, canonical options, name expressions) is computed once, when it is made.
// Headers edited after that are seen by a new `Program`, not by this one.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kjit {

// How to compile a program. Arch flags are not options: the target is chosen by the `Runtime`.
struct CompileOptions {
  // NVRTC options, e.g. "-DBLOCK=256", "-std=c++17", "--use_fast_math". Two-word forms ("-D", "X")
  // are accepted.
  std::vector<std::string> options;
  // Directories searched for `#include "..."` and `#include <...>`, in order. Their headers enter
  // the cache key by content, not by path.
  std::vector<std::filesystem::path> include_dirs;
  // Template instantiations to compile, e.g. "scale<float>"; a kernel is then asked for by the
  // same expression.
  std::vector<std::string> name_expressions;
};

// One header a program includes, as found when the program was made.
struct Header {
  std::string include_name;   // as written in the #include, e.g. "common.cuh"
  std::filesystem::path path; // where it was found
  std::string content;
};

// An immutable CUDA source program; cheap to copy (shared).
class Program {
public:
  // A program from a source string. `name` is the file name NVRTC reports in its log.
  Program(std::string name, std::string source, CompileOptions options = {});

  // Reads `path`; its folder is searched first for includes. The program's name is the file
  // name (no directories, so the key is the same on every machine). Throws `kjit::Error` when the
  // file cannot be read.
  static Program from_file(const std::filesystem::path& path, CompileOptions options = {});

  const std::string& name() const noexcept;
  const std::string& source() const noexcept;
  const CompileOptions& options() const noexcept;
  // The options in canonical form (normalized spelling, a stable order), as hashed.
  const std::vector<std::string>& canonical_options() const noexcept;
  // Every header found through the include dirs, recursively, in discovery order.
  const std::vector<Header>& headers() const noexcept;
  // XXH3-128 digest of everything above that changes the binary.
  std::array<std::uint64_t, 2> digest() const noexcept;

private:
  struct Impl;
  std::shared_ptr<const Impl> m_impl;
};

} // namespace kjit
