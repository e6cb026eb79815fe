// Kernel-package ops as torch ops, registered with the dispatcher at run time.
//
// Note [Op registration]: a package's ops live in a `torch::Library` (DEF) for the package's
// namespace, kept for the life of the process. Each op gets boxed functors for CUDA (checks,
// outputs, specialization, launch on torch's current stream under a device guard), Meta (outputs
// from the same spec with symbolic sizes, for torch.compile) and CPU (checks, then the package's
// Python function registered on a hidden op `<ns>::kjit_cpu_<op>`), and torch's
// autograd-not-implemented fallback, so a backward through a kjit op is an error, never a silent
// zero gradient. No Python runs on the CUDA path.
#pragma once

#include <kjit/package.hpp>
#include <kjit/runtime.hpp>

#include <string>
#include <vector>

namespace kjit::torch_layer {

// The runtime the torch layer compiles with (default options, created at first use).
Runtime& runtime();

// Registers the ops of `package` under `torch.ops.<ns>` (once per manifest; the namespace must be
// free). Returns the names of the hidden CPU ops to implement from Python, as (op, hidden op)
// pairs.
std::vector<std::pair<std::string, std::string>> register_package(const Package& package,
                                                                  const std::string& ns);

} // namespace kjit::torch_layer
