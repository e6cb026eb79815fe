#include "runtime/util/env.hpp"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace kjit::detail {

std::optional<std::string> getenv_nonempty(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return std::nullopt;
  }
  return std::string(value);
}

bool env_flag(const char* name) {
  auto value = getenv_nonempty(name);
  if (!value) {
    return false;
  }
  std::string lower;
  for (char c : *value) {
    lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return lower == "1" || lower == "true" || lower == "yes" || lower == "on";
}

std::vector<std::filesystem::path> env_paths(const char* name) {
  std::vector<std::filesystem::path> paths;
  if (auto text = getenv_nonempty(name)) {
    std::string_view rest = *text;
    while (!rest.empty()) {
      const auto colon = rest.find(':');
      if (colon != 0) {
        paths.emplace_back(std::string(rest.substr(0, colon)));
      }
      if (colon == std::string_view::npos) {
        break;
      }
      rest.remove_prefix(colon + 1);
    }
  }
  return paths;
}

std::optional<std::uint64_t> parse_size(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  double number = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec != std::errc() || number < 0 || !std::isfinite(number)) {
    return std::nullopt;
  }
  std::string unit(end, text.data() + text.size());
  for (char& c : unit) {
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  if (unit.ends_with("IB")) {
    unit.resize(unit.size() - 2);
  } else if (unit.size() == 2 && unit.back() == 'B') {
    unit.resize(1);
  }
  double scale = 1;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "K") {
    scale = 1024.0;
  } else if (unit == "M") {
    scale = 1024.0 * 1024;
  } else if (unit == "G") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "T") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return std::nullopt;
  }
  // Sizes from 2^63 bytes up are mistakes (or wrapped negatives), never "everything".
  const double bytes = number * scale;
  if (!(bytes < 9.2e18)) {
    return std::nullopt;
  }
  return static_cast<std::uint64_t>(bytes);
}

std::string format_size(std::uint64_t bytes) {
  if (bytes < 1024) {
    return fmt::format("{} B", bytes);
  }
  static constexpr const char* k_units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, k_units[unit]);
}

} // namespace kjit::detail
