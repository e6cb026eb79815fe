#include "support/catch_run.hpp"

int main(int argc, char** argv) {
  return kjit::test::catch_run(argc, argv);
}
