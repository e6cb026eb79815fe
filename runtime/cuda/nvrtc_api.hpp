// The part of the NVRTC API that kjit calls, declared here so that kjit builds without the CUDA
// toolkit. Nothing here is defined or linked: NVRTC is found and loaded at run time
// (`runtime/cuda/nvrtc.hpp`) and every call goes through its table. The values and signatures
// are NVRTC's ABI (12.x and 13.x).
#pragma once

#include <cstddef>

#ifdef __NVRTC_H__
#  error "runtime/cuda/nvrtc_api.hpp declares the NVRTC API itself; do not include nvrtc.h too"
#endif

extern "C" {

enum nvrtcResult : int {
  NVRTC_SUCCESS = 0,
  NVRTC_ERROR_OUT_OF_MEMORY = 1,
  NVRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
  NVRTC_ERROR_INVALID_INPUT = 3,
  NVRTC_ERROR_INVALID_PROGRAM = 4,
  NVRTC_ERROR_INVALID_OPTION = 5,
  NVRTC_ERROR_COMPILATION = 6,
  NVRTC_ERROR_BUILTIN_OPERATION_FAILURE = 7,
  NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION = 8,
  NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION = 9,
  NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID = 10,
  NVRTC_ERROR_INTERNAL_ERROR = 11,
  NVRTC_ERROR_TIME_FILE_WRITE_FAILED = 12,
  NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED = 13,
  NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED = 14,
  NVRTC_ERROR_PCH_CREATE = 15,
  NVRTC_ERROR_CANCELLED = 16,
};

using nvrtcProgram = struct _nvrtcProgram*;

const char* nvrtcGetErrorString(nvrtcResult result);
nvrtcResult nvrtcVersion(int* major, int* minor);
nvrtcResult nvrtcGetNumSupportedArchs(int* count);
nvrtcResult nvrtcGetSupportedArchs(int* archs);
nvrtcResult nvrtcCreateProgram(nvrtcProgram* program, const char* source, const char* name,
                               int header_count, const char* const* headers,
                               const char* const* include_names);
nvrtcResult nvrtcDestroyProgram(nvrtcProgram* program);
nvrtcResult nvrtcCompileProgram(nvrtcProgram program, int option_count, const char* const* options);
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram program, std::size_t* size);
nvrtcResult nvrtcGetProgramLog(nvrtcProgram program, char* log);
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram program, std::size_t* size);
nvrtcResult nvrtcGetCUBIN(nvrtcProgram program, char* cubin);
nvrtcResult nvrtcGetPTXSize(nvrtcProgram program, std::size_t* size);
nvrtcResult nvrtcGetPTX(nvrtcProgram program, char* ptx);
nvrtcResult nvrtcAddNameExpression(nvrtcProgram program, const char* expression);
nvrtcResult nvrtcGetLoweredName(nvrtcProgram program, const char* expression, const char** lowered);
nvrtcResult nvrtcGetPCHCreateStatus(nvrtcProgram program); // 12.8+

} // extern "C"
