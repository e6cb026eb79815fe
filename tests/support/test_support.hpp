// Shared helpers of kjit's Catch2 tests: temporary directories, child processes, captured logs.
#pragma once

#include <kjit/log.hpp>

#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kjit::test {

// A fresh directory under the system temp dir, removed (recursively) on destruction.
class TempDir {
public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const noexcept { return m_path; }
  std::filesystem::path operator/(const std::string& name) const { return m_path / name; }

private:
  std::filesystem::path m_path;
};

// Writes `content` to `path`, creating parent directories.
void write_text(const std::filesystem::path& path, const std::string& content);

// The result of a child process.
struct ProcessResult {
  int exit_code = -1;
  std::string output;                        // stdout
  std::map<std::string, std::string> values; // `name=value` lines of stdout
};

// Runs `argv` (argv[0] is a path), with `env` added to the environment; waits for it.
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::vector<std::string>& env = {});

// Starts `argv` with stdout to a pipe; `wait_process` collects it.
struct Child {
  int pid = -1;
  int stdout_fd = -1;
};
Child start_process(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});
ProcessResult wait_process(Child child);

// The path of kjit_test_helper and of the source tree.
std::string helper_path();
std::filesystem::path source_dir();

// Collects kjit's log messages while it lives (and silences stderr).
class LogCapture {
public:
  LogCapture();
  ~LogCapture();
  std::vector<std::string> messages(LogLevel at_least = LogLevel::warning) const;
  // Messages at or above warning that contain `text`.
  std::size_t count(const std::string& text) const;

private:
  mutable std::mutex m_mutex;
  std::vector<std::pair<LogLevel, std::string>> m_messages;
};

} // namespace kjit::test
