// The forward kernels of the norm package: RMSNorm, fused residual add + RMSNorm, LayerNorm.
// The launch rules and the shared helpers are in norm_common.cuh.
#include "norm_common.cuh"

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
