#include <kjit/error.hpp>
#include <kjit/warm.hpp>

#include "runtime/util/env.hpp"

#include <fmt/format.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

#include <csignal>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace kjit {

std::vector<WarmJob> warm_jobs(const std::vector<Package>& packages,
                               const std::vector<Target>& targets) {
  std::vector<WarmJob> jobs;
  for (const auto& package : packages) {
    for (const auto& item : package.warm_list()) {
      for (const auto& target : targets) {
        jobs.push_back(WarmJob{package.name(), item.op, item.kernel, item.program, target});
      }
    }
  }
  return jobs;
}

namespace {

using Clock = std::chrono::steady_clock;

WarmResult run_job(Runtime& runtime, const WarmJob& job) {
  WarmResult result;
  result.job = &job;
  const auto start = Clock::now();
  try {
    const Binary binary = runtime.compile(job.program, job.target);
    result.ok = true;
    result.cached = binary.cached;
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  result.ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return result;
}

// Counts a result into the summary and reports it.
void record(WarmSummary& summary, const WarmOptions& options, std::size_t& done,
            WarmResult result) {
  ++done;
  if (!result.ok) {
    ++summary.failed;
    summary.failures.push_back(result);
  } else if (result.cached) {
    ++summary.cached;
  } else {
    ++summary.compiled;
  }
  if (options.on_result) {
    options.on_result(result, done, summary.all.size());
  }
}

void warm_threads(Runtime& runtime, WarmSummary& summary, const WarmOptions& options) {
  std::atomic<std::size_t> next{0};
  std::mutex mutex; // guards the summary and serializes on_result
  std::size_t done = 0;
  auto worker = [&] {
    for (std::size_t i = next++; i < summary.all.size(); i = next++) {
      WarmResult result = run_job(runtime, summary.all[i]);
      std::lock_guard lock(mutex);
      record(summary, options, done, std::move(result));
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < summary.jobs; ++t) {
    threads.emplace_back(worker);
  }
  worker();
  for (auto& thread : threads) {
    thread.join();
  }
}

// Note [Warm worker processes]: the parent hands out job indices one at a time over a socket
// pair per worker (a worker asks for the next by answering the last), so fast and slow jobs
// balance as with threads. A worker's answer is a `WireResult` and the error text.
struct WireResult {
  std::uint32_t index;
  std::uint8_t ok;
  std::uint8_t cached;
  double ms;
  std::uint32_t error_size;
};

// Moves `size` bytes with `step(done)` (one send or read from offset `done`), through EINTR.
template <class Step>
bool whole(std::size_t size, Step step) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = step(done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

bool write_all(int fd, const void* data, std::size_t size) {
  return whole(size, [&](std::size_t done) {
    return ::send(fd, static_cast<const char*>(data) + done, size - done, MSG_NOSIGNAL);
  });
}

bool read_all(int fd, void* data, std::size_t size) {
  return whole(size, [&](std::size_t done) {
    return ::read(fd, static_cast<char*>(data) + done, size - done);
  });
}

[[noreturn]] void warm_worker(const std::vector<WarmJob>& jobs, const RuntimeOptions& options,
                              int fd) {
  int code = 0;
  try {
    Runtime runtime(options);
    std::uint32_t index = 0;
    while (read_all(fd, &index, sizeof index) && index < jobs.size()) {
      const WarmResult result = run_job(runtime, jobs[index]);
      const WireResult wire{index, result.ok, result.cached, result.ms,
                            static_cast<std::uint32_t>(result.error.size())};
      if (!write_all(fd, &wire, sizeof wire) ||
          !write_all(fd, result.error.data(), result.error.size())) {
        break;
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "kjit: warm worker: " << e.what() << "\n";
    code = 1;
  }
  ::_exit(code);
}

void warm_processes(WarmSummary& summary, const WarmOptions& options) {
  struct Worker {
    pid_t pid = -1;
    int fd = -1;
    std::int64_t job = -1; // the index it works on
  };
  std::cout.flush(); // a child must not inherit buffered output
  std::cerr.flush();
  std::vector<Worker> workers;
  for (unsigned w = 0; w < summary.jobs; ++w) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      throw Error(fmt::format("cannot start warm workers: socketpair: {}", std::strerror(errno)));
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw Error(fmt::format("cannot start warm workers: fork: {}", std::strerror(errno)));
    }
    if (pid == 0) {
      ::close(fds[0]);
      for (const Worker& other : workers) {
        ::close(other.fd);
      }
      warm_worker(summary.all, *options.processes, fds[1]);
    }
    ::close(fds[1]);
    workers.push_back(Worker{pid, fds[0], -1});
  }

  std::size_t next = 0;
  std::size_t done = 0;
  auto hand_out = [&](Worker& worker) {
    worker.job = -1;
    if (next < summary.all.size()) {
      const auto index = static_cast<std::uint32_t>(next);
      if (write_all(worker.fd, &index, sizeof index)) {
        worker.job = static_cast<std::int64_t>(next++);
        return;
      }
    }
    ::shutdown(worker.fd, SHUT_WR); // nothing more: the worker exits
  };
  auto fail = [&](std::size_t index, std::string error) {
    WarmResult result;
    result.job = &summary.all[index];
    result.error = std::move(error);
    record(summary, options, done, std::move(result));
  };
  for (Worker& worker : workers) {
    hand_out(worker);
  }
  while (true) {
    std::vector<pollfd> polled;
    std::vector<Worker*> owners;
    for (Worker& worker : workers) {
      if (worker.job >= 0) {
        polled.push_back(pollfd{worker.fd, POLLIN, 0});
        owners.push_back(&worker);
      }
    }
    if (polled.empty()) {
      break;
    }
    if (::poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw Error(fmt::format("warm: poll: {}", std::strerror(errno)));
    }
    for (std::size_t i = 0; i < polled.size(); ++i) {
      if (polled[i].revents == 0) {
        continue;
      }
      Worker& worker = *owners[i];
      const auto index = static_cast<std::size_t>(worker.job);
      WireResult wire{};
      std::string error;
      const bool answered = read_all(worker.fd, &wire, sizeof wire);
      bool ok = answered && wire.index == index;
      if (ok) {
        error.resize(wire.error_size);
        ok = read_all(worker.fd, error.data(), error.size());
      }
      if (!ok) {
        // The worker died (or broke the protocol): its job fails, the others go on.
        // A closed socket means the worker is exiting: wait for its status as it is.
        if (answered && wire.index != index) {
          ::kill(worker.pid, SIGKILL); // alive but not making sense: stop it
        }
        int status = 0;
        ::waitpid(worker.pid, &status, 0);
        worker.pid = -1;
        ::close(worker.fd);
        worker.job = -1;
        fail(index,
             WIFSIGNALED(status)
               ? fmt::format("the warm worker process died of signal {} ({})", WTERMSIG(status),
                             ::strsignal(WTERMSIG(status)))
               : fmt::format("the warm worker process exited with status {}", WEXITSTATUS(status)));
        continue;
      }
      WarmResult result;
      result.job = &summary.all[index];
      result.ok = wire.ok != 0;
      result.cached = wire.cached != 0;
      result.ms = wire.ms;
      result.error = std::move(error);
      record(summary, options, done, std::move(result));
      hand_out(worker);
    }
  }
  // Jobs no worker could take (every worker died) fail too.
  while (next < summary.all.size()) {
    fail(next++, "no warm worker process left to compile it");
  }
  for (Worker& worker : workers) {
    if (worker.pid > 0) {
      int status = 0;
      ::waitpid(worker.pid, &status, 0);
      ::close(worker.fd);
    }
  }
}

} // namespace

WarmSummary warm(Runtime& runtime, const std::vector<Package>& packages,
                 const WarmOptions& options) {
  WarmSummary summary;
  summary.all = warm_jobs(packages, options.targets);
  const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
  summary.jobs = std::max(1U, std::min<unsigned>(options.jobs == 0 ? cores : options.jobs,
                                                 static_cast<unsigned>(summary.all.size())));
  const auto start = Clock::now();
  if (options.processes && summary.jobs > 1) {
    WarmOptions forked = options;
    if (!runtime.cache().enabled()) {
      // The store already failed here (and said so): the workers go without it, silently.
      forked.processes->disable_cache = true;
    }
    warm_processes(summary, forked);
  } else {
    warm_threads(runtime, summary, options);
  }
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return summary;
}

std::vector<std::filesystem::path> installed_package_dirs() {
  std::vector<std::filesystem::path> dirs;
  if (auto env = detail::getenv_nonempty("KJIT_BUILTIN_PACKAGES")) {
    dirs.emplace_back(*env);
  }
  std::vector<std::filesystem::path> candidates;
  Dl_info info{};
  std::error_code ec;
  if (::dladdr(reinterpret_cast<void*>(&installed_package_dirs), &info) != 0 &&
      info.dli_fname != nullptr) {
    const auto here = std::filesystem::weakly_canonical(info.dli_fname, ec).parent_path();
    candidates = {here / ".." / "share" / "kjit" / "kernels", here / "kernels",
                  here / ".." / "kernels"};
  }
#ifdef KJIT_INSTALL_KERNELS
  candidates.emplace_back(KJIT_INSTALL_KERNELS);
#endif
  for (const auto& candidate : candidates) {
    if (std::filesystem::is_directory(candidate, ec)) {
      dirs.push_back(std::filesystem::weakly_canonical(candidate, ec));
      break;
    }
  }
  return dirs;
}

std::vector<std::filesystem::path>
package_search_path(const std::vector<std::filesystem::path>& builtin) {
  std::vector<std::filesystem::path> path = detail::env_paths("KJIT_PATH");
  for (const auto& dir : builtin) {
    if (std::find(path.begin(), path.end(), dir) == path.end()) {
      path.push_back(dir);
    }
  }
  return path;
}

std::vector<std::filesystem::path>
find_packages(const std::vector<std::filesystem::path>& search_path) {
  std::vector<std::filesystem::path> found;
  for (const auto& root : search_path) {
    std::error_code ec;
    std::vector<std::filesystem::path> here;
    for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
      if (std::filesystem::is_regular_file(entry.path() / "kernel.toml", ec)) {
        here.push_back(entry.path());
      }
    }
    std::sort(here.begin(), here.end());
    found.insert(found.end(), here.begin(), here.end());
  }
  return found;
}

std::filesystem::path find_package(std::string_view name,
                                   const std::vector<std::filesystem::path>& search_path) {
  std::error_code ec;
  const std::filesystem::path as_path(name);
  if (std::filesystem::is_regular_file(as_path / "kernel.toml", ec) ||
      (as_path.filename() == "kernel.toml" && std::filesystem::is_regular_file(as_path, ec))) {
    return as_path;
  }
  std::string searched;
  for (const auto& root : search_path) {
    if (std::filesystem::is_regular_file(root / name / "kernel.toml", ec)) {
      return root / name;
    }
    searched += (searched.empty() ? "" : ", ") + root.string();
  }
  throw Error(fmt::format("no kernel package '{}': not a folder with a kernel.toml, and not in "
                          "the search path ({}); set KJIT_PATH to add folders",
                          name, searched.empty() ? "empty" : searched));
}

} // namespace kjit
