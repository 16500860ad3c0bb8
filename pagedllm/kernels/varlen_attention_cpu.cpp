// Paged attention over packed sequences (varlen, flash-style) for CPU: the prefill chunks of a
// step, every sequence's query rows concatenated with per-sequence offsets (cu_seqlens, the
// metadata the Triton path uses), keys and values read through the block table, causal inside
// each sequence, optional sliding window and logit soft-capping, fp32 online softmax. Nothing
// is padded to the longest sequence and no [P, q, L] mask exists: a step of one 900-token
// prompt and nineteen 5-token prompts costs what its (query, key) pairs cost.
//
//   q rows:  [ seq 0: n0 rows | seq 1: n1 rows | ... ]      query_start [P + 1]
//   seq p:   its n_p rows are positions L_p - n_p .. L_p - 1 (L_p = seq_lens[p], cached + new)
//            the row at position i sees keys max(0, i - window + 1) .. i
//
// Work item = (sequence, KV head, tile of kQT query positions; kQTT for prompt rows on the
// AMX tiles). A tile's rows are its positions x the G query heads of that KV head (GQA: each
// K/V chunk is loaded once for all G heads), in blocks of kVW rows held in the lanes of a
// vector ("rows in lanes"):
//
//   qt [d][kVW]   the block's queries, transposed once per tile (times the scale)
//   s[j]          one vector per key of the chunk: row r's score in lane r
//                 s[j] += qt[c] * K[j][c]   (a broadcast of one K value per FMA)
//   m, l          running max and sum per lane; p[j] = e^(s[j] - m) never leaves registers
//   ot [d][kVW]   ot[c] = ot[c] * alpha + sum_j V[j][c] * p[j]
//
// so K and V are read in the cache's own row layout (no transposition), the online softmax has
// no horizontal reductions, and the causal / window mask is a compare of key and row positions,
// needed only in the chunks that cross a row's first or last visible key. Keys stream in
// chunks of kKC starting at multiples of kKC, so a row's result does not depend on how its
// sequence was split into tiles, prefill chunks or blocks (lanes compute independently).
// Items are handed out dynamically, costliest first: causal tiles differ in cost.
#include <torch/csrc/utils/pybind.h>  // register_varlen_attention(m): pybind11, Tensor casters
#include "torch_lite_cpu.h"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kv_rows_cpu.h"
#include "kernels_cpu.h"  // prompt_tile_mode

namespace {

#include "simd_cpu.h"

#if PAGEDLLM_GGUF_SIMD
constexpr int64_t kKC = kVW;  // keys per chunk
constexpr int64_t kQT = 16;   // query positions per tile
// Query positions per tile of prompt rows on the AMX tiles (varlen_tiles_cpu.h), which take
// a chunk's blocks two at a time (sharing each K and V^T tile load): with 16 positions and
// 3 heads a KV head (SmolLM2), every third block went alone. 32 positions (6 blocks): the
// tiles' attention 1.03-1.05x at 512 and 2,000 tokens and mixed short prompts, 0.99x at one
// 900-token prompt with nineteen 5-token ones (Sapphire Rapids class, same bits); 64: 1.00x.
constexpr int64_t kQTT = 32;

struct Layout {
  int64_t H, kvh, d, bs, max_blocks, q_stride;
  float scale, softcap;
  int64_t window;
};

// K and V rows [kKC][d] of keys c0 .. c0 + nk - 1 of one sequence and KV head `hk`, fp32 with
// their scales applied; rows nk .. kKC - 1 are zero (the caller masks them).
template <typename T>
void load_chunk(const T* kc, const T* vc, const uint16_t* ks, const uint16_t* vs,
                const int64_t* table, const Layout& lo, int64_t hk, int64_t c0, int64_t nk,
                float* kb, float* vb) {
  const int64_t d = lo.d;
  for (int64_t j = 0; j < kKC; ++j) {
    float* kr = kb + j * d;
    float* vr = vb + j * d;
    if (j >= nk) {
      std::fill(kr, kr + d, 0.f);
      std::fill(vr, vr + d, 0.f);
      continue;
    }
    const int64_t pos = c0 + j;
    const int64_t at = (table[pos / lo.bs] * lo.bs + pos % lo.bs) * lo.kvh + hk;
    if constexpr (std::is_same_v<T, float>) {
      (void)ks, (void)vs;
      std::memcpy(kr, kc + at * d, d * sizeof(float));
      std::memcpy(vr, vc + at * d, d * sizeof(float));
    } else if constexpr (!kScaled<T>) {  // float16: converted, no scale
      (void)ks, (void)vs;
      Row<T>::load(kc + at * d, kr, d);
      Row<T>::load(vc + at * d, vr, d);
    } else {
      const float k_mul = Row<T>::kMul * half_to_float(ks[at]);
      const float v_mul = Row<T>::kMul * half_to_float(vs[at]);
      Row<T>::load(kc + at * d, kr, d);
      Row<T>::load(vc + at * d, vr, d);
      for (int64_t c = 0; c < d; ++c) {
        kr[c] *= k_mul;
        vr[c] *= v_mul;
      }
    }
  }
}

// One block of kVW rows (rows in lanes) against one chunk of keys; the block's online-softmax
// state is m, l (one lane per row) and ot [d][kVW]. `mask`: the chunk crosses some row's first
// or last visible key (or holds fewer than kKC keys), so lanes are masked by position.
struct BlockState {
  const float* qt;   // [d][kVW] queries x scale
  V qpos, qlo;       // each row's position, and its first visible key (window; else 0)
  float* m;          // [kVW]
  float* l;          // [kVW]
  float* ot;         // [d][kVW]
};

// D: the head size as a compile-time constant (64, 128, 256), so K[j][c] and V[j][c] are one
// base register plus constant offsets (with a run-time d, GCC juggled kKC row pointers through
// vector registers: half the loop's instructions); 0 for any other size.
template <int64_t D>
__attribute__((noinline)) void attend_block(const BlockState& b, const float* kb,
                                            const float* vb, int64_t c0, int64_t nk,
                                            bool mask, const Layout& lo) {
  const int64_t d = D > 0 ? D : lo.d;
  V s[kKC];
#pragma GCC unroll 16
  for (int64_t j = 0; j < kKC; ++j) s[j] = vzero();
  for (int64_t c = 0; c < d; ++c) {
    const V q = vload(b.qt + c * kVW);
#pragma GCC unroll 16
    for (int64_t j = 0; j < kKC; ++j) s[j] = vfma(q, vset(kb[j * d + c]), s[j]);
  }
  if (lo.softcap > 0.f) {
    float t[kVW];
    for (int64_t j = 0; j < kKC; ++j) {
      vstore(t, s[j]);
      for (int i = 0; i < kVW; ++i) t[i] = std::tanh(t[i] / lo.softcap) * lo.softcap;
      s[j] = vload(t);
    }
  }
  M vis[kKC];
  const V m_old = vload(b.m);
  V mx = m_old;
  if (mask) {
#pragma GCC unroll 16
    for (int64_t j = 0; j < kKC; ++j) {
      const V key = vset(static_cast<float>(j < nk ? c0 + j : INT32_MAX));
      vis[j] = mand(vle(key, b.qpos), vle(b.qlo, key));
      s[j] = vsel(vis[j], s[j], vset(-1e30f));
    }
  }
#pragma GCC unroll 16
  for (int64_t j = 0; j < kKC; ++j) mx = vmax(mx, s[j]);
  const V alpha = vexp_le0(vsub(m_old, mx));
  V sum = vzero();
#pragma GCC unroll 16
  for (int64_t j = 0; j < kKC; ++j) {
    s[j] = vexp_le0(vsub(s[j], mx));
    if (mask) s[j] = vsel(vis[j], s[j], vzero());  // a row with nothing visible yet: p = 0
    sum = vadd(sum, s[j]);
  }
  vstore(b.m, mx);
  vstore(b.l, vfma(vload(b.l), alpha, sum));
  // Four columns at a time: four independent FMA chains (one would wait on each FMA's latency).
  for (int64_t c = 0; c < d; c += 4) {
    V o[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) o[i] = vmul(vload(b.ot + (c + i) * kVW), alpha);
#pragma GCC unroll 16
    for (int64_t j = 0; j < kKC; ++j) {
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) o[i] = vfma(vset(vb[j * d + c + i]), s[j], o[i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) vstore(b.ot + (c + i) * kVW, o[i]);
  }
}

#include "varlen_tiles_cpu.h"  // the prompt rows on AMX-bf16 tiles

// A tile of up to kQT query positions of one sequence (run once per KV head) and its cost:
// key chunks it visits x blocks of kVW rows. `tiles`: its rows are prompt rows bound for the
// AMX-bf16 tiles (varlen_tiles_cpu.h), else the fp32 kernel.
struct Tile {
  int64_t seq, row0, rows, cost;
  bool tiles;
};

// The tiles of a step, costliest first. Items are handed out dynamically, and in causal
// order the costliest come last (a prompt's final tile sees every key): the thread that takes
// the last one finishes alone. Largest first (LPT) leaves only cheap items for the end; with
// 16-32 threads on a 512-token prompt the causal order idles 15-30% of the thread time.
// The order changes no result: each item computes the same way wherever it runs.
// `prompt` (or null): sequence p's first prompt[p] rows are prompt rows for the tiles; a tile
// never mixes them with other rows.
std::vector<Tile> tiles_by_cost(const int64_t* lens, const int64_t* qstart, int64_t P,
                                int64_t G, int64_t window, const int64_t* prompt) {
  std::vector<Tile> tiles;
  for (int64_t p = 0; p < P; ++p) {
    const int64_t n = qstart[p + 1] - qstart[p];
    const int64_t split = qstart[p] + (prompt ? std::min(prompt[p], n) : 0);
    for (int64_t i = qstart[p]; i < qstart[p + 1];) {
      const int64_t end = i < split ? split : qstart[p + 1];
      const int64_t nq = std::min(i < split ? kQTT : kQT, end - i);
      const int64_t pos0 = lens[p] - n + (i - qstart[p]);
      const int64_t k_first = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) : 0;
      const int64_t chunks = (pos0 + nq - k_first / kKC * kKC + kKC - 1) / kKC;
      tiles.push_back({p, i, nq, chunks * ((nq * G + kVW - 1) / kVW), i < split});
      i += nq;
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const Tile& a, const Tile& b) { return a.cost > b.cost; });
  return tiles;
}

#if PAGEDLLM_VARLEN_TILES
// Every (sequence, KV head) with prompt rows packed for the tiles: keys from the first its
// prompt rows see (a multiple of kTK) to past the last, into `store` (each packing starts on a
// 64-byte line: its row strides are multiples of 64 bytes).
template <typename T>
std::vector<PackedKV> pack_prompt_keys(const T* kc, const T* vc, const uint16_t* ks,
                                       const uint16_t* vs, const int64_t* bt,
                                       const int64_t* lens, const int64_t* qstart,
                                       const int64_t* prompt, int64_t P, const Layout& lo,
                                       Bf16Buffer& store) {
  std::vector<PackedKV> packed(P * lo.kvh);
  std::vector<int64_t> at(P * lo.kvh + 1, 0);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t n = qstart[p + 1] - qstart[p], rows = std::min(prompt[p], n);
    for (int64_t hk = 0; hk < lo.kvh; ++hk) {
      PackedKV& pk = packed[p * lo.kvh + hk];
      if (rows > 0) {
        const int64_t first = lens[p] - n, last = first + rows - 1;
        pk.base = (lo.window > 0 ? std::max<int64_t>(0, first - lo.window + 1) : 0) / kTK * kTK;
        pk.n = (last + 1 - pk.base + kTK - 1) / kTK * kTK;
        pk.ldv = pk.n + kTK;
      }
      at[p * lo.kvh + hk + 1] = at[p * lo.kvh + hk] + (pk.n + pk.ldv) * lo.d;
    }
  }
  uint16_t* base = store.reserve(at.back());  // on a cache line: a tile row is one line
#pragma omp parallel
  {
    std::vector<float> kb(kKC * lo.d), vb(kKC * lo.d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < P * lo.kvh; ++w) {
      PackedKV& pk = packed[w];
      if (pk.n == 0) continue;
      uint16_t* k = base + at[w];
      uint16_t* vt = k + pk.n * lo.d;
      pack_keys<T>(kc, vc, ks, vs, bt + (w / lo.kvh) * lo.max_blocks, lo, w % lo.kvh,
                   lens[w / lo.kvh], pk.base, pk.n, pk.ldv, k, vt, kb.data(), vb.data());
      pk.k = k;
      pk.vt = vt;
    }
  }
  return packed;
}
#endif

// `prompt` (or null): sequence p's first prompt[p] query rows are prompt rows, run on the
// tiles `mode` (varlen_tiles_cpu.h) where this build has them and d is a multiple of 32.
template <typename T>
void varlen(float* out, const float* q, const T* kc, const T* vc, const uint16_t* ks,
            const uint16_t* vs, const int64_t* bt, const int64_t* lens, const int64_t* qstart,
            int64_t P, const Layout& lo, const int64_t* prompt, TileMode mode) {
  const int64_t G = lo.H / lo.kvh, d = lo.d, H = lo.H;
  const bool use_tiles = PAGEDLLM_VARLEN_TILES && prompt != nullptr && mode != TileMode::kOff &&
                         d % 32 == 0 && d <= 256;
  const std::vector<Tile> tiles =
      tiles_by_cost(lens, qstart, P, G, lo.window, use_tiles ? prompt : nullptr);
  const int64_t items = static_cast<int64_t>(tiles.size()) * lo.kvh;
  const int64_t max_blocks = (std::max(kQT, kQTT) * G + kVW - 1) / kVW;
#if PAGEDLLM_VARLEN_TILES
  Bf16Buffer store;
  const std::vector<PackedKV> packed =
      use_tiles ? pack_prompt_keys<T>(kc, vc, ks, vs, bt, lens, qstart, prompt, P, lo, store)
                : std::vector<PackedKV>();
#endif
#pragma omp parallel
  {
    std::vector<float> qt(max_blocks * d * kVW), ot(max_blocks * d * kVW);
    std::vector<float> m(max_blocks * kVW), l(max_blocks * kVW), qpos(max_blocks * kVW);
    std::vector<float> kb(kKC * d), vb(kKC * d);
#if PAGEDLLM_VARLEN_TILES
    const TileScope scope(use_tiles ? mode : TileMode::kOff, kAttentionTiles);
    std::vector<uint32_t> qb(use_tiles ? max_blocks * d / 2 * 16 : 0), pb(kTK * 16);
    std::vector<float> sbuf(2 * kTK * 16), tmp(4 * 16 * 16);
#endif
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < items; ++w) {
      const int64_t ti = w / lo.kvh, hk = w % lo.kvh;
      const int64_t p = tiles[ti].seq, row0 = tiles[ti].row0, nq = tiles[ti].rows;
      const int64_t R = nq * G, nb = (R + kVW - 1) / kVW;
      const int64_t pos0 = lens[p] - (qstart[p + 1] - qstart[p]) + (row0 - qstart[p]);
      const bool on_tiles = tiles[ti].tiles;
      // Row r = qi * G + g (position pos0 + qi, head hk * G + g) sits in lane r % kVW of block
      // r / kVW; lanes past the last row repeat it (computed, never written out). Tile rows go
      // straight into their blocks' Q^T pairs (write_query_block), the others into qt.
      for (int64_t bi = 0; bi < nb; ++bi) {
        const float* src[kVW];
        for (int64_t i = 0; i < kVW; ++i) {
          const int64_t rr = std::min(bi * kVW + i, R - 1);
          src[i] = q + (row0 + rr / G) * lo.q_stride + (hk * G + rr % G) * d;
          qpos[bi * kVW + i] = static_cast<float>(pos0 + rr / G);
        }
#if PAGEDLLM_VARLEN_TILES
        if (on_tiles) {
          write_query_block(src, d, lo.scale, qb.data() + bi * d / 2 * 16);
          continue;
        }
#endif
        for (int64_t i = 0; i < kVW; ++i) {
          float* dst = qt.data() + bi * d * kVW + i;
          for (int64_t c = 0; c < d; ++c) dst[c * kVW] = src[i][c] * lo.scale;
        }
      }
      std::fill(ot.begin(), ot.begin() + nb * d * kVW, 0.f);
      std::fill(m.begin(), m.begin() + nb * kVW, -1e30f);
      std::fill(l.begin(), l.begin() + nb * kVW, 0.f);
      const int64_t k_end = pos0 + nq;  // one past the last key any row sees
      const int64_t k_first = lo.window > 0 ? std::max<int64_t>(0, pos0 - lo.window + 1) : 0;
      const int64_t* table = bt + p * lo.max_blocks;
#if PAGEDLLM_VARLEN_TILES
      const int64_t chunk = on_tiles ? kTK : kKC;
      auto qb_at = [&](int64_t bi) -> const uint32_t* { return qb.data() + bi * d / 2 * 16; };
      // one or two blocks of the chunk on the tiles (varlen_tiles_cpu.h)
      auto attend_pair = [&](const BlockState* bs, const uint32_t* const* qbs, int64_t c0,
                             int64_t nk, const bool* masks, int n) {
        const PackedKV& kv = packed[p * lo.kvh + hk];
        with_bf16_tiles(mode, [&](auto tiles) {
          using Tl = decltype(tiles);
          if (n == 2)
            attend_tiles<Tl, true>(bs, qbs, kv, c0, nk, masks, lo, sbuf.data(), pb.data(), tmp.data());
          else
            attend_tiles<Tl, false>(bs, qbs, kv, c0, nk, masks, lo, sbuf.data(), pb.data(), tmp.data());
        });
      };
#else
      const int64_t chunk = kKC;
      auto qb_at = [](int64_t) -> const uint32_t* { return nullptr; };
      auto attend_pair = [](const BlockState*, const uint32_t* const*, int64_t, int64_t,
                            const bool*, int) {};
#endif
      for (int64_t c0 = k_first / chunk * chunk; c0 < k_end; c0 += chunk) {
        const int64_t nk = std::min(chunk, k_end - c0);
        if (!on_tiles) load_chunk<T>(kc, vc, ks, vs, table, lo, hk, c0, nk, kb.data(), vb.data());
        int pending = 0;  // blocks of this chunk waiting for a partner on the tiles
        BlockState pair[2];
        bool pair_mask[2];
        const uint32_t* pair_qb[2];
        for (int64_t bi = 0; bi < nb; ++bi) {
          const float* qp = qpos.data() + bi * kVW;
          const int64_t lo_pos = static_cast<int64_t>(qp[0]);
          const int64_t hi_pos = static_cast<int64_t>(qp[kVW - 1]);
          if (c0 > hi_pos) continue;  // every key after every row of the block
          if (lo.window > 0 && c0 + nk - 1 < lo_pos - lo.window + 1) continue;  // before
          const bool mask = nk < chunk || c0 + chunk - 1 > lo_pos ||
                            (lo.window > 0 && c0 < hi_pos - lo.window + 1);
          const V pos = vload(qp);
          const V first = lo.window > 0 ? vsub(pos, vset(static_cast<float>(lo.window - 1)))
                                        : vset(-1.f);
          const BlockState b{qt.data() + bi * d * kVW, pos, first, m.data() + bi * kVW,
                             l.data() + bi * kVW, ot.data() + bi * d * kVW};
          if (on_tiles) {
            pair[pending] = b;
            pair_mask[pending] = mask;
            pair_qb[pending] = qb_at(bi);
            if (++pending == 2) {
              attend_pair(pair, pair_qb, c0, nk, pair_mask, 2);
              pending = 0;
            }
            continue;
          }
          switch (d) {
            case 64: attend_block<64>(b, kb.data(), vb.data(), c0, nk, mask, lo); break;
            case 128: attend_block<128>(b, kb.data(), vb.data(), c0, nk, mask, lo); break;
            case 256: attend_block<256>(b, kb.data(), vb.data(), c0, nk, mask, lo); break;
            default: attend_block<0>(b, kb.data(), vb.data(), c0, nk, mask, lo);
          }
        }
        if (pending) attend_pair(pair, pair_qb, c0, nk, pair_mask, 1);
      }
#if PAGEDLLM_VARLEN_TILES
      if (d % 16 == 0) {  // AVX-512 (kVW 16): a block's rows by 16 x 16 transposes
        for (int64_t bi = 0; bi < nb; ++bi) {
          const int rows = static_cast<int>(std::min<int64_t>(kVW, R - bi * kVW));
          float* dst[kVW];
          float inv[kVW];
          for (int i = 0; i < rows; ++i) {
            const int64_t r = bi * kVW + i;
            dst[i] = out + (row0 + r / G) * H * d + (hk * G + r % G) * d;
            inv[i] = 1.f / l[r];
          }
          write_output_rows(ot.data() + bi * d * kVW, d, inv, rows, dst);
        }
        continue;
      }
#endif
      for (int64_t r = 0; r < R; ++r) {
        float* dst = out + (row0 + r / G) * H * d + (hk * G + r % G) * d;
        const float* src = ot.data() + (r / kVW) * d * kVW + r % kVW;
        const float inv = 1.f / l[r];
        for (int64_t c = 0; c < d; ++c) dst[c] = src[c * kVW] * inv;
      }
    }
  }
}
#endif  // PAGEDLLM_GGUF_SIMD

}  // namespace

// out [T, H, d] (contiguous) = attention of q [T, H, d] (rows may be strided, e.g. a view of
// fused qkv rows) over the paged K/V of its sequences; see the top of this file for the
// layout. k_scale / v_scale: the float16 scale pools of an 8-bit cache (None for fp32).
// prompt_rows [P] int64 (or None): sequence p's first prompt_rows[p] query rows are prompt
// positions, run on the prompt rows' tiles (prompt_tile_mode, varlen_tiles_cpu.h) where the
// build has them and the head size is a multiple of 32.
void paged_varlen_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                            torch::Tensor v_cache, c10::optional<torch::Tensor> k_scale,
                            c10::optional<torch::Tensor> v_scale, torch::Tensor block_tables,
                            torch::Tensor seq_lens, torch::Tensor query_start, double scale,
                            int64_t window, double softcap,
                            c10::optional<torch::Tensor> prompt_rows) {
#if PAGEDLLM_GGUF_SIMD
  TORCH_CHECK(q.dim() == 3 && q.dtype() == torch::kFloat32 && q.stride(2) == 1 &&
              q.stride(1) == q.size(2), "paged_varlen_attention: q must be fp32 [T, H, d] "
              "with contiguous heads");
  TORCH_CHECK(out.dtype() == torch::kFloat32 && out.is_contiguous() && out.sizes() == q.sizes(),
              "paged_varlen_attention: out must be contiguous fp32 shaped like q");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.dtype() == v_cache.dtype() &&
              k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_varlen_attention: caches must be contiguous [blocks, bs, kvh, d]");
  TORCH_CHECK(block_tables.dtype() == torch::kInt64 && seq_lens.dtype() == torch::kInt64 &&
              query_start.dtype() == torch::kInt64 && block_tables.is_contiguous() &&
              seq_lens.is_contiguous() && query_start.is_contiguous(),
              "paged_varlen_attention: int64 contiguous block tables, lengths and offsets");
  const int64_t P = seq_lens.numel();
  TORCH_CHECK(query_start.numel() == P + 1 && block_tables.size(0) == P,
              "paged_varlen_attention: ", P, " sequences need ", P + 1, " offsets and ", P,
              " block table rows");
  const int64_t H = q.size(1), d = q.size(2), kvh = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == d && H % kvh == 0 && d % kVW == 0, "paged_varlen_attention: ",
              H, " query heads of ", d, " over ", kvh, " KV heads of ", k_cache.size(3),
              " (head size a multiple of ", kVW, ")");
  const int64_t* qstart = query_start.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t bs = k_cache.size(1), max_blocks = block_tables.size(1);
  TORCH_CHECK(qstart[0] == 0 && qstart[P] == q.size(0), "paged_varlen_attention: offsets must "
              "run from 0 to the ", q.size(0), " query rows");
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t num_blocks = k_cache.size(0);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t n = qstart[p + 1] - qstart[p];
    TORCH_CHECK(n >= 0 && n <= lens[p] && lens[p] <= max_blocks * bs,
                "paged_varlen_attention: sequence ", p, " has ", n, " queries, length ",
                lens[p], ", room for ", max_blocks * bs);
    for (int64_t b = 0; b < (lens[p] + bs - 1) / bs; ++b) {
      TORCH_CHECK(bt[p * max_blocks + b] >= 0 && bt[p * max_blocks + b] < num_blocks,
                  "paged_varlen_attention: block ", bt[p * max_blocks + b], " out of range");
    }
  }
  const Layout lo{H, kvh, d, bs, max_blocks, q.stride(0), static_cast<float>(scale),
                  static_cast<float>(softcap), window};
  const int64_t* prompt = nullptr;
  const TileMode mode = static_cast<TileMode>(prompt_tile_mode());
  if (prompt_rows.has_value()) {
    TORCH_CHECK(prompt_rows->dtype() == torch::kInt64 && prompt_rows->is_contiguous() &&
                prompt_rows->numel() == P, "paged_varlen_attention: prompt_rows must be ",
                P, " contiguous int64 counts");
    TORCH_CHECK(mode != TileMode::kOff, "paged_varlen_attention: prompt rows given, but no "
                "prompt tiles chosen (set_prompt_tiles: amx or emulated)");
    prompt = prompt_rows->data_ptr<int64_t>();
  }
  if (!k_scale.has_value()) {
    dispatch_16_32(k_cache.scalar_type(), "paged_varlen_attention", [&](auto tag) {
      using C = decltype(tag);
      varlen<C>(out.data_ptr<float>(), q.data_ptr<float>(),
                static_cast<const C*>(k_cache.data_ptr()), static_cast<const C*>(v_cache.data_ptr()),
                nullptr, nullptr, bt, lens, qstart, P, lo, prompt, mode);
    });
    return;
  }
  TORCH_CHECK(v_scale.has_value() && k_scale->dtype() == torch::kFloat16 &&
              v_scale->dtype() == torch::kFloat16 && k_scale->is_contiguous() &&
              v_scale->is_contiguous(), "scales must be contiguous float16");
  dispatch_8bit(k_cache.scalar_type(), "paged_varlen_attention", [&](auto tag) {
    using Q = decltype(tag);
    varlen<Q>(out.data_ptr<float>(), q.data_ptr<float>(),
              static_cast<const Q*>(k_cache.data_ptr()), static_cast<const Q*>(v_cache.data_ptr()),
              static_cast<const uint16_t*>(k_scale->data_ptr()),
              static_cast<const uint16_t*>(v_scale->data_ptr()), bt, lens, qstart, P, lo,
              prompt, mode);
  });
#else
  TORCH_CHECK(false, "paged_varlen_attention: built without AVX2/FMA/F16C");
#endif
}

// Whether this build has the kernel (AVX2 with FMA and F16C, or AVX-512).
bool varlen_attention_available() { return PAGEDLLM_GGUF_SIMD != 0; }
// Head sizes must be a multiple of this (the accumulator is whole vectors).
int64_t varlen_attention_head_multiple() { return kVW; }

void register_varlen_attention(pybind11::module_& m) {
  m.def("paged_varlen_attention", &paged_varlen_attention,
        pybind11::call_guard<pybind11::gil_scoped_release>(),
        "paged attention over packed sequences (prefill chunks): causal, windowed, fp32 "
        "softmax; prompt_rows (or None): each sequence's leading prompt rows, on the prompt "
        "rows' AMX-bf16 tiles");
  m.def("varlen_attention_available", &varlen_attention_available,
        "whether this build has paged_varlen_attention (AVX2 + FMA + F16C or AVX-512)");
  m.def("varlen_attention_head_multiple", &varlen_attention_head_multiple,
        "paged_varlen_attention needs head sizes that are a multiple of this");
}
