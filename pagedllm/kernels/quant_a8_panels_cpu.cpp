// GGUF Q8_0, Q4_0, Q4_1, Q4_K and Q6_K weights with int8 activations (`--int8-activations` on a GGUF
// model): integer dot products at every M, llama.cpp's q8_0 / q4_0 / q4_1 x q8 dot products
// laid out as a GEMM. An int8 dot product does 4x (AVX2 maddubs) to 8x (AVX-512 VNNI vpdpbusd)
// the multiply-adds of an fp32 FMA per instruction: a decode step reads the file's bytes with
// a fraction of a per-row kernel's instructions, and large batches get past the fp32 path's
// FMA ceiling (W8A8).
//
// The file's blocks are repacked once at load (pagedllm/model/layers/quant/gguf_a8_panels.py)
// into panels of kNB output rows, no bigger than the file:
//
//   Q8_0  codes uint8 [P, K / 32, 8, kNB, 4]  codes 4t..4t+3 of block j of row p kNB + c,
//                                             + 128 (u8) for VNNI's u8 x s8 vpdpbusd, else s8
//   Q4_x  codes uint8 [P, K / 32, 4, kNB, 4]  byte b of lane (u, c): code 8u + b (low nibble)
//                                             and code 8u + 4 + b (high nibble), u8 0..15
//         d     fp16  [P, K / 32, kNB]        the block's scale (0 for rows past N)
//         m     fp16  [P, K / 32, kNB]        Q4_1's offset (w = d c + m); empty otherwise
//   Q4_K  Q4_x's codes, d and m fp32          a 32-value sub-block's d x sc and -dmin x m
//                                             (exact in fp32, not in fp16), w = d c + m
//   Q6_K  codes uint8 [P, K / 32, 8, kNB, 4]  Q8_0's lanes of u8 codes 0..63, w = S (c - 32)
//         d     fp32  [P, K / 32, 2, kNB]     S = d x sc of each 16-value half (exact)
//
// x is quantized per 32 values (a8_quantize_cpu.h: x ~ dx q, q in [-127, 127]); per block
//
//   sum_i w_i x_i  ~  d dx (sum c q - z sum q)  (+ m dx sum q for Q4_1)
//
// with z = 8 for Q4_0 (w = d (c - 8)) and z = 128 for VNNI's offset Q8_0 codes; Q6_K sums each
// half on its own, d dx sum c q - 32 d (dx sum q) with the quantizer's fp32 half sums. The inner sums
// are exact in int32, the block sums run in fp32 in k order, the same instructions for a row
// whatever M is: a row's result does not depend on the batch (batch-invariant). Not exact
// against fp32: the activation rounding is the error (docs/benchmarks.md measures it).
#include <torch/csrc/utils/pybind.h>  // register_*(m): pybind11, torch's Tensor casters
#include "torch_lite_cpu.h"
#include "kernels_cpu.h"  // PrefetchPlan, and this file's entry points
#include "balanced_for_cpu.h"  // balanced_for: threads that finish together
#include "filled_cpu.h"  // Filled: storage that starts uninitialized
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#pragma GCC push_options
#pragma GCC optimize("no-associative-math")  // the same k-ordered sums for every M

namespace {
#include "simd_cpu.h"

#include "gguf_formats_cpu.h"
#include "int8_dot_cpu.h"
#include "a8_panel_ptrs_cpu.h"  // kF32Scales, kAffine, scale_at, PanelPtrs, with_format

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PAGEDLLM_A8P_SIMD 1
#include "a8_quantize_cpu.h"
#include "grouped_cpu.h"

constexpr bool kVNNI = kXOffset;  // int8_dot_cpu.h's VNNI branch
// rows of x per micro-kernel call: 2 x MR int32 and 2 x MR fp32 accumulators
constexpr int kMRQ = kVW == 16 ? 6 : 3;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// acc += u8 codes (lanes of 4) . the 4 s8 values of xquad, exact. VNNI only: without it Q8_0
// takes dot4's sign trick and the 4-bit codes the int16 sums below.
inline void dotu(acc8& acc, VI w, int32_t xquad) {
  acc = _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(xquad));
}
#endif

// Without VNNI, maddubs' int16 pair sums of 4-bit codes (|c q + c' q'| <= 2 x 15 x 127) add up
// in int16 over a whole block (8 x 3810 < 32767): one widening madd per block instead of one
// per maddubs.
#if defined(__AVX512BW__)
inline VI pairs16(VI w, int32_t xquad) { return _mm512_maddubs_epi16(w, _mm512_set1_epi32(xquad)); }
inline VI add16(VI a, VI b) { return _mm512_add_epi16(a, b); }
inline VI widen16(VI s) { return _mm512_madd_epi16(s, _mm512_set1_epi16(1)); }
#else
inline VI pairs16(VI w, int32_t xquad) { return _mm256_maddubs_epi16(w, _mm256_set1_epi32(xquad)); }
inline VI add16(VI a, VI b) { return _mm256_add_epi16(a, b); }
inline VI widen16(VI s) { return _mm256_madd_epi16(s, _mm256_set1_epi16(1)); }
#endif

#if defined(__AVX512F__)
inline VI iload(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline VI nib_lo(VI v) { return _mm512_and_si512(v, _mm512_set1_epi8(15)); }
inline VI nib_hi(VI v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15)); }
#else
inline VI iload(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline VI nib_lo(VI v) { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }
inline VI nib_hi(VI v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15)); }
#endif

// Keeps v in a register at this point of the schedule (an empty asm the compiler cannot
// move sums across).
inline void pin(VI& v) { asm volatile("" : "+x"(v)); }

// 4-byte lane rows per block: a byte a code (Q8_0, Q6_K) or two (the 4-bit formats)
template <int F> constexpr int kLaneGroups = F == kQ8_0 || F == kQ6_K ? 8 : 4;
// what the codes' sum x q carries beyond sum w x / d: z sum q
template <int F> constexpr int kZero = F == kQ4_0 ? 8 : (F == kQ8_0 && kVNNI) ? 128 : 0;

// MR rows of quantized x over one panel. fq: the rows' fp32 block sums (Q6_K: half sums, two
// a block).
template <int F, int MR>
__attribute__((noinline)) void micro(const int8_t* xq, int64_t K, const float* dx,
                                     const int32_t* sq, const float* fq, int64_t nb,
                                     const uint8_t* codes, const uint16_t* d, const uint16_t* mo,
                                     float* y, int64_t ldy, int64_t ncols) {
  constexpr int G = kLaneGroups<F>, H = kScalesPerBlock<F>, GH = G / H;
  V acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vzero();
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* wj = codes + j * G * kNB * 4;
    const int8_t* xj = xq + 32 * j;
    for (int hf = 0; hf < H; ++hf) {  // (one pass but for Q6_K's two halves)
      acc8 dot[MR][2];
      for (int i = 0; i < MR; ++i) dot[i][0] = dot[i][1] = zero8();
#pragma GCC unroll 8
      for (int gg = 0; gg < GH; ++gg) {
        const int g = hf * GH + gg;
        const VI w0 = iload(wj + g * kNB * 4), w1 = iload(wj + g * kNB * 4 + kVW * 4);
        for (int i = 0; i < MR; ++i) {
          int32_t xa;
          if constexpr (F == kQ8_0 || F == kQ6_K) {  // a byte a code
            std::memcpy(&xa, xj + i * K + 4 * g, 4);
            if constexpr (kVNNI) {
              dotu(dot[i][0], w0, xa);
              dotu(dot[i][1], w1, xa);
            } else if constexpr (F == kQ8_0) {  // s8 codes: |x| x sign(w, x)
              dot4(dot[i][0], xa, reinterpret_cast<const int8_t*>(wj + g * kNB * 4));
              dot4(dot[i][1], xa, reinterpret_cast<const int8_t*>(wj + g * kNB * 4 + kVW * 4));
            } else {  // Q6_K's u8 codes 0..63: a pair sum reaches 2 x 63 x 127, widened at once
              dot[i][0] = iadd(dot[i][0], widen16(pairs16(w0, xa)));
              dot[i][1] = iadd(dot[i][1], widen16(pairs16(w1, xa)));
            }
          } else {
            int32_t xb;
            std::memcpy(&xa, xj + i * K + 8 * g, 4);
            std::memcpy(&xb, xj + i * K + 8 * g + 4, 4);
            if constexpr (kVNNI) {
              dotu(dot[i][0], nib_lo(w0), xa);
              dotu(dot[i][0], nib_hi(w0), xb);
              dotu(dot[i][1], nib_lo(w1), xa);
              dotu(dot[i][1], nib_hi(w1), xb);
            } else {  // int16 sums in dot until the block ends (widened below)
              dot[i][0] = add16(dot[i][0], add16(pairs16(nib_lo(w0), xa), pairs16(nib_hi(w0), xb)));
              dot[i][1] = add16(dot[i][1], add16(pairs16(nib_lo(w1), xa), pairs16(nib_hi(w1), xb)));
              // integer adds reassociate: unpinned, GCC computed a block's 16 maddubs first and
              // spilled them all to the stack before adding (AVX2, Zen 3 profile)
              pin(dot[i][0]);
              pin(dot[i][1]);
            }
          }
        }
      }
      if constexpr (F != kQ8_0 && F != kQ6_K && !kVNNI)
        for (int i = 0; i < MR; ++i) dot[i][0] = widen16(dot[i][0]), dot[i][1] = widen16(dot[i][1]);
      const int64_t si = (j * H + hf) * kNB;
      const V d0 = scale_v<F>(d, si), d1 = scale_v<F>(d, si + kVW);
      V m0 = vzero(), m1 = vzero();
      if constexpr (kAffine<F>) m0 = scale_v<F>(mo, j * kNB), m1 = scale_v<F>(mo, j * kNB + kVW);
      for (int i = 0; i < MR; ++i) {
        const V s = vset(dx[i * nb + j]);
        VI a0 = dot[i][0], a1 = dot[i][1];
        if constexpr (kZero<F> != 0) {
          const VI z = iset(kZero<F> * sq[i * nb + j]);
          a0 = isub(a0, z);
          a1 = isub(a1, z);
        }
        acc[i][0] = vfma(vcvt(a0), vmul(d0, s), acc[i][0]);
        acc[i][1] = vfma(vcvt(a1), vmul(d1, s), acc[i][1]);
        if constexpr (kAffine<F>) {  // + m dx sum q
          const V f = vset(fq[i * nb + j]);
          acc[i][0] = vfma(m0, f, acc[i][0]);
          acc[i][1] = vfma(m1, f, acc[i][1]);
        } else if constexpr (F == kQ6_K) {  // - 32 S dx sum q over the half
          const V f = vset(-32.f * fq[i * 2 * nb + 2 * j + hf]);
          acc[i][0] = vfma(d0, f, acc[i][0]);
          acc[i][1] = vfma(d1, f, acc[i][1]);
        }
      }
    }
  }
  store_tile<MR>(acc, y, ldy, ncols);
}

template <int F, int MR>
void micro_tail(int rows, const int8_t* xq, int64_t K, const float* dx, const int32_t* sq,
                const float* fq, int64_t nb, const uint8_t* codes, const uint16_t* d,
                const uint16_t* mo, float* y, int64_t ldy, int64_t ncols) {
  if constexpr (MR > 0) {
    if (rows == MR) return micro<F, MR>(xq, K, dx, sq, fq, nb, codes, d, mo, y, ldy, ncols);
    micro_tail<F, MR - 1>(rows, xq, K, dx, sq, fq, nb, codes, d, mo, y, ldy, ncols);
  }
}

#include "a8_panel_tiles_cpu.h"

// Row m's fp32 block sums as micro<F> reads them: the quantizer's half sums for Q6_K (two a
// block), its block sums otherwise.
template <int F>
const float* block_sums(const QuantizedX& qx, int64_t m) {
  return F == kQ6_K ? qx.f.data() + m * 2 * qx.nblk : qx.f32.data() + m * qx.nblk;
}

// Quantized rows [m0, m0 + M) of qx against panel p into y (row m0's kNB outputs, row stride
// ldy); whole 16-row tiles on the matrix tiles when `tiles` is on (the caller's thread has
// them configured: TileScope), the rest (all of them otherwise) on the vector micro-kernels.
template <int F>
void panel_rows(const QuantizedX& qx, int64_t m0, int64_t M, const uint8_t* codes,
                const uint16_t* d, const uint16_t* mo, int64_t N, int64_t p, float* y,
                int64_t ldy, TileMode tiles) {
  const int64_t K = qx.K, nb = qx.nblk;
  const int64_t codes_per_panel = nb * kLaneGroups<F> * kNB * 4;
  const int8_t* xq = qx.q.data();
  const int64_t ncols = std::min<int64_t>(kNB, N - p * kNB);
  const uint8_t* pc = codes + p * codes_per_panel;
  const uint16_t *pd = scale_at<F>(d, p * nb * kScalesPerBlock<F> * kNB),
                 *pm = mo ? scale_at<F>(mo, p * nb * kNB) : nullptr;
  int64_t m = tile_rows_of_panel<F>(tiles, qx, m0, m0 + M, pc, pd, pm, y, ldy, ncols);
  for (; m + kMRQ <= m0 + M; m += kMRQ)
    micro<F, kMRQ>(xq + m * K, K, qx.d.data() + m * nb, qx.sum.data() + m * nb,
                   block_sums<F>(qx, m), nb, pc, pd, pm, y + (m - m0) * ldy, ldy, ncols);
  if (m < m0 + M)
    micro_tail<F, kMRQ - 1>(static_cast<int>(m0 + M - m), xq + m * K, K, qx.d.data() + m * nb,
                            qx.sum.data() + m * nb, block_sums<F>(qx, m), nb, pc, pd, pm,
                            y + (m - m0) * ldy, ldy, ncols);
}

// panel_rows into y [rows, N] at row m0, column p kNB.
template <int F>
void panel_impl(const QuantizedX& qx, int64_t m0, int64_t M, const uint8_t* codes,
                const uint16_t* d, const uint16_t* mo, int64_t N, int64_t p, float* y,
                TileMode tiles) {
  panel_rows<F>(qx, m0, M, codes, d, mo, N, p, y + m0 * N + p * kNB, N, tiles);
}

// Rows per thread from which the T threads split a call's rows instead of its panels: thread t
// computes every panel for rows [t M / T, (t + 1) M / T), the rows the step's other kernels
// (quantizer, norms, RoPE, SiLU) also give it, so the rows it writes are the rows it reads
// next; split by panels, every output row holds columns from every thread. When a VM's two
// vCPUs sit on different dies a cache line crossing between them costs ~350 ns there and back
// (~80 on one die; this Zen 4 VM moves between the two every few seconds to minutes). SmolLM2
// Q4_1, 2 threads, one process alternating the splits, mostly on two dies: 512-token prefill
// 1.16x (1,470-1,591 -> 1,726-1,858 tok/s), offline 64 x 128/128 1.04x. Layer GEMM chains: on
// one die 512 rows 1.02-1.03x, 1,024 1.01x; on two dies 512 1.03-1.09x, 1,024 1.11-1.13x. Each
// thread then reads every panel: on one die 128 rows (64 a thread) ran 0.98x and 256 1.00x, so
// decode batches keep the panel split, and a many-core server splits rows only where a
// thread's share still pays for reading all of the weights.
constexpr int64_t kRowSplitRowsPerThread = 128;
// Rows an item of that split (balanced_for_cpu.h): a thread runs its own rows in runs of
// several items, each run over every panel; a thread done with its own takes 32 rows at a
// time from the back of another's (one row alone would read every panel for one row).
// Through the engine with the int8 prompt rows (PAGEDLLM_PROMPT_TILES=off), Sapphire Rapids
// class VM, ABBA against the fixed split: prefill 512 1.06x (0.83-1.23 a round), 2,000
// tokens 1.04x (0.89-1.23).
constexpr int64_t kRowItem = 32;

// `plan` (or none): lines asked for between the panels (prefetch_plan_cpu.h).
template <int F>
void linear_impl(const QuantizedX& qx, int64_t M, const uint8_t* codes, const uint16_t* d,
                 const uint16_t* mo, int64_t N, float* y, PrefetchPlan* plan) {
  const int64_t P = (N + kNB - 1) / kNB;
  const TileMode tiles = tiles_for_rows(M);
  const int64_t threads = at::get_num_threads();
  const bool by_rows = threads > 1 && M >= kRowSplitRowsPerThread * threads;
  if (by_rows) {  // each run of a thread's rows [m0, m1) x every panel
    balanced_for((M + kRowItem - 1) / kRowItem, [&](BalancedTurn& turn) {
      const TileScope scope(tiles, kA8Tiles);
      for (int64_t i, e; (i = turn.next_run(&e)) >= 0;) {
        const int64_t m0 = i * kRowItem, m1 = std::min(M, e * kRowItem);
        for (int64_t p = 0; p < P; ++p) {
          if (plan) plan->advance(p, P);
          panel_impl<F>(qx, m0, m1 - m0, codes, d, mo, N, p, y, tiles);
        }
      }
    });
    return;
  }
  // every row x the panels, a faster thread taking a slower one's last panels; the plan
  // advances with the thread's own share
  balanced_for(P, [&](BalancedTurn& turn) {
    const TileScope scope(tiles, kA8Tiles);
    const int64_t first = turn.first(), own = turn.own();
    for (int64_t p; (p = turn.next()) >= 0;) {
      if (plan && p >= first && p < first + own) plan->advance(p - first, own);
      panel_impl<F>(qx, 0, M, codes, d, mo, N, p, y, tiles);
    }
  }, M >= kStealRows);
}

// A Llama MLP's first half, down(silu(gate) * up)'s input, without its fp32 tensors: each
// thread computes the gate and up columns of whole 32-value blocks (a block of the down
// projection's input), applies silu_mul_span (silu_mul's arithmetic) and quantizes the block
// with quantize_block (quantize_x's), a chunk of rows at a time in its own buffers. The
// unfused chain wrote [M, 2 I] fp32 (64 rows: 0.77 MB a layer), split by panels (gate columns
// on one thread, up on the other); silu_mul then read each row's columns from both threads,
// and quantize_x read its rows again: three parallel regions and the cross-thread reads become
// one region. The same codes and scales as the chain (tests/model/quant/test_gguf_a8_panels.py).
// SmolLM2 Q4_1, 2 threads, Zen 4, decode steps of 64 rows alternating the two in one run:
// 1.014x with the vCPUs on one die, 1.06-1.07x on two; prefill unchanged (0.99-1.03x, any
// chunk of 32-128 rows).
constexpr int64_t kMlpChunkRows = 64;

// Rows [m0, m1) x blocks [b0, b1) of the down input into `out`; gate panels [0, I / kNB), up
// panels [I / kNB, 2 I / kNB) of the gate_up matrix.
template <int F>
void gate_up_silu(const QuantizedX& qx, int64_t m0, int64_t m1, int64_t b0, int64_t b1,
                  const uint8_t* codes, const uint16_t* d, const uint16_t* mo, int64_t I,
                  const QuantizedOut out, TileMode tiles) {
  constexpr int64_t kPanelsPerBlock = 32 / kNB;
  constexpr int64_t kBuf = kMlpChunkRows * 32;
  thread_local Filled<float> buf;
  buf.resize(2 * kBuf + 32);
  float *g = buf.data(), *u = g + kBuf, *a = u + kBuf;
  const int64_t up0 = I / kNB;
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t r0 = m0; r0 < m1; r0 += kMlpChunkRows) {
      const int64_t rows = std::min(kMlpChunkRows, m1 - r0);
      for (int64_t i = 0; i < kPanelsPerBlock; ++i) {
        const int64_t p = b * kPanelsPerBlock + i;
        panel_rows<F>(qx, r0, rows, codes, d, mo, 2 * I, p, g + i * kNB, 32, tiles);
        panel_rows<F>(qx, r0, rows, codes, d, mo, 2 * I, up0 + p, u + i * kNB, 32, tiles);
      }
      for (int64_t r = 0; r < rows; ++r) {
        silu_mul_span(g + 32 * r, u + 32 * r, a, 32);
        quantize_block(a, out, r0 + r, b);
      }
    }
}

// gate_up_silu over all M rows, the threads split as linear_impl splits them (rows from
// kRowSplitRowsPerThread a thread, else the blocks).
template <int F>
void mlp_gate_up(const QuantizedX& qx, int64_t M, const uint8_t* codes, const uint16_t* d,
                 const uint16_t* mo, int64_t I, QuantizedX& act) {
  const int64_t B = I / 32;
  const TileMode tiles = tiles_for_rows(M);
  const int64_t threads = at::get_num_threads();
  const bool by_rows = threads > 1 && M >= kRowSplitRowsPerThread * threads;
  const QuantizedOut out(act);
  if (by_rows) {
    balanced_for((M + kRowItem - 1) / kRowItem, [&, out](BalancedTurn& turn) {
      const TileScope scope(tiles, kA8Tiles);
      const QuantizedOut o = out;  // this thread's copy (QuantizedOut says why)
      for (int64_t i, e; (i = turn.next_run(&e)) >= 0;)
        gate_up_silu<F>(qx, i * kRowItem, std::min(M, e * kRowItem), 0, B, codes, d, mo, I, o,
                        tiles);
    });
    return;
  }
  balanced_for(B, [&, out](BalancedTurn& turn) {
    const TileScope scope(tiles, kA8Tiles);
    const QuantizedOut o = out;
    for (int64_t b; (b = turn.next()) >= 0;)
      gate_up_silu<F>(qx, 0, M, b, b + 1, codes, d, mo, I, o, tiles);
  }, M >= kStealRows);
}

// rows of one expert per work item of a8_panel_grouped_linear
constexpr int64_t kGroupRowTile = 256;

// Every expert's rows in one parallel region (grouped_cpu.h): codes / d / m of expert e at
// e times their stride; bit for bit a8_panel_linear once per expert (rows quantize alone).
// An expert's rows take the tiles as that call would: when it has kTileCallRows or more.
template <int F>
void grouped_impl(const QuantizedX& qx, const int64_t* off, int64_t E, const uint8_t* codes,
                  int64_t codes_stride, const uint16_t* d, const uint16_t* mo,
                  int64_t scale_stride, int64_t N, float* y) {
  const int64_t P = (N + kNB - 1) / kNB;
  const int64_t R = static_cast<int64_t>(qx.q.size()) / qx.K;  // rows of every expert
  const TileMode tiles = tiles_for_rows(R);
  run_tiles(group_tiles(off, E, P, kGroupRowTile), [&](const GroupTile* t, const GroupTile* end) {
    const TileScope scope(tiles, kA8Tiles);
    for (; t < end; ++t)
      panel_impl<F>(qx, t->row0, t->rows, codes + t->expert * codes_stride,
                    scale_at<F>(d, t->expert * scale_stride),
                    mo ? scale_at<F>(mo, t->expert * scale_stride) : nullptr, N, t->col, y,
                    t->group_rows >= kTileCallRows ? tiles : TileMode::kOff);
  });
}
#else
#define PAGEDLLM_A8P_SIMD 0
constexpr bool kVNNI = false;
#include "a8_panel_tiles_cpu.h"
#endif

// Bytes of one block's codes in the panel layout (Q8_0, Q6_K: 32, Q4_x and Q4_K: 16).
int64_t code_bytes(int64_t fmt) {
  TORCH_CHECK(fmt == kQ8_0 || fmt == kQ4_0 || fmt == kQ4_1 || fmt == kQ4_K || fmt == kQ6_K,
              "a8_panel_linear: format ", fmt,
              " has no panel kernel (Q8_0, Q4_0, Q4_1, Q4_K and Q6_K do)");
  return fmt == kQ8_0 || fmt == kQ6_K ? 32 : 16;
}

// The dtype of a format's panel scales (Q4_K, Q6_K fp32, else fp16) and its name.
torch::ScalarType scale_dtype(int64_t fmt) {
  return f32_scale_format(fmt) ? torch::kFloat32 : torch::kFloat16;
}
const char* scale_name(int64_t fmt) { return f32_scale_format(fmt) ? "fp32" : "fp16"; }

// A panel matrix's d shape: [P, K / 32, kNB], Q6_K's [P, K / 32, 2, kNB] (after `lead`, the
// experts' dimension of a grouped call).
std::vector<int64_t> scale_shape(int64_t fmt, std::vector<int64_t> lead, int64_t P, int64_t nb) {
  lead.insert(lead.end(), {P, nb});
  if (scales_per_block(fmt) == 2) lead.push_back(2);
  lead.push_back(kNB);
  return lead;
}

}  // namespace

// One [N, K] matrix in the panel layout (the file header): codes uint8 [P, K / 32, lanes,
// kNB, 4], d (and Q4_1's / Q4_K's m) [P, K / 32, kNB] (Q6_K's d [P, K / 32, 2, kNB]), fp16
// (Q4_K, Q6_K: fp32); `fn` names the caller in the errors.
void check_a8_panel_weight(const char* fn, int64_t fmt, const torch::Tensor& codes,
                           const torch::Tensor& d, const torch::Tensor& m, int64_t N,
                           int64_t K) {
  const int64_t nb = K / 32, P = (N + kNB - 1) / kNB, lanes = code_bytes(fmt) / 4;
  TORCH_CHECK(K % 32 == 0, fn, ": K=", K, " is not whole 32-value blocks");
  TORCH_CHECK(codes.dtype() == torch::kUInt8 && codes.is_contiguous() &&
                  codes.sizes() == torch::IntArrayRef({P, nb, lanes, kNB, 4}),
              fn, ": codes must be uint8 [", P, ", ", nb, ", ", lanes, ", ", kNB, ", 4]");
  const std::vector<int64_t> ds = scale_shape(fmt, {}, P, nb), ms{P, nb, kNB};
  const auto sd = scale_dtype(fmt);
  TORCH_CHECK(d.dtype() == sd && d.is_contiguous() && d.sizes() == torch::IntArrayRef(ds),
              fn, ": d must be ", scale_name(fmt), " ", torch::IntArrayRef(ds));
  TORCH_CHECK(!affine_format(fmt) || (m.dtype() == sd && m.is_contiguous() &&
                                      m.sizes() == torch::IntArrayRef(ms)),
              fn, ": Q4_1 / Q4_K need m ", scale_name(fmt), " [", P, ", ", nb, ", ", kNB, "]");
}

void check_a8_panel_mlp(const char* fn, const torch::Tensor& x, int64_t gu_fmt,
                        const torch::Tensor& gu_codes, const torch::Tensor& gu_d,
                        const torch::Tensor& gu_m, int64_t down_fmt,
                        const torch::Tensor& down_codes, const torch::Tensor& down_d,
                        const torch::Tensor& down_m, int64_t I, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              fn, ": x must be contiguous fp32 [M, K]");
  TORCH_CHECK(I > 0 && I % 32 == 0, fn, ": the intermediate size ", I,
              " is not whole 32-value blocks");
  const std::string gate_up = std::string(fn) + " (gate_up)", down = std::string(fn) + " (down)";
  check_a8_panel_weight(gate_up.c_str(), gu_fmt, gu_codes, gu_d, gu_m, 2 * I, x.size(1));
  check_a8_panel_weight(down.c_str(), down_fmt, down_codes, down_d, down_m, N, I);
}

bool a8_panels_available() { return PAGEDLLM_A8P_SIMD; }
// The instructions of this build's int8 dot products (int8_dot_cpu.h): "avx512_vnni" (vpdpbusd),
// "avx512bw" or "avx2" (maddubs pair sums), "scalar". The engine turns int8 activations on by
// default where they are VNNI's (pagedllm/kernels/cpu_features.py).
std::string int8_dot_isa() { return kInt8DotIsa; }
int64_t q8_0_code_offset() { return kVNNI ? 128 : 0; }
int64_t a8_panel_width() { return kNB; }

torch::Tensor a8_panel_linear(torch::Tensor x, int64_t fmt, torch::Tensor codes, torch::Tensor d,
                              torch::Tensor m, int64_t N) {
  return a8_panel_linear_prefetching(std::move(x), fmt, std::move(codes), std::move(d),
                                     std::move(m), N, nullptr);
}

torch::Tensor a8_panel_linear_prefetching(torch::Tensor x, int64_t fmt, torch::Tensor codes,
                                          torch::Tensor d, torch::Tensor m, int64_t N,
                                          PrefetchPlan* plan) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "a8_panel_linear: x must be contiguous fp32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1);
  check_a8_panel_weight("a8_panel_linear", fmt, codes, d, m, N, K);
  auto y = torch::empty({M, N}, x.options());
#if PAGEDLLM_A8P_SIMD
  const QuantizedX qx = quantize_x(x.data_ptr<float>(), M, K);
  const PanelPtrs w(fmt, codes, d, m);
  with_format(fmt, [&](auto f) {
    linear_impl<decltype(f)::value>(qx, M, w.codes, w.d, w.m, N, y.data_ptr<float>(), plan);
  });
#else
  (void)plan;
  TORCH_CHECK(false, "a8_panel_linear needs AVX2 + FMA + F16C (built without them)");
#endif
  return y;
}

// y = silu(x Wg^T) * (x Wu^T) @ Wd^T for a Llama MLP whose fused [gate | up] matrix ([2 I, K])
// and down matrix ([N, I]) are both int8-activation panels, I a multiple of 32: the same bits
// as a8_panel_linear, silu_mul, a8_panel_linear (the note above gate_up_silu says what it
// saves).
torch::Tensor a8_panel_mlp(torch::Tensor x, int64_t gu_fmt, torch::Tensor gu_codes,
                           torch::Tensor gu_d, torch::Tensor gu_m, int64_t down_fmt,
                           torch::Tensor down_codes, torch::Tensor down_d, torch::Tensor down_m,
                           int64_t I, int64_t N) {
  check_a8_panel_mlp("a8_panel_mlp", x, gu_fmt, gu_codes, gu_d, gu_m, down_fmt, down_codes,
                     down_d, down_m, I, N);
  const int64_t M = x.size(0), K = x.size(1);
  auto y = torch::empty({M, N}, x.options());
#if PAGEDLLM_A8P_SIMD
  const QuantizedX qx = quantize_x(x.data_ptr<float>(), M, K);
  QuantizedX act = alloc_quantized(M, I);
  const PanelPtrs gu(gu_fmt, gu_codes, gu_d, gu_m), dn(down_fmt, down_codes, down_d, down_m);
  with_format(gu_fmt, [&](auto f) {
    mlp_gate_up<decltype(f)::value>(qx, M, gu.codes, gu.d, gu.m, I, act);
  });
  with_format(down_fmt, [&](auto f) {
    linear_impl<decltype(f)::value>(act, M, dn.codes, dn.d, dn.m, N, y.data_ptr<float>(),
                                    nullptr);
  });
#else
  TORCH_CHECK(false, "a8_panel_mlp needs AVX2 + FMA + F16C (built without them)");
#endif
  return y;
}

// Rows `ids` of a panel-layout matrix (the token embedding of a tied GGUF model), exact:
// d * (code - offset) (Q8_0; offset 128 where the layout stores VNNI's u8 codes), d * (code - 8)
// (Q4_0), d * code + m (Q4_1, Q4_K), S * (code - 32) (Q6_K, S its half's), in fp32 as gguf_a8_panels.py's `embedding` computes them. One call
// instead of ~10 torch ops per decode step; an id outside [0, N) raises IndexError. No fused
// multiply-add (-ffast-math would contract d * code + m): the same two roundings as torch.
__attribute__((optimize("fp-contract=off")))
torch::Tensor a8_panel_rows(torch::Tensor ids, int64_t fmt, torch::Tensor codes, torch::Tensor d,
                            torch::Tensor m, int64_t N, int64_t K) {
  TORCH_CHECK(ids.dtype() == torch::kInt64 && ids.dim() == 1 && ids.is_contiguous(),
              "a8_panel_rows: ids must be contiguous int64 [T]");
  check_a8_panel_weight("a8_panel_rows", fmt, codes, d, m, N, K);
  const int64_t T = ids.size(0), nb = K / 32, lanes = code_bytes(fmt) / 4;
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    if (ip[t] < 0 || ip[t] >= N)
      throw std::out_of_range("row ids must be in [0, " + std::to_string(N) + "), got " +
                              std::to_string(ip[t]));
  auto out = torch::empty({T, K}, torch::TensorOptions().dtype(torch::kFloat32));
  const PanelPtrs w(fmt, codes, d, m);
  const uint8_t* cp = w.codes;
  const uint16_t *dp = w.d, *mp = w.m;
  const bool f32 = f32_scale_format(fmt);
  const int64_t H = scales_per_block(fmt);
  auto scale = [f32](const uint16_t* p, int64_t s) {
    return f32 ? reinterpret_cast<const float*>(p)[s] : c10::detail::fp16_ieee_to_fp32_value(p[s]);
  };
  const int offset = fmt == kQ8_0 ? static_cast<int>(q8_0_code_offset())
                     : fmt == kQ4_0 ? 8 : fmt == kQ6_K ? 32 : 0;
  float* op = out.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = ip[t] / kNB, c = ip[t] % kNB;
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t s = (p * nb + j) * kNB + c;
      const float mj = mp ? scale(mp, s) : 0.f;
      float* row = op + t * K + 32 * j;
      for (int64_t g = 0; g < lanes; ++g) {
        const uint8_t* b = cp + (((p * nb + j) * lanes + g) * kNB + c) * 4;
        const float dj = scale(dp, ((p * nb + j) * H + g * H / lanes) * kNB + c);
        for (int i = 0; i < 4; ++i) {
          if (fmt == kQ6_K) {
            row[4 * g + i] = static_cast<float>(b[i] - offset) * dj;
          } else if (fmt == kQ8_0) {
            // s8 codes stored as bytes (offset 0), or VNNI's u8 = s8 + 128
            row[4 * g + i] = static_cast<float>(static_cast<int8_t>(b[i] - offset)) * dj;
          } else {  // lane g: codes 8g + i (low nibbles), 8g + 4 + i (high)
            const float lo = static_cast<float>((b[i] & 15) - offset) * dj;
            const float hi = static_cast<float>((b[i] >> 4) - offset) * dj;
            row[8 * g + i] = mp ? lo + mj : lo;
            row[8 * g + 4 + i] = mp ? hi + mj : hi;
          }
        }
      }
    }
  }
  return out;
}

// The experts of a MoE layer in one call: codes [E, P, K / 32, lanes, NB, 4], d (and Q4_1's
// m) [E, P, K / 32, NB] (expert e's are a8_panel_linear's), x's rows sorted by expert,
// offsets [E + 1] (grouped_cpu.h).
torch::Tensor a8_panel_grouped_linear(torch::Tensor x, int64_t fmt, torch::Tensor codes,
                                      torch::Tensor d, torch::Tensor m, int64_t N,
                                      torch::Tensor offsets) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "a8_panel_grouped_linear: x must be contiguous fp32 [R, K]");
  const int64_t R = x.size(0), K = x.size(1), nb = K / 32, P = (N + kNB - 1) / kNB;
  const int64_t lanes = code_bytes(fmt) / 4;
  TORCH_CHECK(K % 32 == 0, "a8_panel_grouped_linear: K=", K, " is not whole 32-value blocks");
  TORCH_CHECK(codes.dim() == 6 && codes.size(0) > 0, "a8_panel_grouped_linear: codes must be stacked over experts");
  const int64_t E = codes.size(0);
  TORCH_CHECK(codes.dtype() == torch::kUInt8 && codes.is_contiguous() &&
                  codes.sizes() == torch::IntArrayRef({E, P, nb, lanes, kNB, 4}),
              "a8_panel_grouped_linear: codes must be uint8 [", E, ", ", P, ", ", nb, ", ", lanes,
              ", ", kNB, ", 4]");
  const std::vector<int64_t> ds = scale_shape(fmt, {E}, P, nb), ms{E, P, nb, kNB};
  const auto sd = scale_dtype(fmt);
  TORCH_CHECK(d.dtype() == sd && d.is_contiguous() && d.sizes() == torch::IntArrayRef(ds),
              "a8_panel_grouped_linear: d must be ", scale_name(fmt), " ", torch::IntArrayRef(ds));
  TORCH_CHECK(!affine_format(fmt) || (m.dtype() == sd && m.is_contiguous() &&
                                      m.sizes() == torch::IntArrayRef(ms)),
              "a8_panel_grouped_linear: Q4_1 / Q4_K need m ", scale_name(fmt), " [", E, ", ", P,
              ", ", nb, ", ", kNB, "]");
  const int64_t* off = checked_offsets(offsets, E, R);
  auto y = torch::empty({R, N}, x.options());
#if PAGEDLLM_A8P_SIMD
  const QuantizedX qx = quantize_x(x.data_ptr<float>(), R, K);
  const PanelPtrs w(fmt, codes, d, m);
  const int64_t cs = codes.numel() / E, ss = d.numel() / E;
  with_format(fmt, [&](auto f) {
    grouped_impl<decltype(f)::value>(qx, off, E, w.codes, cs, w.d, w.m, ss, N,
                                     y.data_ptr<float>());
  });
#else
  TORCH_CHECK(false, "a8_panel_grouped_linear needs AVX2 + FMA + F16C (built without them)");
#endif
  return y;
}

#pragma GCC pop_options

void register_a8_panel_kernels(pybind11::module_& m) {
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("a8_panels_available", &a8_panels_available, nogil,
        "whether the int8-activation panel kernels (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) are built "
        "(AVX2 + FMA + F16C)");
  m.def("int8_dot_isa", &int8_dot_isa,
        "instructions of the int8 dot products: avx512_vnni, avx512bw, avx2 or scalar");
  m.def("a8_panel_width", &a8_panel_width, nogil, "output rows per int8-activation panel");
  m.def("int8_tiles", &int8_tiles,
        "the matrix tiles of the int8-activation panels' 16-row tiles: amx, emulated or off");
  m.def("set_int8_tiles", &set_int8_tiles,
        "choose the int8-activation panels' tiles (auto, amx, emulated: the software model "
        "for tests, off); returns the tiles now in use");
  m.def("a8_panel_rows", &a8_panel_rows, nogil,
        "rows ids of a panel-layout Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K matrix, dequantized "
        "exactly (fp32)");
  m.def("q8_0_code_offset", &q8_0_code_offset, nogil,
        "what the panel layout adds to each Q8_0 code (128 for VNNI's u8 codes, else 0)");
  m.def("a8_panel_grouped_linear", &a8_panel_grouped_linear, nogil,
        "MoE experts in one call: rows of x sorted by expert (offsets [E + 1]) times their "
        "expert's int8-activation panels (stacked over experts)");
  m.def("a8_panel_mlp", &a8_panel_mlp, nogil,
        "a Llama MLP, silu(x Wg^T) * (x Wu^T) @ Wd^T, over int8-activation panels (fused "
        "[gate | up] [2 I, K] and down [N, I]) in two parallel regions: the bits of "
        "a8_panel_linear, silu_mul, a8_panel_linear");
  m.def("a8_panel_linear", &a8_panel_linear, nogil,
        "y = x @ W^T, W GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K repacked into panels, x quantized "
        "per 32 "
        "values, integer dot products");
}
