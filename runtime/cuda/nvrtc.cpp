#include "runtime/cuda/nvrtc.hpp"

#include <kjit/error.hpp>

#include "runtime/logging.hpp"
#include "runtime/util/env.hpp"
#include "runtime/util/file.hpp"
#include "runtime/util/hash.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

namespace kjit::detail {
namespace {

namespace fs = std::filesystem;

#define KJIT_STRINGIFY_EXPANDED(name) KJIT_STRINGIFY(name)
#define KJIT_STRINGIFY(name) #name

// The oldest NVRTC kjit uses: CUDA 12.4 (cuKernelGetParamInfo's release; kjit's options and
// name expressions are tested from there).
constexpr int k_min_version = 12 * 100 + 4;

std::mutex g_python_paths_mutex;
std::vector<std::string> g_python_paths;

struct Candidate {
  std::string file; // a path, or a bare soname for the loader's search
  std::string how;
};

std::string real_path(const std::string& path) {
  std::error_code ec;
  const auto canonical = fs::canonical(path, ec);
  return ec ? path : canonical.string();
}

bool is_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

bool is_dir(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

// The file kjit's own code was loaded from: the Python module, the CLI or an app.
std::string own_binary() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&own_binary), &info) != 0 && info.dli_fname != nullptr &&
      info.dli_fname[0] == '/') {
    return real_path(info.dli_fname);
  }
  return real_path("/proc/self/exe");
}

// libnvrtc files loaded into the process, e.g. torch's: the loader's list of loaded objects
// (dl_iterate_phdr), not /proc/self/maps, whose thousands of lines in a CUDA process take ~1 ms.
std::vector<std::string> mapped_nvrtc() {
  std::vector<std::string> found;
  ::dl_iterate_phdr(
    [](dl_phdr_info* info, std::size_t, void* data) {
      auto& out = *static_cast<std::vector<std::string>*>(data);
      const std::string_view path = info->dlpi_name != nullptr ? info->dlpi_name : "";
      const auto slash = path.rfind('/');
      if (slash != std::string_view::npos && path.substr(slash + 1).starts_with("libnvrtc.so") &&
          std::find(out.begin(), out.end(), path) == out.end()) {
        out.emplace_back(path);
      }
      return 0;
    },
    &found);
  return found;
}

void add_wheels(const fs::path& root, const std::string& how, std::vector<Candidate>& out) {
  for (const char* relative :
       {"nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"}) {
    const auto file = (root / relative).lexically_normal().string();
    if (std::none_of(out.begin(), out.end(), [&](const Candidate& c) { return c.file == file; })) {
      out.push_back({file, how});
    }
  }
}

// site-packages folders of an environment rooted at `prefix` (lib/python3.*/site-packages).
std::vector<fs::path> site_packages_of(const fs::path& prefix) {
  std::vector<fs::path> result;
  for (const char* lib : {"lib", "lib64"}) {
    std::error_code ec;
    fs::directory_iterator it(prefix / lib, ec);
    for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const auto name = it->path().filename().string();
      if (name.starts_with("python3") && is_dir(it->path() / "site-packages")) {
        result.push_back(it->path() / "site-packages");
      }
    }
  }
  std::sort(result.begin(), result.end());
  return result;
}

const std::vector<fs::path>& loader_dirs();

std::vector<Candidate> candidates(std::optional<std::string> explicit_library) {
  std::vector<Candidate> out;
  if (explicit_library) {
    out.push_back({*explicit_library, "KJIT_NVRTC_LIBRARY"});
    return out;
  }
  for (const auto& file : mapped_nvrtc()) {
    out.push_back({file, "already loaded in the process"});
  }
  {
    std::lock_guard lock(g_python_paths_mutex);
    for (const auto& path : g_python_paths) {
      if (!path.empty() && is_dir(path)) {
        add_wheels(path, "pip wheel in the Python path", out);
      }
    }
  }
  // The folders above kjit's binary: site-packages/kjit/_C.so is two levels below the wheels;
  // <env>/bin/kjit-tool below the environment's site-packages.
  fs::path dir = fs::path(own_binary()).parent_path();
  for (int level = 0; level < 5 && !dir.empty() && dir != dir.root_path(); ++level) {
    add_wheels(dir, "pip wheel beside kjit", out);
    for (const auto& site : site_packages_of(dir)) {
      add_wheels(site, "pip wheel beside kjit", out);
    }
    dir = dir.parent_path();
  }
  if (auto venv = getenv_nonempty("VIRTUAL_ENV")) {
    for (const auto& site : site_packages_of(std::string(*venv))) {
      add_wheels(site, "pip wheel in $VIRTUAL_ENV", out);
    }
  }
  if (auto conda = getenv_nonempty("CONDA_PREFIX")) {
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12"}) {
      out.push_back({(fs::path(std::string(*conda)) / "lib" / name).string(), "$CONDA_PREFIX"});
    }
  }
  for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12"}) {
    for (const auto& folder : loader_dirs()) {
      out.push_back({(folder / name).string(), "the loader's path"});
    }
  }
  std::vector<std::pair<std::string, std::string>> homes;
  for (const char* variable : {"CUDA_HOME", "CUDA_PATH"}) {
    if (auto home = getenv_nonempty(variable)) {
      homes.emplace_back(std::string(*home), fmt::format("${}", variable));
    }
  }
  homes.emplace_back("/usr/local/cuda", "/usr/local/cuda");
  for (const auto& [home, how] : homes) {
    for (const char* lib : {"lib64", "lib"}) {
      for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12"}) {
        out.push_back({(fs::path(home) / lib / name).string(), how});
      }
    }
  }
  return out;
}

// Loads `libnvrtc-builtins.so.<major>.*` from `dir` by absolute path: a wheel's NVRTC has no
// RPATH and would not find it, and once loaded the loader matches it by soname.
void preload_builtins(const fs::path& dir, const std::string& nvrtc_name) {
  const auto dot = nvrtc_name.find(".so.");
  const std::string major = dot == std::string::npos ? "" : nvrtc_name.substr(dot + 4);
  const std::string prefix = "libnvrtc-builtins.so." + major;
  std::vector<fs::path> found;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name.starts_with(prefix) && name.find(".alt.") == std::string::npos) {
      found.push_back(it->path());
    }
  }
  std::sort(found.begin(), found.end());
  if (!found.empty()) {
    // Longest version last: libnvrtc-builtins.so.13.0 rather than a bare .so.13 link.
    if (::dlopen(found.back().c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
      const char* why = ::dlerror();
      log(LogLevel::debug, "cannot preload '{}': {}", found.back().string(),
          why != nullptr ? why : "?");
    }
  }
}

// The folders the loader searches, in its order: LD_LIBRARY_PATH, the folders of
// /etc/ld.so.conf (what ldconfig's cache is made of) and the default ones. Resolved here, without
// dlopen, so that NVRTC is located by stat calls alone (Note [NVRTC identity]).
void read_ld_conf(const fs::path& file, std::vector<fs::path>& dirs, int depth) {
  std::ifstream in(file);
  std::string line;
  while (depth < 4 && std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) {
      line.pop_back();
    }
    const auto start = line.find_first_not_of(" \t");
    if (start == std::string::npos) {
      continue;
    }
    line = line.substr(start);
    if (line.starts_with("include")) {
      std::string pattern = line.substr(7);
      pattern = pattern.substr(pattern.find_first_not_of(" \t"));
      const fs::path glob(pattern);
      std::vector<fs::path> files;
      std::error_code ec;
      for (fs::directory_iterator it(glob.parent_path(), ec); !ec && it != fs::directory_iterator();
           it.increment(ec)) {
        if (it->path().extension() == glob.extension()) {
          files.push_back(it->path());
        }
      }
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        read_ld_conf(f, dirs, depth + 1);
      }
    } else if (line.front() == '/') {
      dirs.emplace_back(line);
    }
  }
}

const std::vector<fs::path>& loader_dirs() {
  static const std::vector<fs::path> dirs = [] {
    std::vector<fs::path> result;
    if (auto path = getenv_nonempty("LD_LIBRARY_PATH")) {
      std::string_view rest = *path;
      while (!rest.empty()) {
        const auto colon = rest.find(':');
        const auto dir = rest.substr(0, colon);
        if (!dir.empty()) {
          result.emplace_back(std::string(dir));
        }
        rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
      }
    }
    read_ld_conf("/etc/ld.so.conf", result, 0);
    for (const char* dir : {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64",
                            "/usr/lib64", "/lib", "/usr/lib"}) {
      result.emplace_back(dir);
    }
    return result;
  }();
  return dirs;
}

// The path the loader chose for `handle`.
std::string loaded_path(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] == '/') {
    return real_path(map->l_name);
  }
  return fallback;
}

struct Loaded {
  NvrtcApi table;
  NvrtcSearch search;
  std::optional<NvrtcError> error;
};

// Tries one candidate; returns the reason it was not used, or nothing when `out` is filled.
std::optional<std::string> try_load(const Candidate& candidate, NvrtcApi& out, std::string& path) {
  const bool bare = candidate.file.find('/') == std::string::npos;
  if (!bare && !is_file(candidate.file)) {
    return "not found";
  }
  if (!bare) {
    path = real_path(candidate.file);
    preload_builtins(fs::path(path).parent_path(), fs::path(candidate.file).filename().string());
  }
  void* handle = ::dlopen(bare ? candidate.file.c_str() : path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return bare ? std::string("not on the loader's path") : std::string(why ? why : "cannot load");
  }
  if (bare) {
    path = loaded_path(handle, candidate.file);
    preload_builtins(fs::path(path).parent_path(), candidate.file);
  }
  NvrtcApi t;
#define KJIT_RESOLVE(name)                                                                         \
  t.name = reinterpret_cast<decltype(t.name)>(::dlsym(handle, KJIT_STRINGIFY_EXPANDED(name)));     \
  if (t.name == nullptr) {                                                                         \
    return fmt::format("no symbol '{}'", KJIT_STRINGIFY_EXPANDED(name));                           \
  }
  KJIT_NVRTC_FUNCTIONS(KJIT_RESOLVE)
#undef KJIT_RESOLVE
#define KJIT_RESOLVE_OPTIONAL(name)                                                                \
  t.name = reinterpret_cast<decltype(t.name)>(::dlsym(handle, KJIT_STRINGIFY_EXPANDED(name)));
  KJIT_NVRTC_OPTIONAL_FUNCTIONS(KJIT_RESOLVE_OPTIONAL)
#undef KJIT_RESOLVE_OPTIONAL
  if (t.nvrtcVersion(&t.version_major, &t.version_minor) != NVRTC_SUCCESS) {
    return "nvrtcVersion failed";
  }
  if (t.version_major * 100 + t.version_minor < k_min_version) {
    return fmt::format("NVRTC {}.{} is older than 12.4, which kjit needs", t.version_major,
                       t.version_minor);
  }
  t.include_dirs = cuda_include_dirs_for(path);
  t.headers_digest = cuda_headers_digest(t.include_dirs);
  out = std::move(t);
  return std::nullopt;
}

Loaded load_nvrtc() {
  Loaded result;
  const auto explicit_library = getenv_nonempty("KJIT_NVRTC_LIBRARY");
  for (const auto& candidate :
       candidates(explicit_library ? std::optional<std::string>(std::string(*explicit_library))
                                   : std::nullopt)) {
    std::string path;
    const auto why_not = try_load(candidate, result.table, path);
    if (!why_not) {
      result.search.library = path;
      result.search.how = candidate.how;
      log(LogLevel::debug, "NVRTC {}.{} from '{}' ({}); CUDA headers: {}",
          result.table.version_major, result.table.version_minor, path, candidate.how,
          result.table.include_dirs.empty()
            ? std::string("NVRTC's built-in only")
            : fmt::format("{}", fmt::join(result.table.include_dirs, ", ")));
      return result;
    }
    result.search.searched.push_back(
      fmt::format("{} ({}): {}", candidate.file, candidate.how, *why_not));
  }
  if (explicit_library) {
    result.search.error =
      fmt::format("cannot use NVRTC from KJIT_NVRTC_LIBRARY: {}", result.search.searched.back());
  } else {
    result.search.error = fmt::format(
      "no NVRTC found: install it with `pip install nvidia-cuda-nvrtc` (CUDA 13; "
      "nvidia-cuda-nvrtc-cu12 for CUDA 12), or the CUDA toolkit (12.4 or later), or name a "
      "libnvrtc.so in KJIT_NVRTC_LIBRARY. Searched:\n  {}",
      fmt::join(result.search.searched, "\n  "));
  }
  result.error.emplace(result.search.error);
  return result;
}

std::atomic<bool> g_loaded{false};

const Loaded& loaded() {
  static const Loaded result = [] {
    Loaded r = load_nvrtc();
    g_loaded.store(!r.error.has_value(), std::memory_order_release);
    return r;
  }();
  return result;
}

std::atomic<const NvrtcApi*> g_override{nullptr};

} // namespace

const NvrtcApi& nvrtc() {
  if (const NvrtcApi* table = g_override.load(std::memory_order_acquire)) {
    return *table;
  }
  const Loaded& result = loaded();
  if (result.error) {
    throw *result.error;
  }
  return result.table;
}

bool nvrtc_loaded() noexcept {
  return g_override.load(std::memory_order_acquire) != nullptr ||
         g_loaded.load(std::memory_order_acquire);
}

const std::optional<NvrtcLocation>& nvrtc_location() {
  static const std::optional<NvrtcLocation> location = []() -> std::optional<NvrtcLocation> {
    const auto explicit_library = getenv_nonempty("KJIT_NVRTC_LIBRARY");
    for (const auto& candidate :
         candidates(explicit_library ? std::optional<std::string>(std::string(*explicit_library))
                                     : std::nullopt)) {
      struct stat st {};
      if (::stat(candidate.file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        continue;
      }
      NvrtcLocation l;
      l.library = real_path(candidate.file);
      l.how = candidate.how;
      l.size = static_cast<std::uint64_t>(st.st_size);
      l.mtime_ns = std::int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
      l.include_dirs = cuda_include_dirs_for(l.library);
      l.headers_digest = cuda_headers_digest(l.include_dirs);
      return l;
    }
    return std::nullopt;
  }();
  return location;
}

const NvrtcSearch& nvrtc_search() {
  return loaded().search;
}

void set_python_paths(std::vector<std::string> paths) {
  std::lock_guard lock(g_python_paths_mutex);
  g_python_paths = std::move(paths);
}

// Note [CUDA headers]: NVRTC is given the CUDA headers (cuda_fp16.h, cuda/std/..., CUB) of the
// root it was loaded from, so that headers and compiler match: a toolkit's `include` and
// `include/cccl`; a CUDA 13 wheel's `nvidia/cu13/include` and its `cccl` (from nvidia-cuda-cccl);
// a CUDA 12 wheel's sibling wheels. What identifies them enters every cache key: the sizes of
// CUDA's numeric-type and runtime headers and the CCCL and CUB version headers' text, a few
// stats and two small reads per process. The NVRTC version alone would not tell two CCCLs apart.
std::vector<std::string> cuda_include_dirs_for(const std::string& library) {
  std::vector<std::string> dirs;
  const fs::path lib_dir = fs::path(library).parent_path();
  const fs::path root = lib_dir.parent_path();
  auto add = [&](const fs::path& include) {
    if (is_dir(include)) {
      dirs.push_back(include.string());
      if (is_dir(include / "cccl")) {
        dirs.push_back((include / "cccl").string());
      }
    }
  };
  if (root.parent_path().filename() == "nvidia" && root.filename() != "cu13") {
    for (const char* wheel : {"cuda_runtime", "cuda_cccl", "cuda_crt", "cuda_nvrtc"}) {
      add(root.parent_path() / wheel / "include");
    }
  } else if (is_file(root / "include" / "cuda_fp16.h") || is_dir(root / "include" / "cccl")) {
    add(root / "include");
  } else if (root == "/usr" && is_file("/usr/include/cuda_fp16.h")) {
    add("/usr/include"); // a distribution's packages
  }
  return dirs;
}

std::array<std::uint64_t, 2> cuda_headers_digest(const std::vector<std::string>& include_dirs) {
  static constexpr const char* k_sized[] = {
    "cuda_fp16.h",        "cuda_fp16.hpp",     "cuda_bf16.h",           "cuda_bf16.hpp",
    "cuda_fp8.h",         "cuda_fp8.hpp",      "cuda_runtime_api.h",    "vector_types.h",
    "crt/host_defines.h", "crt/host_config.h", "crt/math_functions.hpp"};
  static constexpr const char* k_read[] = {"cuda/std/__cccl/version.h", "cub/version.cuh"};
  Hasher hasher;
  for (const auto& dir : include_dirs) {
    hasher.field("dir", std::string_view("include"));
    for (const char* name : k_sized) {
      std::error_code ec;
      const auto size = fs::file_size(fs::path(dir) / name, ec);
      if (!ec) {
        hasher.field(name, static_cast<std::int64_t>(size));
      }
    }
    for (const char* name : k_read) {
      std::string error;
      if (auto text = read_file(fs::path(dir) / name, &error)) {
        hasher.field(name, *text);
      }
    }
  }
  return hasher.digest();
}

NvrtcOverride::NvrtcOverride(const NvrtcApi& table)
  : m_previous(g_override.exchange(&table, std::memory_order_acq_rel)) {}

NvrtcOverride::~NvrtcOverride() {
  g_override.store(m_previous, std::memory_order_release);
}

} // namespace kjit::detail
