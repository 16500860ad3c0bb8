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
// Work item = (sequence, KV head, tile of kQT query positions). A tile's rows are its
// positions x the G query heads of that KV head (GQA: each K/V chunk is loaded once for all G
// heads). Keys stream in chunks of kKC: the chunk's K is transposed into a [d][kKC] buffer and V
// copied into [kKC][d] (both dequantized for an 8-bit cache, scale folded in), the scores of a
// row are kKC-wide vector FMAs, then the running max m, sum l and accumulator rescale of the
// online softmax, then O += P V. Items are handed out dynamically: causal tiles differ in cost.
#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kv_rows_cpu.h"

namespace {

#include "simd_cpu.h"

#if PAGEDLLM_GGUF_SIMD
constexpr int64_t kKC = kVW;  // keys per chunk: one vector of scores per query row
constexpr int64_t kQT = 16;   // query positions per tile
constexpr int64_t kRB = 4;    // query rows sharing each K vector in the score loop
constexpr int64_t kOB = 4;    // accumulator vectors held in registers across a chunk's keys

// e^x for the x <= 0 the softmax feeds it (a score minus its running max): Cody-Waite
// reduction x = n ln2 + r and Cephes' expf polynomial for e^r (relative error ~1e-7); x below
// -87 gives ~1e-38, so the first chunk's rescale of an empty accumulator is harmless.
inline V vexp_le0(V x) {
  x = vmax(x, vset(-87.f));
  const V n = vfloor(vfma(x, vset(1.44269504088896341f), vset(0.5f)));
  V r = vfma(n, vset(-0.693359375f), x);
  r = vfma(n, vset(2.12194440e-4f), r);
  V p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  p = vfma(vmul(p, r), r, vadd(r, vset(1.f)));
  return vmul(p, vpow2(n));
}

inline float exp_le0(float x) {
  float v[kVW];
  vstore(v, vexp_le0(vset(x)));
  return v[0];
}

struct Layout {
  int64_t H, kvh, d, bs, max_blocks, q_stride;
  float scale, softcap;
  int64_t window;
};

// The K (transposed, [d][kKC]) and V ([kKC][d]) rows of keys c0 .. c0 + nk - 1 of one sequence
// and KV head `hk`, as fp32 with their scales applied; keys nk .. kKC - 1 are zero (the caller
// masks them).
template <typename T>
void load_chunk(const T* kc, const T* vc, const uint16_t* ks, const uint16_t* vs,
                const int64_t* table, const Layout& lo, int64_t hk, int64_t c0, int64_t nk,
                float* kt, float* vb, float* row) {
  const int64_t d = lo.d;
  for (int64_t j = 0; j < kKC; ++j) {
    if (j >= nk) {
      for (int64_t c = 0; c < d; ++c) kt[c * kKC + j] = 0.f;
      std::fill(vb + j * d, vb + (j + 1) * d, 0.f);
      continue;
    }
    const int64_t pos = c0 + j;
    const int64_t at = (table[pos / lo.bs] * lo.bs + pos % lo.bs) * lo.kvh + hk;
    if constexpr (std::is_same_v<T, float>) {
      (void)ks, (void)vs, (void)row;
      const float* k = kc + at * d;
      for (int64_t c = 0; c < d; ++c) kt[c * kKC + j] = k[c];
      std::copy(vc + at * d, vc + (at + 1) * d, vb + j * d);
    } else {
      const float k_mul = Row<T>::kMul * half_to_float(ks[at]);
      Row<T>::load(kc + at * d, row, d);
      for (int64_t c = 0; c < d; ++c) kt[c * kKC + j] = row[c] * k_mul;
      const float v_mul = Row<T>::kMul * half_to_float(vs[at]);
      Row<T>::load(vc + at * d, vb + j * d, d);
      for (int64_t c = 0; c < d; ++c) vb[j * d + c] *= v_mul;
    }
  }
}

// S[r] = q_r . K (a vector over the chunk's keys) for rows r0 .. r0 + RB - 1.
template <int RB>
__attribute__((noinline)) void scores(const float* qs, int64_t d, const float* kt, float* s) {
  V acc[RB];
  for (int i = 0; i < RB; ++i) acc[i] = vzero();
  for (int64_t c = 0; c < d; ++c) {
    const V k = vload(kt + c * kKC);
#pragma GCC unroll 8
    for (int i = 0; i < RB; ++i) acc[i] = vfma(vset(qs[i * d + c]), k, acc[i]);
  }
  for (int i = 0; i < RB; ++i) vstore(s + i * kKC, acc[i]);
}

// o = o * alpha + sum_j p[j] v_j over the chunk's keys, kOB vectors of o held in registers.
__attribute__((noinline)) void accumulate(float* o, float alpha, const float* p,
                                          const float* vb, int64_t d) {
  const V a = vset(alpha);
  for (int64_t c0 = 0; c0 < d; c0 += kOB * kVW) {
    const int nb = static_cast<int>(std::min<int64_t>(kOB, (d - c0) / kVW));
    V acc[kOB];
    for (int b = 0; b < nb; ++b) acc[b] = vmul(vload(o + c0 + b * kVW), a);
    for (int64_t j = 0; j < kKC; ++j) {
      const V pj = vset(p[j]);
      const float* v = vb + j * d + c0;
      for (int b = 0; b < nb; ++b) acc[b] = vfma(pj, vload(v + b * kVW), acc[b]);
    }
    for (int b = 0; b < nb; ++b) vstore(o + c0 + b * kVW, acc[b]);
  }
}

// One tile (rows r = qi * G + g: query position pos0 + qi, head hk * G + g) against one chunk:
// scores, soft-capping, the causal / window mask, the online-softmax update of m and l, and the
// accumulator. qs [R][d] holds the queries times the scale; s is scratch [R][kKC].
struct Tile {
  const float* qs;
  float* acc;
  float* m;
  float* l;
  float* s;
};

void attend_chunk(const Tile& t, int64_t R, int64_t G, int64_t pos0, int64_t c0, int64_t nk,
                  const float* kt, const float* vb, const Layout& lo) {
  const int64_t d = lo.d;
  int64_t r = 0;
  for (; r + kRB <= R; r += kRB) scores<kRB>(t.qs + r * d, d, kt, t.s + r * kKC);
  for (; r < R; ++r) scores<1>(t.qs + r * d, d, kt, t.s + r * kKC);
  for (r = 0; r < R; ++r) {
    float* sr = t.s + r * kKC;
    V s = vload(sr);
    if (lo.softcap > 0.f) {
      for (int64_t j = 0; j < kKC; ++j) sr[j] = std::tanh(sr[j] / lo.softcap) * lo.softcap;
      s = vload(sr);
    }
    // Visible keys of this row: c0 + j <= qpos, inside the window, loaded (j < nk).
    const int64_t qpos = pos0 + r / G;
    const int64_t hi = std::min(nk, qpos - c0 + 1);
    const int64_t first = lo.window > 0 ? std::max<int64_t>(0, qpos - lo.window + 1 - c0) : 0;
    if (hi <= first) continue;
    const bool partial = first > 0 || hi < kKC;
    if (partial) {
      for (int64_t j = 0; j < kKC; ++j) sr[j] = j >= first && j < hi ? sr[j] : -1e30f;
      s = vload(sr);
    }
    const float mx = std::max(t.m[r], hmax(s));
    V p = vexp_le0(vsub(s, vset(mx)));
    if (partial) {  // masked lanes are e^(-1e30 - mx) ~ 1e-38 and must not count at all
      vstore(sr, p);
      for (int64_t j = 0; j < kKC; ++j) sr[j] = j >= first && j < hi ? sr[j] : 0.f;
      p = vload(sr);
    }
    const float alpha = exp_le0(t.m[r] - mx);
    t.m[r] = mx;
    t.l[r] = t.l[r] * alpha + hsum(p);
    vstore(sr, p);
    accumulate(t.acc + r * d, alpha, sr, vb, d);
  }
}

template <typename T>
void varlen(float* out, const float* q, const T* kc, const T* vc, const uint16_t* ks,
            const uint16_t* vs, const int64_t* bt, const int64_t* lens, const int64_t* qstart,
            int64_t P, const Layout& lo) {
  const int64_t G = lo.H / lo.kvh, d = lo.d, H = lo.H;
  // Tiles in order: (sequence, first row); each runs once per KV head.
  std::vector<int64_t> tile_seq, tile_row;
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t i = qstart[p]; i < qstart[p + 1]; i += kQT) {
      tile_seq.push_back(p);
      tile_row.push_back(i);
    }
  }
  const int64_t items = static_cast<int64_t>(tile_seq.size()) * lo.kvh;
#pragma omp parallel
  {
    const int64_t r_max = kQT * G;
    std::vector<float> qs(r_max * d), acc(r_max * d), m(r_max), l(r_max), s(r_max * kKC);
    std::vector<float> kt(d * kKC), vb(kKC * d), row(d);
    const Tile tile{qs.data(), acc.data(), m.data(), l.data(), s.data()};
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < items; ++w) {
      const int64_t ti = w / lo.kvh, hk = w % lo.kvh;
      const int64_t p = tile_seq[ti], row0 = tile_row[ti];
      const int64_t nq = std::min(kQT, qstart[p + 1] - row0);
      const int64_t R = nq * G;
      const int64_t pos0 = lens[p] - (qstart[p + 1] - qstart[p]) + (row0 - qstart[p]);
      for (int64_t r = 0; r < R; ++r) {
        const float* src = q + (row0 + r / G) * lo.q_stride + (hk * G + r % G) * d;
        for (int64_t c = 0; c < d; ++c) qs[r * d + c] = src[c] * lo.scale;
      }
      std::fill(acc.begin(), acc.begin() + R * d, 0.f);
      std::fill(m.begin(), m.begin() + R, -1e30f);
      std::fill(l.begin(), l.begin() + R, 0.f);
      // Chunks start at multiples of kKC whatever the tile, so a row's result does not depend
      // on how its sequence was split into tiles or prefill chunks.
      const int64_t k_end = pos0 + nq;  // one past the last key any row sees
      const int64_t k_first = lo.window > 0 ? std::max<int64_t>(0, pos0 - lo.window + 1) : 0;
      const int64_t* table = bt + p * lo.max_blocks;
      for (int64_t c0 = k_first / kKC * kKC; c0 < k_end; c0 += kKC) {
        const int64_t nk = std::min(kKC, k_end - c0);
        load_chunk<T>(kc, vc, ks, vs, table, lo, hk, c0, nk, kt.data(), vb.data(), row.data());
        attend_chunk(tile, R, G, pos0, c0, nk, kt.data(), vb.data(), lo);
      }
      for (int64_t r = 0; r < R; ++r) {
        float* dst = out + (row0 + r / G) * H * d + (hk * G + r % G) * d;
        const float inv = 1.f / l[r];
        for (int64_t c = 0; c < d; ++c) dst[c] = acc[r * d + c] * inv;
      }
    }
  }
}
#endif  // PAGEDLLM_GGUF_SIMD

}  // namespace

// out [T, H, d] (contiguous) = attention of q [T, H, d] (rows may be strided, e.g. a view of
// fused qkv rows) over the paged K/V of its sequences; see the top of this file for the
// layout. k_scale / v_scale: the float16 scale pools of an 8-bit cache (None for fp32).
void paged_varlen_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                            torch::Tensor v_cache, c10::optional<torch::Tensor> k_scale,
                            c10::optional<torch::Tensor> v_scale, torch::Tensor block_tables,
                            torch::Tensor seq_lens, torch::Tensor query_start, double scale,
                            int64_t window, double softcap) {
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
  if (!k_scale.has_value()) {
    TORCH_CHECK(k_cache.dtype() == torch::kFloat32,
                "paged_varlen_attention: fp32 cache, or an 8-bit cache with scales");
    varlen<float>(out.data_ptr<float>(), q.data_ptr<float>(), k_cache.data_ptr<float>(),
                  v_cache.data_ptr<float>(), nullptr, nullptr, bt, lens, qstart, P, lo);
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
              static_cast<const uint16_t*>(v_scale->data_ptr()), bt, lens, qstart, P, lo);
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
        py::call_guard<py::gil_scoped_release>(),
        "paged attention over packed sequences (prefill chunks): causal, windowed, fp32 softmax");
  m.def("varlen_attention_available", &varlen_attention_available,
        "whether this build has paged_varlen_attention (AVX2 + FMA + F16C or AVX-512)");
  m.def("varlen_attention_head_multiple", &varlen_attention_head_multiple,
        "paged_varlen_attention needs head sizes that are a multiple of this");
}
