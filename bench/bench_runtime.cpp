// Runtime overheads on a GPU, each beside its peer in the same run:
//   cold first use      Runtime::kernel() on an empty store  vs  the NVRTC compile inside it
//   warm first use      a new process: store open + lookup + load (context creation apart)
//   in-process lookup   Runtime::kernel() on a memoized kernel
//   launch overhead     Kernel::launch  vs  raw cuLaunchKernel, host time per launch
//   header-heavy cold   compiles of kernels sharing cuda_fp16.h and cuda/std headers, with
//                       NVRTC's automatic precompiled headers (the default) vs without
//
//   kjit_bench_runtime [--json FILE]
#include <kjit/kjit.hpp>

#include "runtime/cuda/driver.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

std::string img2gray_path() {
  return std::string(KJIT_SOURCE_DIR) + "/kernels_src/img2gray/img2gray.cu";
}

// Child mode: context creation, then request -> launchable from a full store. Prints two numbers.
int warm_child(const std::string& cache_dir) {
  auto start = Clock::now();
  kjit::set_device(0); // cuInit + primary context: reported apart
  const double context_us = us_since(start);
  start = Clock::now();
  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = cache_dir});
  const kjit::Kernel kernel =
    runtime.kernel(kjit::Program::from_file(img2gray_path()), "img2gray_kernel");
  const double ready_us = us_since(start);
  if (runtime.stats().compiles != 0 || !kernel) {
    return 3;
  }
  std::printf("%f %f\n", context_us, ready_us);
  return 0;
}

// A kernel that includes the headers real kernels include; `variant` makes each a new program.
std::string header_heavy_source(int variant) {
  return fmt::format(R"(#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda/std/type_traits>
#include <cuda/std/limits>
#include <cuda/std/array>
#include <cuda/std/cmath>
#include <cuda/std/complex>

template <typename T> __global__ void scale_{0}(T* x, long long n, float s) {{
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  static_assert(cuda::std::is_trivially_copyable_v<T>);
  cuda::std::array<float, 2> bias{{{0}.0f, cuda::std::numeric_limits<float>::epsilon()}};
  if (i < n) {{
    x[i] = T(cuda::std::sqrt(float(x[i])) * s + bias[0] + bias[1]);
  }}
}}
)",
                     variant);
}

constexpr int k_header_heavy = 8;

// Child mode: compiles k_header_heavy header-heavy programs in one process (no store); prints
// each compile's milliseconds. KJIT_NVRTC_PCH in the environment says whether PCH is used.
int pch_child() {
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  const kjit::Target target{kjit::Arch{9, 0}};
  for (int i = 0; i < k_header_heavy; ++i) {
    kjit::Program program(
      "scale.cu", header_heavy_source(i),
      {.options = {"-std=c++17"}, .name_expressions = {fmt::format("scale_{}<__half>", i)}});
    const auto start = Clock::now();
    runtime.compile(program, target);
    std::printf("%f\n", us_since(start) / 1000);
  }
  return 0;
}

std::vector<double> run_pch_child(const char* self, bool pch) {
  const std::string command = fmt::format("KJIT_NVRTC_PCH={} {} --pch-child", pch ? 1 : 0, self);
  FILE* pipe = ::popen(command.c_str(), "r");
  std::vector<double> ms;
  double value = 0;
  while (pipe != nullptr && std::fscanf(pipe, "%lf", &value) == 1) {
    ms.push_back(value);
  }
  if (pipe == nullptr || ::pclose(pipe) != 0 || ms.size() != k_header_heavy) {
    std::printf("header-heavy child failed\n");
    std::exit(1);
  }
  return ms;
}

struct Row {
  std::string metric;
  std::string kjit;
  std::string peer;
  std::string ratio;
  std::string target;
  double value = 0; // kjit's number, and its peer's, in the unit of the row (for the chart)
  double peer_value = 0;
};

} // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--warm-child") {
    return warm_child(argv[2]);
  }
  if (argc == 2 && std::string(argv[1]) == "--pch-child") {
    return pch_child();
  }
  std::string json_path;
  if (argc == 3 && std::string(argv[1]) == "--json") {
    json_path = argv[2];
  }
  if (kjit::device_count() == 0) {
    std::printf("no CUDA device: the runtime benchmarks need a GPU\n");
    return 125;
  }
  const auto info = kjit::device_info(0);
  std::printf("device: %s (%s), driver %d, NVRTC %d.%d\n", info.name.c_str(),
              info.arch.name().c_str(), kjit::detail::driver().version, kjit::nvrtc_version().first,
              kjit::nvrtc_version().second);
  kjit::set_device(0);
  std::vector<Row> rows;
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("kjit-bench-{}", getpid());
  std::filesystem::remove_all(dir);

  // Cold first use: a kernel the store does not have (distinct programs: a constant differs).
  // The store itself exists; creating a new store file is reported apart.
  {
    std::vector<double> total;
    std::vector<double> nvrtc;
    std::vector<double> create;
    const std::string source = kjit::Program::from_file(img2gray_path()).source();
    for (int i = 0; i < 9; ++i) {
      const auto store = dir / fmt::format("cold{}", i);
      kjit::Program program("img2gray.cu", source + fmt::format("\n// variant {}\n", i));
      auto start = Clock::now();
      kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = store});
      create.push_back(us_since(start) / 1000);
      start = Clock::now();
      const kjit::Kernel kernel = runtime.kernel(program, "img2gray_kernel");
      total.push_back(us_since(start) / 1000);
      nvrtc.push_back(runtime.stats().compile_ms);
    }
    // The first compile of a process pays NVRTC's own start-up; the medians are of later ones.
    std::printf("cold: first %.1f ms (NVRTC %.1f ms)\n", total[0], nvrtc[0]);
    total.erase(total.begin());
    nvrtc.erase(nvrtc.begin());
    create.erase(create.begin());
    std::vector<double> overhead;
    for (std::size_t i = 0; i < total.size(); ++i) {
      overhead.push_back(total[i] - nvrtc[i]);
    }
    const double t = median(total);
    const double n = median(nvrtc);
    rows.push_back(
      {"cold first use (kernel not in the store), request -> launchable",
       fmt::format("{:.2f} ms", t),
       fmt::format("NVRTC compile {:.2f} ms (kjit's own part {:.3f} ms)", n, median(overhead)),
       fmt::format("{:.3f}x", t / n), "<= 1.10x", t, n});
    rows.push_back({"new store file (first use on a machine), Runtime construction",
                    fmt::format("{:.2f} ms", median(create)), "-", "-", "once per machine"});
  }

  // Warm first use in new processes.
  {
    const auto store = dir / "warm";
    {
      kjit::Runtime(kjit::RuntimeOptions{.cache_dir = store})
        .compile(kjit::Program::from_file(img2gray_path()), kjit::Runtime().default_target());
    }
    std::vector<double> context;
    std::vector<double> ready;
    for (int i = 0; i < 15; ++i) {
      const std::string command = fmt::format("{} --warm-child {}", argv[0], store.string());
      FILE* pipe = ::popen(command.c_str(), "r");
      double c = 0;
      double r = 0;
      if (pipe == nullptr || std::fscanf(pipe, "%lf %lf", &c, &r) != 2) {
        std::printf("warm child failed\n");
        return 1;
      }
      if (::pclose(pipe) != 0) {
        std::printf("warm child compiled or failed\n");
        return 1;
      }
      context.push_back(c / 1000);
      ready.push_back(r / 1000);
    }
    rows.push_back({"warm first use (new process, full store), request -> launchable",
                    fmt::format("{:.3f} ms", median(ready)),
                    fmt::format("CUDA context creation {:.1f} ms (apart)", median(context)), "-",
                    "<= 1 ms", median(ready), median(context)});
  }

  kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = dir / "warm"});
  const auto program = kjit::Program::from_file(img2gray_path());
  kjit::Kernel kernel = runtime.kernel(program, "img2gray_kernel");

  // In-process repeat lookup.
  {
    std::vector<double> per_call;
    for (int round = 0; round < 9; ++round) {
      constexpr int k_calls = 100000;
      const auto start = Clock::now();
      for (int i = 0; i < k_calls; ++i) {
        kernel = runtime.kernel(program, "img2gray_kernel");
      }
      per_call.push_back(us_since(start) / k_calls);
    }
    rows.push_back({"in-process repeat lookup (Runtime::kernel)",
                    fmt::format("{:.3f} us", median(per_call)), "-", "-", "<= 1 us",
                    median(per_call)});
  }

  // Launch overhead: host time per launch, in bursts well under the launch queue's depth,
  // alternating kjit and raw bursts; the GPU drains between bursts.
  {
    const auto& d = kjit::detail::driver();
    kjit::DeviceBuffer in(3);
    kjit::DeviceBuffer out(1);
    std::uint64_t in_ptr = in.get();
    std::uint64_t out_ptr = out.get();
    int width = 1;
    int height = 1;
    void* raw_args[] = {&in_ptr, &out_ptr, &width, &height};
    const auto function = reinterpret_cast<CUfunction>(kernel.handle());
    constexpr int k_burst = 200;
    std::vector<double> kjit_us;
    std::vector<double> raw_us;
    for (int round = 0; round < 300; ++round) {
      auto start = Clock::now();
      for (int i = 0; i < k_burst; ++i) {
        kernel.launch({1}, {32, 8}, 0, nullptr, in_ptr, out_ptr, width, height);
      }
      kjit_us.push_back(us_since(start) / k_burst);
      kjit::synchronize();
      start = Clock::now();
      for (int i = 0; i < k_burst; ++i) {
        KJIT_CU_CHECK(d.cuLaunchKernel(function, 1, 1, 1, 32, 8, 1, 0, nullptr, raw_args, nullptr),
                      "raw launch");
      }
      raw_us.push_back(us_since(start) / k_burst);
      kjit::synchronize();
    }
    const double k = median(kjit_us);
    const double r = median(raw_us);
    rows.push_back({"launch, host time per call (Kernel::launch vs raw cuLaunchKernel)",
                    fmt::format("{:.3f} us", k), fmt::format("{:.3f} us", r),
                    fmt::format("+{:.3f} us", k - r), "<= +0.3 us", k, r});
  }
  std::filesystem::remove_all(dir);

  // Header-heavy kernels: without PCH, then with it, each series in its own process.
  {
    const auto without = run_pch_child(argv[0], false);
    const auto with = run_pch_child(argv[0], true);
    const auto rest = [](const std::vector<double>& ms) {
      return median(std::vector<double>(ms.begin() + 1, ms.end()));
    };
    std::printf("header-heavy: without PCH first %.0f ms, then %.0f ms; with PCH first %.0f ms, "
                "then %.0f ms\n",
                without[0], rest(without), with[0], rest(with));
    rows.push_back({fmt::format("header-heavy kernel cold compile, 2nd..{}th sharing the headers",
                                k_header_heavy),
                    fmt::format("{:.0f} ms with NVRTC PCH (first {:.0f} ms)", rest(with), with[0]),
                    fmt::format("{:.0f} ms without (first {:.0f} ms)", rest(without), without[0]),
                    fmt::format("{:.1f}x faster", rest(without) / rest(with)), ">= 3x faster",
                    rest(with), rest(without)});
  }

  std::printf("\n| metric | kjit | peer | ratio / difference | target |\n|---|---|---|---|---|\n");
  std::string json = "[";
  for (const auto& row : rows) {
    std::printf("| %s | %s | %s | %s | %s |\n", row.metric.c_str(), row.kjit.c_str(),
                row.peer.c_str(), row.ratio.c_str(), row.target.c_str());
    json += fmt::format("{}{{\"metric\":\"{}\",\"kjit\":\"{}\",\"peer\":\"{}\",\"ratio\":\"{}\","
                        "\"target\":\"{}\",\"value\":{},\"peer_value\":{}}}",
                        json.size() > 1 ? "," : "", row.metric, row.kjit, row.peer, row.ratio,
                        row.target, row.value, row.peer_value);
  }
  json += "]\n";
  if (!json_path.empty()) {
    std::ofstream(json_path) << json;
  }
  return 0;
}
