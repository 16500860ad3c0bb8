// GGUF linear layers with int8 activations (opt-in, `--int8-activations`): the way llama.cpp
// multiplies a quantized weight (its vec_dot_q4_1_q8_1 and siblings). Weights stay in GGUF's
// own block layout, row by row as in the file (no repack: resident bytes = file bytes):
//
//   w   uint8 [N, K / block * block_bytes]   row n = the GGUF blocks of output n along K
//
// Small M (decoding): each row of x is quantized per 32 values to int8 with an fp32 scale
// dx (round to nearest, dx = max|x| / 127), and a 32-value block of a weight row contributes
//
//   sum_i w_i x_i  ~  dx * ( S * sum_i c_i q_i  +  (B - S * zero) * sum_i q_i )
//
// with w_i = S (c_i - zero) + B the GGUF value (code c, per-block scale S and offset B;
// Q6_K: S per 16 values). sum c q runs in int32 with AVX2 `maddubs` / `madd` (Q8_0's signed
// codes through the `sign` trick, as llama.cpp does): 32 products in two instructions where
// the exact path (quant_gguf_cpu.cpp) spends ~12 to dequantize and multiply 16 weights. Not
// exact: rounding x to 8 bits changes the logits slightly (docs/benchmarks.md measures it).
//
// Large M (prefill): 16 weight rows at a time are dequantized exactly (the values
// gguf.quants.dequantize gives) into an fp32 panel and the fp32 micro-kernel of
// simd_cpu.h runs over it, so a prefill computes what the exact path computes.
#include <torch/csrc/utils/pybind.h>  // register_*(m): pybind11, torch's Tensor casters
#include "torch_lite_cpu.h"
#include "kernels_cpu.h"  // PrefetchPlan, and this file's entry points
#include <ATen/Parallel.h>
#include "balanced_for_cpu.h"  // balanced_for: threads that finish together
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
// fp-contract=off: dequantized values are fl(fl(S * (c - zero)) + B), gguf-py's two roundings.
#pragma GCC optimize("no-associative-math", "fp-contract=off")

namespace {
#include "simd_cpu.h"

#include "gguf_formats_cpu.h"

// Q6_K's scale changes every 16 values: a 32-value block has two
template <int F>
constexpr bool kSplit = Traits<F>::group < 32;

struct Layout {
  int64_t values, bytes;  // per GGUF block
};

template <int F>
constexpr Layout layout_of() { return {Traits<F>::values, Traits<F>::bytes}; }

Layout layout(int64_t fmt) {
  switch (fmt) {
    case kQ4_0: return layout_of<kQ4_0>();
    case kQ4_1: return layout_of<kQ4_1>();
    case kQ5_0: return layout_of<kQ5_0>();
    case kQ8_0: return layout_of<kQ8_0>();
    case kQ4_K: return layout_of<kQ4_K>();
    case kQ6_K: return layout_of<kQ6_K>();
  }
  TORCH_CHECK(false, "unknown GGUF kernel format ", fmt);
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PAGEDLLM_A8_SIMD 1
#include "a8_quantize_cpu.h"
#include "grouped_cpu.h"

inline float half(const uint8_t* p) {  // one F16C instruction (the exact conversion)
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// One 32-value block j of a weight row: codes (uint8; Q8_0: int8) in value order, scales for
// values 0-15 / 16-31, the zero subtracted from the code and the offset added after scaling.
struct Block {
  __m256i c;
  float s0, s1, b;
};

inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 16 bytes of two 4-bit codes each -> 32 codes: low nibbles are values 0-15, high 16-31.
inline __m256i nibbles(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m), _mm_and_si128(raw, m));
}

// Bit i of 32 -> byte i = 0x10 or 0 (Q5_0's fifth bits; llama.cpp's bytes_from_bits_32).
inline __m256i fifth_bits(const uint8_t* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                         0x0101010101010101, 0x0000000000000000);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_and_si256(_mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}

// Q4_K's 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, int& sc, int& mn) {
  if (j < 4) {
    sc = q[j] & 63;
    mn = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

template <int F>
inline Block block(const uint8_t* row, int64_t j) {
  Block out{};
  if constexpr (F == kQ4_0 || F == kQ4_1 || F == kQ5_0 || F == kQ8_0) {
    const uint8_t* bp = row + j * Traits<F>::bytes;
    out.s0 = out.s1 = half(bp);
    if constexpr (F == kQ4_0) out.c = nibbles(bp + 2);
    if constexpr (F == kQ4_1) out.c = nibbles(bp + 4), out.b = half(bp + 2);
    if constexpr (F == kQ5_0) out.c = _mm256_or_si256(nibbles(bp + 6), fifth_bits(bp + 2));
    if constexpr (F == kQ8_0) out.c = load256(bp + 2);
  } else if constexpr (F == kQ4_K) {
    const uint8_t* bp = row + (j / 8) * Traits<F>::bytes;
    const int jj = static_cast<int>(j % 8);
    int sc, mn;
    scale_min_k4(jj, bp + 4, sc, mn);
    out.s0 = out.s1 = half(bp) * static_cast<float>(sc);  // exact: 11 x 6 bits
    out.b = -(half(bp + 2) * static_cast<float>(mn));
    const __m256i raw = load256(bp + 16 + 32 * (jj / 2));
    const __m256i m = _mm256_set1_epi8(15);
    out.c = _mm256_and_si256(jj % 2 ? _mm256_srli_epi16(raw, 4) : raw, m);
  } else {  // Q6_K: ql[128] qh[64] scales[16] d; value 128 h + 32 t + l of a super-block
    const uint8_t* bp = row + (j / 8) * Traits<F>::bytes;
    const int jj = static_cast<int>(j % 8), h = jj / 4, t = jj % 4;
    const __m256i ql = load256(bp + 64 * h + 32 * (t & 1));
    const __m256i qh = load256(bp + 128 + 32 * h);
    const __m256i lo = _mm256_and_si256(t >= 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(15));
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
    out.c = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    const float d = half(bp + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(bp + 192) + 8 * h + 2 * t;
    out.s0 = d * static_cast<float>(sc[0]);
    out.s1 = d * static_cast<float>(sc[1]);
  }
  return out;
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// MT rows of quantized x (from row m0) against one weight row: y[i * ldy] for i < MT. Per
// block the x block's 32 int8 values meet the weight codes in one maddubs + madd; the
// offset term is a scalar per block. noinline keeps the accumulators in registers (see
// simd_cpu.h's micro_f). (Four weight rows per call with the offsets as vector FMAs measured
// slower: 6.9 against 5.5 ms for SmolLM2's linears at M = 1, AVX2.)
template <int F, int MT>
__attribute__((noinline)) void dot_rows(const uint8_t* row, const QuantizedX& qx, int64_t m0,
                                        float* y, int64_t ldy) {
  using T = Traits<F>;
  __m256 acc[MT];
  float off[MT];
  for (int i = 0; i < MT; ++i) acc[i] = _mm256_setzero_ps(), off[i] = 0.f;
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t nb = qx.nblk, K = qx.K;
  for (int64_t j = 0; j < nb; ++j) {
    const Block b = block<F>(row, j);
    const __m256i wa = F == kQ8_0 ? _mm256_sign_epi8(b.c, b.c) : b.c;
    const __m256 sv = kSplit<F> ? _mm256_set_m128(_mm_set1_ps(b.s1), _mm_set1_ps(b.s0))
                               : _mm256_set1_ps(b.s0);
    // offset per unit of the scaled code sums: B - S * zero (per 16 values for Q6_K)
    const float o0 = b.b - b.s0 * static_cast<float>(T::zero);
    const float o1 = b.b - b.s1 * static_cast<float>(T::zero);
#pragma GCC unroll 4
    for (int i = 0; i < MT; ++i) {
      const int64_t m = m0 + i;
      const __m256i xq = load256(reinterpret_cast<const uint8_t*>(qx.q.data() + m * K + 32 * j));
      const __m256i p = _mm256_maddubs_epi16(wa, F == kQ8_0 ? _mm256_sign_epi8(xq, b.c) : xq);
      const __m256 pf = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
      const __m256 dx = _mm256_broadcast_ss(qx.d.data() + m * nb + j);
      acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(pf, dx), sv, acc[i]);
      if constexpr (kSplit<F>) {
        const float* f = qx.f.data() + m * 2 * nb + 2 * j;
        off[i] += o0 * f[0] + o1 * f[1];
      } else if constexpr (T::affine || T::zero != 0) {
        off[i] += o0 * qx.f32[m * nb + j];
      }
    }
  }
  for (int i = 0; i < MT; ++i) y[i * ldy] = hsum(acc[i]) + off[i];
}

template <int F, int MT>
void dot_tail(int rows, const uint8_t* row, const QuantizedX& qx, int64_t m0, float* y, int64_t ldy) {
  if constexpr (MT > 0) {
    if (rows == MT) return dot_rows<F, MT>(row, qx, m0, y, ldy);
    dot_tail<F, MT - 1>(rows, row, qx, m0, y, ldy);
  }
}

// The exact fp32 values of one weight row [K] (gguf.quants.dequantize's, bit for bit).
template <int F>
void deq_row(const uint8_t* row, int64_t K, float* out) {
  using T = Traits<F>;
  alignas(32) uint8_t codes[32];
  for (int64_t j = 0; j < K / 32; ++j) {
    const Block b = block<F>(row, j);
    _mm256_store_si256(reinterpret_cast<__m256i*>(codes), b.c);
    for (int v = 0; v < 4; ++v) {
      const __m128i c8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8 * v));
      __m256i c = F == kQ8_0 ? _mm256_cvtepi8_epi32(c8) : _mm256_cvtepu8_epi32(c8);
      if constexpr (T::zero != 0) c = _mm256_sub_epi32(c, _mm256_set1_epi32(T::zero));
      __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(v < 2 ? b.s0 : b.s1));
      if constexpr (T::affine) w = _mm256_add_ps(w, _mm256_set1_ps(b.b));
      _mm256_storeu_ps(out + 32 * j + 8 * v, w);
    }
  }
}

// dst[i * ldd + j] = src[j * lds + i] for an 8 x 8 block of floats.
inline void transpose8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// Weight rows [n0, n1) against the quantized rows [m0, m0 + M) of qx: y[m, n] (row stride N).
template <int F>
void int_rows_impl(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t N,
                   const QuantizedX& qx, int64_t m0, int64_t M, float* y) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    int64_t m = m0;
    for (; m + 4 <= m0 + M; m += 4) dot_rows<F, 4>(row, qx, m, y + m * N + n, N);
    if (m < m0 + M) dot_tail<F, 3>(static_cast<int>(m0 + M - m), row, qx, m, y + m * N + n, N);
  }
}

// Rows [0, M) of x against weight rows p * NB ... dequantized exactly into a panel (`panel`
// K x NB floats, `rows` 8 x K: scratch of the caller's thread).
template <int F>
void panel_impl(const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, int64_t p,
                const float* x, int64_t M, float* y, float* panel, float* rows) {
  const int64_t n0 = p * kNB, ncols = std::min<int64_t>(kNB, N - n0);
  // 8 weight rows at a time: dequantized along K, then turned into 8 panel columns by
  // 8 x 8 transposes (rows past N are zeros).
  for (int64_t c0 = 0; c0 < kNB; c0 += 8) {
    for (int64_t r = 0; r < 8; ++r) {
      if (c0 + r < ncols) deq_row<F>(w + (n0 + c0 + r) * row_bytes, K, rows + r * K);
      else std::fill(rows + r * K, rows + (r + 1) * K, 0.f);
    }
    for (int64_t k = 0; k < K; k += 8) transpose8(rows + k, K, panel + k * kNB + c0, kNB);
  }
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR) micro_f<kMR>(x + m * K, K, panel, K, y + m * N + n0, N, ncols);
  if (m < M) tail_f<kMR - 1>(static_cast<int>(M - m), x + m * K, K, panel, K, y + m * N + n0, N, ncols);
}

// `plan` (or none): lines asked for between 16-row tiles of the integer path (prefetch_plan_cpu.h).
template <int F>
void linear_impl(const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const float* x,
                 int64_t M, float* y, int64_t int_rows, PrefetchPlan* plan) {
  if (M <= int_rows) {
    const QuantizedX qx = quantize_x(x, M, K);
    // 16 weight rows an item; the plan advances with the thread's own share
    balanced_for((N + 15) / 16, [&](BalancedTurn& turn) {
      const int64_t first = turn.first(), own = turn.own();
      for (int64_t i; (i = turn.next()) >= 0;) {
        if (plan && i >= first && i < first + own) plan->advance(i - first, own);
        int_rows_impl<F>(w, row_bytes, 16 * i, std::min(N, 16 * (i + 1)), N, qx, 0, M, y);
      }
    }, M >= kStealRows);
    return;
  }
  const int64_t P = (N + kNB - 1) / kNB;
  balanced_for(P, [&](BalancedTurn& turn) {
    std::vector<float> panel(K * kNB), rows(8 * K);
    for (int64_t p; (p = turn.next()) >= 0;)
      panel_impl<F>(w, row_bytes, N, K, p, x, M, y, panel.data(), rows.data());
  }, M >= kStealRows);
}

// Weight rows per work item of the grouped int8-activation path (linear_impl's grain).
constexpr int64_t kIntRowTile = 16;
// Rows of one expert per work item of the grouped exact path.
constexpr int64_t kGroupRowTile = 256;

// Every expert's rows in one parallel region (grouped_cpu.h): w [E, N, row_bytes]; an expert
// with at most int_rows rows runs int8 activations, one with more the exact panels, as its
// linear_impl would: equal to gguf_a8_linear once per expert, bit for bit.
template <int F>
void grouped_impl(const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const float* x,
                  const int64_t* off, int64_t E, float* y, int64_t int_rows) {
  const int64_t P = (N + kNB - 1) / kNB, C = (N + kIntRowTile - 1) / kIntRowTile;
  bool any_int = false;
  for (int64_t e = 0; e < E; ++e) any_int |= off[e + 1] > off[e] && off[e + 1] - off[e] <= int_rows;
  const QuantizedX qx = any_int ? quantize_x(x, off[E], K) : QuantizedX{K, K / 32, {}, {}, {}, {}, {}};
  const auto tiles = group_tiles(off, E, [&](int64_t n) { return n <= int_rows ? C : P; },
                                 kGroupRowTile);
  run_tiles(tiles, [&](const GroupTile* t, const GroupTile* end) {
    std::vector<float> panel, rows;
    for (; t < end; ++t) {
      const uint8_t* we = w + t->expert * N * row_bytes;
      if (t->group_rows <= int_rows) {
        int_rows_impl<F>(we, row_bytes, t->col * kIntRowTile,
                         std::min(N, (t->col + 1) * kIntRowTile), N, qx, t->row0, t->rows, y);
      } else {
        panel.resize(K * kNB), rows.resize(8 * K);
        panel_impl<F>(we, row_bytes, N, K, t->col, x + t->row0 * K, t->rows, y + t->row0 * N,
                      panel.data(), rows.data());
      }
    }
  });
}

template <typename Fn>
void dispatch(int64_t fmt, Fn&& fn) {
  switch (fmt) {
    case kQ4_0: return fn(std::integral_constant<int, kQ4_0>{});
    case kQ4_1: return fn(std::integral_constant<int, kQ4_1>{});
    case kQ5_0: return fn(std::integral_constant<int, kQ5_0>{});
    case kQ8_0: return fn(std::integral_constant<int, kQ8_0>{});
    case kQ4_K: return fn(std::integral_constant<int, kQ4_K>{});
    case kQ6_K: return fn(std::integral_constant<int, kQ6_K>{});
  }
  TORCH_CHECK(false, "unknown GGUF kernel format ", fmt);
}
#else
#define PAGEDLLM_A8_SIMD 0
#endif

// The weight's [N, row_bytes] bytes, checked against the format and K.
int64_t checked_row_bytes(int64_t fmt, const torch::Tensor& w, int64_t K) {
  const Layout l = layout(fmt);
  TORCH_CHECK(w.dim() == 2 && w.dtype() == torch::kUInt8 && w.is_contiguous(),
              "gguf_a8: weight must be contiguous uint8 [N, row bytes]");
  TORCH_CHECK(K > 0 && K % l.values == 0, "gguf_a8: K=", K, " is not whole blocks of ", l.values);
  TORCH_CHECK(w.size(1) == K / l.values * l.bytes, "gguf_a8: rows of ", w.size(1),
              " bytes, K=", K, " needs ", K / l.values * l.bytes);
  return w.size(1);
}

}  // namespace

bool gguf_a8_available() { return PAGEDLLM_A8_SIMD; }

torch::Tensor gguf_a8_linear(torch::Tensor x, int64_t fmt, torch::Tensor w, int64_t K,
                             int64_t int_rows) {
  return gguf_a8_linear_prefetching(std::move(x), fmt, std::move(w), K, int_rows, nullptr);
}

torch::Tensor gguf_a8_linear_prefetching(torch::Tensor x, int64_t fmt, torch::Tensor w, int64_t K,
                                         int64_t int_rows, PrefetchPlan* plan) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous() && x.size(1) == K,
              "gguf_a8_linear: x must be contiguous fp32 [M, ", K, "]");
  const int64_t row_bytes = checked_row_bytes(fmt, w, K), N = w.size(0), M = x.size(0);
  auto y = torch::empty({M, N}, x.options());
#if PAGEDLLM_A8_SIMD
  dispatch(fmt, [&](auto f) {
    linear_impl<decltype(f)::value>(w.data_ptr<uint8_t>(), row_bytes, N, K, x.data_ptr<float>(),
                                    M, y.data_ptr<float>(), int_rows, plan);
  });
#else
  (void)plan;
  TORCH_CHECK(false, "gguf_a8_linear needs AVX2 + FMA + F16C (built without them)");
#endif
  return y;
}

// Rows `ids` of the weight as exact fp32 [len(ids), K]: embedding lookups, and the reference.
// The experts of a MoE layer in one call: w [E, N, row bytes] (expert e's gguf_a8_linear
// weight), x's rows sorted by expert, offsets [E + 1] (grouped_cpu.h).
torch::Tensor gguf_a8_grouped_linear(torch::Tensor x, int64_t fmt, torch::Tensor w, int64_t K,
                                     torch::Tensor offsets, int64_t int_rows) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous() && x.size(1) == K,
              "gguf_a8_grouped_linear: x must be contiguous fp32 [R, ", K, "]");
  TORCH_CHECK(w.dim() == 3 && w.size(0) > 0, "gguf_a8_grouped_linear: w must be stacked [E, N, row bytes]");
  const int64_t E = w.size(0), N = w.size(1), R = x.size(0);
  const int64_t row_bytes = checked_row_bytes(fmt, w[0], K);
  TORCH_CHECK(w.is_contiguous(), "gguf_a8_grouped_linear: w must be contiguous");
  const int64_t* off = checked_offsets(offsets, E, R);
  auto y = torch::empty({R, N}, x.options());
#if PAGEDLLM_A8_SIMD
  dispatch(fmt, [&](auto f) {
    grouped_impl<decltype(f)::value>(w.data_ptr<uint8_t>(), row_bytes, N, K, x.data_ptr<float>(),
                                     off, E, y.data_ptr<float>(), int_rows);
  });
#else
  TORCH_CHECK(false, "gguf_a8_grouped_linear needs AVX2 + FMA + F16C (built without them)");
#endif
  return y;
}

torch::Tensor gguf_a8_rows(torch::Tensor ids, int64_t fmt, torch::Tensor w, int64_t K) {
  const int64_t row_bytes = checked_row_bytes(fmt, w, K), N = w.size(0);
  auto idx = ids.to(torch::kLong).contiguous();
  const int64_t T = idx.numel();
  const int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(ip[t] >= 0 && ip[t] < N, "gguf_a8_rows: row ", ip[t], " out of range [0, ", N, ")");
  auto out = torch::empty({T, K}, torch::kFloat32);
#if PAGEDLLM_A8_SIMD
  float* op = out.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  dispatch(fmt, [&](auto f) {
    at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) deq_row<decltype(f)::value>(wp + ip[t] * row_bytes, K, op + t * K);
    });
  });
#else
  TORCH_CHECK(false, "gguf_a8_rows needs AVX2 + FMA + F16C (built without them)");
#endif
  return out;
}

#pragma GCC pop_options

void register_gguf_a8_kernels(pybind11::module_& m) {
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("gguf_a8_available", &gguf_a8_available, nogil,
        "whether the int8-activation GGUF kernels are built (AVX2 + FMA + F16C)");
  m.def("gguf_a8_linear", &gguf_a8_linear, nogil,
        "y = x @ W^T over GGUF rows: int8 activations up to int_rows rows, exact fp32 above");
  m.def("gguf_a8_grouped_linear", &gguf_a8_grouped_linear, nogil,
        "MoE experts in one call: rows of x sorted by expert (offsets [E + 1]) times their "
        "expert's GGUF rows (stacked [E, N, row bytes]), int8 activations up to int_rows rows");
  m.def("gguf_a8_rows", &gguf_a8_rows, nogil, "rows W[ids] of GGUF rows as fp32 (exact)");
}
