// Kernel::launch: argument checks against the parameter layout, then cuLaunchKernel.
#include <kjit/error.hpp>
#include <kjit/kernel.hpp>

#include "runtime/cuda/driver.hpp"
#include "runtime/library.hpp"
#include "runtime/util/assert.hpp"

#include <cxxabi.h>
#include <fmt/format.h>

#include <cstdlib>
#include <memory>

namespace kjit {
namespace {

std::string type_name(std::span<const std::type_info* const> types, std::size_t i) {
  if (i >= types.size() || types[i] == nullptr) {
    return {};
  }
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> demangled(
    abi::__cxa_demangle(types[i]->name(), nullptr, nullptr, &status), &std::free);
  return fmt::format(" (type '{}')", status == 0 && demangled ? demangled.get() : types[i]->name());
}

[[noreturn]] void throw_argument_mismatch(const detail::KernelRecord& record,
                                          std::span<const std::size_t> sizes,
                                          std::span<const std::type_info* const> types) {
  if (sizes.size() != record.param_sizes.size()) {
    throw LaunchError(fmt::format("cannot launch kernel '{}': it takes {} argument{}, {} given",
                                  record.name, record.param_sizes.size(),
                                  record.param_sizes.size() == 1 ? "" : "s", sizes.size()));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] != record.param_sizes[i]) {
      throw LaunchError(fmt::format("cannot launch kernel '{}': parameter {} is {} bytes, but "
                                    "argument {} is {} bytes{}",
                                    record.name, i, record.param_sizes[i], i, sizes[i],
                                    type_name(types, i)));
    }
  }
  KJIT_ASSERT(false);
}

bool sizes_match(const detail::KernelRecord& record, std::span<const std::size_t> sizes) {
  if (sizes.size() != record.param_sizes.size()) {
    return false;
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] != record.param_sizes[i]) {
      return false;
    }
  }
  return true;
}

} // namespace

Kernel::Kernel(std::shared_ptr<const detail::KernelRecord> record) : m_record(std::move(record)) {}

const std::string& Kernel::name() const {
  KJIT_ASSERT(m_record);
  return m_record->name;
}

const std::string& Kernel::lowered_name() const {
  KJIT_ASSERT(m_record);
  return m_record->lowered_name;
}

int Kernel::param_count() const {
  KJIT_ASSERT(m_record);
  m_record->resolve_params();
  return m_record->params_known ? static_cast<int>(m_record->param_sizes.size()) : -1;
}

std::span<const std::size_t> Kernel::param_sizes() const {
  KJIT_ASSERT(m_record);
  m_record->resolve_params();
  return m_record->param_sizes;
}

void* Kernel::handle() const {
  KJIT_ASSERT(m_record);
  return m_record->handle;
}

void Kernel::launch_packed(Dim3 grid, Dim3 block, std::size_t shared_mem, StreamHandle stream,
                           std::span<void* const> values, std::span<const std::size_t> sizes,
                           std::span<const std::type_info* const> types) const {
  if (!m_record) {
    throw LaunchError("cannot launch an empty kjit::Kernel (default-constructed or moved from)");
  }
  const detail::KernelRecord& record = *m_record;
  KJIT_ASSERT(values.size() == sizes.size());
  record.resolve_params(stream);
  if (record.params_known && !sizes_match(record, sizes)) {
    throw_argument_mismatch(record, sizes, types);
  }
  const detail::DriverApi& d = detail::driver();
  auto launch = [&] {
    return d.cuLaunchKernel(reinterpret_cast<CUfunction>(record.handle), grid.x, grid.y, grid.z,
                            block.x, block.y, block.z, static_cast<unsigned>(shared_mem), stream,
                            const_cast<void**>(values.data()), nullptr);
  };
  CUresult result = launch();
  if (result == CUDA_ERROR_INVALID_CONTEXT) {
    // No current context on this thread: take the stream's, or device 0's primary one.
    detail::ensure_context(stream);
    result = launch();
  }
  if (result != CUDA_SUCCESS) {
    throw LaunchError(fmt::format(
      "cannot launch kernel '{}' with grid ({}, {}, {}), block ({}, {}, {}), {} bytes of shared "
      "memory: cuLaunchKernel failed: {}",
      record.name, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_mem,
      detail::driver_error_text(result)));
  }
}

} // namespace kjit
