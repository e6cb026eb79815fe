// A second process for kjit's tests: compiles or loads a kernel with a given cache directory and
// prints what happened as `name=value` lines.
//
//   kjit_test_helper compile DIR SOURCE ARCH [GO_FILE]  compile for ARCH (waits for GO_FILE first)
//   kjit_test_helper compile-then-wait DIR SOURCE ARCH READY_FILE
//                                   compile, create READY_FILE, then wait (at most 120 s) to be
//                                   killed
//   kjit_test_helper kernel DIR SOURCE NAME             load NAME for the device
//   kjit_test_helper compile-many DIR ARCH THREADS GO_FILE SOURCE...
//                                   THREADS threads each compile every SOURCE (rotated order)
//   kjit_test_helper key SOURCE ARCH                    print the cache key
//   kjit_test_helper launch-without-driver SOURCE NAME  expect a DriverError (KJIT_CUDA_DRIVER)
#include <kjit/kjit.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

void print_stats(const kjit::CacheStats& s) {
  std::cout << "memory_hits=" << s.memory_hits << "\nstore_hits=" << s.store_hits
            << "\nstore_misses=" << s.store_misses << "\ncompiles=" << s.compiles
            << "\ncorrupt=" << s.corrupt << "\n";
}

int run(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "compile" && argc >= 5) {
    if (argc >= 6) {
      while (!std::filesystem::exists(argv[5])) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = argv[2]});
    const auto binary =
      runtime.compile(kjit::Program::from_file(argv[3]), kjit::Target{kjit::Arch::parse(argv[4])});
    std::cout << "key=" << binary.key << "\nsize=" << binary.data.size() << "\n";
    print_stats(runtime.stats());
    // Whether this process loaded NVRTC (Note [NVRTC identity]: not for a store hit).
    std::ifstream maps("/proc/self/maps");
    std::string line;
    bool mapped = false;
    while (std::getline(maps, line)) {
      mapped = mapped || line.find("/libnvrtc.so") != std::string::npos;
    }
    std::cout << "nvrtc_mapped=" << mapped << "\n";
    return 0;
  }
  if (command == "compile-then-wait" && argc >= 6) {
    kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = argv[2]});
    runtime.compile(kjit::Program::from_file(argv[3]), kjit::Target{kjit::Arch::parse(argv[4])});
    std::ofstream(argv[5]).put('\n');
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  if (command == "compile-many" && argc >= 7) {
    const int threads = std::stoi(argv[4]);
    while (!std::filesystem::exists(argv[5])) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::vector<kjit::Program> programs;
    for (int i = 6; i < argc; ++i) {
      programs.push_back(kjit::Program::from_file(argv[i]));
    }
    kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = argv[2]});
    const kjit::Target target{kjit::Arch::parse(argv[3])};
    std::vector<std::thread> workers;
    std::atomic<int> failures{0};
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        for (std::size_t i = 0; i < programs.size(); ++i) {
          try {
            const auto binary = runtime.compile(programs[(i + t) % programs.size()], target);
            if (binary.data.size() < 4 || binary.data.substr(1, 3) != "ELF") {
              ++failures;
            }
          } catch (const std::exception& e) {
            std::cerr << e.what() << "\n";
            ++failures;
          }
        }
      });
    }
    for (auto& worker : workers) {
      worker.join();
    }
    std::cout << "failures=" << failures.load() << "\n";
    print_stats(runtime.stats());
    return failures.load() == 0 ? 0 : 1;
  }
  if (command == "kernel" && argc >= 5) {
    kjit::Runtime runtime(kjit::RuntimeOptions{.cache_dir = argv[2]});
    const auto kernel = runtime.kernel(kjit::Program::from_file(argv[3]), argv[4]);
    std::cout << "kernel=" << kernel.lowered_name() << "\nparams=" << kernel.param_count() << "\n";
    print_stats(runtime.stats());
    return 0;
  }
  if (command == "key" && argc >= 4) {
    kjit::Runtime runtime(kjit::RuntimeOptions{.disable_cache = true});
    std::cout << runtime.key(kjit::Program::from_file(argv[2]),
                             kjit::Target{kjit::Arch::parse(argv[3])})
              << "\n";
    return 0;
  }
  if (command == "launch-without-driver" && argc >= 4) {
    kjit::Runtime runtime(
      kjit::RuntimeOptions{.disable_cache = true, .arch = kjit::Arch::parse("sm_90")});
    const auto program = kjit::Program::from_file(argv[2]);
    runtime.compile(program, kjit::Target{kjit::Arch::parse("sm_90")});
    std::cout << "compiled=1\ndevices=" << kjit::device_count() << "\n";
    try {
      runtime.kernel(program, argv[3]);
    } catch (const kjit::DriverError& e) {
      std::cout << "error=" << e.what() << "\n";
      return 0;
    }
    std::cout << "error=none\n";
    return 1;
  }
  std::cerr << "usage: kjit_test_helper "
               "compile|compile-then-wait|compile-many|kernel|key|launch-without-driver ...\n";
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kjit_test_helper: " << e.what() << "\n";
    return 1;
  }
}
