// The fleet tier (Note [Remote tier]) against real redis-servers, each case beside its peer:
//   remote hit      a new process, request -> launchable, entry in Redis only  vs  a local hit,
//                   and vs the cold compile it replaces
//   Redis refused   first use with the server down (connection refused)  vs  cold without a tier
//   Redis hung      first use with the server stopped (SIGSTOP)  vs  cold without a tier
//   breaker open    a lookup while the breaker is open (in process)
// Without a GPU the cases measure request -> binary in memory (nothing is loaded). Each request
// is a new process's first: it includes loading NVRTC (dlopen, about 6 ms on the CPU machine),
// which every case pays alike, since the cache key holds NVRTC's version.
//
//   kjit_bench_remote SOURCE URL HUNG_URL REFUSED_URL [--json FILE]   (bench/bench_remote.py
//   starts the servers)
#include <kjit/kjit.hpp>

#include "cache/remote/remote_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Child: one request for the kernel of SOURCE with this cache dir and remote; prints ms.
int child(const std::string& source, const std::string& dir, const std::string& url) {
  kjit::RuntimeOptions options;
  options.cache_dir = dir;
  options.remote_cache = url;
  kjit::Runtime runtime(options);
  // The shipped activation kernel (cuda_fp16.h, cuda_bf16.h): what a real package compiles.
  const auto program =
    kjit::Program::from_file(source, {.name_expressions = {"silu_and_mul_kernel<__nv_bfloat16>"}});
  const bool gpu = kjit::device_count() > 0;
  if (gpu) {
    kjit::set_device(0);
  }
  const auto start = Clock::now();
  if (gpu) {
    runtime.kernel(program, "silu_and_mul_kernel<__nv_bfloat16>"); // loaded: launchable
  } else {
    runtime.compile(program, kjit::Target{kjit::Arch{9, 0}, kjit::OutputKind::cubin});
  }
  std::printf("%f\n", ms_since(start));
  return 0;
}

double run_child(const char* self, const std::string& source, const std::string& dir,
                 const std::string& url) {
  int fds[2];
  if (::pipe(fds) != 0) {
    return -1;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::execl(self, self, "--child", source.c_str(), dir.c_str(), url.c_str(), nullptr);
    ::_exit(127);
  }
  ::close(fds[1]);
  char buffer[64] = {};
  const auto n = ::read(fds[0], buffer, sizeof buffer - 1);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return n > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? std::atof(buffer) : -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--child") {
    return child(argv[2], argv[3], argv[4]);
  }
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s SOURCE URL HUNG_URL REFUSED_URL [--json FILE]\n", argv[0]);
    return 2;
  }
  const std::string source = argv[1];
  const std::string url = argv[2];
  const std::string hung_url = argv[3];
  const std::string refused_url = argv[4];
  const std::string json_path = argc == 7 ? argv[6] : "";
  const fs::path root = fs::temp_directory_path() / fmt::format("kjit-bench-remote-{}", getpid());
  fs::remove_all(root);
  constexpr int k_rounds = 7;
  std::vector<double> cold, local, remote, fresh, refused, hung;
  for (int i = 0; i < k_rounds; ++i) {
    // Each round a program no store has seen (a new define), so that "cold" is cold.
    const fs::path dir = root / std::to_string(i);
    fs::create_directories(dir);
    const fs::path copy = dir / "activation.cu";
    std::ifstream in(source);
    std::ofstream(copy) << "#define KJIT_BENCH_ROUND " << i << "\n" << in.rdbuf();
    cold.push_back(run_child(argv[0], copy, (dir / "cold").string(), ""));
    // The first host compiles and fills Redis; a second process on that host hits locally.
    run_child(argv[0], copy, (dir / "writer").string(), url);
    local.push_back(run_child(argv[0], copy, (dir / "writer").string(), url));
    // A host whose store lacks this kernel (it knows its NVRTC: Note [NVRTC identity]), and a
    // new host whose store is empty (it loads NVRTC once to learn its version).
    const double on_host = run_child(argv[0], copy, (root / "host").string(), url);
    if (i > 0) {
      remote.push_back(on_host);
    }
    fresh.push_back(run_child(argv[0], copy, (dir / "fresh").string(), url));
    refused.push_back(run_child(argv[0], copy, (dir / "refused").string(), refused_url));
    hung.push_back(run_child(argv[0], copy, (dir / "hung").string(), hung_url));
  }
  fs::remove_all(root);

  // In process: lookups while the breaker is open.
  kjit::detail::RemoteStore down(kjit::detail::RemoteConfig::parse(refused_url));
  kjit::detail::StoredBinary out;
  down.get("0123456789abcdef0123456789abcdef", out); // opens the breaker
  constexpr int k_lookups = 1000000;
  const auto start = Clock::now();
  for (int i = 0; i < k_lookups; ++i) {
    down.get("0123456789abcdef0123456789abcdef", out);
  }
  const double open_us = ms_since(start) * 1000 / k_lookups;

  const bool gpu = kjit::device_count() > 0;
  const char* what = gpu ? "request -> launchable" : "request -> binary (no GPU)";
  const double c = median(cold), l = median(local), r = median(remote), f = median(refused),
               h = median(hung), n = median(fresh);
  std::printf("| metric | kjit | peer | ratio / difference | target |\n|---|---|---|---|---|\n");
  std::printf(
    "| remote hit, new process, %s | %.2f ms | local hit %.2f ms | +%.2f ms | <= +2 ms |\n", what,
    r, l, r - l);
  std::printf(
    "| remote hit vs the cold compile it replaces | %.2f ms | cold %.1f ms | %.0fx faster "
    "| >= 20x |\n",
    r, c, c / r);
  std::printf("| remote hit, a new host's first process (empty store: NVRTC loaded once for its "
              "version) | %.2f ms | local hit %.2f ms | +%.2f ms | - |\n",
              n, l, n - l);
  std::printf("| first use, Redis refusing connections | %.1f ms | cold without a tier %.1f ms | "
              "+%.1f ms | <= the timeout (100 ms connect) |\n",
              f, c, f - c);
  std::printf("| first use, Redis hung (SIGSTOP) | %.1f ms | cold without a tier %.1f ms | +%.1f "
              "ms | <= the timeout (%s) |\n",
              h, c, h - c, "operation timeout of the URL");
  std::printf("| lookup while the breaker is open | %.3f us | - | - | <= 1 us |\n", open_us);
  if (!json_path.empty()) {
    std::ofstream(json_path) << fmt::format(
      "{{\"cold_ms\":{},\"local_ms\":{},\"remote_ms\":{},\"refused_ms\":{},\"hung_ms\":{},"
      "\"open_us\":{},\"gpu\":{},\"fresh_ms\":{}}}\n",
      c, l, r, f, h, open_us, gpu, n);
  }
  return 0;
}
