// Softmax over the last dim (forward, backward) and cross-entropy over large vocabularies
// (forward, backward) for T = float, __half or __nv_bfloat16, float32 arithmetic.
//
// BLOCK threads a row of n elements, read as vectors of VEC elements (16 bytes where the row and
// pointer are aligned, else 1); a block takes one row, but softmax's forward block with BLOCK <=
// 32 takes 128 / BLOCK rows (rows of a few vectors then still fill the SMs). The row's maximum and
// sum of exponentials are found in one pass (online: a new maximum rescales the running sum), per
// thread then across the block; a thread's loop keeps UNROLL vectors' loads in flight.
//
// softmax: ITEMS > 0: thread t keeps vectors t, t + BLOCK, ... (ITEMS of them, as loaded) in
// registers, so the row is read from memory once. ITEMS 0 (rows too long for that): a second
// pass reads the row again (mostly from L2: the block read it just before) and writes
// exp(x - max) / sum. backward: dx = y * (dy - sum(dy * y)), two passes likewise.
//
// cross-entropy: the forward reads each row once and keeps per row lse = log(sum(exp(x))) (a
// hidden output the backward uses) and loss = lse - (1 - eps) x[t] - eps / n sum(x) (eps: label
// smoothing, t: the target), 0 for rows whose target is ignore_index, NaN for a target outside
// [0, n); a second launch sums the rows (and counts those not ignored, for the mean). The
// backward writes (exp(x - lse) - eps / n - (1 - eps) [j == t]) * grad / count without ever
// holding a softmax in the input dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

__device__ __forceinline__ float neg_inf() {
  return __int_as_float(0xff800000);
}

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ void load(float (&dst)[VEC], const T* p) {
  const Vec<T, VEC> v = *reinterpret_cast<const Vec<T, VEC>*>(p);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    dst[j] = static_cast<float>(v.v[j]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store(T* p, const float (&src)[VEC]) {
  Vec<T, VEC> v;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    v.v[j] = T(src[j]);
  }
  *reinterpret_cast<Vec<T, VEC>*>(p) = v;
}

// Vectors of its loop a thread loads before it uses the first (bytes in flight).
constexpr int UNROLL = 4;

template <typename T, int VEC>
__device__ __forceinline__ void to_float(float (&dst)[VEC], const Vec<T, VEC>& v) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    dst[j] = static_cast<float>(v.v[j]);
  }
}

// (max, sum of exp(v - max)) of one vector; (-inf, 0) when every element is -inf (a masked
// part of a row), which merge() then leaves out.
template <int VEC>
__device__ __forceinline__ float2 vector_max_sum(const float (&v)[VEC]) {
  float m = v[0];
#pragma unroll
  for (int j = 1; j < VEC; ++j) {
    m = fmaxf(m, v[j]);
  }
  float s = 0.f;
  if (m != neg_inf()) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      s += __expf(v[j] - m);
    }
  }
  return make_float2(m, s);
}

// (max, sum of exp(x - max)) of two parts.
__device__ __forceinline__ float2 merge(float2 a, float2 b) {
  const float m = fmaxf(a.x, b.x);
  if (m == neg_inf()) {
    return make_float2(m, 0.f);
  }
  return make_float2(m, a.y * __expf(a.x - m) + b.y * __expf(b.x - m));
}

// Rows a block of softmax_kernel takes (its threads: BLOCK * rows_a_block).
template <int BLOCK>
constexpr int rows_a_block = BLOCK <= 32 ? 128 / BLOCK : 1;

template <int BLOCK>
constexpr int threads_a_block = BLOCK <= 32 ? 128 : BLOCK; // BLOCK * rows_a_block

// The (max, sum) over a row's BLOCK threads: the block (BLOCK a multiple of 32), or an aligned
// group of BLOCK lanes of a warp (BLOCK <= 32); `shared` holds 32 float2.
template <int BLOCK>
__device__ __forceinline__ float2 block_max_sum(float2 v, float2* shared) {
#pragma unroll
  for (int o = (BLOCK < 32 ? BLOCK : 32) / 2; o > 0; o >>= 1) {
    float2 other;
    other.x = __shfl_xor_sync(0xffffffffu, v.x, o);
    other.y = __shfl_xor_sync(0xffffffffu, v.y, o);
    v = merge(v, other);
  }
  if constexpr (BLOCK > 32) {
    __syncthreads();
    if (threadIdx.x % 32 == 0) {
      shared[threadIdx.x / 32] = v;
    }
    __syncthreads();
    v = threadIdx.x % 32 < BLOCK / 32 ? shared[threadIdx.x % 32] : make_float2(neg_inf(), 0.f);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float2 other;
      other.x = __shfl_xor_sync(0xffffffffu, v.x, o);
      other.y = __shfl_xor_sync(0xffffffffu, v.y, o);
      v = merge(v, other);
    }
  }
  return v;
}

// The sums over the block of a and b; `shared` holds 32 float2.
template <int BLOCK>
__device__ __forceinline__ float2 block_sum2(float a, float b, float2* shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if constexpr (BLOCK > 32) {
    __syncthreads();
    if (threadIdx.x % 32 == 0) {
      shared[threadIdx.x / 32] = make_float2(a, b);
    }
    __syncthreads();
    const float2 s =
      threadIdx.x % 32 < BLOCK / 32 ? shared[threadIdx.x % 32] : make_float2(0.f, 0.f);
    a = s.x;
    b = s.y;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      a += __shfl_xor_sync(0xffffffffu, a, o);
      b += __shfl_xor_sync(0xffffffffu, b, o);
    }
  }
  return make_float2(a, b);
}

// This thread's (max, sum of exp) of its vectors of row x (n / VEC of them), and the plain sum
// of its elements into `total` (for label smoothing; unused elsewhere, and then optimized away).
// t: the thread's index among the row's BLOCK threads; nv: the row's vectors.
template <typename T, int BLOCK, int VEC>
__device__ __forceinline__ float2 thread_max_sum(const T* __restrict__ x, long long nv, int t,
                                                 float& total) {
  float2 acc = make_float2(neg_inf(), 0.f);
  long long i = t;
  for (; i + (UNROLL - 1) * BLOCK < nv; i += UNROLL * BLOCK) {
    Vec<T, VEC> raw[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      raw[u] = *reinterpret_cast<const Vec<T, VEC>*>(x + (i + u * BLOCK) * VEC);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float v[VEC];
      to_float<T, VEC>(v, raw[u]);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        total += v[j];
      }
      acc = merge(acc, vector_max_sum<VEC>(v));
    }
  }
  for (; i < nv; i += BLOCK) {
    float v[VEC];
    load<T, VEC>(v, x + i * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      total += v[j];
    }
    acc = merge(acc, vector_max_sum<VEC>(v));
  }
  return acc;
}

} // namespace

// Grid: cdiv(rows, rows_a_block); block: BLOCK * rows_a_block threads, BLOCK a row. Threads past
// the last row join the reductions but read and write nothing.
template <typename T, int BLOCK, int VEC, int ITEMS>
__global__ void __launch_bounds__(threads_a_block<BLOCK>)
  softmax_kernel(T* __restrict__ y, const T* __restrict__ x, long long n, long long rows) {
  __shared__ float2 shared[32];
  const long long row =
    static_cast<long long>(blockIdx.x) * rows_a_block<BLOCK> + threadIdx.x / BLOCK;
  const int t = static_cast<int>(threadIdx.x % BLOCK);
  const long long nvl = row < rows ? n / VEC : 0; // the row's vectors
  x += row * n;
  y += row * n;
  if constexpr (ITEMS > 0) {
    const int nv = static_cast<int>(nvl);
    Vec<T, VEC> raw[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = t + k * BLOCK;
      if (i < nv) {
        raw[k] = *reinterpret_cast<const Vec<T, VEC>*>(x + i * VEC);
      }
    }
    float m = neg_inf();
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (t + k * BLOCK < nv) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          m = fmaxf(m, static_cast<float>(raw[k].v[j]));
        }
      }
    }
    float s = 0.f;
    if (m != neg_inf()) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (t + k * BLOCK < nv) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            s += __expf(static_cast<float>(raw[k].v[j]) - m);
          }
        }
      }
    }
    const float2 ms = block_max_sum<BLOCK>(make_float2(m, s), shared);
    const float inv = 1.f / ms.y;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = t + k * BLOCK;
      if (i < nv) {
        float v[VEC];
        to_float<T, VEC>(v, raw[k]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          v[j] = __expf(v[j] - ms.x) * inv;
        }
        store<T, VEC>(y + i * VEC, v);
      }
    }
  } else {
    float unused = 0.f;
    const float2 ms =
      block_max_sum<BLOCK>(thread_max_sum<T, BLOCK, VEC>(x, nvl, t, unused), shared);
    const float inv = 1.f / ms.y;
    for (long long i = t; i < nvl; i += BLOCK) {
      float v[VEC];
      load<T, VEC>(v, x + i * VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[j] = __expf(v[j] - ms.x) * inv;
      }
      store<T, VEC>(y + i * VEC, v);
    }
  }
}

template <typename T, int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
  softmax_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ y,
                          long long n) {
  __shared__ float2 shared[32];
  const long long row = blockIdx.x;
  dx += row * n;
  dy += row * n;
  y += row * n;
  float dot = 0.f;
  for (long long i = threadIdx.x; i < n / VEC; i += BLOCK) {
    float g[VEC];
    float v[VEC];
    load<T, VEC>(g, dy + i * VEC);
    load<T, VEC>(v, y + i * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      dot += g[j] * v[j];
    }
  }
  dot = block_sum2<BLOCK>(dot, 0.f, shared).x;
  for (long long i = threadIdx.x; i < n / VEC; i += BLOCK) {
    float g[VEC];
    float v[VEC];
    load<T, VEC>(g, dy + i * VEC);
    load<T, VEC>(v, y + i * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      g[j] = v[j] * (g[j] - dot);
    }
    store<T, VEC>(dx + i * VEC, g);
  }
}

template <typename T, int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
  cross_entropy_kernel(float* __restrict__ loss, float* __restrict__ lse,
                       const T* __restrict__ logits, const long long* __restrict__ target,
                       long long n, long long ignore_index, float smoothing) {
  __shared__ float2 shared[32];
  const long long row = blockIdx.x;
  const T* x = logits + row * n;
  float sum = 0.f; // of x, for label smoothing
  const float2 acc =
    block_max_sum<BLOCK>(thread_max_sum<T, BLOCK, VEC>(x, n / VEC, threadIdx.x, sum), shared);
  sum = block_sum2<BLOCK>(sum, 0.f, shared).x;
  if (threadIdx.x == 0) {
    const float row_lse = acc.x + __logf(acc.y);
    lse[row] = row_lse;
    const long long t = target[row];
    if (t == ignore_index) {
      loss[row] = 0.f;
    } else if (t < 0 || t >= n) {
      loss[row] = __int_as_float(0x7fc00000); // NaN: a target outside the vocabulary
    } else {
      const float xt = static_cast<float>(x[t]);
      loss[row] = row_lse - (1.f - smoothing) * xt - smoothing / static_cast<float>(n) * sum;
    }
  }
}

// out[0] = the sum of loss over rows (MEAN: divided by the rows not ignored, NaN for none, as
// torch); count[0] = the rows not ignored (MEAN) or 1 (sum).
template <int MEAN>
__global__ void __launch_bounds__(1024)
  cross_entropy_reduce_kernel(float* __restrict__ out, float* __restrict__ count,
                              const float* __restrict__ loss, const long long* __restrict__ target,
                              long long rows, long long ignore_index) {
  __shared__ float2 shared[32];
  float total = 0.f;
  float kept = 0.f;
  for (long long r = threadIdx.x; r < rows; r += 1024) {
    total += loss[r];
    kept += target[r] != ignore_index ? 1.f : 0.f;
  }
  const float2 s = block_sum2<1024>(total, kept, shared);
  if (threadIdx.x == 0) {
    const float c = MEAN ? s.y : 1.f;
    count[0] = c;
    out[0] = s.x / c;
  }
}

template <typename T, int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK)
  cross_entropy_backward_kernel(T* __restrict__ dlogits, const float* __restrict__ grad,
                                const T* __restrict__ logits, const long long* __restrict__ target,
                                const float* __restrict__ lse, const float* __restrict__ count,
                                long long n, long long ignore_index, float smoothing) {
  const long long row = blockIdx.x;
  const T* x = logits + row * n;
  T* dx = dlogits + row * n;
  const long long t = target[row];
  const bool ignored = t == ignore_index;
  const float scale = ignored ? 0.f : grad[0] / count[0];
  const float row_lse = lse[row];
  const float uniform = smoothing / static_cast<float>(n);
  for (long long i = threadIdx.x; i < n / VEC; i += BLOCK) {
    float v[VEC];
    load<T, VEC>(v, x + i * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const long long col = i * VEC + j;
      const float p = __expf(v[j] - row_lse);
      v[j] = (p - uniform - (col == t ? 1.f - smoothing : 0.f)) * scale;
    }
    store<T, VEC>(dx + i * VEC, v);
  }
}
