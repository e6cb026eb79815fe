// expect: not_there.cuh
#include "not_there.cuh"
extern "C" __global__ void k(float* x) { x[0] = 1; }
