// GGUF block-quantized linear layers for CPU: y[M, N] = x[M, K] @ W[N, K]^T with W kept in its
// GGUF form (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), repacked once at load time
// (pagedllm/model/layers/quant/gguf.py) into panels of NB output columns like gemm_cpu.cpp:
//
//   q   uint8 [P, K, RB]   row k of a panel: the NB codes of that k, RB = NB * bits / 8 bytes
//                          4 bits: byte j = code[j] | code[j + VW] << 4   (j < VW, VW = NB / 2)
//                          5/6 bits: the low nibbles as above, then per vector (VW columns) a
//                          little-endian word with the high bit(s) of lane l at bit hb * l
//                          8 bits: the NB int8 codes
//   d   fp16  [P, S, NB]   scale per group (legacy types) or per 256-super-block (K types)
//   sc  uint8 [P, G, NB]   K types: 6-bit (Q4_K) / int8 (Q6_K) sub-block scale per group
//   m   fp16  [P, S, NB]   Q4_1: min per group; Q4_K: -dmin per super-block
//   mi  uint8 [P, G, NB]   Q4_K: 6-bit sub-block min per group
//
// A weight is w = fl(fl(S * (code - zero)) + B) with S = d (x sc) and B = m (x mi), exactly as
// gguf-py dequantizes (the K-type products d * sc and dmin * mi are exact in fp32: 11 + 8 bits).
// The multiply and the add are kept apart (no FMA contraction) so the values equal
// gguf.quants.dequantize's bit for bit. Each output is then the same k-ordered fp32 FMA chain
// as gemm_cpu.cpp's packed_linear: quantized and fp32 paths give identical results.
//
// Small M (decoding): the codes are dequantized inside the micro-kernel, in registers, reading
// the quantized bytes once. Large M: a panel is dequantized once into a thread-local fp32
// scratch of K x NB floats (in L2) and every row block runs the fp32 micro-kernel over it.
#include <torch/csrc/utils/pybind.h>  // register_*(m): pybind11, torch's Tensor casters
#include "torch_lite_cpu.h"
#include <ATen/Parallel.h>
#include "balanced_for_cpu.h"  // balanced_for: threads that finish together
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
// fp-contract=off: a * b + c stays two roundings (gguf-py's dequantization); the FMA chain of
// the dot products is written with explicit fmadd intrinsics, which this does not touch.
#pragma GCC optimize("no-associative-math", "fp-contract=off")

namespace {

#include "gguf_formats_cpu.h"

int bits_of(int64_t fmt) {
  switch (fmt) {
    case kQ4_0: case kQ4_1: case kQ4_K: return 4;
    case kQ5_0: return 5;
    case kQ6_K: return 6;
    case kQ8_0: return 8;
  }
  TORCH_CHECK(false, "unknown GGUF kernel format ", fmt);
}

#include "simd_cpu.h"
#include "grouped_cpu.h"

// rows of one expert per work item of gguf_grouped_linear (a scratch panel is dequantized
// once per item, then stays in L2 across its rows)
constexpr int64_t kGroupRowTile = 256;

struct Packed {
  int64_t N, K, P;
  const uint8_t* q;
  const uint16_t* d;
  const uint8_t* sc;
  const uint16_t* m;
  const uint8_t* mi;
};

#if PAGEDLLM_GGUF_SIMD
// fl(a * b), rounded before the add that follows (no FMA contraction in this file).
inline V mul_rounded(V a, V b) { return vmul(a, b); }

// One panel of one weight: the per-group scale and offset vectors, and rows of weights.
template <int F>
struct PanelDeq {
  using T = Traits<F>;
  static constexpr int RB = kNB * T::bits / 8;
  const Packed& w;
  int64_t p;
  const uint8_t* qp;
  V s[2], b[2];

  PanelDeq(const Packed& w_, int64_t p_) : w(w_), p(p_), qp(w_.q + p_ * w_.K * RB) {}

  __attribute__((always_inline)) inline void group(int64_t g) {  // g: index of the group along K
    const int64_t G = w.K / T::group;
    for (int v = 0; v < 2; ++v) {
      if constexpr (T::kq) {
        const int64_t S = w.K / kSuper, sb = g * T::group / kSuper;
        const V d = f16x(w.d + (p * S + sb) * kNB + v * kVW);
        const uint8_t* scp = w.sc + (p * G + g) * kNB + v * kVW;
        const V sc = vcvt(F == kQ6_K ? i8x(scp) : u8x(scp));
        s[v] = vmul(d, sc);  // exact: 11-bit x 8-bit mantissas
        if constexpr (T::affine) {
          const V dm = f16x(w.m + (p * S + sb) * kNB + v * kVW);
          b[v] = vmul(dm, vcvt(u8x(w.mi + (p * G + g) * kNB + v * kVW)));
        }
      } else {
        s[v] = f16x(w.d + (p * G + g) * kNB + v * kVW);
        if constexpr (T::affine) b[v] = f16x(w.m + (p * G + g) * kNB + v * kVW);
      }
    }
  }

  static inline uint32_t word(const uint8_t* p, int nbytes) {
    uint32_t x = 0;
    std::memcpy(&x, p, nbytes);
    return x;
  }

  // Scale and offset vectors of every group of the panel: gp[4 g + {0, 1}] = S, {2, 3} = B.
  void fill(V* gp) {
    for (int64_t g = 0; g < w.K / T::group; ++g) {
      group(g);
      gp[4 * g] = s[0], gp[4 * g + 1] = s[1];
      if constexpr (T::affine) gp[4 * g + 2] = b[0], gp[4 * g + 3] = b[1];
    }
  }

  // The NB weights of row k of the panel as two vectors, gp: its group's fill() entries.
  __attribute__((always_inline)) inline void row(int64_t k, const V* gp, V& w0, V& w1) const {
    const uint8_t* r = qp + k * RB;
    VI c0, c1;
    if constexpr (T::bits == 8) {
      c0 = i8x(r);
      c1 = i8x(r + kVW);
    } else {
      const VI lo = u8x(r), nib = iset(15);
      c0 = iand(lo, nib);
      c1 = isrl4(lo);
      if constexpr (T::bits > 4) {
        constexpr int hb = T::bits - 4, nbytes = kVW * hb / 8;
        const VI shifts = lanes_times(hb), mask = iset((1 << hb) - 1);
        const VI h0 = iand(isrlv(iset(static_cast<int>(word(r + kVW, nbytes))), shifts), mask);
        const VI h1 = iand(isrlv(iset(static_cast<int>(word(r + kVW + nbytes, nbytes))), shifts), mask);
        c0 = ior(c0, isll4(h0));
        c1 = ior(c1, isll4(h1));
      }
    }
    if constexpr (T::zero != 0) {
      c0 = isub(c0, iset(T::zero));
      c1 = isub(c1, iset(T::zero));
    }
    w0 = mul_rounded(vcvt(c0), gp[0]);
    w1 = mul_rounded(vcvt(c1), gp[1]);
    if constexpr (T::affine) {
      w0 = vadd(w0, gp[2]);
      w1 = vadd(w1, gp[3]);
    }
  }
};


// Dequantize-in-registers micro-kernel: MR rows of x against one panel. The group scales
// come precomputed (gp, from PanelDeq::fill) so the k loop has no branch: with the group
// set-up inside it GCC kept the accumulators in memory and stored them at every k. noinline:
// inlined into linear_impl's parallel lambda, GCC 12 again stored all 2 x MR accumulators to
// the stack at every k (16 stores per k at MR = 8, ~8 cycles per extra row); as a function
// of its own the loop keeps them in registers.
template <int F, int MR>
__attribute__((noinline)) void micro_q(const PanelDeq<F>& pd, const V* gp, const float* x,
                                       int64_t ldx, float* y, int64_t ldy, int64_t ncols) {
  V acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vzero();
  constexpr int G = Traits<F>::group;
  for (int64_t k = 0; k < pd.w.K; ++k) {
    V w0, w1;
    pd.row(k, gp + 4 * (k / G), w0, w1);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V xb = vset(x[i * ldx + k]);
      acc[i][0] = vfma(xb, w0, acc[i][0]);
      acc[i][1] = vfma(xb, w1, acc[i][1]);
    }
  }
  store_tile<MR>(acc, y, ldy, ncols);
}


template <int F>
void deq_panel(const Packed& w, int64_t p, V* gp, float* out) {  // out [K, NB]
  PanelDeq<F> pd(w, p);
  pd.fill(gp);
  constexpr int G = Traits<F>::group;
  for (int64_t k = 0; k < w.K; ++k) {
    V w0, w1;
    pd.row(k, gp + 4 * (k / G), w0, w1);
    vstore(out + k * kNB, w0);
    vstore(out + k * kNB + kVW, w1);
  }
}

template <int F, int MR>
void tail_q(int rows, const PanelDeq<F>& pd, const V* gp, const float* x, int64_t ldx, float* y,
            int64_t ldy, int64_t ncols) {
  if constexpr (MR > 0) {
    if (rows == MR) return micro_q<F, MR>(pd, gp, x, ldx, y, ldy, ncols);
    tail_q<F, MR - 1>(rows, pd, gp, x, ldx, y, ldy, ncols);
  }
}


// Rows [0, M) of x [M, K] against panel p of w: y[:, p * NB ...] (row stride N). In registers
// (small M, `in_registers`) or through a scratch panel of K x NB floats (resized here once).
template <int F>
void panel_impl(const Packed& w, int64_t p, const float* x, int64_t M, float* y, bool in_registers,
                V* gp, std::vector<float>& scratch) {
  const int64_t N = w.N, K = w.K;
  const int64_t n = p * kNB, ncols = std::min<int64_t>(kNB, N - n);
  if (in_registers) {
    PanelDeq<F> pd(w, p);
    pd.fill(gp);
    int64_t m = 0;
    for (; m + kMR <= M; m += kMR) micro_q<F, kMR>(pd, gp, x + m * K, K, y + m * N + n, N, ncols);
    if (m < M) tail_q<F, kMR - 1>(static_cast<int>(M - m), pd, gp, x + m * K, K, y + m * N + n, N, ncols);
  } else {
    if (scratch.size() < static_cast<size_t>(K * kNB)) scratch.resize(K * kNB);
    deq_panel<F>(w, p, gp, scratch.data());
    int64_t m = 0;
    for (; m + kMR <= M; m += kMR) micro_f<kMR>(x + m * K, K, scratch.data(), K, y + m * N + n, N, ncols);
    if (m < M) tail_f<kMR - 1>(static_cast<int>(M - m), x + m * K, K, scratch.data(), K, y + m * N + n, N, ncols);
  }
}

template <int F>
void linear_impl(const Packed& w, const float* x, int64_t M, float* y, int64_t in_register_rows) {
  balanced_for(w.P, [&](BalancedTurn& turn) {
    std::vector<float> scratch;
    std::vector<V> gp(4 * (w.K / Traits<F>::group));
    for (int64_t p; (p = turn.next()) >= 0;)
      panel_impl<F>(w, p, x, M, y, M <= in_register_rows, gp.data(), scratch);
  }, M >= kStealRows);
}

// Every expert's rows in one parallel region (grouped_cpu.h): ws[e] is expert e's weight; an
// expert's path (in registers or scratch) is chosen by all its rows, as its linear would.
template <int F>
void grouped_impl(const std::vector<Packed>& ws, const std::vector<GroupTile>& tiles,
                  const float* x, float* y, int64_t in_register_rows) {
  const int64_t N = ws[0].N, K = ws[0].K;
  run_tiles(tiles, [&](const GroupTile* t, const GroupTile* end) {
    std::vector<float> scratch;
    std::vector<V> gp(4 * (K / Traits<F>::group));
    for (; t < end; ++t)
      panel_impl<F>(ws[t->expert], t->col, x + t->row0 * K, t->rows, y + t->row0 * N,
                    t->group_rows <= in_register_rows, gp.data(), scratch);
  });
}

template <template <int> class Fn, typename... A>
void dispatch(int64_t fmt, A&&... args) {
  switch (fmt) {
    case kQ4_0: return Fn<kQ4_0>::run(std::forward<A>(args)...);
    case kQ4_1: return Fn<kQ4_1>::run(std::forward<A>(args)...);
    case kQ5_0: return Fn<kQ5_0>::run(std::forward<A>(args)...);
    case kQ8_0: return Fn<kQ8_0>::run(std::forward<A>(args)...);
    case kQ4_K: return Fn<kQ4_K>::run(std::forward<A>(args)...);
    case kQ6_K: return Fn<kQ6_K>::run(std::forward<A>(args)...);
  }
  TORCH_CHECK(false, "unknown GGUF kernel format ", fmt);
}

template <int F> struct LinearFn {
  static void run(const Packed& w, const float* x, int64_t M, float* y, int64_t r) { linear_impl<F>(w, x, M, y, r); }
};
template <int F> struct GroupedFn {
  static void run(const std::vector<Packed>& ws, const std::vector<GroupTile>& tiles,
                  const float* x, float* y, int64_t r) { grouped_impl<F>(ws, tiles, x, y, r); }
};
template <int F> struct DeqFn {
  static void run(const Packed& w, float* out) {  // out [N, K]
    at::parallel_for(0, w.P, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> panel(w.K * kNB);
      std::vector<V> gp(4 * (w.K / Traits<F>::group));
      for (int64_t p = begin; p < end; ++p) {
        deq_panel<F>(w, p, gp.data(), panel.data());
        for (int64_t c = 0; c < kNB && p * kNB + c < w.N; ++c)
          for (int64_t k = 0; k < w.K; ++k) out[(p * kNB + c) * w.K + k] = panel[k * kNB + c];
      }
    });
  }
};
#endif  // PAGEDLLM_GGUF_SIMD

// Scalar dequantization of single weights, for embedding lookups (a few rows of a panel).
float deq_one(int64_t fmt, const Packed& w, int64_t n, int64_t k) {
  const int64_t p = n / kNB, c = n % kNB, v = c / kVW, l = c % kVW;
  const int bits = bits_of(fmt), RB = kNB * bits / 8;
  const uint8_t* r = w.q + (p * w.K + k) * RB;
  int code;
  if (bits == 8) {
    code = static_cast<int8_t>(r[c]);
  } else {
    code = v == 0 ? (r[l] & 15) : (r[l] >> 4);
    if (bits > 4) {
      const int hb = bits - 4, nbytes = kVW * hb / 8;
      uint32_t word = 0;
      std::memcpy(&word, r + kVW + v * nbytes, nbytes);
      code |= static_cast<int>((word >> (hb * l)) & ((1u << hb) - 1)) << 4;
    }
  }
  const int zero = fmt == kQ4_0 ? 8 : fmt == kQ5_0 ? 16 : fmt == kQ6_K ? 32 : 0;
  const bool kq = fmt == kQ4_K || fmt == kQ6_K;
  const int64_t group = fmt == kQ6_K ? 16 : 32, G = w.K / group, g = k / group;
  float s, b = 0.f;
  if (kq) {
    const int64_t S = w.K / kSuper, sb = k / kSuper;
    const uint8_t scb = w.sc[(p * G + g) * kNB + c];
    const float sc = fmt == kQ6_K ? static_cast<float>(static_cast<int8_t>(scb)) : static_cast<float>(scb);
    s = static_cast<float>(c10::Half(w.d[(p * S + sb) * kNB + c], c10::Half::from_bits())) * sc;
    if (fmt == kQ4_K)
      b = static_cast<float>(c10::Half(w.m[(p * S + sb) * kNB + c], c10::Half::from_bits())) *
          static_cast<float>(w.mi[(p * G + g) * kNB + c]);
  } else {
    s = static_cast<float>(c10::Half(w.d[(p * G + g) * kNB + c], c10::Half::from_bits()));
    if (fmt == kQ4_1) b = static_cast<float>(c10::Half(w.m[(p * G + g) * kNB + c], c10::Half::from_bits()));
  }
  const float prod = static_cast<float>(code - zero) * s;  // rounded before the add
  return prod + b;
}

template <typename T>
const T* ptr_or_null(const torch::Tensor& t) {
  return t.numel() ? reinterpret_cast<const T*>(t.data_ptr()) : nullptr;
}

Packed view(int64_t fmt, int64_t N, const torch::Tensor& q, const torch::Tensor& d,
            const torch::Tensor& sc, const torch::Tensor& m, const torch::Tensor& mi) {
  const int64_t RB = kNB * bits_of(fmt) / 8;
  TORCH_CHECK(q.dim() == 3 && q.size(2) == RB && q.dtype() == torch::kUInt8 && q.is_contiguous(),
              "gguf kernel: codes not packed for this build (expected [P, K, ", RB, "] uint8)");
  const int64_t P = q.size(0), K = q.size(1);
  TORCH_CHECK(P * kNB >= N && (P - 1) * kNB < N, "gguf kernel: ", P, " panels do not hold N=", N);
  const int64_t group = fmt == kQ6_K ? 16 : 32;
  const bool kq = fmt == kQ4_K || fmt == kQ6_K;
  TORCH_CHECK(K % (kq ? kSuper : group) == 0, "gguf kernel: K=", K, " is not a whole number of blocks");
  const int64_t S = kq ? K / kSuper : K / group, G = K / group;
  for (const auto* t : {&d, &sc, &m, &mi}) TORCH_CHECK(!t->numel() || t->is_contiguous());
  TORCH_CHECK(d.numel() == P * S * kNB && d.element_size() == 2, "gguf kernel: bad scales");
  if (kq) TORCH_CHECK(sc.numel() == P * G * kNB && sc.element_size() == 1, "gguf kernel: bad sub-scales");
  if (fmt == kQ4_1) TORCH_CHECK(m.numel() == P * G * kNB && m.element_size() == 2, "gguf kernel: bad mins");
  if (fmt == kQ4_K) {
    TORCH_CHECK(m.numel() == P * S * kNB && m.element_size() == 2, "gguf kernel: bad mins");
    TORCH_CHECK(mi.numel() == P * G * kNB && mi.element_size() == 1, "gguf kernel: bad sub-mins");
  }
  return Packed{N, K, P, q.data_ptr<uint8_t>(), ptr_or_null<uint16_t>(d), ptr_or_null<uint8_t>(sc),
                ptr_or_null<uint16_t>(m), ptr_or_null<uint8_t>(mi)};
}

}  // namespace

int64_t gguf_panel_width() { return PAGEDLLM_GGUF_SIMD ? kNB : 0; }

torch::Tensor gguf_linear(torch::Tensor x, int64_t fmt, int64_t N, torch::Tensor q, torch::Tensor d,
                          torch::Tensor sc, torch::Tensor m, torch::Tensor mi,
                          int64_t in_register_rows) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "gguf_linear: x must be contiguous fp32 [M, K]");
  const Packed w = view(fmt, N, q, d, sc, m, mi);
  TORCH_CHECK(x.size(1) == w.K, "gguf_linear: x has ", x.size(1), " columns, the weight K=", w.K);
  auto y = torch::empty({x.size(0), N}, x.options());
#if PAGEDLLM_GGUF_SIMD
  dispatch<LinearFn>(fmt, w, x.data_ptr<float>(), x.size(0), y.data_ptr<float>(), in_register_rows);
#else
  TORCH_CHECK(false, "gguf_linear needs AVX2 + FMA + F16C (built without them)");
#endif
  return y;
}

// The experts of a MoE layer in one call: each weight tensor stacked over E experts (q
// [E, P, K, RB], d [E, ...], ...: expert e's is gguf_linear's weight), x's rows sorted by
// expert, offsets [E + 1] (grouped_cpu.h). Equal to gguf_linear once per expert, bit for bit.
torch::Tensor gguf_grouped_linear(torch::Tensor x, int64_t fmt, int64_t N, torch::Tensor q,
                                  torch::Tensor d, torch::Tensor sc, torch::Tensor m,
                                  torch::Tensor mi, torch::Tensor offsets,
                                  int64_t in_register_rows) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "gguf_grouped_linear: x must be contiguous fp32 [R, K]");
  TORCH_CHECK(q.dim() == 4 && q.size(0) > 0, "gguf_grouped_linear: codes must be stacked [E, P, K, RB]");
  const int64_t E = q.size(0), R = x.size(0);
  for (const auto* t : {&d, &sc, &m, &mi})
    TORCH_CHECK(!t->numel() || (t->size(0) == E && t->is_contiguous()),
                "gguf_grouped_linear: every weight tensor must be stacked over the ", E, " experts");
  auto first = [](const torch::Tensor& t) { return t.numel() ? t[0] : t; };
  const Packed w0 = view(fmt, N, q[0], first(d), first(sc), first(m), first(mi));
  TORCH_CHECK(x.size(1) == w0.K, "gguf_grouped_linear: x has ", x.size(1), " columns, the weight K=", w0.K);
  auto stride = [&](const torch::Tensor& t) { return t.numel() / E; };
  std::vector<Packed> ws(E, w0);
  for (int64_t e = 0; e < E; ++e) {
    ws[e].q += e * stride(q);
    if (ws[e].d) ws[e].d += e * stride(d);
    if (ws[e].sc) ws[e].sc += e * stride(sc);
    if (ws[e].m) ws[e].m += e * stride(m);
    if (ws[e].mi) ws[e].mi += e * stride(mi);
  }
  const int64_t* off = checked_offsets(offsets, E, R);
  auto y = torch::empty({R, N}, x.options());
#if PAGEDLLM_GGUF_SIMD
  dispatch<GroupedFn>(fmt, ws, group_tiles(off, E, w0.P, kGroupRowTile), x.data_ptr<float>(),
                      y.data_ptr<float>(), in_register_rows);
#else
  TORCH_CHECK(false, "gguf_grouped_linear needs AVX2 + FMA + F16C (built without them)");
#endif
  return y;
}

torch::Tensor gguf_dequantize(int64_t fmt, int64_t N, torch::Tensor q, torch::Tensor d,
                              torch::Tensor sc, torch::Tensor m, torch::Tensor mi) {
  const Packed w = view(fmt, N, q, d, sc, m, mi);
  auto out = torch::empty({N, w.K}, torch::kFloat32);
#if PAGEDLLM_GGUF_SIMD
  dispatch<DeqFn>(fmt, w, out.data_ptr<float>());
#else
  TORCH_CHECK(false, "gguf_dequantize needs AVX2 + FMA + F16C (built without them)");
#endif
  return out;
}

torch::Tensor gguf_embedding(torch::Tensor ids, int64_t fmt, int64_t N, torch::Tensor q,
                             torch::Tensor d, torch::Tensor sc, torch::Tensor m, torch::Tensor mi) {
  const Packed w = view(fmt, N, q, d, sc, m, mi);
  auto idx = ids.to(torch::kLong).contiguous();
  const int64_t T = idx.numel();
  const int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(ip[t] >= 0 && ip[t] < N, "gguf_embedding: token id ", ip[t], " out of range [0, ", N, ")");
  auto out = torch::empty({T, w.K}, torch::kFloat32);
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t k = 0; k < w.K; ++k) op[t * w.K + k] = deq_one(fmt, w, ip[t], k);
  });
  return out;
}

#pragma GCC pop_options

void register_gguf_kernels(pybind11::module_& m) {
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("gguf_panel_width", &gguf_panel_width, nogil,
        "output columns per GGUF weight panel (0: built without AVX2/FMA/F16C)");
  m.def("gguf_linear", &gguf_linear, nogil,
        "y = x @ W^T over a repacked GGUF weight (in-register dequant up to in_register_rows rows)");
  m.def("gguf_grouped_linear", &gguf_grouped_linear, nogil,
        "MoE experts in one call: rows of x sorted by expert (offsets [E + 1]) times their "
        "expert's GGUF weight (tensors stacked over experts)");
  m.def("gguf_dequantize", &gguf_dequantize, nogil, "the dense fp32 [N, K] of a repacked GGUF weight");
  m.def("gguf_embedding", &gguf_embedding, nogil, "rows W[ids] of a repacked GGUF weight");
}
