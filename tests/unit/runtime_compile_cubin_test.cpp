#include <kjit/runtime.hpp>

#include "runtime/compile/cubin.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace {

const kjit::Target k_sm90{kjit::Arch{9, 0}, kjit::OutputKind::cubin};

kjit::Binary compile(const std::string& source, std::vector<std::string> names = {}) {
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  kjit::CompileOptions options;
  options.name_expressions = std::move(names);
  return runtime.compile(kjit::Program("k.cu", source, options), k_sm90);
}

std::vector<std::size_t> sizes(const std::vector<kjit::detail::KernelParam>& params) {
  std::vector<std::size_t> out;
  for (const auto& p : params) {
    out.push_back(p.size);
  }
  return out;
}

} // namespace

TEST_CASE("kernel parameters come from the cubin, without a driver", "[cubin]") {
  const auto binary = compile(R"(#include <cuda_fp16.h>
struct S { int a[5]; };
extern "C" __global__ void k(float* out, const float* x, long long n, int m, char c, double d) {}
extern "C" __global__ void s(S s, float* o) {}
extern "C" __global__ void none() {}
template <typename T> __global__ void t(T* x, T v, int n) {}
)",
                              {"t<__half>"});
  const auto k = kjit::detail::cubin_kernel_params(binary.data, "k");
  REQUIRE(k);
  CHECK(sizes(*k) == std::vector<std::size_t>{8, 8, 8, 4, 1, 8});
  CHECK((*k)[4].offset == 28);
  CHECK((*k)[5].offset == 32);
  const auto s = kjit::detail::cubin_kernel_params(binary.data, "s");
  REQUIRE(s);
  CHECK(sizes(*s) == std::vector<std::size_t>{20, 8});
  REQUIRE(binary.lowered_names.size() == 1);
  const auto t = kjit::detail::cubin_kernel_params(binary.data, binary.lowered_names[0].second);
  REQUIRE(t);
  CHECK(sizes(*t) == std::vector<std::size_t>{8, 2, 4});
  const auto none = kjit::detail::cubin_kernel_params(binary.data, "none");
  CHECK((!none || none->empty()));
  CHECK_FALSE(kjit::detail::cubin_kernel_params(binary.data, "missing"));
}

TEST_CASE("what is not a cubin gives no answer, never a wrong one or a crash", "[cubin]") {
  const auto binary = compile(R"(extern "C" __global__ void k(float* out, int n) {})");
  CHECK_FALSE(kjit::detail::cubin_kernel_params("", "k"));
  CHECK_FALSE(kjit::detail::cubin_kernel_params(".version 8.0\n.target sm_90\n", "k"));
  for (std::size_t cut = 0; cut < binary.data.size(); cut += 97) {
    (void)kjit::detail::cubin_kernel_params(std::string_view(binary.data).substr(0, cut), "k");
  }
  std::string damaged = binary.data;
  for (std::size_t i = 0x40; i < damaged.size(); i += 13) {
    damaged[i] = static_cast<char>(damaged[i] ^ 0x5a);
    (void)kjit::detail::cubin_kernel_params(damaged, "k");
  }
  SUCCEED("no crash");
}
