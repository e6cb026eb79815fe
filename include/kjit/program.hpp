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
// A `Program` is immutable: its content digest (source, the content of every header-like file of
// its include dirs, canonical options, name expressions) is computed once, when it is made.
// Header-like: a C, C++ or CUDA extension (.h, .cuh, .cu, .inc, ...) or none; hidden files and
// folders are skipped. An include dir may hold at most 4096 such files of 64 MiB in all (give
// kernels a folder of their own).
// `-include`/`--pre-include` files found in the include dirs enter the key like headers; one given
// by an absolute path is refused.
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

// Where a program comes from: recorded with its cache entries (`kjit cache ls --package`,
// `kjit cache why`), never part of the cache key. `Package::specialize` sets it; empty for a
// program made by hand.
struct ProgramOrigin {
  std::string package;
  std::string version;
  std::string kernel;           // the kernel's name in the manifest
  std::vector<std::string> ops; // the ops that launch that kernel
  std::string specialization;   // the entry compiled, e.g. "rms_norm_fwd<float, 256, 4>"
  bool empty() const noexcept { return package.empty() && kernel.empty(); }
  bool operator==(const ProgramOrigin&) const = default;
};

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
  // Which scoped read-only stores may serve this program (a package's op namespace; see
  // `Cache::add_read_only_path`). Not part of the cache key.
  std::string scope;
  // Recorded with the program's cache entries; not part of the cache key.
  ProgramOrigin origin;
};

// One header a program includes, or a header-like file of its include dirs, as found when the
// program was made. All of them enter the key: NVRTC can reach any of them, also through an
// `#include` whose name is a macro.
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
  // Every header found through the include dirs (recursively, in discovery order), then every
  // other file of the include dirs (include name relative to its dir).
  const std::vector<Header>& headers() const noexcept;
  // XXH3-128 digest of everything above that changes the binary.
  std::array<std::uint64_t, 2> digest() const noexcept;

private:
  struct Impl;
  std::shared_ptr<const Impl> m_impl;
};

} // namespace kjit
