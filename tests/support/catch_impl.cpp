// Catch2's implementation (its single header with CATCH_CONFIG_RUNNER: everything but main),
// compiled once for the unit and the GPU tests, whose mains call catch_run.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_run.hpp"

int kjit::test::catch_run(int argc, char** argv) {
  return Catch::Session().run(argc, argv);
}
