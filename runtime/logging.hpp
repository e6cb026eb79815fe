// kjit's internal logging, routed to the handler set with `kjit::set_log_handler`.
#pragma once

#include <kjit/log.hpp>

#include <fmt/format.h>

#include <string_view>

namespace kjit::detail {

bool log_enabled(LogLevel level) noexcept;
void log_message(LogLevel level, std::string_view message) noexcept;

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) noexcept {
  if (log_enabled(level)) {
    try {
      log_message(level, fmt::format(format, std::forward<Args>(args)...));
    } catch (...) {
      // A message that cannot be formatted is dropped: logging never fails the caller.
    }
  }
}

} // namespace kjit::detail
