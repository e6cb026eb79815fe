// The kjit command: pre-warm kernel caches and manage them. A thin shell over the library.
//
//   kjit warm [PACKAGE|PATH ...] [--arch sm_80,sm_90] [--driver-version V] [-j N] [--remote URL]
//   kjit cache stats|ls|verify [--fix]|prune|clear|export FILE|import FILE|push|pull [--json]
//   kjit cache ls|rm [KEY ...] [--package NAME [--version V]] [--op OP] [--arch A]
//   kjit cache why PACKAGE [OP] [--arch A] [--driver-version V] [--json]
//   kjit info [--json]
//   kjit compile FILE --arch sm_90 [-o OUT] [--ptx] [--option OPT ...]
//   kjit new NAME [DIR]
//
// Exit codes: 0 success, 1 the work failed, 2 usage errors. Here: the options of every command,
// info, compile and new; warm and check in warm_commands.cpp, cache in cache_commands.cpp.
#include <kjit/kjit.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <unistd.h>

#include "tools/cli.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace kjit_cli;

namespace {

// ---- info, compile, new ---------------------------------------------------------------------

int run_info(bool as_json, const std::vector<std::string>& extra_packages) {
  kjit::Runtime runtime;
  const kjit::NvrtcInfo nvrtc = kjit::nvrtc_info();
  json devices = json::array();
  for (int d = 0; d < kjit::device_count(); ++d) {
    const auto info = kjit::device_info(d);
    devices.push_back({{"index", d},
                       {"name", info.name},
                       {"arch", info.arch.name()},
                       {"memory", info.total_memory},
                       {"target", nvrtc.found ? kjit::target_for_device(info.arch).name()
                                              : std::string("? (no NVRTC)")}});
  }
  const auto search = kjit::package_search_path(builtin_package_dirs());
  json packages = json::array();
  std::vector<fs::path> dirs = kjit::find_packages(search);
  for (const auto& extra : extra_packages) {
    std::error_code ec;
    if (std::none_of(dirs.begin(), dirs.end(),
                     [&](const fs::path& d) { return fs::equivalent(d, extra, ec); })) {
      dirs.emplace_back(extra);
    }
  }
  for (const auto& dir : dirs) {
    try {
      const auto package = kjit::Package::load(dir);
      packages.push_back(
        {{"name", package.name()}, {"version", package.version()}, {"path", dir.string()}});
    } catch (const kjit::Error& e) {
      packages.push_back({{"path", dir.string()}, {"error", e.what()}});
    }
  }
  json stores = json::array();
  if (runtime.cache().enabled()) {
    const auto stats = runtime.cache().stats();
    stores.push_back({{"path", runtime.cache().path().string()},
                      {"read_only", runtime.cache().read_only()},
                      {"entries", stats.entries},
                      {"size", stats.size_bytes}});
  }
  for (const auto& path : runtime.cache().read_only_paths()) {
    stores.push_back({{"path", path.string()}, {"read_only", true}});
  }
  json search_json = json::array();
  for (const auto& dir : search) {
    search_json.push_back(dir.string());
  }
  std::string driver = "none (libcuda.so.1 not found)";
  if (kjit::driver_available()) {
    driver = fmt::format("CUDA {}.{}", runtime.driver_version() / 1000,
                         runtime.driver_version() % 1000 / 10);
  }
  std::vector<std::string> archs;
  if (nvrtc.found) {
    for (const auto& arch : kjit::nvrtc_supported_archs()) {
      archs.push_back(arch.name());
    }
  }
  json nvrtc_json = {{"found", nvrtc.found},
                     {"library", nvrtc.library},
                     {"how", nvrtc.how},
                     {"include_dirs", nvrtc.include_dirs},
                     {"searched", nvrtc.searched}};
  if (!nvrtc.found) {
    nvrtc_json["error"] = nvrtc.error;
  }
  const json info = {{"kjit", std::string(kjit::version())},
                     {"nvrtc", nvrtc.found ? fmt::format("{}.{}", nvrtc.major, nvrtc.minor) : ""},
                     {"nvrtc_library", nvrtc_json},
                     {"nvrtc_archs", archs},
                     {"driver", driver},
                     {"devices", devices},
                     {"stores", stores},
                     {"package_search_path", search_json},
                     {"packages", packages}};
  if (as_json) {
    std::cout << info.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("kjit      {}\n", kjit::version());
  if (nvrtc.found) {
    std::cout << fmt::format("NVRTC     {}.{} ({} to {}) from {} ({})\n", nvrtc.major, nvrtc.minor,
                             archs.empty() ? "?" : archs.front(),
                             archs.empty() ? "?" : archs.back(), nvrtc.library, nvrtc.how);
    std::string headers = nvrtc.include_dirs.empty() ? "NVRTC's built-in only" : "";
    for (const auto& dir : nvrtc.include_dirs) {
      headers += (headers.empty() ? "" : ", ") + dir;
    }
    std::cout << fmt::format("headers   {}\n", headers);
  } else {
    std::cout << fmt::format("NVRTC     none: {}\n", nvrtc.error);
  }
  std::cout << fmt::format("driver    {}\n", driver);
  if (devices.empty()) {
    std::cout << "devices   none\n";
  }
  for (const auto& d : devices) {
    std::cout << fmt::format("device {}  {} ({}, {}), compiles for {}\n", d["index"].get<int>(),
                             d["name"].get<std::string>(), d["arch"].get<std::string>(),
                             size_text(d["memory"].get<std::uint64_t>()),
                             d["target"].get<std::string>());
  }
  if (stores.empty()) {
    std::cout << "cache     disabled\n";
  }
  for (const auto& s : stores) {
    std::cout << fmt::format("cache     {}{}", s["path"].get<std::string>(),
                             s["read_only"].get<bool>() ? " (read-only)" : "");
    if (s.contains("entries")) {
      std::cout << fmt::format(": {} entries, {}", s["entries"].get<std::uint64_t>(),
                               size_text(s["size"].get<std::uint64_t>()));
    }
    std::cout << "\n";
  }
  for (const auto& dir : search) {
    std::cout << "packages  " << dir.string() << "\n";
  }
  for (const auto& p : packages) {
    if (p.contains("error")) {
      std::cout << "  (broken) " << p["error"].get<std::string>() << "\n";
    } else {
      std::cout << fmt::format("  {} {}\n", p["name"].get<std::string>(),
                               p["version"].get<std::string>());
    }
  }
  return 0;
}

struct CompileArgs {
  std::string file;
  std::string arch;
  std::string output;
  bool ptx = false;
  std::vector<std::string> options;
  std::vector<std::string> include_dirs;
};

int run_compile(const CompileArgs& args) {
  kjit::CompileOptions options;
  options.options = args.options;
  for (const auto& dir : args.include_dirs) {
    options.include_dirs.emplace_back(dir);
  }
  const auto program = kjit::Program::from_file(args.file, options);
  const kjit::Target target{kjit::Arch::parse(args.arch),
                            args.ptx ? kjit::OutputKind::ptx : kjit::OutputKind::cubin};
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  const kjit::Binary binary = runtime.compile(program, target);
  fs::path out = args.output;
  if (out.empty()) {
    out = fs::path(args.file).filename();
    out.replace_extension(args.ptx ? ".ptx" : ".cubin");
  }
  std::ofstream file(out, std::ios::binary);
  file.write(binary.data.data(), static_cast<std::streamsize>(binary.data.size()));
  if (!file) {
    throw kjit::Error(fmt::format("cannot write '{}'", out.string()));
  }
  if (!binary.log.empty()) {
    std::cerr << binary.log << "\n";
  }
  std::cout << fmt::format("{}: {} for {}, {} bytes, {:.1f} ms\n", out.string(),
                           args.ptx ? "PTX" : "cubin", target.name(), binary.data.size(),
                           binary.compile_ms);
  return 0;
}

int run_new(const std::string& name, const std::string& dir_arg) {
  const bool identifier =
    !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
    std::all_of(name.begin(), name.end(),
                [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  if (!identifier) {
    throw UsageError(
      fmt::format("'{}' is not a valid package name: use letters, digits and _", name));
  }
  const fs::path dir = dir_arg.empty() ? fs::path(name) : fs::path(dir_arg);
  std::error_code ec;
  if (fs::exists(dir / "kernel.toml", ec)) {
    throw kjit::Error(fmt::format("'{}' already holds a kernel package", dir.string()));
  }
  fs::create_directories(dir, ec);
  if (ec) {
    throw kjit::Error(fmt::format("cannot create '{}': {}", dir.string(), ec.message()));
  }
  auto write = [&](const std::string& file, const std::string& text) {
    std::ofstream out(dir / file);
    out << text;
    if (!out) {
      throw kjit::Error(fmt::format("cannot write '{}'", (dir / file).string()));
    }
  };
  write("kernel.toml", fmt::format(R"~([package]
name = "{0}"
version = "0.1.0"
description = "y = a * x + b, elementwise (a kjit kernel package)"

[kernel.{0}]
source = "{0}.cu"
entry = "{0}_kernel<{{T}}>"

[op.{0}]
schema = "{0}(Tensor x, float a, float b) -> Tensor"
doc = "a * x + b for float32 tensors"
kernel = "{0}"
checks = ["x.dtype == float32 || x.dtype == float64", "x.is_contiguous()"]
outputs = [{{ like = "x" }}]
args = ["out0", "x", "a", "b", "x.numel()"]
grid = ["cdiv(x.numel(), 256)"]
block = [256]
specialize = {{ T = "x.dtype" }}
warm = {{ T = ["float32", "float64"] }}
cpu = "{0}_cpu"
)~",
                                   name));
  write(name + ".cu", fmt::format(R"~(// y = a * x + b, one thread per element.
template <typename T>
__global__ void {0}_kernel(T* __restrict__ y, const T* __restrict__ x, float a, float b,
                           long long n) {{
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {{
    y[i] = static_cast<T>(a) * x[i] + static_cast<T>(b);
  }}
}}
)~",
                                  name));
  write("__init__.py", fmt::format(R"~("""CPU kernel of the {0} package."""

import torch


def {0}_cpu(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    return a * x + b
)~",
                                   name));
  write(fmt::format("test_{}.py", name), fmt::format(R"~(import pathlib
import subprocess
import sys

import pytest
import torch

import kjit

HERE = pathlib.Path(__file__).resolve().parent
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_torch(device, dtype):
    module = kjit.load(HERE)
    x = torch.randn(1000, 3, device=device, dtype=dtype)
    torch.testing.assert_close(module.{0}(x, 2.0, -1.0), 2.0 * x - 1.0)


def test_opcheck():
    kjit.load(HERE)
    torch.library.opcheck(torch.ops.{0}.{0}.default, (torch.randn(8), 2.0, 1.0))


def test_every_launch_matches_its_kernel():
    """Compiles every specialization and checks the launches' arguments against the kernels'
    parameters (no GPU needed): a wrong `args` list fails here, not on a GPU."""
    result = subprocess.run([sys.executable, "-m", "kjit", "check", str(HERE), "--arch", "sm_90"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
)~",
                                                     name));
  std::cout << fmt::format("created kernel package '{}' in {}\n"
                           "  kernel.toml, {}.cu, __init__.py (CPU kernel), test_{}.py\n"
                           "next: kjit warm {} --arch sm_90; python -m pytest {}\n",
                           name, dir.string(), name, name, dir.string(), dir.string());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"kjit: pre-warm and manage just-in-time CUDA kernel caches", "kjit"};
  app.require_subcommand(1);
  // Run by the Python package's `kjit` command, which serves these itself (python_bindings/kjit/
  // _cli.py): listed here so that one `kjit --help` names every subcommand.
  if (const char* python = std::getenv("KJIT_PYTHON_CLI"); python != nullptr && *python != '\0') {
    app.footer(
      "Package distribution (the Python package's, kjit COMMAND --help for each):\n"
      "  fetch URL           fetch a package from a git repository into the package store\n"
      "  lock [PROJECT]      resolve [tool.kjit.dependencies] of pyproject.toml into kjit.lock\n"
      "  sync                fetch and verify what kjit.lock names (then works offline)\n"
      "  bundle OUT          copy the locked packages and a pre-warmed store into a folder\n"
      "  wheel PACKAGE       build a py3-none-any wheel of a kernel package\n"
      "  versions NAME       the installed versions of a package\n"
      "  info NAME           a package: version, ops with schemas, kernels, source hash\n"
      "  tune PACKAGE        tune ops' launch parameters for shapes on this GPU, into the store\n");
  }
  app.set_version_flag("--version", std::string(kjit::version()));

  WarmArgs warm_args;
  auto* warm = app.add_subcommand("warm", "compile kernel packages for archs into the cache");
  warm->add_option("packages", warm_args.packages,
                   "package names or folders (default: every package on the search path)");
  warm->add_option("--arch", warm_args.arch, "archs, e.g. sm_80,sm_90 (default: detected GPUs)");
  warm->add_option("--driver-version", warm_args.driver_version,
                   "driver version that enters cache keys without a driver (e.g. 13000)");
  warm->add_option("-j,--jobs", warm_args.jobs, "parallel compiles (default: one per core)");
  warm->add_option("--remote", warm_args.remote,
                   "also fill this remote cache, e.g. redis://host:6379 (default: "
                   "KJIT_REMOTE_CACHE)");

  std::vector<std::string> check_packages;
  std::string check_arch;
  auto* check = app.add_subcommand(
    "check", "compile every specialization of packages and check each launch's arguments "
             "against the kernel's parameters (no GPU needed)");
  check->add_option("packages", check_packages, "package names or folders")->required();
  check->add_option("--arch", check_arch, "archs to compile for (default: sm_90)");
  bool check_json = false;
  check->add_flag("--json", check_json, "print JSON");

  auto* cache = app.add_subcommand("cache", "inspect and manage the kernel cache");
  cache->require_subcommand(1);
  bool as_json = false;
  auto* stats = cache->add_subcommand("stats", "hits, misses, compiles, size");
  stats->add_flag("--json", as_json, "print JSON");
  kjit::EntryFilter filter;
  auto add_filter = [&](CLI::App* command) {
    command->add_option("--package", filter.package, "the entries of this package (a name)");
    command->add_option("--version", filter.version, "of this version of --package");
    command->add_option("--op", filter.op, "of the kernels this op launches");
    command->add_option("--arch", filter.arch, "for this arch, e.g. sm_90");
  };
  auto* ls = cache->add_subcommand("ls", "list entries, most recently used first");
  add_filter(ls);
  ls->add_flag("--json", as_json, "print JSON");
  std::vector<std::string> rm_keys;
  auto* rm = cache->add_subcommand("rm", "remove entries by key or by package, version, op");
  rm->add_option("keys", rm_keys, "keys or key prefixes (kjit cache ls shows them)");
  add_filter(rm);
  WhyArgs why_args;
  auto* why = cache->add_subcommand(
    "why", "whether an op's kernels are cached, and for a miss the input of the key that "
           "differs (source, header, option, arch, NVRTC, driver)");
  why->add_option("package", why_args.package, "a package name or folder")->required();
  why->add_option("op", why_args.op, "one op (default: every op)");
  why->add_option("--arch", why_args.arch, "archs (default: the detected GPU's, else sm_90)");
  why->add_option("--driver-version", why_args.driver_version,
                  "driver version that enters cache keys without a driver, as for warm");
  why->add_flag("--json", why_args.as_json, "print JSON");
  bool fix = false;
  auto* verify = cache->add_subcommand("verify", "check every checksum and SQLite's integrity");
  verify->add_flag("--fix", fix, "remove bad entries");
  verify->add_flag("--json", as_json, "print JSON");
  std::string max_size;
  std::string older_than;
  auto* prune = cache->add_subcommand("prune", "remove least recently used or old entries");
  prune->add_option("--max-size", max_size, "shrink to this size, e.g. 500M, 2G");
  prune->add_option("--older-than", older_than, "remove entries unused for this long, e.g. 30d");
  auto* clear = cache->add_subcommand("clear", "remove every entry and the statistics");
  std::string file;
  std::string export_arch;
  auto* export_cmd = cache->add_subcommand("export", "write entries into a standalone store");
  export_cmd->add_option("file", file, "the store file to write")->required();
  export_cmd->add_option("--arch", export_arch, "only these archs, e.g. sm_80,sm_90");
  auto* import_cmd = cache->add_subcommand("import", "merge a store file into the cache");
  import_cmd->add_option("file", file, "the store file to read")
    ->required()
    ->check(CLI::ExistingFile);

  std::optional<std::string> remote_url;
  auto* push = cache->add_subcommand("push", "copy every entry to the remote cache");
  push->add_option("--remote", remote_url, "redis://host:port (default: KJIT_REMOTE_CACHE)");
  auto* pull = cache->add_subcommand("pull", "copy every entry of the remote cache here");
  pull->add_option("--remote", remote_url, "redis://host:port (default: KJIT_REMOTE_CACHE)");

  std::vector<std::string> info_packages;
  auto* info = app.add_subcommand("info", "versions, devices, caches and packages");
  info->add_flag("--json", as_json, "print JSON");
  info
    ->add_option("--package", info_packages,
                 "also list the package in this folder (the Python kjit command passes every "
                 "installed one: package store, wheels)")
    ->allow_extra_args(false);

  CompileArgs compile_args;
  auto* compile = app.add_subcommand("compile", "compile one .cu file (no cache)");
  compile->add_option("file", compile_args.file, "CUDA source")
    ->required()
    ->check(CLI::ExistingFile);
  compile->add_option("--arch", compile_args.arch, "target, e.g. sm_90")->required();
  compile->add_option("-o,--output", compile_args.output, "output file");
  compile->add_flag("--ptx", compile_args.ptx, "PTX instead of a cubin");
  compile->add_option("--option", compile_args.options, "an NVRTC option, e.g. -DN=4")
    ->allow_extra_args(false);
  compile->add_option("-I,--include", compile_args.include_dirs, "an include folder")
    ->allow_extra_args(false);

  std::string new_name;
  std::string new_dir;
  auto* create = app.add_subcommand("new", "create a kernel package to start from");
  create->add_option("name", new_name, "package (and op) name")->required();
  create->add_option("dir", new_dir, "folder (default: NAME)");

  if (argc >= 2 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      found = found || sub->get_name() == argv[1];
      known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (const char* python = std::getenv("KJIT_PYTHON_CLI"); python != nullptr && *python != '\0') {
      known += ", fetch, lock, sync, bundle, wheel, versions, tune";
    }
    if (!found) {
      std::cerr << fmt::format("kjit: unknown command '{}' (commands: {}; kjit --help)\n", argv[1],
                               known);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  try {
    if (warm->parsed()) {
      return run_warm(warm_args);
    }
    if (check->parsed()) {
      return run_check(check_packages, check_arch, check_json);
    }
    if (info->parsed()) {
      return run_info(as_json, info_packages);
    }
    if (compile->parsed()) {
      return run_compile(compile_args);
    }
    if (create->parsed()) {
      return run_new(new_name, new_dir);
    }
    if (why->parsed()) {
      return run_cache_why(why_args);
    }
    if (push->parsed() || pull->parsed()) {
      kjit::Runtime runtime(kjit::RuntimeOptions{.remote_cache = remote_url});
      if (push->parsed()) {
        const auto n = runtime.push_to_remote();
        std::cout << fmt::format("pushed {} entries to {}\n", n, *runtime.remote_cache());
      } else {
        const auto n = runtime.pull_from_remote();
        std::cout << fmt::format("pulled {} entries from {} into {}\n", n, *runtime.remote_cache(),
                                 runtime.cache().path().string());
      }
      return 0;
    }
    kjit::Runtime runtime;
    if (stats->parsed()) {
      return run_cache_stats(runtime, as_json);
    }
    if (ls->parsed()) {
      return run_cache_ls(runtime, filter, as_json);
    }
    if (rm->parsed()) {
      return run_cache_rm(runtime, rm_keys, filter);
    }
    if (verify->parsed()) {
      return run_cache_verify(runtime, fix, as_json);
    }
    if (prune->parsed()) {
      std::optional<std::uint64_t> size;
      std::optional<std::int64_t> age;
      if (!max_size.empty() && !(size = kjit::parse_size(max_size))) {
        throw UsageError(fmt::format("--max-size '{}' is not a size like 500M or 2G", max_size));
      }
      if (!older_than.empty() && !(age = parse_duration(older_than))) {
        throw UsageError(
          fmt::format("--older-than '{}' is not a duration like 30d, 12h or 90s", older_than));
      }
      if (!size && !age) {
        throw UsageError("give --max-size and/or --older-than");
      }
      const auto removed = runtime.cache().prune(size, age);
      std::cout << fmt::format("removed {} entries; {} left ({})\n", removed,
                               runtime.cache().stats().entries,
                               size_text(runtime.cache().stats().size_bytes));
      return 0;
    }
    if (clear->parsed()) {
      const auto before = runtime.cache().stats().entries;
      runtime.cache().clear();
      std::cout << fmt::format("removed {} entries from {}\n", before,
                               runtime.cache().path().string());
      return 0;
    }
    if (export_cmd->parsed()) {
      std::vector<std::string> archs;
      for (const auto& arch : kjit::Arch::parse_list(export_arch)) {
        archs.push_back(arch.name());
        archs.push_back(arch.virtual_name());
      }
      const auto written = runtime.cache().export_to(file, archs);
      std::cout << fmt::format("exported {} entries to {}\n", written, file);
      return 0;
    }
    if (import_cmd->parsed()) {
      const auto added = runtime.cache().import_from(file);
      std::cout << fmt::format("imported {} new entries into {}\n", added,
                               runtime.cache().path().string());
      return 0;
    }
  } catch (const UsageError& e) {
    // The usage of the innermost subcommand given.
    const CLI::App* used = &app;
    std::string parents; // "kjit cache" for kjit cache rm: its usage line names the whole path
    while (!used->get_subcommands().empty()) {
      parents += (parents.empty() ? "" : " ") + used->get_name();
      used = used->get_subcommands().front();
    }
    std::cerr << "kjit: " << e.what() << "\n\n" << used->help(parents) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kjit: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
