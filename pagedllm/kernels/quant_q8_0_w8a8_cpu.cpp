// GGUF Q8_0 weights with int8 activations (`--int8-activations` on a GGUF model): W8A8 at
// every M, llama.cpp's q8_0 x q8_0 dot product laid out as a GEMM. Integer dot products do 4x
// (AVX2 maddubs) to 8x (AVX-512 VNNI vpdpbusd) the multiply-adds of an fp32 FMA per
// instruction, so large batches get past the fp32 path's compute ceiling, and a decode step
// reads the same bytes with a fraction of the instructions of a per-row dot product.
//
// The file's blocks (fp16 d, 32 int8 codes) are repacked once at load
// (pagedllm/model/layers/quant/gguf_q8.py) into panels of kNB output rows, no bigger than the
// file (34 bytes per 32 values):
//
//   codes  uint8 [P, K / 32, 8, kNB, 4]  codes 4t..4t+3 of block j of row p kNB + c, stored
//                                        + 128 (u8) for VNNI's u8 x s8 vpdpbusd, else as s8
//   d      fp16  [P, K / 32, kNB]        the block's scale (0 for rows past N)
//
// x is quantized per 32 values (a8_quantize_cpu.h: x ~ dx q, q in [-127, 127]), so
//
//   y[m, n] = sum_j  d[n, j] dx[m, j]  (sum_{i < 32} c[n, 32 j + i] q[m, 32 j + i])
//
// the inner sums exact in int32 (VNNI: sum (c + 128) q - 128 sum q), the outer one in fp32,
// block by block in k order, the same instructions for a row whatever M is: a row's result
// does not depend on the batch (batch-invariant). Not exact against fp32: the activation
// rounding is the error (docs/benchmarks.md measures it).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC optimize("no-associative-math")  // the same k-ordered sums for every M

namespace {
#include "simd_cpu.h"

#include "int8_dot_cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PAGEDLLM_Q8_SIMD 1
#include "a8_quantize_cpu.h"

constexpr int kQuads = 8;  // 4-value quads per 32-value block
// rows of x per micro-kernel call: 2 x MR int32 and 2 x MR fp32 accumulators
constexpr int kMRQ = kVW == 16 ? 6 : 2;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr int kCodeOffset = 128;  // codes stored as u8, x as s8: sum (c + 128) q
inline void dotw(acc8& acc, const uint8_t* w, int32_t xquad) {
  acc = _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(w), _mm512_set1_epi32(xquad));
}
#else
constexpr int kCodeOffset = 0;  // s8 codes: int8_dot_cpu.h's |x| x sign(w, x)
inline void dotw(acc8& acc, const uint8_t* w, int32_t xquad) {
  dot4(acc, xquad, reinterpret_cast<const int8_t*>(w));
}
#endif

#if defined(__AVX512F__)
inline V f16v(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
#else
inline V f16v(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif

// MR rows of quantized x over one panel; sx: 128 x each x block's code sum (VNNI offset).
template <int MR>
__attribute__((noinline)) void micro_q8(const int8_t* xq, int64_t K, const float* dx,
                                        const int32_t* sx, int64_t nb, const uint8_t* codes,
                                        const uint16_t* d, float* y, int64_t ldy, int64_t ncols) {
  V acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vzero();
  for (int64_t j = 0; j < nb; ++j) {
    acc8 dot[MR][2];
    for (int i = 0; i < MR; ++i) dot[i][0] = dot[i][1] = zero8();
    const uint8_t* wj = codes + j * kQuads * kNB * 4;
#pragma GCC unroll 8
    for (int t = 0; t < kQuads; ++t) {
      for (int i = 0; i < MR; ++i) {
        int32_t xquad;
        std::memcpy(&xquad, xq + i * K + 32 * j + 4 * t, 4);
        dotw(dot[i][0], wj + t * kNB * 4, xquad);
        dotw(dot[i][1], wj + t * kNB * 4 + kVW * 4, xquad);
      }
    }
    const V d0 = f16v(d + j * kNB), d1 = f16v(d + j * kNB + kVW);
    for (int i = 0; i < MR; ++i) {
      const V s = vset(dx[i * nb + j]);
      VI a0 = dot[i][0], a1 = dot[i][1];
      if constexpr (kCodeOffset != 0) {
        const VI c = iset(sx[i * nb + j]);
        a0 = isub(a0, c);
        a1 = isub(a1, c);
      }
      acc[i][0] = vfma(vcvt(a0), vmul(d0, s), acc[i][0]);
      acc[i][1] = vfma(vcvt(a1), vmul(d1, s), acc[i][1]);
    }
  }
  store_tile<MR>(acc, y, ldy, ncols);
}

template <int MR>
void micro_q8_tail(int rows, const int8_t* xq, int64_t K, const float* dx, const int32_t* sx,
                   int64_t nb, const uint8_t* codes, const uint16_t* d, float* y, int64_t ldy,
                   int64_t ncols) {
  if constexpr (MR > 0) {
    if (rows == MR) return micro_q8<MR>(xq, K, dx, sx, nb, codes, d, y, ldy, ncols);
    micro_q8_tail<MR - 1>(rows, xq, K, dx, sx, nb, codes, d, y, ldy, ncols);
  }
}
#else
#define PAGEDLLM_Q8_SIMD 0
constexpr int kCodeOffset = 0;
#endif

}  // namespace

bool q8_0_panels_available() { return PAGEDLLM_Q8_SIMD; }
int64_t q8_0_code_offset() { return kCodeOffset; }

torch::Tensor q8_0_panel_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor d, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "q8_0_panel_linear: x must be contiguous fp32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), nb = K / 32, P = (N + kNB - 1) / kNB;
  TORCH_CHECK(K % 32 == 0, "q8_0_panel_linear: K=", K, " is not whole Q8_0 blocks");
  TORCH_CHECK(codes.dtype() == torch::kUInt8 && codes.is_contiguous() &&
                  codes.sizes() == torch::IntArrayRef({P, nb, 8, kNB, 4}),
              "q8_0_panel_linear: codes must be uint8 [", P, ", ", nb, ", 8, ", kNB, ", 4]");
  TORCH_CHECK(d.dtype() == torch::kFloat16 && d.is_contiguous() &&
                  d.sizes() == torch::IntArrayRef({P, nb, kNB}),
              "q8_0_panel_linear: d must be fp16 [", P, ", ", nb, ", ", kNB, "]");
  auto y = torch::empty({M, N}, x.options());
#if PAGEDLLM_Q8_SIMD
  const QuantizedX qx = quantize_x(x.data_ptr<float>(), M, K);
  std::vector<int32_t> sx(M * nb);
  for (int64_t i = 0; i < M * nb; ++i) sx[i] = kCodeOffset * qx.sum[i];
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const uint16_t* dp = reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, P, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n0 = p * kNB, ncols = std::min<int64_t>(kNB, N - n0);
      const uint8_t* pc = cp + p * nb * kQuads * kNB * 4;
      const uint16_t* pd = dp + p * nb * kNB;
      int64_t m = 0;
      for (; m + kMRQ <= M; m += kMRQ)
        micro_q8<kMRQ>(qx.q.data() + m * K, K, qx.d.data() + m * nb, sx.data() + m * nb, nb, pc,
                       pd, yp + m * N + n0, N, ncols);
      if (m < M)
        micro_q8_tail<kMRQ - 1>(static_cast<int>(M - m), qx.q.data() + m * K, K,
                                qx.d.data() + m * nb, sx.data() + m * nb, nb, pc, pd,
                                yp + m * N + n0, N, ncols);
    }
  });
#else
  TORCH_CHECK(false, "q8_0_panel_linear needs AVX2 + FMA + F16C (built without them)");
#endif
  return y;
}

#pragma GCC pop_options

void register_q8_0_kernels(pybind11::module_& m) {
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("q8_0_panels_available", &q8_0_panels_available, nogil,
        "whether the Q8_0 W8A8 panel kernel is built (AVX2 + FMA + F16C)");
  m.def("q8_0_code_offset", &q8_0_code_offset, nogil,
        "what the panel layout adds to each Q8_0 code (128 for VNNI's u8 codes, else 0)");
  m.def("q8_0_panel_linear", &q8_0_panel_linear, nogil,
        "y = x @ W^T, W GGUF Q8_0 repacked into panels, x quantized per 32 values (W8A8)");
}
