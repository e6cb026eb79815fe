// img2gray: interleaved RGB (H x W x 3, uint8) to gray (H x W, uint8).
//
// Luminance uses the ITU-R BT.601 weights (0.299 R + 0.587 G + 0.114 B) in 8-bit fixed point:
// 77, 150 and 29 sum to 256, so the result is a rounded shift and every output is exactly
// reproducible on the CPU (the reference in tests computes the same integer expression):
//   gray = (77 R + 150 G + 29 B + 128) >> 8
//
// One thread per pixel on a 2-D grid: the classic first kernel.

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
  gray[i] = static_cast<unsigned char>((77u * p[0] + 150u * p[1] + 29u * p[2] + 128u) >> 8);
}
