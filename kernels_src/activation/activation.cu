// Gated activations: out[t, i] = act(x[t, i]) * x[t, d + i] for x of shape [tokens, 2d], act
// SiLU, GELU (erf) or GELU (tanh), and their backward. T is float, __half or __nv_bfloat16; the
// arithmetic is float32, rounded once to T.
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

// Each activation with its derivative (for the backward kernels).
struct Silu {
  __device__ __forceinline__ float operator()(float x) const { return x / (1.0f + __expf(-x)); }
  __device__ __forceinline__ float grad(float x) const {
    const float s = 1.0f / (1.0f + __expf(-x));
    return s * (1.0f + x * (1.0f - s));
  }
};

struct Gelu {
  // Exact GELU (torch's approximate='none'): 0.5 x (1 + erf(x / sqrt(2))).
  __device__ __forceinline__ float operator()(float x) const {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
  }
  __device__ __forceinline__ float grad(float x) const {
    return 0.5f * (1.0f + erff(x * 0.70710678118654752440f)) +
           x * 0.39894228040143267794f * __expf(-0.5f * x * x);
  }
};

struct GeluTanh {
  // torch's approximate='tanh': 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
  __device__ __forceinline__ float operator()(float x) const {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
  }
  __device__ __forceinline__ float grad(float x) const {
    const float t = tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * 0.79788456080286535588f * (1.0f + 0.134145f * x * x);
  }
};

constexpr int k_elems = 8; // elements per thread and row
constexpr int k_rows = 4;  // rows per thread

// k_elems elements of T as 16-byte words.
template <typename T>
union Pack8 {
  static constexpr int k_words = int(k_elems * sizeof(T) / 16);
  uint4 words[k_words];
  T v[k_elems];
};

__device__ __forceinline__ bool aligned(const void* p) {
  return reinterpret_cast<unsigned long long>(p) % 16 == 0;
}

// a and b: rows of d elements `stride` apart (x and x + d with stride 2d for the [.., 2d] form;
// two tensors with stride d for the two-input form).
template <typename T, typename Act>
__device__ __forceinline__ void act_and_mul(T* __restrict__ out, const T* __restrict__ a_in,
                                            const T* __restrict__ b_in, long long stride, int d,
                                            long long tokens) {
  using Pack = Pack8<T>;
  constexpr int k_words = Pack::k_words;
  const Act act;
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * k_elems;
  if (i >= d) {
    return;
  }
  const bool vectorized = d % k_elems == 0 && aligned(a_in) && aligned(b_in) && aligned(out);
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
          const uint4* a = reinterpret_cast<const uint4*>(a_in + (t0 + r) * stride + i);
          const uint4* b = reinterpret_cast<const uint4*>(b_in + (t0 + r) * stride + i);
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
        const T* a = a_in + (t0 + r) * stride + i;
        const T* b = b_in + (t0 + r) * stride + i;
        T* o = out + (t0 + r) * d + i;
        for (int j = 0; j < n; ++j) {
          o[j] = from_float<T>(act(to_float(a[j])) * to_float(b[j]));
        }
      }
    }
  }
}

// The backward of act_and_mul: with a = a_in[t, i], b = b_in[t, i] and g = grad[t, i],
// da[t, i] = g * b * act'(a) and db[t, i] = g * act(a) (inputs and gradients rows `stride` apart,
// as in act_and_mul). One row per block row (blocks in y loop over rows past 65535), 8 elements a
// thread, 16-byte moves when d and the rows allow.
template <typename T, typename Act>
__device__ __forceinline__ void
act_and_mul_backward(T* __restrict__ da_out, T* __restrict__ db_out, const T* __restrict__ g,
                     const T* __restrict__ a_in, const T* __restrict__ b_in, long long stride,
                     int d, long long tokens) {
  using Pack = Pack8<T>;
  constexpr int k_words = Pack::k_words;
  const Act act;
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * k_elems;
  if (i >= d) {
    return;
  }
  const bool vectorized = d % k_elems == 0 && aligned(a_in) && aligned(b_in) && aligned(g) &&
                          aligned(da_out) && aligned(db_out);
  for (long long t = blockIdx.y; t < tokens; t += gridDim.y) {
    const T* xa = a_in + t * stride + i;
    const T* xb = b_in + t * stride + i;
    const T* gr = g + t * d + i;
    T* da = da_out + t * stride + i;
    T* db = db_out + t * stride + i;
    if (vectorized) {
      Pack pa, pb, pg, oa, ob;
#pragma unroll
      for (int w = 0; w < k_words; ++w) {
        pa.words[w] = reinterpret_cast<const uint4*>(xa)[w];
        pb.words[w] = reinterpret_cast<const uint4*>(xb)[w];
        pg.words[w] = reinterpret_cast<const uint4*>(gr)[w];
      }
#pragma unroll
      for (int j = 0; j < k_elems; ++j) {
        const float a = to_float(pa.v[j]);
        const float gj = to_float(pg.v[j]);
        oa.v[j] = from_float<T>(gj * to_float(pb.v[j]) * act.grad(a));
        ob.v[j] = from_float<T>(gj * act(a));
      }
#pragma unroll
      for (int w = 0; w < k_words; ++w) {
        reinterpret_cast<uint4*>(da)[w] = oa.words[w];
        reinterpret_cast<uint4*>(db)[w] = ob.words[w];
      }
    } else {
      const int n = d - i < k_elems ? d - i : k_elems;
      for (int j = 0; j < n; ++j) {
        const float a = to_float(xa[j]);
        const float gj = to_float(gr[j]);
        da[j] = from_float<T>(gj * to_float(xb[j]) * act.grad(a));
        db[j] = from_float<T>(gj * act(a));
      }
    }
  }
}

} // namespace

template <typename T>
__global__ void silu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int d,
                                    long long tokens) {
  act_and_mul<T, Silu>(out, x, x + d, 2LL * d, d, tokens);
}

template <typename T>
__global__ void gelu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int d,
                                    long long tokens) {
  act_and_mul<T, Gelu>(out, x, x + d, 2LL * d, d, tokens);
}

template <typename T>
__global__ void gelu_tanh_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int d,
                                         long long tokens) {
  act_and_mul<T, GeluTanh>(out, x, x + d, 2LL * d, d, tokens);
}

// act(a) * b of two tensors [tokens, d] (Liger's silu_mul form: no concatenated input).
template <typename T, int ACT>
__global__ void act_mul_kernel(T* __restrict__ out, const T* __restrict__ a,
                               const T* __restrict__ b, int d, long long tokens) {
  if constexpr (ACT == 0) {
    act_and_mul<T, Silu>(out, a, b, d, d, tokens);
  } else if constexpr (ACT == 1) {
    act_and_mul<T, Gelu>(out, a, b, d, d, tokens);
  } else {
    act_and_mul<T, GeluTanh>(out, a, b, d, d, tokens);
  }
}

// The backward kernels. TWO true: da and db from grad, a and b (each [tokens, d]); TWO false:
// dx (shape of x, [tokens, 2d]) from grad and x, passed as da and a (db and b are ignored: the
// halves of dx and x).
template <typename T, int ACT, bool TWO>
__global__ void act_and_mul_backward_kernel(T* da, T* db, const T* g, const T* a, const T* b, int d,
                                            long long tokens) {
  const long long stride = TWO ? d : 2LL * d;
  if constexpr (!TWO) {
    db = da + d;
    b = a + d;
  }
  if constexpr (ACT == 0) {
    act_and_mul_backward<T, Silu>(da, db, g, a, b, stride, d, tokens);
  } else if constexpr (ACT == 1) {
    act_and_mul_backward<T, Gelu>(da, db, g, a, b, stride, d, tokens);
  } else {
    act_and_mul_backward<T, GeluTanh>(da, db, g, a, b, stride, d, tokens);
  }
}
