// Devices and device memory, through the lazily loaded CUDA driver (no CUDA runtime needed).
//
// **Example**
//
//   if (kjit::device_count() > 0) {
//     kjit::DeviceBuffer buf(bytes);
//     buf.upload(host.data(), bytes);
//     // ... launch kernels on buf.get() ...
//     kjit::synchronize();
//     buf.download(host.data(), bytes);
//   }
#pragma once

#include <kjit/arch.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace kjit {

// Whether `libcuda.so.1` could be loaded and initialized. Never throws.
bool driver_available() noexcept;

// The number of CUDA devices: 0 when there is no driver or no device. Never throws.
int device_count() noexcept;

// Facts about device `ordinal`; throws `DriverError` when there is no such device.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  Arch arch;
  std::size_t total_memory = 0;
  int sm_count = 0;             // multiprocessors
  int max_shared_mem_optin = 0; // shared memory a block may opt in to, bytes
  int warp_size = 0;
};
DeviceInfo device_info(int ordinal);

// Makes device `ordinal`'s primary context current on the calling thread (a no-op when it is).
void set_device(int ordinal);

// Waits for all work of the current context (making device 0's current when there is none).
void synchronize();

// Owning device memory (cuMemAlloc on the current context, made device 0's primary context when
// there is none); frees it on destruction. Move-only.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // The device address (a `CUdeviceptr`), to pass as a kernel argument.
  std::uint64_t get() const noexcept { return m_ptr; }
  std::size_t size() const noexcept { return m_size; }
  // Copies `bytes` (at most `size()`) from or to host memory, synchronously.
  void upload(const void* host, std::size_t bytes);
  void download(void* host, std::size_t bytes) const;
  // Sets every byte to `value`.
  void fill(unsigned char value);
  // Gives up ownership; returns the address.
  std::uint64_t release() noexcept;

private:
  std::uint64_t m_ptr = 0;
  std::size_t m_size = 0;
};

} // namespace kjit
