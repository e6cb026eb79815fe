// Compiles a kernel for sm_90 through kjit's public API: works with or without a GPU.
#include <kjit/kjit.hpp>

#include <iostream>

int main() {
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  kjit::Program program("axpy.cu", R"(
    extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) y[i] += a * x[i];
    })");
  const kjit::Binary binary = runtime.compile(program, kjit::Target{kjit::Arch::parse("sm_90")});
  std::cout << "kjit " << kjit::version() << ": compiled axpy for sm_90, " << binary.data.size()
            << " bytes\n";
  return binary.data.empty() ? 1 : 0;
}
