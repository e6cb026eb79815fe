// Gated activations: out[t, i] = act(x[t, i]) * x[t, d + i] for x of shape [tokens, 2d].
// T is float, __half or __nv_bfloat16; the arithmetic is float32, rounded once to T.
//
// Grid: (cdiv(d, 8 * blockDim.x), min(tokens, 65535)). Each thread handles 8 consecutive
// elements of a row (blocks in y loop over rows past 65535): with d a multiple of 8 and aligned
// rows it moves them with 16-byte loads and stores (one vector for 16-bit types, two for float),
// else element by element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
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

constexpr int k_elems = 8; // elements per thread

template <typename T, typename Act>
__device__ __forceinline__ void act_and_mul(T* __restrict__ out, const T* __restrict__ x, int d,
                                            long long tokens) {
  union Pack {
    uint4 words[k_elems * sizeof(T) / 16];
    T v[k_elems];
  };
  const Act act;
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * k_elems;
  if (i >= d) {
    return;
  }
  const bool vectorized = d % k_elems == 0 && reinterpret_cast<unsigned long long>(x) % 16 == 0 &&
                          reinterpret_cast<unsigned long long>(out) % 16 == 0;
  for (long long t = blockIdx.y; t < tokens; t += gridDim.y) {
    const T* a = x + t * 2 * d + i;
    const T* b = a + d;
    T* o = out + t * d + i;
    if (vectorized) {
      Pack pa;
      Pack pb;
      Pack po;
#pragma unroll
      for (int w = 0; w < int(sizeof(pa.words) / 16); ++w) {
        pa.words[w] = __ldcs(reinterpret_cast<const uint4*>(a) + w);
        pb.words[w] = __ldcs(reinterpret_cast<const uint4*>(b) + w);
      }
#pragma unroll
      for (int j = 0; j < k_elems; ++j) {
        po.v[j] = from_float<T>(act(to_float(pa.v[j])) * to_float(pb.v[j]));
      }
#pragma unroll
      for (int w = 0; w < int(sizeof(po.words) / 16); ++w) {
        __stcs(reinterpret_cast<uint4*>(o) + w, po.words[w]);
      }
    } else {
      const int n = d - i < k_elems ? d - i : k_elems;
      for (int j = 0; j < n; ++j) {
        o[j] = from_float<T>(act(to_float(a[j])) * to_float(b[j]));
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
