// GPU tests: exit 125 (reported as skipped by CTest) where no driver or device is found.
#include <kjit/device.hpp>

#include "support/catch_run.hpp"

#include <cstdio>

int main(int argc, char** argv) {
  if (kjit::device_count() == 0) {
    std::printf("no CUDA driver or device found: skipping the GPU tests\n");
    return 125;
  }
  const auto info = kjit::device_info(0);
  std::printf("device 0: %s (%s)\n", info.name.c_str(), info.arch.name().c_str());
  return kjit::test::catch_run(argc, argv);
}
