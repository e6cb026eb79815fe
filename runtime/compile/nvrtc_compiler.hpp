// NVRTC: CUDA source to cubin or PTX for one target. Needs no GPU and no driver.
//
#pragma once

#include <kjit/arch.hpp>

#include "runtime/cuda/nvrtc.hpp"

#include <string>
#include <utility>
#include <vector>

namespace kjit::detail {

// `nvrtcGetSupportedArchs` of the loaded NVRTC, ascending (e.g. 75, 80, ..., 120).
const std::vector<int>& nvrtc_supported_arch_numbers();

// The target for a device of `device_arch` given an NVRTC's supported archs and version: its cubin,
// or PTX of the newest arch below it for a device newer than NVRTC (kjit::target_for_device).
Target target_for_device(Arch device_arch, const std::vector<int>& supported,
                         std::pair<int, int> nvrtc_version);

// The include dirs of CUDA's headers that NVRTC is given (cuda_fp16.h, cuda/std/...): those of
// the root NVRTC was loaded from (Note [CUDA headers]).
const std::vector<std::string>& toolkit_include_dirs();

// Owning `nvrtcProgram`; destroys on destruction. Move-only.
class UniqueProgram {
public:
  UniqueProgram() = default;
  explicit UniqueProgram(nvrtcProgram program) noexcept : m_program(program) {}
  ~UniqueProgram();
  UniqueProgram(UniqueProgram&& other) noexcept : m_program(other.release()) {}
  UniqueProgram& operator=(UniqueProgram&& other) noexcept;
  UniqueProgram(const UniqueProgram&) = delete;
  UniqueProgram& operator=(const UniqueProgram&) = delete;
  nvrtcProgram get() const noexcept { return m_program; }
  nvrtcProgram release() noexcept { return std::exchange(m_program, nullptr); }

private:
  nvrtcProgram m_program = nullptr;
};

// Whether compiles ask NVRTC for automatic precompiled headers: on unless KJIT_NVRTC_PCH=0.
bool nvrtc_pch_enabled();

// Whether the PCH folder's file system ($TMPDIR, else /tmp) has the 1 GiB free that compiles
// with PCH need there (said once at info where it has not).
bool pch_has_room();

struct CompileRequest {
  std::string name;
  std::string source;
  std::vector<std::pair<std::string, std::string>> headers; // include name -> content
  std::vector<std::string> options;                         // user options, canonical
  std::vector<std::string> include_dirs;
  std::vector<std::string> name_expressions;
  Target target;
  bool auto_pch = nvrtc_pch_enabled(); // Note [Precompiled headers]
};

struct CompileResult {
  std::string binary;
  std::vector<std::pair<std::string, std::string>> lowered_names;
  std::string log;
  double compile_ms = 0; // nvrtcCompileProgram alone
  // Whether this compile left a precompiled header for later ones (Note [Precompiled headers]).
  bool pch_created = false;
};

// Compiles `request`. Throws `CompileError` (with the log) when NVRTC fails.
CompileResult nvrtc_compile(const CompileRequest& request);

} // namespace kjit::detail
