// Small file helpers. No project types.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace kjit::detail {

// The most a source, header or manifest may hold.
inline constexpr std::size_t k_max_source_bytes = 16u << 20;

// The whole content of the regular file `path`, or nullopt with `error` set (strerror, "not a
// regular file" for FIFOs, devices and folders, or "larger than N bytes"). Never blocks on a
// FIFO and never reads past `max_bytes`.
std::optional<std::string> read_file(const std::filesystem::path& path,
                                     std::string* error = nullptr,
                                     std::size_t max_bytes = k_max_source_bytes);

// Writes `content` to `path` through a temporary file and a rename, so readers never see a partial
// file. Returns an error message, or an empty string on success.
std::string write_file_atomic(const std::filesystem::path& path, std::string_view content);

// Creates `dir` and missing parents; a directory it creates gets mode 0700. Returns an error
// message, or an empty string on success.
std::string create_private_dirs(const std::filesystem::path& dir);

// Why `path` must not be trusted with this user's data: owned by another user (root too, unless
// `root_ok`), or writable by group or others (a sticky folder such as /tmp is fine: others cannot
// replace what is in it). Empty when it is safe (or does not exist).
std::string untrusted_reason(const std::filesystem::path& path, bool root_ok = false);

// Whether the calling process may write into directory `dir` (access(2) W_OK|X_OK).
bool dir_writable(const std::filesystem::path& dir);

} // namespace kjit::detail
