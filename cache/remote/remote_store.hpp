// The fleet tier: a Redis server shared by many hosts, under each host's local store.
//
// Note [Remote tier]: the local store is asked first; on a local miss the remote is asked, and a
// remote hit is written to the local store (a local hit never touches Redis). After a compile,
// the local write is synchronous and the remote write is queued to a writer thread (bounded,
// dropped on overflow, flushed at exit within a deadline). One key per entry holds a
// self-checking blob (Note [Remote blob]); a bad one is deleted and recompiled. Compiles are
// merged across hosts: the first host to miss takes `SET <lock> <token> NX PX ttl`, the others
// poll for the entry with jittered back-off for a bounded time and then compile themselves; the
// holder releases with compare-and-delete after its entry is written, and a holder that dies
// lets the TTL expire. A host that takes the lock checks that the entry is still missing: a
// holder may have written and released between this host's miss and its lock.
//
// Faults cost at most a timeout: explicit connect and operation timeouts, and a circuit breaker
// (Note [Breaker]) so that a dead server is asked again only after a back-off, while lookups in
// between return at once. SIGPIPE is blocked around socket writes. One warning per state change.
#pragma once

#include "cache/sqlite_store.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

struct redisContext;
struct redisReply;

namespace kjit::detail {

struct RemoteConfig {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;
  std::string user;
  std::string password;
  bool read_only = false; // ?mode=ro: never writes (no entries, no locks)
  std::string prefix =
    "kjit"; // keys are <prefix>:v<format>:<key>, locks <prefix>:v<format>:lock:<key>
  std::chrono::milliseconds connect_timeout{100};
  std::chrono::milliseconds timeout{1500}; // per operation
  std::chrono::milliseconds lock_ttl{120000};
  std::chrono::milliseconds wait{60000}; // for another host's compile, at most
  std::size_t queue_limit = 256;         // queued writes; more are dropped
  std::chrono::milliseconds flush_deadline{2000};
  std::string secret; // HMAC key (KJIT_REMOTE_CACHE_KEY_FILE): entries signed, unsigned refused

  // redis://[user[:password]@]host[:port][/db][?mode=ro&prefix=P&connect_timeout_ms=N&
  // timeout_ms=N&lock_ttl_ms=N&wait_ms=N&queue=N]. Throws `Error` naming what is wrong.
  static RemoteConfig parse(const std::string& url);
  // The URL without its password, for messages.
  std::string display() const;
};

class RemoteStore {
public:
  enum class Result { hit, miss, unavailable };
  enum class Lock { acquired, held_by_other, unavailable };

  explicit RemoteStore(RemoteConfig config);
  ~RemoteStore(); // flushes queued writes within the deadline
  RemoteStore(const RemoteStore&) = delete;
  RemoteStore& operator=(const RemoteStore&) = delete;

  const RemoteConfig& config() const noexcept { return m_config; }

  // Looks `key` up; a bad entry is deleted (unless read-only) and counted, and is a miss.
  Result get(const std::string& key, StoredBinary& out);
  // Takes the compile lock of `key`; `token` identifies this holder. held_by_other also where
  // the entry was written since the caller's miss (its holder finished and let go): wait_for
  // then reads it.
  Lock lock(const std::string& key, std::string& token);
  // Waits (jittered back-off, at most `wait`) for another host's entry of `key`.
  Result wait_for(const std::string& key, StoredBinary& out);
  // Releases a lock now (compare-and-delete), e.g. after a compile failed.
  void unlock(const std::string& key, const std::string& token);
  // Queues the entry; the writer releases `token`'s lock after writing it.
  void put(const std::string& key, const StoredBinary& value, std::string token = {});
  // Writes now (kjit cache push). False when it could not.
  bool put_now(const std::string& key, const StoredBinary& value);
  // The cache keys of every entry on the server (kjit cache pull).
  std::vector<std::string> keys();
  // Waits for queued writes, at most `deadline`.
  void flush(std::chrono::milliseconds deadline);

  RemoteStats stats() const;

private:
  class Connection;
  struct ReplyDeleter {
    void operator()(redisReply* reply) const;
  };
  using Reply = std::unique_ptr<redisReply, ReplyDeleter>;
  struct Write {
    std::string key;
    std::string blob;
    std::string token;
  };

  bool allow(); // Note [Breaker]
  void succeeded();
  void failed(const std::string& why, bool timeout);
  std::string entry_key(const std::string& key) const;
  std::string lock_key(const std::string& key) const;
  void writer_loop();
  Result read(Connection& connection, const std::string& key, StoredBinary& out);
  // Runs one command and tells the breaker how the connection did: nullptr when it failed.
  Reply call(Connection& connection, const std::vector<std::string_view>& argv);

  RemoteConfig m_config;
  std::string m_display;

  std::mutex m_mutex; // guards m_reader
  std::unique_ptr<Connection> m_reader;

  enum class State { closed, open, half_open };
  std::mutex m_breaker_mutex;
  State m_state = State::closed;
  std::chrono::steady_clock::time_point m_retry_at{};
  std::chrono::milliseconds m_backoff{1000};
  std::atomic<bool> m_open{false}; // fast path of allow()

  std::mutex m_queue_mutex;
  std::condition_variable m_queue_cv;
  std::deque<Write> m_queue;
  bool m_writing = false;
  bool m_stop = false;
  std::thread m_writer;

  mutable std::mutex m_stats_mutex;
  RemoteStats m_stats;
  std::atomic<bool> m_warned_write{false};
};

// The remote tier configured by the environment: `KJIT_REMOTE_CACHE` (a redis:// URL) and
// `KJIT_REMOTE_CACHE_KEY_FILE` (a file holding the fleet's secret). Nothing when unset.
// Throws `Error` for a malformed URL or an unreadable key file.
std::optional<RemoteConfig> remote_config_from(const std::optional<std::string>& url);

} // namespace kjit::detail
