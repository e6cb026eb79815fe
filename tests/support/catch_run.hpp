#pragma once

namespace kjit::test {

// Catch2's session over the command line (support/catch_impl.cpp): the test programs' main.
int catch_run(int argc, char** argv);

} // namespace kjit::test
