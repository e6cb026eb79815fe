// Note [Tuner] with the fleet tier (Note [Remote tier]), and the fleet's compile lock: tuned
// configurations and locks go through a real redis-server, started here on 127.0.0.1 and a
// free port and stopped at the end of each test (CI installs it; where it is missing the tests
// say so and fail, as a skipped check hides a defect).
#include <kjit/runtime.hpp>

#include "cache/remote/remote_store.hpp"
#include "cache/sqlite_store.hpp"
#include "runtime/tune/tuner.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <netinet/in.h>
#include <spawn.h>
#include <sstream>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char** environ;

namespace {

std::filesystem::path find_redis_server() {
  std::stringstream path(std::getenv("PATH") != nullptr ? std::getenv("PATH") : "");
  for (std::string dir; std::getline(path, dir, ':');) {
    const auto candidate = std::filesystem::path(dir) / "redis-server";
    if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return {};
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// redis-server on 127.0.0.1 and a free port, no persistence, for the life of the object.
class RedisServer {
public:
  explicit RedisServer(const std::filesystem::path& dir) : m_port(free_port()) {
    const auto server = find_redis_server();
    REQUIRE_FALSE(server.empty()); // CI installs redis-server (scripts/dev's apt packages)
    const std::string port = std::to_string(m_port);
    const std::string folder = dir.string();
    std::vector<std::string> args{server.string(), "--port", port,           "--bind", "127.0.0.1",
                                  "--save",        "",       "--appendonly", "no",     "--dir",
                                  folder};
    std::vector<char*> argv;
    for (auto& a : args) {
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    posix_spawn_file_actions_t quiet; // its log would fill the test output
    posix_spawn_file_actions_init(&quiet);
    posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&quiet, 2, "/dev/null", O_WRONLY, 0);
    const int spawned = ::posix_spawn(&m_pid, argv[0], &quiet, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&quiet);
    REQUIRE(spawned == 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!accepts(m_port)) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~RedisServer() {
    ::kill(m_pid, SIGKILL);
    ::waitpid(m_pid, nullptr, 0);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  std::string url() const { return "redis://127.0.0.1:" + std::to_string(m_port); }
  kjit::detail::RemoteConfig config() const {
    return kjit::detail::RemoteConfig::parse(url() + "?wait_ms=20000");
  }

private:
  int m_port;
  pid_t m_pid = -1;
};

kjit::TunedConfig config_of(std::int64_t best) {
  kjit::TunedConfig config;
  config.names = {"BLOCK"};
  config.best = {best};
  config.timings = {{{256}, 2.0, ""}, {{best}, 1.0, ""}};
  config.seconds = 0.3;
  return config;
}

const std::string k_key = kjit::detail::tune_key({"tuned",
                                                  "d",
                                                  "f",
                                                  {{"BLOCK", {256, 512}}},
                                                  "NVIDIA H200 (sm_90, 132 SMs)",
                                                  {"float32"},
                                                  {4096}});

} // namespace

TEST_CASE("a host tunes a key once for the fleet; the others read it from the remote tier",
          "[tune][remote]") {
  kjit::test::TempDir dir;
  RedisServer redis(dir.path());
  std::atomic<int> tunings{0};
  auto tune = [&] {
    ++tunings;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return config_of(512);
  };
  const kjit::TunedEntryInfo entry{
    k_key, "tuned::f", "4096; x float32", "NVIDIA H200 (sm_90, 132 SMs)", {}, 0, {}};
  // Three hosts at once: a store and a remote connection each.
  std::vector<std::int64_t> results(3);
  std::vector<std::thread> hosts;
  for (std::size_t i = 0; i < results.size(); ++i) {
    hosts.emplace_back([&, i] {
      kjit::Runtime runtime(kjit::RuntimeOptions{
        .cache_dir = dir.path() / ("host" + std::to_string(i)), .remote_cache = redis.url()});
      results[i] = runtime.tuned("tuned", entry, tune).value().best.at(0);
    });
  }
  for (auto& h : hosts) {
    h.join();
  }
  CHECK(tunings == 1);
  CHECK(results == std::vector<std::int64_t>{512, 512, 512});
  // Each host's store holds it now: a host asks nothing of a remote that has gone.
  kjit::Runtime host0(kjit::RuntimeOptions{.cache_dir = dir.path() / "host0"});
  const auto local = host0.cache().tuned_entries();
  REQUIRE(local.size() == 1);
  CHECK(local[0].op == "tuned::f");
  CHECK(local[0].bucket == "4096; x float32");
  CHECK(local[0].config.timings.size() == 2);
  // A new host without a tuner (lookup only) still finds it remotely.
  kjit::Runtime fresh(
    kjit::RuntimeOptions{.cache_dir = dir.path() / "fresh", .remote_cache = redis.url()});
  CHECK(fresh.tuned("tuned", entry).value().best == std::vector<std::int64_t>{512});
  CHECK(tunings == 1);
}

TEST_CASE("kjit cache push and pull carry tuned configurations; a damaged one is refused",
          "[tune][remote]") {
  kjit::test::TempDir dir;
  RedisServer redis(dir.path());
  {
    kjit::Runtime a(kjit::RuntimeOptions{.cache_dir = dir.path() / "a"});
    a.cache().store()->put_tuned(
      {k_key, "tuned::f", "4096", "NVIDIA H200 (sm_90, 132 SMs)", config_of(256), 0, {}});
  }
  kjit::Runtime a(kjit::RuntimeOptions{.cache_dir = dir.path() / "a", .remote_cache = redis.url()});
  CHECK(a.push_to_remote() == 1);
  kjit::Runtime b(kjit::RuntimeOptions{.cache_dir = dir.path() / "b", .remote_cache = redis.url()});
  CHECK(b.pull_from_remote() == 1);
  const auto pulled = b.cache().tuned_entries();
  REQUIRE(pulled.size() == 1);
  CHECK(pulled[0].config.best == std::vector<std::int64_t>{256});
  CHECK(b.cache().entries().empty()); // not taken for a kernel
  CHECK(b.pull_from_remote() == 0);   // already here

  // A tuned entry whose values do not match its names is not used (it is tuned again).
  kjit::detail::RemoteStore remote(redis.config());
  kjit::TunedEntryInfo bad{std::string(32, 'e'), "tuned::f", "1", "dev", config_of(1), 0, {}};
  bad.config.names = {"BLOCK", "ROWS"};
  REQUIRE(remote.put_now(bad.key, kjit::detail::tuned_binary(bad)));
  kjit::Runtime c(kjit::RuntimeOptions{.cache_dir = dir.path() / "c", .remote_cache = redis.url()});
  int tunings = 0;
  CHECK(c.tuned("tuned", bad,
                [&] {
                  ++tunings;
                  return config_of(512);
                })
          ->best == std::vector<std::int64_t>{512});
  CHECK(tunings == 1);
}

TEST_CASE("a lock taken after the holder wrote and let go is not a second compile", "[remote]") {
  // Host a misses; host b (which held the lock) writes the entry and releases its lock; only
  // then does a ask for the lock. a must read b's entry, not compile the key again.
  kjit::test::TempDir dir;
  RedisServer redis(dir.path());
  kjit::detail::RemoteStore a(redis.config());
  kjit::detail::RemoteStore b(redis.config());
  const std::string key(32, 'c');
  const kjit::TunedEntryInfo entry{key, "tuned::f", "1", "dev", config_of(512), 0, {}};
  kjit::detail::StoredBinary out;
  REQUIRE(a.get(key, out) == kjit::detail::RemoteStore::Result::miss);
  std::string b_token;
  REQUIRE(b.lock(key, b_token) == kjit::detail::RemoteStore::Lock::acquired);
  REQUIRE(b.put_now(key, kjit::detail::tuned_binary(entry)));
  b.unlock(key, b_token);

  std::string a_token;
  CHECK(a.lock(key, a_token) == kjit::detail::RemoteStore::Lock::held_by_other);
  CHECK(a_token.empty()); // a holds nothing: nothing to release
  CHECK(a.wait_for(key, out) == kjit::detail::RemoteStore::Result::hit);
  // A key not written yet still locks as before: one holder, the others wait, then it is free.
  std::string c_token;
  kjit::detail::RemoteStore c(redis.config());
  const std::string other(32, 'd');
  CHECK(c.lock(other, c_token) == kjit::detail::RemoteStore::Lock::acquired);
  std::string d_token;
  CHECK(a.lock(other, d_token) == kjit::detail::RemoteStore::Lock::held_by_other);
  c.unlock(other, c_token);
  CHECK(a.lock(other, d_token) == kjit::detail::RemoteStore::Lock::acquired);
}
