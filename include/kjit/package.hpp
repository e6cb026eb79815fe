// Kernel packages: a folder with a `kernel.toml` manifest and CUDA sources.
//
// **Example**
//
//   kjit::Package package = kjit::Package::load("kernels_src/img2gray");
//   for (const auto& op : package.ops()) {
//     std::cout << op.schema << "\n";          // "img2gray(Tensor image) -> Tensor"
//   }
//   for (const auto& item : package.warm_list()) {
//     runtime.compile(item.program, kjit::Target{kjit::Arch::parse("sm_90")});
//   }
//
// The manifest (see kernels_src/*/kernel.toml and ARCHITECTURE.md, "Kernel packages"):
//
//   [package]        name, version (semver), description
//   [kernel.NAME]    source, entry ("f" or a template "f<{T}>"), options, include_dirs
//   [op.NAME]        schema, kernel, checks, outputs, args, grid, block, shared_mem,
//                    specialize ({T = "x.dtype"}), warm ({T = ["float16", ...]}), cpu, doc,
//                    workspaces, strings, [[op.NAME.launch]] tables, backward
//
// Every expression is parsed when the package loads; a mistake is a `ManifestError` naming the
// file, the table and key, the line and the column.
#pragma once

#include <kjit/program.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kjit {

namespace detail {
struct OpSpec;
} // namespace detail

struct KernelDecl {
  std::string name;
  std::filesystem::path source; // absolute
  std::string entry;            // may hold placeholders: "scale<{T}>"
  std::vector<std::string> options;
  std::vector<std::filesystem::path> include_dirs; // absolute
};

struct OutputDecl {
  std::vector<std::string> shape; // size expressions, or empty with `like`
  bool has_shape = false;         // `shape` given (`shape = []`: a 0-dim tensor, e.g. a loss)
  std::string like;               // a tensor argument whose shape to copy
  std::vector<std::pair<std::int64_t, std::string>> dims; // with `like`: dims replaced
  std::string dtype;                                      // a dtype expression; default like's
  bool hidden = false; // made and saved for the backward, not returned (after the returned ones)
  // layout = "preserve" (with `like`, no `dims`): the output takes like's strides where like is
  // non-overlapping and dense, as torch.empty_like does (a transposed view stays transposed);
  // else, and by default, it is contiguous.
  bool preserve_layout = false;
};

// A temporary tensor of one call (not returned), passed to launches by name.
struct WorkspaceDecl {
  std::string name;
  std::vector<std::string> shape; // size expressions
  std::string dtype;              // a dtype expression
  bool zero = false;              // cleared before the first launch
};

// One kernel launch of an op; an op makes its launches in order, on one stream.
struct LaunchDecl {
  std::string kernel;
  std::string when; // a bool expression: the launch is skipped when false; empty: always
  std::vector<std::string> args;
  std::vector<std::string> grid;
  std::vector<std::string> block;
  std::string shared_mem = "0";
  std::vector<std::pair<std::string, std::string>> specialize; // placeholder -> expr
};

// The backward of a differentiable op: another op of the package, called with `args` (names of
// the forward's arguments, its outputs out0.. (hidden ones too) and the gradients of its returned
// outputs grad_out0..), whose returns are the gradients of the arguments in `gradients`.
struct BackwardDecl {
  std::string op;
  std::vector<std::string> args;
  std::vector<std::string> gradients;
};

struct OpDecl {
  std::string name;
  std::string schema;
  std::string doc;
  std::vector<std::string> checks;
  std::vector<OutputDecl> outputs;
  std::vector<WorkspaceDecl> workspaces;
  std::vector<LaunchDecl> launches; // `[[op.NAME.launch]]`, or the op's own kernel/args/grid keys
  // `warm`: placeholder -> values. One table, or several (`warm = [{...}, {...}]`): the warm
  // list is the union of their cartesian products (say, float32 with VEC 4, 16-bit types with
  // VEC 8, instead of every dtype with every width).
  using WarmTable = std::vector<std::pair<std::string, std::vector<std::string>>>;
  std::vector<WarmTable> warm;
  // str arguments: argument -> (string -> the integer expressions see)
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::int64_t>>>> strings;
  std::string cpu; // a function of the package's __init__.py, or empty
  std::optional<BackwardDecl> backward;
  // Tunable launch parameters (`tune = { BLOCK = [128, 256], ... }`): integer names that the
  // launches' grid, block, shared memory, args, specializations and `when` may use; `tune_valid`
  // prunes candidates, `tune_key` buckets calls, `tune_default` is the configuration used where
  // no tuned one is known (expressions of the arguments).
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> tune;
  std::string tune_valid;
  std::vector<std::string> tune_key;
  std::vector<std::pair<std::string, std::string>> tune_default;
};

// A program and kernel name to compile ahead of time.
struct WarmItem {
  std::string op;
  Program program;
  std::string kernel;     // the name to ask the runtime for (a name expression for templates)
  std::size_t launch = 0; // which of the op's launches
};

// A kernel of an op that `warm_list` cannot pre-compile: a specialization placeholder with no
// warm values (and no default from the op's dtype checks).
struct WarmGap {
  std::string op;
  std::string kernel;             // the kernel's declared name
  std::vector<std::string> needs; // the placeholders without values
  std::string fix;                // what to add to the manifest
};

// Op namespaces no package may take: torch's own ("aten", "prim", "torch", ...) and kjit's.
const std::vector<std::string>& reserved_namespaces();

class Package {
public:
  // Loads `path` (a package folder or its kernel.toml). Throws `ManifestError`, also when the
  // name is a reserved namespace, or when a source, an include dir or a header that a source
  // includes lies outside the package folder (symbolic links resolved).
  static Package load(const std::filesystem::path& path);

  const std::string& name() const noexcept;
  // The op namespace of this package: its name for major versions 0 and 1, `NAME_vN` after. It is
  // also the scope of its programs (`CompileOptions::scope`), so its shipped store serves it alone.
  const std::string& scope() const noexcept;
  const std::string& version() const noexcept;
  const std::string& description() const noexcept;
  const std::filesystem::path& dir() const noexcept;
  const std::filesystem::path& manifest() const noexcept;
  const std::vector<KernelDecl>& kernels() const noexcept;
  const std::vector<OpDecl>& ops() const noexcept;

  const KernelDecl& kernel(std::string_view name) const;

  // The program of kernel `kernel` with its entry specialized by `values` (placeholder ->
  // C++ text, e.g. {"T", "__half"}), and the name to ask for. Throws `ManifestError` when a
  // placeholder has no value.
  std::pair<Program, std::string>
  specialize(const KernelDecl& kernel,
             const std::vector<std::pair<std::string, std::string>>& values) const;

  // Every (op, specialization) the manifest asks to pre-warm: each op's `warm` values, or the one
  // program of an op that has no placeholders. A placeholder without warm values whose
  // specialization is a tensor's dtype (`T = "x.dtype"`) takes the dtypes the op's checks
  // compare that tensor with (`x.dtype == float16 || ...`). A program that several ops or
  // launches share is listed once, unless `every_launch` (one item per op, launch and
  // specialization: what `kjit check` checks).
  std::vector<WarmItem> warm_list(bool every_launch = false) const;

  // The kernels warm_list leaves out, with why and the fix (empty when it leaves none out).
  std::vector<WarmGap> warm_gaps() const;

  // Internal: the parsed specs of the ops, in `ops()` order.
  const std::vector<std::shared_ptr<const detail::OpSpec>>& op_specs() const noexcept;

private:
  // The program of `kernel` asking for `entry` (its specialized entry).
  Program program(const KernelDecl& kernel, const std::string& entry) const;

  struct Impl;
  std::shared_ptr<const Impl> m_impl;
};

} // namespace kjit
