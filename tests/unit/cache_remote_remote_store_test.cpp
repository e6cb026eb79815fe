#include <kjit/error.hpp>

#include "cache/remote/remote_blob.hpp"
#include "cache/remote/remote_store.hpp"

#include <catch2/catch.hpp>

#include <chrono>

using kjit::detail::RemoteConfig;

namespace {

kjit::detail::StoredBinary sample() {
  kjit::detail::StoredBinary v;
  v.kind = "cubin";
  v.arch = "sm_90";
  v.name = "k.cu";
  v.nvrtc_version = "13.0";
  v.driver_version = 13000;
  v.options = "-DN=4 --std=c++17";
  v.lowered_names = {{"scale<float>", "_Z5scaleIfEvPT_"}};
  v.blob = std::string("\x7f"
                       "ELF\0\1\2",
                       7) +
           std::string(1000, 'x');
  v.compile_ms = 123.5;
  v.log = "warning: something";
  return v;
}

const std::string k_key = "0123456789abcdef0123456789abcdef";

} // namespace

TEST_CASE("remote cache URLs", "[remote]") {
  const auto c = RemoteConfig::parse(
    "redis://fleet:s3cret@cache.internal:6380/2?mode=ro&prefix=team&timeout_ms=50&wait_ms=7");
  CHECK(c.host == "cache.internal");
  CHECK(c.port == 6380);
  CHECK(c.db == 2);
  CHECK(c.user == "fleet");
  CHECK(c.password == "s3cret");
  CHECK(c.read_only);
  CHECK(c.prefix == "team");
  CHECK(c.timeout == std::chrono::milliseconds(50));
  CHECK(c.wait == std::chrono::milliseconds(7));
  CHECK(c.display() == "redis://fleet@cache.internal:6380/2?mode=ro"); // no password

  const auto plain = RemoteConfig::parse("redis://127.0.0.1");
  CHECK(plain.port == 6379);
  CHECK(plain.db == 0);
  CHECK_FALSE(plain.read_only);
  CHECK(plain.connect_timeout == std::chrono::milliseconds(100));

  for (const char* bad : {"http://host", "redis://", "redis://host:port", "redis://h?mode=rx",
                          "redis://h?bogus=1", "redis://h?timeout_ms=-1", "redis://h/x"}) {
    INFO(bad);
    CHECK_THROWS_AS(RemoteConfig::parse(bad), kjit::Error);
  }
}

TEST_CASE("a remote blob round-trips and refuses every kind of damage", "[remote]") {
  const auto value = sample();
  const std::string blob = kjit::detail::encode_remote_blob(k_key, value, "");
  kjit::detail::StoredBinary out;
  REQUIRE_FALSE(kjit::detail::decode_remote_blob(blob, k_key, "", out));
  CHECK(out.blob == value.blob);
  CHECK(out.lowered_names == value.lowered_names);
  CHECK(out.compile_ms == value.compile_ms);
  CHECK(out.driver_version == 13000);
  CHECK(out.options == value.options);
  CHECK(out.log == value.log);

  auto refused = [&](std::string_view damaged, std::string_view key = k_key,
                     std::string_view secret = "") {
    kjit::detail::StoredBinary ignored;
    return kjit::detail::decode_remote_blob(damaged, key, secret, ignored).value_or("");
  };
  CHECK(refused("") == "not a kjit entry");
  CHECK(refused(blob.substr(0, blob.size() - 1)) == "truncated");
  CHECK(refused(blob.substr(0, 40)) == "truncated");
  CHECK(refused(blob + "x") == "trailing bytes");
  CHECK(refused(blob, "ffffffffffffffffffffffffffffffff") == "holds another key");
  for (std::size_t at : {std::size_t(30), blob.size() / 2, blob.size() - 9}) {
    std::string flipped = blob;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x40);
    INFO(at);
    CHECK_FALSE(refused(flipped).empty());
  }
  CHECK(refused(blob, k_key, "fleet secret of 16+") == "unsigned (a fleet secret is set)");
}

TEST_CASE("signed remote blobs need the same secret", "[remote]") {
  const std::string secret = "fleet secret of 16+ bytes";
  const std::string blob = kjit::detail::encode_remote_blob(k_key, sample(), secret);
  kjit::detail::StoredBinary out;
  CHECK_FALSE(kjit::detail::decode_remote_blob(blob, k_key, secret, out));
  CHECK(kjit::detail::decode_remote_blob(blob, k_key, "another secret, as long", out).value() ==
        "wrong signature");
  // A client without the secret can still read signed entries (it cannot check them).
  CHECK_FALSE(kjit::detail::decode_remote_blob(blob, k_key, "", out));
  // The HMAC is the RFC 4231 one (test case 2).
  CHECK(kjit::detail::hmac_sha256("Jefe", "what do ya want for nothing?") ==
        std::string("\x5b\xdc\xc1\x46\xbf\x60\x75\x4e\x6a\x04\x24\x26\x08\x95\x75\xc7\x5a\x00\x3f"
                    "\x08\x9d\x27\x39\x83\x9d\xec\x58\xb9\x64\xec\x38\x43",
                    32));
}

TEST_CASE("a server that refuses connections opens the breaker: later lookups do not try it",
          "[remote]") {
  auto config = RemoteConfig::parse("redis://127.0.0.1:1?connect_timeout_ms=100");
  kjit::detail::RemoteStore remote(config);
  kjit::detail::StoredBinary out;
  CHECK(remote.get(k_key, out) == kjit::detail::RemoteStore::Result::unavailable);
  int unavailable = 0;
  for (int i = 0; i < 1000; ++i) {
    unavailable += remote.get(k_key, out) == kjit::detail::RemoteStore::Result::unavailable;
  }
  CHECK(unavailable == 1000);
  // Note [Breaker]: while open, no lookup tries the server again (one failure counted in all).
  CHECK(remote.stats().errors + remote.stats().timeouts == 1);
}
