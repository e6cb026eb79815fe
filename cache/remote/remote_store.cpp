#include "cache/remote/remote_store.hpp"

#include <kjit/error.hpp>

#include "cache/remote/remote_blob.hpp"
#include "runtime/logging.hpp"
#include "runtime/util/env.hpp"
#include "runtime/util/file.hpp"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstring>
#include <random>

#include <pthread.h>

namespace kjit::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Blocks SIGPIPE in this thread while a socket may be written, and consumes one raised meanwhile,
// so that a dropped connection is an error code and not the death of the process.
class SigpipeGuard {
public:
  SigpipeGuard() {
    sigemptyset(&m_set);
    sigaddset(&m_set, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    m_was_pending = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &m_set, &m_old);
  }
  ~SigpipeGuard() {
    if (!m_was_pending) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        sigtimedwait(&m_set, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &m_old, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

private:
  sigset_t m_set{};
  sigset_t m_old{};
  bool m_was_pending = false;
};

timeval to_timeval(milliseconds ms) {
  return timeval{static_cast<time_t>(ms.count() / 1000),
                 static_cast<suseconds_t>((ms.count() % 1000) * 1000)};
}

// Deletes a lock only if this holder still has it (not one taken after its TTL expired).
constexpr std::string_view k_compare_and_delete =
  "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

std::string random_token() {
  std::random_device device;
  std::mt19937_64 generator((std::uint64_t(device()) << 32) ^ device() ^ std::uint64_t(::getpid()));
  return fmt::format("{:016x}{:016x}", generator(), generator());
}

} // namespace

// ---- connection ------------------------------------------------------------------------------

class RemoteStore::Connection {
public:
  explicit Connection(const RemoteConfig& config) : m_config(config) {}
  ~Connection() { drop(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Runs one command; nullptr with `why` (and `timeout`) set when it failed at the connection
  // level (the connection is dropped and made again next time).
  // A connection that was open but has died meanwhile (the server restarted) is made again once
  // and the command retried; a timeout is not retried.
  Reply run(const std::vector<std::string_view>& argv, std::string& why, bool& timeout) {
    SigpipeGuard guard;
    const bool fresh = m_context == nullptr;
    if (fresh && !connect(why, timeout)) {
      return nullptr;
    }
    Reply reply = command(argv, why, timeout);
    if (!reply && !fresh && !timeout && connect(why, timeout)) {
      reply = command(argv, why, timeout);
    }
    return reply;
  }

private:
  Reply command(const std::vector<std::string_view>& argv, std::string& why, bool& timeout) {
    std::vector<const char*> args;
    std::vector<std::size_t> sizes;
    for (const auto& a : argv) {
      args.push_back(a.data());
      sizes.push_back(a.size());
    }
    errno = 0;
    auto* raw = static_cast<redisReply*>(
      redisCommandArgv(m_context, static_cast<int>(args.size()), args.data(), sizes.data()));
    if (raw == nullptr) {
      const int saved = errno;
      timeout = saved == EAGAIN || saved == EWOULDBLOCK || saved == ETIMEDOUT;
      why = timeout ? fmt::format("no answer within {} ms", m_config.timeout.count())
                    : std::string(m_context->errstr);
      drop();
      return nullptr;
    }
    return Reply(raw);
  }

  bool connect(std::string& why, bool& timeout) {
    const timeval connect_tv = to_timeval(m_config.connect_timeout);
    errno = 0;
    m_context = redisConnectWithTimeout(m_config.host.c_str(), m_config.port, connect_tv);
    if (m_context == nullptr || m_context->err != 0) {
      const int saved = errno;
      why = m_context != nullptr ? std::string(m_context->errstr) : "out of memory";
      timeout = saved == EINPROGRESS || saved == ETIMEDOUT || saved == EAGAIN ||
                why.find("timed out") != std::string::npos;
      if (timeout) {
        why = fmt::format("cannot connect within {} ms", m_config.connect_timeout.count());
      }
      drop();
      return false;
    }
    const timeval op_tv = to_timeval(m_config.timeout);
    redisSetTimeout(m_context, op_tv);
    auto ok = [&](Reply reply, const char* what) {
      if (!reply) {
        return false;
      }
      if (reply->type == REDIS_REPLY_ERROR) {
        why = fmt::format("{} refused: {}", what, std::string(reply->str, reply->len));
        drop();
        return false;
      }
      return true;
    };
    if (!m_config.password.empty()) {
      std::vector<std::string_view> auth{"AUTH"};
      if (!m_config.user.empty()) {
        auth.emplace_back(m_config.user);
      }
      auth.emplace_back(m_config.password);
      if (!ok(command(auth, why, timeout), "AUTH")) {
        return false;
      }
    }
    if (m_config.db != 0) {
      const std::string db = std::to_string(m_config.db);
      if (!ok(command({"SELECT", db}, why, timeout), "SELECT")) {
        return false;
      }
    }
    return true;
  }

  void drop() {
    if (m_context != nullptr) {
      redisFree(m_context);
      m_context = nullptr;
    }
  }

  const RemoteConfig& m_config;
  redisContext* m_context = nullptr;
};

// ---- the store -------------------------------------------------------------------------------

void RemoteStore::ReplyDeleter::operator()(redisReply* reply) const {
  freeReplyObject(reply);
}

RemoteStore::Reply RemoteStore::call(Connection& connection,
                                     const std::vector<std::string_view>& argv) {
  std::string why;
  bool timeout = false;
  Reply reply = connection.run(argv, why, timeout);
  if (reply) {
    succeeded();
  } else {
    failed(why, timeout);
  }
  return reply;
}

RemoteStore::RemoteStore(RemoteConfig config)
  : m_config(std::move(config)), m_display(m_config.display()),
    m_reader(std::make_unique<Connection>(m_config)) {}

RemoteStore::~RemoteStore() {
  flush(m_config.flush_deadline);
  {
    std::lock_guard lock(m_queue_mutex);
    m_stop = true;
    if (!m_queue.empty()) {
      std::lock_guard stats(m_stats_mutex);
      m_stats.dropped += m_queue.size();
      m_queue.clear();
    }
  }
  m_queue_cv.notify_all();
  if (m_writer.joinable()) {
    m_writer.join();
  }
}

std::string RemoteStore::entry_key(const std::string& key) const {
  return fmt::format("{}:v{}:{}", m_config.prefix, k_remote_format_version, key);
}

std::string RemoteStore::lock_key(const std::string& key) const {
  return fmt::format("{}:v{}:lock:{}", m_config.prefix, k_remote_format_version, key);
}

// Note [Breaker]: closed (normal) -> open after a connection failure or timeout: every operation
// returns at once (a miss) until the back-off has passed (1 s, doubling to 60 s); then half-open:
// one operation tries, and its success closes the breaker, its failure opens it again for longer.
// So a training job that outlives a Redis restart reconnects, and a dead server costs one timeout
// per back-off, not one per lookup. Refusals of a live server (out of memory, no permission) do
// not open it.
bool RemoteStore::allow() {
  if (!m_open.load(std::memory_order_acquire)) {
    return true;
  }
  std::lock_guard lock(m_breaker_mutex);
  if (m_state == State::open && Clock::now() >= m_retry_at) {
    m_state = State::half_open; // this caller probes
    return true;
  }
  return m_state == State::closed;
}

void RemoteStore::succeeded() {
  if (!m_open.load(std::memory_order_acquire)) {
    return;
  }
  std::lock_guard lock(m_breaker_mutex);
  if (m_state != State::closed) {
    m_state = State::closed;
    m_backoff = milliseconds(1000);
    m_open.store(false, std::memory_order_release);
    log(LogLevel::warning, "remote cache {} is reachable again", m_display);
  }
}

void RemoteStore::failed(const std::string& why, bool timeout) {
  {
    std::lock_guard stats(m_stats_mutex);
    ++(timeout ? m_stats.timeouts : m_stats.errors);
  }
  std::lock_guard lock(m_breaker_mutex);
  if (m_state == State::closed) {
    log(LogLevel::warning,
        "remote cache {} is unavailable ({}): compiling locally, asking again "
        "in {} s",
        m_display, why, m_backoff.count() / 1000.0);
  } else if (m_state == State::half_open) {
    m_backoff = std::min(m_backoff * 2, milliseconds(60000));
    log(LogLevel::debug, "remote cache {} still unavailable ({}); next try in {} s", m_display, why,
        m_backoff.count() / 1000.0);
  }
  m_state = State::open;
  m_retry_at = Clock::now() + m_backoff;
  m_open.store(true, std::memory_order_release);
}

RemoteStore::Result RemoteStore::read(Connection& connection, const std::string& key,
                                      StoredBinary& out) {
  const std::string name = entry_key(key);
  Reply reply = call(connection, {"GET", name});
  if (!reply) {
    return Result::unavailable;
  }
  if (reply->type == REDIS_REPLY_NIL) {
    return Result::miss;
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    std::lock_guard stats(m_stats_mutex);
    ++m_stats.errors;
    return Result::unavailable;
  }
  const std::string_view blob(reply->str, reply->type == REDIS_REPLY_STRING ? reply->len : 0);
  if (auto bad = decode_remote_blob(blob, key, m_config.secret, out)) {
    log(LogLevel::warning, "remote cache entry {} is unusable ({}): {}", key, *bad,
        m_config.read_only ? "ignored" : "deleted, recompiling");
    {
      std::lock_guard stats(m_stats_mutex);
      ++m_stats.bad_entries;
    }
    if (!m_config.read_only) {
      call(connection, {"DEL", name});
    }
    return Result::miss;
  }
  std::lock_guard stats(m_stats_mutex);
  ++m_stats.hits;
  m_stats.bytes_read += blob.size();
  m_stats.saved_ms += out.compile_ms;
  return Result::hit;
}

RemoteStore::Result RemoteStore::get(const std::string& key, StoredBinary& out) {
  if (!allow()) {
    return Result::unavailable;
  }
  std::lock_guard lock(m_mutex);
  const Result result = read(*m_reader, key, out);
  if (result == Result::miss) {
    std::lock_guard stats(m_stats_mutex);
    ++m_stats.misses;
  }
  return result;
}

RemoteStore::Lock RemoteStore::lock(const std::string& key, std::string& token) {
  if (m_config.read_only || !allow()) {
    return Lock::unavailable;
  }
  token = random_token();
  const std::string ttl = std::to_string(m_config.lock_ttl.count());
  std::lock_guard lock(m_mutex);
  Reply reply = call(*m_reader, {"SET", lock_key(key), token, "NX", "PX", ttl});
  if (!reply) {
    return Lock::unavailable;
  }
  if (reply->type == REDIS_REPLY_NIL) {
    return Lock::held_by_other;
  }
  if (reply->type != REDIS_REPLY_STATUS) {
    return Lock::unavailable; // refused (an ACL without SET): compile without merging
  }
  // Between the caller's miss and this lock another host may have compiled the key, written
  // it and let go of the lock: then the entry is there, and compiling again would be the
  // fleet's second compile of it.
  Reply exists = call(*m_reader, {"EXISTS", entry_key(key)});
  if (exists && exists->type == REDIS_REPLY_INTEGER && exists->integer == 1) {
    call(*m_reader, {"EVAL", k_compare_and_delete, "1", lock_key(key), token});
    token.clear();
    return Lock::held_by_other;
  }
  return Lock::acquired;
}

RemoteStore::Result RemoteStore::wait_for(const std::string& key, StoredBinary& out) {
  {
    std::lock_guard stats(m_stats_mutex);
    ++m_stats.lock_waits;
  }
  const auto deadline = Clock::now() + m_config.wait;
  std::minstd_rand jitter(static_cast<unsigned>(std::hash<std::string>{}(key) ^ ::getpid()));
  milliseconds delay(5);
  while (Clock::now() < deadline) {
    const auto pause = delay + milliseconds(jitter() % (delay.count() / 2 + 1));
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    delay = std::min(delay * 2, milliseconds(200));
    if (!allow()) {
      return Result::unavailable;
    }
    std::lock_guard lock(m_mutex);
    const Result result = read(*m_reader, key, out);
    if (result != Result::miss) {
      return result;
    }
    // The holder died (its lock expired) or gave up: stop waiting, compile here.
    Reply held = call(*m_reader, {"EXISTS", lock_key(key)});
    if (!held) {
      return Result::unavailable;
    }
    if (held->type == REDIS_REPLY_INTEGER && held->integer == 0) {
      return read(*m_reader, key, out); // written just before the lock was released?
    }
  }
  return Result::miss;
}

void RemoteStore::unlock(const std::string& key, const std::string& token) {
  if (token.empty() || !allow()) {
    return;
  }
  std::lock_guard lock(m_mutex);
  call(*m_reader,
       {"EVAL", k_compare_and_delete, "1", lock_key(key), token}); // else the TTL frees it
}

void RemoteStore::put(const std::string& key, const StoredBinary& value, std::string token) {
  if (m_config.read_only) {
    return;
  }
  Write write{key, encode_remote_blob(key, value, m_config.secret), std::move(token)};
  std::lock_guard lock(m_queue_mutex);
  if (m_queue.size() >= m_config.queue_limit) {
    std::lock_guard stats(m_stats_mutex);
    ++m_stats.dropped;
    return; // the lock (if any) expires with its TTL
  }
  m_queue.push_back(std::move(write));
  if (!m_writer.joinable()) {
    m_writer = std::thread([this] { writer_loop(); });
  }
  m_queue_cv.notify_one();
}

bool RemoteStore::put_now(const std::string& key, const StoredBinary& value) {
  if (m_config.read_only || !allow()) {
    return false;
  }
  const std::string blob = encode_remote_blob(key, value, m_config.secret);
  std::lock_guard lock(m_mutex);
  Reply reply = call(*m_reader, {"SET", entry_key(key), blob});
  if (!reply) {
    return false;
  }
  std::lock_guard stats(m_stats_mutex);
  if (reply->type == REDIS_REPLY_ERROR) {
    ++m_stats.errors;
    return false;
  }
  ++m_stats.writes;
  m_stats.bytes_written += blob.size();
  return true;
}

void RemoteStore::writer_loop() {
  Connection connection(m_config);
  std::unique_lock lock(m_queue_mutex);
  while (true) {
    m_queue_cv.wait(lock, [&] { return m_stop || !m_queue.empty(); });
    if (m_queue.empty()) {
      return; // stopping
    }
    Write write = std::move(m_queue.front());
    m_queue.pop_front();
    m_writing = true;
    lock.unlock();
    bool written = false;
    if (allow()) {
      Reply reply = call(connection, {"SET", entry_key(write.key), write.blob});
      if (reply) {
        if (reply->type == REDIS_REPLY_ERROR) {
          if (!m_warned_write.exchange(true)) {
            log(LogLevel::warning, "remote cache {} refused a write ({}): entries stay local",
                m_display, std::string(reply->str, reply->len));
          }
          std::lock_guard stats(m_stats_mutex);
          ++m_stats.errors;
        } else {
          written = true;
          std::lock_guard stats(m_stats_mutex);
          ++m_stats.writes;
          m_stats.bytes_written += write.blob.size();
        }
      }
      if (!write.token.empty() && reply) {
        call(connection, {"EVAL", k_compare_and_delete, "1", lock_key(write.key), write.token});
      }
    }
    if (!written) {
      std::lock_guard stats(m_stats_mutex);
      ++m_stats.dropped;
    }
    lock.lock();
    m_writing = false;
    m_queue_cv.notify_all();
  }
}

void RemoteStore::flush(std::chrono::milliseconds deadline) {
  std::unique_lock lock(m_queue_mutex);
  m_queue_cv.wait_for(lock, deadline, [&] { return m_queue.empty() && !m_writing; });
}

std::vector<std::string> RemoteStore::keys() {
  std::vector<std::string> result;
  if (!allow()) {
    return result;
  }
  const std::string pattern = fmt::format("{}:v{}:*", m_config.prefix, k_remote_format_version);
  const std::string lock_prefix = lock_key("");
  const std::size_t prefix_size = entry_key("").size();
  std::string cursor = "0";
  std::lock_guard lock(m_mutex);
  do {
    Reply reply = call(*m_reader, {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) {
      throw CacheError(fmt::format("cannot list the remote cache {}: {}", m_display,
                                   reply ? "unexpected SCAN reply" : "unreachable (see above)"));
    }
    cursor.assign(reply->element[0]->str, reply->element[0]->len);
    const redisReply* names = reply->element[1];
    for (std::size_t i = 0; i < names->elements; ++i) {
      std::string name(names->element[i]->str, names->element[i]->len);
      // Only names that are cache keys (32 hex digits): the server is not trusted.
      const std::string key = name.size() > prefix_size ? name.substr(prefix_size) : "";
      if (!name.starts_with(lock_prefix) && key.size() == 32 &&
          key.find_first_not_of("0123456789abcdef") == std::string::npos) {
        result.push_back(key);
      }
    }
  } while (cursor != "0");
  return result;
}

RemoteStats RemoteStore::stats() const {
  std::lock_guard lock(m_stats_mutex);
  return m_stats;
}

} // namespace kjit::detail
