// Where kjit's warnings go.
//
// **Example**
//
//   kjit::set_log_handler([](kjit::LogLevel level, std::string_view message) {
//     my_logger.log(level == kjit::LogLevel::warning ? WARN : DEBUG, message);
//   });
//
// By default warnings go to stderr as "kjit: warning: ...". `KJIT_LOG=debug|info|warning|off`
// sets the default level.
#pragma once

#include <functional>
#include <string_view>

namespace kjit {

enum class LogLevel { debug, info, warning, off };

using LogHandler = std::function<void(LogLevel, std::string_view)>;

// Replaces the handler (nullptr restores the default). Thread-safe.
void set_log_handler(LogHandler handler);

// Messages below `level` are dropped.
void set_log_level(LogLevel level);

} // namespace kjit
