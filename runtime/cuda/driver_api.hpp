// The part of the CUDA driver API that kjit calls, declared here so that kjit builds without the
// CUDA toolkit: types, the enumerators kjit uses, and prototypes for `decltype`. Nothing here is
// defined or linked; every call goes through the table in `runtime/cuda/driver.hpp`, filled by
// dlsym. The values and signatures are the driver's ABI (CUDA 12.0 and later, unchanged in 13).
//
// Versioned entry points: the names below resolve to the symbols that cuda.h maps them to when
// per-thread default streams are off (`cuMemAlloc` is `cuMemAlloc_v2`, ...), so that
// `KJIT_STRINGIFY_EXPANDED(cuMemAlloc)` names the right symbol.
#pragma once

#include <cstddef>

// Never together with cuda.h: these are the same names.
#ifdef __cuda_cuda_h__
#  error "runtime/cuda/driver_api.hpp declares the driver API itself; do not include cuda.h too"
#endif

extern "C" {

enum cudaError_enum : int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_STUB_LIBRARY = 34,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_INVALID_PTX = 218,
  CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
};
using CUresult = cudaError_enum;

enum CUdevice_attribute_enum : int {
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
  CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};
using CUdevice_attribute = CUdevice_attribute_enum;

enum CUfunction_attribute_enum : int {
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
};
using CUfunction_attribute = CUfunction_attribute_enum;

// Only passed as null arrays.
enum CUjit_option_enum : int {};
using CUjit_option = CUjit_option_enum;
enum CUlibraryOption_enum : int {};
using CUlibraryOption = CUlibraryOption_enum;

using CUdevice = int;
using CUdeviceptr = unsigned long long; // 64-bit hosts only
using CUcontext = struct CUctx_st*;
using CUlibrary = struct CUlib_st*;
using CUkernel = struct CUkern_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;

enum CUstreamCaptureStatus_enum : int {
  CU_STREAM_CAPTURE_STATUS_NONE = 0,
  CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
  CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
};
using CUstreamCaptureStatus = CUstreamCaptureStatus_enum;

enum CUstreamCaptureMode_enum : int {
  CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_STREAM_CAPTURE_MODE_RELAXED = 2,
};
using CUstreamCaptureMode = CUstreamCaptureMode_enum;

constexpr unsigned int CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned int CU_EVENT_DEFAULT = 0x0;

#define cuDeviceTotalMem cuDeviceTotalMem_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
#define cuMemcpyHtoD cuMemcpyHtoD_v2
#define cuMemcpyDtoH cuMemcpyDtoH_v2
#define cuMemsetD8 cuMemsetD8_v2
#define cuMemcpyDtoDAsync cuMemcpyDtoDAsync_v2
#define cuStreamDestroy cuStreamDestroy_v2
#define cuEventDestroy cuEventDestroy_v2
#define cuStreamBeginCapture cuStreamBeginCapture_v2
#define cuGraphInstantiate cuGraphInstantiateWithFlags
// cuEventElapsedTime stays the first version: every 12.x driver has it (cuda.h 12.8+ maps the
// name to _v2, which older drivers lack; both read two events of one context the same way).

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int* version);
CUresult cuGetErrorName(CUresult error, const char** text);
CUresult cuGetErrorString(CUresult error, const char** text);
CUresult cuDeviceGet(CUdevice* device, int ordinal);
CUresult cuDeviceGetCount(int* count);
CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device);
CUresult cuDeviceGetName(char* name, int length, CUdevice device);
CUresult cuDeviceTotalMem(std::size_t* bytes, CUdevice device);
CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device);
CUresult cuCtxGetCurrent(CUcontext* context);
CUresult cuCtxSetCurrent(CUcontext context);
CUresult cuCtxGetDevice(CUdevice* device);
CUresult cuCtxSynchronize();
CUresult cuStreamGetCtx(CUstream stream, CUcontext* context);
CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jit_options,
                           void** jit_option_values, unsigned int jit_option_count,
                           CUlibraryOption* library_options, void** library_option_values,
                           unsigned int library_option_count);
CUresult cuLibraryUnload(CUlibrary library);
CUresult cuLibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name);
CUresult cuKernelSetAttribute(CUfunction_attribute attribute, int value, CUkernel kernel,
                              CUdevice device);
CUresult cuKernelGetParamInfo(CUkernel kernel, std::size_t index, std::size_t* offset,
                              std::size_t* size);
CUresult cuLaunchKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y,
                        unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                        unsigned int block_z, unsigned int shared_bytes, CUstream stream,
                        void** params, void** extra);
CUresult cuMemAlloc(CUdeviceptr* pointer, std::size_t bytes);
CUresult cuMemFree(CUdeviceptr pointer);
CUresult cuMemcpyHtoD(CUdeviceptr destination, const void* source, std::size_t bytes);
CUresult cuMemcpyDtoH(void* destination, CUdeviceptr source, std::size_t bytes);
CUresult cuMemsetD8(CUdeviceptr destination, unsigned char value, std::size_t count);
CUresult cuMemsetD8Async(CUdeviceptr destination, unsigned char value, std::size_t count,
                         CUstream stream);
CUresult cuMemcpyDtoDAsync(CUdeviceptr destination, CUdeviceptr source, std::size_t bytes,
                           CUstream stream);
CUresult cuStreamCreate(CUstream* stream, unsigned int flags);
CUresult cuStreamDestroy(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status);
CUresult cuStreamBeginCapture(CUstream stream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph);
CUresult cuGraphInstantiate(CUgraphExec* exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphDestroy(CUgraph graph);
CUresult cuEventCreate(CUevent* event, unsigned int flags);
CUresult cuEventDestroy(CUevent event);
CUresult cuEventRecord(CUevent event, CUstream stream);
CUresult cuEventSynchronize(CUevent event);
CUresult cuEventElapsedTime(float* milliseconds, CUevent start, CUevent end);

} // extern "C"
