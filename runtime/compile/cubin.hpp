// The parameters of a kernel, read from a cubin (an ELF file) without a driver: what
// cuKernelGetParamInfo would answer after loading it, for checks on a machine with no GPU.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

namespace kjit::detail {

struct KernelParam {
  std::size_t offset = 0; // in the parameter buffer
  std::size_t size = 0;   // bytes
};

// The parameters of kernel `mangled` (its symbol, the lowered name for templates) in order,
// from the EIATTR_KPARAM_INFO records of its `.nv.info.<name>` section. Nothing when `cubin` is
// not an ELF cubin (PTX, say) or has no such kernel; a kernel without parameters gives an empty
// list.
std::optional<std::vector<KernelParam>> cubin_kernel_params(std::string_view cubin,
                                                            std::string_view mangled);

} // namespace kjit::detail
