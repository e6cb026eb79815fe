#include <kjit/kjit.hpp>

#include "runtime/library.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <random>

namespace {

std::vector<unsigned char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<unsigned char> bytes(n);
  for (auto& b : bytes) {
    b = static_cast<unsigned char>(byte(rng));
  }
  return bytes;
}

std::vector<unsigned char> img2gray_reference(const std::vector<unsigned char>& rgb) {
  std::vector<unsigned char> gray(rgb.size() / 3);
  for (std::size_t i = 0; i < gray.size(); ++i) {
    gray[i] = static_cast<unsigned char>(
      (77u * rgb[3 * i] + 150u * rgb[3 * i + 1] + 29u * rgb[3 * i + 2] + 128u) >> 8);
  }
  return gray;
}

std::string img2gray_path() {
  return (kjit::test::source_dir() / "kernels_src/img2gray/img2gray.cu").string();
}

} // namespace

TEST_CASE("img2gray on the GPU is byte-exact against the CPU reference", "[gpu]") {
  kjit::test::TempDir dir;
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir.path()});
  const auto kernel = runtime.kernel(kjit::Program::from_file(img2gray_path()), "img2gray_kernel");
  CHECK(kernel.param_count() == 4);
  // Odd sizes, so edge blocks are partly outside the image.
  for (auto [width, height] : {std::pair{1037, 719}, std::pair{1, 1}, std::pair{4096, 33}}) {
    CAPTURE(width, height);
    const auto rgb = random_bytes(std::size_t(width) * height * 3, width + height);
    kjit::DeviceBuffer in(rgb.size());
    kjit::DeviceBuffer out(rgb.size() / 3);
    in.upload(rgb.data(), rgb.size());
    out.fill(0xA5);
    kernel.launch({kjit::cdiv(width, 32), kjit::cdiv(height, 8)}, {32, 8}, 0, nullptr, in.get(),
                  out.get(), width, height);
    kjit::synchronize();
    std::vector<unsigned char> gray(out.size());
    out.download(gray.data(), gray.size());
    CHECK(gray == img2gray_reference(rgb));
  }
}

TEST_CASE("a launch with a wrongly sized argument is refused by the real parameter layout",
          "[gpu]") {
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  const auto kernel = runtime.kernel(kjit::Program::from_file(img2gray_path()), "img2gray_kernel");
  kjit::DeviceBuffer buffer(64);
  CHECK_THROWS_WITH(
    kernel.launch({1}, {1}, 0, nullptr, buffer.get(), buffer.get(), std::size_t{4}, 4),
    Catch::Contains("parameter 2 is 4 bytes, but argument 2 is 8 bytes"));
  CHECK_THROWS_WITH(kernel.launch({1}, {1}, 0, nullptr, buffer.get(), buffer.get(), 4),
                    Catch::Contains("takes 4 arguments, 3 given"));
}

TEST_CASE("a second process gets the kernel from the store without NVRTC", "[gpu]") {
  kjit::test::TempDir dir;
  const std::vector<std::string> command{kjit::test::helper_path(), "kernel", dir.path().string(),
                                         img2gray_path(), "img2gray_kernel"};
  const auto first = kjit::test::run_process(command);
  REQUIRE(first.exit_code == 0);
  CHECK(first.values.at("compiles") == "1");
  const auto second = kjit::test::run_process(command);
  REQUIRE(second.exit_code == 0);
  CHECK(second.values.at("compiles") == "0");
  CHECK(second.values.at("store_hits") == "1");
  CHECK(second.values.at("params") == "4");
}

TEST_CASE("a template kernel runs through its name expression", "[gpu]") {
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  const kjit::Program program("scale.cu", R"(
    template <typename T> __global__ void scale(T* x, T a, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) x[i] *= a;
    })",
                              {.name_expressions = {"scale<float>", "scale<double>"}});
  const auto kernel = runtime.kernel(program, "scale<float>");
  CHECK(kernel.lowered_name() == "_Z5scaleIfEvPT_S0_i");
  const int n = 1000;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i) - 17.5f;
  }
  kjit::DeviceBuffer buffer(n * sizeof(float));
  buffer.upload(x.data(), buffer.size());
  kernel.launch({kjit::cdiv(n, 256)}, {256}, 0, nullptr, buffer.get(), 3.0f, n);
  kjit::synchronize();
  std::vector<float> y(n);
  buffer.download(y.data(), buffer.size());
  for (int i = 0; i < n; ++i) {
    REQUIRE(y[i] == x[i] * 3.0f);
  }
  CHECK_THROWS_AS(kernel.launch({1}, {1}, 0, nullptr, buffer.get(), 3.0, n), kjit::LaunchError);
}

TEST_CASE("PTX for an older virtual arch loads and runs (the path for GPUs newer than NVRTC)",
          "[gpu]") {
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  const kjit::Program program("fill.cu",
                              "extern \"C\" __global__ void fill(int* x, int v) { x[threadIdx.x] "
                              "= v + threadIdx.x; }");
  auto ptx = runtime.compile(program, kjit::Target{kjit::Arch{8, 0}, kjit::OutputKind::ptx}).data;
  ptx.push_back('\0');
  auto library = kjit::detail::Library::load(ptx, "fill.cu (compute_80)");
  kjit::Kernel kernel(library->kernel("fill", "fill"));
  kjit::DeviceBuffer buffer(32 * sizeof(int));
  kernel.launch({1}, {32}, 0, nullptr, buffer.get(), 100);
  kjit::synchronize();
  std::vector<int> values(32);
  buffer.download(values.data(), buffer.size());
  for (int i = 0; i < 32; ++i) {
    REQUIRE(values[i] == 100 + i);
  }
}

TEST_CASE("the vectorized img2gray kernel matches the reference, aligned or not", "[gpu]") {
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  const auto kernel =
    runtime.kernel(kjit::Program::from_file(img2gray_path()), "img2gray_vec_kernel");
  for (long long pixels : {1LL, 15LL, 16LL, 17LL, 1000003LL}) {
    for (int offset : {0, 1}) {
      CAPTURE(pixels, offset);
      const auto rgb = random_bytes(std::size_t(pixels) * 3, unsigned(pixels) + offset);
      kjit::DeviceBuffer in(rgb.size() + 3 * offset);
      kjit::DeviceBuffer out(std::size_t(pixels) + offset);
      std::vector<unsigned char> padded(3 * offset, 0);
      padded.insert(padded.end(), rgb.begin(), rgb.end());
      in.upload(padded.data(), padded.size());
      out.fill(0x5A);
      const long long groups = (pixels + 15) / 16;
      kernel.launch({kjit::cdiv(groups, 256)}, {256}, 0, nullptr, in.get() + 3 * offset,
                    out.get() + offset, pixels);
      kjit::synchronize();
      std::vector<unsigned char> gray(std::size_t(pixels) + offset);
      out.download(gray.data(), gray.size());
      CHECK(std::vector<unsigned char>(gray.begin() + offset, gray.end()) ==
            img2gray_reference(rgb));
    }
  }
}

TEST_CASE("dynamic shared memory: a block-wise sum (racecheck's kernel)", "[gpu]") {
  // Each block sums its 256 inputs through shared memory; compute-sanitizer's racecheck runs over
  // this test (scripts/gpu-check sanitize), so the barriers are checked, not assumed.
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  kjit::Program program("block_sum.cu", R"(
extern "C" __global__ void block_sum(const int* __restrict__ in, int* __restrict__ out, int n) {
  extern __shared__ int partial[];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  partial[threadIdx.x] = i < n ? in[i] : 0;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[blockIdx.x] = partial[0];
  }
}
)");
  const auto kernel = runtime.kernel(program, "block_sum");
  constexpr int k_block = 256;
  const int n = 1000 * k_block + 77; // a partial last block
  const unsigned blocks = kjit::cdiv(n, k_block);
  std::vector<int> values(n);
  for (int i = 0; i < n; ++i) {
    values[i] = (i * 7919) % 1001 - 500;
  }
  kjit::DeviceBuffer in(n * sizeof(int));
  kjit::DeviceBuffer out(blocks * sizeof(int));
  in.upload(values.data(), in.size());
  kernel.launch({blocks}, {k_block}, k_block * sizeof(int), nullptr, in.get(), out.get(), n);
  kjit::synchronize();
  std::vector<int> sums(blocks);
  out.download(sums.data(), out.size());
  for (unsigned b = 0; b < blocks; ++b) {
    int expected = 0;
    for (int i = b * k_block; i < std::min<int>(n, (b + 1) * k_block); ++i) {
      expected += values[i];
    }
    CAPTURE(b);
    REQUIRE(sums[b] == expected);
  }
}
