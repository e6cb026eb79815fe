#include "runtime/util/file_lock.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>
#include <utility>

namespace kjit::detail {

UniqueFd::~UniqueFd() {
  if (m_fd >= 0) {
    ::close(m_fd);
  }
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (m_fd >= 0) {
      ::close(m_fd);
    }
    m_fd = other.release();
  }
  return *this;
}

int UniqueFd::release() noexcept {
  return std::exchange(m_fd, -1);
}

LockGuard::LockGuard(LockGuard&& other) noexcept
  : m_file(std::exchange(other.m_file, nullptr)), m_offset(other.m_offset) {}

LockGuard& LockGuard::operator=(LockGuard&& other) noexcept {
  if (this != &other) {
    if (m_file != nullptr) {
      m_file->unlock(m_offset);
    }
    m_file = std::exchange(other.m_file, nullptr);
    m_offset = other.m_offset;
  }
  return *this;
}

LockGuard::~LockGuard() {
  if (m_file != nullptr) {
    m_file->unlock(m_offset);
  }
}

LockFile::LockFile(const std::filesystem::path& path)
  : m_fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
  if (!m_fd) {
    m_error = fmt::format("cannot open lock file '{}': {}", path.string(), std::strerror(errno));
  }
}

LockGuard LockFile::lock(std::uint64_t id) const {
  if (!m_fd) {
    return {};
  }
  // One byte per id; offsets stay positive and below the largest off_t.
  const auto offset = static_cast<std::int64_t>(id & 0x3fffffffffffffffULL);
  struct flock request = {};
  request.l_type = F_WRLCK;
  request.l_whence = SEEK_SET;
  request.l_start = offset;
  request.l_len = 1;
  while (::fcntl(m_fd.get(), F_OFD_SETLKW, &request) != 0) {
    if (errno != EINTR) {
      return {};
    }
  }
  return LockGuard(this, offset);
}

void LockFile::unlock(std::int64_t offset) const noexcept {
  struct flock request = {};
  request.l_type = F_UNLCK;
  request.l_whence = SEEK_SET;
  request.l_start = offset;
  request.l_len = 1;
  ::fcntl(m_fd.get(), F_OFD_SETLK, &request);
}

} // namespace kjit::detail
