#include "runtime/logging.hpp"

#include "runtime/util/assert.hpp"
#include "runtime/util/env.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace kjit {
namespace {

LogLevel level_from_env() {
  auto value = detail::getenv_nonempty("KJIT_LOG");
  if (!value) {
    return LogLevel::warning;
  }
  if (*value == "debug") {
    return LogLevel::debug;
  }
  if (*value == "info") {
    return LogLevel::info;
  }
  if (*value == "off" || *value == "quiet" || *value == "none") {
    return LogLevel::off;
  }
  return LogLevel::warning;
}

std::atomic<LogLevel> g_level{level_from_env()};
std::mutex g_handler_mutex;
LogHandler g_handler; // guarded by g_handler_mutex; empty means stderr

std::string_view level_name(LogLevel level) {
  switch (level) {
  case LogLevel::debug:
    return "debug";
  case LogLevel::info:
    return "info";
  case LogLevel::warning:
    return "warning";
  case LogLevel::off:
    break;
  }
  return "";
}

} // namespace

void set_log_handler(LogHandler handler) {
  std::lock_guard lock(g_handler_mutex);
  g_handler = std::move(handler);
}

void set_log_level(LogLevel level) {
  g_level.store(level, std::memory_order_relaxed);
}

namespace detail {

bool log_enabled(LogLevel level) noexcept {
  return level != LogLevel::off && level >= g_level.load(std::memory_order_relaxed);
}

void log_message(LogLevel level, std::string_view message) noexcept {
  std::lock_guard lock(g_handler_mutex);
  if (g_handler) {
    try {
      g_handler(level, message);
    } catch (...) {
      // A throwing handler must not turn a warning into a failure.
    }
    return;
  }
  std::fprintf(stderr, "kjit: %.*s: %.*s\n", static_cast<int>(level_name(level).size()),
               level_name(level).data(), static_cast<int>(message.size()), message.data());
}

void assertion_failed(const char* expression, const char* file, int line,
                      const char* function) noexcept {
  std::fprintf(stderr, "kjit: internal error: assertion '%s' failed in %s (%s:%d)\n", expression,
               function, file, line);
  std::abort();
}

} // namespace detail
} // namespace kjit
