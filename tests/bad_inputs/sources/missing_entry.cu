// expect: nope
// name: nope<float>
template <typename T> __global__ void k(T* x) { x[0] = T(1); }
