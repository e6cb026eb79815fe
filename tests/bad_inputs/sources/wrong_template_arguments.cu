// expect: k<float>
// name: k<float>
template <int N> __global__ void k(float* x) { x[0] = N; }
