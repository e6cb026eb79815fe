#include <kjit/device.hpp>

#include "runtime/cuda/driver.hpp"
#include "runtime/logging.hpp"

#include <fmt/format.h>

#include <utility>

namespace kjit {

bool driver_available() noexcept {
  return detail::driver_loaded();
}

int device_count() noexcept {
  try {
    int count = 0;
    if (detail::driver().cuDeviceGetCount(&count) == CUDA_SUCCESS) {
      return count;
    }
  } catch (...) {
  }
  return 0;
}

DeviceInfo device_info(int ordinal) {
  const detail::DriverApi& d = detail::driver();
  CUdevice device = 0;
  KJIT_CU_CHECK(d.cuDeviceGet(&device, ordinal), "cannot get CUDA device {}", ordinal);
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  KJIT_CU_CHECK(d.cuDeviceGetName(name, sizeof name, device), "cannot get the name of device {}",
                ordinal);
  info.name = name;
  KJIT_CU_CHECK(
    d.cuDeviceGetAttribute(&info.arch.major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
    "cannot get the compute capability of device {}", ordinal);
  KJIT_CU_CHECK(
    d.cuDeviceGetAttribute(&info.arch.minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
    "cannot get the compute capability of device {}", ordinal);
  KJIT_CU_CHECK(d.cuDeviceTotalMem(&info.total_memory, device),
                "cannot get the memory size of device {}", ordinal);
  KJIT_CU_CHECK(
    d.cuDeviceGetAttribute(&info.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
    "cannot get the multiprocessor count of device {}", ordinal);
  KJIT_CU_CHECK(d.cuDeviceGetAttribute(&info.max_shared_mem_optin,
                                       CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                       device),
                "cannot get the shared memory limit of device {}", ordinal);
  KJIT_CU_CHECK(d.cuDeviceGetAttribute(&info.warp_size, CU_DEVICE_ATTRIBUTE_WARP_SIZE, device),
                "cannot get the warp size of device {}", ordinal);
  return info;
}

void set_device(int ordinal) {
  const detail::DriverApi& d = detail::driver();
  CUdevice device = 0;
  KJIT_CU_CHECK(d.cuDeviceGet(&device, ordinal), "cannot get CUDA device {}", ordinal);
  CUcontext context = nullptr;
  KJIT_CU_CHECK(d.cuDevicePrimaryCtxRetain(&context, device),
                "cannot retain the primary context of device {}", ordinal);
  KJIT_CU_CHECK(d.cuCtxSetCurrent(context), "cannot make device {}'s context current", ordinal);
}

void synchronize() {
  detail::ensure_context();
  KJIT_CU_CHECK(detail::driver().cuCtxSynchronize(), "cannot synchronize the CUDA context");
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : m_size(bytes) {
  detail::ensure_context();
  CUdeviceptr ptr = 0;
  KJIT_CU_CHECK(detail::driver().cuMemAlloc(&ptr, bytes > 0 ? bytes : 1),
                "cannot allocate {} bytes of device memory", bytes);
  m_ptr = ptr;
}

DeviceBuffer::~DeviceBuffer() {
  if (m_ptr != 0) {
    try {
      const CUresult result = detail::driver().cuMemFree(m_ptr);
      if (result != CUDA_SUCCESS && result != CUDA_ERROR_DEINITIALIZED) {
        detail::log(LogLevel::warning, "cannot free device memory: {}",
                    detail::driver_error_text(result));
      }
    } catch (...) {
    }
  }
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
  : m_ptr(std::exchange(other.m_ptr, 0)), m_size(std::exchange(other.m_size, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    m_ptr = std::exchange(other.m_ptr, 0);
    m_size = std::exchange(other.m_size, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  if (bytes > m_size) {
    throw Error(
      fmt::format("cannot upload {} bytes into a device buffer of {} bytes", bytes, m_size));
  }
  detail::ensure_context();
  KJIT_CU_CHECK(detail::driver().cuMemcpyHtoD(m_ptr, host, bytes),
                "cannot copy {} bytes to the device", bytes);
}

void DeviceBuffer::download(void* host, std::size_t bytes) const {
  if (bytes > m_size) {
    throw Error(
      fmt::format("cannot download {} bytes from a device buffer of {} bytes", bytes, m_size));
  }
  detail::ensure_context();
  KJIT_CU_CHECK(detail::driver().cuMemcpyDtoH(host, m_ptr, bytes),
                "cannot copy {} bytes from the device", bytes);
}

void DeviceBuffer::fill(unsigned char value) {
  detail::ensure_context();
  KJIT_CU_CHECK(detail::driver().cuMemsetD8(m_ptr, value, m_size), "cannot fill {} bytes", m_size);
}

std::uint64_t DeviceBuffer::release() noexcept {
  m_size = 0;
  return std::exchange(m_ptr, 0);
}

} // namespace kjit
