#include "runtime/util/file.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kjit::detail {

std::optional<std::string> read_file(const std::filesystem::path& path, std::string* error,
                                     std::size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (error != nullptr) {
      *error = std::strerror(errno);
    }
    return std::nullopt;
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) ||
      static_cast<std::uint64_t>(info.st_size) > max_bytes) {
    if (error != nullptr) {
      *error = !S_ISREG(info.st_mode) ? std::string("not a regular file")
                                      : fmt::format("larger than {} bytes", max_bytes);
    }
    ::close(fd);
    return std::nullopt;
  }
  std::string content;
  char buffer[65536];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      if (error != nullptr) {
        *error = std::strerror(errno);
      }
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) {
      break;
    }
    if (content.size() + static_cast<std::size_t>(n) > max_bytes) { // grew while read
      if (error != nullptr) {
        *error = fmt::format("larger than {} bytes", max_bytes);
      }
      ::close(fd);
      return std::nullopt;
    }
    content.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return content;
}

std::string write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  const std::string tmp = fmt::format("{}.tmp.{}", path.string(), ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return fmt::format("cannot create '{}': {}", tmp, std::strerror(errno));
  }
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      const std::string message = fmt::format("cannot write '{}': {}", tmp, std::strerror(errno));
      ::close(fd);
      ::unlink(tmp.c_str());
      return message;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string message =
      fmt::format("cannot write '{}': {}", path.string(), std::strerror(errno));
    ::unlink(tmp.c_str());
    return message;
  }
  return {};
}

std::string create_private_dirs(const std::filesystem::path& dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) {
    return {};
  }
  if (dir.has_parent_path() && dir.parent_path() != dir) {
    // Parents are made with the usual mode, like `mkdir -p`; only kjit's own folder is private.
    std::filesystem::create_directories(dir.parent_path(), ec);
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return fmt::format("cannot create directory '{}': {}", dir.string(), std::strerror(errno));
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return fmt::format("'{}' exists and is not a directory", dir.string());
  }
  return {};
}

std::string untrusted_reason(const std::filesystem::path& path, bool root_ok) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return {};
  }
  if (info.st_uid != ::geteuid() && !(root_ok && info.st_uid == 0)) {
    return fmt::format("'{}' belongs to user id {}, not to this user ({})", path.string(),
                       info.st_uid, ::geteuid());
  }
  const bool sticky_dir = S_ISDIR(info.st_mode) && (info.st_mode & S_ISVTX) != 0;
  if ((info.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !sticky_dir) {
    return fmt::format("'{}' is writable by {} (mode {:o})", path.string(),
                       (info.st_mode & S_IWOTH) != 0 ? "others" : "its group",
                       info.st_mode & 07777);
  }
  return {};
}

bool dir_writable(const std::filesystem::path& dir) {
  return ::access(dir.c_str(), W_OK | X_OK) == 0;
}

} // namespace kjit::detail
