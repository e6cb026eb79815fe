#include "runtime/util/hash.hpp"

#include <catch2/catch.hpp>

using kjit::detail::Hasher;

TEST_CASE("fields are delimited: moving bytes between fields changes the digest", "[hash]") {
  Hasher a;
  a.field("x", "ab").field("y", "c");
  Hasher b;
  b.field("x", "a").field("y", "bc");
  Hasher c;
  c.field("xa", "b").field("y", "c");
  CHECK(a.digest() != b.digest());
  CHECK(a.digest() != c.digest());
}

TEST_CASE("the digest is deterministic and 32 hex digits", "[hash]") {
  Hasher a;
  a.field("n", std::int64_t{42}).field("s", "text");
  Hasher b;
  b.field("n", std::int64_t{42}).field("s", "text");
  CHECK(a.digest() == b.digest());
  const auto hex = kjit::detail::to_hex(a.digest());
  CHECK(hex.size() == 32);
  CHECK(hex.find_first_not_of("0123456789abcdef") == std::string::npos);
}

TEST_CASE("checksum64 sees one flipped bit", "[hash]") {
  std::string data(4096, 'x');
  const auto before = kjit::detail::checksum64(data);
  data[1000] ^= 1;
  CHECK(kjit::detail::checksum64(data) != before);
}
