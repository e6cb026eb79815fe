// Softmax over the last dim (forward, backward) and cross-entropy over large vocabularies
// (forward, backward) for T = float, __half or __nv_bfloat16, float32 arithmetic.
// One file of about 640 lines: the four kernels' families share its row machinery (vectors,
// reductions, clusters).
//
// BLOCK threads a row of n elements, read as vectors of VEC elements (16 bytes where the row and
// pointer are aligned, else 1); a block takes one row, but softmax's forward block with BLOCK <=
// 32 takes 128 / BLOCK rows (rows of a few vectors then still fill the SMs). A row read twice
// finds its maximum and sum of exponentials in one pass (online: a new maximum rescales the
// running sum), per thread then across the block; a thread's loop keeps UNROLL vectors' loads in
// flight. A row kept in registers (ITEMS > 0, one block) takes the maximum, then the sum, as two
// plain reductions: the online merge puts two exponentials on each step of the reduction's chain,
// which is what a call of a few rows waits for.
//
// softmax: ITEMS > 0: thread t keeps vectors t, t + BLOCK, ... (ITEMS of them, as loaded) in
// registers, so the row is read from memory once. ITEMS 0 (rows too long for that): a second
// pass reads the row again (from L2 where the rows in flight fit there) and writes
// exp(x - max) / sum. backward: dx = y * (dy - sum(dy * y)), dy and y kept in registers or read
// twice likewise. The *_cluster kernels (sm_90 on) split a long row over a cluster of 8 blocks
// (below, "Thread block clusters"): the rows in flight then fit in L2, or in registers.
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

// op(v, ...) over a row's BLOCK threads (op associative and commutative: fmaxf, a sum), as
// block_max_sum; the cross-warp stage reads the BLOCK / 32 warps' values into every group of
// BLOCK / 32 lanes, so log2(BLOCK / 32) levels give every lane the result.
template <int BLOCK, typename Op>
__device__ __forceinline__ float block_reduce(float v, float2* shared, Op op) {
#pragma unroll
  for (int o = (BLOCK < 32 ? BLOCK : 32) / 2; o > 0; o >>= 1) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  if constexpr (BLOCK > 32) {
    constexpr int W = BLOCK / 32;
    __syncthreads();
    if (threadIdx.x % 32 == 0) {
      shared[threadIdx.x / 32].x = v;
    }
    __syncthreads();
    v = shared[threadIdx.x % W].x;
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
      v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
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

// Thread block clusters (sm_90 on): a row too long for one block's registers is split over the
// CLUSTER blocks of a cluster, each of which keeps its part in registers (or reads it twice,
// from L2: a part is an eighth of the row), and the blocks exchange their partial reductions
// through distributed shared memory. The row is then read from memory once where one block
// would read it twice, and a 128k-vocabulary row is never larger than L2 holds.
constexpr int CLUSTER = 8;

#if __CUDA_ARCH__ >= 900
#  define KJIT_CLUSTER_DIMS __cluster_dims__(CLUSTER, 1, 1)
#else
#  define KJIT_CLUSTER_DIMS
#endif

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank = 0;
#if __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
#endif
  return rank;
}

// Arrive: this block's shared memory writes are visible to the cluster; wait: every block of
// the cluster has arrived. A block waits before it exits, so that no block reads the shared
// memory of one that is gone.
__device__ __forceinline__ void cluster_arrive() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// `part` of the cluster's block `rank`.
__device__ __forceinline__ float2 cluster_load(const float2* part, unsigned rank) {
  float2 v = make_float2(0.f, 0.f);
#if __CUDA_ARCH__ >= 900
  const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(part));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
               : "=f"(v.x), "=f"(v.y)
               : "r"(remote)
               : "memory");
#endif
  return v;
}

// Every block's `mine` combined over the cluster (MAX_SUM: merge()d (max, sum) pairs, else sums),
// for all threads of all blocks. Leaves the cluster arrived at its second barrier: the caller
// waits at it (cluster_wait) before it exits.
template <bool MAX_SUM>
__device__ __forceinline__ float2 cluster_combine(float2* part, float2 mine) {
  if (threadIdx.x == 0) {
    *part = mine;
  }
  cluster_arrive();
  cluster_wait();
  // Lane r of each warp reads block r's part; the 8 lanes then combine theirs.
  const unsigned lane = threadIdx.x % 32;
  float2 v = MAX_SUM ? make_float2(neg_inf(), 0.f) : make_float2(0.f, 0.f);
  if (lane < CLUSTER) {
    v = cluster_load(part, lane);
  }
#pragma unroll
  for (int o = CLUSTER / 2; o > 0; o >>= 1) {
    float2 other;
    other.x = __shfl_xor_sync(0xffffffffu, v.x, o);
    other.y = __shfl_xor_sync(0xffffffffu, v.y, o);
    v = MAX_SUM ? merge(v, other) : make_float2(v.x + other.x, v.y + other.y);
  }
  v.x = __shfl_sync(0xffffffffu, v.x, 0);
  v.y = __shfl_sync(0xffffffffu, v.y, 0);
  cluster_arrive();
  return v;
}

// A row's softmax over the vectors [0, nv) of x and y (a row, or a cluster block's part of one):
// t is the thread's index among the row's BLOCK threads. With CLUSTER > 1 the (max, sum) of the
// parts is combined over the cluster (`part`: this block's slot) before anything is written.
template <typename T, int BLOCK, int VEC, int ITEMS, int CLUSTER>
__device__ __forceinline__ void softmax_row(T* __restrict__ y, const T* __restrict__ x,
                                            long long nvl, int t, float2* shared, float2* part) {
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
    float2 ms;
    if constexpr (CLUSTER == 1) {
      // The row's maximum, then its sum of exp(x - max): two plain reductions where the online
      // merge (two exponentials a step) would sit on the chain.
      ms.x = block_reduce<BLOCK>(m, shared, [](float x, float y) { return fmaxf(x, y); });
      float s = 0.f;
      if (ms.x != neg_inf()) {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
          if (t + k * BLOCK < nv) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
              s += __expf(static_cast<float>(raw[k].v[j]) - ms.x);
            }
          }
        }
      }
      ms.y = block_reduce<BLOCK>(s, shared, [](float x, float y) { return x + y; });
    } else {
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
      ms = cluster_combine<true>(part, block_max_sum<BLOCK>(make_float2(m, s), shared));
    }
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
    float2 ms = block_max_sum<BLOCK>(thread_max_sum<T, BLOCK, VEC>(x, nvl, t, unused), shared);
    if constexpr (CLUSTER > 1) {
      ms = cluster_combine<true>(part, ms);
    }
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

// dx = y * (dy - sum(dy * y)) over the vectors [0, nv) of a row (or a cluster block's part).
template <typename T, int BLOCK, int VEC, int ITEMS, int CLUSTER>
__device__ __forceinline__ void softmax_backward_row(T* __restrict__ dx, const T* __restrict__ dy,
                                                     const T* __restrict__ y, long long nvl,
                                                     float2* shared, float2* part) {
  const int t = static_cast<int>(threadIdx.x);
  if constexpr (ITEMS > 0) {
    const int nv = static_cast<int>(nvl);
    Vec<T, VEC> raw_g[ITEMS];
    Vec<T, VEC> raw_y[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = t + k * BLOCK;
      if (i < nv) {
        raw_g[k] = *reinterpret_cast<const Vec<T, VEC>*>(dy + i * VEC);
        raw_y[k] = *reinterpret_cast<const Vec<T, VEC>*>(y + i * VEC);
      }
    }
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (t + k * BLOCK < nv) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          dot += static_cast<float>(raw_g[k].v[j]) * static_cast<float>(raw_y[k].v[j]);
        }
      }
    }
    float2 total = block_sum2<BLOCK>(dot, 0.f, shared);
    if constexpr (CLUSTER > 1) {
      total = cluster_combine<false>(part, total);
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = t + k * BLOCK;
      if (i < nv) {
        float g[VEC];
        float v[VEC];
        to_float<T, VEC>(g, raw_g[k]);
        to_float<T, VEC>(v, raw_y[k]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          g[j] = v[j] * (g[j] - total.x);
        }
        store<T, VEC>(dx + i * VEC, g);
      }
    }
  } else {
    float dot = 0.f;
    long long i = t;
    for (; i + (UNROLL - 1) * BLOCK < nvl; i += UNROLL * BLOCK) {
      Vec<T, VEC> raw_g[UNROLL];
      Vec<T, VEC> raw_y[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        raw_g[u] = *reinterpret_cast<const Vec<T, VEC>*>(dy + (i + u * BLOCK) * VEC);
        raw_y[u] = *reinterpret_cast<const Vec<T, VEC>*>(y + (i + u * BLOCK) * VEC);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          dot += static_cast<float>(raw_g[u].v[j]) * static_cast<float>(raw_y[u].v[j]);
        }
      }
    }
    for (; i < nvl; i += BLOCK) {
      float g[VEC];
      float v[VEC];
      load<T, VEC>(g, dy + i * VEC);
      load<T, VEC>(v, y + i * VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        dot += g[j] * v[j];
      }
    }
    float2 total = block_sum2<BLOCK>(dot, 0.f, shared);
    if constexpr (CLUSTER > 1) {
      total = cluster_combine<false>(part, total);
    }
    for (long long i = t; i < nvl; i += BLOCK) {
      float g[VEC];
      float v[VEC];
      load<T, VEC>(g, dy + i * VEC);
      load<T, VEC>(v, y + i * VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        g[j] = v[j] * (g[j] - total.x);
      }
      store<T, VEC>(dx + i * VEC, g);
    }
  }
}

// This cluster block's part of a row of nv vectors: [first, first + count).
__device__ __forceinline__ long long cluster_part(long long nv, long long& count) {
  const long long per = (nv + CLUSTER - 1) / CLUSTER;
  const long long first = min(nv, static_cast<long long>(cluster_rank()) * per);
  count = min(nv - first, per);
  return first;
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
  const long long nv = row < rows ? n / VEC : 0;
  softmax_row<T, BLOCK, VEC, ITEMS, 1>(y + row * n, x + row * n, nv, threadIdx.x % BLOCK, shared,
                                       nullptr);
}

// Grid: rows * CLUSTER; a cluster a row (rows too long for one block's registers, sm_90 on).
template <typename T, int BLOCK, int VEC, int ITEMS>
__global__ void KJIT_CLUSTER_DIMS __launch_bounds__(BLOCK)
  softmax_cluster_kernel(T* __restrict__ y, const T* __restrict__ x, long long n) {
#if __CUDA_ARCH__ >= 900
  __shared__ float2 shared[32];
  __shared__ float2 part;
  const long long row = blockIdx.x / CLUSTER;
  long long count;
  const long long first = cluster_part(n / VEC, count);
  softmax_row<T, BLOCK, VEC, ITEMS, CLUSTER>(y + row * n + first * VEC, x + row * n + first * VEC,
                                             count, threadIdx.x, shared, &part);
  cluster_wait(); // the others have read `part`
#else
  __trap();
#endif
}

// Grid: rows; block: BLOCK threads a row.
template <typename T, int BLOCK, int VEC, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
  softmax_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ y,
                          long long n) {
  __shared__ float2 shared[32];
  const long long row = blockIdx.x;
  softmax_backward_row<T, BLOCK, VEC, ITEMS, 1>(dx + row * n, dy + row * n, y + row * n, n / VEC,
                                                shared, nullptr);
}

// Grid: rows * CLUSTER; a cluster a row, as softmax_cluster_kernel.
template <typename T, int BLOCK, int VEC, int ITEMS>
__global__ void KJIT_CLUSTER_DIMS __launch_bounds__(BLOCK)
  softmax_backward_cluster_kernel(T* __restrict__ dx, const T* __restrict__ dy,
                                  const T* __restrict__ y, long long n) {
#if __CUDA_ARCH__ >= 900
  __shared__ float2 shared[32];
  __shared__ float2 part;
  const long long row = blockIdx.x / CLUSTER;
  long long count;
  const long long at = row * n + cluster_part(n / VEC, count) * VEC;
  softmax_backward_row<T, BLOCK, VEC, ITEMS, CLUSTER>(dx + at, dy + at, y + at, count, shared,
                                                      &part);
  cluster_wait();
#else
  __trap();
#endif
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
