#include "runtime/compile/pch_folder.hpp"

#include "runtime/logging.hpp"
#include "runtime/util/env.hpp"
#include "runtime/util/file_lock.hpp"

#include <chrono>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <cerrno>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

// Note [PCH folders]: NVRTC keeps a process's automatic precompiled headers in files of a folder
// it makes under $TMPDIR or /tmp (`__nvrtc_auto_pch_<pid>_0`) and removes them when the process
// exits. A killed process (SIGKILL, the OOM killer, a timeout) leaves the folder with its PCH
// files (7-100 MB each), and nobody can tell later whether its pid is gone: /tmp is shared across
// PID namespaces (containers), where the same pid is another, live process, whose compiles with
// PCH fail once its folder is gone (NVRTC: "invalid PCH directory"; kjit then compiles without).
//
// So kjit names the folder itself (`--pch-dir`): `kjit-pch-XXXXXX`, holding a file `owner` that
// the process keeps locked (flock, on an open file description the kernel releases when the
// process dies, whatever its namespace). A folder whose owner lock can be taken is a dead
// process's, and the first PCH compile of each process removes those. A folder is made as
// `.kjit-pch-new-XXXXXX`, locked, then renamed, so a sweep never sees a live folder unlocked; a
// `.kjit-pch-new-` folder left by a process killed in between is removed once it is 10 minutes
// old, and so is a named folder that lost its owner file, where it is empty. Only real
// directories of this user are looked at (no symlinks followed; /tmp's sticky bit keeps other
// users from renaming them). NVRTC still removes its files at a normal exit, and kjit removes the
// folder then. A forked child that exits normally leaves its parent's folder and owner file (the
// pid is checked), but NVRTC in it removes the parent's PCH files, which the parent then makes
// again; with NVRTC's own folder the child removed the whole folder (both seen with NVRTC 13.0).
namespace kjit::detail {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view k_prefix = "kjit-pch-";
constexpr std::string_view k_new_prefix = ".kjit-pch-new-";
constexpr auto k_unfinished_age = std::chrono::minutes(10);

// The owner file of `folder` (opened relative to `base_fd`, no link followed); empty where it has
// none.
UniqueFd open_owner(int base_fd, const char* folder) {
  const UniqueFd dir(::openat(base_fd, folder, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) {
    return UniqueFd();
  }
  return UniqueFd(::openat(dir.get(), "owner", O_RDWR | O_NOFOLLOW | O_CLOEXEC));
}

// This process's folder: old folders swept and a new one made when constructed, removed when
// destroyed (at exit) by the process that made it.
struct PchFolder {
  std::string path;
  UniqueFd owner; // locked while the process lives
  pid_t creator = 0;

  PchFolder();
  PchFolder(const PchFolder&) = delete;
  PchFolder& operator=(const PchFolder&) = delete;
  ~PchFolder() {
    if (!path.empty() && ::getpid() == creator) {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  }
};

// Makes this process's folder under `base`: made under a temporary name, its owner file locked,
// then renamed. Returns false (and says why at debug) where that fails.
bool make_folder(const fs::path& base, PchFolder& folder) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::string made = (base / (std::string(k_new_prefix) + "XXXXXX")).string();
    if (::mkdtemp(made.data()) == nullptr) {
      log(LogLevel::debug, "cannot make a PCH folder in '{}': {}", base.string(),
          std::strerror(errno));
      return false;
    }
    UniqueFd owner(
      ::open((fs::path(made) / "owner").c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    std::error_code ignored;
    if (!owner || ::flock(owner.get(), LOCK_EX | LOCK_NB) != 0) {
      log(LogLevel::debug, "cannot lock a PCH folder in '{}': {}", base.string(),
          std::strerror(errno));
      fs::remove_all(made, ignored);
      return false;
    }
    const std::string suffix = made.substr(made.size() - 6);
    const std::string named = (base / (std::string(k_prefix) + suffix)).string();
    if (::rename(made.c_str(), named.c_str()) == 0) {
      folder.path = named;
      folder.owner = std::move(owner);
      folder.creator = ::getpid();
      return true;
    }
    fs::remove_all(made, ignored); // that name is taken: another try
  }
  return false;
}

PchFolder::PchFolder() {
  const fs::path base = pch_base_dir();
  if (const std::size_t removed = sweep_pch_folders(base); removed > 0) {
    log(LogLevel::debug, "removed {} PCH folder(s) of processes that are gone from '{}'", removed,
        base.string());
  }
  make_folder(base, *this);
}

} // namespace

fs::path pch_base_dir() {
  const auto tmpdir = getenv_nonempty("TMPDIR");
  return tmpdir ? fs::path(*tmpdir) : fs::path("/tmp");
}

std::size_t sweep_pch_folders(const fs::path& base) {
  const UniqueFd base_fd(::open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!base_fd) {
    return 0;
  }
  // The folders to remove, each with its owner lock held until it is gone: two processes sweeping
  // at once would otherwise both remove it, and each stop at the files the other removed first,
  // leaving it half removed.
  std::vector<std::pair<std::string, UniqueFd>> dead;
  std::size_t emptied = 0;
  {
    UniqueFd listing_fd(::dup(base_fd.get()));
    DIR* listing = listing_fd ? ::fdopendir(listing_fd.get()) : nullptr;
    if (listing == nullptr) {
      return 0;
    }
    listing_fd.release(); // closedir closes it
    while (const dirent* entry = ::readdir(listing)) {
      const std::string_view name = entry->d_name;
      const bool named = name.starts_with(k_prefix);
      const bool unfinished = name.starts_with(k_new_prefix);
      if (!named && !unfinished) {
        continue;
      }
      struct stat info {};
      if (::fstatat(base_fd.get(), entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISDIR(info.st_mode) || info.st_uid != ::geteuid()) {
        continue; // another user's, a link or not a folder
      }
      const bool old =
        ::time(nullptr) - info.st_mtime > std::chrono::seconds(k_unfinished_age).count();
      if (unfinished && !old) {
        continue; // perhaps being made right now
      }
      UniqueFd owner = open_owner(base_fd.get(), entry->d_name);
      if (owner ? ::flock(owner.get(), LOCK_EX | LOCK_NB) == 0 : unfinished) {
        dead.emplace_back(name, std::move(owner));
      } else if (!owner && old && ::unlinkat(base_fd.get(), entry->d_name, AT_REMOVEDIR) == 0) {
        // A named folder without its owner file (something removed it): only when it is empty
        // (rmdir), as no live process's PCH files can then be in it.
        ++emptied;
      }
    }
    ::closedir(listing);
  }
  std::size_t removed = emptied;
  for (const auto& [name, lock] : dead) {
    std::error_code error;
    fs::remove_all(base / name, error);
    if (error) {
      log(LogLevel::debug, "cannot remove the PCH folder '{}': {}", (base / name).string(),
          error.message());
    } else {
      ++removed;
    }
  }
  return removed;
}

const std::string& pch_folder() {
  static const PchFolder folder;
  return folder.path;
}

} // namespace kjit::detail
