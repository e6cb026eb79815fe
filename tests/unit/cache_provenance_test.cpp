// Note [Provenance]: entries record their package, version, kernel, ops and specialization and
// the inputs of their key; listing and removal by package; why a lookup misses.
#include <kjit/device.hpp>
#include <kjit/error.hpp>
#include <kjit/package.hpp>
#include <kjit/runtime.hpp>

#include "cache/provenance.hpp"
#include "cache/sqlite.hpp"
#include "cache/sqlite_store.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>

using kjit::test::TempDir;

namespace {

const kjit::Target k_sm90{kjit::Arch{9, 0}};
const kjit::Target k_sm80{kjit::Arch{8, 0}};

// A package "p" of `version`: op `f` and op `g` launch kernel `k` (a template on T), op `h`
// launches kernel `plain`; `extra` is appended to k.cu.
kjit::Package package(const std::filesystem::path& dir, const std::string& version,
                      const std::string& extra = "", const std::string& options = "[]") {
  kjit::test::write_text(dir / "kernel.toml", R"toml([package]
name = "p"
version = ")toml" + version + R"toml("

[kernel.k]
source = "k.cu"
entry = "k<{T}>"
options = )toml" + options + R"toml(

[kernel.plain]
source = "plain.cu"
entry = "plain"

[op.f]
schema = "f(Tensor x) -> Tensor"
kernel = "k"
outputs = [{ like = "x" }]
args = ["out0", "x"]
grid = [1]
block = [1]
specialize = { T = "x.dtype" }
warm = { T = ["float32", "int32"] }

[op.g]
schema = "g(Tensor x) -> Tensor"
kernel = "k"
outputs = [{ like = "x" }]
args = ["out0", "x"]
grid = [1]
block = [1]
specialize = { T = "x.dtype" }
warm = { T = ["float32"] }

[op.h]
schema = "h(Tensor x) -> Tensor"
kernel = "plain"
outputs = [{ like = "x" }]
args = ["out0", "x"]
grid = [1]
block = [1]
)toml");
  kjit::test::write_text(dir / "k.cu", "template <typename T> __global__ void k(T* out, const T* "
                                       "x) { out[threadIdx.x] = x[threadIdx.x]; }\n" +
                                         extra);
  kjit::test::write_text(dir / "plain.cu", "extern \"C\" __global__ void plain(float* out, const "
                                           "float* x) { out[0] = x[0]; }\n");
  return kjit::Package::load(dir);
}

void warm_all(kjit::Runtime& runtime, const kjit::Package& p, const kjit::Target& target) {
  for (const auto& item : p.warm_list()) {
    runtime.compile(item.program, target);
  }
}

kjit::WarmItem item_of(const std::vector<kjit::WarmItem>& items, const std::string& op,
                       const std::string& kernel) {
  auto it = std::find_if(items.begin(), items.end(),
                         [&](const auto& i) { return i.op == op && i.kernel == kernel; });
  REQUIRE(it != items.end());
  return *it;
}

kjit::RuntimeOptions at(const TempDir& dir) {
  return kjit::RuntimeOptions{.cache_dir = dir / "cache"};
}

} // namespace

TEST_CASE("a package's entries record package, version, kernel, ops and specialization",
          "[provenance]") {
  TempDir dir;
  const auto p = package(dir / "p", "1.2.0");
  kjit::Runtime runtime(at(dir));
  warm_all(runtime, p, k_sm90);
  runtime.compile(kjit::Program("bare.cu", "extern \"C\" __global__ void b() {}"), k_sm90);
  const auto entries = runtime.cache().entries();
  REQUIRE(entries.size() == 4); // k<float>, k<int>, plain, bare
  std::size_t of_package = 0;
  for (const auto& e : entries) {
    if (e.name == "bare.cu") {
      CHECK(e.package.empty());
      CHECK(e.ops.empty());
      continue;
    }
    ++of_package;
    CHECK(e.package == "p");
    CHECK(e.package_version == "1.2.0");
    CHECK_FALSE(e.key_fields.empty());
    if (e.kernel == "k") {
      CHECK(e.ops == std::vector<std::string>{"f", "g"});
      CHECK((e.specialization == "k<float>" || e.specialization == "k<int>"));
    } else {
      CHECK(e.kernel == "plain");
      CHECK(e.ops == std::vector<std::string>{"h"});
      CHECK(e.specialization == "plain");
    }
  }
  CHECK(of_package == 3);

  kjit::EntryFilter filter{.package = "p", .op = "g"};
  CHECK(std::count_if(entries.begin(), entries.end(),
                      [&](const auto& e) { return filter.matches(e); }) == 2);
  CHECK_THROWS_AS(runtime.cache().remove(kjit::EntryFilter{}), kjit::CacheError);
  CHECK(runtime.cache().remove(kjit::EntryFilter{.package = "p", .version = "9.9.9"}) == 0);
  CHECK(runtime.cache().remove(kjit::EntryFilter{.package = "p", .op = "h"}) == 1);
  CHECK(runtime.cache().remove(kjit::EntryFilter{.package = "p"}) == 2);
  const auto left = runtime.cache().entries();
  REQUIRE(left.size() == 1);
  CHECK(left[0].name == "bare.cu");
}

TEST_CASE("an entry a new version of the package hits gets its origin, with the next write",
          "[provenance]") {
  TempDir dir;
  {
    kjit::Runtime runtime(at(dir));
    warm_all(runtime, package(dir / "p", "1.0.0"), k_sm90);
  }
  {
    kjit::Runtime runtime(at(dir));
    warm_all(runtime, package(dir / "p", "1.0.1"), k_sm90); // same sources: hits
    CHECK(runtime.stats().compiles == 0);
  }
  kjit::Runtime runtime(at(dir));
  for (const auto& e : runtime.cache().entries()) {
    CHECK(e.package_version == "1.0.1");
  }
}

TEST_CASE("explain: a hit, and a miss named by the key input that changed", "[provenance]") {
  TempDir dir;
  const auto before = package(dir / "p", "1.0.0", "", "[\"-DA=1\"]");
  {
    kjit::Runtime runtime(at(dir));
    warm_all(runtime, before, k_sm90);
  }
  kjit::Runtime runtime(at(dir));
  const auto f_float = item_of(before.warm_list(true), "f", "k<float>");
  const auto hit = runtime.explain(f_float.program, k_sm90);
  CHECK(hit.hit);
  CHECK(hit.key == runtime.key(f_float.program, k_sm90));
  CHECK(hit.store == runtime.cache().path().string());

  const auto arch = runtime.explain(f_float.program, k_sm80);
  CHECK_FALSE(arch.hit);
  CHECK(arch.candidates == 2); // k<float> and k<int> for sm_90: the entries of k.cu
  REQUIRE(arch.differences.size() == 1);
  CHECK(arch.differences[0] == "arch: the entry has sm_90, this lookup sm_80");

  const auto edited = package(dir / "p", "1.0.0", "// edited\n", "[\"-DA=1\"]");
  const auto source =
    runtime.explain(item_of(edited.warm_list(true), "f", "k<float>").program, k_sm90);
  CHECK_FALSE(source.hit);
  CHECK(source.differences == std::vector<std::string>{"the source of k.cu changed"});

  kjit::test::write_text(dir / "p" / "common.cuh", "#define X 1\n");
  const auto header = package(dir / "p", "1.0.0", "", "[\"-DA=1\"]");
  CHECK(
    runtime.explain(item_of(header.warm_list(true), "f", "k<float>").program, k_sm90).differences ==
    std::vector<std::string>{"header common.cuh is new (the entry was compiled without it)"});
  std::filesystem::remove(dir / "p" / "common.cuh");

  const auto option = package(dir / "p", "1.0.0", "", "[\"-DA=2\"]");
  CHECK(
    runtime.explain(item_of(option.warm_list(true), "f", "k<float>").program, k_sm90).differences ==
    std::vector<std::string>{"option -DA=2 is new (the entry was compiled without it)",
                             "option -DA=1 is gone (the entry was compiled with it)"});

  kjit::Runtime other_driver(
    kjit::RuntimeOptions{.cache_dir = dir / "cache", .driver_version = 12080});
  if (!kjit::driver_available()) {
    const auto driver = other_driver.explain(f_float.program, k_sm90);
    REQUIRE(driver.differences.size() == 1);
    CHECK(driver.differences[0].starts_with("driver version"));
    CHECK(driver.differences[0].find("the entry has 13") != std::string::npos);
  }

  const auto never = runtime.explain(kjit::Program("other.cu", "x"), k_sm90);
  CHECK_FALSE(never.hit);
  CHECK(never.candidates == 0);
  CHECK(never.nearest.empty());
}

TEST_CASE("provenance travels with export and import, and stores without it still work",
          "[provenance]") {
  TempDir dir;
  const auto p = package(dir / "p", "2.0.0");
  {
    kjit::Runtime runtime(at(dir));
    warm_all(runtime, p, k_sm90);
    CHECK(runtime.cache().export_to(dir / "baked.sqlite", {"sm_90"}) == 3);
  }
  TempDir fresh;
  kjit::Runtime imported(at(fresh));
  CHECK(imported.cache().import_from(dir / "baked.sqlite") == 3);
  for (const auto& e : imported.cache().entries()) {
    CHECK(e.package == "p");
    CHECK_FALSE(e.key_fields.empty());
  }

  // A store of an older kjit: no provenance table. Read-only, it is listed and explained from
  // its columns; writable, it gets the table when opened.
  {
    kjit::detail::Database db;
    sqlite3* raw = nullptr;
    REQUIRE(sqlite3_open((dir / "baked.sqlite").c_str(), &raw) == SQLITE_OK);
    db = kjit::detail::Database(raw);
    db.exec("DROP TABLE provenance");
  }
  TempDir empty;
  auto options = at(empty);
  options.read_only_caches = std::vector<std::filesystem::path>{dir / "baked.sqlite"};
  kjit::Runtime old_reader(options);
  const auto listed = old_reader.cache().read_only_entries();
  REQUIRE(listed.size() == 3);
  CHECK(listed[0].package.empty());
  const auto f = item_of(p.warm_list(true), "f", "k<float>");
  CHECK(old_reader.explain(f.program, k_sm90).hit);
  const auto miss = old_reader.explain(f.program, k_sm80);
  CHECK_FALSE(miss.recorded);
  CHECK(miss.differences ==
        std::vector<std::string>{"arch: the entry has sm_90, this lookup sm_80"});
  CHECK(old_reader.compile(f.program, k_sm90).cached);

  kjit::detail::Database db;
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(kjit::detail::store_file(dir / "cache").c_str(), &raw) == SQLITE_OK);
  db = kjit::detail::Database(raw);
  db.exec("DROP TABLE provenance");
  kjit::Runtime reopened(at(dir));
  CHECK(reopened.compile(f.program, k_sm90).cached);
  reopened.cache().flush();
  const auto entries = reopened.cache().entries();
  REQUIRE(entries.size() == 3);
  CHECK(std::count_if(entries.begin(), entries.end(),
                      [](const auto& e) { return e.package == "p"; }) == 1); // the one it hit
}

TEST_CASE("key fields round-trip and differences read as sentences", "[provenance]") {
  using kjit::detail::Fields;
  const Fields fields{{"program", "a.cu"}, {"source", "01"},  {"header x.h", "02"},
                      {"option", "-DA"},   {"arch", "sm_90"}, {"driver", "13000"}};
  CHECK(kjit::detail::decode_fields(kjit::detail::encode_fields(fields)) == fields);
  CHECK(kjit::detail::decode_fields("junk line\nprogram\ta.cu\n") == Fields{{"program", "a.cu"}});
  Fields moved = fields;
  moved[3].second = "-DB";
  moved[2].second = "03";
  CHECK(kjit::detail::field_differences(fields, moved) ==
        std::vector<std::string>{"header x.h changed",
                                 "option -DA is new (the entry was compiled without it)",
                                 "option -DB is gone (the entry was compiled with it)"});
  const kjit::ProgramOrigin origin{"p", "1.0.0", "k", {"f", "g"}, "k<float>"};
  CHECK(kjit::detail::decode_origin(kjit::detail::encode_origin(origin)) == origin);
  CHECK(kjit::detail::encode_origin(kjit::ProgramOrigin{}).empty());
}
