#include "entry_points.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <string_view>

namespace kjit::python {
namespace {

constexpr std::size_t k_max_file = 1 << 20; // an entry_points.txt larger than this is skipped

bool ends_with(std::string_view text, std::string_view tail) {
  return text.size() >= tail.size() && text.substr(text.size() - tail.size()) == tail;
}

// The text of `name` under the folder `dir_fd`, or empty when it cannot be read or is larger
// than k_max_file. Three system calls for a small file (open, read, read at the end).
std::string read_small(int dir_fd, const std::string& name) {
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return {};
  }
  std::string text;
  char buffer[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0 || text.size() + static_cast<std::size_t>(n) > k_max_file) {
      if (n != 0) {
        text.clear(); // an error, a folder, or too large
      }
      break;
    }
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

} // namespace

std::vector<std::pair<std::string, std::string>>
entry_point_files(const std::vector<std::string>& dirs, const std::string& group) {
  const std::string header = "[" + group + "]";
  std::vector<std::pair<std::string, std::string>> found;
  for (const auto& dir : dirs) {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      continue;
    }
    while (const dirent* entry = ::readdir(d)) {
      const std::string_view name = entry->d_name;
      if (!ends_with(name, ".dist-info") && !ends_with(name, ".egg-info")) {
        continue;
      }
      std::string path = dir + "/" + std::string(name);
      std::string text = read_small(::dirfd(d), std::string(name) + "/entry_points.txt");
      if (text.find(header) == std::string::npos) {
        text.clear();
      }
      found.emplace_back(std::move(path), std::move(text));
    }
    ::closedir(d);
  }
  return found;
}

} // namespace kjit::python
