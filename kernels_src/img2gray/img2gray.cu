// img2gray: interleaved RGB (H x W x 3, uint8) to gray (H x W, uint8).
//
// Luminance uses the ITU-R BT.601 weights (0.299 R + 0.587 G + 0.114 B) in 8-bit fixed point:
// 77, 150 and 29 sum to 256, so the result is a rounded shift and every output is exactly
// reproducible on the CPU (the reference in tests computes the same integer expression):
//   gray = (77 R + 150 G + 29 B + 128) >> 8

__device__ __forceinline__ unsigned char luma(unsigned r, unsigned g, unsigned b) {
  return static_cast<unsigned char>((77u * r + 150u * g + 29u * b + 128u) >> 8);
}

// The classic first kernel: one thread per pixel on a 2-D grid. Easy to read; each thread loads
// three single bytes and stores one, so it reaches about a third of the copy bandwidth.
extern "C" __global__ void img2gray_kernel(const unsigned char* __restrict__ rgb,
                                           unsigned char* __restrict__ gray, int width,
                                           int height) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= width || y >= height) {
    return;
  }
  const size_t i = static_cast<size_t>(y) * width + x;
  const unsigned char* p = rgb + 3 * i;
  gray[i] = luma(p[0], p[1], p[2]);
}

// The fast kernel the op uses: a contiguous image is a flat array of pixels, so each thread
// converts 16 of them with three 16-byte loads (48 bytes of RGB) and one 16-byte store, the
// widest accesses the memory system serves. Plain loads and stores: the streaming hints
// (__ldcs/__stcs) measured 7% slower on an H200. Pixels past the last full group of 16, and images
// whose pointers are not 16-byte aligned (views into a larger buffer), take the byte-wise path.
// Same arithmetic as img2gray_kernel, so the results are identical.
extern "C" __global__ void img2gray_vec_kernel(const unsigned char* __restrict__ rgb,
                                               unsigned char* __restrict__ gray, long long pixels) {
  constexpr int k_pixels = 16;
  const long long first =
    (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * k_pixels;
  if (first >= pixels) {
    return;
  }
  const bool aligned = (reinterpret_cast<unsigned long long>(rgb) % 16 == 0) &&
                       (reinterpret_cast<unsigned long long>(gray) % 16 == 0);
  if (aligned && first + k_pixels <= pixels) {
    union {
      uint4 words[3];
      unsigned char bytes[48];
    } in;
    const uint4* src = reinterpret_cast<const uint4*>(rgb + 3 * first);
    in.words[0] = src[0];
    in.words[1] = src[1];
    in.words[2] = src[2];
    union {
      uint4 word;
      unsigned char bytes[16];
    } out;
#pragma unroll
    for (int k = 0; k < k_pixels; ++k) {
      out.bytes[k] = luma(in.bytes[3 * k], in.bytes[3 * k + 1], in.bytes[3 * k + 2]);
    }
    *reinterpret_cast<uint4*>(gray + first) = out.word;
    return;
  }
  const long long last = first + k_pixels < pixels ? first + k_pixels : pixels;
  for (long long i = first; i < last; ++i) {
    gray[i] = luma(rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2]);
  }
}
