// Environment variables and human-readable sizes. No project types.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kjit::detail {

// The value of `name`, or nullopt when unset or empty.
std::optional<std::string> getenv_nonempty(const char* name);

// Whether `name` is set to a true value ("1", "true", "yes", "on"; case-insensitive).
bool env_flag(const char* name);

// The ':'-separated paths in environment variable `name` (empty entries skipped).
std::vector<std::filesystem::path> env_paths(const char* name);

// Parses "2G", "500M", "64k", "2GiB", "1.5G" or a byte count (K = 1024). Returns nullopt when the
// text is not a size.
std::optional<std::uint64_t> parse_size(std::string_view text);

// "1.5 GiB", "12.0 MiB", "512 B".
std::string format_size(std::uint64_t bytes);

} // namespace kjit::detail
