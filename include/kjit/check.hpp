// Checking a kernel package without a GPU: every specialization its warm lists name is
// compiled, and each launch's arguments are checked against the parameters of the kernel it
// launches, read from the compiled binary. A wrong manifest fails here, before it reaches a GPU.
//
//   kjit::Runtime runtime;
//   const auto problems = kjit::check_package(runtime, kjit::Package::load(dir), {target});
#pragma once

#include <kjit/package.hpp>
#include <kjit/runtime.hpp>

#include <string>
#include <vector>

namespace kjit {

struct CheckProblem {
  std::string op;
  std::string kernel; // the specialized kernel name (what the runtime is asked for)
  std::string target; // "sm_90"
  std::string what;   // one line: the argument, what the manifest passes, what the kernel takes
};

struct CheckReport {
  std::size_t checked = 0;            // (op, launch, specialization, target) checked
  std::size_t unreadable = 0;         // binaries that gave no parameters (PTX): compiled only
  std::vector<CheckProblem> problems; // compile errors and argument mismatches
  std::vector<WarmGap> gaps;          // kernels with placeholders that have no warm values
};

// Compiles (through `runtime`'s stores) and checks every launch of every op of `package` for
// each target. Cubin targets give the parameters; PTX targets are compiled only.
CheckReport check_package(Runtime& runtime, const Package& package,
                          const std::vector<Target>& targets);

} // namespace kjit
