// What the kjit command's files share: usage errors, where shipped packages are, printers, and
// the cache subcommands (tools/cache_commands.cpp).
#pragma once

#include <kjit/kjit.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kjit_cli {

// Usage errors (exit 2) found after parsing.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where the packages shipped with kjit are: an installed tree (bin/../share/kjit/kernels), the
// Python package (kjit/bin/kjit -> kjit/kernels), `KJIT_BUILTIN_PACKAGES`, or the source tree of
// this build.
std::vector<std::filesystem::path> builtin_package_dirs();

std::string human_time(std::int64_t unix_seconds); // "2026-12-04 20:41", "-" for none
std::string size_text(std::uint64_t bytes);        // "12.3 KiB"
// "30d", "12h", "45m", "90s" or plain seconds.
std::optional<std::int64_t> parse_duration(const std::string& text);
nlohmann::json stats_json(const kjit::CacheStats& stats);

// kjit warm, kjit check (tools/warm_commands.cpp)
struct WarmArgs {
  std::vector<std::string> packages;
  std::string arch;
  std::optional<int> driver_version;
  unsigned jobs = 0;
  std::optional<std::string> remote;
};
int run_warm(const WarmArgs& args);
int run_check(const std::vector<std::string>& names, const std::string& arch, bool as_json);

// kjit cache ...
int run_cache_stats(kjit::Runtime& runtime, bool as_json);
int run_cache_ls(kjit::Runtime& runtime, const kjit::EntryFilter& filter, bool as_json);
int run_cache_verify(kjit::Runtime& runtime, bool fix, bool as_json);
int run_cache_rm(kjit::Runtime& runtime, const std::vector<std::string>& keys,
                 kjit::EntryFilter filter);
struct WhyArgs {
  std::string package; // a name or a folder
  std::string op;      // empty: every op
  std::string arch;    // default: the detected GPU's, else sm_90
  std::optional<int> driver_version;
  bool as_json = false;
};
int run_cache_why(const WhyArgs& args);

} // namespace kjit_cli
