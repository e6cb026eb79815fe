// Reading kernel parameters from a cubin. The layout, as ptxas writes it (sm_50 to sm_120):
// an ELF64 file whose section `.nv.info.<kernel>` is a list of attribute records
//   u8 format, u8 attribute, then by format: 0x01 (none), 0x02 (a byte), 0x03 (a u16) two
//   bytes, so that records stay 4-byte aligned; 0x04 a u16 size and that many bytes.
// EIATTR_KPARAM_INFO (0x17, format 0x04, 12 bytes) describes one parameter:
//   u32 index, u16 ordinal, u16 offset, u32 flags whose bits 18..31 are the size in bytes.
#include "runtime/compile/cubin.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

namespace kjit::detail {

namespace {

template <class T>
bool read(std::string_view data, std::size_t at, T& out) {
  if (at > data.size() || data.size() - at < sizeof(T)) {
    return false;
  }
  std::memcpy(&out, data.data() + at, sizeof(T));
  return true;
}

constexpr std::uint8_t k_kparam_info = 0x17;

} // namespace

std::optional<std::vector<KernelParam>> cubin_kernel_params(std::string_view cubin,
                                                            std::string_view mangled) {
  // ELF64 little-endian header: e_shoff at 0x28, e_shentsize at 0x3a, e_shnum at 0x3c,
  // e_shstrndx at 0x3e.
  if (cubin.size() < 0x40 ||
      cubin.substr(0, 4) != "\x7f"
                            "ELF" ||
      cubin[4] != 2 || cubin[5] != 1) {
    return std::nullopt;
  }
  std::uint64_t shoff = 0;
  std::uint16_t shentsize = 0;
  std::uint16_t shnum = 0;
  std::uint16_t shstrndx = 0;
  if (!read(cubin, 0x28, shoff) || !read(cubin, 0x3a, shentsize) || !read(cubin, 0x3c, shnum) ||
      !read(cubin, 0x3e, shstrndx) || shentsize < 0x40 || shstrndx >= shnum) {
    return std::nullopt;
  }
  struct Section {
    std::uint32_t name = 0;
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
  };
  const auto section = [&](std::uint16_t i, Section& s) {
    const std::uint64_t at = shoff + std::uint64_t(i) * shentsize;
    return read(cubin, at, s.name) && read(cubin, at + 0x18, s.offset) &&
           read(cubin, at + 0x20, s.size) && s.offset <= cubin.size() &&
           s.size <= cubin.size() - s.offset;
  };
  Section names;
  if (!section(shstrndx, names)) {
    return std::nullopt;
  }
  const std::string wanted = ".nv.info." + std::string(mangled);
  for (std::uint16_t i = 0; i < shnum; ++i) {
    Section s;
    if (!section(i, s) || s.name >= names.size) {
      continue;
    }
    const std::string_view table = cubin.substr(names.offset, names.size);
    const std::string_view name = table.substr(s.name, table.find('\0', s.name) - s.name);
    if (name != wanted) {
      continue;
    }
    const std::string_view info = cubin.substr(s.offset, s.size);
    std::vector<std::pair<std::uint16_t, KernelParam>> params; // by ordinal
    for (std::size_t at = 0; at + 2 <= info.size();) {
      const auto format = static_cast<std::uint8_t>(info[at]);
      const auto attribute = static_cast<std::uint8_t>(info[at + 1]);
      at += 2;
      std::size_t length = 0;
      if (format == 0x01 || format == 0x02 || format == 0x03) {
        length = 2; // records stay 4-byte aligned: the value (none, a byte, a u16) takes 2
      } else if (format == 0x04) {
        std::uint16_t size = 0;
        if (!read(info, at, size)) {
          return std::nullopt;
        }
        at += 2;
        length = size;
      } else {
        return std::nullopt; // a format this reader does not know: no answer rather than a wrong
                             // one
      }
      if (length > info.size() - at) {
        return std::nullopt;
      }
      if (attribute == k_kparam_info && format == 0x04 && length >= 12) {
        std::uint16_t ordinal = 0;
        std::uint16_t offset = 0;
        std::uint32_t flags = 0;
        read(info, at + 4, ordinal);
        read(info, at + 6, offset);
        read(info, at + 8, flags);
        params.push_back({ordinal, KernelParam{offset, flags >> 18}});
      }
      at += length;
    }
    std::sort(params.begin(), params.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<KernelParam> result;
    for (std::size_t k = 0; k < params.size(); ++k) {
      if (params[k].first != k) {
        return std::nullopt; // ordinals with a gap: not what this reader expects
      }
      result.push_back(params[k].second);
    }
    return result;
  }
  return std::nullopt;
}

} // namespace kjit::detail
