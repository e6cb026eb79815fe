#include <kjit/error.hpp>
#include <kjit/program.hpp>

#include "runtime/util/file.hpp"
#include "runtime/util/hash.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string_view>

namespace kjit {

struct Program::Impl {
  std::string name;
  std::string source;
  CompileOptions options;
  std::vector<std::string> canonical_options;
  std::vector<Header> headers;
  detail::Digest digest{};
};

namespace {

// Note [Canonical options]: spellings are normalized ("-D X", "--define-macro=X" -> "-DX"), then
// options are sorted stably by a key in which -D and -U of the same macro compare equal, so
// reordering independent options keeps the key while the order of definitions of one macro (the
// last one wins in NVRTC) is kept. Include paths leave the options: headers enter the key by
// content. Arch flags are refused: the runtime chooses the target.
std::vector<std::string> canonicalize(const std::vector<std::string>& raw,
                                      std::vector<std::filesystem::path>& include_dirs,
                                      const std::string& program_name) {
  std::vector<std::string> options;
  auto take_value = [&](std::size_t& i, std::string_view option) -> std::string {
    if (i + 1 >= raw.size()) {
      throw Error(fmt::format("option '{}' of program '{}' needs a value", option, program_name));
    }
    return raw[++i];
  };
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const std::string& option = raw[i];
    std::string_view o = option;
    if (o.empty()) {
      continue;
    }
    if (o == "-arch" || o == "--gpu-architecture" || o.starts_with("-arch=") ||
        o.starts_with("--gpu-architecture=") || o == "-code" || o.starts_with("--gpu-code") ||
        o.starts_with("-code=")) {
      throw Error(fmt::format("option '{}' of program '{}' is not allowed: the runtime chooses "
                              "the target arch (pass a Target or RuntimeOptions::arch)",
                              option, program_name));
    }
    if (o == "-D" || o == "--define-macro") {
      options.push_back("-D" + take_value(i, o));
    } else if (o.starts_with("--define-macro=")) {
      options.push_back("-D" + std::string(o.substr(15)));
    } else if (o == "-U" || o == "--undefine-macro") {
      options.push_back("-U" + take_value(i, o));
    } else if (o.starts_with("--undefine-macro=")) {
      options.push_back("-U" + std::string(o.substr(17)));
    } else if (o == "-I" || o == "--include-path") {
      include_dirs.emplace_back(take_value(i, o));
    } else if (o.starts_with("--include-path=")) {
      include_dirs.emplace_back(std::string(o.substr(15)));
    } else if (o.starts_with("-I")) {
      include_dirs.emplace_back(std::string(o.substr(2)));
    } else if (o == "-std" || o == "--std") {
      options.push_back("-std=" + take_value(i, o));
    } else if (o.starts_with("--std=")) {
      options.push_back("-std=" + std::string(o.substr(6)));
    } else if (o == "-include" || o == "--pre-include" || o.starts_with("--pre-include=") ||
               o.starts_with("-include=")) {
      const auto eq = o.find('=');
      const std::string file =
        eq == std::string_view::npos ? take_value(i, o) : std::string(o.substr(eq + 1));
      const std::filesystem::path path(file);
      if (file.empty() || path.is_absolute() ||
          std::find(path.begin(), path.end(), "..") != path.end()) {
        throw Error(fmt::format("option '{}' of program '{}' names '{}': a pre-included header "
                                "must be a name in the include dirs or the toolkit's, not a path "
                                "outside them",
                                option, program_name, file));
      }
      options.push_back("--pre-include=" + file);
    } else {
      options.push_back(option);
    }
  }
  auto sort_key = [](const std::string& option) -> std::string {
    if (option.starts_with("-D") || option.starts_with("-U")) {
      const std::string_view macro = std::string_view(option).substr(2);
      return "-D" + std::string(macro.substr(0, macro.find('=')));
    }
    return option;
  };
  std::stable_sort(options.begin(), options.end(),
                   [&](const auto& a, const auto& b) { return sort_key(a) < sort_key(b); });
  options.erase(std::unique(options.begin(), options.end()), options.end());
  return options;
}

// The include name of every `#include "x"` or `#include <x>` line.
std::vector<std::pair<std::string, bool>> find_includes(std::string_view text) {
  std::vector<std::pair<std::string, bool>> includes; // name, quoted
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    auto skip_space = [&] {
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
        line.remove_prefix(1);
      }
    };
    skip_space();
    if (!line.starts_with('#')) {
      continue;
    }
    line.remove_prefix(1);
    skip_space();
    if (!line.starts_with("include")) {
      continue;
    }
    line.remove_prefix(7);
    skip_space();
    if (line.empty() || (line.front() != '"' && line.front() != '<')) {
      continue;
    }
    const char close = line.front() == '"' ? '"' : '>';
    const auto last = line.find(close, 1);
    if (last == std::string_view::npos || last == 1) {
      continue;
    }
    includes.emplace_back(std::string(line.substr(1, last - 1)), close == '"');
  }
  return includes;
}

void scan_headers(std::string_view text, const std::filesystem::path& including_dir,
                  const std::vector<std::filesystem::path>& include_dirs,
                  std::set<std::filesystem::path>& seen, std::vector<Header>& headers) {
  for (const auto& [name, quoted] : find_includes(text)) {
    std::vector<std::filesystem::path> candidates;
    if (quoted && !including_dir.empty()) {
      candidates.push_back(including_dir / name);
    }
    for (const auto& dir : include_dirs) {
      candidates.push_back(dir / name);
    }
    // A header found nowhere is a system or toolkit header (covered by the NVRTC version), or one
    // that NVRTC will report missing.
    for (const auto& candidate : candidates) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(candidate, ec)) {
        continue;
      }
      const auto canonical = std::filesystem::weakly_canonical(candidate, ec);
      if (!seen.insert(canonical).second) {
        break;
      }
      std::string error;
      auto content = detail::read_file(candidate, &error);
      if (!content) {
        throw Error(fmt::format("cannot read header '{}': {}", candidate.string(), error));
      }
      headers.push_back(Header{name, candidate, *content});
      scan_headers(*content, candidate.parent_path(), include_dirs, seen, headers);
      break;
    }
  }
}

// Whether a file of an include dir may be a header: a C, C++ or CUDA extension, or none (like
// <vector>). Manifests, Python, stores and documents are not: they would tie the key to files
// that are not compiled (a package's shipped store lives in its folder).
bool is_source_like(const std::filesystem::path& path) {
  static constexpr std::string_view k_extensions[] = {
    ".h",   ".hh",  ".hpp", ".hxx", ".h++", ".cuh", ".cu",  ".c",   ".cc",
    ".cpp", ".cxx", ".inc", ".inl", ".ipp", ".tcc", ".tpp", ".def", ".cuinc"};
  const std::string extension = path.extension().string();
  return extension.empty() || std::find(std::begin(k_extensions), std::end(k_extensions),
                                        extension) != std::end(k_extensions);
}

// Every header-like file under `dir` (not under hidden folders or `__pycache__`), sorted by
// relative name. NVRTC may read any of them (an `#include` through a macro is not seen by the
// scanner), so they all enter the key. Bounded, so a program pointed at a big folder fails
// clearly.
void hash_include_dir(const std::filesystem::path& dir, std::set<std::filesystem::path>& seen,
                      std::vector<Header>& headers, std::size_t& files, std::uint64_t& bytes) {
  constexpr std::size_t k_max_files = 4096;
  constexpr std::uint64_t k_max_bytes = 64u << 20;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return;
  }
  std::vector<std::pair<std::string, std::filesystem::path>> found;
  std::filesystem::recursive_directory_iterator it(dir, ec);
  for (; !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const auto& entry = *it;
    const auto name = entry.path().filename().string();
    if (entry.is_directory(ec)) {
      if (name.starts_with('.') || name == "__pycache__") {
        it.disable_recursion_pending();
      }
      continue;
    }
    if (!entry.is_regular_file(ec) || name.starts_with('.') || !is_source_like(entry.path())) {
      continue;
    }
    if (++files > k_max_files) {
      throw Error(fmt::format("include dir '{}' holds more than {} files: every file of an "
                              "include dir enters the cache key; give the kernel a folder of its "
                              "own",
                              dir.string(), k_max_files));
    }
    found.emplace_back(entry.path().lexically_relative(dir).generic_string(), entry.path());
  }
  if (ec) {
    throw Error(fmt::format("cannot list include dir '{}': {}", dir.string(), ec.message()));
  }
  std::sort(found.begin(), found.end());
  for (const auto& [relative, path] : found) {
    if (!seen.insert(std::filesystem::weakly_canonical(path, ec)).second) {
      continue; // already hashed as an included header
    }
    std::string error;
    auto content = detail::read_file(path, &error);
    if (!content) {
      if (!std::filesystem::exists(path, ec)) {
        continue; // removed since it was listed
      }
      throw Error(
        fmt::format("cannot read '{}' of include dir '{}': {}", relative, dir.string(), error));
    }
    bytes += content->size();
    if (bytes > k_max_bytes) {
      throw Error(fmt::format("include dirs of more than {} bytes: every file of an include dir "
                              "enters the cache key; give the kernel a folder of its own",
                              k_max_bytes));
    }
    headers.push_back(Header{relative, path, std::move(*content)});
  }
}

} // namespace

Program::Program(std::string name, std::string source, CompileOptions options) {
  auto impl = std::make_shared<Impl>();
  impl->name = std::move(name);
  impl->source = std::move(source);
  impl->options = std::move(options);
  std::vector<std::filesystem::path> include_dirs = impl->options.include_dirs;
  impl->canonical_options = canonicalize(impl->options.options, include_dirs, impl->name);
  impl->options.include_dirs = include_dirs;
  std::set<std::filesystem::path> seen;
  scan_headers(impl->source, {}, include_dirs, seen, impl->headers);
  for (const auto& option : impl->canonical_options) {
    if (option.starts_with("--pre-include=")) {
      const std::string line = "#include \"" + option.substr(14) + "\"\n";
      scan_headers(line, {}, include_dirs, seen, impl->headers);
    }
  }
  std::size_t files = 0;
  std::uint64_t bytes = 0;
  for (const auto& dir : include_dirs) {
    hash_include_dir(dir, seen, impl->headers, files, bytes);
  }

  detail::Hasher hasher;
  hasher.field("program", impl->name).field("source", impl->source);
  for (const auto& header : impl->headers) {
    hasher.field("header", header.include_name).field("content", header.content);
  }
  for (const auto& option : impl->canonical_options) {
    hasher.field("option", option);
  }
  for (const auto& expression : impl->options.name_expressions) {
    hasher.field("name_expression", expression);
  }
  impl->digest = hasher.digest();
  m_impl = std::move(impl);
}

Program Program::from_file(const std::filesystem::path& path, CompileOptions options) {
  std::string error;
  auto source = detail::read_file(path, &error);
  if (!source) {
    throw Error(fmt::format("cannot read kernel source '{}': {}", path.string(), error));
  }
  // The file's own folder comes first, as for `#include "..."` in a compiler.
  auto dir = path.parent_path();
  if (dir.empty()) {
    dir = ".";
  }
  options.include_dirs.insert(options.include_dirs.begin(), dir);
  return Program(path.filename().string(), std::move(*source), std::move(options));
}

const std::string& Program::name() const noexcept {
  return m_impl->name;
}

const std::string& Program::source() const noexcept {
  return m_impl->source;
}

const CompileOptions& Program::options() const noexcept {
  return m_impl->options;
}

const std::vector<std::string>& Program::canonical_options() const noexcept {
  return m_impl->canonical_options;
}

const std::vector<Header>& Program::headers() const noexcept {
  return m_impl->headers;
}

std::array<std::uint64_t, 2> Program::digest() const noexcept {
  return m_impl->digest;
}

} // namespace kjit
