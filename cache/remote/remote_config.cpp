#include "cache/remote/remote_store.hpp"

#include <kjit/error.hpp>

#include "runtime/util/env.hpp"
#include "runtime/util/file.hpp"

#include <fmt/format.h>

#include <charconv>

namespace kjit::detail {
namespace {

using std::chrono::milliseconds;

std::int64_t query_int(std::string_view value, std::string_view name) {
  std::int64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < 0) {
    throw Error(
      fmt::format("remote cache URL: '{}' must be a non-negative integer, not '{}'", name, value));
  }
  return n;
}

} // namespace

// ---- configuration ---------------------------------------------------------------------------

RemoteConfig RemoteConfig::parse(const std::string& url) {
  RemoteConfig c;
  constexpr std::string_view scheme = "redis://";
  if (!std::string_view(url).starts_with(scheme)) {
    throw Error(fmt::format("remote cache URL '{}' must start with redis:// "
                            "(redis://[user[:password]@]host[:port][/db][?mode=ro])",
                            url));
  }
  std::string_view rest = std::string_view(url).substr(scheme.size());
  std::string_view query;
  if (const auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view credentials = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (const auto colon = credentials.find(':'); colon != std::string_view::npos) {
      c.user = std::string(credentials.substr(0, colon));
      c.password = std::string(credentials.substr(colon + 1));
    } else {
      c.password = std::string(credentials); // redis://password@host, as redis-cli -u
    }
  }
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    const auto db = rest.substr(slash + 1);
    if (!db.empty()) {
      c.db = static_cast<int>(query_int(db, "db"));
    }
    rest = rest.substr(0, slash);
  }
  if (const auto colon = rest.rfind(':'); colon != std::string_view::npos) {
    c.port = static_cast<int>(query_int(rest.substr(colon + 1), "port"));
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) {
    throw Error(fmt::format("remote cache URL '{}' names no host", url));
  }
  c.host = std::string(rest);
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const auto eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? "" : item.substr(eq + 1);
    if (name == "mode") {
      if (value != "ro" && value != "rw") {
        throw Error(fmt::format("remote cache URL: mode must be ro or rw, not '{}'", value));
      }
      c.read_only = value == "ro";
    } else if (name == "prefix") {
      c.prefix = std::string(value);
    } else if (name == "connect_timeout_ms") {
      c.connect_timeout = milliseconds(query_int(value, name));
    } else if (name == "timeout_ms") {
      c.timeout = milliseconds(query_int(value, name));
    } else if (name == "lock_ttl_ms") {
      c.lock_ttl = milliseconds(query_int(value, name));
    } else if (name == "wait_ms") {
      c.wait = milliseconds(query_int(value, name));
    } else if (name == "queue") {
      c.queue_limit = static_cast<std::size_t>(query_int(value, name));
    } else {
      throw Error(fmt::format("remote cache URL: unknown parameter '{}' (mode, prefix, "
                              "connect_timeout_ms, timeout_ms, lock_ttl_ms, wait_ms, queue)",
                              name));
    }
  }
  return c;
}

std::string RemoteConfig::display() const {
  return fmt::format("redis://{}{}:{}/{}{}", user.empty() ? "" : user + "@", host, port, db,
                     read_only ? "?mode=ro" : "");
}

std::optional<RemoteConfig> remote_config_from(const std::optional<std::string>& url) {
  std::string text;
  if (url) {
    text = *url;
  } else if (auto env = getenv_nonempty("KJIT_REMOTE_CACHE")) {
    text = std::string(*env);
  }
  if (text.empty()) {
    return std::nullopt;
  }
  RemoteConfig config = RemoteConfig::parse(text);
  if (auto file = getenv_nonempty("KJIT_REMOTE_CACHE_KEY_FILE")) {
    std::string error;
    auto secret = read_file(std::string(*file), &error);
    if (!secret) {
      throw Error(fmt::format("cannot read KJIT_REMOTE_CACHE_KEY_FILE '{}': {}", *file, error));
    }
    while (!secret->empty() && (secret->back() == '\n' || secret->back() == '\r')) {
      secret->pop_back();
    }
    if (secret->size() < 16) {
      throw Error(fmt::format("the fleet secret in '{}' is {} bytes; use at least 16", *file,
                              secret->size()));
    }
    config.secret = std::move(*secret);
  }
  return config;
}

} // namespace kjit::detail
