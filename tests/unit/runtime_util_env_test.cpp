#include "runtime/util/env.hpp"

#include <catch2/catch.hpp>

using kjit::detail::format_size;
using kjit::detail::parse_size;

TEST_CASE("parse_size reads bytes and binary units", "[util]") {
  CHECK(parse_size("1024") == 1024u);
  CHECK(parse_size("2G") == 2ULL << 30);
  CHECK(parse_size("2GiB") == 2ULL << 30);
  CHECK(parse_size("500M") == 500ULL << 20);
  CHECK(parse_size("64k") == 64ULL << 10);
  CHECK(parse_size("1.5G") == 3ULL << 29);
  CHECK(parse_size(" 10MB ") == 10ULL << 20);
}

TEST_CASE("parse_size refuses what is not a size", "[util]") {
  CHECK_FALSE(parse_size(""));
  CHECK_FALSE(parse_size("G"));
  CHECK_FALSE(parse_size("-1"));
  CHECK_FALSE(parse_size("12 parsecs"));
  CHECK_FALSE(parse_size("99999999999T"));
}

TEST_CASE("format_size is readable", "[util]") {
  CHECK(format_size(512) == "512 B");
  CHECK(format_size(2048) == "2.0 KiB");
  CHECK(format_size(3ULL << 29) == "1.5 GiB");
}
