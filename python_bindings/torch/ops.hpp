// Kernel-package ops as torch ops: the CUDA path, on torch's stable ABI (Note [Stable ABI table]).
//
// Note [Op registration]: a package's schemas are defined from Python (torch.library, with the
// pt2_compliant tag), which also registers the fake kernels (symbolic shapes, from the manifest's
// parsed expressions), the CPU implementations and, where the manifest names one, the backward.
// The CUDA kernel of every op is registered here, as a boxed stable-ABI kernel: checks, outputs,
// specialization, launch on torch's current stream (with a device guard when the tensors are not
// on the current device), with no Python on the path. A stable boxed kernel is a bare function
// pointer that learns nothing of the op it serves, so each op gets one of a fixed pool of
// trampolines (`k_max_ops`), each reading its own slot. Ops without a backward have torch's
// autograd fallback (no per-call cost; a Python autograd kernel costs ~5 us a call); kjit turns the
// fallback's warning on backward into an error (kjit/_torch_layer.py), so such a backward fails
// naming the op.
//
// Note [Aliasing returns]: torch functionalizes (for torch.compile) custom ops that write their
// arguments only when no return aliases an argument. An op declared `f(Tensor(a!) x) -> Tensor(a!)`
// therefore gets a twin `_kjit_f(Tensor(a!) x) -> ()` (its new outputs, if any, stay): the CPU and
// CUDA kernels of both are kjit's, the twin's fake kernel makes the new outputs, and `f` also has a
// CompositeImplicitAutograd kernel (Python) that calls the twin and returns the arguments. Eager
// calls reach f's own kernels; tracing decomposes f into the twin, which torch functionalizes.
//
// Note [Backward ops]: an op with a `backward` (another op of the package) is differentiable. Its
// outputs may include hidden ones (saved for the backward, not returned, e.g. a norm's rstd), so
// the op has a twin `_kjit_f` with the same arguments that returns every output (kjit's CPU and
// CUDA kernels, a fake kernel, no autograd formula of its own). `f` has kjit's CPU and CUDA
// kernels and a fake kernel like any op, and an Autograd kernel (Python, kjit/_torch_layer.py):
// an autograd.Function whose forward calls the twin and saves what the backward's `args` name
// (the hidden outputs among them) and whose backward calls the backward op with them and the
// gradients of the returned outputs, made contiguous; where no gradient is needed it calls the
// twin alone, and under inference mode (no Autograd key) the call reaches f's CUDA kernel with
// no Python at all. (torch.library.register_autograd would add a second Python hop, a
// composite of f calling the twin, and a refill of the schema's defaults on every call.)
// Mutating ops cannot have a backward (torch refuses autograd of mutating custom ops).
#pragma once

#include <kjit/package.hpp>
#include <kjit/runtime.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kjit::torch_layer {

// The name of the twin of an op whose returns alias its arguments (Note [Aliasing returns]).
inline std::string twin_name(const std::string& op) {
  return "_kjit_" + op;
}

// Resolves torch's stable C ABI (Note [Stable ABI table]): `libtorch_cpu` must be loaded (by
// `import torch`); `libtorch_cuda` may be absent (a CPU-only torch). Throws kjit::Error.
void attach(const std::string& libtorch_cpu, const std::string& libtorch_cuda);

// The runtime the torch layer compiles with (default options, created at first use).
Runtime& runtime();

// Throws kjit::Error when an op of `package` exceeds what the CUDA path supports (arguments,
// specialization placeholders) or the trampoline pool is full. No torch needed.
void check_package(const Package& package);

// Registers the CUDA kernels of `package`'s ops under `torch.ops.<ns>` (its schemas must be
// defined). Needs `attach` (abi.hpp). Registrations live for the process.
void register_cuda(const Package& package, const std::string& ns);

// Note [Tuning]: how the CUDA kernels of op `ns::name` (and its twin) pick their tune parameters
// from now on: "tuned" (per bucket, the default), "default" (the package's rule) or "fixed"
// (`values`, one per parameter, for every call). Throws kjit::Error for an op that is not
// registered, has no tune parameters, or a wrong number of values.
void set_tune_mode(const std::string& ns, const std::string& name, const std::string& mode,
                   const std::vector<std::int64_t>& values);

// Forgets the tuned configurations this process holds for `ns::name` (the stores keep theirs).
void forget_tuned(const std::string& ns, const std::string& name);

} // namespace kjit::torch_layer
