// img2gray with kjit: reads a PPM (P6) image, converts it to gray on the GPU, writes a PGM (P5).
// Uses only kjit's public API. Where no GPU is found it pre-warms the kernel for an arch (sm_90 by
// default) into the cache, shows the cache entry, and converts the image on the CPU.
//
//   kjit_img2gray INPUT.ppm OUTPUT.pgm [--arch sm_90] [--kernel img2gray.cu] [--check]
#include <kjit/kjit.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Image {
  int width = 0;
  int height = 0;
  std::vector<unsigned char> pixels; // interleaved RGB, or gray
};

// Reads the next header token of a PNM file, skipping comments.
std::string next_token(std::istream& in) {
  std::string token;
  while (in >> token) {
    if (token[0] != '#') {
      return token;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return {};
}

Image read_ppm(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("cannot open '" + path + "'");
  }
  if (next_token(in) != "P6") {
    throw std::runtime_error("'" + path + "' is not a binary PPM (P6) image");
  }
  Image image;
  image.width = std::stoi(next_token(in));
  image.height = std::stoi(next_token(in));
  if (next_token(in) != "255" || image.width <= 0 || image.height <= 0) {
    throw std::runtime_error("'" + path + "': only 8-bit PPM images of positive size are read");
  }
  in.get(); // the single whitespace after the header
  image.pixels.resize(std::size_t(image.width) * image.height * 3);
  in.read(reinterpret_cast<char*>(image.pixels.data()),
          static_cast<std::streamsize>(image.pixels.size()));
  if (!in) {
    throw std::runtime_error("'" + path + "' is truncated");
  }
  return image;
}

void write_pgm(const std::string& path, const Image& gray) {
  std::ofstream out(path, std::ios::binary);
  out << "P5\n" << gray.width << ' ' << gray.height << "\n255\n";
  out.write(reinterpret_cast<const char*>(gray.pixels.data()),
            static_cast<std::streamsize>(gray.pixels.size()));
  if (!out) {
    throw std::runtime_error("cannot write '" + path + "'");
  }
}

// The same integer arithmetic as the kernel (BT.601 weights in 8-bit fixed point).
Image img2gray_cpu(const Image& rgb) {
  Image gray{rgb.width, rgb.height, std::vector<unsigned char>(rgb.pixels.size() / 3)};
  for (std::size_t i = 0; i < gray.pixels.size(); ++i) {
    const unsigned char* p = &rgb.pixels[3 * i];
    gray.pixels[i] =
      static_cast<unsigned char>((77u * p[0] + 150u * p[1] + 29u * p[2] + 128u) >> 8);
  }
  return gray;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
    .count();
}

int run(int argc, char** argv) {
  std::vector<std::string> positional;
  std::optional<std::string> arch;
  std::string kernel_path = KJIT_IMG2GRAY_SOURCE;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--arch" && i + 1 < argc) {
      arch = argv[++i];
    } else if (arg == "--kernel" && i + 1 < argc) {
      kernel_path = argv[++i];
    } else if (arg == "--check") {
      check = true;
    } else if (arg.starts_with("-")) {
      std::cerr << "unknown option '" << arg << "'\n";
      return 2;
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2) {
    std::cerr << "usage: kjit_img2gray INPUT.ppm OUTPUT.pgm [--arch sm_90] [--kernel FILE] "
                 "[--check]\n";
    return 2;
  }
  const Image rgb = read_ppm(positional[0]);
  std::cout << "image: " << rgb.width << " x " << rgb.height << " ('" << positional[0] << "')\n";
  const auto program = kjit::Program::from_file(kernel_path);
  kjit::Runtime runtime;
  std::cout << "kernel cache: "
            << (runtime.cache().enabled() ? runtime.cache().path().string() : "disabled") << "\n";

  Image gray;
  if (kjit::device_count() > 0 && !arch) {
    const auto device = kjit::device_info(0);
    std::cout << "device 0: " << device.name << " (" << device.arch.name() << ")\n";
    auto start = std::chrono::steady_clock::now();
    const kjit::Kernel kernel = runtime.kernel(program, "img2gray_kernel");
    const auto stats = runtime.stats();
    std::cout << "kernel ready in " << ms_since(start) << " ms ("
              << (stats.compiles > 0 ? "compiled with NVRTC" : "from the kernel cache") << ")\n";

    kjit::DeviceBuffer in(rgb.pixels.size());
    kjit::DeviceBuffer out(rgb.pixels.size() / 3);
    in.upload(rgb.pixels.data(), rgb.pixels.size());
    start = std::chrono::steady_clock::now();
    kernel.launch({kjit::cdiv(rgb.width, 32), kjit::cdiv(rgb.height, 8)}, {32, 8}, 0, nullptr,
                  in.get(), out.get(), rgb.width, rgb.height);
    kjit::synchronize();
    std::cout << "converted on the GPU in " << ms_since(start) << " ms\n";
    gray = Image{rgb.width, rgb.height, std::vector<unsigned char>(out.size())};
    out.download(gray.pixels.data(), gray.pixels.size());
    if (check) {
      if (gray.pixels != img2gray_cpu(rgb).pixels) {
        std::cerr << "check failed: the GPU result differs from the CPU reference\n";
        return 1;
      }
      std::cout << "check: byte-exact against the CPU reference\n";
    }
  } else {
    const kjit::Target target{kjit::Arch::parse(arch.value_or("sm_90"))};
    if (!arch) {
      std::cout << "no CUDA device found: pre-warming img2gray for " << target.name()
                << " and converting on the CPU\n";
    }
    const kjit::Binary binary = runtime.compile(program, target);
    const auto stats = runtime.stats();
    std::cout << "compiled for " << target.name() << ": " << binary.data.size() << " bytes, "
              << (stats.compiles > 0 ? "NVRTC " + std::to_string(binary.compile_ms) + " ms"
                                     : std::string("already in the kernel cache"))
              << "\n";
    bool stored = !runtime.cache().enabled();
    for (const auto& entry : runtime.cache().entries()) {
      if (entry.key == binary.key) {
        stored = true;
        std::cout << "cache entry: key " << entry.key << ", " << entry.name << ", " << entry.kind
                  << " for " << entry.arch << ", " << entry.size << " bytes, NVRTC "
                  << entry.nvrtc_version << ", driver " << entry.driver_version << ", compiled in "
                  << entry.compile_ms << " ms, hits " << entry.hits << "\n";
      }
    }
    if (check && !stored) {
      std::cerr << "check failed: the kernel is not in the cache\n";
      return 1;
    }
    gray = img2gray_cpu(rgb);
  }
  write_pgm(positional[1], gray);
  std::cout << "wrote '" << positional[1] << "'\n";
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kjit::CompileError& e) {
    std::cerr << "kjit_img2gray: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "kjit_img2gray: " << e.what() << "\n";
  }
  return 1;
}
