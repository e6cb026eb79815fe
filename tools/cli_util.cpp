#include "tools/cli.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <string>

namespace fs = std::filesystem;
using nlohmann::json;

namespace kjit_cli {
namespace {

fs::path executable_dir() {
  std::error_code ec;
  const auto self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : self.parent_path();
}

} // namespace

std::vector<fs::path> builtin_package_dirs() {
  std::vector<fs::path> dirs = kjit::installed_package_dirs();
  const fs::path exe = executable_dir();
  std::error_code ec;
  // The tool's own neighbours too (it may be linked statically, far from a libkjit), and the
  // source tree of this build last.
  for (const auto& candidate : {exe / ".." / "share" / "kjit" / "kernels", exe / ".." / "kernels",
                                fs::path(KJIT_SOURCE_KERNELS)}) {
    if (fs::is_directory(candidate, ec)) {
      const auto dir = fs::weakly_canonical(candidate, ec);
      if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) {
        dirs.push_back(dir);
      }
      break;
    }
  }
  return dirs;
}

std::string human_time(std::int64_t unix_seconds) {
  if (unix_seconds <= 0) {
    return "-";
  }
  const std::time_t t = unix_seconds;
  std::tm tm{};
  localtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M", &tm);
  return text;
}

std::string size_text(std::uint64_t bytes) {
  if (bytes < 1024) {
    return fmt::format("{} B", bytes);
  }
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, units[unit]);
}

std::optional<std::int64_t> parse_duration(const std::string& text) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const std::string unit = text.substr(used);
  const std::int64_t scale = unit.empty() || unit == "s" ? 1
                             : unit == "m"               ? 60
                             : unit == "h"               ? 3600
                             : unit == "d"               ? 86400
                             : unit == "w"               ? 7 * 86400
                                                         : 0;
  std::int64_t seconds = 0;
  if (scale == 0 || value < 0 || __builtin_mul_overflow(value, scale, &seconds)) {
    return std::nullopt;
  }
  return seconds;
}

json stats_json(const kjit::CacheStats& s) {
  return {{"memory_hits", s.memory_hits},
          {"memory_misses", s.memory_misses},
          {"store_hits", s.store_hits},
          {"store_misses", s.store_misses},
          {"compiles", s.compiles},
          {"compile_ms", s.compile_ms},
          {"corrupt", s.corrupt},
          {"evictions", s.evictions},
          {"entries", s.entries},
          {"size_bytes", s.size_bytes},
          {"remote",
           {{"hits", s.remote.hits},
            {"misses", s.remote.misses},
            {"errors", s.remote.errors},
            {"timeouts", s.remote.timeouts},
            {"bad_entries", s.remote.bad_entries},
            {"writes", s.remote.writes},
            {"dropped", s.remote.dropped},
            {"lock_waits", s.remote.lock_waits},
            {"bytes_read", s.remote.bytes_read},
            {"bytes_written", s.remote.bytes_written},
            {"saved_ms", s.remote.saved_ms}}}};
}

} // namespace kjit_cli
