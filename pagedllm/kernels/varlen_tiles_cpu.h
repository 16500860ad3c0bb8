// The prompt rows' attention on AMX-bf16 tiles, for the varlen kernel (varlen_attention_cpu.cpp).
//
// Why: on a Sapphire Rapids class Xeon the fp32 kernel was a quarter of a 512-token prefill
// once the GEMMs ran on the tiles (prompt_tiles_cpu.cpp); its FMAs are at the vector units'
// peak, so the products go to TDPBF16PS (16,384 multiply-adds an instruction). Which rows come
// here is the prompt tiles' rule (model/layers/quant/prompt_rows.py): a prompt position, never
// the size of its batch; the others stay on the fp32 kernel.
//
// The same state as the fp32 kernel, rows in lanes: a block of 16 query rows (positions x the
// G heads of a KV head) keeps m, l [16] and ot [d][16]. Per chunk of kTK = 32 keys (starting at
// multiples of 32, so a row's result does not depend on how its prompt was split):
//
//   S^T [32 keys][16 rows] = K [32][d] . Q^T       A: K rows (bf16, as packed), B: Q^T pairs
//   s[j] = row j of S^T: every row's score for key j in its lane; mask, max, e^x as fp32
//   O^T [d][16 rows] += V^T [d][32] . P^T          A: V^T rows (packed), B: P^T pairs
//
// so no horizontal reduction and no transposition in the loop: each query row goes into its
// lane of Q^T once per item (write_query_block); K and V^T are packed once per call for each
// (sequence, KV head), bf16, keys from the first any prompt row sees (a multiple of 32) to
// past the last, zero beyond the sequence. Q x scale, K, V and p are rounded to bf16;
// sums and the softmax are fp32. Two blocks go through a chunk together (attend_tiles).
// HwTiles on an AMX-bf16 build; VecTiles (VDPBF16PS) on an AVX-512 BF16 build without AMX
// (Zen 4 class: a 2,000-token prefill 1.2x faster than on the fp32 kernel, 512 tokens 1.1x);
// EmuTiles (the software model) for tests elsewhere.
// Included inside varlen_attention_cpu.cpp's anonymous namespace, after its Layout,
// BlockState and load_chunk.
#pragma once
#include "amx_tiles_cpu.h"
#include "bf16_rows_cpu.h"

#if PAGEDLLM_GGUF_SIMD && defined(__AVX512F__) && defined(__AVX512BW__)
#define PAGEDLLM_VARLEN_TILES 1

constexpr int64_t kTK = 128;  // keys per softmax step: four TDPBF16PS deep in P V

constexpr TileConfig attention_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  return cfg;
}
constexpr TileConfig kAttentionTiles = attention_tile_config();

// One (sequence, KV head)'s keys base .. base + n - 1 packed for the tiles: k [n][d] and
// vt [d][ldv] bf16 (n a multiple of kTK; keys at or past the sequence's length are zero).
// ldv = n + kTK: a row stride of a multiple of 1 KB would put a tile's 16 rows in 4 of the
// L1's 64 sets.
struct PackedKV {
  const uint16_t* k = nullptr;
  const uint16_t* vt = nullptr;
  int64_t base = 0, n = 0, ldv = 0;
};

// Keys [base, base + n) of sequence `table` / KV head hk into pk (n x d) and pvt (d x n);
// kb / vb: kKC x d fp32 scratch for load_chunk.
template <typename T>
void pack_keys(const T* kc, const T* vc, const uint16_t* ks, const uint16_t* vs,
               const int64_t* table, const Layout& lo, int64_t hk, int64_t len, int64_t base,
               int64_t n, int64_t ldv, uint16_t* pk, uint16_t* pvt, float* kb, float* vb) {
  const int64_t d = lo.d;
  alignas(64) uint16_t row[256];
  for (int64_t c0 = base; c0 < base + n; c0 += kKC) {
    const int64_t nk = std::max<int64_t>(0, std::min(kKC, len - c0));
    load_chunk<T>(kc, vc, ks, vs, table, lo, hk, c0, nk, kb, vb);  // rows past nk zero
    for (int64_t j = 0; j < kKC; ++j) {
      const int64_t at = c0 - base + j;
      for (int64_t c = 0; c < d; c += 16) store_bf16(pk + at * d + c, vload(kb + j * d + c));
      for (int64_t c = 0; c < d; c += 16) store_bf16(row + c, vload(vb + j * d + c));
      for (int64_t c = 0; c < d; ++c) pvt[c * ldv + at] = row[c];
    }
  }
}

// r[0..15] (16 x 16 32-bit values, row i in r[i]) transposed in place: r[k] holds column k.
// Four rounds of lane shuffles (64 instructions) in place of 256 scattered 4-byte moves: with
// them the query and output transpositions below made the attention 1.02-1.05x faster (512
// and 2,000 tokens, mixed lengths; same bits).
inline void transpose16(VI* r) {
  VI t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // u[4 g + k], 128-bit lane L: rows 4 g .. 4 g + 3, column 4 L + k
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
    t[4 + k] = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xdd);
    t[8 + k] = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
    t[12 + k] = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xdd);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0x88);
    r[8 + k] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0xdd);
    r[4 + k] = _mm512_shuffle_i32x4(t[4 + k], t[12 + k], 0x88);
    r[12 + k] = _mm512_shuffle_i32x4(t[4 + k], t[12 + k], 0xdd);
  }
}

// A block's 16 query rows (d values at src[i], times scale) into its Q^T pairs (dst [d / 2]
// [16] 32-bit words): word (j, i) holds row i's (q[2 j], q[2 j + 1]) in bf16, rounded to
// nearest even: the B tiles of S^T = K . Q^T. 32 values of a row are 16 such words in one
// vector, so 16 rows' vectors transposed are 16 rows of dst.
inline void write_query_block(const float* const* src, int64_t d, float scale, uint32_t* dst) {
  const V sc = vset(scale);
  for (int64_t c = 0; c < d; c += 32) {
    VI r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = bf16_32(vmul(vload(src[i] + c), sc), vmul(vload(src[i] + c + 16), sc));
    transpose16(r);
    for (int j = 0; j < 16; ++j) _mm512_storeu_si512(dst + (c / 2 + j) * 16, r[j]);
  }
}

// A block's output, rows in lanes (ot [d][16]), to its first `rows` rows (dst[i], d values)
// times inv[i].
inline void write_output_rows(const float* ot, int64_t d, const float* inv, int rows,
                              float* const* dst) {
  for (int64_t c = 0; c < d; c += 16) {
    VI r[16];
    for (int k = 0; k < 16; ++k) r[k] = _mm512_castps_si512(vload(ot + (c + k) * 16));
    transpose16(r);
    for (int i = 0; i < rows; ++i)
      vstore(dst[i] + c, vmul(_mm512_castsi512_ps(r[i]), vset(inv[i])));
  }
}

// e^x for the x <= 0 of the softmax, to ~4e-5 relative: the probabilities are rounded to bf16
// (2^-9) for the tiles, so a 4th-degree 2^f on [-1/2, 1/2] and one scalef do (the fp32
// kernel's vexp_le0 takes twice the instructions for 1e-7, and e^x is the softmax's cost).
inline V exp_bf16(V x) {
  const V t = vmul(vmax(x, vset(-87.f)), vset(1.44269504088896341f));
  const V n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V f = vsub(t, n);
  V p = vset(9.6181291e-3f);           // ln2^4 / 24
  p = vfma(p, f, vset(5.5504109e-2f));  // ln2^3 / 6
  p = vfma(p, f, vset(2.4022651e-1f));  // ln2^2 / 2
  p = vfma(p, f, vset(6.9314718e-1f));  // ln2
  p = vfma(p, f, vset(1.f));
  return _mm512_scalef_ps(p, n);
}

// The softmax step of one block of 16 rows over the chunk's first `width` scores, sbuf
// [width][16] (rows in lanes): mask, running max and sum, and the probabilities as P^T pairs
// in pb [width / 2][16]; returns alpha, the factor the block's earlier sums take.
inline V softmax_chunk(const BlockState& b, int64_t c0, int64_t nk, int64_t width, bool mask,
                       float softcap, float* sbuf, uint32_t* pb) {
  if (softcap > 0.f)
    for (int64_t i = 0; i < width * 16; ++i) sbuf[i] = std::tanh(sbuf[i] / softcap) * softcap;
  const V m_old = vload(b.m);
  V mx = m_old;
  uint32_t vis[kTK];  // lane masks (all lanes unless `mask`)
  for (int64_t j = 0; j < width; ++j) {
    V s = vload(sbuf + j * 16);
    if (mask) {
      const V key = vset(static_cast<float>(j < nk ? c0 + j : INT32_MAX));
      const M v = mand(vle(key, b.qpos), vle(b.qlo, key));
      vis[j] = mbits(v);
      s = vsel(v, s, vset(-1e30f));
      vstore(sbuf + j * 16, s);
    }
    mx = vmax(mx, s);
  }
  const V alpha = exp_bf16(vsub(m_old, mx));
  V sum = vzero();
  for (int64_t j = 0; j < width; j += 2) {
    if (mask && (vis[j] | vis[j + 1]) == 0) {  // past every row (causal) or before (window)
      _mm512_storeu_si512(pb + (j / 2) * 16, _mm512_setzero_si512());
      continue;
    }
    V p[2];
    for (int h = 0; h < 2; ++h) {
      p[h] = exp_bf16(vsub(vload(sbuf + (j + h) * 16), mx));
      if (mask) p[h] = vsel(static_cast<M>(vis[j + h]), p[h], vzero());  // nothing visible: 0
      sum = vadd(sum, p[h]);
    }
    _mm512_storeu_si512(pb + (j / 2) * 16, pair_row(p[0], p[1]));
  }
  vstore(b.m, mx);
  vstore(b.l, vfma(vload(b.l), alpha, sum));
  return alpha;
}

// Blocks b[0] (and b[1] when `Two`) of 16 rows each against keys c0 .. c0 + kTK - 1 (nk of
// them real) on the tiles: the fp32 kernel's attend_block with the products on TDPBF16PS.
// Two blocks share each K and V^T tile load, and the four tile products of a step are
// independent (C[2 h + i]: key or column half h, block i); the kTK keys go through in steps
// of 32 with no dependence between the steps (S^T stored per step, O^T summed in the tiles
// over all steps), so the unit is not left waiting on one chain. qb[i]: block i's Q^T pairs;
// mask[i]: its lanes are masked by position; sbuf [2][kTK][16] and tmp [2][32][16] fp32,
// pb [2][kTK / 2][16] pairs: scratch.
template <typename Tiles, bool Two>
void attend_tiles(const BlockState* b, const uint32_t* const* qb, const PackedKV& kv,
                  int64_t c0, int64_t nk, const bool* mask, const Layout& lo, float* sbuf,
                  uint32_t* pb, float* tmp) {
  const int64_t d = lo.d, at = c0 - kv.base, steps = (nk + 31) / 32;
  constexpr int64_t kS = kTK * 16, kP = kTK / 2 * 16;
  for (int64_t t = 0; t < steps; ++t) {  // S^T keys 32 t + 0-15 (A 4) and + 16-31 (A 5)
    Tiles::template zero<0>();
    Tiles::template zero<2>();
    if constexpr (Two) {
      Tiles::template zero<1>();
      Tiles::template zero<3>();
    }
    const uint16_t* k = kv.k + (at + 32 * t) * d;
    for (int64_t s = 0; s < d / 32; ++s) {
      Tiles::template load<4>(k + 32 * s, d * 2);
      Tiles::template load<5>(k + 16 * d + 32 * s, d * 2);
      Tiles::template load<6>(qb[0] + s * 256, 64);
      Tiles::template dpbf16ps<0, 4, 6>();
      Tiles::template dpbf16ps<2, 5, 6>();
      if constexpr (Two) {
        Tiles::template load<7>(qb[1] + s * 256, 64);
        Tiles::template dpbf16ps<1, 4, 7>();
        Tiles::template dpbf16ps<3, 5, 7>();
      }
    }
    Tiles::template store<0>(sbuf + t * 512, 64);
    Tiles::template store<2>(sbuf + t * 512 + 256, 64);
    if constexpr (Two) {
      Tiles::template store<1>(sbuf + kS + t * 512, 64);
      Tiles::template store<3>(sbuf + kS + t * 512 + 256, 64);
    }
  }
  V alpha[2];
  for (int i = 0; i < (Two ? 2 : 1); ++i)
    alpha[i] = softmax_chunk(b[i], c0, nk, steps * 32, mask[i], lo.softcap, sbuf + i * kS,
                             pb + i * kP);
  for (int64_t cb = 0; cb < d; cb += 32) {  // O^T rows cb .. cb + 15 (A 4), + 16 .. 31 (A 5)
    Tiles::template zero<0>();
    Tiles::template zero<2>();
    if constexpr (Two) {
      Tiles::template zero<1>();
      Tiles::template zero<3>();
    }
    for (int64_t t = 0; t < steps; ++t) {
      Tiles::template load<4>(kv.vt + cb * kv.ldv + at + 32 * t, kv.ldv * 2);
      Tiles::template load<5>(kv.vt + (cb + 16) * kv.ldv + at + 32 * t, kv.ldv * 2);
      Tiles::template load<6>(pb + t * 256, 64);
      Tiles::template dpbf16ps<0, 4, 6>();
      Tiles::template dpbf16ps<2, 5, 6>();
      if constexpr (Two) {
        Tiles::template load<7>(pb + kP + t * 256, 64);
        Tiles::template dpbf16ps<1, 4, 7>();
        Tiles::template dpbf16ps<3, 5, 7>();
      }
    }
    Tiles::template store<0>(tmp, 64);
    Tiles::template store<2>(tmp + 256, 64);
    if constexpr (Two) {
      Tiles::template store<1>(tmp + 512, 64);
      Tiles::template store<3>(tmp + 768, 64);
    }
    for (int i = 0; i < (Two ? 2 : 1); ++i)
      for (int64_t c = 0; c < 32; ++c) {
        float* o = b[i].ot + (cb + c) * kVW;
        vstore(o, vfma(vload(o), alpha[i], vload(tmp + i * 512 + c * 16)));
      }
  }
}
#else
#define PAGEDLLM_VARLEN_TILES 0
#endif
