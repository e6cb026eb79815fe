#include "runtime/compile/nvrtc_compiler.hpp"
#include "runtime/compile/pch_folder.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <thread>

#include <csignal>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;

// A kernel that starts with headers worth precompiling.
std::string header_heavy(int salt) {
  return fmt::format(R"(#include <cuda_fp16.h>
#include <cuda/std/type_traits>
#include <cuda/std/limits>

extern "C" __global__ void heavy{}(__half* x) {{
  x[0] = __float2half(cuda::std::numeric_limits<float>::epsilon());
}}
)",
                     salt);
}

// The PCH folders (kjit's and NVRTC's own) directly under `base`, sorted.
std::vector<std::string> pch_folders(const fs::path& base) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(base)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("kjit-pch-") || name.starts_with(".kjit-pch-new-") ||
        name.starts_with("__nvrtc_auto_pch_")) {
      names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool holds_pch_file(const fs::path& folder) {
  return std::any_of(fs::directory_iterator(folder), fs::directory_iterator(),
                     [](const auto& entry) { return entry.path().extension() == ".pch"; });
}

// A fake PCH folder `name` under `base` with an owner file and a PCH file.
fs::path fake_folder(const fs::path& base, const std::string& name) {
  const fs::path folder = base / name;
  kjit::test::write_text(folder / "owner", "");
  kjit::test::write_text(folder / "k_0.pch", std::string(4096, 'p'));
  return folder;
}

} // namespace

TEST_CASE("the sweep removes the PCH folders of processes that are gone, and nothing else",
          "[pch]") {
  kjit::test::TempDir base;
  fake_folder(base.path(), "kjit-pch-dead01");
  const fs::path live = fake_folder(base.path(), "kjit-pch-live01");
  // The live folder's owner lock, held on an open file description of its own, as its process
  // would hold it.
  const int live_lock = ::open((live / "owner").c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(live_lock >= 0);
  REQUIRE(::flock(live_lock, LOCK_EX | LOCK_NB) == 0);
  // Named folders that lost their owner file: removed where old and empty (no PCH of a live
  // process can be in them), else kept.
  kjit::test::write_text(base / "kjit-pch-noowner" / "k_0.pch", "p");
  fs::create_directory(base / "kjit-pch-empty01");
  fs::create_directory(base / "kjit-pch-young01");
  const auto an_hour_ago = fs::file_time_type::clock::now() - std::chrono::hours(1);
  fs::last_write_time(base / "kjit-pch-noowner", an_hour_ago);
  fs::last_write_time(base / "kjit-pch-empty01", an_hour_ago);
  fake_folder(base.path(), ".kjit-pch-new-young1"); // perhaps being made now
  const fs::path old_unfinished = fake_folder(base.path(), ".kjit-pch-new-old001");
  fs::last_write_time(old_unfinished, an_hour_ago);
  const fs::path target = fake_folder(base.path(), "elsewhere");
  fs::create_directory_symlink(target, base / "kjit-pch-link01"); // no symlink is followed
  kjit::test::write_text(base / "kjit-pch-file01", "a file, not a folder");

  CHECK(kjit::detail::sweep_pch_folders(base.path()) == 3);
  CHECK_FALSE(fs::exists(base / "kjit-pch-dead01"));
  CHECK_FALSE(fs::exists(old_unfinished));
  CHECK_FALSE(fs::exists(base / "kjit-pch-empty01"));
  CHECK(fs::exists(base / "kjit-pch-young01"));
  CHECK(fs::exists(live / "k_0.pch"));
  CHECK(fs::exists(base / "kjit-pch-noowner" / "k_0.pch"));
  CHECK(fs::exists(base / ".kjit-pch-new-young1" / "k_0.pch"));
  CHECK(fs::is_symlink(base / "kjit-pch-link01"));
  CHECK(fs::exists(target / "k_0.pch"));
  CHECK(fs::exists(base / "kjit-pch-file01"));

  ::close(live_lock); // its process is gone now
  CHECK(kjit::detail::sweep_pch_folders(base.path()) == 1);
  CHECK_FALSE(fs::exists(live));
  CHECK(kjit::detail::sweep_pch_folders(base / "missing") == 0);
}

TEST_CASE("two sweeps at once remove each dead folder whole, once", "[pch]") {
  kjit::test::TempDir base;
  constexpr int k_folders = 200;
  for (int i = 0; i < k_folders; ++i) {
    const fs::path folder = fake_folder(base.path(), fmt::format("kjit-pch-{:06}", i));
    for (int j = 1; j < 8; ++j) {
      kjit::test::write_text(folder / fmt::format("k_{}.pch", j), "p");
    }
  }
  std::size_t removed[2] = {0, 0};
  std::thread other([&] { removed[1] = kjit::detail::sweep_pch_folders(base.path()); });
  removed[0] = kjit::detail::sweep_pch_folders(base.path());
  other.join();
  CHECK(removed[0] + removed[1] == k_folders);
  CHECK(pch_folders(base.path()).empty());
}

TEST_CASE("PCH files go to this process's own kjit-pch folder, which the sweep leaves alone",
          "[pch][nvrtc]") {
  if (!kjit::detail::pch_has_room()) {
    WARN("less than 1 GiB free in the temp folder: kjit uses no PCH there, nothing to check");
    return;
  }
  kjit::detail::CompileRequest request;
  request.name = "heavy.cu";
  request.source = header_heavy(0);
  request.target = kjit::Target{kjit::Arch{9, 0}, kjit::OutputKind::cubin};
  request.auto_pch = true;
  kjit::detail::nvrtc_compile(request);
  const fs::path folder = kjit::detail::pch_folder();
  REQUIRE_FALSE(folder.empty());
  CHECK(fs::equivalent(folder.parent_path(), kjit::detail::pch_base_dir()));
  CHECK(folder.filename().string().starts_with("kjit-pch-"));
  CHECK(fs::exists(folder / "owner"));
  CHECK(holds_pch_file(folder)); // the first PCH compile of this process made one there
  CHECK_FALSE(
    fs::exists(kjit::detail::pch_base_dir() / fmt::format("__nvrtc_auto_pch_{}_0", ::getpid())));
  kjit::detail::sweep_pch_folders(folder.parent_path());
  CHECK(holds_pch_file(folder));
}

TEST_CASE("a killed process's PCH folder is removed by the next process, a live one's kept",
          "[pch][nvrtc]") {
  if (!kjit::detail::pch_has_room()) {
    WARN("less than 1 GiB free in the temp folder: kjit uses no PCH there, nothing to check");
    return;
  }
  kjit::test::TempDir tmp;
  kjit::test::write_text(tmp / "one.cu", header_heavy(1));
  kjit::test::write_text(tmp / "two.cu", header_heavy(2));
  const std::vector<std::string> env = {"TMPDIR=" + tmp.path().string()};
  const std::string helper = kjit::test::helper_path();

  auto waiting =
    kjit::test::start_process({helper, "compile-then-wait", (tmp / "cache1").string(),
                               (tmp / "one.cu").string(), "sm_90", (tmp / "ready").string()},
                              env);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(tmp / "ready") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(fs::exists(tmp / "ready"));
  const auto left = pch_folders(tmp.path());
  REQUIRE(left.size() == 1); // kjit's, not NVRTC's own
  CHECK(left[0].starts_with("kjit-pch-"));
  CHECK(holds_pch_file(tmp / left[0]));

  // Another process compiling two.cu (into a new store, so that it compiles).
  const auto compile_in = [&](const std::string& cache) {
    const auto result = kjit::test::run_process(
      {helper, "compile", (tmp / cache).string(), (tmp / "two.cu").string(), "sm_90"}, env);
    REQUIRE(result.exit_code == 0);
    CHECK(result.values.at("compiles") == "1");
  };
  // A second process: the first one's folder is live and kept; its own is gone when it exits.
  compile_in("cache2");
  CHECK(pch_folders(tmp.path()) == left);

  ::kill(waiting.pid, SIGKILL);
  kjit::test::wait_process(waiting);
  CHECK(pch_folders(tmp.path()) == left); // what a killed process leaves
  CHECK(holds_pch_file(tmp / left[0]));

  compile_in("cache3");
  CHECK(pch_folders(tmp.path()).empty());
}
