// Paged decode attention for CPU: one query token per sequence, keys/values read straight
// from the block pool through the block table (no gather copy). Parallel over sequences, or
// over query heads with fewer sequences than threads (see decode below); each K/V row (all kv
// heads) is read once per work item and serves the G = heads / kv_heads query heads of each
// KV head. softmax in fp32 with max subtraction.
// Layout: cache [num_blocks, block_size, kv_heads, d].
//
// Cache dtypes: fp32, float16, or 8 bits (int8, fp8 e4m3fn, fp8 e5m2) with a float16 scale
// per token per KV head, scales [num_blocks, block_size, kv_heads]
// (pagedllm/model/layers/kv_quant.py). A converted row serves its G query heads: in the
// vector tiles (head sizes 64, 128, 256; AVX-512 or AVX2) it is converted in registers as it is
// read, elsewhere once into a small per-thread buffer (L1); an 8-bit row's scale multiplies
// the G dot products (K) or softmax weights (V) instead of every element. An 8-bit row read
// from memory is 1/4 of fp32's bytes, a float16 row 1/2.
//
// quantize_into_cache is the write side: quantize new tokens' K or V and store values and
// scales at their slots (one call per layer instead of ~15 small torch ops); it computes
// exactly what kv_quant.quantize does.
#include "torch_lite_cpu.h"
#include "kernels_cpu.h"  // PrefetchPlan, and this file's entry points
#include <ATen/Parallel.h>
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kv_rows_cpu.h"
#include "filled_cpu.h"  // Filled: storage that starts uninitialized
#include "balanced_for_cpu.h"  // balanced_for: threads that finish together

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline float dot(const float* a, const float* b, int64_t d) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  float r = _mm_cvtss_f32(s);
  for (; i < d; ++i) r += a[i] * b[i];
  return r;
}
static inline void axpy(float* y, float a, const float* x, int64_t d) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < d; ++i) y[i] += a * x[i];
}
#else
static inline float dot(const float* a, const float* b, int64_t d) {
  float r = 0.f;
  for (int64_t i = 0; i < d; ++i) r += a[i] * b[i];
  return r;
}
static inline void axpy(float* y, float a, const float* x, int64_t d) {
  for (int64_t i = 0; i < d; ++i) y[i] += a * x[i];
}
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
// The vector path for head sizes 64, 128 and 256, in tiles of kTile tokens (one vector of them:
// 16 on AVX-512, 8 on AVX2). The scalar-result dot above spends more instructions on its
// horizontal sum than on its FMAs, and the axpy loads and stores a head's accumulator for
// every token: with the rows in L2 the kernel ran at ~12% of the FMA peak (SmolLM2, 64 x 192
// tokens, 30 layers, AVX-512: 16 ms hot vs 23.5 ms from memory). Here a head's query stays in
// registers while a tile's K rows each leave one vector of partial sums, and one
// transpose-add (reduce_tile) turns them into the tile's scores; a head's V sums stay in
// registers over all tokens (head size 256: 16 vectors of them on AVX-512, 8 at a time on
// AVX2). Gemma 3's head size 256 against the per-token path, 64 sequences x 192 float16
// tokens, 18 layers, 2 threads, Zen 4: 13.0 against 20.8 ms, one sequence of 1,000 tokens 0.98
// against 1.97; an AVX2 build 1.0-1.2x (offline 64 x 128/128, Gemma 3 270M: 1.015x, ABBA).
#define PAGEDLLM_PA_TILES 1

// 16 / 8 stored values as fp32: in place (fp32) or converted in registers, the same values
// as Row<T>::load (kv_rows_cpu.h; an 8-bit row's scale, and fp8 e4m3's 2^8, stay in the
// caller's per-token scales).
#if defined(__AVX512F__)
constexpr int kTile = 16;
constexpr int kAccRegs = 16;  // V sums kept in registers (of 32)
using VF = __m512;
static inline VF vzero() { return _mm512_setzero_ps(); }
static inline VF vset1(float x) { return _mm512_set1_ps(x); }
static inline VF vmul(VF a, VF b) { return _mm512_mul_ps(a, b); }
static inline VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
static inline void vstore(float* p, VF v) { _mm512_storeu_ps(p, v); }
static inline VF loadv(const float* p) { return _mm512_loadu_ps(p); }
static inline VF loadv(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
static inline VF loadv(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
static inline __m256i bytes16(const void* p) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
static inline VF loadv(const c10::Float8_e5m2* p) {  // the high byte of a float16
  return _mm512_cvtph_ps(_mm256_slli_epi16(bytes16(p), 8));
}
static inline VF loadv(const c10::Float8_e4m3fn* p) {  // float16 of the value x 2^-8
  const __m256i w = bytes16(p);
  return _mm512_cvtph_ps(_mm256_or_si256(
      _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), 7),
      _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8)));
}

// Lane i of the result is the sum of p[i]'s 16 lanes (45 shuffles and adds for 16 sums).
static inline VF reduce_tile(const VF* p) {
  __m512 a[8], b[4];
  for (int k = 0; k < 8; ++k)
    a[k] = _mm512_add_ps(_mm512_unpacklo_ps(p[2 * k], p[2 * k + 1]),
                         _mm512_unpackhi_ps(p[2 * k], p[2 * k + 1]));
  for (int k = 0; k < 4; ++k) {
    const __m512d x = _mm512_castps_pd(a[2 * k]), y = _mm512_castps_pd(a[2 * k + 1]);
    b[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 c01 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88),
                                   _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
  const __m512 c23 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88),
                                   _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c01, c23, 0x88), _mm512_shuffle_f32x4(c01, c23, 0xDD));
}
#else  // AVX2 + FMA + F16C
constexpr int kTile = 8;
constexpr int kAccRegs = 8;  // V sums kept in registers (of 16)
using VF = __m256;
static inline VF vzero() { return _mm256_setzero_ps(); }
static inline VF vset1(float x) { return _mm256_set1_ps(x); }
static inline VF vmul(VF a, VF b) { return _mm256_mul_ps(a, b); }
static inline VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
static inline void vstore(float* p, VF v) { _mm256_storeu_ps(p, v); }
static inline VF loadv(const float* p) { return _mm256_loadu_ps(p); }
static inline VF loadv(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
static inline __m128i bytes8(const void* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
static inline VF loadv(const int8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes8(p))); }
static inline VF loadv(const c10::Float8_e5m2* p) {  // the high byte of a float16
  return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(bytes8(p)), 8));
}
static inline VF loadv(const c10::Float8_e4m3fn* p) {  // float16 of the value x 2^-8
  const __m128i w = _mm_cvtepu8_epi16(bytes8(p));
  return _mm256_cvtph_ps(_mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7F)), 7),
                                      _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8)));
}

// Lane i of the result is the sum of p[i]'s 8 lanes (21 shuffles and adds for 8 sums).
static inline VF reduce_tile(const VF* p) {
  __m256 a[4], b[2];
  for (int k = 0; k < 4; ++k)
    a[k] = _mm256_add_ps(_mm256_unpacklo_ps(p[2 * k], p[2 * k + 1]),
                         _mm256_unpackhi_ps(p[2 * k], p[2 * k + 1]));
  for (int k = 0; k < 2; ++k) {
    const __m256d x = _mm256_castps_pd(a[2 * k]), y = _mm256_castps_pd(a[2 * k + 1]);
    b[k] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)),
                         _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20),
                       _mm256_permute2f128_ps(b[0], b[1], 0x31));
}
#endif
constexpr int kVW = kTile;  // floats per vector
// Which rows take the tiles. AVX2 fp32 rows stay on the per-token loop: from memory (SmolLM2
// shapes, 64 sequences x 192 tokens, one layer's pool, 2 threads, Zen 3) its tiles ran
// 1.1-2.9 ms against 1.7-2.1 ms, while float16 rows ran 0.86-0.92 against 1.83-1.98 ms and
// int8 1.02-1.08 against 1.94-1.95 (the conversion, not the bytes, was their cost).
template <typename T> constexpr bool kTiles = kVW == 16 || !std::is_same_v<T, float>;

// Asks for the n values at `off` of ahead[i] (if any), the row kAhead tokens after rows[i],
// as the tile kernels read the same slice of rows[i]: the requests go out at the rate the rows
// are consumed. A whole next tile asked for at a tile's start (96 lines, SmolLM2 float16)
// queued behind the core's miss buffers, and the tile's own reads behind those: from memory
// the kernel took its in-cache time plus the bytes' time (numbers at kAhead).
// Into L2 only (prefetcht1), not L1: an L1 prefetch holds one of the core's few L1 miss
// buffers until its line arrives, so with every row asked for ahead the prefetches themselves
// stalled the loop (a profile put ~20% of the kernel's samples on the instruction after
// them); from L2 the row's loads take a few cycles more. 64 sequences x 192 float16 tokens,
// 30 layers' pools, 2 threads, Zen 4: 11.4-12.0 ms against 17.3-18.3 in pool order, 12.2-13.9
// against 22.1-22.2 shuffled, in cache 8.0 either way; prefetcht2 the same as prefetcht1,
// 32 tokens ahead ~10% slower than 16, 8 ahead as slow as L1.
template <typename E>
static inline void ask_slice(const E* const* ahead, int i, int64_t off, int64_t n) {
  if (const E* a = ahead[i]) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(a + off) & ~uintptr_t{63};
    const uintptr_t end = reinterpret_cast<uintptr_t>(a + off + n);
    for (uintptr_t line = first; line < end; line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 2);
  }
}

// scores[i] = (q . rows[i][0, kVW NV)) * scale[i] for the nt <= kTile rows of a tile (scale
// has kTile readable entries); `ahead`: see ask_slice.
template <int NV, typename E>
static inline void tile_scores(const float* q, const E* const* rows, const E* const* ahead,
                               int64_t off, int nt, const float* scale, float* scores) {
  VF qv[NV], p[kTile];
  for (int c = 0; c < NV; ++c) qv[c] = loadv(q + kVW * c);
  for (int i = 0; i < kTile; ++i) {
    if (i < nt) {
      ask_slice(ahead, i, off, NV * kVW);
      const E* r = rows[i] + off;
      p[i] = vmul(qv[0], loadv(r));
      for (int c = 1; c < NV; ++c) p[i] = vfma(qv[c], loadv(r + kVW * c), p[i]);
    } else {
      p[i] = vzero();
    }
  }
  float out[kTile];
  vstore(out, vmul(reduce_tile(p), loadv(scale)));
  std::copy(out, out + nt, scores);
}

// Most query heads of one KV head whose scores tile_scores_shared computes together (their
// queries and a row's vectors in registers: nh x NV + NV <= 2 kAccRegs - 4); 1: no sharing.
template <int NV>
constexpr int kScoreHeads = std::max(1, std::min(4, (2 * kAccRegs - 4) / NV - 1));

// tile_scores for nh <= kScoreHeads<NV> query heads q[h] of one KV head (rows at `off`): each
// row's NV vectors are read (converted) once for all of them; the partial sums wait in `p`
// (L1) for their transpose-add. The same products, sums and reduction per head as
// tile_scores, so the same scores.
template <int NV, typename E>
static inline void tile_scores_shared(const float* const* q, int nh, const E* const* rows,
                                      const E* const* ahead, int64_t off, int nt,
                                      const float* scale, float* const* scores) {
  constexpr int S = kScoreHeads<NV>;
  VF qv[S][NV], p[S][kTile];
  for (int h = 0; h < S && h < nh; ++h)
    for (int c = 0; c < NV; ++c) qv[h][c] = loadv(q[h] + kVW * c);
  for (int i = 0; i < kTile; ++i) {
    if (i < nt) {
      ask_slice(ahead, i, off, NV * kVW);
      VF k[NV];
      for (int c = 0; c < NV; ++c) k[c] = loadv(rows[i] + off + kVW * c);
      for (int h = 0; h < S; ++h) {
        if (h >= nh) break;
        VF acc = vmul(qv[h][0], k[0]);
        for (int c = 1; c < NV; ++c) acc = vfma(qv[h][c], k[c], acc);
        p[h][i] = acc;
      }
    } else {
      for (int h = 0; h < S; ++h) p[h][i] = vzero();
    }
  }
  const VF sv = loadv(scale);
  for (int h = 0; h < S && h < nh; ++h) {
    float out[kTile];
    vstore(out, vmul(reduce_tile(p[h]), sv));
    std::copy(out, out + nt, scores[h]);
  }
}

// sums[h][0, kVW NV) += sum_i w[h][i] rows[i][off[h] ...] over the nt rows of a tile, for NH
// units of NV vectors each (NH x NV <= kAccRegs), in token order. Shared: every unit at off[0]
// (heads of one KV head), each row's NV vectors read (converted) once for all of them; the
// same FMAs per unit in the same order either way, so the same sums. NH is a template
// argument so the sums stay in registers for the whole tile: with a run-time head count GCC
// kept them on the stack, a load and a store around every FMA (the V pass took 1.8x the
// scores pass in cache, 64 x 192 tokens, Zen 4).
template <int NV, int NH, bool Shared, typename E>
static inline void tile_values_n(float* const* sums, const E* const* rows, const E* const* ahead,
                                 const int64_t* off, int nt, const float* w, int64_t w_stride) {
  VF acc[NH][NV];
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < NV; ++c) acc[h][c] = loadv(sums[h] + kVW * c);
  for (int i = 0; i < nt; ++i) {
    if constexpr (Shared) {
      ask_slice(ahead, i, off[0], NV * kVW);
      VF v[NV];
      for (int c = 0; c < NV; ++c) v[c] = loadv(rows[i] + off[0] + kVW * c);
      for (int h = 0; h < NH; ++h) {
        const VF wv = vset1(w[h * w_stride + i]);
        for (int c = 0; c < NV; ++c) acc[h][c] = vfma(wv, v[c], acc[h][c]);
      }
    } else {
      for (int h = 0; h < NH; ++h) {
        ask_slice(ahead, i, off[h], NV * kVW);
        const VF wv = vset1(w[h * w_stride + i]);
        for (int c = 0; c < NV; ++c)
          acc[h][c] = vfma(wv, loadv(rows[i] + off[h] + kVW * c), acc[h][c]);
      }
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < NV; ++c) vstore(sums[h] + kVW * c, acc[h][c]);
}

// tile_values_n for the run-time unit count nh (1 <= nh <= kAccRegs / NV).
template <int NV, bool Shared, typename E, int NH = kAccRegs / NV>
static inline void tile_values(int nh, float* const* sums, const E* const* rows,
                               const E* const* ahead, const int64_t* off, int nt,
                               const float* w, int64_t w_stride) {
  if constexpr (NH >= 1) {
    if (nh == NH) return tile_values_n<NV, NH, Shared, E>(sums, rows, ahead, off, nt, w, w_stride);
    tile_values<NV, Shared, E, NH - 1>(nh, sums, rows, ahead, off, nt, w, w_stride);
  }
}
#endif

// s[0, n) -> softmax(s) in place, fp32, with max subtraction.
static inline void softmax_(float* s, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < n; ++t) m = s[t] > m ? s[t] : m;
  float sum = 0.f;
  for (int64_t t = 0; t < n; ++t) { s[t] = std::exp(s[t] - m); sum += s[t]; }
  const float inv = 1.f / sum;
  for (int64_t t = 0; t < n; ++t) s[t] *= inv;
}

// A sequence's blocks lie anywhere in the pool (a server's block tables are shuffled after
// its first requests finish), so the hardware prefetcher, which follows one contiguous
// stream, stops at every block boundary: with blocks in random order the kernel ran at half
// the speed of the same blocks in pool order (SmolLM2 shapes, 64 sequences of 192 tokens, 2
// threads, Zen 4/5: 45-62 vs 18-32 ms for 30 layers). Each token's row therefore asks for the
// row kAhead tokens later, through the block table, before it is read: 24-37 ms in random
// order, the same as before in pool order (a noisy shared VM; medians of 3 alternating runs).
// The tile kernels ask slice by slice as they read (ask_slice), and the last tile of a pass
// asks for the next pass's first rows (TileRows::next): 64 x 192 tokens, shuffled, from memory
// 19-22 ms against 26-31 for whole tiles asked for at once (a read-only loop over the same
// rows: 14), in cache 10.8 either way, the same bits (Zen 4, 2 threads).
constexpr int64_t kAhead = 16;
constexpr int64_t kSplitTokens = 128;  // see decode: heads split across threads from here

// Asks for the cache lines of [p, p + bytes).
static inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
}

// The row at `slot` (what the per-token loops ask for).
template <typename T>
static inline void prefetch_row(const T* pool, int64_t slot, int64_t row_len) {
  prefetch_bytes(pool + slot * row_len, row_len * static_cast<int64_t>(sizeof(T)));
}

// The pool slot of position `pos` of sequence b through its block table row.
static inline int64_t pool_slot(const int64_t* bt, int64_t max_blocks, int64_t bs, int64_t b,
                                int64_t pos) {
  return bt[b * max_blocks + pos / bs] * bs + pos % bs;
}

// The first position a query of a sequence of L tokens sees (a sliding window's start).
static inline int64_t visible_start(int64_t L, int64_t window) {
  return window > 0 && L > window ? L - window : 0;
}

// T = float: rows are used in place; T = c10::Half: rows converted as they are read;
// otherwise (8 bits) ks / vs are the float16 scale pools.
//
#if defined(PAGEDLLM_PA_TILES)
// Tokens per chunk of a head's V sums: every path sums a head's weighted V rows chunk by chunk
// from zero and adds the chunks' sums in order, so the split below (chunks on different
// threads) gives the bits one thread gives, and a sequence's output does not depend on its
// batch. A multiple of kTile.
constexpr int64_t kChunk = 64;

// One thread's view of a tile of a sequence's K or V rows: the rows' addresses (the tile
// kernels convert them in registers), the addresses of the rows kAhead tokens later (nullptr
// past the sequence's end; the kernels ask for them as they read: ask_slice) and
// tscale[j * kTile + i] = mul x row i's scale for kv head j.
template <typename T>
struct TileRows {
  const int64_t* bt;
  int64_t max_blocks, bs, kvh, row_len;
  std::vector<float> tscale;
  const T* rows[kTile];
  const T* ahead[kTile];
  bool have_scale = false;  // (no NaN sentinel: these kernels build with -ffast-math)
  float filled = 0.f;
  // What the last tile of a pass asks for: rows from pos0 of sequence b (L tokens) in `pool`
  // (the V rows after the K rows, the next sequence's K rows after the V rows), or nothing.
  struct Next {
    const T* pool = nullptr;
    int64_t b = 0, pos0 = 0, L = 0;
  } next;

  TileRows(const int64_t* bt_, int64_t max_blocks_, int64_t bs_, int64_t kvh_, int64_t row_len_)
      : bt(bt_), max_blocks(max_blocks_), bs(bs_), kvh(kvh_), row_len(row_len_),
        tscale(kvh_ * kTile) {}

  int64_t slot_of(int64_t b, int64_t pos) const { return pool_slot(bt, max_blocks, bs, b, pos); }

  // rows[i], ahead[i] for the nt positions from pos0 (step 1, one table lookup for a run
  // inside one block: the common case, tiles start at block boundaries when bs is a multiple
  // of kTile).
  void place(const T* pool, const T** out, int64_t b, int64_t pos0, int nt, int64_t L) const {
    const bool one_block = pos0 / bs == (pos0 + nt - 1) / bs;
    const int64_t slot0 = one_block && pos0 < L ? slot_of(b, pos0) : 0;
    for (int i = 0; i < nt; ++i) {
      const int64_t pos = pos0 + i;
      out[i] = pos >= L ? nullptr : pool + (one_block ? slot0 + i : slot_of(b, pos)) * row_len;
    }
  }

  // The rows of tokens [pos0, pos0 + nt) of sequence b (L tokens); unscaled rows' tscale is
  // filled once per value of `mul`.
  void fetch(const T* pool, const uint16_t* scales, int64_t b, int64_t pos0, int nt, int64_t L,
             float mul) {
    place(pool, rows, b, pos0, nt, L);
    if (pos0 + kAhead < L || !next.pool) place(pool, ahead, b, pos0 + kAhead, nt, L);
    else place(next.pool, ahead, next.b, next.pos0, nt, next.L);
    if constexpr (kScaled<T>) {
      for (int i = 0; i < nt; ++i) {
        const int64_t slot = (rows[i] - pool) / row_len;
        for (int64_t j = 0; j < kvh; ++j)
          tscale[j * kTile + i] = mul * Row<T>::kMul * half_to_float(scales[slot * kvh + j]);
      }
    } else {
      (void)scales;
      if (!have_scale || filled != mul) {
        std::fill(tscale.begin(), tscale.end(), mul);
        have_scale = true, filled = mul;
      }
    }
  }
};

// What a sequence's tile passes need: its query, K / V pools and scales, the query heads per
// KV head G, head size d, its visible tokens [start, start + n) of L, the score scale.
template <typename T>
struct TileSeq {
  const float* q;
  const T *kp, *vp;
  const uint16_t *ks, *vs;
  int64_t b, G, d, start, n, L;
  float fscale;
};

// Scores of query heads [h0, h1) for tokens [t_a, t_b) (tile-aligned, relative to start) into
// scores + (h - h0) * stride + t. GQA: a KV head's rows are read once for up to kScoreHeads
// of its heads (tile_scores_shared; the same scores as tile_scores).
template <int NV, typename T>
static void scores_range(TileRows<T>& rd, const TileSeq<T>& s, int64_t h0, int64_t h1,
                         int64_t t_a, int64_t t_b, float* scores, int64_t stride) {
  for (int64_t t0 = t_a; t0 < t_b; t0 += kTile) {
    const int nt = static_cast<int>(std::min<int64_t>(kTile, t_b - t0));
    rd.fetch(s.kp, s.ks, s.b, s.start + t0, nt, s.L, s.fscale);
    if (kScoreHeads<NV> > 1 && s.G > 1) {
      for (int64_t c0 = h0; c0 < h1;) {
        const int64_t c1 = std::min({c0 + kScoreHeads<NV>, h1, (c0 / s.G + 1) * s.G});
        const float* qh[kScoreHeads<NV>];
        float* out[kScoreHeads<NV>];
        for (int64_t h = c0; h < c1; ++h) {
          qh[h - c0] = s.q + h * s.d;
          out[h - c0] = scores + (h - h0) * stride + t0;
        }
        const int64_t j = c0 / s.G;
        tile_scores_shared<NV, T>(qh, static_cast<int>(c1 - c0), rd.rows, rd.ahead, j * s.d, nt,
                                  rd.tscale.data() + j * kTile, out);
        c0 = c1;
      }
    } else {
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t j = h / s.G;
        tile_scores<NV, T>(s.q + h * s.d, rd.rows, rd.ahead, j * s.d, nt,
                           rd.tscale.data() + j * kTile, scores + (h - h0) * stride + t0);
      }
    }
  }
}

// acc [h1 - h0, d] += the softmax weights (scores, as scores_range laid them out) times the V
// rows of tokens [t_a, t_b): a tile's rows once, then kHeads heads at a time with their sums
// in registers, NVC vectors of columns at a time (below); stored between tiles: exact, so a
// head's sums do not depend on its neighbours.
// With GQA and room for a row's vectors beside the sums, a chunk's heads share one KV head,
// whose rows tile_values (shared) converts once for all of them.
template <int NV, typename T>
static void values_range(TileRows<T>& rd, const TileSeq<T>& s, int64_t h0, int64_t h1,
                         int64_t t_a, int64_t t_b, const float* scores, int64_t stride,
                         float* acc) {
  // per V unit: a whole head, or on AVX-512 half of a head of 256 (then two heads of a KV head
  // share each converted row: 64 x 192 tokens of Gemma 3's shape 14.7 -> 12.9 ms, 2 threads,
  // Zen 4, the same bits); AVX2's kAccRegs vectors (not measured on an AVX2 host)
  constexpr int NVC = NV < kAccRegs ? NV : (kVW == 16 ? kAccRegs / 2 : kAccRegs);
  constexpr int kHeads = kAccRegs / NVC;
  const bool share = kHeads > 1 && s.G > 1;
  float w[kHeads * kTile];
  for (int64_t t0 = t_a; t0 < t_b; t0 += kTile) {
    const int nt = static_cast<int>(std::min<int64_t>(kTile, t_b - t0));
    rd.fetch(s.vp, s.vs, s.b, s.start + t0, nt, s.L, 1.f);
    for (int64_t c0 = h0; c0 < h1;) {
      const int64_t c1 = std::min({c0 + kHeads, h1, share ? (c0 / s.G + 1) * s.G : h1});
      const int nc = static_cast<int>(c1 - c0);
      for (int i = 0; i < nc; ++i) {
        const int64_t h = c0 + i, j = h / s.G;
        for (int k = 0; k < nt; ++k)
          w[i * kTile + k] = scores[(h - h0) * stride + t0 + k] * rd.tscale[j * kTile + k];
      }
      for (int64_t col = 0; col < s.d; col += NVC * kVW) {
        int64_t off[kHeads];
        float* sums[kHeads];  // unit i's columns in acc
        for (int i = 0; i < nc; ++i) {
          sums[i] = acc + (c0 + i - h0) * s.d + col;
          off[i] = (c0 + i) / s.G * s.d + col;
        }
        if (share) tile_values<NVC, true, T>(nc, sums, rd.rows, rd.ahead, off, nt, w, kTile);
        else tile_values<NVC, false, T>(nc, sums, rd.rows, rd.ahead, off, nt, w, kTile);
      }
      c0 = c1;
    }
  }
}

// decode_split's per-call arrays, kept by the calling thread.
struct SplitScratch {
  std::vector<int64_t> starts, ns, first_chunk, score_at;
  Filled<float> scores, partial;
};

// One stream (or fewer sequences than threads) over many tokens, in three passes whose items
// are (sequence, KV head, chunk of kChunk tokens): the scores of the KV head's G query heads
// (its rows read once for all of them, only its slice of each row fetched); each head's
// softmax; each item's V sums from zero. The chunks' sums are then added in order: the same
// bits as one item per sequence (decode's per-sequence path sums the same chunks). Where
// per-head items (the split before) read every KV row G times and the 9 heads of a SmolLM2
// layer went 5 : 4 to two threads.
//
// The passes run in one parallel region, a barrier between them, each thread on a fixed share
// of each pass's items. Three regions (a fork and a join each, and the pass's imbalance at
// every join) took one stream of 256 tokens 11.8 us a layer on 2 threads, in cache, against
// ~16 on one thread; one region 10.7 (128 tokens 8.5 -> 7.0, 1,000 34 -> 32; Zen 4).
//
// Its buffers (SplitScratch) stay with the calling thread from call to call, unfilled: a
// zeroed scores / partial-sums pair per layer was memset, malloc and free on the calling
// thread while the others waited for the region (the memset alone 2% of that thread's
// samples in a one-stream profile, 2 threads, Zen 4); one sequence of 600 float16 tokens,
// SmolLM2 shapes: 19.0-19.4 us a call against 20.1-22.3 (minimum of 300).
template <int NV, typename T>
static void decode_split(float* op, const float* qp, const T* kp, const T* vp,
                         const uint16_t* ks, const uint16_t* vs, const int64_t* bt,
                         const int64_t* lens, int64_t D, int64_t H, int64_t d, int64_t bs,
                         int64_t kvh, int64_t max_blocks, float fscale, int64_t window,
                         int64_t q_stride) {
  const int64_t G = H / kvh, row_len = kvh * d;
  thread_local SplitScratch sx;
  std::vector<int64_t>&starts = sx.starts, &ns = sx.ns, &first_chunk = sx.first_chunk,
                       &score_at = sx.score_at;
  starts.resize(D), ns.resize(D), first_chunk.assign(D + 1, 0), score_at.assign(D + 1, 0);
  for (int64_t b = 0; b < D; ++b) {
    starts[b] = visible_start(lens[b], window);
    ns[b] = lens[b] - starts[b];
    first_chunk[b + 1] = first_chunk[b] + (ns[b] + kChunk - 1) / kChunk;
    score_at[b + 1] = score_at[b] + H * ns[b];
  }
  const int64_t chunks = first_chunk[D];
  // every score is written by scores_range and every partial sum by its item's fill before
  // they are read
  sx.scores.resize(score_at[D]);
  sx.partial.resize(chunks * H * d);
  float* const scores_p = sx.scores.data();
  float* const partial_p = sx.partial.data();
  auto seq = [&](int64_t b) {
    return TileSeq<T>{qp + b * q_stride, kp, vp, ks, vs, b, G, d, starts[b], ns[b], lens[b],
                      fscale};
  };
  const int threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  // Items: (global chunk, KV head), or whole chunks (all heads, a chunk's rows read as one run
  // of bytes) where those split evenly or are many: the same chunks' sums either way. The
  // item's sequence by the chunk offsets.
  const int64_t groups = chunks % threads == 0 || chunks >= 4 * threads ? 1 : kvh;
  const int64_t items = chunks * groups;
  auto for_items = [&](int t, int nt, TileRows<T>& rd, auto&& body) {
    for (int64_t it = items * t / nt; it < items * (t + 1) / nt; ++it) {
      const int64_t c = it / groups, g = it % groups;
      const int64_t b = std::upper_bound(first_chunk.begin(), first_chunk.end(), c) -
                        first_chunk.begin() - 1;
      const TileSeq<T> s = seq(b);
      const int64_t t_a = (c - first_chunk[b]) * kChunk;
      body(rd, s, c, g * H / groups, (g + 1) * H / groups, t_a, std::min(s.n, t_a + kChunk));
    }
  };
  // Thread t of nt: its scores, its heads' softmax, its V sums; `sync` between the passes (the
  // region's barrier, or nothing on one thread).
  auto run = [&](int t, int nt, auto&& sync) {
    TileRows<T> rd(bt, max_blocks, bs, kvh, row_len);
    for_items(t, nt, rd, [&](TileRows<T>& r, const TileSeq<T>& s, int64_t, int64_t h0,
                             int64_t h1, int64_t t_a, int64_t t_b) {
      scores_range<NV, T>(r, s, h0, h1, t_a, t_b, scores_p + score_at[s.b] + h0 * s.n,
                          s.n);
    });
    sync();
    for (int64_t i = D * H * t / nt; i < D * H * (t + 1) / nt; ++i)
      softmax_(scores_p + score_at[i / H] + (i % H) * ns[i / H], ns[i / H]);
    sync();
    for_items(t, nt, rd, [&](TileRows<T>& r, const TileSeq<T>& s, int64_t c, int64_t h0,
                             int64_t h1, int64_t t_a, int64_t t_b) {
      float* acc = partial_p + (c * H + h0) * d;
      std::fill(acc, acc + (h1 - h0) * d, 0.f);
      values_range<NV, T>(r, s, h0, h1, t_a, t_b, scores_p + score_at[s.b] + h0 * s.n,
                          s.n, acc);
    });
  };
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    run(omp_get_thread_num(), omp_get_num_threads(), [] {
#pragma omp barrier
    });
  } else {
    run(0, 1, [] {});
  }
  for (int64_t b = 0; b < D; ++b) {
    float* out = op + b * H * d;
    std::fill(out, out + H * d, 0.f);
    for (int64_t c = first_chunk[b]; c < first_chunk[b + 1]; ++c) {
      const float* part = partial_p + c * H * d;
      for (int64_t i = 0; i < H * d; ++i) out[i] += part[i];
    }
  }
}

// fn(integral_constant<NV>) for a head size the tiles take (64, 128, 256: NV vectors a
// row); false for the others, which run the per-token path. One list for both of decode's
// paths.
template <typename Fn>
static inline bool with_tile_head(int64_t d, Fn&& fn) {
  switch (d) {
    case 64: fn(std::integral_constant<int, 64 / kVW>{}); return true;
    case 128: fn(std::integral_constant<int, 128 / kVW>{}); return true;
    case 256: fn(std::integral_constant<int, 256 / kVW>{}); return true;
    default: return false;
  }
}
#endif

// Work items: with at least as many sequences as threads, one per sequence, where each cached
// token's K (then V) row of all kv heads is read once, contiguously, and serves all H query
// heads. With fewer (one stream: D = 1) holding kSplitTokens or more: the tile kernels'
// decode_split, elsewhere one item per (sequence, query head), so every thread has work (a
// row's kv-head slice then serves the heads of one item; the rest stay in L2). A head's
// numbers do not depend on the split: the same dot products, softmax and sums in the same
// order.
template <typename T>
static void decode(float* op, const float* qp, const T* kp, const T* vp, const uint16_t* ks,
                   const uint16_t* vs, const int64_t* bt, const int64_t* lens, int64_t D,
                   int64_t H, int64_t d, int64_t bs, int64_t kvh, int64_t max_blocks,
                   float fscale, int64_t window, int64_t q_stride) {
  constexpr bool kQuant = !std::is_same_v<T, float>;  // rows converted to fp32 to be used
  const int64_t G = H / kvh, row_len = kvh * d;
  int64_t tokens = 0;
  for (int64_t b = 0; b < D; ++b) tokens += lens[b];
  // fewer sequences than threads, with enough tokens to pay for the parallel regions (~3-5
  // us; a 64-token head split ran slower than one thread)
  const bool split = D < at::get_num_threads() && tokens >= kSplitTokens;
#if defined(PAGEDLLM_PA_TILES)
  if (split && kTiles<T> && with_tile_head(d, [&](auto nv) {
        decode_split<decltype(nv)::value, T>(op, qp, kp, vp, ks, vs, bt, lens, D, H, d, bs, kvh,
                                             max_blocks, fscale, window, q_stride);
      }))
    return;
#endif
  const int64_t per_seq = split ? 1 : H;  // query heads per work item
  const int64_t items_per_seq = H / per_seq;
  // Whole sequences an item, a thread done with its own taking a slower thread's last ones;
  // (sequence, head) items split as at::parallel_for splits them (no stealing).
  balanced_for(D * items_per_seq, [&](BalancedTurn& turn) {
    std::vector<float> scores, acc(H * d), buf(kQuant ? row_len : 0), row_scale(kvh);
    int64_t run_end = 0;  // the end of the run of items this thread is in
    auto fetch = [&](const T* pool, const uint16_t* scales, int64_t slot, float mul) {
      if constexpr (kQuant) {
        Row<T>::load(pool + slot * row_len, buf.data(), row_len);
        for (int64_t j = 0; j < kvh; ++j) {
          row_scale[j] = kScaled<T> ? mul * Row<T>::kMul * half_to_float(scales[slot * kvh + j])
                                    : mul;
        }
        return static_cast<const float*>(buf.data());
      } else {
        (void)scales;
        std::fill(row_scale.begin(), row_scale.end(), mul);
        return static_cast<const float*>(pool + slot * row_len);
      }
    };
    auto slot_of = [&](int64_t b, int64_t pos) { return pool_slot(bt, max_blocks, bs, b, pos); };
    // query heads [h0, h1) of sequence b
    auto attend = [&](int64_t b, int64_t h0, int64_t h1) {
      const int64_t L = lens[b];
      const int64_t start = visible_start(L, window);
      const int64_t n = L - start, nh = h1 - h0;
      scores.resize(nh * n);
      const float* qb = qp + b * q_stride;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = start + t;
        if (t + kAhead < n) prefetch_row(kp, slot_of(b, pos + kAhead), row_len);
        const float* row = fetch(kp, ks, slot_of(b, pos), fscale);
        for (int64_t h = h0; h < h1; ++h) {
          scores[(h - h0) * n + t] = dot(qb + h * d, row + (h / G) * d, d) * row_scale[h / G];
        }
      }
      for (int64_t h = 0; h < nh; ++h) softmax_(scores.data() + h * n, n);
      std::fill(acc.begin(), acc.begin() + nh * d, 0.f);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = start + t;
        if (t + kAhead < n) prefetch_row(vp, slot_of(b, pos + kAhead), row_len);
        const float* row = fetch(vp, vs, slot_of(b, pos), 1.f);
        for (int64_t h = h0; h < h1; ++h) {
          axpy(acc.data() + (h - h0) * d, scores[(h - h0) * n + t] * row_scale[h / G],
               row + (h / G) * d, d);
        }
      }
      std::copy(acc.begin(), acc.begin() + nh * d, op + b * H * d + h0 * d);
    };
#if defined(PAGEDLLM_PA_TILES)
    TileRows<T> rd(bt, max_blocks, bs, kvh, row_len);
    // the tile passes over all heads of sequence b, the V sums chunk by chunk (decode_split's)
    auto attend_tiles = [&](auto nv, int64_t b) {
      constexpr int NV = decltype(nv)::value;  // vectors per head row
      const int64_t L = lens[b];
      const int64_t start = visible_start(L, window);
      const TileSeq<T> s{qp + b * q_stride, kp, vp, ks, vs, b, G, d, start, L - start, L,
                         fscale};
      scores.resize(H * s.n);
      rd.next = {vp, b, start, L};  // the K pass's last tile asks for the first V rows
      scores_range<NV, T>(rd, s, 0, H, 0, s.n, scores.data(), s.n);
      for (int64_t h = 0; h < H; ++h) softmax_(scores.data() + h * s.n, s.n);
      float* out = op + b * H * d;
      std::fill(out, out + H * d, 0.f);
      rd.next = {};  // and the V pass's, the K rows of this thread's next sequence (an item
      const int64_t nb = b + 1 < run_end ? b + 1 : turn.peek();  // is a sequence here:
      if (nb >= 0) rd.next = {kp, nb, visible_start(lens[nb], window), lens[nb]};  // unsplit)
      for (int64_t t_a = 0; t_a < s.n; t_a += kChunk) {
        std::fill(acc.begin(), acc.end(), 0.f);
        values_range<NV, T>(rd, s, 0, H, t_a, std::min(s.n, t_a + kChunk), scores.data(), s.n,
                            acc.data());
        for (int64_t i = 0; i < H * d; ++i) out[i] += acc[i];
      }
    };
#endif
    // each run of items [begin, run_end) as runs of consecutive heads of one sequence
    for (int64_t begin; (begin = turn.next_run(&run_end)) >= 0;)
      for (int64_t it = begin; it < run_end;) {
        const int64_t b = it / items_per_seq, first = it % items_per_seq;
        const int64_t last = std::min(items_per_seq, first + (run_end - it));
        const int64_t h0 = first * per_seq, h1 = last * per_seq;
#if defined(PAGEDLLM_PA_TILES)
        if (!(kTiles<T> && with_tile_head(d, [&](auto nv) { attend_tiles(nv, b); })))
#endif
        attend(b, h0, h1);
        it += last - first;
      }
  }, !split && D >= kStealRows);
}

// Which thread reads what mirrors decode above: with at least as many rows as threads, thread t
// takes rows [t c, (t + 1) c) (c = ceil(D / threads), at::parallel_for's split), each row's K
// then its V; with fewer, every thread takes its share of each row's tokens (decode_split's
// chunks, near enough), all its K rows before its V rows (the scores pass, then the values').
PrefetchPlan decode_kv_prefetch(const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                                int64_t window, int64_t threads, int64_t budget) {
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  block_tables.dtype() == torch::kInt64 && block_tables.is_contiguous() &&
                  seq_lens.dtype() == torch::kInt64 && seq_lens.is_contiguous() &&
                  block_tables.size(0) == seq_lens.numel() && threads > 0,
              "decode_kv_prefetch: caches [blocks, bs, kvh, d], int64 block tables [D, W] and "
              "seq_lens [D]");
  const int64_t D = seq_lens.numel(), W = block_tables.size(1), bs = k_cache.size(1);
  const int64_t row = k_cache.size(2) * k_cache.size(3) * k_cache.element_size();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const char* pools[2] = {static_cast<const char*>(k_cache.data_ptr()),
                          static_cast<const char*>(v_cache.data_ptr())};
  std::vector<std::vector<PrefetchSpan>> spans(threads);
  std::vector<int64_t> left(threads, budget);
  // tokens [p0, p1) of row b from pool `which`: one span per block, cut at the budget
  auto add = [&](int64_t t, int which, int64_t b, int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1 && left[t] > 0;) {
      const int64_t end = std::min(p1, (p / bs + 1) * bs);
      const int64_t bytes = std::min((end - p) * row, left[t]);
      spans[t].push_back({pools[which] + pool_slot(bt, W, bs, b, p) * row, bytes});
      left[t] -= bytes;
      p = end;
    }
  };
  auto visible = [&](int64_t b) {  // the tokens before the new one a query of row b sees
    const int64_t L = lens[b];
    return std::make_pair(visible_start(L, window), std::max<int64_t>(L - 1, 0));
  };
  if (D >= threads) {
    const int64_t c = (D + threads - 1) / threads;
    for (int64_t b = 0; b < D; ++b) {
      const auto [p0, p1] = visible(b);
      for (int which = 0; which < 2; ++which) add(b / c, which, b, p0, p1);
    }
  } else {
    for (int which = 0; which < 2; ++which) {
      for (int64_t b = 0; b < D; ++b) {
        const auto [p0, p1] = visible(b);
        for (int64_t t = 0; t < threads; ++t)
          add(t, which, b, p0 + (p1 - p0) * t / threads, p0 + (p1 - p0) * (t + 1) / threads);
      }
    }
  }
  return PrefetchPlan(std::move(spans));
}

static void check_decode_args(const torch::Tensor& out, const torch::Tensor& q,
                              const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                              const torch::Tensor& block_tables, const torch::Tensor& seq_lens) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && out.dtype() == torch::kFloat32,
              "paged decode attention: fp32 queries only");
  TORCH_CHECK(k_cache.dtype() == v_cache.dtype(), "K and V caches must have one dtype");
  TORCH_CHECK(block_tables.dtype() == torch::kInt64 && seq_lens.dtype() == torch::kInt64);
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
              out.is_contiguous() && block_tables.is_contiguous() && seq_lens.is_contiguous());
}

void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                            torch::Tensor v_cache, torch::Tensor block_tables,
                            torch::Tensor seq_lens, double scale, int64_t window) {
  check_decode_args(out, q, k_cache, v_cache, block_tables, seq_lens);
  dispatch_16_32(k_cache.scalar_type(), "paged_decode_attention", [&](auto tag) {
    using T = decltype(tag);
    decode<T>(out.data_ptr<float>(), q.data_ptr<float>(),
              static_cast<const T*>(k_cache.data_ptr()), static_cast<const T*>(v_cache.data_ptr()),
              nullptr, nullptr, block_tables.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(),
              q.size(0), q.size(1), q.size(2), k_cache.size(1), k_cache.size(2),
              block_tables.size(1), static_cast<float>(scale), window, q.size(1) * q.size(2));
  });
}

void paged_decode_attention_quant(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                                  torch::Tensor v_cache, torch::Tensor k_scale,
                                  torch::Tensor v_scale, torch::Tensor block_tables,
                                  torch::Tensor seq_lens, double scale, int64_t window) {
  check_decode_args(out, q, k_cache, v_cache, block_tables, seq_lens);
  TORCH_CHECK(k_scale.dtype() == torch::kFloat16 && v_scale.dtype() == torch::kFloat16 &&
              k_scale.is_contiguous() && v_scale.is_contiguous(),
              "scales must be contiguous float16");
  auto run = [&](auto tag) {
    using T = decltype(tag);
    decode<T>(out.data_ptr<float>(), q.data_ptr<float>(),
              static_cast<const T*>(k_cache.data_ptr()), static_cast<const T*>(v_cache.data_ptr()),
              static_cast<const uint16_t*>(k_scale.data_ptr()),
              static_cast<const uint16_t*>(v_scale.data_ptr()), block_tables.data_ptr<int64_t>(),
              seq_lens.data_ptr<int64_t>(), q.size(0), q.size(1), q.size(2), k_cache.size(1),
              k_cache.size(2), block_tables.size(1), static_cast<float>(scale), window,
              q.size(1) * q.size(2));
  };
  dispatch_8bit(k_cache.scalar_type(), "paged_decode_attention_quant", run);
}

// Every slot a write targets lies inside the pool (a bad slot would write out of bounds).
static void check_slots(const int64_t* sp, int64_t T, int64_t num_slots) {
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "slot ", sp[t], " out of range [0, ",
                num_slots, ")");
  }
}

template <typename T>
static void quantize_rows(const float* x, T* cache, uint16_t* scales, const int64_t* slots,
                          int64_t rows, int64_t kvh, int64_t d, int64_t token_stride) {
  constexpr float kScaleMin = 5.9604644775390625e-08f;  // 2^-24, smallest float16
  constexpr float kScaleMax = 65504.f;                   // largest float16
  constexpr float kInvMax = 1.f / Row<T>::kMax;
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* src = x + (r / kvh) * token_stride + (r % kvh) * d;
      float amax = 0.f;
      for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(src[i]));
      const float target = std::min(std::max(amax * kInvMax, kScaleMin), kScaleMax);
      uint16_t s = c10::detail::fp16_ieee_from_fp32_value(target);
      if (half_to_float(s) < target) ++s;  // round up: positive and finite, so next float16
      const float inv = 1.f / half_to_float(s);
      const int64_t dst = slots[r / kvh] * kvh + r % kvh;
      T* out = cache + dst * d;
      for (int64_t i = 0; i < d; ++i) out[i] = Row<T>::store(src[i] * inv);
      scales[dst] = s;
    }
  });
}

void quantize_into_cache(torch::Tensor x, torch::Tensor cache, torch::Tensor scales,
                         torch::Tensor slots) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous() && x.dim() == 3,
              "quantize_into_cache: x must be contiguous fp32 [T, kv_heads, d]");
  TORCH_CHECK(cache.is_contiguous() && scales.is_contiguous() &&
              scales.dtype() == torch::kFloat16 && slots.dtype() == torch::kInt64 &&
              slots.is_contiguous());
  const int64_t T = x.size(0), kvh = x.size(1), d = x.size(2);
  TORCH_CHECK(slots.numel() == T && cache.size(-2) == kvh && cache.size(-1) == d);
  const int64_t num_slots = cache.numel() / (kvh * d);
  const int64_t* sp = slots.data_ptr<int64_t>();
  check_slots(sp, T, num_slots);
  auto run = [&](auto tag) {
    using Q = decltype(tag);
    quantize_rows<Q>(x.data_ptr<float>(), static_cast<Q*>(cache.data_ptr()),
                     static_cast<uint16_t*>(scales.data_ptr()), sp, T * kvh, kvh, d, kvh * d);
  };
  dispatch_8bit(cache.scalar_type(), "quantize_into_cache", run);
}

// T rows of `row` fp32 values (x, row stride ldx) stored at slots sp of an fp32 or float16
// cache of such rows: copied, or rounded to nearest even by F16C's instruction (torch's and
// c10::Half's bits). The K/V write of every step, prefill (store_into_cache) and decode-only
// (paged_decode_attention_qkv) alike.
template <typename C>
void store_rows(const float* x, int64_t ldx, int64_t T, int64_t row, const int64_t* sp,
                C* cache) {
  at::parallel_for(0, T, 64, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* src = x + t * ldx;
      C* dst = cache + sp[t] * row;
      if constexpr (std::is_same_v<C, float>) {
        std::copy(src, src + row, dst);
      } else {
        uint16_t* out = reinterpret_cast<uint16_t*>(dst);
        int64_t c = 0;
#if defined(__AVX512F__)
        for (; c + 16 <= row; c += 16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c),
                              _mm512_cvtps_ph(_mm512_loadu_ps(src + c), _MM_FROUND_TO_NEAREST_INT));
#elif defined(__F16C__)
        for (; c + 8 <= row; c += 8)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c),
                           _mm256_cvtps_ph(_mm256_loadu_ps(src + c), _MM_FROUND_TO_NEAREST_INT));
#endif
        for (; c < row; ++c) dst[c] = c10::Half(src[c]);
      }
    }
  });
}

// K or V rows x [T, kvh, d] fp32 (rows may be strided: a view of the fused qkv rows) stored
// at their slots of an fp32 or float16 cache [slots, kvh, d]: `cache.index_copy_(0, slots,
// x.to(cache.dtype))` in one pass, no converted copy (a prefill wrote every K / V row twice).
void store_into_cache(torch::Tensor x, torch::Tensor cache, torch::Tensor slots) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 3 && x.stride(2) == 1 &&
              x.stride(1) == x.size(2), "store_into_cache: x must be fp32 [T, kv_heads, d] "
              "with contiguous rows");
  TORCH_CHECK(cache.is_contiguous() && (cache.dtype() == torch::kFloat32 ||
              cache.dtype() == torch::kFloat16) && slots.dtype() == torch::kInt64 &&
              slots.is_contiguous(), "store_into_cache: an fp32 or float16 contiguous cache "
              "and int64 slots");
  const int64_t T = x.size(0), row = x.size(1) * x.size(2);
  TORCH_CHECK(slots.numel() == T && cache.numel() % row == 0 &&
              cache.size(-1) * cache.size(-2) == row, "store_into_cache: ", T, " rows of ",
              row, " values, ", slots.numel(), " slots");
  const int64_t* sp = slots.data_ptr<int64_t>();
  check_slots(sp, T, cache.numel() / row);
  dispatch_16_32(cache.scalar_type(), "store_into_cache", [&](auto tag) {
    using C = decltype(tag);
    store_rows<C>(x.data_ptr<float>(), x.stride(0), T, row, sp, static_cast<C*>(cache.data_ptr()));
  });
}

// One decode step of one layer's attention straight from the fused q|k|v rows of the qkv
// projection, qkv [T, (H + 2 kvh) d] with every row a decode (one token per sequence): the
// new K and V rows go to their slots (quantized when the cache is 8-bit), then attention
// reads the queries in place. One call instead of the split, views, two cache writes, an
// output allocation and the attention call (~8 torch ops, ~3-5 us each on this CPU).
//
//   row t:  [ q: H x d | k: kvh x d | v: kvh x d ]  ->  out[t] = attention(q_t, cache[t])
torch::Tensor paged_decode_attention_qkv(torch::Tensor qkv, torch::Tensor k_cache,
                                         torch::Tensor v_cache,
                                         c10::optional<torch::Tensor> k_scale,
                                         c10::optional<torch::Tensor> v_scale, torch::Tensor slots,
                                         torch::Tensor block_tables, torch::Tensor seq_lens,
                                         int64_t H, double scale, int64_t window) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.dtype() == torch::kFloat32 && qkv.is_contiguous(),
              "paged_decode_attention_qkv: qkv must be contiguous fp32 [T, (H + 2 kvh) d]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.dtype() == v_cache.dtype() &&
              k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_decode_attention_qkv: caches must be contiguous [blocks, bs, kvh, d]");
  TORCH_CHECK(block_tables.dtype() == torch::kInt64 && seq_lens.dtype() == torch::kInt64 &&
              slots.dtype() == torch::kInt64 && block_tables.is_contiguous() &&
              seq_lens.is_contiguous() && slots.is_contiguous());
  const int64_t T = qkv.size(0), bs = k_cache.size(1), kvh = k_cache.size(2), d = k_cache.size(3);
  const int64_t stride = qkv.size(1);
  TORCH_CHECK(stride == (H + 2 * kvh) * d, "paged_decode_attention_qkv: rows of ", stride,
              " values do not hold ", H, " q heads and 2 x ", kvh, " kv heads of ", d);
  TORCH_CHECK(slots.numel() == T && seq_lens.numel() == T && block_tables.size(0) == T,
              "paged_decode_attention_qkv: one slot, length and block table row per row");
  const int64_t num_slots = k_cache.numel() / (kvh * d);
  const int64_t* sp = slots.data_ptr<int64_t>();
  check_slots(sp, T, num_slots);
  const float* base = qkv.data_ptr<float>();
  auto out = torch::empty({T, H * d}, qkv.options());
  const int64_t row_len = kvh * d;
  const bool quant = k_scale.has_value();
  if (!quant) {
    dispatch_16_32(k_cache.scalar_type(), "paged_decode_attention_qkv", [&](auto tag) {
      using C = decltype(tag);
      C* kc = static_cast<C*>(k_cache.data_ptr());
      C* vc = static_cast<C*>(v_cache.data_ptr());
      store_rows<C>(base + H * d, stride, T, row_len, sp, kc);
      store_rows<C>(base + H * d + row_len, stride, T, row_len, sp, vc);
      decode<C>(out.data_ptr<float>(), base, kc, vc, nullptr, nullptr,
                block_tables.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(), T, H, d, bs,
                kvh, block_tables.size(1), static_cast<float>(scale), window, stride);
    });
    return out;
  }
  TORCH_CHECK(v_scale.has_value() && k_scale->dtype() == torch::kFloat16 &&
              v_scale->dtype() == torch::kFloat16 && k_scale->is_contiguous() &&
              v_scale->is_contiguous(), "scales must be contiguous float16");
  auto run = [&](auto tag) {
    using Q = decltype(tag);
    Q* kc = static_cast<Q*>(k_cache.data_ptr());
    Q* vc = static_cast<Q*>(v_cache.data_ptr());
    uint16_t* ks = static_cast<uint16_t*>(k_scale->data_ptr());
    uint16_t* vs = static_cast<uint16_t*>(v_scale->data_ptr());
    quantize_rows<Q>(base + H * d, kc, ks, sp, T * kvh, kvh, d, stride);
    quantize_rows<Q>(base + H * d + row_len, vc, vs, sp, T * kvh, kvh, d, stride);
    decode<Q>(out.data_ptr<float>(), base, kc, vc, ks, vs, block_tables.data_ptr<int64_t>(),
              seq_lens.data_ptr<int64_t>(), T, H, d, bs, kvh, block_tables.size(1),
              static_cast<float>(scale), window, stride);
  };
  dispatch_8bit(k_cache.scalar_type(), "paged_decode_attention_qkv", run);
  return out;
}
