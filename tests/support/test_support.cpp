#include "support/test_support.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace kjit::test {

TempDir::TempDir() {
  std::random_device device;
  const auto base = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate =
      base / ("kjit-test-" + std::to_string(::getpid()) + "-" + std::to_string(device() % 1000000));
    if (std::filesystem::create_directory(candidate)) {
      m_path = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary directory");
}

TempDir::~TempDir() {
  std::error_code ec;
  // Tests may leave read-only folders behind: make them writable before removing.
  for (auto it = std::filesystem::recursive_directory_iterator(m_path, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
  }
  std::filesystem::permissions(m_path, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ec);
  std::filesystem::remove_all(m_path, ec);
}

void write_text(const std::filesystem::path& path, const std::string& content) {
  if (path.has_parent_path()) {
    std::filesystem::create_directories(path.parent_path());
  }
  std::ofstream out(path, std::ios::binary);
  out << content;
  if (!out) {
    throw std::runtime_error("cannot write " + path.string());
  }
}

Child start_process(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  int fds[2];
  if (::pipe(fds) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  // `env` replaces inherited variables of the same name (getenv finds the first one).
  auto name_of = [](std::string_view variable) { return variable.substr(0, variable.find('=')); };
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const bool replaced = std::any_of(
      env.begin(), env.end(), [&](const std::string& v) { return name_of(v) == name_of(*e); });
    if (!replaced) {
      environment.emplace_back(*e);
    }
  }
  for (const auto& variable : env) {
    environment.push_back(variable);
  }
  std::vector<char*> argv_c;
  for (const auto& a : argv) {
    argv_c.push_back(const_cast<char*>(a.c_str()));
  }
  argv_c.push_back(nullptr);
  std::vector<char*> env_c;
  for (const auto& e : environment) {
    env_c.push_back(const_cast<char*>(e.c_str()));
  }
  env_c.push_back(nullptr);
  const int pid = ::fork();
  if (pid < 0) {
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execve(argv_c[0], argv_c.data(), env_c.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  return Child{pid, fds[0]};
}

ProcessResult wait_process(Child child) {
  ProcessResult result;
  std::array<char, 4096> buffer{};
  while (true) {
    const ssize_t n = ::read(child.stdout_fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;
    }
    result.output.append(buffer.data(), static_cast<std::size_t>(n));
  }
  ::close(child.stdout_fd);
  int status = 0;
  while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::istringstream lines(result.output);
  std::string line;
  while (std::getline(lines, line)) {
    if (const auto eq = line.find('='); eq != std::string::npos) {
      result.values[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  return result;
}

ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::vector<std::string>& env) {
  return wait_process(start_process(argv, env));
}

std::string helper_path() {
  return KJIT_TEST_HELPER;
}

std::filesystem::path source_dir() {
  return KJIT_SOURCE_DIR;
}

LogCapture::LogCapture() {
  set_log_handler([this](LogLevel level, std::string_view message) {
    std::lock_guard lock(m_mutex);
    m_messages.emplace_back(level, std::string(message));
  });
}

LogCapture::~LogCapture() {
  set_log_handler(nullptr);
}

std::vector<std::string> LogCapture::messages(LogLevel at_least) const {
  std::lock_guard lock(m_mutex);
  std::vector<std::string> result;
  for (const auto& [level, message] : m_messages) {
    if (level >= at_least) {
      result.push_back(message);
    }
  }
  return result;
}

std::size_t LogCapture::count(const std::string& text) const {
  std::size_t n = 0;
  for (const auto& message : messages()) {
    if (message.find(text) != std::string::npos) {
      ++n;
    }
  }
  return n;
}

} // namespace kjit::test
