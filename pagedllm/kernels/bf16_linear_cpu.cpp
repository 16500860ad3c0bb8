// Linear layer over a bf16 weight for CPU: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), x and y
// fp32, W bf16 in the HF layout [N, K] (row-major, stored once: the torch path reads it too).
//
// The contract (model/layers/quant/bf16.py, also the grouped bf16 MoE kernels'):
//   M <  torch_rows   fp32 x times W widened exactly to fp32 (bf16 -> fp32 is a 16-bit left
//                     shift), fp32 accumulation: this file's kernel. Bandwidth-bound: at
//                     M = 1 it reads 2 bytes per weight where the fp32 packed kernel reads 4.
//   M >= torch_rows   x rounded to bf16, torch's bf16 matmul (oneDNN: avx512_bf16 dot
//                     products, AMX-bf16 tiles on Xeons; fp32 accumulation), output widened
//                     to fp32 (torch has no CPU matmul with bf16 inputs and an fp32 output,
//                     so the output is rounded to bf16 once on the way), bias added in fp32.
//
// The kernel: each work item is NR rows of W (NR x K x 2 bytes, 16 KiB at K = 2048, kept in
// L1) against all M rows of x, MR rows at a time; an output is the dot product of a row of x
// and a row of W, MR x NR vector accumulators over k, summed across lanes at the end. Every
// output's arithmetic is the same whatever M, MR or the row's place in the batch: results
// are batch-invariant below torch_rows. Reassociation is off for this file (-ffast-math).
//
// ISA paths (chosen at compile time for the build's -march; cpu_ops builds per CPU target):
// AVX-512F (16 lanes, MR 6), AVX2 + FMA (8 lanes, MR 2), scalar.
#include "torch_lite_cpu.h"
#include "balanced_for_cpu.h"  // balanced_for: threads that finish together
#include <ATen/ops/linear.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>

#pragma GCC push_options
#pragma GCC optimize("no-associative-math")

namespace {

constexpr int kNR = 4;  // rows of W per micro-kernel call

inline float widen(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#if defined(__AVX512F__)
constexpr int kVW = 16, kMR = 6;  // 24 accumulators + 4 weight vectors of 32 zmm
using F = __m512;
inline F wload(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline F xload(const float* p) { return _mm512_loadu_ps(p); }
inline F vfma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
inline F vzero() { return _mm512_setzero_ps(); }
inline float hsum(F v) { return _mm512_reduce_add_ps(v); }
// The four sums of a, b, c, d at once (a quarter of four hsum's instructions).
inline void hsum4(F a, F b, F c, F d, float* out) {
  const F ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const F cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const F q = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(q),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(q), 1)));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}
constexpr const char* kIsa = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kVW = 8, kMR = 2;  // 8 accumulators + 4 weight vectors of 16 ymm
using F = __m256;
inline F wload(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline F xload(const float* p) { return _mm256_loadu_ps(p); }
inline F vfma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
inline F vzero() { return _mm256_setzero_ps(); }
inline float hsum(F v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline void hsum4(F a, F b, F c, F d, float* out) {
  const F ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  const F q = _mm256_hadd_ps(ab, cd);  // per 128-bit half: [a, b, c, d] partial sums
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1)));
}
constexpr const char* kIsa = "avx2";
#else
constexpr int kVW = 0, kMR = 4;
constexpr const char* kIsa = "scalar";
#endif

// MR rows of x against NR rows of w: y[i, j] = sum_k x[i, k] w[j, k] (+ bias[j]).
template <int MR, int NR>
__attribute__((noinline)) void micro(const float* x, int64_t K, const uint16_t* w, float* y,
                                     int64_t N, const float* bias) {
  float s[MR][NR];
  int64_t k = 0;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  F acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = vzero();
  for (; k + kVW <= K; k += kVW) {
    F wv[NR];
    for (int j = 0; j < NR; ++j) {
      // the same place in the next block's rows: 4 streams a hardware prefetcher misses
      __builtin_prefetch(w + (j + NR) * K + k);
      wv[j] = wload(w + j * K + k);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      F xv = xload(x + i * K + k);
#if defined(__AVX512F__) || defined(__AVX2__)
      // one load of x per NR FMAs: GCC otherwise folds it into every FMA, and the kernel
      // becomes load-bound (28 loads for 24 FMAs per step at MR 6)
      asm("" : "+v"(xv));
#endif
      for (int j = 0; j < NR; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    if constexpr (NR == 4) {
      hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], s[i]);
    } else {
      for (int j = 0; j < NR; ++j) s[i][j] = hsum(acc[i][j]);
    }
  }
#else
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) s[i][j] = 0.f;
#endif
  for (; k < K; ++k)  // the K % kVW tail (all of K on the scalar path)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j)  // an explicit fma: contraction must not vary with MR
        s[i][j] = __builtin_fmaf(x[i * K + k], widen(w[j * K + k]), s[i][j]);
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * N + j] = bias ? s[i][j] + bias[j] : s[i][j];
}

// The micro-kernel with exactly `rows` rows of x (M % MR leftovers) and NR rows of w.
template <int MR, int NR>
void micro_rows(int rows, const float* x, int64_t K, const uint16_t* w, float* y, int64_t N,
                const float* bias) {
  if constexpr (MR > 0) {
    if (rows == MR) return micro<MR, NR>(x, K, w, y, N, bias);
    micro_rows<MR - 1, NR>(rows, x, K, w, y, N, bias);
  }
}

// All M rows of x against rows [n, n + nr) of w (nr <= kNR; fewer only at the end of N).
template <int NR>
void rows_block(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t n, float* y,
                int64_t N, const float* bias) {
  const uint16_t* wn = w + n * K;
  const float* bn = bias ? bias + n : nullptr;
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR) micro<kMR, NR>(x + m * K, K, wn, y + m * N + n, N, bn);
  if (m < M) micro_rows<kMR - 1, NR>(static_cast<int>(M - m), x + m * K, K, wn, y + m * N + n, N, bn);
}

void bf16_kernel(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, float* y,
                 const float* bias) {
  const int64_t blocks = (N + kNR - 1) / kNR;
  balanced_for(blocks, [&](BalancedTurn& turn) {
    for (int64_t b; (b = turn.next()) >= 0;) {
      const int64_t n = b * kNR, nr = std::min<int64_t>(kNR, N - n);
      switch (nr) {
        case 4: rows_block<4>(x, M, K, w, n, y, N, bias); break;
        case 3: rows_block<3>(x, M, K, w, n, y, N, bias); break;
        case 2: rows_block<2>(x, M, K, w, n, y, N, bias); break;
        default: rows_block<1>(x, M, K, w, n, y, N, bias); break;
      }
    }
  }, M >= kStealRows);
}

}  // namespace

std::string bf16_linear_isa() { return kIsa; }

torch::Tensor bf16_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias,
                          int64_t torch_rows) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "bf16_linear: x must be contiguous fp32 [M, K]");
  TORCH_CHECK(w.dim() == 2 && w.dtype() == at::kBFloat16 && w.is_contiguous() &&
                  w.size(1) == x.size(1),
              "bf16_linear: w must be contiguous bf16 [N, K] with x's K");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  if (bias) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == N && bias->dtype() == torch::kFloat32,
                "bf16_linear: bias must be contiguous fp32 [N]");
  }
  if (torch_rows > 0 && M >= torch_rows) {
    torch::Tensor y = at::linear(x.to(at::kBFloat16), w).to(torch::kFloat32);
    if (bias) y.add_(*bias);
    return y;
  }
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  bf16_kernel(x.data_ptr<float>(), M, K, reinterpret_cast<const uint16_t*>(w.data_ptr()), N,
              y.data_ptr<float>(), bias ? bias->data_ptr<float>() : nullptr);
  return y;
}

#pragma GCC pop_options
