// Gated activations: out[t, i] = act(a[t, i]) * b[t, i] with act SiLU, GELU (erf) or GELU (tanh),
// and their backward. a and b are either the halves of x [tokens, 2d] (a = x[..., :d],
// b = x[..., d:]; vLLM's silu_and_mul) or two tensors of the output's shape (Liger's silu_mul).
// T is float, __half or __nv_bfloat16; the arithmetic is float32, rounded once to T.
//
// Elementwise over the output's flat index: a thread takes one 16-byte vector (8 elements of a
// 16-bit type, 4 of float) of the output and the matching vectors of a and b, the grid covers the
// whole tensor (cdiv(n, VEC * blockDim.x) blocks; a grid-stride loop past 2^31 - 1 of them), all
// loads before the arithmetic. Measured on an H100 against the form this replaces (8 elements of 4
// rows a thread, a grid of rows / 4): a wave of short threads keeps more loads in flight per SM
// than fewer long ones. Where the pointers are not 16-byte aligned, or d is not a multiple of the
// vector (the concatenated form), the thread moves its elements one at a time. Plain loads and
// stores: the streaming hints (__ldcs/__stcs) measured slower on an H200.
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
// The logistic sigmoid 1 / (1 + e^-z) of SiLU and of tanh GELU, by the fast exponential and the
// fast division (__fdividef, as Triton's and so Liger's and inductor's division is): the IEEE
// division's refinement and slow-path branch, and tanhf's branches, showed in the large forwards.
// Measured in one process on an H100: silu_mul float32 16384 x 8192 531 -> 524 us, gelu_tanh_mul
// bfloat16 273 -> 265 us (Liger 525 and 266), the other rows within 1.3%; two vectors a thread
// were 0.5-3% slower everywhere. Where e^-z overflows, __fdividef(x, inf) is 0, the limit.
__device__ __forceinline__ float times_sigmoid(float x, float z) {
  return __fdividef(x, 1.0f + __expf(-z));
}

struct Silu {
  __device__ __forceinline__ float operator()(float x) const { return times_sigmoid(x, x); }
  __device__ __forceinline__ float grad(float x) const {
    const float s = times_sigmoid(1.0f, x);
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
  // torch's approximate='tanh': 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), as
  // x sigmoid(2u) (0.5 (1 + tanh(u)) = sigmoid(2u)): one exponential and a division instead of
  // tanhf's branches. The derivative, with s = sigmoid(2u): s + x s (1 - s) d(2u)/dx, where
  // d(2u)/dx = 2 sqrt(2 / pi) (1 + 3 * 0.044715 x^2).
  __device__ __forceinline__ static float two_u(float x) {
    return 1.59576912160573071176f * (x + 0.044715f * x * x * x);
  }
  __device__ __forceinline__ float operator()(float x) const { return times_sigmoid(x, two_u(x)); }
  __device__ __forceinline__ float grad(float x) const {
    const float s = times_sigmoid(1.0f, two_u(x));
    return s + x * s * (1.0f - s) * 1.59576912160573071176f * (1.0f + 0.134145f * x * x);
  }
};

template <int ACT>
struct ActOf;
template <>
struct ActOf<0> {
  using type = Silu;
};
template <>
struct ActOf<1> {
  using type = Gelu;
};
template <>
struct ActOf<2> {
  using type = GeluTanh;
};

// One 16-byte vector of T.
template <typename T>
union Vec {
  static constexpr int k_size = int(16 / sizeof(T));
  uint4 word;
  T v[k_size];
};

__device__ __forceinline__ bool aligned(const void* p) {
  return reinterpret_cast<unsigned long long>(p) % 16 == 0;
}

// Where output element e ([tokens, d], contiguous) finds its a; b is d further in the
// concatenated form (CAT: x [tokens, 2d], a at row * 2d + col), at e itself in the other. The
// division is 32-bit where the tensor allows (`narrow`).
template <bool CAT>
__device__ __forceinline__ long long a_offset(long long e, int d, bool narrow) {
  if constexpr (CAT) {
    const long long row = narrow ? static_cast<unsigned>(e) / static_cast<unsigned>(d) : e / d;
    return e + row * d;
  } else {
    return e;
  }
}

// The vectors of the grid-stride loop over n output elements: f(e, vectorized) for each vector's
// first element e, vectorized where a 16-byte move is safe for all of it.
template <typename T, bool CAT, typename F>
__device__ __forceinline__ void for_each_vector(long long n, int d, bool all_aligned, F f) {
  constexpr int k_vec = Vec<T>::k_size;
  const bool whole_rows = !CAT || d % k_vec == 0; // no vector straddles a row of a
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x * k_vec;
  for (long long e = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * k_vec; e < n;
       e += step) {
    f(e, all_aligned && whole_rows && e + k_vec <= n);
  }
}

// U vectors a thread, a block's span (blockDim.x vectors) apart, every load issued before any
// arithmetic: with U > 1 an element's arithmetic (erff: ~25 instructions) runs while the other
// vectors' loads are in flight, as the 4-rows kernel this replaced hid it. The grid covers
// cdiv(n, VEC * blockDim.x * U) (a grid-stride loop past that); the last group of a thread moves
// its elements one at a time where any of its vectors would pass n. Measured (H100, bf16, one
// process): gelu_and_mul 16384 x 8192 291 -> 267 us with U = 2 (torch.compile 267), 4096 x 14336
// 132 -> 122; gelu_mul (two inputs) unchanged, its tuner keeps U = 1 at the large sizes and the
// kernel stays ~8% behind torch.compile there (KERNELS_NOTES.md).
template <typename T, int ACT, bool CAT, int U = 1>
__device__ __forceinline__ void act_and_mul(T* __restrict__ out, const T* __restrict__ a_in,
                                            const T* __restrict__ b_in, int d, long long n) {
  constexpr int k_vec = Vec<T>::k_size;
  const typename ActOf<ACT>::type act;
  const bool narrow = n <= 0xffffffffLL;
  const long long b_shift = CAT ? d : 0;
  const bool vectors = aligned(a_in) && aligned(b_in) && aligned(out) && (!CAT || d % k_vec == 0);
  const long long span = static_cast<long long>(blockDim.x) * k_vec;
  const long long step = static_cast<long long>(gridDim.x) * span * U;
  for (long long e0 = static_cast<long long>(blockIdx.x) * span * U + threadIdx.x * k_vec; e0 < n;
       e0 += step) {
    if (vectors && e0 + (U - 1) * span + k_vec <= n) {
      Vec<T> a[U];
      Vec<T> b[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const long long ai = a_offset<CAT>(e0 + u * span, d, narrow);
        a[u].word = *reinterpret_cast<const uint4*>(a_in + ai);
        b[u].word = *reinterpret_cast<const uint4*>(b_in + ai + b_shift);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        Vec<T> o;
#pragma unroll
        for (int j = 0; j < k_vec; ++j) {
          o.v[j] = from_float<T>(act(to_float(a[u].v[j])) * to_float(b[u].v[j]));
        }
        *reinterpret_cast<uint4*>(out + e0 + u * span) = o.word;
      }
    } else {
      for (int u = 0; u < U; ++u) {
        const long long e = e0 + u * span;
        for (long long k = e; k < n && k < e + k_vec; ++k) {
          const long long ai = a_offset<CAT>(k, d, narrow);
          out[k] = from_float<T>(act(to_float(a_in[ai])) * to_float(b_in[ai + b_shift]));
        }
      }
    }
  }
}

// The backward of act_and_mul: with a, b and the output's gradient g at one element,
// da = g * b * act'(a) and db = g * act(a), written where a and b are read (CAT: the halves of dx).
template <typename T, int ACT, bool CAT>
__device__ __forceinline__ void
act_and_mul_backward(T* __restrict__ da_out, T* __restrict__ db_out, const T* __restrict__ g_in,
                     const T* __restrict__ a_in, const T* __restrict__ b_in, int d, long long n) {
  constexpr int k_vec = Vec<T>::k_size;
  const typename ActOf<ACT>::type act;
  const bool narrow = n <= 0xffffffffLL;
  const long long b_shift = CAT ? d : 0;
  const bool all_aligned =
    aligned(a_in) && aligned(b_in) && aligned(g_in) && aligned(da_out) && aligned(db_out);
  for_each_vector<T, CAT>(n, d, all_aligned, [&](long long e, bool vectorized) {
    if (vectorized) {
      const long long ai = a_offset<CAT>(e, d, narrow);
      Vec<T> a, b, g, da, db;
      a.word = *reinterpret_cast<const uint4*>(a_in + ai);
      b.word = *reinterpret_cast<const uint4*>(b_in + ai + b_shift);
      g.word = *reinterpret_cast<const uint4*>(g_in + e);
#pragma unroll
      for (int j = 0; j < k_vec; ++j) {
        const float x = to_float(a.v[j]);
        const float gj = to_float(g.v[j]);
        da.v[j] = from_float<T>(gj * to_float(b.v[j]) * act.grad(x));
        db.v[j] = from_float<T>(gj * act(x));
      }
      *reinterpret_cast<uint4*>(da_out + ai) = da.word;
      *reinterpret_cast<uint4*>(db_out + ai + b_shift) = db.word;
    } else {
      for (long long k = e; k < n && k < e + k_vec; ++k) {
        const long long ai = a_offset<CAT>(k, d, narrow);
        const float x = to_float(a_in[ai]);
        const float gk = to_float(g_in[k]);
        da_out[ai] = from_float<T>(gk * to_float(b_in[ai + b_shift]) * act.grad(x));
        db_out[ai + b_shift] = from_float<T>(gk * act(x));
      }
    }
  });
}

} // namespace

// The concatenated form: out [tokens, d] from x [tokens, 2d]; n = tokens * d.
template <typename T>
__global__ void silu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int d,
                                    long long n) {
  act_and_mul<T, 0, true>(out, x, x, d, n);
}

// U: vectors a thread (act_and_mul), tuned per size (the manifest's `tune`).
template <typename T, int U>
__global__ void gelu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int d,
                                    long long n) {
  act_and_mul<T, 1, true, U>(out, x, x, d, n);
}

template <typename T>
__global__ void gelu_tanh_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int d,
                                         long long n) {
  act_and_mul<T, 2, true>(out, x, x, d, n);
}

// act(a) * b of two contiguous tensors of n elements (Liger's silu_mul form: no concatenated
// input). At most 40 registers (6 blocks of 256 an SM): the exact GELU at U = 2 took 59 and ran
// 4 blocks, its loads then too few to fill the memory pipe (H100, bf16 16384 x 8192: 288.1 ->
// 267.6 us, torch.compile 265.0; no spills for any ACT or U that the manifest uses; SiLU and the
// tanh GELU take 32 either way). The concatenated kernel above spills under the same bound.
template <typename T, int ACT, int U>
__global__ void __launch_bounds__(256, 6) act_mul_kernel(T* __restrict__ out, const T* __restrict__ a,
                               const T* __restrict__ b, long long n) {
  act_and_mul<T, ACT, false, U>(out, a, b, 0, n);
}

// The backward kernels over the n elements of grad. TWO true: da and db from grad, a and b (each
// of grad's shape; d unused); TWO false: dx (shape of x, [tokens, 2d]) from grad [tokens, d] and x,
// passed as da and a (db and b are not read: the halves of dx and x).
template <typename T, int ACT, bool TWO>
__global__ void act_and_mul_backward_kernel(T* da, T* db, const T* g, const T* a, const T* b, int d,
                                            long long n) {
  if constexpr (TWO) {
    act_and_mul_backward<T, ACT, false>(da, db, g, a, b, d, n);
  } else {
    act_and_mul_backward<T, ACT, true>(da, da, g, a, a, d, n);
  }
}
