#include <kjit/arch.hpp>
#include <kjit/error.hpp>

#include "runtime/compile/nvrtc_compiler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace kjit {

Arch Arch::parse(std::string_view text) {
  std::string_view rest = text;
  for (std::string_view prefix : {"sm_", "compute_", "sm", "compute"}) {
    if (rest.starts_with(prefix)) {
      rest.remove_prefix(prefix.size());
      break;
    }
  }
  Arch arch;
  char suffix = '\0';
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f')) {
    suffix = rest.back();
    rest.remove_suffix(1);
  }
  const auto dot = rest.find('.');
  int major = 0;
  int minor = 0;
  bool ok = false;
  if (dot != std::string_view::npos) {
    auto r1 = std::from_chars(rest.data(), rest.data() + dot, major);
    auto r2 = std::from_chars(rest.data() + dot + 1, rest.data() + rest.size(), minor);
    ok = r1.ec == std::errc() && r1.ptr == rest.data() + dot && r2.ec == std::errc() &&
         r2.ptr == rest.data() + rest.size() && minor >= 0 && minor <= 9;
  } else if (rest.size() >= 2 && rest.size() <= 3) {
    int number = 0;
    auto r = std::from_chars(rest.data(), rest.data() + rest.size(), number);
    ok = r.ec == std::errc() && r.ptr == rest.data() + rest.size();
    major = number / 10;
    minor = number % 10;
  }
  if (!ok || major < 1 || major > 99) {
    throw Error(fmt::format("cannot parse GPU architecture '{}': expected a name like 'sm_90', "
                            "'sm_90a', 'compute_90' or '9.0'",
                            text));
  }
  arch.major = major;
  arch.minor = minor;
  arch.suffix = suffix;
  return arch;
}

std::vector<Arch> Arch::parse_list(std::string_view text) {
  std::vector<Arch> archs;
  while (!text.empty()) {
    const auto comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) {
      item.remove_prefix(1);
    }
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) {
      item.remove_suffix(1);
    }
    if (!item.empty()) {
      archs.push_back(parse(item));
    }
    if (comma == std::string_view::npos) {
      break;
    }
    text.remove_prefix(comma + 1);
  }
  return archs;
}

std::string Arch::name() const {
  return suffix == '\0' ? fmt::format("sm_{}", number()) : fmt::format("sm_{}{}", number(), suffix);
}

std::string Arch::virtual_name() const {
  return suffix == '\0' ? fmt::format("compute_{}", number())
                        : fmt::format("compute_{}{}", number(), suffix);
}

std::string_view to_string(OutputKind kind) noexcept {
  return kind == OutputKind::cubin ? "cubin" : "ptx";
}

std::vector<Arch> nvrtc_supported_archs() {
  std::vector<Arch> archs;
  for (int number : detail::nvrtc_supported_arch_numbers()) {
    archs.push_back(Arch{number / 10, number % 10});
  }
  return archs;
}

Target target_for_device(Arch device_arch) {
  return detail::target_for_device(device_arch, detail::nvrtc_supported_arch_numbers(),
                                   {detail::nvrtc().version_major, detail::nvrtc().version_minor});
}

namespace detail {

Target target_for_device(Arch device_arch, const std::vector<int>& supported,
                         std::pair<int, int> nvrtc_version) {
  const int number = device_arch.number();
  if (std::find(supported.begin(), supported.end(), number) != supported.end()) {
    return Target{Arch{device_arch.major, device_arch.minor}, OutputKind::cubin};
  }
  // A device newer than this NVRTC: PTX for the newest arch it knows below the device, which the
  // driver compiles for the device when it loads the library.
  int best = 0;
  for (int candidate : supported) {
    if (candidate <= number && candidate > best) {
      best = candidate;
    }
  }
  if (best == 0) {
    throw Error(fmt::format("cannot compile for {}: NVRTC {}.{} supports sm_{} and newer only",
                            device_arch.name(), nvrtc_version.first, nvrtc_version.second,
                            supported.empty() ? 0 : supported.front()));
  }
  return Target{Arch{best / 10, best % 10}, OutputKind::ptx};
}

} // namespace detail

} // namespace kjit
