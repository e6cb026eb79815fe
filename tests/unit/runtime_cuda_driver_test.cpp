// The driver layer without a GPU: a missing driver, and the whole kernel()/launch() path over a
// fake driver table (Note [Driver table]).
#include <kjit/kjit.hpp>

#include "runtime/cuda/driver.hpp"
#include "support/test_support.hpp"

#include <catch2/catch.hpp>

#include <cstring>

namespace {

// State of the fake driver; one test at a time uses it.
struct Fake {
  CUcontext current = nullptr;
  std::vector<std::size_t> params = {8, 8, 4, 4};
  CUresult load_result = CUDA_SUCCESS;
  int loads = 0;
  int launches = 0;
  unsigned grid_x = 0;
  unsigned block_y = 0;
  CUstream stream = nullptr;
  std::vector<std::int64_t> first_args;
};
Fake g_fake;

CUcontext fake_context() {
  static int context_storage = 0;
  return reinterpret_cast<CUcontext>(&context_storage);
}

kjit::detail::DriverApi fake_table() {
  kjit::detail::DriverApi t{};
  t.version = 13000;
  t.cuGetErrorName = [](CUresult r, const char** s) {
    *s = r == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
  };
  t.cuGetErrorString = [](CUresult, const char** s) {
    *s = "fake error";
    return CUDA_SUCCESS;
  };
  t.cuCtxGetCurrent = [](CUcontext* c) {
    *c = g_fake.current;
    return CUDA_SUCCESS;
  };
  t.cuCtxGetDevice = [](CUdevice* d) {
    *d = 0;
    return CUDA_SUCCESS;
  };
  t.cuDeviceGet = [](CUdevice* d, int ordinal) {
    *d = ordinal;
    return CUDA_SUCCESS;
  };
  t.cuDeviceGetCount = [](int* n) {
    *n = 1;
    return CUDA_SUCCESS;
  };
  t.cuDeviceGetAttribute = [](int* value, CUdevice_attribute attribute, CUdevice) {
    *value = attribute == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : 0;
    return CUDA_SUCCESS;
  };
  t.cuDevicePrimaryCtxRetain = [](CUcontext* c, CUdevice) {
    *c = fake_context();
    return CUDA_SUCCESS;
  };
  t.cuCtxSetCurrent = [](CUcontext c) {
    g_fake.current = c;
    return CUDA_SUCCESS;
  };
  t.cuLibraryLoadData = [](CUlibrary* library, const void* code, CUjit_option*, void**, unsigned,
                           CUlibraryOption*, void**, unsigned) {
    if (g_fake.load_result != CUDA_SUCCESS) {
      return g_fake.load_result;
    }
    // A cubin: the image the runtime hands over is the compiled ELF.
    REQUIRE(std::memcmp(code,
                        "\x7f"
                        "ELF",
                        4) == 0);
    ++g_fake.loads;
    static int library_storage = 0;
    *library = reinterpret_cast<CUlibrary>(&library_storage);
    return CUDA_SUCCESS;
  };
  t.cuLibraryUnload = [](CUlibrary) { return CUDA_SUCCESS; };
  t.cuLibraryGetKernel = [](CUkernel* kernel, CUlibrary, const char* name) {
    if (std::strcmp(name, "img2gray_kernel") != 0) {
      return CUDA_ERROR_NOT_FOUND;
    }
    static int kernel_storage = 0;
    *kernel = reinterpret_cast<CUkernel>(&kernel_storage);
    return CUDA_SUCCESS;
  };
  t.cuKernelGetParamInfo = [](CUkernel, std::size_t index, std::size_t* offset, std::size_t* size) {
    if (index >= g_fake.params.size()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    *offset = 0;
    *size = g_fake.params[index];
    return CUDA_SUCCESS;
  };
  t.cuLaunchKernel = [](CUfunction, unsigned gx, unsigned, unsigned, unsigned, unsigned by,
                        unsigned, unsigned, CUstream stream, void** args, void**) {
    if (g_fake.current == nullptr) {
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    ++g_fake.launches;
    g_fake.grid_x = gx;
    g_fake.block_y = by;
    g_fake.stream = stream;
    g_fake.first_args = {*static_cast<std::int64_t*>(args[0]), *static_cast<std::int64_t*>(args[1]),
                         *static_cast<int*>(args[2]), *static_cast<int*>(args[3])};
    return CUDA_SUCCESS;
  };
  return t;
}

kjit::Program img2gray() {
  return kjit::Program::from_file(kjit::test::source_dir() / "kernels_src/img2gray/img2gray.cu");
}

} // namespace

TEST_CASE("without a driver, compiling works and launching says no CUDA driver was found",
          "[driver]") {
  auto result = kjit::test::run_process(
    {kjit::test::helper_path(), "launch-without-driver",
     (kjit::test::source_dir() / "kernels_src/img2gray/img2gray.cu").string(), "img2gray_kernel"},
    {"KJIT_CUDA_DRIVER=/nonexistent/libcuda.so.1"});
  CHECK(result.exit_code == 0);
  CHECK(result.values["compiled"] == "1");
  CHECK(result.values["devices"] == "0");
  CHECK_THAT(result.values["error"], Catch::Contains("no CUDA driver found") &&
                                       Catch::Contains("/nonexistent/libcuda.so.1"));
}

TEST_CASE("kernel() detects the arch, loads once, and launch() passes the arguments", "[driver]") {
  g_fake = Fake{};
  const auto table = fake_table();
  kjit::detail::DriverOverride driver(table);
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  CHECK(runtime.default_target().name() == "sm_90");
  const auto k = runtime.kernel(img2gray(), "img2gray_kernel");
  const auto again = runtime.kernel(img2gray(), "img2gray_kernel");
  CHECK(g_fake.loads == 1);
  CHECK(k.handle() == again.handle());
  CHECK(k.param_count() == 4);
  CHECK(k.lowered_name() == "img2gray_kernel");

  const std::uint64_t in = 0x1000;
  const std::uint64_t out = 0x2000;
  // No context is current: the launch makes device 0's primary context current and retries.
  k.launch({7, 3}, {32, 8}, 0, nullptr, in, out, 640, 480);
  CHECK(g_fake.launches == 1);
  CHECK(g_fake.current == fake_context());
  CHECK(g_fake.grid_x == 7);
  CHECK(g_fake.block_y == 8);
  CHECK(g_fake.first_args == std::vector<std::int64_t>{0x1000, 0x2000, 640, 480});
}

TEST_CASE("argument count and size mismatches are LaunchErrors naming the parameter", "[driver]") {
  g_fake = Fake{};
  const auto table = fake_table();
  kjit::detail::DriverOverride driver(table);
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  const auto k = runtime.kernel(img2gray(), "img2gray_kernel");
  const std::uint64_t p = 0;
  CHECK_THROWS_WITH(k.launch({1}, {1}, 0, nullptr, p, p, 1),
                    Catch::Contains("kernel 'img2gray_kernel'") &&
                      Catch::Contains("takes 4 arguments, 3 given"));
  CHECK_THROWS_WITH(k.launch({1}, {1}, 0, nullptr, p, p, 1, std::int64_t{1}),
                    Catch::Contains("parameter 3 is 4 bytes, but argument 3 is 8 bytes") &&
                      Catch::Contains("(type 'long')"));
  CHECK_THROWS_AS(k.launch({1}, {1}, 0, nullptr, p, 1, 1, 1), kjit::LaunchError);
  CHECK(g_fake.launches == 0);
}

TEST_CASE("an unknown kernel name is a LaunchError that says what to pass", "[driver]") {
  g_fake = Fake{};
  const auto table = fake_table();
  kjit::detail::DriverOverride driver(table);
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  CHECK_THROWS_WITH(runtime.kernel(img2gray(), "rgb2gray"),
                    Catch::Contains("has no kernel 'rgb2gray'") &&
                      Catch::Contains("name expressions"));
}

TEST_CASE("a failed load is a DriverError naming the call and the driver's error", "[driver]") {
  g_fake = Fake{};
  g_fake.load_result = CUDA_ERROR_OUT_OF_MEMORY;
  const auto table = fake_table();
  kjit::detail::DriverOverride driver(table);
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  try {
    runtime.kernel(img2gray(), "img2gray_kernel");
    FAIL("expected a DriverError");
  } catch (const kjit::DriverError& e) {
    CHECK(e.code() == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(e.code_name() == "CUDA_ERROR_OUT_OF_MEMORY");
    CHECK_THAT(std::string(e.what()),
               Catch::Contains("cuLibraryLoadData") && Catch::Contains("img2gray.cu"));
  }
  // The failure is not remembered: a later call loads again.
  g_fake.load_result = CUDA_SUCCESS;
  CHECK_NOTHROW(runtime.kernel(img2gray(), "img2gray_kernel"));
}

TEST_CASE("without the param-info entry point, launches are not size-checked", "[driver]") {
  g_fake = Fake{};
  auto table = fake_table();
  table.cuKernelGetParamInfo = nullptr;
  kjit::detail::DriverOverride driver(table);
  kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
  const auto k = runtime.kernel(img2gray(), "img2gray_kernel");
  CHECK(k.param_count() == -1);
  const std::uint64_t p = 0;
  k.launch({1}, {1}, 0, nullptr, p, p, 1, 1);
  CHECK(g_fake.launches == 1);
}
