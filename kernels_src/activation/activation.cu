// Gated activations: out[t, i] = act(x[t, i]) * x[t, d + i] for x of shape [tokens, 2d].
// T is float, __half or __nv_bfloat16; the arithmetic is float32, rounded once to T.
//
// Grid: (min(tokens, 65535), cdiv(d, 4096)); each block walks rows t = blockIdx.x, +gridDim.x,
// ... and a 4096-wide slice of the row. Where d is a multiple of the vector width and the rows
// are aligned, each thread moves 16 bytes per load (8 halves or 4 floats).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

struct Silu {
  __device__ __forceinline__ float operator()(float x) const { return x / (1.0f + __expf(-x)); }
};

struct Gelu {
  // Exact GELU (torch's approximate='none'): 0.5 x (1 + erf(x / sqrt(2))).
  __device__ __forceinline__ float operator()(float x) const {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
  }
};

constexpr int k_slice = 4096; // elements of a row per block in y

template <typename T, typename Act>
__device__ __forceinline__ void act_and_mul(T* __restrict__ out, const T* __restrict__ x, int d,
                                            long long tokens) {
  constexpr int k_vec = 16 / sizeof(T); // elements per 16-byte load
  struct alignas(16) Vec {
    T v[k_vec];
  };
  const Act act;
  const int begin = blockIdx.y * k_slice;
  const int end = min(d, begin + k_slice);
  const bool vectorized = d % k_vec == 0 &&
                          reinterpret_cast<unsigned long long>(x) % 16 == 0 &&
                          reinterpret_cast<unsigned long long>(out) % 16 == 0;
  for (long long t = blockIdx.x; t < tokens; t += gridDim.x) {
    const T* a = x + t * 2 * d;
    const T* b = a + d;
    T* o = out + t * d;
    if (vectorized) {
      for (int i = begin + threadIdx.x * k_vec; i < end; i += blockDim.x * k_vec) {
        const Vec va = *reinterpret_cast<const Vec*>(a + i);
        const Vec vb = *reinterpret_cast<const Vec*>(b + i);
        Vec vo;
#pragma unroll
        for (int j = 0; j < k_vec; ++j) {
          vo.v[j] = from_float<T>(act(to_float(va.v[j])) * to_float(vb.v[j]));
        }
        *reinterpret_cast<Vec*>(o + i) = vo;
      }
    } else {
      for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
        o[i] = from_float<T>(act(to_float(a[i])) * to_float(b[i]));
      }
    }
  }
}

} // namespace

template <typename T>
__global__ void silu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int d,
                                    long long tokens) {
  act_and_mul<T, Silu>(out, x, d, tokens);
}

template <typename T>
__global__ void gelu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int d,
                                    long long tokens) {
  act_and_mul<T, Gelu>(out, x, d, tokens);
}
