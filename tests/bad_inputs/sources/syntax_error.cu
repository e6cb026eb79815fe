// expect: (3): error: expected a ";"
extern "C" __global__ void k(float* x) {
  x[0] = 1 x[1] = 2;
}
