// Runtime::Impl: the memo, single-flight compiles and the store tiers (local, read-only, remote)
// behind `Runtime::kernel`. Over 600 lines: they share one Impl and its per-process counters.
#include <kjit/error.hpp>
#include <kjit/runtime.hpp>

#include "cache/cache_key.hpp"
#include "cache/provenance.hpp"
#include "cache/remote/remote_store.hpp"
#include "cache/sqlite_store.hpp"
#include "runtime/compile/nvrtc_compiler.hpp"
#include "runtime/cuda/driver.hpp"
#include "runtime/library.hpp"
#include "runtime/logging.hpp"
#include "runtime/tune/tuner.hpp"
#include "runtime/util/env.hpp"
#include "runtime/util/file.hpp"
#include "runtime/util/hash.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <unordered_map>

#ifndef KJIT_VERSION
#  define KJIT_VERSION "0.0.0"
#endif

namespace kjit {
namespace {

struct DigestHash {
  std::size_t operator()(const detail::Digest& d) const noexcept {
    return static_cast<std::size_t>(d[1]);
  }
};

// A program compiled for one target, and its library once loaded.
struct Compiled {
  Binary binary;
  std::once_flag load_once;
  std::shared_ptr<detail::Library> library;
};

constexpr int k_max_devices = 64;

std::uint64_t resolve_max_size(const RuntimeOptions& options) {
  if (options.max_cache_size) {
    return *options.max_cache_size;
  }
  if (auto text = detail::getenv_nonempty("KJIT_CACHE_MAX_SIZE")) {
    if (auto size = detail::parse_size(*text)) {
      return *size;
    }
    detail::log(LogLevel::warning,
                "ignoring KJIT_CACHE_MAX_SIZE='{}': not a size like '2G' or "
                "'500M'; using 2 GiB",
                *text);
  }
  return detail::k_default_max_size;
}

bool cache_disabled(const RuntimeOptions& options) {
  return options.disable_cache.value_or(false) || detail::env_flag("KJIT_DISABLE_CACHE");
}

std::vector<std::filesystem::path> read_only_cache_paths(const RuntimeOptions& options) {
  if (options.read_only_caches) {
    return *options.read_only_caches;
  }
  return detail::env_paths("KJIT_CACHE_READONLY");
}

std::unique_ptr<detail::SqliteStore> open_store(const RuntimeOptions& options) {
  if (cache_disabled(options)) {
    return nullptr;
  }
  std::filesystem::path dir = options.cache_dir.value_or(detail::default_cache_dir());
  // A store another user could write is a store someone else could plant binaries in: it is not
  // used. The per-user default is tried instead, unless that is the one refused.
  if (const std::string why = detail::untrusted_reason(dir); !why.empty()) {
    const auto fallback = detail::per_user_cache_dir();
    const bool can_fall_back =
      fallback != dir && detail::untrusted_reason(fallback).empty() && !options.cache_read_only;
    detail::log(LogLevel::warning, "not using kernel cache directory: {}; {}", why,
                can_fall_back ? fmt::format("using '{}' instead", fallback.string())
                              : std::string("compiling without a kernel cache"));
    if (!can_fall_back) {
      return nullptr;
    }
    dir = fallback;
  }
  return detail::SqliteStore::open(dir, resolve_max_size(options), options.cache_read_only);
}

// The in-memory headers for NVRTC: one per include name; a name that stands for two different
// files is left to NVRTC's own search of the include dirs.
std::vector<std::pair<std::string, std::string>> nvrtc_headers(const Program& program) {
  std::map<std::string, const std::string*> by_name;
  std::vector<std::string> ambiguous;
  for (const auto& header : program.headers()) {
    auto [it, inserted] = by_name.emplace(header.include_name, &header.content);
    if (!inserted && *it->second != header.content) {
      ambiguous.push_back(header.include_name);
    }
  }
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& [name, content] : by_name) {
    if (std::find(ambiguous.begin(), ambiguous.end(), name) == ambiguous.end()) {
      headers.emplace_back(name, *content);
    }
  }
  return headers;
}

} // namespace

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
    .count();
}

struct Runtime::Impl {
  explicit Impl(RuntimeOptions o)
    : options(std::move(o)), opened(std::chrono::steady_clock::now()), cache(open_store(options)) {
    detail::log(LogLevel::debug, "kernel store {} opened in {:.2f} ms",
                cache.enabled() ? fmt::format("'{}'", cache.path().string())
                                : std::string("(none)"),
                ms_since(opened));
    if (!cache_disabled(options)) {
      for (const auto& path : read_only_cache_paths(options)) {
        cache.add_read_only_path(path);
      }
    }
    try {
      if (auto config = detail::remote_config_from(options.remote_cache)) {
        remote = std::make_unique<detail::RemoteStore>(std::move(*config));
      }
    } catch (const Error& e) {
      detail::log(LogLevel::warning, "no remote cache: {}", e.what());
    }
  }

  RuntimeOptions options;
  std::chrono::steady_clock::time_point opened; // when the store started opening
  Cache cache;
  std::unique_ptr<detail::RemoteStore> remote; // Note [Remote tier]

  std::mutex memo_mutex;
  std::unordered_map<detail::Digest, std::shared_future<std::shared_ptr<Compiled>>, DigestHash>
    memo;

  std::atomic<std::uint64_t> memory_hits{0};
  std::atomic<std::uint64_t> memory_misses{0};
  std::atomic<std::uint64_t> store_hits{0};
  std::atomic<std::uint64_t> store_misses{0};
  std::atomic<std::uint64_t> compiles{0};
  std::atomic<std::uint64_t> corrupt{0};
  std::atomic<double> compile_ms{0};
  std::array<std::atomic<int>, k_max_devices> device_arch{}; // 0 = not asked yet

  // What of NVRTC enters the key (Note [NVRTC identity]).
  struct NvrtcIdentity {
    int major = 0;
    int minor = 0;
    std::array<std::uint64_t, 2> headers{};
    std::vector<int> archs; // nvrtcGetSupportedArchs
  };
  mutable std::once_flag identity_once;
  mutable NvrtcIdentity identity_value;

  const NvrtcIdentity& nvrtc_identity() const {
    std::call_once(identity_once, [&] {
      const auto start = std::chrono::steady_clock::now();
      identity_value = find_identity();
      detail::log(LogLevel::debug, "NVRTC {}.{} identified in {:.2f} ms", identity_value.major,
                  identity_value.minor, ms_since(start));
    });
    return identity_value;
  }

  NvrtcIdentity find_identity() const {
    const auto loaded = [] {
      const auto& api = detail::nvrtc(); // throws NvrtcError when there is none
      return NvrtcIdentity{api.version_major, api.version_minor, api.headers_digest,
                           detail::nvrtc_supported_arch_numbers()};
    };
    const auto& location = detail::nvrtc_location();
    detail::SqliteStore* store = cache.store();
    if (detail::nvrtc_loaded() || !location || store == nullptr) {
      return loaded();
    }
    // "<major> <minor> <archs, comma-separated> <file size> <file mtime ns>"
    const std::string name = "nvrtc:" + location->library;
    if (auto value = store->meta(name)) {
      NvrtcIdentity id;
      char archs[512] = {};
      unsigned long long size = 0;
      long long mtime = 0;
      if (std::sscanf(value->c_str(), "%d %d %511s %llu %lld", &id.major, &id.minor, archs, &size,
                      &mtime) == 5 &&
          size == location->size && mtime == location->mtime_ns && id.major >= 12) {
        for (const char* p = archs; *p != '\0';) {
          id.archs.push_back(std::atoi(p));
          p = std::strchr(p, ',');
          p = p == nullptr ? "" : p + 1;
        }
        id.headers = location->headers_digest;
        return id;
      }
    }
    NvrtcIdentity id = loaded();
    if (detail::nvrtc_search().library == location->library && !id.archs.empty()) {
      std::string archs;
      for (int a : id.archs) {
        if (!archs.empty()) {
          archs += ',';
        }
        archs += std::to_string(a);
      }
      store->set_meta(name, fmt::format("{} {} {} {} {}", id.major, id.minor, archs, location->size,
                                        location->mtime_ns));
    }
    return id;
  }

  int driver_version() const {
    if (detail::driver_loaded()) {
      return detail::driver().version;
    }
    if (options.driver_version) {
      return *options.driver_version;
    }
    const auto& id = nvrtc_identity();
    return id.major * 1000 + id.minor * 10;
  }

  detail::Digest key(const Program& program, const Target& target) const {
    const auto& id = nvrtc_identity();
    return detail::cache_key(detail::KeyInputs{program.digest(), target, id.major, id.minor,
                                               driver_version(), id.headers});
  }

  detail::KeyIdentity key_identity() const {
    const auto& id = nvrtc_identity();
    return detail::KeyIdentity{id.major, id.minor, driver_version(), id.headers};
  }

  // A writable-store hit whose stored origin is not the program's: record the program's
  // (Note [Provenance]).
  void note_origin(detail::SqliteStore& store, const Program& program, const Target& target,
                   const std::string& key_hex, const std::string& stored_origin) {
    const ProgramOrigin& origin = program.options().origin;
    if (origin.empty() || detail::decode_origin(stored_origin) == origin) {
      return;
    }
    store.note_provenance(
      key_hex, detail::encode_origin(origin),
      detail::encode_fields(detail::key_fields(program, target, key_identity())));
  }

  std::shared_ptr<Compiled> obtain(const Program& program, const Target& target) {
    const detail::Digest digest = key(program, target);
    // A scoped program may be served by its package's own store: its memo entry is its own.
    detail::Digest memo_key = digest;
    if (!program.options().scope.empty()) {
      memo_key =
        detail::Hasher().field("key", digest).field("scope", program.options().scope).digest();
    }
    std::promise<std::shared_ptr<Compiled>> promise;
    {
      std::unique_lock lock(memo_mutex);
      auto it = memo.find(memo_key);
      if (it != memo.end()) {
        auto future = it->second;
        lock.unlock();
        memory_hits.fetch_add(1, std::memory_order_relaxed);
        return future.get(); // waits while another thread compiles it
      }
      memo.emplace(memo_key, promise.get_future().share());
    }
    memory_misses.fetch_add(1, std::memory_order_relaxed);
    try {
      auto compiled = fetch_or_compile(program, target, digest);
      promise.set_value(compiled);
      return compiled;
    } catch (...) {
      {
        std::lock_guard lock(memo_mutex);
        memo.erase(memo_key);
      }
      promise.set_exception(std::current_exception());
      throw;
    }
  }

  std::shared_ptr<Compiled> from_store(const detail::StoredBinary& stored, const Target& target,
                                       const std::string& key_hex) {
    store_hits.fetch_add(1, std::memory_order_relaxed);
    return compiled_from(std::move(stored), target, key_hex);
  }

  // A binary found in a store (local, read-only or remote).
  static std::shared_ptr<Compiled> compiled_from(detail::StoredBinary stored, const Target& target,
                                                 const std::string& key_hex) {
    auto compiled = std::make_shared<Compiled>();
    compiled->binary = Binary{target,
                              std::move(stored.blob),
                              std::move(stored.lowered_names),
                              std::move(stored.log),
                              stored.compile_ms,
                              key_hex,
                              true};
    return compiled;
  }

  std::shared_ptr<Compiled> fetch_or_compile(const Program& program, const Target& target,
                                             const detail::Digest& digest) {
    const std::string key_hex = detail::to_hex(digest);
    detail::SqliteStore* store = cache.store();
    auto lookup = detail::SqliteStore::Lookup::miss;
    detail::LockGuard guard;
    detail::StoredBinary stored;
    using Lookup = detail::SqliteStore::Lookup;
    if (store != nullptr) {
      lookup = store->get(key_hex, stored);
      if (lookup == Lookup::hit) {
        detail::log(LogLevel::debug, "'{}' for {}: hit in the store (key {})", program.name(),
                    target.name(), key_hex);
        note_origin(*store, program, target, key_hex, stored.origin);
        return from_store(stored, target, key_hex);
      }
    }
    // Read-only stores (baked into an image) are searched after the writable one.
    for (const auto& read_only : cache.read_only_stores()) {
      if (read_only.serves(program.options().scope) &&
          read_only.store->get(key_hex, stored) == Lookup::hit) {
        detail::log(LogLevel::debug, "'{}' for {}: hit in the read-only store {} (key {})",
                    program.name(), target.name(), read_only.store->path().string(), key_hex);
        return from_store(stored, target, key_hex);
      }
    }
    if (store != nullptr || !cache.read_only_stores().empty()) {
      detail::log(LogLevel::debug, "'{}' for {}: {} in the store{} (key {})", program.name(),
                  target.name(), lookup == Lookup::corrupt ? "a damaged entry" : "miss",
                  cache.read_only_stores().empty() ? "" : "s, read-only ones included", key_hex);
    }
    if (store != nullptr) {
      // Processes that miss together compile once: the first holds the key's lock while it
      // compiles and stores; the others then find the entry.
      guard = store->lock_key(digest[1]);
      if (guard) {
        const auto again = store->get(key_hex, stored);
        lookup = again == Lookup::miss ? lookup : again;
      }
      if (lookup == Lookup::corrupt) {
        store->count_corrupt(key_hex);
        corrupt.fetch_add(1, std::memory_order_relaxed);
      }
      if (lookup == Lookup::hit) {
        note_origin(*store, program, target, key_hex, stored.origin);
        return from_store(stored, target, key_hex);
      }
      store->count_miss();
      store_misses.fetch_add(1, std::memory_order_relaxed);
    }
    std::string remote_token; // held while this host compiles for the fleet
    if (remote) {
      if (auto compiled = from_remote(program, key_hex, target, lookup, remote_token)) {
        return compiled;
      }
    }
    try {
      return compile(program, target, key_hex, lookup, remote_token);
    } catch (...) {
      if (!remote_token.empty()) {
        remote->unlock(key_hex, remote_token); // compile errors are never stored remotely
      }
      throw;
    }
  }

  // A remote hit (written to the local store), or another host's compile waited for; else
  // nothing, with `token` set when this host now holds the fleet's compile lock.
  std::shared_ptr<Compiled> from_remote(const Program& program, const std::string& key_hex,
                                        const Target& target, detail::SqliteStore::Lookup lookup,
                                        std::string& token) {
    using Result = detail::RemoteStore::Result;
    detail::StoredBinary stored;
    Result result = remote->get(key_hex, stored);
    if (result == Result::miss) {
      switch (remote->lock(key_hex, token)) {
      case detail::RemoteStore::Lock::acquired:
        return nullptr;
      case detail::RemoteStore::Lock::held_by_other:
        detail::log(LogLevel::debug, "'{}' for {} is being compiled by another host: waiting",
                    program.name(), target.name());
        result = remote->wait_for(key_hex, stored);
        break;
      case detail::RemoteStore::Lock::unavailable:
        break;
      }
    }
    if (result != Result::hit) {
      return nullptr;
    }
    if (detail::SqliteStore* store = cache.store()) {
      stored.origin = detail::encode_origin(program.options().origin);
      stored.fields = detail::encode_fields(detail::key_fields(program, target, key_identity()));
      store->put(key_hex, stored, lookup == detail::SqliteStore::Lookup::corrupt,
                 /*count_compile=*/false);
    }
    detail::log(LogLevel::debug, "'{}' for {} from the remote cache", program.name(),
                target.name());
    return compiled_from(std::move(stored), target, key_hex);
  }

  std::shared_ptr<Compiled> compile(const Program& program, const Target& target,
                                    const std::string& key_hex, detail::SqliteStore::Lookup lookup,
                                    const std::string& remote_token) {
    detail::SqliteStore* store = cache.store();

    detail::CompileRequest request;
    request.name = program.name();
    request.source = program.source();
    request.headers = nvrtc_headers(program);
    request.options = program.canonical_options();
    for (const auto& dir : program.options().include_dirs) {
      request.include_dirs.push_back(dir.string());
    }
    request.name_expressions = program.options().name_expressions;
    request.target = target;
    detail::CompileResult result = detail::nvrtc_compile(request);
    compiles.fetch_add(1, std::memory_order_relaxed);
    compile_ms.fetch_add(result.compile_ms, std::memory_order_relaxed);
    detail::log(LogLevel::info, "compiled '{}' for {} in {:.1f} ms{}", program.name(),
                target.name(), result.compile_ms,
                result.pch_created ? " (and precompiled its headers for the next compiles)" : "");
    if (!result.log.empty()) {
      detail::log(LogLevel::debug, "NVRTC log of '{}':\n{}", program.name(), result.log);
    }

    auto compiled = std::make_shared<Compiled>();
    compiled->binary = Binary{target,
                              std::move(result.binary),
                              std::move(result.lowered_names),
                              std::move(result.log),
                              result.compile_ms,
                              key_hex};
    if (store != nullptr) {
      store->put(key_hex, stored_value(program, target, *compiled),
                 lookup == detail::SqliteStore::Lookup::corrupt);
    }
    if (remote && !remote->config().read_only) {
      remote->put(key_hex, stored_value(program, target, *compiled), remote_token);
    }
    return compiled;
  }

  detail::StoredBinary stored_value(const Program& program, const Target& target,
                                    const Compiled& compiled) const {
    const auto& api = detail::nvrtc();
    detail::StoredBinary value;
    value.kind = std::string(to_string(target.kind));
    value.arch = target.name();
    value.name = program.name();
    value.nvrtc_version = fmt::format("{}.{}", api.version_major, api.version_minor);
    value.driver_version = driver_version();
    value.options = fmt::format("{}", fmt::join(program.canonical_options(), " "));
    value.lowered_names = compiled.binary.lowered_names;
    value.blob = compiled.binary.data;
    value.compile_ms = compiled.binary.compile_ms;
    value.log = compiled.binary.log;
    value.origin = detail::encode_origin(program.options().origin);
    value.fields = detail::encode_fields(detail::key_fields(program, target, key_identity()));
    return value;
  }

  Target default_target() {
    if (options.arch) {
      return Target{*options.arch, OutputKind::cubin};
    }
    const detail::DriverApi& d = detail::driver();
    CUcontext context = nullptr;
    CUdevice device = 0;
    if (d.cuCtxGetCurrent(&context) == CUDA_SUCCESS && context != nullptr) {
      KJIT_CU_CHECK(d.cuCtxGetDevice(&device), "cannot get the device of the current context");
    }
    int number = device < k_max_devices ? device_arch[device].load(std::memory_order_relaxed) : 0;
    if (number == 0) {
      int count = 0;
      KJIT_CU_CHECK(d.cuDeviceGetCount(&count), "cannot count CUDA devices");
      if (count == 0) {
        throw DriverError("no CUDA device found: name an arch (RuntimeOptions::arch) to compile "
                          "without one",
                          CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE");
      }
      int major = 0;
      int minor = 0;
      KJIT_CU_CHECK(
        d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
        "cannot get the compute capability of device {}", device);
      KJIT_CU_CHECK(
        d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
        "cannot get the compute capability of device {}", device);
      number = 10 * major + minor;
      if (device < k_max_devices) {
        device_arch[device].store(number, std::memory_order_relaxed);
      }
    }
    const auto& id = nvrtc_identity(); // no NVRTC loaded on a warm start
    return detail::target_for_device(Arch{number / 10, number % 10}, id.archs,
                                     {id.major, id.minor});
  }
};

Runtime::Runtime() : Runtime(RuntimeOptions{}) {}

Runtime::Runtime(RuntimeOptions options) : m_impl(std::make_unique<Impl>(std::move(options))) {}

Runtime::~Runtime() {
  if (m_impl->remote) {
    m_impl->remote->flush(m_impl->remote->config().flush_deadline);
  }
  if (detail::SqliteStore* store = m_impl->cache.store()) {
    store->count_memory(m_impl->memory_hits.load(), m_impl->memory_misses.load());
    if (m_impl->remote) {
      store->count_remote(m_impl->remote->stats());
    }
    store->flush();
  }
}

Kernel Runtime::kernel(const Program& program, std::string_view name) {
  const auto start = std::chrono::steady_clock::now();
  const Target target = m_impl->default_target();
  const double target_ms = ms_since(start);
  std::shared_ptr<Compiled> compiled = m_impl->obtain(program, target);
  std::call_once(compiled->load_once, [&] {
    // The first use of this binary in the process: where its time went, for KJIT_LOG=debug.
    const double binary_ms = ms_since(start) - target_ms;
    const auto load_start = std::chrono::steady_clock::now();
    std::string image = compiled->binary.data;
    if (target.kind == OutputKind::ptx && (image.empty() || image.back() != '\0')) {
      image.push_back('\0');
    }
    compiled->library = detail::Library::load(
      image, fmt::format("'{}' ({}, key {})", program.name(), target.name(), compiled->binary.key));
    detail::log(LogLevel::debug,
                "'{}' for {} ready in {:.2f} ms: target {:.2f} ms, binary {:.2f} ms ({}), module "
                "load {:.2f} ms",
                program.name(), target.name(), ms_since(start), target_ms, binary_ms,
                compiled->binary.cached ? "from a store" : "compiled", ms_since(load_start));
  });
  std::string lowered(name);
  for (const auto& [expression, mangled] : compiled->binary.lowered_names) {
    if (expression == name) {
      lowered = mangled;
      break;
    }
  }
  return Kernel(compiled->library->kernel(std::string(name), lowered));
}

Binary Runtime::compile(const Program& program, const Target& target) {
  return m_impl->obtain(program, target)->binary;
}

Target Runtime::default_target() {
  return m_impl->default_target();
}

std::string Runtime::key(const Program& program, const Target& target) {
  return detail::to_hex(m_impl->key(program, target));
}

LookupExplanation Runtime::explain(const Program& program, const Target& target) {
  return detail::explain_lookup(m_impl->cache, detail::to_hex(m_impl->key(program, target)),
                                detail::key_fields(program, target, m_impl->key_identity()),
                                program.options().scope);
}

int Runtime::driver_version() {
  return m_impl->driver_version();
}

CacheStats Runtime::stats() const {
  CacheStats stats;
  stats.memory_hits = m_impl->memory_hits.load();
  stats.memory_misses = m_impl->memory_misses.load();
  stats.store_hits = m_impl->store_hits.load();
  stats.store_misses = m_impl->store_misses.load();
  stats.compiles = m_impl->compiles.load();
  stats.compile_ms = m_impl->compile_ms.load();
  stats.corrupt = m_impl->corrupt.load();
  if (m_impl->remote) {
    stats.remote = m_impl->remote->stats();
  }
  return stats;
}

std::optional<TunedConfig> Runtime::tuned(const std::string& scope, TunedEntryInfo entry,
                                          const std::function<TunedConfig()>& tune) {
  return detail::obtain_tuned(m_impl->cache, scope, std::move(entry), tune, m_impl->remote.get());
}

std::optional<std::string> Runtime::remote_cache() const {
  if (!m_impl->remote) {
    return std::nullopt;
  }
  return m_impl->remote->config().display();
}

namespace {

void require_remote(const std::unique_ptr<detail::RemoteStore>& remote,
                    detail::SqliteStore* store) {
  if (!remote) {
    throw CacheError("no remote cache: set KJIT_REMOTE_CACHE (redis://host:port) or --remote");
  }
  if (store == nullptr) {
    throw CacheError("no local kernel cache to copy entries to or from");
  }
}

} // namespace

std::uint64_t Runtime::push_to_remote() {
  detail::SqliteStore* store = m_impl->cache.store();
  require_remote(m_impl->remote, store);
  if (m_impl->remote->config().read_only) {
    throw CacheError(fmt::format("the remote cache {} is read-only (mode=ro)",
                                 m_impl->remote->config().display()));
  }
  std::uint64_t pushed = 0;
  for (const auto& entry : store->entries()) {
    detail::StoredBinary stored;
    if (store->get(entry.key, stored) != detail::SqliteStore::Lookup::hit) {
      continue;
    }
    if (!m_impl->remote->put_now(entry.key, stored)) {
      throw CacheError(fmt::format("cannot write to the remote cache {} (after {} entries); see "
                                   "the warning above",
                                   m_impl->remote->config().display(), pushed));
    }
    ++pushed;
  }
  for (const auto& entry : store->tuned_entries()) { // Note [Tuner]: the fleet's too
    if (!m_impl->remote->put_now(entry.key, detail::tuned_binary(entry))) {
      throw CacheError(fmt::format("cannot write to the remote cache {} (after {} entries); see "
                                   "the warning above",
                                   m_impl->remote->config().display(), pushed));
    }
    ++pushed;
  }
  return pushed;
}

void Runtime::flush_remote() {
  if (m_impl->remote) {
    m_impl->remote->flush(m_impl->remote->config().flush_deadline);
  }
}

std::uint64_t Runtime::pull_from_remote() {
  detail::SqliteStore* store = m_impl->cache.store();
  require_remote(m_impl->remote, store);
  std::uint64_t pulled = 0;
  for (const auto& key : m_impl->remote->keys()) {
    detail::StoredBinary stored;
    if (store->get(key, stored) == detail::SqliteStore::Lookup::hit) {
      continue; // already here
    }
    if (m_impl->remote->get(key, stored) != detail::RemoteStore::Result::hit) {
      continue;
    }
    if (stored.kind == "tuned") { // a tuned configuration (Note [Tuner])
      if (auto entry = detail::tuned_from_binary(key, stored);
          entry && !store->get_tuned(key).has_value()) {
        store->put_tuned(*entry);
        ++pulled;
      }
      continue;
    }
    store->put(key, stored, true, /*count_compile=*/false);
    ++pulled;
  }
  return pulled;
}

Cache& Runtime::cache() noexcept {
  return m_impl->cache;
}

const RuntimeOptions& Runtime::options() const noexcept {
  return m_impl->options;
}

std::pair<int, int> nvrtc_version() {
  const auto& api = detail::nvrtc();
  return {api.version_major, api.version_minor};
}

NvrtcInfo nvrtc_info() {
  NvrtcInfo info;
  const detail::NvrtcSearch& search = detail::nvrtc_search();
  info.library = search.library;
  info.how = search.how;
  info.searched = search.searched;
  info.error = search.error;
  try {
    const auto& api = detail::nvrtc();
    info.found = true;
    info.major = api.version_major;
    info.minor = api.version_minor;
    info.include_dirs = api.include_dirs;
  } catch (const NvrtcError&) {
  }
  return info;
}

std::string_view version() noexcept {
  return KJIT_VERSION;
}

} // namespace kjit
