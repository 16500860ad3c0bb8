// bf16 MoE experts in one call per projection (grouped_cpu.h draws the work items): rows of
// fp32 x sorted by expert, every expert's bf16 weight packed once at load
// (model/layers/moe/grouped_bf16.py) into panels of kNB = 32 output columns, k in pairs:
//
//   packed bf16 [E, P, K2, kNB, 2]    K2 = ceil(K / 2), N and K zero-padded
//   panel p, pair k2:  w[c0][2k2] w[c0][2k2+1] w[c1][2k2] w[c1][2k2+1] ... w[c31][2k2+1]
//                      = 128 bytes: one 32-bit lane per column holding (even k, odd k)
//
// One layout serves every path, so the ISA is chosen per call (at run time, from the CPU):
//
//   exact (any group below min_bf16_rows, every group where the CPU lacks avx512_bf16):
//     fp32 x times the weights widened exactly to fp32 (a 16-bit shift of each lane's low
//     half gives w[2k], masking its low half gives w[2k+1]), one k-ordered fp32 FMA chain per
//     output: bit for bit packed_linear (gemm_cpu.cpp) over the widened weights.
//       avx512   MR = 8 rows x 32 columns per pass      avx2   MR = 4 rows x 16 columns
//       (a group of up to 4 rows: 64 columns; one row on avx2: 32, for more FMA chains)
//       generic  plain C++ (any CPU; what a non-x86 build runs)
//   avx512_bf16 (groups of at least min_bf16_rows rows): the group's rows rounded to bf16
//     (round to nearest even) once per call, then vdpbf16ps, 12 rows x 32 columns per pass:
//     each step adds two exact products to an fp32 accumulator (odd k, then even k).
//
// Why both: up to kWideRows rows a pass over two panels reads weights near memory speed and
// the result is exact; from there on the widened path is bound by its FMAs, and the bf16 dot
// product does twice the multiply-adds per instruction (grouped_bf16.py's MIN_BF16_ROWS has
// the numbers). y is fp32 [R, N].
#include <torch/csrc/utils/pybind.h>  // register_*(m): pybind11, torch's Tensor casters
#include "kernels_cpu.h"
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {
#include "grouped_cpu.h"

#pragma GCC push_options
#pragma GCC optimize("no-associative-math")

constexpr int kNB = 32;                 // output columns per panel
constexpr int64_t kPanelRow = kNB * 2;   // bf16 values in one panel row (one k pair)
constexpr int64_t kRowTile = 256;       // rows of one expert per work item
constexpr int64_t kWideRows = 4;        // groups up to this many rows: two panels per pass

enum class Isa { generic, avx2, avx512, avx512_bf16 };
const char* const kIsaNames[] = {"generic", "avx2", "avx512", "avx512_bf16"};

// The ISAs this CPU runs, best first (the best is the default).
std::vector<Isa> cpu_isas() {
  std::vector<Isa> isas;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  if (avx512 && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16"))
    isas.push_back(Isa::avx512_bf16);
  if (avx512) isas.push_back(Isa::avx512);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isas.push_back(Isa::avx2);
#endif
  isas.push_back(Isa::generic);
  return isas;
}

Isa pick_isa(const std::string& want) {
  static const std::vector<Isa> isas = cpu_isas();
  if (want.empty()) return isas.front();
  for (Isa isa : isas)
    if (want == kIsaNames[static_cast<int>(isa)]) return isa;
  std::string have;
  for (Isa isa : isas) have += std::string(have.empty() ? "" : ", ") + kIsaNames[static_cast<int>(isa)];
  TORCH_CHECK(false, "bf16 grouped linear: ISA '", want, "' is not one this CPU runs (", have, ")");
  return isas.front();
}

inline void store_row(float* y, const float* out, int64_t ncols) {
  std::memcpy(y, out, ncols * sizeof(float));
}

// ---- generic: plain C++, one k-ordered chain per output (the compiler vectorizes over columns)
template <int MR>
void micro_generic(const float* x, int64_t ldx, const uint16_t* wp, int64_t K, float* y,
                   int64_t ldy, int64_t ncols) {
  float acc[MR][kNB] = {};
  for (int64_t k = 0; k < K; ++k) {
    const uint16_t* row = wp + (k / 2) * kPanelRow + (k & 1);
    float w[kNB];
    for (int j = 0; j < kNB; ++j) {
      const uint32_t bits = static_cast<uint32_t>(row[2 * j]) << 16;
      std::memcpy(&w[j], &bits, 4);
    }
    for (int i = 0; i < MR; ++i) {
      const float xv = x[i * ldx + k];
      for (int j = 0; j < kNB; ++j) acc[i][j] += xv * w[j];
    }
  }
  for (int i = 0; i < MR; ++i) store_row(y + i * ldy, acc[i], ncols);
}

#if defined(__x86_64__)
// ---- avx2: a 256-bit load is 8 columns' (even, odd) pairs. Rows in passes of MR over half a
// panel (NV = 2 vectors: 16 ymm registers hold no more), one row over the whole panel (NV = 4:
// four FMA chains, so decode's single row is not bound by the FMA latency).
#define PAGEDLLM_AVX2 __attribute__((target("avx2,fma")))

template <int MR, int NV>
PAGEDLLM_AVX2 __attribute__((noinline)) void span_avx2(const float* x, int64_t ldx,
                                                       const uint16_t* wp, int64_t K, float* y,
                                                       int64_t ldy, int64_t ncols) {
  __m256 acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_setzero_ps();
  const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t pairs = K / 2;
  for (int64_t k2 = 0; k2 < pairs; ++k2) {
    __m256 even[NV], odd[NV];
    for (int j = 0; j < NV; ++j) {
      const __m256i v =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + k2 * kPanelRow + 16 * j));
      even[j] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      odd[j] = _mm256_castsi256_ps(_mm256_and_si256(v, hi_mask));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 x0 = _mm256_set1_ps(x[i * ldx + 2 * k2]);
      const __m256 x1 = _mm256_set1_ps(x[i * ldx + 2 * k2 + 1]);
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(x0, even[j], acc[i][j]);
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(x1, odd[j], acc[i][j]);
    }
  }
  if (K & 1) {  // the last k alone (its odd partner is padding)
    __m256 even[NV];
    for (int j = 0; j < NV; ++j)
      even[j] = _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + pairs * kPanelRow + 16 * j)),
          16));
    for (int i = 0; i < MR; ++i) {
      const __m256 x0 = _mm256_set1_ps(x[i * ldx + K - 1]);
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(x0, even[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float out[8 * NV];
    for (int j = 0; j < NV; ++j) _mm256_storeu_ps(out + 8 * j, acc[i][j]);
    store_row(y + i * ldy, out, std::min<int64_t>(ncols, 8 * NV));
  }
}

template <int MR>
PAGEDLLM_AVX2 void micro_avx2(const float* x, int64_t ldx, const uint16_t* wp, int64_t K,
                              float* y, int64_t ldy, int64_t ncols) {
  if constexpr (MR == 1) {
    span_avx2<1, 4>(x, ldx, wp, K, y, ldy, ncols);
  } else {
    span_avx2<MR, 2>(x, ldx, wp, K, y, ldy, std::min<int64_t>(ncols, 16));
    if (ncols > 16) span_avx2<MR, 2>(x, ldx, wp + 32, K, y + 16, ldy, ncols - 16);
  }
}

// ---- avx512: a 512-bit load is 16 columns' (even, odd) pairs, two per panel row. NP = 2
// runs two panels (ps values apart) in one pass: a group of a few rows (decode) then has four
// independent FMA chains per row instead of two, enough to hide the FMA latency that bounds
// one panel's pass (the sums themselves are unchanged).
#define PAGEDLLM_AVX512 __attribute__((target("avx512f,avx512bw,fma")))

template <int MR, int NP>
PAGEDLLM_AVX512 inline void store_tile512(__m512 (&acc)[MR][2 * NP], float* y, int64_t ldy,
                                          int64_t ncols) {
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NP; ++q) {
      const int64_t cols = std::min<int64_t>(kNB, ncols - q * kNB);
      float* yq = y + i * ldy + q * kNB;
      if (cols == kNB) {
        _mm512_storeu_ps(yq, acc[i][2 * q]);
        _mm512_storeu_ps(yq + 16, acc[i][2 * q + 1]);
      } else if (cols > 0) {
        float out[kNB];
        _mm512_storeu_ps(out, acc[i][2 * q]);
        _mm512_storeu_ps(out + 16, acc[i][2 * q + 1]);
        store_row(yq, out, cols);
      }
    }
}

template <int MR, int NP = 1>
PAGEDLLM_AVX512 __attribute__((noinline)) void micro_avx512(const float* x, int64_t ldx,
                                                            const uint16_t* wp, int64_t K,
                                                            float* y, int64_t ldy,
                                                            int64_t ncols, int64_t ps = 0) {
  __m512 acc[MR][2 * NP];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 2 * NP; ++j) acc[i][j] = _mm512_setzero_ps();
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t pairs = K / 2;
  for (int64_t k2 = 0; k2 < pairs; ++k2) {
    __m512 even[2 * NP], odd[2 * NP];
    for (int j = 0; j < 2 * NP; ++j) {
      const __m512i v = _mm512_loadu_si512(wp + (j / 2) * ps + k2 * kPanelRow + (j % 2) * 32);
      even[j] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      odd[j] = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 x0 = _mm512_set1_ps(x[i * ldx + 2 * k2]);
      const __m512 x1 = _mm512_set1_ps(x[i * ldx + 2 * k2 + 1]);
      for (int j = 0; j < 2 * NP; ++j) acc[i][j] = _mm512_fmadd_ps(x0, even[j], acc[i][j]);
      for (int j = 0; j < 2 * NP; ++j) acc[i][j] = _mm512_fmadd_ps(x1, odd[j], acc[i][j]);
    }
  }
  if (K & 1) {  // the last k alone (its odd partner is padding)
    __m512 even[2 * NP];
    for (int j = 0; j < 2 * NP; ++j)
      even[j] = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_loadu_si512(wp + (j / 2) * ps + pairs * kPanelRow + (j % 2) * 32), 16));
    for (int i = 0; i < MR; ++i) {
      const __m512 x0 = _mm512_set1_ps(x[i * ldx + K - 1]);
      for (int j = 0; j < 2 * NP; ++j) acc[i][j] = _mm512_fmadd_ps(x0, even[j], acc[i][j]);
    }
  }
  store_tile512<MR, NP>(acc, y, ldy, ncols);
}

// ---- avx512_bf16: xb holds each row's bf16 pairs as 32-bit words (K2 per row); NP as above
#define PAGEDLLM_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

template <int MR, int NP = 1>
PAGEDLLM_BF16 __attribute__((noinline)) void micro_bf16(const uint32_t* xb, int64_t ldxb,
                                                        const uint16_t* wp, int64_t K2,
                                                        float* y, int64_t ldy, int64_t ncols,
                                                        int64_t ps = 0) {
  __m512 acc[MR][2 * NP];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 2 * NP; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k2 = 0; k2 < K2; ++k2) {
    __m512bh w[2 * NP];
    for (int j = 0; j < 2 * NP; ++j)
      w[j] = (__m512bh)_mm512_loadu_si512(wp + (j / 2) * ps + k2 * kPanelRow + (j % 2) * 32);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xb[i * ldxb + k2]));
      for (int j = 0; j < 2 * NP; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, w[j]);
    }
  }
  store_tile512<MR, NP>(acc, y, ldy, ncols);
}

// Row r of x (K floats) as bf16 pairs: K2 32-bit words, round to nearest even, a zero after an
// odd K's last value.
PAGEDLLM_BF16 void round_row_bf16(const float* x, int64_t K, uint16_t* out) {
  int64_t k = 0;
  for (; k + 16 <= K; k += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + k)));
  if (k < K) {
    const __mmask16 m = static_cast<__mmask16>((1u << (K - k)) - 1);
    _mm256_mask_storeu_epi16(out + k, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + k)));
  }
  if (K & 1) out[K] = 0;
}
#endif  // __x86_64__

// Rows [0, M) through one micro-kernel `Micro<MR>` in passes of MR rows, the M % MR leftover
// with the micro-kernel of exactly that many rows.
template <int MR, template <int> class Micro, typename... Args>
inline void rows_tail(int rows, Args... args) {
  if constexpr (MR > 0) {
    if (rows == MR) return Micro<MR>::run(args...);
    rows_tail<MR - 1, Micro>(rows, args...);
  }
}

#define PAGEDLLM_MICRO(Name, fn)                                                        \
  template <int MR>                                                                     \
  struct Name {                                                                         \
    template <typename... A>                                                            \
    static void run(A... a) { fn<MR>(a...); }                                           \
  };
PAGEDLLM_MICRO(Generic, micro_generic)
#if defined(__x86_64__)
PAGEDLLM_MICRO(Avx2, micro_avx2)
PAGEDLLM_MICRO(Avx512, micro_avx512)
PAGEDLLM_MICRO(Bf16, micro_bf16)
#endif

// M fp32 rows of x (row stride ldx) against one panel, MR rows per pass: y[:, :ncols].
template <int MR, template <int> class Micro, typename X>
void panel_rows(const X* x, int64_t ldx, int64_t M, const uint16_t* wp, int64_t depth,
                float* y, int64_t ldy, int64_t ncols) {
  int64_t m = 0;
  for (; m + MR <= M; m += MR) Micro<MR>::run(x + m * ldx, ldx, wp, depth, y + m * ldy, ldy, ncols);
  if (m < M)
    rows_tail<MR - 1, Micro>(static_cast<int>(M - m), x + m * ldx, ldx, wp, depth, y + m * ldy,
                             ldy, ncols);
}

#if defined(__x86_64__)
// Two panels per pass (the second, if any, ps values after the first; ncols over both),
// M <= kWideRows rows; one panel's micro-kernel where only one is left (an odd P).
#define PAGEDLLM_WIDE(Name, fn)                                                          \
  struct Name {                                                                          \
    template <int MR, typename X>                                                        \
    static void run(const X* x, int64_t ldx, const uint16_t* wp, int64_t depth, float* y, \
                    int64_t ldy, int64_t ncols, int64_t ps) {                            \
      if (ncols > kNB) fn<MR, 2>(x, ldx, wp, depth, y, ldy, ncols, ps);                  \
      else fn<MR, 1>(x, ldx, wp, depth, y, ldy, ncols, 0);                               \
    }                                                                                    \
  };
PAGEDLLM_WIDE(Avx512Wide, micro_avx512)
PAGEDLLM_WIDE(Bf16Wide, micro_bf16)

template <class Wide, typename X>
void wide_rows(const X* x, int64_t ldx, int64_t M, const uint16_t* wp, int64_t depth, float* y,
               int64_t ldy, int64_t ncols, int64_t ps) {
  static_assert(kWideRows == 4, "one case per row count");
  switch (M) {
    case 1: return Wide::template run<1>(x, ldx, wp, depth, y, ldy, ncols, ps);
    case 2: return Wide::template run<2>(x, ldx, wp, depth, y, ldy, ncols, ps);
    case 3: return Wide::template run<3>(x, ldx, wp, depth, y, ldy, ncols, ps);
    default: return Wide::template run<4>(x, ldx, wp, depth, y, ldy, ncols, ps);
  }
}
#endif

int64_t bf16_panel_width() { return kNB; }

std::vector<std::string> bf16_isas() {
  std::vector<std::string> names;
  for (Isa isa : cpu_isas()) names.emplace_back(kIsaNames[static_cast<int>(isa)]);
  return names;
}

// y [R, N] = rows of expert e times W_e^T (module comment). `isa` "" picks this CPU's best.
torch::Tensor grouped_linear_impl(torch::Tensor x, torch::Tensor packed, int64_t N,
                                  torch::Tensor offsets, int64_t min_bf16_rows,
                                  const std::string& isa_name) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "bf16 grouped linear: x must be contiguous fp32 [R, K]");
  const int64_t R = x.size(0), K = x.size(1), K2 = (K + 1) / 2;
  TORCH_CHECK(packed.dim() == 5 && packed.scalar_type() == at::kBFloat16 &&
                  packed.is_contiguous() && packed.size(2) == K2 && packed.size(3) == kNB &&
                  packed.size(4) == 2 && packed.size(1) * kNB >= N,
              "bf16 grouped linear: weights not packed [E, P, ceil(K / 2), ", kNB,
              ", 2] bf16 for K = ", K);
  const int64_t E = packed.size(0), P = packed.size(1);
  const int64_t* off = checked_offsets(offsets, E, R);
  const Isa isa = pick_isa(isa_name);
  auto y = torch::empty({R, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint16_t* w = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  const int64_t expert_stride = P * K2 * kPanelRow;
  const int64_t panel_stride = K2 * kPanelRow;
  // AVX-512 items of a group of at most kWideRows rows span two panels (micro_avx512's NP)
  const bool avx512 = isa == Isa::avx512 || isa == Isa::avx512_bf16;
  auto wide = [&](int64_t rows) { return avx512 && rows <= kWideRows; };
  const auto tiles = group_tiles(
      off, E, [&](int64_t rows) { return wide(rows) ? (P + 1) / 2 : P; }, kRowTile);
#if defined(__x86_64__)
  // The rows of groups that take the bf16 dot product, rounded once (not once per panel).
  std::vector<uint16_t> xb;
  if (isa == Isa::avx512_bf16) {
    std::vector<int64_t> rows;
    for (int64_t e = 0; e < E; ++e)
      if (off[e + 1] - off[e] >= min_bf16_rows)
        for (int64_t r = off[e]; r < off[e + 1]; ++r) rows.push_back(r);
    if (!rows.empty()) {
      xb.resize(R * 2 * K2);
      at::parallel_for(0, static_cast<int64_t>(rows.size()), 16, [&](int64_t b, int64_t end) {
        for (int64_t i = b; i < end; ++i)
          round_row_bf16(xp + rows[i] * K, K, xb.data() + rows[i] * 2 * K2);
      });
    }
  }
#endif
  run_tiles(tiles, [&](const GroupTile* t, const GroupTile* end) {
    for (; t < end; ++t) {
      const float* xr = xp + t->row0 * K;
#if defined(__x86_64__)
      if (wide(t->group_rows)) {
        const int64_t p = 2 * t->col, ncols = std::min<int64_t>(2 * kNB, N - p * kNB);
        const uint16_t* wp = w + t->expert * expert_stride + p * panel_stride;
        float* yr = yp + t->row0 * N + p * kNB;
        if (isa == Isa::avx512_bf16 && t->group_rows >= min_bf16_rows) {
          const auto* xbr = reinterpret_cast<const uint32_t*>(xb.data() + t->row0 * 2 * K2);
          wide_rows<Bf16Wide>(xbr, K2, t->rows, wp, K2, yr, N, ncols, panel_stride);
        } else {
          wide_rows<Avx512Wide>(xr, K, t->rows, wp, K, yr, N, ncols, panel_stride);
        }
        continue;
      }
#endif
      const uint16_t* wp = w + t->expert * expert_stride + t->col * panel_stride;
      const int64_t ncols = std::min<int64_t>(kNB, N - t->col * kNB);
      float* yr = yp + t->row0 * N + t->col * kNB;
      switch (isa) {
#if defined(__x86_64__)
        case Isa::avx512_bf16:
          if (t->group_rows >= min_bf16_rows) {
            const auto* xbr = reinterpret_cast<const uint32_t*>(xb.data() + t->row0 * 2 * K2);
            panel_rows<12, Bf16>(xbr, K2, t->rows, wp, K2, yr, N, ncols);
            break;
          }
          [[fallthrough]];
        case Isa::avx512:
          panel_rows<8, Avx512>(xr, K, t->rows, wp, K, yr, N, ncols);
          break;
        case Isa::avx2:
          panel_rows<4, Avx2>(xr, K, t->rows, wp, K, yr, N, ncols);
          break;
#endif
        default:
          panel_rows<4, Generic>(xr, K, t->rows, wp, K, yr, N, ncols);
      }
    }
  });
  return y;
}

#pragma GCC pop_options
}  // namespace

// (kernels_cpu.h: also called by the C++ decode loop's MoE block, moe_decode_cpu.h)
torch::Tensor bf16_grouped_linear(torch::Tensor x, torch::Tensor packed, int64_t N,
                                  torch::Tensor offsets, int64_t min_bf16_rows,
                                  const std::string& isa_name) {
  return grouped_linear_impl(std::move(x), std::move(packed), N, std::move(offsets),
                             min_bf16_rows, isa_name);
}

void register_bf16_grouped_kernels(pybind11::module_& m) {
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("bf16_panel_width", &bf16_panel_width, nogil,
        "output columns per panel of bf16_grouped_linear's packed weights");
  m.def("bf16_isas", &bf16_isas, nogil,
        "the instruction sets bf16_grouped_linear can run on this CPU, best first");
  m.def("bf16_grouped_linear", &bf16_grouped_linear, nogil,
        "MoE experts in one call: fp32 rows of x sorted by expert (offsets [E + 1]) times "
        "their expert's bf16 weight packed [E, P, ceil(K / 2), 32, 2]; groups of at least "
        "min_bf16_rows rows round x to bf16 where the ISA has a bf16 dot product");
}
