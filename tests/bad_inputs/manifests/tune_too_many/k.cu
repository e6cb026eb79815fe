extern "C" __global__ void k(float* o, const float* x, int b) {}
