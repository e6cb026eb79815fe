// Gated activations: out[t, i] = act(x[t, i]) * x[t, d + i] for x of shape [tokens, 2d].
// T is float, __half or __nv_bfloat16; the arithmetic is float32, rounded once to T.
//
// Grid: (cdiv(d, 8 * blockDim.x), min(cdiv(tokens, 4), 65535)). Each thread handles 8
// consecutive elements of 4 consecutive rows (blocks in y loop over rows past 4 x 65535): with d
// a multiple of 8 and aligned rows it moves them with 16-byte loads and stores (one vector for
// 16-bit types, two for float), else element by element. Plain loads and stores: the streaming
// hints (__ldcs/__stcs) measured slower on an H200.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
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

constexpr int k_elems = 8; // elements per thread and row
constexpr int k_rows = 4;  // rows per thread

template <typename T, typename Act>
__device__ __forceinline__ void act_and_mul(T* __restrict__ out, const T* __restrict__ x, int d,
                                            long long tokens) {
  union Pack {
    uint4 words[k_elems * sizeof(T) / 16];
    T v[k_elems];
  };
  constexpr int k_words = int(sizeof(Pack) / 16);
  const Act act;
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * k_elems;
  if (i >= d) {
    return;
  }
  const bool vectorized = d % k_elems == 0 && reinterpret_cast<unsigned long long>(x) % 16 == 0 &&
                          reinterpret_cast<unsigned long long>(out) % 16 == 0;
  for (long long t0 = blockIdx.y * static_cast<long long>(k_rows); t0 < tokens;
       t0 += static_cast<long long>(gridDim.y) * k_rows) {
    const int rows = tokens - t0 < k_rows ? static_cast<int>(tokens - t0) : k_rows;
    if (vectorized) {
      // All loads of the k_rows rows first, then the arithmetic: 2 x k_rows 16-byte loads in
      // flight per thread hide the latency that the GELU arithmetic would otherwise expose.
      Pack pa[k_rows];
      Pack pb[k_rows];
#pragma unroll
      for (int r = 0; r < k_rows; ++r) {
        if (r < rows) {
          const uint4* a = reinterpret_cast<const uint4*>(x + (t0 + r) * 2 * d + i);
          const uint4* b = reinterpret_cast<const uint4*>(x + (t0 + r) * 2 * d + d + i);
#pragma unroll
          for (int w = 0; w < k_words; ++w) {
            pa[r].words[w] = a[w];
            pb[r].words[w] = b[w];
          }
        }
      }
#pragma unroll
      for (int r = 0; r < k_rows; ++r) {
        if (r < rows) {
          Pack po;
#pragma unroll
          for (int j = 0; j < k_elems; ++j) {
            po.v[j] = from_float<T>(act(to_float(pa[r].v[j])) * to_float(pb[r].v[j]));
          }
          uint4* o = reinterpret_cast<uint4*>(out + (t0 + r) * d + i);
#pragma unroll
          for (int w = 0; w < k_words; ++w) {
            o[w] = po.words[w];
          }
        }
      }
    } else {
      const int n = d - i < k_elems ? d - i : k_elems;
      for (int r = 0; r < rows; ++r) {
        const T* a = x + (t0 + r) * 2 * d + i;
        const T* b = a + d;
        T* o = out + (t0 + r) * d + i;
        for (int j = 0; j < n; ++j) {
          o[j] = from_float<T>(act(to_float(a[j])) * to_float(b[j]));
        }
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
