template <typename T> __global__ void k(T* o, const T* x, int b) {}
