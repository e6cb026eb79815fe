// Kernels of the test package `optest`: each exercises a manifest feature of real ops
// (written arguments, optionals, str arguments, int lists, several launches with a workspace,
// device properties, computed template constants, dynamic shared memory above 48 KiB).

// residual += x; x = residual * rsqrt(mean(residual^2) + eps) * weight, one block per row.
template <int BLOCK>
__global__ void add_rms_kernel(float* x, float* residual, const float* weight, float eps,
                               int hidden) {
  __shared__ float partial[BLOCK];
  float* xr = x + static_cast<long long>(blockIdx.x) * hidden;
  float* rr = residual + static_cast<long long>(blockIdx.x) * hidden;
  float sum = 0.f;
  for (int i = threadIdx.x; i < hidden; i += BLOCK) {
    const float r = rr[i] + xr[i];
    rr[i] = r;
    sum += r * r;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = BLOCK / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      partial[threadIdx.x] += partial[threadIdx.x + s];
    }
    __syncthreads();
  }
  const float scale = rsqrtf(partial[0] / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += BLOCK) {
    xr[i] = rr[i] * scale * weight[i];
  }
}

extern "C" __global__ void scale_kernel(float* x, float s, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    x[i] *= s;
  }
}

// out = act(x + bias[col]); MODE 0: relu, 1: identity. A null bias when HAS_BIAS is false.
template <bool HAS_BIAS, int MODE>
__global__ void bias_act_kernel(float* out, const float* x, const float* bias, long long n,
                                int cols) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  float v = x[i];
  if (HAS_BIAS) {
    v += bias[i % cols];
  }
  out[i] = MODE == 0 ? fmaxf(v, 0.f) : v;
}

// Launch 1: each block adds its grid-stride partial sum into partial[blockIdx.x] (zeroed).
extern "C" __global__ void partial_sum_kernel(float* partial, const float* x, long long n) {
  __shared__ float s[256];
  float sum = 0.f;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    sum += x[i];
  }
  s[threadIdx.x] = sum;
  __syncthreads();
  for (int k = 128; k > 0; k /= 2) {
    if (threadIdx.x < k) {
      s[threadIdx.x] += s[threadIdx.x + k];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partial[blockIdx.x] += s[0];
  }
}

// Launch 2: one block sums the partials into out[0].
extern "C" __global__ void final_sum_kernel(float* out, const float* partial, int count) {
  __shared__ float s[256];
  float sum = 0.f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    sum += partial[i];
  }
  s[threadIdx.x] = sum;
  __syncthreads();
  for (int k = 128; k > 0; k /= 2) {
    if (threadIdx.x < k) {
      s[threadIdx.x] += s[threadIdx.x + k];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[0] = s[0];
  }
}

// out[i] = x[i % n] for out of n * reps elements.
extern "C" __global__ void tile_kernel(float* out, const float* x, long long n, long long total) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) {
    out[i] = x[i % n];
  }
}

// Reverses x (of n <= `shared_floats` elements) through dynamic shared memory: one block.
extern "C" __global__ void reverse_kernel(float* out, const float* x, int n) {
  extern __shared__ float buffer[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    buffer[i] = x[i];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    out[i] = buffer[n - 1 - i];
  }
}

// The sum of `v` over a block of 256 threads (every thread gets it).
template <typename T>
__device__ T block_sum_256(T v) {
  __shared__ T s[256];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int k = 128; k > 0; k /= 2) {
    if (threadIdx.x < k) {
      s[threadIdx.x] += s[threadIdx.x + k];
    }
    __syncthreads();
  }
  const T total = s[0];
  __syncthreads();
  return total;
}

// y = x * rstd * weight with rstd = rsqrt(mean(x^2) + eps) saved per row: one block per row.
template <typename T>
__global__ void rms_kernel(T* y, T* rstd, const T* x, const T* weight, T eps, int n) {
  const long long row = blockIdx.x;
  const T* xr = x + row * n;
  T sum = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    sum += xr[i] * xr[i];
  }
  const T r = T(1) / sqrt(block_sum_256(sum) / n + eps);
  if (threadIdx.x == 0) {
    rstd[row] = r;
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    y[row * n + i] = xr[i] * r * weight[i];
  }
}

// The backward, launch 1: dx = rstd * (g * w - x * rstd^2 * mean(g * w * x)), one block per row.
template <typename T>
__global__ void rms_dx_kernel(T* dx, const T* grad, const T* x, const T* weight, const T* rstd,
                              int n) {
  const long long row = blockIdx.x;
  const T* g = grad + row * n;
  const T* xr = x + row * n;
  const T r = rstd[row];
  T sum = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    sum += g[i] * weight[i] * xr[i];
  }
  const T mean = block_sum_256(sum) / n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    dx[row * n + i] = r * (g[i] * weight[i] - xr[i] * r * r * mean);
  }
}

// Launch 2: dweight = sum over rows of g * x * rstd, one thread per column.
template <typename T>
__global__ void rms_dw_kernel(T* dweight, const T* grad, const T* x, const T* rstd, int rows,
                              int n) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= n) {
    return;
  }
  T sum = 0;
  for (long long row = 0; row < rows; ++row) {
    sum += grad[row * n + col] * x[row * n + col] * rstd[row];
  }
  dweight[col] = sum;
}
