// Kernels of the autotuning test package (kernel.toml says what each op checks).

template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
  scale_kernel(float* out, const float* x, float alpha, long long n) {
  const long long i = (static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x) * VEC;
  if constexpr (VEC == 4) {
    if (i < n) {
      float4 v = *reinterpret_cast<const float4*>(x + i);
      v.x *= alpha;
      v.y *= alpha;
      v.z *= alpha;
      v.w *= alpha;
      *reinterpret_cast<float4*>(out + i) = v;
    }
  } else if constexpr (VEC == 2) {
    if (i < n) {
      float2 v = *reinterpret_cast<const float2*>(x + i);
      v.x *= alpha;
      v.y *= alpha;
      *reinterpret_cast<float2*>(out + i) = v;
    }
  } else {
    if (i < n) {
      out[i] = x[i] * alpha;
    }
  }
}

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK) add_kernel(float* x, const float* y, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
  if (i < n) {
    x[i] += y[i];
  }
}

// Grid-stride partial sums, one atomicAdd per warp into acc (zeroed before the launch).
template <int BLOCK>
__global__ void __launch_bounds__(BLOCK) sum_kernel(float* acc, const float* x, long long n) {
  float s = 0.f;
  for (long long i = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * BLOCK) {
    s += x[i];
  }
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(acc, s);
  }
}

extern "C" __global__ void copy_out_kernel(float* out, const float* acc) {
  *out = *acc;
}
