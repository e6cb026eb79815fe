// Row normalizations of LLMs: RMSNorm (forward, backward, with a fused residual add) and LayerNorm
// (forward, backward), for T = float, __half or __nv_bfloat16, float32 arithmetic.
//
// Rows are the last dimension (n elements; rows = numel / n). A row is read as vectors of VEC
// elements (16 bytes when the manifest finds the pointers and n aligned, else one element).
// ITEMS > 0: thread t of a BLOCK-thread block keeps vectors t, t + BLOCK, ... (ITEMS of them) in
// registers, so a row is read from memory once. ITEMS <= 0: rows too long for registers are read
// twice (the second time mostly from L2); the backward kernels then sum the weight gradients in
// dynamic shared memory (ITEMS 0) or, rows too long for that, in the workspace (ITEMS -1).
//
// Forward kernels: BLOCK threads a row; a block takes one row, or with BLOCK <= 32 it takes
// 128 / BLOCK rows (rows_a_block: a row of a few vectors then still fills the SMs), the last
// block's threads past the last row joining its reductions but reading and writing nothing.
// With LOOP (the register path) a grid of fewer blocks loops over the row groups, the next
// group's loads issued before this one is reduced and written (loop_row_groups).
// Backward kernels: a grid of G blocks (G <= rows), block b taking rows b, b + G, ... (the next
// row's x, dy, rstd and mean in flight while a row is reduced and written, x and dy held as
// stored: 16-bit types take half the registers of their float32 values, which are converted
// again where used); each block sums its rows' weight (and bias) gradients in registers and
// writes them to row b of a [G, n] float32 workspace, which col_sum_kernel reduces. Their
// *_cluster variants (sm_90 on) split each row over the blocks of a cluster (below).
//
// MODE (RMSNorm's casting mode): 0 "llama": x * rstd rounded to T, then times (weight + offset),
// as Hugging Face's LlamaRMSNorm; 1 "gemma": all float32, rounded once, as GemmaRMSNorm
// (offset = 1: the weight is stored as w - 1).
//
// This header holds what the forward (norm.cu) and backward (norm_backward.cu) kernels share:
// vector loads and stores, the block reductions and the forward's row layout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

// The value T would hold.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return static_cast<float>(T(v)); // T(float) rounds to nearest
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

// Rows a block of a forward kernel takes (its threads: BLOCK * rows_a_block).
template <int BLOCK>
constexpr int rows_a_block = BLOCK <= 32 ? 128 / BLOCK : 1;

template <int BLOCK>
constexpr int threads_a_block = BLOCK <= 32 ? 128 : BLOCK; // BLOCK * rows_a_block

// The sums of a and b over a row's BLOCK threads: the block (BLOCK a multiple of 32), or an
// aligned group of BLOCK lanes of a warp (BLOCK <= 32); `shared` holds 32 float2.
template <int BLOCK>
__device__ __forceinline__ float2 block_sum2(float a, float b, float2* shared) {
#pragma unroll
  for (int o = (BLOCK < 32 ? BLOCK : 32) / 2; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if constexpr (BLOCK > 32) {
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    __syncthreads(); // the previous use of `shared` is over
    if (lane == 0) {
      shared[warp] = make_float2(a, b);
    }
    __syncthreads();
    // Every group of BLOCK / 32 lanes reads the warps' sums, so log2(BLOCK / 32) steps give
    // every lane the total (5 steps over 32 lanes waited longer for a call of a few rows).
    constexpr int W = BLOCK / 32;
    const float2 s = shared[lane % W];
    a = s.x;
    b = s.y;
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
      a += __shfl_xor_sync(0xffffffffu, a, o);
      b += __shfl_xor_sync(0xffffffffu, b, o);
    }
  }
  return make_float2(a, b);
}

template <int BLOCK>
__device__ __forceinline__ float block_sum(float a, float2* shared) {
  return block_sum2<BLOCK>(a, 0.f, shared).x;
}

// A forward kernel's thread: its row, its index t among the row's BLOCK threads, and the row's
// vectors (0 past the last row: such a thread only joins the reductions).
struct RowSlot {
  long long row;
  int t;
  int nv;
};

template <int BLOCK, int VEC>
__device__ __forceinline__ RowSlot row_slot(int n, long long rows) {
  const long long row =
    static_cast<long long>(blockIdx.x) * rows_a_block<BLOCK> + threadIdx.x / BLOCK;
  return {row, static_cast<int>(threadIdx.x % BLOCK), row < rows ? n / VEC : 0};
}

// The LOOP schedule of a forward kernel's register path: block b takes row groups (rows_a_block
// rows each) b, b + gridDim.x, ...; load(state, row) fetches a row's vectors into registers (as
// stored), and is issued for the next group before body(state, row) reduces and writes this one
// (row past the last: body reads and writes nothing but joins the reductions).
template <int BLOCK, typename State, typename Load, typename Body>
__device__ __forceinline__ void loop_row_groups(long long rows, Load load, Body body) {
  constexpr int R = rows_a_block<BLOCK>;
  const long long step = static_cast<long long>(gridDim.x) * R;
  long long row = static_cast<long long>(blockIdx.x) * R + threadIdx.x / BLOCK;
  State cur;
  if (row < rows) {
    load(cur, row);
  }
  for (long long first = static_cast<long long>(blockIdx.x) * R; first < rows;
       first += step, row += step) {
    State next;
    if (row + step < rows) {
      load(next, row + step);
    }
    body(cur, row);
    cur = next;
  }
}

// Row `row` of x and of g (when row < rows; rows n elements apart, nv vectors of each read) into
// this thread's registers, as stored (16 bytes a vector whatever T is: half the registers of
// float32 values for 16-bit types).
template <typename T, int BLOCK, int VEC, int ITEMS>
__device__ __forceinline__ void load_rows(Vec<T, VEC> (&xv)[ITEMS], Vec<T, VEC> (&gv)[ITEMS],
                                          const T* __restrict__ x, const T* __restrict__ g,
                                          long long row, long long rows, int n, int nv) {
  if (row >= rows) {
    return;
  }
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int i = threadIdx.x + k * BLOCK;
    if (i < nv) {
      xv[k] = *reinterpret_cast<const Vec<T, VEC>*>(x + row * n + i * VEC);
      gv[k] = *reinterpret_cast<const Vec<T, VEC>*>(g + row * n + i * VEC);
    }
  }
}

// Hides v's value from the compiler, so that a float32 conversion of it is redone after this
// point rather than kept live in registers from before it (16-byte vectors: 4 words).
template <typename T, int VEC>
__device__ __forceinline__ void opaque(Vec<T, VEC>& v) {
  static_assert(sizeof(v) % 4 == 0, "16-byte vectors only");
  auto* words = reinterpret_cast<unsigned*>(&v);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(v) / 4); ++i) {
    asm volatile("" : "+r"(words[i]));
  }
}

template <typename T, int VEC, int ITEMS>
__device__ __forceinline__ void opaque(Vec<T, VEC> (&x)[ITEMS], Vec<T, VEC> (&g)[ITEMS],
                                       Vec<T, VEC> (&w)[ITEMS]) {
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    opaque(x[k]);
    opaque(g[k]);
    opaque(w[k]);
  }
}

// This thread's vectors of the weight (the same for every row; nv of them read).
template <typename T, int BLOCK, int VEC, int ITEMS>
__device__ __forceinline__ void load_weight(Vec<T, VEC> (&wv)[ITEMS], const T* __restrict__ w,
                                            int nv) {
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int i = threadIdx.x + k * BLOCK;
    if (i < nv) {
      wv[k] = *reinterpret_cast<const Vec<T, VEC>*>(w + i * VEC);
    }
  }
}

template <typename T, int MODE>
__device__ __forceinline__ float rms_out(float normed, float weight) {
  return MODE == 0 ? round_to<T>(normed) * weight : normed * weight;
}

// The RMSNorm of one row held in registers (v: the row, read from x or from x + residual).
template <typename T, int BLOCK, int VEC, int ITEMS, int MODE>
__device__ __forceinline__ void rms_row_registers(T* __restrict__ y, float* __restrict__ rstd,
                                                  const T* __restrict__ w, float (&v)[ITEMS][VEC],
                                                  float ss, float eps, float offset, int n, int nv,
                                                  int t, long long row, float2* shared) {
  // Up to 2 vectors a thread, the weights are loaded before the reduction, which hides their
  // latency; with more, the registers they take would cost occupancy.
  float wv[ITEMS][VEC];
  if constexpr (ITEMS <= 2) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = t + k * BLOCK;
      if (i < nv) {
        load<T, VEC>(wv[k], w + i * VEC);
      }
    }
  }
  const float r = rsqrtf(block_sum<BLOCK>(ss, shared) / n + eps);
  if (t == 0 && nv > 0) {
    rstd[row] = r;
  }
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int i = t + k * BLOCK;
    if (i < nv) {
      if constexpr (ITEMS > 2) {
        load<T, VEC>(wv[k], w + i * VEC);
      }
      float o[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        o[j] = rms_out<T, MODE>(v[k][j] * r, wv[k][j] + offset);
      }
      store<T, VEC>(y + row * n + i * VEC, o);
    }
  }
}

// Thread block clusters (sm_90 on): the backward kernels' *_cluster variants split a long row
// over the CL blocks of a cluster, each keeping its part of the row (and of the weight-gradient
// sums) in registers, and sum their partial reductions through distributed shared memory. A
// block's work a row is then a CL-th of it: CL times the blocks an SM holds at once.
#if __CUDA_ARCH__ >= 900
#  define KJIT_CLUSTER_DIMS(n) __cluster_dims__(n, 1, 1)
#else
#  define KJIT_CLUSTER_DIMS(n)
#endif

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank = 0;
#if __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
#endif
  return rank;
}

// Every block of the cluster arrives (its shared memory writes visible to the others) and waits
// for the others.
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// The sum over the cluster's CL blocks of each one's `mine` (the same in all its threads), for
// all threads. `slot`: this block's shared float2 for this call; the caller alternates two, so a
// block that runs ahead to the next call never overwrites a slot another block still reads (it
// cannot pass that call's barrier before the others have read this one).
template <int CL>
__device__ __forceinline__ float2 cluster_sum(float2 mine, float2* slot) {
  if (threadIdx.x == 0) {
    *slot = mine;
  }
  cluster_sync();
  const unsigned lane = threadIdx.x % 32;
  float2 v = make_float2(0.f, 0.f);
#if __CUDA_ARCH__ >= 900
  if (lane < CL) {
    const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(slot));
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(lane));
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"(remote)
                 : "memory");
  }
#endif
#pragma unroll
  for (int o = CL / 2; o > 0; o >>= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
  }
  v.x = __shfl_sync(0xffffffffu, v.x, 0);
  v.y = __shfl_sync(0xffffffffu, v.y, 0);
  return v;
}

// The part of a row of nv vectors that block `rank` of a CL-block cluster takes:
// [first, first + count).
template <int CL>
__device__ __forceinline__ int row_part(int nv, int& count) {
  const int per = (nv + CL - 1) / CL;
  const int first = min(nv, static_cast<int>(cluster_rank()) * per);
  count = min(nv - first, per);
  return first;
}

} // namespace
