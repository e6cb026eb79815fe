// The forward kernels of the norm package: RMSNorm, fused residual add + RMSNorm, LayerNorm.
// The launch rules and the shared helpers are in norm_common.cuh.
#include "norm_common.cuh"

// A row of ITEMS vectors a thread as stored (16 bytes a vector), the next row's loads in flight
// under the LOOP schedule.
template <typename T, int VEC, int ITEMS>
struct RowVectors {
  Vec<T, VEC> v[ITEMS];
};

template <typename T, int BLOCK, int VEC, int ITEMS>
__device__ __forceinline__ void load_row(RowVectors<T, VEC, ITEMS>& s, const T* __restrict__ x,
                                         long long row, int n) {
  const int t = threadIdx.x % BLOCK;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int i = t + k * BLOCK;
    if (i < n / VEC) {
      s.v[k] = *reinterpret_cast<const Vec<T, VEC>*>(x + row * n + i * VEC);
    }
  }
}

// The float32 values of this thread's vectors (0 past nv) and the sum of their squares.
template <typename T, int BLOCK, int VEC, int ITEMS>
__device__ __forceinline__ float to_floats(float (&v)[ITEMS][VEC],
                                           const RowVectors<T, VEC, ITEMS>& s, int nv, int t) {
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const bool in = t + k * BLOCK < nv;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      v[k][j] = in ? static_cast<float>(s.v[k].v[j]) : 0.f;
      ss += v[k][j] * v[k][j];
    }
  }
  return ss;
}

// y = rms_norm(x) * (w + offset); rstd[row] = 1 / sqrt(mean(x^2) + eps).
// Grid: cdiv(rows, rows_a_block), or with LOOP (the register path only) fewer blocks, each
// looping over row groups (loop_row_groups); block: BLOCK * rows_a_block threads.
template <typename T, int BLOCK, int VEC, int ITEMS, int MODE, bool LOOP>
__global__ void __launch_bounds__(threads_a_block<BLOCK>)
  rms_norm_kernel(T* __restrict__ y, float* __restrict__ rstd, const T* __restrict__ x,
                  const T* __restrict__ w, float eps, float offset, int n, long long rows) {
  __shared__ float2 shared[32];
  if constexpr (LOOP) {
    static_assert(ITEMS > 0, "the LOOP schedule keeps rows in registers");
    const int t = threadIdx.x % BLOCK;
    using State = RowVectors<T, VEC, ITEMS>;
    loop_row_groups<BLOCK, State>(
      rows, [&](State& s, long long row) { load_row<T, BLOCK, VEC, ITEMS>(s, x, row, n); },
      [&](const State& s, long long row) {
        const int nv = row < rows ? n / VEC : 0;
        float v[ITEMS][VEC];
        const float ss = to_floats<T, BLOCK, VEC, ITEMS>(v, s, nv, t);
        rms_row_registers<T, BLOCK, VEC, ITEMS, MODE>(y, rstd, w, v, ss, eps, offset, n, nv, t, row,
                                                      shared);
      });
    return;
  }
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
template <typename T, int BLOCK, int VEC, int ITEMS, int MODE, bool LOOP>
__global__ void __launch_bounds__(threads_a_block<BLOCK>)
  fused_add_rms_norm_kernel(T* __restrict__ x, T* __restrict__ residual, float* __restrict__ rstd,
                            const T* __restrict__ w, float eps, float offset, int n,
                            long long rows) {
  __shared__ float2 shared[32];
  if constexpr (LOOP) {
    static_assert(ITEMS > 0, "the LOOP schedule keeps rows in registers");
    const int t = threadIdx.x % BLOCK;
    struct State {
      RowVectors<T, VEC, ITEMS> x, r;
    };
    loop_row_groups<BLOCK, State>(
      rows,
      [&](State& s, long long row) {
        load_row<T, BLOCK, VEC, ITEMS>(s.x, x, row, n);
        load_row<T, BLOCK, VEC, ITEMS>(s.r, residual, row, n);
      },
      [&](const State& s, long long row) {
        const int nv = row < rows ? n / VEC : 0;
        float v[ITEMS][VEC];
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
          const int i = t + k * BLOCK;
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            v[k][j] =
              i < nv
                ? round_to<T>(static_cast<float>(s.r.v[k].v[j]) + static_cast<float>(s.x.v[k].v[j]))
                : 0.f;
            ss += v[k][j] * v[k][j];
          }
          if (i < nv) {
            store<T, VEC>(residual + row * n + i * VEC, v[k]);
          }
        }
        rms_row_registers<T, BLOCK, VEC, ITEMS, MODE>(x, rstd, w, v, ss, eps, offset, n, nv, t, row,
                                                      shared);
      });
    return;
  }
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

// The LayerNorm of one row held in registers (v: the row, 0 past nv), written to yr; its mean
// and rstd into `mean` and `r`.
template <typename T, int BLOCK, int VEC, int ITEMS, bool HAS_BIAS>
__device__ __forceinline__ void ln_row_registers(T* __restrict__ yr, const T* __restrict__ w,
                                                 const T* __restrict__ b, float (&v)[ITEMS][VEC],
                                                 float eps, int n, int nv, int t, float2* shared,
                                                 float& mean, float& r) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      s += v[k][j];
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
}

// y = (x - mean) * rstd * w + b (b absent: HAS_BIAS false); mean and rstd saved per row.
// Grid and block as rms_norm_kernel's.
template <typename T, int BLOCK, int VEC, int ITEMS, bool HAS_BIAS, bool LOOP>
__global__ void __launch_bounds__(threads_a_block<BLOCK>)
  layer_norm_kernel(T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                    const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                    float eps, int n, long long rows) {
  __shared__ float2 shared[32];
  if constexpr (LOOP) {
    static_assert(ITEMS > 0, "the LOOP schedule keeps rows in registers");
    const int t = threadIdx.x % BLOCK;
    using State = RowVectors<T, VEC, ITEMS>;
    loop_row_groups<BLOCK, State>(
      rows, [&](State& s, long long row) { load_row<T, BLOCK, VEC, ITEMS>(s, x, row, n); },
      [&](const State& s, long long row) {
        const int nv = row < rows ? n / VEC : 0;
        float v[ITEMS][VEC];
        to_floats<T, BLOCK, VEC, ITEMS>(v, s, nv, t);
        float mean;
        float r;
        ln_row_registers<T, BLOCK, VEC, ITEMS, HAS_BIAS>(y + row * n, w, b, v, eps, n, nv, t,
                                                         shared, mean, r);
        if (t == 0 && nv > 0) {
          mean_out[row] = mean;
          rstd_out[row] = r;
        }
      });
    return;
  }
  const auto [row, t, nv] = row_slot<BLOCK, VEC>(n, rows);
  const T* xr = x + row * n;
  T* yr = y + row * n;
  float mean;
  float r;
  if constexpr (ITEMS > 0) {
    // The weight and bias are read after the two reductions; a call of a row or a few (latency-
    // bound) would pay a second memory round trip there. The first blocks ask the L2 for them
    // before the row's loads (no registers held; later blocks find them in the L2). H100, bf16:
    // 1 x 1024 5.38 -> 5.01 us, 4096 x 4096 28.8 -> 28.2, Liger 4.82 and 28.7 (KERNELS_NOTES.md);
    // holding them in registers instead gained less and cost up to 30 more registers.
    if (blockIdx.x < 64) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int i = t + k * BLOCK;
        if (i < nv) {
          asm volatile("prefetch.global.L2 [%0];" ::"l"(w + i * VEC));
          if constexpr (HAS_BIAS) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(b + i * VEC));
          }
        }
      }
    }
    float v[ITEMS][VEC];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (t + k * BLOCK < nv) {
        load<T, VEC>(v[k], xr + (t + k * BLOCK) * VEC);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          v[k][j] = 0.f;
        }
      }
    }
    ln_row_registers<T, BLOCK, VEC, ITEMS, HAS_BIAS>(yr, w, b, v, eps, n, nv, t, shared, mean, r);
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
