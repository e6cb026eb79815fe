// kjit error types.
//
// **Example**
//
//   try {
//     auto kernel = runtime.kernel(program, "my_kernel");
//   } catch (const kjit::CompileError& e) {
//     std::cerr << e.log();  // the NVRTC log, with line numbers
//   } catch (const kjit::Error& e) {
//     std::cerr << e.what();
//   }
//
// Every error that a user or the environment can cause is a `kjit::Error`. Bugs in kjit itself
// are assertions (`KJIT_ASSERT`), not exceptions of these types.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace kjit {

// The base of every kjit exception. `what()` says what was being done, to what, and why.
class Error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// The CUDA driver is missing or a driver call failed. `code()` is the `CUresult` value (0 when the
// driver library itself could not be loaded) and `code_name()` its name, e.g.
// "CUDA_ERROR_OUT_OF_MEMORY".
class DriverError : public Error {
public:
  DriverError(const std::string& message, int code, std::string code_name);

  // The `CUresult` of the failed call, or 0 when no driver was found.
  int code() const noexcept { return m_code; }
  // The name of `code()`, or "no driver".
  const std::string& code_name() const noexcept { return m_code_name; }

private:
  int m_code;
  std::string m_code_name;
};

// No usable NVRTC was found (or `KJIT_NVRTC_LIBRARY` names one that cannot be loaded). The
// message lists every place searched and what to install. Only compiling needs NVRTC.
class NvrtcError : public Error {
public:
  using Error::Error;
};

// NVRTC failed to compile a program. `what()` is a summary followed by the log; the fields keep
// everything a caller needs to report or retry.
class CompileError : public Error {
public:
  CompileError(std::string result_name, std::string log, std::vector<std::string> options,
               std::string program_name, std::string arch);

  // The `nvrtcResult` name, e.g. "NVRTC_ERROR_COMPILATION".
  const std::string& result_name() const noexcept { return m_result_name; }
  // The full NVRTC log (errors carry "name(line): error: ...").
  const std::string& log() const noexcept { return m_log; }
  // The options NVRTC was given, in order, include and arch flags included.
  const std::vector<std::string>& options() const noexcept { return m_options; }
  // The program's name, e.g. "img2gray.cu".
  const std::string& program_name() const noexcept { return m_program_name; }
  // The target, e.g. "sm_90" or "compute_90".
  const std::string& arch() const noexcept { return m_arch; }

private:
  std::string m_result_name;
  std::string m_log;
  std::vector<std::string> m_options;
  std::string m_program_name;
  std::string m_arch;
};

// A kernel cache could not be used as asked (an explicit cache operation failed). Cache problems
// met while getting a kernel are never thrown: kjit warns once and compiles without the cache.
class CacheError : public Error {
public:
  using Error::Error;
};

// A launch was refused: wrong argument count or sizes, an unknown kernel name, or a driver
// failure while launching. The message names the kernel and the parameter.
class LaunchError : public Error {
public:
  using Error::Error;
};

// A kernel package's manifest is wrong: `what()` names the file, the table and key, and where
// known the line and the column inside an expression.
class ManifestError : public Error {
public:
  ManifestError(std::string file, std::string location, int line, int column,
                const std::string& message);

  // The manifest file.
  const std::string& file() const noexcept { return m_file; }
  // The table and key, e.g. "op.img2gray.checks[1]".
  const std::string& location() const noexcept { return m_location; }
  // 1-based line in the file, or 0 when unknown.
  int line() const noexcept { return m_line; }
  // 1-based column inside the expression, or 0.
  int column() const noexcept { return m_column; }

private:
  std::string m_file;
  std::string m_location;
  int m_line;
  int m_column;
};

} // namespace kjit
