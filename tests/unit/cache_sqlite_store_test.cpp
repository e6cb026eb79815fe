#include <kjit/error.hpp>
#include <kjit/runtime.hpp>

#include "cache/sqlite.hpp"
#include "cache/sqlite_store.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

using kjit::test::TempDir;

namespace {

const kjit::Target k_sm90{kjit::Arch{9, 0}};

// A tiny kernel; `variant` makes distinct programs.
kjit::Program tiny(int variant) {
  return kjit::Program("tiny.cu", "extern \"C\" __global__ void k(int* x) { *x = " +
                                    std::to_string(variant) + "; }\n");
}

kjit::RuntimeOptions at(const TempDir& dir) {
  return kjit::RuntimeOptions{.cache_dir = dir.path()};
}

// Runs `sql` on the store in `dir` from outside kjit.
void tamper(const TempDir& dir, const char* sql) {
  kjit::detail::Database db;
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(kjit::detail::store_file(dir.path()).c_str(), &raw) == SQLITE_OK);
  db = kjit::detail::Database(raw);
  db.exec(sql);
}

std::string img2gray_path() {
  return (kjit::test::source_dir() / "kernels_src/img2gray/img2gray.cu").string();
}

} // namespace

TEST_CASE("a second process gets the cubin from the store and does not compile", "[store]") {
  TempDir dir;
  const auto first = kjit::test::run_process(
    {kjit::test::helper_path(), "compile", dir.path().string(), img2gray_path(), "sm_90"});
  REQUIRE(first.exit_code == 0);
  CHECK(first.values.at("compiles") == "1");
  CHECK(first.values.at("store_misses") == "1");
  const auto second = kjit::test::run_process(
    {kjit::test::helper_path(), "compile", dir.path().string(), img2gray_path(), "sm_90"});
  REQUIRE(second.exit_code == 0);
  CHECK(second.values.at("compiles") == "0");
  CHECK(second.values.at("store_hits") == "1");
  CHECK(second.values.at("key") == first.values.at("key"));
  CHECK(second.values.at("size") == first.values.at("size"));

  kjit::Runtime runtime(at(dir));
  const auto stats = runtime.cache().stats();
  CHECK(stats.compiles == 1);
  CHECK(stats.store_hits == 1);
  CHECK(stats.store_misses == 1);
  CHECK(stats.entries == 1);
  const auto entries = runtime.cache().entries();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].name == "img2gray.cu");
  CHECK(entries[0].arch == "sm_90");
  CHECK(entries[0].kind == "cubin");
  CHECK(entries[0].hits == 1);
  CHECK(entries[0].key == first.values.at("key"));
  CHECK(entries[0].size == std::stoull(first.values.at("size")));
}

TEST_CASE("the store directory is created private", "[store]") {
  TempDir dir;
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "a/b/kjit"});
  struct stat info {};
  REQUIRE(::stat((dir / "a/b/kjit").c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0700);
  CHECK(runtime.cache().enabled());
  CHECK(runtime.cache().path() == kjit::detail::store_file(dir / "a/b/kjit"));
}

TEST_CASE("a corrupted blob is a miss: recompiled and replaced", "[store]") {
  TempDir dir;
  kjit::test::LogCapture logs;
  { kjit::Runtime(at(dir)).compile(tiny(1), k_sm90); }
  tamper(dir, "UPDATE entries SET blob = CAST(zeroblob(length(blob)) AS BLOB)");
  {
    kjit::Runtime runtime(at(dir));
    const auto binary = runtime.compile(tiny(1), k_sm90);
    CHECK(binary.data.substr(1, 3) == "ELF");
    CHECK(runtime.stats().corrupt == 1);
    CHECK(runtime.stats().compiles == 1);
    CHECK(logs.count("fails its checksum") == 1);
  }
  kjit::Runtime runtime(at(dir));
  runtime.compile(tiny(1), k_sm90);
  CHECK(runtime.stats().store_hits == 1);
  CHECK(runtime.stats().compiles == 0);
  CHECK(runtime.cache().stats().corrupt == 1);
}

TEST_CASE("a row whose key was changed is not served for the new key", "[store]") {
  TempDir dir;
  kjit::test::LogCapture logs;
  std::string key1;
  std::string key2;
  {
    kjit::Runtime runtime(at(dir));
    key1 = runtime.compile(tiny(1), k_sm90).key;
    key2 = runtime.key(tiny(2), k_sm90);
  }
  tamper(dir, ("UPDATE entries SET key = '" + key2 + "' WHERE key = '" + key1 + "'").c_str());
  kjit::Runtime runtime(at(dir));
  const auto binary = runtime.compile(tiny(2), k_sm90);
  CHECK(runtime.stats().corrupt == 1);
  CHECK(runtime.stats().compiles == 1);
  CHECK(binary.key == key2);
}

TEST_CASE("least recently used entries are evicted above the size limit", "[store]") {
  std::vector<std::size_t> sizes;
  {
    kjit::Runtime probe(kjit::RuntimeOptions{.disable_cache = true});
    for (int i = 0; i < 3; ++i) {
      sizes.push_back(probe.compile(tiny(i), k_sm90).data.size());
    }
  }
  TempDir dir;
  auto options = at(dir);
  options.max_cache_size = sizes[0] + sizes[1] + sizes[2] - 1; // room for two
  {
    kjit::Runtime runtime(options);
    runtime.compile(tiny(0), k_sm90);
    runtime.compile(tiny(1), k_sm90);
  }
  { kjit::Runtime(options).compile(tiny(0), k_sm90); } // a hit: 0 is now newer than 1
  kjit::Runtime runtime(options);
  const std::string key2 = runtime.compile(tiny(2), k_sm90).key;
  const auto entries = runtime.cache().entries();
  REQUIRE(entries.size() == 2);
  std::vector<std::string> keys{entries[0].key, entries[1].key};
  CHECK(std::find(keys.begin(), keys.end(), runtime.key(tiny(1), k_sm90)) == keys.end());
  CHECK(std::find(keys.begin(), keys.end(), key2) != keys.end());
  CHECK(runtime.cache().stats().evictions == 1);
}

TEST_CASE("a read-only store is read, never written, with one warning", "[store]") {
  TempDir dir;
  { kjit::Runtime(at(dir)).compile(tiny(1), k_sm90); }
  kjit::test::LogCapture logs;
  auto options = at(dir);
  options.cache_read_only = true;
  kjit::Runtime runtime(options);
  CHECK(runtime.cache().read_only());
  runtime.compile(tiny(1), k_sm90);
  CHECK(runtime.stats().store_hits == 1);
  runtime.compile(tiny(2), k_sm90);
  runtime.compile(tiny(3), k_sm90);
  CHECK(runtime.stats().compiles == 2);
  CHECK(runtime.compile(tiny(2), k_sm90).data.size() > 0); // kept in memory
  CHECK(runtime.stats().compiles == 2);
  CHECK(logs.count("read-only") == 1);
  CHECK(runtime.cache().entries().size() == 1);
}

TEST_CASE("a store in a folder without write permission is used read-only", "[store]") {
  if (::geteuid() == 0) {
    WARN("running as root: permissions do not stop root; covered by the cache_read_only test");
    return;
  }
  TempDir dir;
  { kjit::Runtime(at(dir)).compile(tiny(1), k_sm90); }
  std::filesystem::permissions(dir.path(), std::filesystem::perms::owner_read |
                                             std::filesystem::perms::owner_exec);
  kjit::test::LogCapture logs;
  kjit::Runtime runtime(at(dir));
  CHECK(runtime.cache().read_only());
  runtime.compile(tiny(1), k_sm90);
  CHECK(runtime.stats().store_hits == 1);
  runtime.compile(tiny(2), k_sm90);
  CHECK(logs.count("read-only") == 1);
}

TEST_CASE("a file that is not a database is moved aside and replaced", "[store]") {
  TempDir dir;
  kjit::test::write_text(kjit::detail::store_file(dir.path()),
                         std::string(8192, 'g') + "this is not an SQLite database");
  kjit::test::LogCapture logs;
  kjit::Runtime runtime(at(dir));
  REQUIRE(runtime.cache().enabled());
  CHECK(logs.count("is not a valid database") == 1);
  runtime.compile(tiny(1), k_sm90);
  CHECK(runtime.cache().entries().size() == 1);
  int moved = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    moved += entry.path().filename().string().find(".broken-") != std::string::npos;
  }
  CHECK(moved == 1);
}

TEST_CASE("a cache directory that cannot be made means compiling without a cache", "[store]") {
  TempDir dir;
  kjit::test::write_text(dir / "file", "x");
  kjit::test::LogCapture logs;
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "file/kjit"});
  CHECK_FALSE(runtime.cache().enabled());
  CHECK(logs.count("compiling without a kernel cache") == 1);
  CHECK(runtime.compile(tiny(1), k_sm90).data.size() > 0);
}

TEST_CASE("KJIT_DISABLE_CACHE=1 bypasses the store", "[store]") {
  TempDir dir;
  const auto result = kjit::test::run_process(
    {kjit::test::helper_path(), "compile", (dir / "cache").string(), img2gray_path(), "sm_90"},
    {"KJIT_DISABLE_CACHE=1"});
  REQUIRE(result.exit_code == 0);
  CHECK(result.values.at("compiles") == "1");
  CHECK_FALSE(std::filesystem::exists(dir / "cache"));
}

TEST_CASE("KJIT_CACHE_DIR places the store", "[store]") {
  TempDir dir;
  kjit::test::LogCapture logs;
  ::setenv("KJIT_CACHE_DIR", (dir / "from_env").c_str(), 1);
  {
    kjit::Runtime runtime;
    CHECK(runtime.cache().path() == kjit::detail::store_file(dir / "from_env"));
  }
  ::unsetenv("KJIT_CACHE_DIR");
  ::setenv("XDG_CACHE_HOME", (dir / "xdg").c_str(), 1);
  {
    kjit::Runtime runtime;
    CHECK(runtime.cache().path() == kjit::detail::store_file(dir / "xdg/kjit"));
  }
  ::unsetenv("XDG_CACHE_HOME");
}

TEST_CASE("8 processes starting together on an empty store compile a kernel once", "[store]") {
  TempDir dir;
  const auto go = dir / "go";
  std::vector<kjit::test::Child> children;
  for (int i = 0; i < 8; ++i) {
    children.push_back(
      kjit::test::start_process({kjit::test::helper_path(), "compile", (dir / "cache").string(),
                                 img2gray_path(), "sm_90", go.string()}));
  }
  kjit::test::write_text(go, "");
  int compiles = 0;
  int hits = 0;
  for (auto& child : children) {
    const auto result = kjit::test::wait_process(child);
    REQUIRE(result.exit_code == 0);
    compiles += std::stoi(result.values.at("compiles"));
    hits += std::stoi(result.values.at("store_hits"));
  }
  CHECK(compiles == 1);
  CHECK(hits == 7);
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "cache"});
  CHECK(runtime.cache().stats().compiles == 1);
  CHECK(runtime.cache().stats().entries == 1);
}

TEST_CASE("verify reports a corrupted entry and --fix removes it", "[store]") {
  TempDir dir;
  kjit::test::LogCapture logs;
  {
    kjit::Runtime runtime(at(dir));
    runtime.compile(tiny(1), k_sm90);
    runtime.compile(tiny(2), k_sm90);
  }
  kjit::Runtime runtime(at(dir));
  CHECK(runtime.cache().verify(false).ok());
  const std::string key = runtime.key(tiny(2), k_sm90);
  tamper(dir,
         ("UPDATE entries SET blob = zeroblob(length(blob)) WHERE key = '" + key + "'").c_str());
  const auto report = runtime.cache().verify(false);
  CHECK(report.checked == 2);
  CHECK(report.bad_entries == std::vector<std::string>{key});
  CHECK(report.integrity.empty());
  CHECK(runtime.cache().entries().size() == 2);
  const auto fixed = runtime.cache().verify(true);
  CHECK(fixed.removed == 1);
  CHECK(runtime.cache().entries().size() == 1);
  CHECK(runtime.cache().verify(false).ok());
}

TEST_CASE("export writes a standalone store that import merges, skipping bad rows", "[store]") {
  TempDir dir;
  {
    kjit::Runtime runtime(at(dir));
    runtime.compile(tiny(1), k_sm90);
    runtime.compile(tiny(1), kjit::Target{kjit::Arch{8, 0}});
  }
  kjit::Runtime runtime(at(dir));
  CHECK(runtime.cache().export_to(dir / "all.sqlite", {}) == 2);
  CHECK(runtime.cache().export_to(dir / "sm90.sqlite", {"sm_90"}) == 1);
  TempDir fresh;
  kjit::Runtime other(at(fresh));
  CHECK(other.cache().import_from(dir / "sm90.sqlite") == 1);
  CHECK(other.cache().import_from(dir / "all.sqlite") == 1); // sm_90 is already there
  CHECK(other.cache().verify(false).ok());
  other.compile(tiny(1), k_sm90);
  CHECK(other.stats().store_hits == 1);
  CHECK(other.stats().compiles == 0);
  CHECK_THROWS_AS(other.cache().import_from(dir / "missing.sqlite"), kjit::CacheError);
}

TEST_CASE("read-only stores are searched after the writable one and never written", "[store]") {
  TempDir baked;
  { kjit::Runtime(at(baked)).compile(tiny(1), k_sm90); }
  TempDir writable;
  auto options = at(writable);
  options.read_only_caches = std::vector<std::filesystem::path>{baked.path()};
  kjit::Runtime runtime(options);
  REQUIRE(runtime.cache().read_only_paths().size() == 1);
  const auto binary = runtime.compile(tiny(1), k_sm90);
  CHECK(binary.cached);
  CHECK(runtime.stats().compiles == 0);
  runtime.compile(tiny(2), k_sm90); // compiled: goes to the writable store
  CHECK(runtime.stats().compiles == 1);
  CHECK(runtime.cache().entries().size() == 1);
  kjit::Runtime baked_view(at(baked));
  CHECK(baked_view.cache().entries().size() == 1);
}

TEST_CASE("prune by size and clear", "[store]") {
  TempDir dir;
  kjit::Runtime runtime(at(dir));
  for (int i = 0; i < 4; ++i) {
    runtime.compile(tiny(i), k_sm90);
  }
  CHECK(runtime.cache().prune(std::nullopt, 3600) == 0);
  const auto size = runtime.cache().stats().size_bytes;
  CHECK(runtime.cache().prune(size / 2, std::nullopt) >= 2);
  CHECK(runtime.cache().stats().size_bytes <= size / 2);
  runtime.cache().clear();
  CHECK(runtime.cache().entries().empty());
  CHECK(runtime.cache().stats().compiles == 0);
}

TEST_CASE("a cache directory others can write is not used: the per-user one is", "[store]") {
  TempDir dir;
  const auto shared = dir / "shared";
  std::filesystem::create_directory(shared);
  std::filesystem::permissions(shared, std::filesystem::perms::all);
  ::setenv("XDG_CACHE_HOME", (dir / "home-cache").c_str(), 1);
  {
    kjit::test::LogCapture logs;
    kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = shared});
    CHECK(logs.count("is writable by others") == 1);
    CHECK(runtime.cache().path() == kjit::detail::store_file(dir / "home-cache/kjit"));
  }
  if (::geteuid() == 0) {
    const auto foreign = dir / "foreign";
    std::filesystem::create_directory(foreign);
    REQUIRE(::chown(foreign.c_str(), 65534, 65534) == 0);
    kjit::test::LogCapture logs;
    kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = foreign});
    CHECK(logs.count("belongs to user id 65534") == 1);
    CHECK(runtime.cache().path() == kjit::detail::store_file(dir / "home-cache/kjit"));
  }
  ::unsetenv("XDG_CACHE_HOME");
}

TEST_CASE("a read-only store anybody can rewrite is skipped", "[store]") {
  TempDir baked;
  { kjit::Runtime(at(baked)).compile(tiny(1), k_sm90); }
  std::filesystem::permissions(kjit::detail::store_file(baked.path()),
                               std::filesystem::perms::others_write,
                               std::filesystem::perm_options::add);
  kjit::test::LogCapture logs;
  kjit::Runtime runtime(
    kjit::RuntimeOptions{.disable_cache = false, .read_only_caches = std::vector{baked.path()}});
  CHECK(runtime.cache().read_only_paths().empty());
  CHECK(logs.count("writable by others") == 1);
}

TEST_CASE("read-only stores follow the writable store's rules: group, folder, owner",
          "[store][adversarial]") {
  TempDir baked;
  { kjit::Runtime(at(baked)).compile(tiny(1), k_sm90); }
  const auto file = kjit::detail::store_file(baked.path());
  TempDir writable;
  auto refused = [&](const char* why) {
    kjit::test::LogCapture logs;
    auto options = at(writable);
    options.read_only_caches = std::vector{file};
    kjit::Runtime runtime(options);
    CHECK(runtime.cache().read_only_paths().empty());
    CHECK(logs.count(why) == 1);
  };
  using std::filesystem::perm_options;
  using std::filesystem::perms;
  std::filesystem::permissions(file, perms::group_write, perm_options::add);
  refused("writable by its group");
  std::filesystem::permissions(file, perms::group_write, perm_options::remove);
  std::filesystem::permissions(baked.path(), perms::group_write, perm_options::add);
  refused("writable by its group"); // its folder: someone could replace the file
  std::filesystem::permissions(baked.path(), perms::group_write, perm_options::remove);
  if (::geteuid() == 0) {
    REQUIRE(::chown(file.c_str(), 65534, 65534) == 0);
    refused("belongs to user id 65534");
  }
}

TEST_CASE("a scoped read-only store serves only programs of its scope", "[store][adversarial]") {
  TempDir baked;
  { kjit::Runtime(at(baked)).compile(tiny(1), k_sm90); }
  TempDir writable;
  kjit::Runtime runtime(at(writable));
  REQUIRE(runtime.cache().add_read_only_path(baked.path(), "pkg"));
  // Another package's program with the same content is not served from pkg's store.
  kjit::CompileOptions other = tiny(1).options();
  other.scope = "other";
  CHECK_FALSE(
    runtime.compile(kjit::Program(tiny(1).name(), tiny(1).source(), other), k_sm90).cached);
  CHECK(runtime.stats().compiles == 1);
  kjit::CompileOptions own = tiny(1).options();
  own.scope = "pkg";
  CHECK(runtime.compile(kjit::Program(tiny(1).name(), tiny(1).source(), own), k_sm90).cached);
  CHECK(runtime.stats().compiles == 1);
}

TEST_CASE("a store of a future schema version is not used, and compiling goes on", "[store]") {
  TempDir dir;
  { kjit::Runtime(at(dir)).compile(tiny(1), k_sm90); }
  tamper(dir, "UPDATE meta SET value = '99' WHERE name = 'schema_version'");
  kjit::test::LogCapture logs;
  kjit::Runtime runtime(at(dir));
  CHECK_FALSE(runtime.cache().enabled());
  CHECK(logs.count("schema version 99") == 1);
  CHECK(runtime.compile(tiny(1), k_sm90).data.size() > 0);
}

TEST_CASE("a truncated store file is detected and recovered", "[store]") {
  TempDir dir;
  {
    kjit::Runtime runtime(at(dir));
    for (int i = 0; i < 8; ++i) {
      runtime.compile(tiny(i), k_sm90);
    }
  }
  const auto file = kjit::detail::store_file(dir.path());
  REQUIRE(std::filesystem::file_size(file) > 3 * 4096);
  std::filesystem::resize_file(file, 3 * 4096);
  kjit::test::LogCapture logs;
  kjit::Runtime runtime(at(dir));
  for (int i = 0; i < 8; ++i) {
    CHECK(runtime.compile(tiny(i), k_sm90).data.substr(1, 3) == "ELF");
  }
  // Either the open found the damage (moved aside, new store) or reads did (misses, recompiled).
  CHECK(logs.count("is not a valid database") + logs.count("cannot read kernel cache") +
          logs.count("cannot write to kernel cache") >=
        1);
  if (runtime.cache().enabled() && !runtime.cache().read_only()) {
    runtime.cache().verify(true);
  }
}
