#include <kjit/error.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kjit {
namespace {

// The log in `what()` is cut so that a huge template error stays readable; `log()` keeps it all.
constexpr std::size_t k_max_log_in_message = 8192;

std::string compile_message(const std::string& result_name, const std::string& log,
                            const std::vector<std::string>& options,
                            const std::string& program_name, const std::string& arch) {
  std::string message = fmt::format("cannot compile '{}' for {}: {} (options: {})", program_name,
                                    arch, result_name, fmt::join(options, " "));
  if (!log.empty()) {
    message += "\n";
    if (log.size() > k_max_log_in_message) {
      message += log.substr(0, k_max_log_in_message);
      message += fmt::format("\n[... {} more bytes of log]", log.size() - k_max_log_in_message);
    } else {
      message += log;
    }
    // The one missing-header case a user can mend without touching the kernel: pip's CUDA 13
    // wheels keep CCCL (cuda/std, cub, thrust) in a package of its own.
    for (const char* header : {"\"cuda/std/", "\"cuda/", "\"cub/", "\"thrust/"}) {
      if (log.find(std::string("cannot open source file ") + header) != std::string::npos) {
        message +=
          "\nhint: CUDA's C++ library headers (CCCL: cuda/std, cub, thrust) are not on the "
          "include path; install nvidia-cuda-cccl beside this NVRTC (pip install "
          "'kjit[cccl]'), or set KJIT_NVRTC_LIBRARY to a CUDA toolkit's libnvrtc (its headers "
          "come with it; CUDA_HOME does not win over an NVRTC torch has loaded)";
        break;
      }
    }
  }
  return message;
}

} // namespace

DriverError::DriverError(const std::string& message, int code, std::string code_name)
  : Error(message), m_code(code), m_code_name(std::move(code_name)) {}

CompileError::CompileError(std::string result_name, std::string log,
                           std::vector<std::string> options, std::string program_name,
                           std::string arch)
  : Error(compile_message(result_name, log, options, program_name, arch)),
    m_result_name(std::move(result_name)), m_log(std::move(log)), m_options(std::move(options)),
    m_program_name(std::move(program_name)), m_arch(std::move(arch)) {}

ManifestError::ManifestError(std::string file, std::string location, int line, int column,
                             const std::string& message)
  : Error(fmt::format("{}{}: {}{}: {}", file, line > 0 ? fmt::format(":{}", line) : "", location,
                      column > 0 ? fmt::format(" (column {})", column) : "", message)),
    m_file(std::move(file)), m_location(std::move(location)), m_line(line), m_column(column) {}

} // namespace kjit
