#include <kjit/arch.hpp>
#include <kjit/error.hpp>

#include <catch2/catch.hpp>

using kjit::Arch;

TEST_CASE("Arch parses the usual spellings", "[arch]") {
  CHECK(Arch::parse("sm_90") == Arch{9, 0});
  CHECK(Arch::parse("compute_80") == Arch{8, 0});
  CHECK(Arch::parse("86") == Arch{8, 6});
  CHECK(Arch::parse("9.0") == Arch{9, 0});
  CHECK(Arch::parse("sm_100") == Arch{10, 0});
  CHECK(Arch::parse("sm_90a") == Arch{9, 0, 'a'});
  CHECK(Arch::parse("sm_90a").name() == "sm_90a");
  CHECK(Arch::parse("sm_120").virtual_name() == "compute_120");
  CHECK(Arch::parse_list("sm_80, sm_90") == std::vector<Arch>{{8, 0}, {9, 0}});
}

TEST_CASE("Arch refuses garbage with a message naming it", "[arch]") {
  for (const char* bad : {"", "sm_", "gfx90a", "sm_9", "sm_9x", "9.12", "sm_90b"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(Arch::parse(bad), Catch::Contains("cannot parse GPU architecture"));
  }
}

TEST_CASE("a device NVRTC knows gets a cubin for its own arch", "[arch]") {
  const auto supported = kjit::nvrtc_supported_archs();
  REQUIRE_FALSE(supported.empty());
  CHECK(std::find(supported.begin(), supported.end(), Arch{9, 0}) != supported.end());
  const auto target = kjit::target_for_device(Arch{9, 0});
  CHECK(target.kind == kjit::OutputKind::cubin);
  CHECK(target.name() == "sm_90");
}

TEST_CASE("a device newer than NVRTC gets PTX for the newest arch not above it", "[arch]") {
  const auto supported = kjit::nvrtc_supported_archs();
  const Arch newest = supported.back();
  const auto target = kjit::target_for_device(Arch{99, 9});
  CHECK(target.kind == kjit::OutputKind::ptx);
  CHECK(target.arch == newest);
  CHECK(target.name() == newest.virtual_name());
  // An unknown arch between two known ones takes the lower one.
  const auto between = kjit::target_for_device(Arch{9, 5});
  CHECK(between.kind == kjit::OutputKind::ptx);
  CHECK(between.arch == Arch{9, 0});
}

TEST_CASE("a device older than every NVRTC arch is an error", "[arch]") {
  CHECK_THROWS_AS(kjit::target_for_device(Arch{3, 0}), kjit::Error);
  CHECK_THROWS_WITH(kjit::target_for_device(Arch{3, 0}), Catch::Contains("sm_30"));
}
