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
// Backward kernels: a grid of G blocks (G <= rows), block b taking rows b, b + G, ... (the next
// row's x, dy, rstd and mean in flight while a row is reduced and written, x and dy held as
// stored: 16-bit types take half the registers of their float32 values, which are converted
// again where used); each block sums its rows' weight (and bias) gradients in registers and
// writes them to row b of a [G, n] float32 workspace, which col_sum_kernel reduces.
//
// MODE (RMSNorm's casting mode): 0 "llama": x * rstd rounded to T, then times (weight + offset),
// as Hugging Face's LlamaRMSNorm; 1 "gemma": all float32, rounded once, as GemmaRMSNorm
// (offset = 1: the weight is stored as w - 1).
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
    const float2 s = lane < BLOCK / 32 ? shared[lane] : make_float2(0.f, 0.f);
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

// Row `row` of x and of g (when row < rows) into this thread's registers, as stored (16 bytes a
// vector whatever T is: half the registers of float32 values for 16-bit types).
template <typename T, int BLOCK, int VEC, int ITEMS>
__device__ __forceinline__ void load_rows(Vec<T, VEC> (&xv)[ITEMS], Vec<T, VEC> (&gv)[ITEMS],
                                          const T* __restrict__ x, const T* __restrict__ g,
                                          long long row, long long rows, int n) {
  if (row >= rows) {
    return;
  }
  const int nv = n / VEC;
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

// This thread's vectors of the weight (the same for every row).
template <typename T, int BLOCK, int VEC, int ITEMS>
__device__ __forceinline__ void load_weight(Vec<T, VEC> (&wv)[ITEMS], const T* __restrict__ w,
                                            int n) {
  const int nv = n / VEC;
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

} // namespace

// y = rms_norm(x) * (w + offset); rstd[row] = 1 / sqrt(mean(x^2) + eps).
// Grid: cdiv(rows, rows_a_block); block: BLOCK * rows_a_block threads.
template <typename T, int BLOCK, int VEC, int ITEMS, int MODE>
__global__ void __launch_bounds__(threads_a_block<BLOCK>)
  rms_norm_kernel(T* __restrict__ y, float* __restrict__ rstd, const T* __restrict__ x,
                  const T* __restrict__ w, float eps, float offset, int n, long long rows) {
  __shared__ float2 shared[32];
  const auto [row, t, nv] = row_slot<BLOCK, VEC>(n, rows);
  const T* xr = x + row * n;
  float ss = 0.f;
  if constexpr (ITEMS > 0) {
    float v[ITEMS][VEC];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = t + k * BLOCK;
      if (i < nv) {
        load<T, VEC>(v[k], xr + i * VEC);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          v[k][j] = 0.f;
        }
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        ss += v[k][j] * v[k][j];
      }
    }
    rms_row_registers<T, BLOCK, VEC, ITEMS, MODE>(y, rstd, w, v, ss, eps, offset, n, nv, t, row,
                                                  shared);
  } else {
    for (int i = t; i < nv; i += BLOCK) {
      float v[VEC];
      load<T, VEC>(v, xr + i * VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        ss += v[j] * v[j];
      }
    }
    const float r = rsqrtf(block_sum<BLOCK>(ss, shared) / n + eps);
    if (t == 0 && nv > 0) {
      rstd[row] = r;
    }
    for (int i = t; i < nv; i += BLOCK) {
      float v[VEC];
      float wv[VEC];
      load<T, VEC>(v, xr + i * VEC);
      load<T, VEC>(wv, w + i * VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[j] = rms_out<T, MODE>(v[j] * r, wv[j] + offset);
      }
      store<T, VEC>(y + row * n + i * VEC, v);
    }
  }
}

// residual += x (rounded to T, as vLLM's fused_add_rms_norm); x = rms_norm(residual) * (w +
// offset). Both in place. Grid and block as rms_norm_kernel's.
template <typename T, int BLOCK, int VEC, int ITEMS, int MODE>
__global__ void __launch_bounds__(threads_a_block<BLOCK>)
  fused_add_rms_norm_kernel(T* __restrict__ x, T* __restrict__ residual, float* __restrict__ rstd,
                            const T* __restrict__ w, float eps, float offset, int n,
                            long long rows) {
  __shared__ float2 shared[32];
  const auto [row, t, nv] = row_slot<BLOCK, VEC>(n, rows);
  T* xr = x + row * n;
  T* rr = residual + row * n;
  float ss = 0.f;
  if constexpr (ITEMS > 0) {
    float v[ITEMS][VEC];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = t + k * BLOCK;
      if (i < nv) {
        float a[VEC];
        load<T, VEC>(a, xr + i * VEC);
        load<T, VEC>(v[k], rr + i * VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          v[k][j] = round_to<T>(v[k][j] + a[j]);
        }
        store<T, VEC>(rr + i * VEC, v[k]);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          v[k][j] = 0.f;
        }
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        ss += v[k][j] * v[k][j];
      }
    }
    rms_row_registers<T, BLOCK, VEC, ITEMS, MODE>(x, rstd, w, v, ss, eps, offset, n, nv, t, row,
                                                  shared);
  } else {
    for (int i = t; i < nv; i += BLOCK) {
      float a[VEC];
      float v[VEC];
      load<T, VEC>(a, xr + i * VEC);
      load<T, VEC>(v, rr + i * VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[j] = round_to<T>(v[j] + a[j]);
        ss += v[j] * v[j];
      }
      store<T, VEC>(rr + i * VEC, v);
    }
    const float r = rsqrtf(block_sum<BLOCK>(ss, shared) / n + eps);
    if (t == 0 && nv > 0) {
      rstd[row] = r;
    }
    for (int i = t; i < nv; i += BLOCK) {
      float v[VEC];
      float wv[VEC];
      load<T, VEC>(v, rr + i * VEC); // this thread's own writes
      load<T, VEC>(wv, w + i * VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[j] = rms_out<T, MODE>(v[j] * r, wv[j] + offset);
      }
      store<T, VEC>(xr + i * VEC, v);
    }
  }
}

// RMSNorm backward. With xh = x * rstd and gw = g * (w + offset):
//   dx = rstd * (gw - xh * mean(gw * xh)),  dw = sum over rows of g * xh (xh rounded to T in
//   the llama mode, as the forward multiplies the rounded value).
// Grid: G <= rows blocks; partial: [G, n] float32, row b written by block b.
template <typename T, int BLOCK, int VEC, int ITEMS, int MODE>
__global__ void __launch_bounds__(BLOCK)
  rms_norm_backward_kernel(T* __restrict__ dx, float* __restrict__ partial, const T* __restrict__ g,
                           const T* __restrict__ x, const T* __restrict__ w,
                           const float* __restrict__ rstd, float offset, int n, long long rows) {
  __shared__ float2 shared[32];
  const int nv = n / VEC;
  float* part = partial + static_cast<long long>(blockIdx.x) * n;
  if constexpr (ITEMS > 0) {
    constexpr bool PREFETCH = ITEMS <= 2; // registers for the next row's x and g
    float acc[ITEMS][VEC] = {};
    Vec<T, VEC> xv[ITEMS];
    Vec<T, VEC> gv[ITEMS];
    Vec<T, VEC> wv[ITEMS];
    load_weight<T, BLOCK, VEC, ITEMS>(wv, w, n);
    if constexpr (PREFETCH) {
      load_rows<T, BLOCK, VEC, ITEMS>(xv, gv, x, g, blockIdx.x, rows, n);
    }
    float r = blockIdx.x < rows ? rstd[blockIdx.x] : 0.f;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
      if constexpr (!PREFETCH) {
        load_rows<T, BLOCK, VEC, ITEMS>(xv, gv, x, g, row, rows, n);
      }
      float dot = 0.f;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (threadIdx.x + k * BLOCK < nv) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float xh = static_cast<float>(xv[k].v[j]) * r;
            const float gj = static_cast<float>(gv[k].v[j]);
            acc[k][j] += gj * (MODE == 0 ? round_to<T>(xh) : xh);
            dot += gj * (static_cast<float>(wv[k].v[j]) + offset) * xh;
          }
        }
      }
      // The next row's loads are in flight while this one is reduced and written; the row's
      // float32 values are converted again after the reduction rather than held across it.
      opaque(xv, gv, wv);
      Vec<T, VEC> xn[ITEMS];
      Vec<T, VEC> gn[ITEMS];
      if constexpr (PREFETCH) {
        load_rows<T, BLOCK, VEC, ITEMS>(xn, gn, x, g, row + gridDim.x, rows, n);
      }
      const float r_next = row + gridDim.x < rows ? rstd[row + gridDim.x] : 0.f;
      const float mean = block_sum<BLOCK>(dot, shared) / n;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int i = threadIdx.x + k * BLOCK;
        if (i < nv) {
          float o[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float gw =
              static_cast<float>(gv[k].v[j]) * (static_cast<float>(wv[k].v[j]) + offset);
            o[j] = r * (gw - static_cast<float>(xv[k].v[j]) * r * mean);
          }
          store<T, VEC>(dx + row * n + i * VEC, o);
        }
      }
      if constexpr (PREFETCH) {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
          xv[k] = xn[k];
          gv[k] = gn[k];
        }
      }
      r = r_next;
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = threadIdx.x + k * BLOCK;
      if (i < nv) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          part[i * VEC + j] = acc[k][j];
        }
      }
    }
  } else {
    // Each thread owns the columns of its vectors: no synchronization on the sums.
    extern __shared__ float dynamic_shared[];
    float* acc = ITEMS == 0 ? dynamic_shared : part;
    for (int c = threadIdx.x * VEC; c < n; c += BLOCK * VEC) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        acc[c + j] = 0.f;
      }
    }
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
      const float r = rstd[row];
      float dot = 0.f;
      for (int i = threadIdx.x; i < nv; i += BLOCK) {
        float xv[VEC];
        float gv[VEC];
        float wv[VEC];
        load<T, VEC>(xv, x + row * n + i * VEC);
        load<T, VEC>(gv, g + row * n + i * VEC);
        load<T, VEC>(wv, w + i * VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xh = xv[j] * r;
          const float d = gv[j] * (MODE == 0 ? round_to<T>(xh) : xh);
          acc[i * VEC + j] += d;
          dot += gv[j] * (wv[j] + offset) * xh;
        }
      }
      const float mean = block_sum<BLOCK>(dot, shared) / n;
      for (int i = threadIdx.x; i < nv; i += BLOCK) {
        float xv[VEC];
        float gv[VEC];
        float wv[VEC];
        load<T, VEC>(xv, x + row * n + i * VEC);
        load<T, VEC>(gv, g + row * n + i * VEC);
        load<T, VEC>(wv, w + i * VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          gv[j] = r * (gv[j] * (wv[j] + offset) - xv[j] * r * mean);
        }
        store<T, VEC>(dx + row * n + i * VEC, gv);
      }
    }
    if constexpr (ITEMS == 0) {
      for (int c = threadIdx.x * VEC; c < n; c += BLOCK * VEC) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          part[c + j] = acc[c + j];
        }
      }
    }
  }
}

// y = (x - mean) * rstd * w + b (b absent: HAS_BIAS false); mean and rstd saved per row.
// Grid and block as rms_norm_kernel's.
template <typename T, int BLOCK, int VEC, int ITEMS, bool HAS_BIAS>
__global__ void __launch_bounds__(threads_a_block<BLOCK>)
  layer_norm_kernel(T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                    const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                    float eps, int n, long long rows) {
  __shared__ float2 shared[32];
  const auto [row, t, nv] = row_slot<BLOCK, VEC>(n, rows);
  const T* xr = x + row * n;
  T* yr = y + row * n;
  float mean;
  float r;
  if constexpr (ITEMS > 0) {
    float v[ITEMS][VEC];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = t + k * BLOCK;
      if (i < nv) {
        load<T, VEC>(v[k], xr + i * VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          s += v[k][j];
        }
      }
    }
    mean = block_sum<BLOCK>(s, shared) / n;
    float ss = 0.f; // the variance around the mean, from registers: no cancellation
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = t + k * BLOCK;
      if (i < nv) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          v[k][j] -= mean;
          ss += v[k][j] * v[k][j];
        }
      }
    }
    r = rsqrtf(block_sum<BLOCK>(ss, shared) / n + eps);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = t + k * BLOCK;
      if (i < nv) {
        float wv[VEC];
        float bv[VEC] = {};
        load<T, VEC>(wv, w + i * VEC);
        if constexpr (HAS_BIAS) {
          load<T, VEC>(bv, b + i * VEC);
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          v[k][j] = v[k][j] * r * wv[j] + bv[j];
        }
        store<T, VEC>(yr + i * VEC, v[k]);
      }
    }
  } else {
    float s = 0.f;
    float ss = 0.f;
    for (int i = t; i < nv; i += BLOCK) {
      float v[VEC];
      load<T, VEC>(v, xr + i * VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        s += v[j];
        ss += v[j] * v[j];
      }
    }
    const float2 sums = block_sum2<BLOCK>(s, ss, shared);
    mean = sums.x / n;
    r = rsqrtf(fmaxf(sums.y / n - mean * mean, 0.f) + eps);
    for (int i = t; i < nv; i += BLOCK) {
      float v[VEC];
      float wv[VEC];
      float bv[VEC] = {};
      load<T, VEC>(v, xr + i * VEC);
      load<T, VEC>(wv, w + i * VEC);
      if constexpr (HAS_BIAS) {
        load<T, VEC>(bv, b + i * VEC);
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[j] = (v[j] - mean) * r * wv[j] + bv[j];
      }
      store<T, VEC>(yr + i * VEC, v);
    }
  }
  if (t == 0 && nv > 0) {
    mean_out[row] = mean;
    rstd_out[row] = r;
  }
}

// LayerNorm backward. With xh = (x - mean) * rstd and gw = g * w:
//   dx = rstd * (gw - mean(gw) - xh * mean(gw * xh)),  dw = sum g * xh,  db = sum g.
// Grid: G <= rows blocks; partial_w, partial_b: [G, n] float32, row b written by block b.
template <typename T, int BLOCK, int VEC, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
  layer_norm_backward_kernel(T* __restrict__ dx, float* __restrict__ partial_w,
                             float* __restrict__ partial_b, const T* __restrict__ g,
                             const T* __restrict__ x, const T* __restrict__ w,
                             const float* __restrict__ mean, const float* __restrict__ rstd, int n,
                             long long rows) {
  __shared__ float2 shared[32];
  const int nv = n / VEC;
  float* pw = partial_w + static_cast<long long>(blockIdx.x) * n;
  float* pb = partial_b + static_cast<long long>(blockIdx.x) * n;
  if constexpr (ITEMS > 0) {
    constexpr bool PREFETCH = ITEMS <= 2; // registers for the next row's x and g
    float acc_w[ITEMS][VEC] = {};
    float acc_b[ITEMS][VEC] = {};
    Vec<T, VEC> xv[ITEMS];
    Vec<T, VEC> gv[ITEMS];
    Vec<T, VEC> wv[ITEMS];
    load_weight<T, BLOCK, VEC, ITEMS>(wv, w, n);
    if constexpr (PREFETCH) {
      load_rows<T, BLOCK, VEC, ITEMS>(xv, gv, x, g, blockIdx.x, rows, n);
    }
    float mu = blockIdx.x < rows ? mean[blockIdx.x] : 0.f;
    float r = blockIdx.x < rows ? rstd[blockIdx.x] : 0.f;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
      if constexpr (!PREFETCH) {
        load_rows<T, BLOCK, VEC, ITEMS>(xv, gv, x, g, row, rows, n);
      }
      float s = 0.f;
      float dot = 0.f;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (threadIdx.x + k * BLOCK < nv) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float xh = (static_cast<float>(xv[k].v[j]) - mu) * r;
            const float gj = static_cast<float>(gv[k].v[j]);
            acc_w[k][j] += gj * xh;
            acc_b[k][j] += gj;
            const float gw = gj * static_cast<float>(wv[k].v[j]);
            s += gw;
            dot += gw * xh;
          }
        }
      }
      opaque(xv, gv, wv);
      Vec<T, VEC> xn[ITEMS];
      Vec<T, VEC> gn[ITEMS];
      if constexpr (PREFETCH) {
        load_rows<T, BLOCK, VEC, ITEMS>(xn, gn, x, g, row + gridDim.x, rows, n);
      }
      const bool more = row + gridDim.x < rows;
      const float mu_next = more ? mean[row + gridDim.x] : 0.f;
      const float r_next = more ? rstd[row + gridDim.x] : 0.f;
      const float2 sums = block_sum2<BLOCK>(s, dot, shared);
      const float mean_gw = sums.x / n;
      const float mean_dot = sums.y / n;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int i = threadIdx.x + k * BLOCK;
        if (i < nv) {
          float o[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float xh = (static_cast<float>(xv[k].v[j]) - mu) * r;
            const float gw = static_cast<float>(gv[k].v[j]) * static_cast<float>(wv[k].v[j]);
            o[j] = r * (gw - mean_gw - xh * mean_dot);
          }
          store<T, VEC>(dx + row * n + i * VEC, o);
        }
      }
      if constexpr (PREFETCH) {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
          xv[k] = xn[k];
          gv[k] = gn[k];
        }
      }
      mu = mu_next;
      r = r_next;
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = threadIdx.x + k * BLOCK;
      if (i < nv) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          pw[i * VEC + j] = acc_w[k][j];
          pb[i * VEC + j] = acc_b[k][j];
        }
      }
    }
  } else {
    extern __shared__ float dynamic_shared[];
    float* acc_w = ITEMS == 0 ? dynamic_shared : pw;
    float* acc_b = ITEMS == 0 ? dynamic_shared + n : pb;
    for (int c = threadIdx.x * VEC; c < n; c += BLOCK * VEC) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        acc_w[c + j] = 0.f;
        acc_b[c + j] = 0.f;
      }
    }
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
      const float mu = mean[row];
      const float r = rstd[row];
      float s = 0.f;
      float dot = 0.f;
      for (int i = threadIdx.x; i < nv; i += BLOCK) {
        float xv[VEC];
        float gv[VEC];
        float wv[VEC];
        load<T, VEC>(xv, x + row * n + i * VEC);
        load<T, VEC>(gv, g + row * n + i * VEC);
        load<T, VEC>(wv, w + i * VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xh = (xv[j] - mu) * r;
          const int c = i * VEC + j;
          acc_w[c] += gv[j] * xh;
          acc_b[c] += gv[j];
          s += gv[j] * wv[j];
          dot += gv[j] * wv[j] * xh;
        }
      }
      const float2 sums = block_sum2<BLOCK>(s, dot, shared);
      const float mean_gw = sums.x / n;
      const float mean_dot = sums.y / n;
      for (int i = threadIdx.x; i < nv; i += BLOCK) {
        float xv[VEC];
        float gv[VEC];
        float wv[VEC];
        load<T, VEC>(xv, x + row * n + i * VEC);
        load<T, VEC>(gv, g + row * n + i * VEC);
        load<T, VEC>(wv, w + i * VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          gv[j] = r * (gv[j] * wv[j] - mean_gw - (xv[j] - mu) * r * mean_dot);
        }
        store<T, VEC>(dx + row * n + i * VEC, gv);
      }
    }
    if constexpr (ITEMS == 0) {
      for (int c = threadIdx.x * VEC; c < n; c += BLOCK * VEC) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          pw[c + j] = acc_w[c + j];
          pb[c + j] = acc_b[c + j];
        }
      }
    }
  }
}

// out[c] = sum over b < G of partial[b, c], rounded to T. Block (32, 32): 32 columns, 32 row
// strides (a warp a stride, each with 4 loads in flight: the sum is a few microseconds of a
// latency-bound read), summed through shared memory. Grid: cdiv(n, 32). G == 0 gives zeros.
template <typename T>
__global__ void __launch_bounds__(1024)
  col_sum_kernel(T* __restrict__ out, const float* __restrict__ partial, int groups, int n) {
  __shared__ float s[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float sum = 0.f;
  if (c < n) {
#pragma unroll 4
    for (int b = threadIdx.y; b < groups; b += 32) {
      sum += partial[static_cast<long long>(b) * n + c];
    }
  }
  s[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
#pragma unroll
    for (int y = 1; y < 32; ++y) {
      sum += s[y][threadIdx.x];
    }
    out[c] = T(sum);
  }
}
