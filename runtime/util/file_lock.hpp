// Advisory locks on byte ranges of one lock file: one lock per 64-bit id, held by an open file
// description (Linux OFD locks), so threads and processes exclude each other and the kernel drops
// a dead process's locks. No project types.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace kjit::detail {

// Owning file descriptor; closes on destruction.
class UniqueFd {
public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : m_fd(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept : m_fd(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const noexcept { return m_fd; }
  int release() noexcept;
  explicit operator bool() const noexcept { return m_fd >= 0; }

private:
  int m_fd = -1;
};

class LockFile;

// A held lock; released on destruction. Move-only.
class LockGuard {
public:
  LockGuard() = default;
  LockGuard(LockGuard&& other) noexcept;
  LockGuard& operator=(LockGuard&& other) noexcept;
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;
  ~LockGuard();

  // Whether a lock is held (false when the lock file could not be used).
  explicit operator bool() const noexcept { return m_file != nullptr; }

private:
  friend class LockFile;
  LockGuard(const LockFile* file, std::int64_t offset) noexcept : m_file(file), m_offset(offset) {}
  const LockFile* m_file = nullptr;
  std::int64_t m_offset = 0;
};

class LockFile {
public:
  // Opens (creating) `path`. When it cannot be opened, locking yields empty guards and `error()`
  // says why.
  explicit LockFile(const std::filesystem::path& path);

  // Blocks until the lock for `id` is held, for each open file description (each `LockFile`) in
  // the same or another process. Returns an empty guard when locking is impossible.
  LockGuard lock(std::uint64_t id) const;

  const std::string& error() const noexcept { return m_error; }

private:
  friend class LockGuard;
  void unlock(std::int64_t offset) const noexcept;
  UniqueFd m_fd;
  std::string m_error;
};

} // namespace kjit::detail
