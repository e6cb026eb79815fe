// libFuzzer target: any kernel.toml loads or is a ManifestError, never a crash.
#include <kjit/error.hpp>
#include <kjit/package.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace {

// A folder holding the sources manifests may name; the manifest is rewritten per input.
const std::filesystem::path& package_dir() {
  static const std::filesystem::path dir = [] {
    char pattern[] = "/tmp/kjit-manifest-fuzz-XXXXXX";
    const std::filesystem::path made = ::mkdtemp(pattern);
    for (const char* name : {"k.cu", "a.cu", "img2gray.cu", "activation.cu"}) {
      std::ofstream(made / name) << "template <typename T> __global__ void k(T* x) {}\n";
    }
    std::filesystem::create_directory(made / "include");
    return made;
  }();
  return dir;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto dir = package_dir();
  {
    std::ofstream manifest(dir / "kernel.toml", std::ios::binary | std::ios::trunc);
    manifest.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const auto package = kjit::Package::load(dir);
    (void)package.warm_list();
  } catch (const kjit::Error&) {
  }
  return 0;
}
