#include <kjit/runtime.hpp>

#include "cache/cache_key.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

using kjit::detail::cache_key;
using kjit::detail::KeyInputs;

namespace {

KeyInputs base_inputs() {
  KeyInputs inputs;
  inputs.program_digest = {1, 2};
  inputs.target = kjit::Target{kjit::Arch{9, 0}, kjit::OutputKind::cubin};
  inputs.nvrtc_major = 13;
  inputs.nvrtc_minor = 0;
  inputs.driver_version = 13000;
  return inputs;
}

} // namespace

TEST_CASE("changing any one key field changes the key", "[cache_key]") {
  const auto base = cache_key(base_inputs());
  std::vector<KeyInputs> changed(6, base_inputs());
  changed[0].program_digest[1] = 3;
  changed[1].target.arch = kjit::Arch{8, 0};
  changed[2].target.kind = kjit::OutputKind::ptx;
  changed[3].nvrtc_major = 12;
  changed[4].nvrtc_minor = 9;
  changed[5].driver_version = 12080;
  for (std::size_t i = 0; i < changed.size(); ++i) {
    CAPTURE(i);
    CHECK(cache_key(changed[i]) != base);
  }
  auto suffixed = base_inputs();
  suffixed.target.arch.suffix = 'a';
  CHECK(cache_key(suffixed) != base);
}

TEST_CASE("the runtime's key covers source, headers, options and name expressions", "[cache_key]") {
  kjit::test::TempDir dir;
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  const kjit::Target sm90{kjit::Arch{9, 0}};
  kjit::test::write_text(dir / "k.cu", "#include \"h.cuh\"\n__global__ void k() {}\n");
  kjit::test::write_text(dir / "h.cuh", "#define X 1\n");
  const auto base = runtime.key(kjit::Program::from_file(dir / "k.cu"), sm90);
  CHECK(base.size() == 32);
  CHECK(runtime.key(kjit::Program::from_file(dir / "k.cu"), sm90) == base);

  kjit::test::write_text(dir / "h.cuh", "#define X 2\n");
  CHECK(runtime.key(kjit::Program::from_file(dir / "k.cu"), sm90) != base);
  kjit::test::write_text(dir / "h.cuh", "#define X 1\n");
  CHECK(runtime.key(kjit::Program::from_file(dir / "k.cu"), sm90) == base);

  CHECK(runtime.key(kjit::Program::from_file(dir / "k.cu", {.options = {"-DY"}}), sm90) != base);
  CHECK(runtime.key(kjit::Program::from_file(dir / "k.cu", {.name_expressions = {"k"}}), sm90) !=
        base);
  CHECK(runtime.key(kjit::Program::from_file(dir / "k.cu"), kjit::Target{kjit::Arch{8, 0}}) !=
        base);
}

TEST_CASE("nothing process-specific enters the key: another process computes the same key",
          "[cache_key]") {
  kjit::test::TempDir dir;
  kjit::test::write_text(dir / "k.cu", "__global__ void k() {}\n");
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  const auto here =
    runtime.key(kjit::Program::from_file(dir / "k.cu"), kjit::Target{kjit::Arch{9, 0}});
  // A copy in another folder, found through another path, from another process.
  kjit::test::TempDir other;
  std::filesystem::copy_file(dir / "k.cu", other / "k.cu");
  const auto there =
    kjit::test::run_process({kjit::test::helper_path(), "key", (other / "k.cu").string(), "sm_90"},
                            {"KJIT_CACHE_DIR=" + (other / "cache").string()});
  REQUIRE(there.exit_code == 0);
  CHECK(there.output == here + "\n");
}
