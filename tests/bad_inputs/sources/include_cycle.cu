// expect: include
#include "cycle_a.cuh"
extern "C" __global__ void k(float* x) { x[0] = 1; }
