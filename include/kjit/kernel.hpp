// A loaded kernel and its launch.
//
// **Example**
//
//   kjit::Kernel k = runtime.kernel(program, "img2gray_kernel");
//   k.launch({kjit::cdiv(w, 32), kjit::cdiv(h, 8)}, {32, 8}, 0, stream,
//            in.get(), out.get(), w, h);
//
// Arguments are passed by value, as the kernel declares them. Their count and sizes are checked
// against the kernel's parameter layout (`cuKernelGetParamInfo`, where the driver has it), so an
// `int` passed for a `size_t` parameter is a `LaunchError`, not a corrupt launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <typeinfo>

struct CUstream_st; // CUstream and cudaStream_t are `CUstream_st*`.

namespace kjit {

namespace detail {
struct KernelRecord;
} // namespace detail

// A CUDA stream handle: a `CUstream`/`cudaStream_t`, or nullptr for the legacy default stream.
using StreamHandle = CUstream_st*;

// Grid or block dimensions.
struct Dim3 {
  unsigned x = 1;
  unsigned y = 1;
  unsigned z = 1;
};

// Ceiling division, for grid sizes.
constexpr unsigned cdiv(std::uint64_t a, std::uint64_t b) {
  return static_cast<unsigned>((a + b - 1) / b);
}

// A kernel of a loaded library. Shares ownership of the library (which stays loaded while any
// `Kernel` of it exists); cheap to copy. The library is context-independent: one `Kernel` launches
// on every device of its arch.
class Kernel {
public:
  Kernel() = default;
  explicit Kernel(std::shared_ptr<const detail::KernelRecord> record);

  // The name asked for (a name expression such as "scale<float>", or the entry's name).
  const std::string& name() const;
  // The mangled name in the binary.
  const std::string& lowered_name() const;
  // The number of parameters, or -1 where the driver cannot tell (before CUDA 12.4).
  int param_count() const;
  // The size in bytes of each parameter; empty where the driver cannot tell.
  std::span<const std::size_t> param_sizes() const;
  // The `CUkernel` handle (context-independent), for use with driver calls.
  void* handle() const;
  explicit operator bool() const noexcept { return m_record != nullptr; }

  // Launches on `stream`, on the stream's device (a kernel is context-independent: the driver
  // loads it into each device's context at its first launch there); on the null stream, in the
  // calling thread's current context, or device 0's primary one (made current) when there is
  // none. Each argument is copied as
  // the kernel's parameter; throws `LaunchError` naming the parameter when the count or a size does
  // not match, and when the driver refuses the launch.
  template <class... Args>
  void launch(Dim3 grid, Dim3 block, std::size_t shared_mem, StreamHandle stream,
              const Args&... args) const {
    static_assert((std::is_trivially_copyable_v<Args> && ...),
                  "kernel arguments are copied bytewise: pass trivially copyable values");
    constexpr std::size_t n = sizeof...(Args);
    void* values[n > 0 ? n : 1] = {const_cast<void*>(static_cast<const void*>(&args))...};
    const std::size_t sizes[n > 0 ? n : 1] = {sizeof(Args)...};
    const std::type_info* types[n > 0 ? n : 1] = {&typeid(Args)...};
    launch_packed(grid, block, shared_mem, stream, std::span(values, n), std::span(sizes, n),
                  std::span(types, n));
  }

  // Launches with arguments already packed: `values[i]` points at argument i, of `sizes[i]`
  // bytes. `types` may be empty; it only names types in error messages.
  void launch_packed(Dim3 grid, Dim3 block, std::size_t shared_mem, StreamHandle stream,
                     std::span<void* const> values, std::span<const std::size_t> sizes,
                     std::span<const std::type_info* const> types = {}) const;

private:
  std::shared_ptr<const detail::KernelRecord> m_record;
};

} // namespace kjit
