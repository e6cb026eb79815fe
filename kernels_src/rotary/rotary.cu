// Rotary position embeddings (RoPE) for T = float, __half or __nv_bfloat16, float32 arithmetic.
//
// A head of size D rotates its first `rot` dims (rot <= D, even: partial rotary) as rot/2 pairs
// (x1, x2) by angles whose cosines and sines the caller gives:
//   NeoX style (Llama, Qwen, Mistral, Gemma): pair i is (x[i], x[i + rot/2]);
//   GPT-J style: pair i is (x[2i], x[2i + 1]).
//   y1 = x1 * c1 - x2 * s1,  y2 = x2 * c2 + x1 * s2
// (c1 = c2 and s1 = s2 where the caller duplicates the halves, as Hugging Face's cos and sin do).
// The backward of that linear map: dx1 = dy1 * c1 + dy2 * s2, dx2 = dy2 * c2 - dy1 * s1.
//
// One block per token: its cosines and sines are staged in shared memory once, then the block's
// threads take (head, group of VEC pairs) units of every head of q and k. VEC pairs are read as
// vectors (16 bytes where the manifest finds pointers, strides and rot/2 aligned, else one
// element).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

constexpr int k_max_half = 256; // rot / 2 at most (head sizes up to 512)

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ void load(float* dst, const T* p) {
  const Vec<T, VEC> v = *reinterpret_cast<const Vec<T, VEC>*>(p);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    dst[j] = static_cast<float>(v.v[j]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store(T* p, const float* src) {
  Vec<T, VEC> v;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    v.v[j] = T(src[j]);
  }
  *reinterpret_cast<Vec<T, VEC>*>(p) = v;
}

// y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2 over VEC pairs, in place (BACKWARD: the transposed map,
// dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1).
template <int VEC, bool BACKWARD>
__device__ __forceinline__ void rotate_pairs(float* x1, float* x2, const float* c1, const float* c2,
                                             const float* s1, const float* s2) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float a = x1[j];
    const float b = x2[j];
    x1[j] = BACKWARD ? a * c1[j] + b * s2[j] : a * c1[j] - b * s1[j];
    x2[j] = BACKWARD ? b * c2[j] - a * s1[j] : b * c2[j] + a * s2[j];
  }
}

// Rotates VEC NeoX pairs: x1 at `in + i`, x2 at `in + i + half`; c1, s1 from index i of `cos`
// and `sin`, c2, s2 from i + half (staged float32 values).
template <typename T, int VEC, bool BACKWARD>
__device__ __forceinline__ void rotate_neox(T* out, const T* in, int i, int half, const float* cos,
                                            const float* sin) {
  float x1[VEC];
  float x2[VEC];
  load<T, VEC>(x1, in + i);
  load<T, VEC>(x2, in + i + half);
  rotate_pairs<VEC, BACKWARD>(x1, x2, cos + i, cos + half + i, sin + i, sin + half + i);
  store<T, VEC>(out + i, x1);
  store<T, VEC>(out + i + half, x2);
}

// Rotates VEC GPT-J pairs: the 2 VEC elements from `in + 2 i`, pair p = (e[2p], e[2p + 1]), with
// angles i + p.
template <typename T, int VEC>
__device__ __forceinline__ void rotate_gptj(T* out, const T* in, int i, const float* cos,
                                            const float* sin) {
  float e[2 * VEC];
  load<T, VEC>(e, in + 2 * i);
  load<T, VEC>(e + VEC, in + 2 * i + VEC);
#pragma unroll
  for (int p = 0; p < VEC; ++p) {
    const float x1 = e[2 * p];
    const float x2 = e[2 * p + 1];
    const float c = cos[i + p];
    const float s = sin[i + p];
    e[2 * p] = x1 * c - x2 * s;
    e[2 * p + 1] = x2 * c + x1 * s;
  }
  store<T, VEC>(out + 2 * i, e);
  store<T, VEC>(out + 2 * i + VEC, e + VEC);
}

} // namespace

// vLLM's rotary_embedding, in place: query [tokens, q_heads * head_size] (token stride
// q_stride), key likewise or null; cache [max_position, rot] holds rot/2 cosines then rot/2
// sines per position (C: its dtype); positions [tokens] index it.
template <typename T, typename C, int VEC>
__global__ void rotary_embedding_kernel(const long long* __restrict__ positions, T* query, T* key,
                                        const C* __restrict__ cache, long long max_position,
                                        int rot, int head_size, int q_heads, int k_heads,
                                        long long q_stride, long long k_stride, bool neox) {
  __shared__ float cosv[2 * k_max_half];
  __shared__ float sinv[2 * k_max_half];
  const long long token = blockIdx.x;
  const long long position = positions[token];
  if (position < 0 || position >= max_position) {
    return; // outside the cache: left as it is
  }
  const int half = rot / 2;
  const C* row = cache + position * rot;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float c = static_cast<float>(row[i]);
    const float s = static_cast<float>(row[half + i]);
    cosv[i] = c;
    cosv[half + i] = c;
    sinv[i] = s;
    sinv[half + i] = s;
  }
  __syncthreads();
  const int groups = half / VEC;
  const int heads = q_heads + (key != nullptr ? k_heads : 0);
  for (int u = threadIdx.x; u < heads * groups; u += blockDim.x) {
    const int h = u / groups;
    const int i = (u % groups) * VEC;
    T* x = h < q_heads ? query + token * q_stride + h * head_size
                       : key + token * k_stride + (h - q_heads) * head_size;
    if (neox) {
      rotate_neox<T, VEC, false>(x, x, i, half, cosv, sinv);
    } else {
      rotate_gptj<T, VEC>(x, x, i, cosv, sinv);
    }
  }
}

// Element (b, h, s, 0) of q for heads h < q_heads, else of k (its head h - q_heads), given each
// tensor's batch, head and position strides.
template <typename P>
__device__ __forceinline__ P* head_at(P* q, P* k, int q_heads, int h, long long b, long long s,
                                      long long q0, long long q1, long long q2, long long k0,
                                      long long k1, long long k2) {
  return h < q_heads ? q + b * q0 + h * q1 + s * q2 : k + b * k0 + (h - q_heads) * k1 + s * k2;
}

// Hugging Face's apply_rotary_pos_emb (NeoX style), out of place: q [B, Hq, S, D] and k
// [B, Hk, S, D] with any strides but a unit last one (qs, ks: batch, head, seq strides), cos and
// sin [cos_batched ? B : 1, S, rot] contiguous; the outputs [B, H, S, D] with strides qo and ko
// (the inputs' where those are dense, as eager's result; else contiguous), dims past rot
// copied. BACKWARD: the gradients of the same map (q, k: the outputs' gradients).
template <typename T, int VEC, bool BACKWARD>
__global__ void
apply_rotary_kernel(T* __restrict__ q_out, T* __restrict__ k_out, const T* __restrict__ q,
                    const T* __restrict__ k, const T* __restrict__ cos_in,
                    const T* __restrict__ sin_in, int q_heads, int k_heads, int seq, int dim,
                    int rot, long long qs0, long long qs1, long long qs2, long long ks0,
                    long long ks1, long long ks2, long long qo0, long long qo1, long long qo2,
                    long long ko0, long long ko1, long long ko2, bool cos_batched) {
  __shared__ float cosv[2 * k_max_half];
  __shared__ float sinv[2 * k_max_half];
  const int b = blockIdx.x / seq;
  const int s = blockIdx.x % seq;
  const long long cs = (static_cast<long long>(cos_batched ? b : 0) * seq + s) * rot;
  for (int i = threadIdx.x; i < rot; i += blockDim.x) {
    cosv[i] = static_cast<float>(cos_in[cs + i]);
    sinv[i] = static_cast<float>(sin_in[cs + i]);
  }
  __syncthreads();
  const int half = rot / 2;
  const int groups = half / VEC;
  const int heads = q_heads + k_heads;
  for (int u = threadIdx.x; u < heads * groups; u += blockDim.x) {
    const int h = u / groups;
    const int i = (u % groups) * VEC;
    const T* in = head_at(q, k, q_heads, h, b, s, qs0, qs1, qs2, ks0, ks1, ks2);
    T* out = head_at(q_out, k_out, q_heads, h, b, s, qo0, qo1, qo2, ko0, ko1, ko2);
    rotate_neox<T, VEC, BACKWARD>(out, in, i, half, cosv, sinv);
  }
  // Partial rotary: the dims past rot are copied (their gradient passes through).
  const int rest = dim - rot;
  for (int u = threadIdx.x; rest > 0 && u < heads * rest; u += blockDim.x) {
    const int h = u / rest;
    const int d = rot + u % rest;
    const T* in = head_at(q, k, q_heads, h, b, s, qs0, qs1, qs2, ks0, ks1, ks2);
    T* out = head_at(q_out, k_out, q_heads, h, b, s, qo0, qo1, qo2, ko0, ko1, ko2);
    out[d] = in[d];
  }
}

// The same map as apply_rotary_kernel, scheduled for inputs whose positions of a head are
// adjacent ([B, H, S, D] contiguous, as the gradients are): block (x, y) takes ROWS positions
// from x * ROWS of head y % (Hq + Hk) of batch y / (Hq + Hk), so it reads (and, the outputs laid
// out as the inputs, writes) runs of ROWS x D elements; cosines and sines are read per position
// as vectors (from L2: all heads read the same ones).
template <typename T, int VEC, bool BACKWARD, int ROWS>
__global__ void
apply_rotary_rows_kernel(T* __restrict__ q_out, T* __restrict__ k_out, const T* __restrict__ q,
                         const T* __restrict__ k, const T* __restrict__ cos_in,
                         const T* __restrict__ sin_in, int q_heads, int k_heads, int seq, int dim,
                         int rot, long long qs0, long long qs1, long long qs2, long long ks0,
                         long long ks1, long long ks2, long long qo0, long long qo1, long long qo2,
                         long long ko0, long long ko1, long long ko2, bool cos_batched) {
  constexpr int k_rows = ROWS;
  const int heads = q_heads + k_heads;
  const int b = blockIdx.y / heads;
  const int h = blockIdx.y % heads;
  const bool is_q = h < q_heads;
  const T* in = head_at(q, k, q_heads, h, b, 0, qs0, qs1, qs2, ks0, ks1, ks2);
  const long long in_stride = is_q ? qs2 : ks2;
  T* out = head_at(q_out, k_out, q_heads, h, b, 0, qo0, qo1, qo2, ko0, ko1, ko2);
  const long long out_stride = is_q ? qo2 : ko2;
  const T* cos_b = cos_in + static_cast<long long>(cos_batched ? b : 0) * seq * rot;
  const T* sin_b = sin_in + static_cast<long long>(cos_batched ? b : 0) * seq * rot;
  const int half = rot / 2;
  const int groups = half / VEC;
  const int s0 = blockIdx.x * k_rows;
  for (int u = threadIdx.x; u < k_rows * groups; u += blockDim.x) {
    const int s = s0 + u / groups;
    if (s >= seq) {
      break;
    }
    const int i = (u % groups) * VEC;
    float x1[VEC], x2[VEC], c1[VEC], c2[VEC], s1[VEC], s2[VEC];
    const T* row = in + s * in_stride;
    const long long cs = static_cast<long long>(s) * rot;
    load<T, VEC>(x1, row + i);
    load<T, VEC>(x2, row + i + half);
    load<T, VEC>(c1, cos_b + cs + i);
    load<T, VEC>(c2, cos_b + cs + half + i);
    load<T, VEC>(s1, sin_b + cs + i);
    load<T, VEC>(s2, sin_b + cs + half + i);
    rotate_pairs<VEC, BACKWARD>(x1, x2, c1, c2, s1, s2);
    T* o = out + s * out_stride;
    store<T, VEC>(o + i, x1);
    store<T, VEC>(o + i + half, x2);
  }
  const int rest = dim - rot;
  for (int u = threadIdx.x; rest > 0 && u < k_rows * rest; u += blockDim.x) {
    const int s = s0 + u / rest;
    if (s >= seq) {
      break;
    }
    const int d = rot + u % rest;
    out[s * out_stride + d] = in[s * in_stride + d];
  }
}
