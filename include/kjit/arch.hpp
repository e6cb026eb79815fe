// GPU architectures ("sm_90") and compile targets.
//
// **Example**
//
//   auto arch = kjit::Arch::parse("sm_90");        // or Arch{9, 0}
//   std::cout << arch.name() << ' ' << arch.number();  // "sm_90 90"
#pragma once

#include <compare>
#include <string>
#include <string_view>
#include <vector>

namespace kjit {

// A compute capability, with the optional arch-specific ('a') or family ('f') suffix.
struct Arch {
  int major = 0;
  int minor = 0;
  char suffix = '\0'; // '\0', 'a' or 'f'

  // Parses "sm_90", "sm_90a", "compute_90", "90" or "9.0"; throws `kjit::Error` naming `text`
  // otherwise.
  static Arch parse(std::string_view text);

  // Parses a comma-separated list, e.g. "sm_80,sm_90"; throws like `parse`.
  static std::vector<Arch> parse_list(std::string_view text);

  // 10 * major + minor, e.g. 90.
  int number() const noexcept { return 10 * major + minor; }
  // "sm_90" (with the suffix, if any).
  std::string name() const;
  // "compute_90" (with the suffix, if any): the virtual architecture of PTX.
  std::string virtual_name() const;

  friend auto operator<=>(const Arch&, const Arch&) = default;
};

// What NVRTC produces: machine code for one arch (cubin) or PTX that the driver compiles when it
// loads it (for a device newer than the toolkit).
enum class OutputKind { cubin, ptx };

// Returns "cubin" or "ptx".
std::string_view to_string(OutputKind kind) noexcept;

// What one compile makes: an output kind for an arch.
struct Target {
  Arch arch;
  OutputKind kind = OutputKind::cubin;

  // "sm_90" for a cubin, "compute_90" for PTX.
  std::string name() const { return kind == OutputKind::cubin ? arch.name() : arch.virtual_name(); }

  friend auto operator<=>(const Target&, const Target&) = default;
};

// The archs the loaded NVRTC can compile for (`nvrtcGetSupportedArchs`), ascending. Throws
// `NvrtcError` when no NVRTC is found.
std::vector<Arch> nvrtc_supported_archs();

// The target to compile for a device of `device_arch`: a cubin when NVRTC knows the arch, else PTX
// for the newest arch NVRTC knows that is not above it (the driver compiles that PTX for the
// device). Throws `kjit::Error` when the device is older than every arch NVRTC supports.
Target target_for_device(Arch device_arch);

} // namespace kjit
