#include "cache/provenance.hpp"

#include "cache/cache_key.hpp"
#include "cache/sqlite_store.hpp"
#include "runtime/util/hash.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace kjit::detail {

std::string encode_fields(const Fields& fields) {
  std::string text;
  for (const auto& [name, value] : fields) {
    text += name;
    text += '\t';
    text += value;
    text += '\n';
  }
  return text;
}

Fields decode_fields(const std::string& text) {
  Fields fields;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      end = text.size();
    }
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    const std::size_t tab = line.find('\t');
    if (tab == std::string::npos) {
      continue; // not a field line: skipped, as a newer kjit's unknown lines would be
    }
    fields.emplace_back(line.substr(0, tab), line.substr(tab + 1));
  }
  return fields;
}

namespace {

// Tabs and newlines cannot be stored in a field; none of kjit's values holds one.
std::string clean(std::string value) {
  std::replace_if(
    value.begin(), value.end(), [](char c) { return c == '\t' || c == '\n'; }, ' ');
  return value;
}

std::string hex(std::string_view content) {
  return to_hex(Hasher().field("content", content).digest()).substr(0, 16);
}

} // namespace

std::string encode_origin(const ProgramOrigin& origin) {
  if (origin.empty()) {
    return {};
  }
  Fields fields{{"package", clean(origin.package)},
                {"version", clean(origin.version)},
                {"kernel", clean(origin.kernel)}};
  for (const auto& op : origin.ops) {
    fields.emplace_back("op", clean(op));
  }
  fields.emplace_back("specialization", clean(origin.specialization));
  return encode_fields(fields);
}

ProgramOrigin decode_origin(const std::string& text) {
  ProgramOrigin origin;
  for (auto& [name, value] : decode_fields(text)) {
    if (name == "package") {
      origin.package = std::move(value);
    } else if (name == "version") {
      origin.version = std::move(value);
    } else if (name == "kernel") {
      origin.kernel = std::move(value);
    } else if (name == "op") {
      origin.ops.push_back(std::move(value));
    } else if (name == "specialization") {
      origin.specialization = std::move(value);
    }
  }
  return origin;
}

Fields key_fields(const Program& program, const Target& target, const KeyIdentity& identity) {
  Fields fields{{"schema", std::to_string(k_key_schema_version)},
                {"program", clean(program.name())},
                {"source", hex(program.source())}};
  for (const auto& header : program.headers()) {
    fields.emplace_back("header " + clean(header.include_name), hex(header.content));
  }
  for (const auto& option : program.canonical_options()) {
    fields.emplace_back("option", clean(option));
  }
  for (const auto& expression : program.options().name_expressions) {
    fields.emplace_back("name_expression", clean(expression));
  }
  fields.emplace_back("arch", target.name());
  fields.emplace_back("output", std::string(to_string(target.kind)));
  fields.emplace_back("nvrtc", fmt::format("{}.{}", identity.nvrtc_major, identity.nvrtc_minor));
  fields.emplace_back("driver", std::to_string(identity.driver_version));
  fields.emplace_back("cuda_headers", to_hex(identity.cuda_headers).substr(0, 16));
  return fields;
}

namespace {

// The values of one field name, in order (options and name expressions repeat).
std::vector<std::string> values_of(const Fields& fields, std::string_view name) {
  std::vector<std::string> values;
  for (const auto& [field, value] : fields) {
    if (field == name) {
      values.push_back(value);
    }
  }
  return values;
}

std::string one(const Fields& fields, std::string_view name) {
  auto values = values_of(fields, name);
  return values.empty() ? std::string() : values.front();
}

} // namespace

std::vector<std::string> field_differences(const Fields& wanted, const Fields& stored) {
  std::vector<std::string> out;
  const std::string program = one(wanted, "program");
  auto compare = [&](std::string_view name, const std::string& what) {
    const std::string a = one(wanted, name);
    const std::string b = one(stored, name);
    if (a != b && !b.empty()) {
      out.push_back(fmt::format("{}: the entry has {}, this lookup {}", what, b, a));
    }
  };
  compare("schema", "the cache key's schema version (another kjit made the entry)");
  const std::string source = one(stored, "source");
  if (!source.empty() && one(wanted, "source") != source) {
    out.push_back(fmt::format("the source of {} changed", program));
  }
  // Headers are compared only where the entry recorded its sources (an entry of an older kjit
  // records no key fields: then only its columns, arch, versions and options, are known).
  std::map<std::string, std::string> have;
  std::map<std::string, std::string> had;
  for (const auto& [field, value] : source.empty() ? Fields{} : wanted) {
    if (field.starts_with("header ")) {
      have[field.substr(7)] = value;
    }
  }
  for (const auto& [field, value] : stored) {
    if (field.starts_with("header ")) {
      had[field.substr(7)] = value;
    }
  }
  if (source != one(wanted, "source")) {
    have.erase(program); // the source is a file of its own folder too: said once
    had.erase(program);
  }
  for (const auto& [name, digest] : have) {
    auto it = had.find(name);
    if (it == had.end()) {
      out.push_back(fmt::format("header {} is new (the entry was compiled without it)", name));
    } else if (it->second != digest) {
      out.push_back(fmt::format("header {} changed", name));
    }
  }
  for (const auto& [name, digest] : had) {
    if (!have.contains(name)) {
      out.push_back(fmt::format("header {} is gone (the entry was compiled with it)", name));
    }
  }
  for (const char* name : {"option", "name_expression"}) {
    const std::string what = std::string(name) == "option" ? "option" : "name expression";
    const auto now = values_of(wanted, name);
    const auto then = values_of(stored, name);
    const std::multiset<std::string> now_set(now.begin(), now.end());
    const std::multiset<std::string> then_set(then.begin(), then.end());
    for (const auto& value : now_set) {
      if (!then_set.contains(value)) {
        out.push_back(fmt::format("{} {} is new (the entry was compiled without it)", what, value));
      }
    }
    for (const auto& value : then_set) {
      if (!now_set.contains(value)) {
        out.push_back(fmt::format("{} {} is gone (the entry was compiled with it)", what, value));
      }
    }
    if (now_set == then_set && now != then) {
      out.push_back(fmt::format("the {}s are in another order", what));
    }
  }
  compare("arch", "arch");
  compare("output", "output kind");
  compare("nvrtc", "NVRTC version");
  compare("driver", "driver version (--driver-version, or the driver found)");
  compare("cuda_headers", "the CUDA headers given to NVRTC (another toolkit or wheel)");
  return out;
}

namespace {

// The key fields of an entry that recorded none (made by an older kjit): what its columns say.
Fields fields_from_columns(const CacheEntryInfo& entry) {
  Fields fields{{"program", entry.name}};
  std::size_t start = 0;
  while (start < entry.options.size()) {
    std::size_t end = entry.options.find(' ', start);
    if (end == std::string::npos) {
      end = entry.options.size();
    }
    if (end > start) {
      fields.emplace_back("option", entry.options.substr(start, end - start));
    }
    start = end + 1;
  }
  for (const auto& expression : entry.kernels) {
    fields.emplace_back("name_expression", expression);
  }
  fields.emplace_back("arch", entry.arch);
  fields.emplace_back("output", entry.kind);
  fields.emplace_back("nvrtc", entry.nvrtc_version);
  fields.emplace_back("driver", std::to_string(entry.driver_version));
  return fields;
}

} // namespace

LookupExplanation explain_lookup(const Cache& cache, const std::string& key, const Fields& wanted,
                                 const std::string& scope) {
  LookupExplanation out;
  out.key = key;
  std::vector<CacheEntryInfo> entries = cache.entries();
  for (const auto& read_only : cache.read_only_stores()) {
    if (!read_only.serves(scope)) {
      continue;
    }
    for (auto& entry : read_only.store->entries()) {
      entry.store = read_only.store->path().string();
      entries.push_back(std::move(entry));
    }
  }
  const std::string writable = cache.path().string();
  for (const auto& entry : entries) {
    if (entry.key == key) {
      out.hit = true;
      out.store = entry.store.empty() ? writable : entry.store;
      return out;
    }
  }
  const std::string program = one(wanted, "program");
  std::size_t best = 0;
  for (const auto& entry : entries) {
    if (entry.name != program) {
      continue;
    }
    ++out.candidates;
    const bool recorded = !entry.key_fields.empty();
    auto differences = field_differences(wanted, recorded ? decode_fields(entry.key_fields)
                                                          : fields_from_columns(entry));
    // Entries come most recently used first: among equals the first one found stays.
    if (out.nearest.empty() || differences.size() < best) {
      best = differences.size();
      out.nearest = entry.key;
      out.store = entry.store.empty() ? writable : entry.store;
      out.differences = std::move(differences);
      out.recorded = recorded;
    }
  }
  return out;
}

namespace {

std::string join_values(const std::vector<std::int64_t>& values) {
  std::string text;
  for (const std::int64_t v : values) {
    if (!text.empty()) {
      text += ' ';
    }
    text += std::to_string(v);
  }
  return text;
}

std::vector<std::int64_t> split_values(const std::string& text) {
  std::vector<std::int64_t> values;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string::npos) {
      end = text.size();
    }
    if (end > start) {
      try {
        values.push_back(std::stoll(text.substr(start, end - start)));
      } catch (const std::exception&) {
        return {}; // not a list of integers: a damaged row reads as none
      }
    }
    start = end + 1;
  }
  return values;
}

} // namespace

std::string encode_tuned(const TunedConfig& config) {
  Fields fields;
  for (const auto& name : config.names) {
    fields.emplace_back("name", clean(name));
  }
  fields.emplace_back("best", join_values(config.best));
  fields.emplace_back("pruned", std::to_string(config.pruned));
  fields.emplace_back("budget", config.budget_exhausted ? "1" : "0");
  fields.emplace_back("seconds", fmt::format("{}", config.seconds));
  for (const auto& t : config.timings) {
    fields.emplace_back("timing",
                        fmt::format("{}|{}|{}", join_values(t.values), t.ms, clean(t.error)));
  }
  return encode_fields(fields);
}

TunedConfig decode_tuned(const std::string& text) {
  TunedConfig config;
  for (const auto& [name, value] : decode_fields(text)) {
    try {
      if (name == "name") {
        config.names.push_back(value);
      } else if (name == "best") {
        config.best = split_values(value);
      } else if (name == "pruned") {
        config.pruned = std::stoull(value);
      } else if (name == "budget") {
        config.budget_exhausted = value == "1";
      } else if (name == "seconds") {
        config.seconds = std::stod(value);
      } else if (name == "timing") {
        const std::size_t a = value.find('|');
        const std::size_t b = a == std::string::npos ? a : value.find('|', a + 1);
        if (b == std::string::npos) {
          continue;
        }
        config.timings.push_back(TuneTiming{split_values(value.substr(0, a)),
                                            std::stod(value.substr(a + 1, b - a - 1)),
                                            value.substr(b + 1)});
      }
    } catch (const std::exception&) {
      // a damaged field is skipped
    }
  }
  return config;
}

} // namespace kjit::detail
