#include "runtime/nvrtc_compiler.hpp"

#include <kjit/error.hpp>

#include "runtime/logging.hpp"
#include "runtime/util/env.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <filesystem>

#ifndef KJIT_CUDA_TOOLKIT_INCLUDE_DIR
#  define KJIT_CUDA_TOOLKIT_INCLUDE_DIR "/usr/local/cuda/include"
#endif

namespace kjit::detail {
namespace {

NvrtcApi make_linked_table() {
  NvrtcApi t;
#define KJIT_NVRTC_ASSIGN(name) t.name = &::name;
  KJIT_NVRTC_FUNCTIONS(KJIT_NVRTC_ASSIGN)
#undef KJIT_NVRTC_ASSIGN
  ::nvrtcVersion(&t.version_major, &t.version_minor);
  return t;
}

const NvrtcApi& linked_table() {
  static const NvrtcApi table = make_linked_table();
  return table;
}

std::atomic<const NvrtcApi*> g_override{nullptr};

[[noreturn]] void throw_nvrtc(const NvrtcApi& api, nvrtcResult result, const char* call,
                              const CompileRequest& request,
                              const std::vector<std::string>& options, std::string log = {}) {
  std::string name = api.nvrtcGetErrorString(result);
  if (log.empty()) {
    log = fmt::format("{} failed: {}", call, name);
  }
  throw CompileError(std::move(name), std::move(log), options, request.name, request.target.name());
}

} // namespace

#define KJIT_NVRTC_CHECK(call)                                                                     \
  do {                                                                                             \
    const nvrtcResult kjit_result_ = (call);                                                       \
    if (kjit_result_ != NVRTC_SUCCESS) {                                                           \
      throw_nvrtc(api, kjit_result_, #call, request, options);                                     \
    }                                                                                              \
  } while (false)

const NvrtcApi& nvrtc() {
  if (const NvrtcApi* table = g_override.load(std::memory_order_acquire)) {
    return *table;
  }
  return linked_table();
}

NvrtcOverride::NvrtcOverride(const NvrtcApi& table)
  : m_previous(g_override.exchange(&table, std::memory_order_acq_rel)) {}

NvrtcOverride::~NvrtcOverride() {
  g_override.store(m_previous, std::memory_order_release);
}

const std::vector<int>& nvrtc_supported_arch_numbers() {
  static const std::vector<int> archs = [] {
    const NvrtcApi& api = linked_table();
    int count = 0;
    std::vector<int> result;
    if (api.nvrtcGetNumSupportedArchs(&count) == NVRTC_SUCCESS && count > 0) {
      result.resize(static_cast<std::size_t>(count));
      if (api.nvrtcGetSupportedArchs(result.data()) != NVRTC_SUCCESS) {
        result.clear();
      }
    }
    return result;
  }();
  return archs;
}

const std::vector<std::string>& toolkit_include_dirs() {
  static const std::vector<std::string> dirs = [] {
    std::vector<std::string> result;
    std::filesystem::path include = KJIT_CUDA_TOOLKIT_INCLUDE_DIR;
    for (const char* variable : {"CUDA_HOME", "CUDA_PATH"}) {
      if (auto home = getenv_nonempty(variable)) {
        include = std::filesystem::path(*home) / "include";
        break;
      }
    }
    std::error_code ec;
    if (std::filesystem::exists(include / "cuda_runtime.h", ec)) {
      result.push_back(include.string());
      if (std::filesystem::is_directory(include / "cccl", ec)) {
        result.push_back((include / "cccl").string());
      }
    } else {
      log(LogLevel::debug, "no CUDA toolkit headers in '{}': only NVRTC's built-in headers",
          include.string());
    }
    return result;
  }();
  return dirs;
}

UniqueProgram::~UniqueProgram() {
  if (m_program != nullptr) {
    nvrtc().nvrtcDestroyProgram(&m_program);
  }
}

UniqueProgram& UniqueProgram::operator=(UniqueProgram&& other) noexcept {
  if (this != &other) {
    if (m_program != nullptr) {
      nvrtc().nvrtcDestroyProgram(&m_program);
    }
    m_program = other.release();
  }
  return *this;
}

CompileResult nvrtc_compile(const CompileRequest& request) {
  const NvrtcApi& api = nvrtc();
  std::vector<std::string> options;
  options.push_back("--gpu-architecture=" + request.target.name());
  for (const auto& option : request.options) {
    options.push_back(option);
  }
  for (const auto& dir : request.include_dirs) {
    options.push_back("-I" + dir);
  }
  for (const auto& dir : toolkit_include_dirs()) {
    options.push_back("-I" + dir);
  }

  // The headers hashed into the key are handed to NVRTC from memory, so a header edited during
  // the compile cannot give a binary that does not match its key.
  std::vector<const char*> header_sources;
  std::vector<const char*> header_names;
  for (const auto& [name, content] : request.headers) {
    header_names.push_back(name.c_str());
    header_sources.push_back(content.c_str());
  }
  nvrtcProgram raw = nullptr;
  KJIT_NVRTC_CHECK(api.nvrtcCreateProgram(&raw, request.source.c_str(), request.name.c_str(),
                                          static_cast<int>(header_names.size()),
                                          header_sources.data(), header_names.data()));
  UniqueProgram program(raw);
  for (const auto& expression : request.name_expressions) {
    KJIT_NVRTC_CHECK(api.nvrtcAddNameExpression(program.get(), expression.c_str()));
  }

  std::vector<const char*> option_pointers;
  for (const auto& option : options) {
    option_pointers.push_back(option.c_str());
  }
  const auto start = std::chrono::steady_clock::now();
  const nvrtcResult compiled = api.nvrtcCompileProgram(
    program.get(), static_cast<int>(option_pointers.size()), option_pointers.data());
  const auto stop = std::chrono::steady_clock::now();

  CompileResult result;
  result.compile_ms = std::chrono::duration<double, std::milli>(stop - start).count();
  std::size_t log_size = 0;
  if (api.nvrtcGetProgramLogSize(program.get(), &log_size) == NVRTC_SUCCESS && log_size > 1) {
    result.log.resize(log_size);
    if (api.nvrtcGetProgramLog(program.get(), result.log.data()) != NVRTC_SUCCESS) {
      result.log.clear();
    }
    while (!result.log.empty() && (result.log.back() == '\0' || result.log.back() == '\n')) {
      result.log.pop_back();
    }
  }
  if (compiled != NVRTC_SUCCESS) {
    throw_nvrtc(api, compiled, "nvrtcCompileProgram", request, options, result.log);
  }

  std::size_t size = 0;
  if (request.target.kind == OutputKind::cubin) {
    KJIT_NVRTC_CHECK(api.nvrtcGetCUBINSize(program.get(), &size));
    result.binary.resize(size);
    KJIT_NVRTC_CHECK(api.nvrtcGetCUBIN(program.get(), result.binary.data()));
  } else {
    KJIT_NVRTC_CHECK(api.nvrtcGetPTXSize(program.get(), &size));
    result.binary.resize(size);
    KJIT_NVRTC_CHECK(api.nvrtcGetPTX(program.get(), result.binary.data()));
  }
  for (const auto& expression : request.name_expressions) {
    const char* lowered = nullptr;
    KJIT_NVRTC_CHECK(api.nvrtcGetLoweredName(program.get(), expression.c_str(), &lowered));
    result.lowered_names.emplace_back(expression, lowered);
  }
  return result;
}

} // namespace kjit::detail
