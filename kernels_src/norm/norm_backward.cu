// The backward kernels of the norm package (RMSNorm, LayerNorm) and the column sum that
// reduces their weight-gradient partials. The launch rules and the shared helpers are in
// norm_common.cuh.
#include "norm_common.cuh"

// The register path of the RMSNorm backward (ITEMS > 0) over nv vectors of each row (the
// pointers at the first of them, rows n elements apart): rows first_row, first_row + step, ...;
// `part` gets their weight-gradient sums. CL > 1: the vectors are one block's part of the rows of
// a CL-block cluster, each row's dot summed over the cluster (slots: two shared float2).
template <typename T, int BLOCK, int VEC, int ITEMS, int MODE, int CL>
__device__ __forceinline__ void
rms_backward_registers(T* __restrict__ dx, float* __restrict__ part, const T* __restrict__ g,
                       const T* __restrict__ x, const T* __restrict__ w,
                       const float* __restrict__ rstd, float offset, int n, int nv, long long rows,
                       long long first_row, long long step, float2* shared, float2* slots) {
  constexpr bool PREFETCH = ITEMS <= 2; // registers for the next row's x and g
  float acc[ITEMS][VEC] = {};
  Vec<T, VEC> xv[ITEMS];
  Vec<T, VEC> gv[ITEMS];
  Vec<T, VEC> wv[ITEMS];
  load_weight<T, BLOCK, VEC, ITEMS>(wv, w, nv);
  if constexpr (PREFETCH) {
    load_rows<T, BLOCK, VEC, ITEMS>(xv, gv, x, g, first_row, rows, n, nv);
  }
  float r = first_row < rows ? rstd[first_row] : 0.f;
  int p = 0; // the cluster slot of this row (CL > 1)
  for (long long row = first_row; row < rows; row += step) {
    if constexpr (!PREFETCH) {
      load_rows<T, BLOCK, VEC, ITEMS>(xv, gv, x, g, row, rows, n, nv);
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
      load_rows<T, BLOCK, VEC, ITEMS>(xn, gn, x, g, row + step, rows, n, nv);
    }
    const float r_next = row + step < rows ? rstd[row + step] : 0.f;
    float total = block_sum<BLOCK>(dot, shared);
    if constexpr (CL > 1) {
      total = cluster_sum<CL>(make_float2(total, 0.f), slots + p).x;
      p ^= 1;
    }
    const float mean = total / n;
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
}

// The register path of the LayerNorm backward (ITEMS > 0), as rms_backward_registers: part_w
// and part_b get the weight and bias gradients' sums; CL > 1 sums each row's two reductions over
// the cluster.
template <typename T, int BLOCK, int VEC, int ITEMS, int CL>
__device__ __forceinline__ void layer_norm_backward_registers(
  T* __restrict__ dx, float* __restrict__ part_w, float* __restrict__ part_b,
  const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
  const float* __restrict__ mean, const float* __restrict__ rstd, int n, int nv, long long rows,
  long long first_row, long long step, float2* shared, float2* slots) {
  constexpr bool PREFETCH = ITEMS <= 2; // registers for the next row's x and g
  float acc_w[ITEMS][VEC] = {};
  float acc_b[ITEMS][VEC] = {};
  Vec<T, VEC> xv[ITEMS];
  Vec<T, VEC> gv[ITEMS];
  Vec<T, VEC> wv[ITEMS];
  load_weight<T, BLOCK, VEC, ITEMS>(wv, w, nv);
  if constexpr (PREFETCH) {
    load_rows<T, BLOCK, VEC, ITEMS>(xv, gv, x, g, first_row, rows, n, nv);
  }
  float mu = first_row < rows ? mean[first_row] : 0.f;
  float r = first_row < rows ? rstd[first_row] : 0.f;
  int p = 0; // the cluster slot of this row (CL > 1)
  for (long long row = first_row; row < rows; row += step) {
    if constexpr (!PREFETCH) {
      load_rows<T, BLOCK, VEC, ITEMS>(xv, gv, x, g, row, rows, n, nv);
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
      load_rows<T, BLOCK, VEC, ITEMS>(xn, gn, x, g, row + step, rows, n, nv);
    }
    const bool more = row + step < rows;
    const float mu_next = more ? mean[row + step] : 0.f;
    const float r_next = more ? rstd[row + step] : 0.f;
    float2 sums = block_sum2<BLOCK>(s, dot, shared);
    if constexpr (CL > 1) {
      sums = cluster_sum<CL>(sums, slots + p);
      p ^= 1;
    }
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
        part_w[i * VEC + j] = acc_w[k][j];
        part_b[i * VEC + j] = acc_b[k][j];
      }
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
    rms_backward_registers<T, BLOCK, VEC, ITEMS, MODE, 1>(
      dx, part, g, x, w, rstd, offset, n, nv, rows, blockIdx.x, gridDim.x, shared, nullptr);
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
    layer_norm_backward_registers<T, BLOCK, VEC, ITEMS, 1>(
      dx, pw, pb, g, x, w, mean, rstd, n, nv, rows, blockIdx.x, gridDim.x, shared, nullptr);
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

// The register paths with each row split over a cluster of CL blocks (sm_90 on; a trap before):
// grid CL * G, cluster c (of G <= rows) taking rows c, c + G, ..., its block `rank` the rank-th
// CL-th of each (row_part); partial: [G, n] as the kernels above, row c written by cluster c.
template <typename T, int BLOCK, int VEC, int ITEMS, int MODE, int CL>
__global__ void KJIT_CLUSTER_DIMS(CL) __launch_bounds__(BLOCK)
  rms_norm_backward_cluster_kernel(T* __restrict__ dx, float* __restrict__ partial,
                                   const T* __restrict__ g, const T* __restrict__ x,
                                   const T* __restrict__ w, const float* __restrict__ rstd,
                                   float offset, int n, long long rows) {
#if __CUDA_ARCH__ >= 900
  __shared__ float2 shared[32];
  __shared__ float2 slots[2];
  int count;
  const long long off = static_cast<long long>(row_part<CL>(n / VEC, count)) * VEC;
  const long long cluster = blockIdx.x / CL;
  rms_backward_registers<T, BLOCK, VEC, ITEMS, MODE, CL>(
    dx + off, partial + cluster * n + off, g + off, x + off, w + off, rstd, offset, n, count, rows,
    cluster, gridDim.x / CL, shared, slots);
  cluster_sync(); // no block leaves while another may read its slots
#else
  __trap();
#endif
}

template <typename T, int BLOCK, int VEC, int ITEMS, int CL>
__global__ void KJIT_CLUSTER_DIMS(CL) __launch_bounds__(BLOCK)
  layer_norm_backward_cluster_kernel(T* __restrict__ dx, float* __restrict__ partial_w,
                                     float* __restrict__ partial_b, const T* __restrict__ g,
                                     const T* __restrict__ x, const T* __restrict__ w,
                                     const float* __restrict__ mean, const float* __restrict__ rstd,
                                     int n, long long rows) {
#if __CUDA_ARCH__ >= 900
  __shared__ float2 shared[32];
  __shared__ float2 slots[2];
  int count;
  const long long off = static_cast<long long>(row_part<CL>(n / VEC, count)) * VEC;
  const long long cluster = blockIdx.x / CL;
  layer_norm_backward_registers<T, BLOCK, VEC, ITEMS, CL>(
    dx + off, partial_w + cluster * n + off, partial_b + cluster * n + off, g + off, x + off,
    w + off, mean, rstd, n, count, rows, cluster, gridDim.x / CL, shared, slots);
  cluster_sync();
#else
  __trap();
#endif
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
