// Small file helpers. No project types.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace kjit::detail {

// The whole content of `path`, or nullopt (with `error` set to strerror) when it cannot be read.
std::optional<std::string> read_file(const std::filesystem::path& path,
                                     std::string* error = nullptr);

// Writes `content` to `path` through a temporary file and a rename, so readers never see a partial
// file. Returns an error message, or an empty string on success.
std::string write_file_atomic(const std::filesystem::path& path, std::string_view content);

// Creates `dir` and missing parents; a directory it creates gets mode 0700. Returns an error
// message, or an empty string on success.
std::string create_private_dirs(const std::filesystem::path& dir);

// Why `path` must not be trusted with this user's data: owned by another user, or writable by
// group or others. Empty when it is safe (or does not exist).
std::string untrusted_reason(const std::filesystem::path& path);

// Whether the calling process may write into directory `dir` (access(2) W_OK|X_OK).
bool dir_writable(const std::filesystem::path& dir);

} // namespace kjit::detail
