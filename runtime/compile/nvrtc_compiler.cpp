#include "runtime/compile/nvrtc_compiler.hpp"

#include <kjit/error.hpp>

#include "runtime/compile/pch_folder.hpp"
#include "runtime/logging.hpp"
#include "runtime/util/env.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>

#include <mutex>

#include <pthread.h>
#include <sys/statvfs.h>

namespace kjit::detail {
namespace {

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

const std::vector<int>& nvrtc_supported_arch_numbers() {
  static const std::vector<int> archs = [] {
    const NvrtcApi& api = nvrtc();
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
  return nvrtc().include_dirs;
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

// Note [Precompiled headers]: compiles ask NVRTC (12.8+) for automatic PCH (`-pch`). The first
// program of a process that starts with a run of #includes pays for parsing them and leaves a
// precompiled header in NVRTC's process-wide PCH heap; later programs with the same leading
// includes and options start from it instead of parsing them again (cuda_fp16.h with cuda/std
// headers: about 1.5 s, then 0.2 s; bench/RESULTS.md). A PCH saves parsing and changes no code:
// the cubins differ from a compile without it only where two compiles without it already differ
// (the unique ids of internal-linkage names), which a test checks. So it is not part of the
// cache key, like the number of threads of a parallel build. NVRTC keeps the files (7-100 MB
// each) for the life of the process in a folder that kjit makes under $TMPDIR or /tmp and names
// with `--pch-dir`, so that a killed process's files can be found and removed later (Note [PCH
// folders] in pch_folder.cpp); PCH is only asked for where that has room (`pch_has_room`).
// KJIT_NVRTC_PCH=0 turns it off; a user's own PCH options (`--create-pch`, `--use-pch`,
// `--pch-dir`, ...) are passed as given instead.
bool nvrtc_pch_enabled() {
  static const bool enabled = [] {
    const auto value = getenv_nonempty("KJIT_NVRTC_PCH");
    return !value || (*value != "0" && *value != "off" && *value != "false");
  }();
  return enabled;
}

// NVRTC maps its PCH files into memory; where the file system fills up under the mapping, the
// process dies of SIGBUS, which no error code reports. So PCH is only asked for with 1 GiB free
// there: the default PCH heap is 256 MiB, and a PCH of cuda/std headers is about 100 MB.
bool pch_has_room() {
  constexpr std::uint64_t k_needed = std::uint64_t{1} << 30;
  const std::string dir = pch_base_dir().string();
  struct statvfs fs {};
  const bool room =
    ::statvfs(dir.c_str(), &fs) == 0 && std::uint64_t(fs.f_bavail) * fs.f_frsize >= k_needed;
  static std::atomic<bool> said{false};
  if (!room && !said.exchange(true)) {
    log(LogLevel::info,
        "less than 1 GiB free in '{}': compiling without NVRTC's precompiled headers", dir);
  }
  return room;
}

namespace {

bool is_pch_option(const std::string& option) {
  for (const char* prefix :
       {"-pch", "--pch", "-create-pch", "--create-pch", "-use-pch", "--use-pch",
        "-instantiate-templates-in-pch", "--instantiate-templates-in-pch"}) {
    if (option.starts_with(prefix)) {
      return true;
    }
  }
  return false;
}

// Set once automatic PCH has made a compile fail that succeeds without it.
std::atomic<bool> g_pch_failed{false};

CompileResult compile_once(const CompileRequest& request, bool auto_pch) {
  const NvrtcApi& api = nvrtc();
  std::vector<std::string> options;
  options.push_back("--gpu-architecture=" + request.target.name());
  for (const auto& option : request.options) {
    options.push_back(option);
  }
  if (auto_pch) {
    // Quiet: a PCH that does not fit this program is not worth a line in its log.
    options.insert(options.end(), {"-pch", "--pch-messages=false", "--pch-verbose=false"});
    if (const std::string& folder = pch_folder(); !folder.empty()) {
      options.push_back("--pch-dir=" + folder);
    }
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
  if (auto_pch && api.nvrtcGetPCHCreateStatus != nullptr) {
    const nvrtcResult pch = api.nvrtcGetPCHCreateStatus(program.get());
    if (pch == NVRTC_SUCCESS) {
      result.pch_created = true;
    } else if (pch == NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED || pch == NVRTC_ERROR_PCH_CREATE) {
      log(LogLevel::debug, "NVRTC made no precompiled header for '{}': {}", request.name,
          api.nvrtcGetErrorString(pch));
    }
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

} // namespace

// Note [One PCH compile at a time]: NVRTC 13.0 crashes (SIGSEGV inside nvrtcCompileProgram,
// reading an address equal to the process id) when compiles with automatic PCH run at the same
// time in one process once a PCH exists, and in a child forked from a process that made one: about
// 1 run in 3 of the [warm] unit tests after a PCH test, in release and ASan builds alike, and in
// kjit's code from before 2026-12-03 too. So one compile at a time uses PCH (a try-lock: the others
// compile without it, in parallel, rather than wait), and a forked child never does.
namespace {

std::mutex g_pch_mutex;
std::atomic<bool> g_forked{false};

[[maybe_unused]] const int g_atfork =
  ::pthread_atfork(nullptr, nullptr, [] { g_forked.store(true, std::memory_order_relaxed); });

} // namespace

CompileResult nvrtc_compile(const CompileRequest& request) {
  const bool auto_pch =
    request.auto_pch && !g_pch_failed.load(std::memory_order_relaxed) &&
    !g_forked.load(std::memory_order_relaxed) &&
    nvrtc().nvrtcGetPCHCreateStatus != nullptr && // NVRTC 12.8+
    std::none_of(request.options.begin(), request.options.end(), is_pch_option) && pch_has_room();
  std::unique_lock pch_turn(g_pch_mutex, std::defer_lock);
  if (!auto_pch || !pch_turn.try_lock()) {
    return compile_once(request, false);
  }
  try {
    return compile_once(request, true);
  } catch (const CompileError& e) {
    // NVRTC maps its PCH heap from files under /tmp: where /tmp is full or not writable, a
    // compile with `-pch` dies with a catastrophic error ("unable to obtain mapped memory").
    // Such an error (a missing header is one too) gets one more try without PCH; if that one
    // succeeds, PCH was the cause and stays off for this process.
    if (e.log().find("atastrophic error") == std::string::npos) {
      throw;
    }
    CompileResult result = compile_once(request, false); // a real error throws here
    if (!g_pch_failed.exchange(true)) {
      const std::string_view nvrtc_log = e.log();
      log(LogLevel::warning,
          "NVRTC failed with precompiled headers ({}); compiling without them from now on",
          nvrtc_log.substr(0, nvrtc_log.find('\n')));
    }
    return result;
  }
}

} // namespace kjit::detail
