// NVRTC: CUDA source to cubin or PTX for one target. Needs no GPU and no driver.
//
// Note [NVRTC table]: NVRTC is linked, but every call goes through the `nvrtc()` table so that
// tests can inject failures (`NvrtcOverride`), as with the driver (Note [Driver table]).
#pragma once

#include <kjit/arch.hpp>

#include <nvrtc.h>

#include <string>
#include <utility>
#include <vector>

namespace kjit::detail {

#define KJIT_NVRTC_FUNCTIONS(X)                                                                    \
  X(nvrtcGetErrorString)                                                                           \
  X(nvrtcVersion)                                                                                  \
  X(nvrtcGetNumSupportedArchs)                                                                     \
  X(nvrtcGetSupportedArchs)                                                                        \
  X(nvrtcCreateProgram)                                                                            \
  X(nvrtcDestroyProgram)                                                                           \
  X(nvrtcCompileProgram)                                                                           \
  X(nvrtcGetProgramLogSize)                                                                        \
  X(nvrtcGetProgramLog)                                                                            \
  X(nvrtcGetCUBINSize)                                                                             \
  X(nvrtcGetCUBIN)                                                                                 \
  X(nvrtcGetPTXSize)                                                                               \
  X(nvrtcGetPTX)                                                                                   \
  X(nvrtcAddNameExpression)                                                                        \
  X(nvrtcGetLoweredName)                                                                           \
  X(nvrtcGetPCHCreateStatus)

struct NvrtcApi {
#define KJIT_NVRTC_MEMBER(name) decltype(&::name) name = nullptr;
  KJIT_NVRTC_FUNCTIONS(KJIT_NVRTC_MEMBER)
#undef KJIT_NVRTC_MEMBER
  int version_major = 0;
  int version_minor = 0;
};

// The NVRTC table (the linked library, unless a test overrides it).
const NvrtcApi& nvrtc();

// Tests only: swaps the table for `table` while the object lives.
class NvrtcOverride {
public:
  explicit NvrtcOverride(const NvrtcApi& table);
  ~NvrtcOverride();
  NvrtcOverride(const NvrtcOverride&) = delete;
  NvrtcOverride& operator=(const NvrtcOverride&) = delete;

private:
  const NvrtcApi* m_previous;
};

// `nvrtcGetSupportedArchs` of the linked NVRTC, ascending (e.g. 75, 80, ..., 120).
const std::vector<int>& nvrtc_supported_arch_numbers();

// The include dirs of the CUDA toolkit that NVRTC is given (CUDA headers such as cuda_fp16.h
// and cuda/std/...): `$CUDA_HOME/include` (or the build's toolkit) and its `cccl` folder.
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
