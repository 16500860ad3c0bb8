// W8A8 linear layer for CPU (`--quantization int8 --int8-activations`): int8 weights with one
// fp32 scale per output channel, activations quantized to int8 per 32 values (dynamic,
// symmetric, llama.cpp's q8 scheme, as the GGUF int8-activation kernels do), integer dot
// products. y[M, N] = x[M, K] @ W[N, K]^T (+ bias). Part of the "int" kernel family
// (kernels/cpu_ops.py FAMILIES; quant_int_cpu.cpp registers it).
//
// Why per 32 values: one scale per token let a row's largest value set the step of every
// other one (SmolLM2's activations have outliers): +3.8% perplexity against fp32; a scale per
// 32 values keeps the rounding local: +0.37%, int8 weights alone +0.20% (docs/benchmarks.md).
//
// Layout, packed once at load (pagedllm/model/layers/quant/int8.py), K padded to K32 (whole
// 32-value blocks, zeros):
//
//   qp    uint8 [P, K32 / 4, NB, 4]  4 consecutive k of one output column side by side (a
//                                    32-bit lane for vpdpbusd / maddubs); the int8 code
//                                    + kWeightOffset: 128 (u8) for VNNI's u8 x s8 vpdpbusd,
//                                    0 (s8) for the maddubs paths
//   scale fp32  [P * NB]             w[n, k] = code * scale[n]
//
// Per 32-value block b of row m (x ~ dx[m, b] q, q in [-127, 127]):
//
//   y[m, n] = scale[n] * sum_b dx[m, b] (sum_{k in b} (code + off) q - off sum_{k in b} q)
//
// The inner sums are exact in int32; the block sums run in fp32 in k order (one FMA per
// block), the same instructions for a row whatever M is: a row's result does not depend on
// its batch (batch-invariant); the ISA branches differ only in how they get the same integers.
#include <torch/csrc/utils/pybind.h>  // register_*(m): pybind11, torch's Tensor casters
#include "torch_lite_cpu.h"
#include "balanced_for_cpu.h"  // balanced_for: threads that finish together
#include "grouped_cpu.h"
#include <ATen/Parallel.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC optimize("no-associative-math")  // the same k-ordered sums for every M

namespace {

#if defined(__AVX512F__)
constexpr int kVW = 16;  // as quant_int_cpu.cpp: the panel width the Python side packs for
#elif defined(__AVX__)
constexpr int kVW = 8;
#else
constexpr int kVW = 4;
#endif
constexpr int kNB = 2 * kVW;
constexpr int kBlock = 32;

typedef float vec __attribute__((vector_size(kVW * 4)));
typedef int32_t ivec __attribute__((vector_size(kVW * 4)));

#include "int8_dot_cpu.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr int kWeightOffset = 128;
// acc += (u8 codes, lanes of 4) . (the 4 s8 values of xquad): exact
inline void wdot(acc8& acc, const uint8_t* w, int32_t xquad) {
  acc = _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(w), _mm512_set1_epi32(xquad));
}
#else
constexpr int kWeightOffset = 0;
inline void wdot(acc8& acc, const uint8_t* w, int32_t xquad) {
  dot4(acc, xquad, reinterpret_cast<const int8_t*>(w));
}
#endif
// Rows per micro-kernel call: MR x 2 int32 block sums and MR x 2 fp32 accumulators in registers.
constexpr int kMRW = kVW == 16 ? 6 : 2;

template <typename T>
inline T load(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Round to nearest, ties to even (nearbyint under the default rounding mode), lane-wise.
inline vec round_even(vec v) {
#if defined(__AVX512F__)
  return reinterpret_cast<vec>(_mm512_roundscale_ps(reinterpret_cast<__m512>(v),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__AVX__)
  return reinterpret_cast<vec>(_mm256_round_ps(reinterpret_cast<__m256>(v),
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  for (int j = 0; j < kVW; ++j) v[j] = std::nearbyint(v[j]);
  return v;
#endif
}

// x quantized per 32 values: q int8 [M, K32] (zeros past K), dx [M, K32 / 32] the scales,
// zq [M, K32 / 32] = kWeightOffset * sum(q) of each block (what the offset codes add).
struct BlockQuantizedX {
  std::vector<int8_t> q;
  std::vector<float> dx;
  std::vector<int32_t> zq;
};

// Lane-wise reductions and the byte store of the quantizer (GCC lowers the generic forms of
// these to scalar code, a loop per block that cost more than the integer GEMM at M = 512).
inline float hmax(vec v) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps(reinterpret_cast<__m512>(v));
#elif defined(__AVX__)
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(reinterpret_cast<__m256>(v)),
                        _mm256_extractf128_ps(reinterpret_cast<__m256>(v), 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
#else
  float r = v[0];
  for (int j = 1; j < kVW; ++j) r = std::max(r, v[j]);
  return r;
#endif
}

inline int32_t hsum(ivec v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_epi32(reinterpret_cast<__m512i>(v));
#else
  int32_t r = 0;
  for (int j = 0; j < kVW; ++j) r += v[j];
  return r;
#endif
}

// kVW int32 lanes in [-127, 127] stored as bytes.
inline void store_bytes(int8_t* p, ivec v) {
#if defined(__AVX512F__)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(reinterpret_cast<__m512i>(v)));
#elif defined(__AVX2__)
  const __m256i x = reinterpret_cast<__m256i>(v);
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(w, w));
#else
  for (int j = 0; j < kVW; ++j) p[j] = static_cast<int8_t>(v[j]);
#endif
}

// One block of 32 values: dx = max|x| / 127 (as x * (1/127), which the Python reference
// computes the same), q = round-half-even(x / dx) in [-127, 127].
inline void quantize_block(const float* x, int8_t* q, float& dx, int32_t& zq) {
  vec v[kBlock / kVW];
  vec vmax = vec{};
  for (int i = 0; i < kBlock / kVW; ++i) {
    v[i] = load<vec>(x + i * kVW);
    const vec a = v[i] < 0 ? -v[i] : v[i];
    vmax = a > vmax ? a : vmax;
  }
  const float d = hmax(vmax) * (1.f / 127.f), inv = d > 0.f ? 1.f / d : 0.f;
  const vec lo = vec{} - 127.f, hi = vec{} + 127.f;
  ivec sum = ivec{};
  for (int i = 0; i < kBlock / kVW; ++i) {
    vec r = round_even(v[i] * inv);
    r = r < lo ? lo : r;
    r = r > hi ? hi : r;
    const ivec qi = __builtin_convertvector(r, ivec);
    sum += qi;
    store_bytes(q + i * kVW, qi);
  }
  dx = d;
  zq = kWeightOffset * hsum(sum);
}

BlockQuantizedX quantize_x(const float* x, int64_t M, int64_t K, int64_t nblk) {
  BlockQuantizedX qx{std::vector<int8_t>(M * nblk * kBlock), std::vector<float>(M * nblk),
                     std::vector<int32_t>(M * nblk)};
  // rows in parallel from 16 on (prefill); a decode step's few rows stay on this thread
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m)
      for (int64_t b = 0; b < nblk; ++b) {
        const float* xb = x + m * K + b * kBlock;
        int8_t* qb = qx.q.data() + (m * nblk + b) * kBlock;
        if (K - b * kBlock >= kBlock) {
          quantize_block(xb, qb, qx.dx[m * nblk + b], qx.zq[m * nblk + b]);
        } else {  // the last block of a K that is not whole blocks, 0-padded
          float tail[kBlock] = {};
          std::memcpy(tail, xb, (K - b * kBlock) * sizeof(float));
          quantize_block(tail, qb, qx.dx[m * nblk + b], qx.zq[m * nblk + b]);
        }
      }
  });
  return qx;
}

// y = acc * scale (+ bias) for the panel's real columns (scale is panel-padded, bias is not).
inline void store_row(vec a0, vec a1, float* yr, int64_t ncols, const float* sw,
                      const float* bias) {
  a0 *= load<vec>(sw);
  a1 *= load<vec>(sw + kVW);
  float out[kNB];
  std::memcpy(out, &a0, sizeof(vec));
  std::memcpy(out + kVW, &a1, sizeof(vec));
  for (int64_t j = 0; j < ncols; ++j) yr[j] = bias ? out[j] + bias[j] : out[j];
}

// MR rows of quantized x over one panel: per block, exact int32 sums, then one FMA.
template <int MR>
struct W8A8Op {
  static void run(const BlockQuantizedX& qx, int64_t m0, int64_t nblk, const uint8_t* w,
                  float* y, int64_t ldy, int64_t ncols, const float* sw, const float* bias) {
    vec acc[MR][2];
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vec{};
    const int8_t* xq = qx.q.data() + m0 * nblk * kBlock;
    const float* dx = qx.dx.data() + m0 * nblk;
    const int32_t* zq = qx.zq.data() + m0 * nblk;
    const int64_t ldx = nblk * kBlock;
    for (int64_t b = 0; b < nblk; ++b) {
      acc8 dot[MR][2];
      for (int i = 0; i < MR; ++i) dot[i][0] = dot[i][1] = zero8();
      const uint8_t* wb = w + b * (kBlock / 4) * kNB * 4;
#pragma GCC unroll 8
      for (int g = 0; g < kBlock / 4; ++g) {
        const uint8_t* wg = wb + g * kNB * 4;
        for (int i = 0; i < MR; ++i) {
          const int32_t xquad = load<int32_t>(xq + i * ldx + b * kBlock + 4 * g);
          wdot(dot[i][0], wg, xquad);
          wdot(dot[i][1], wg + kVW * 4, xquad);
        }
      }
      for (int i = 0; i < MR; ++i) {
        ivec a0, a1;
        std::memcpy(&a0, &dot[i][0], sizeof(ivec));
        std::memcpy(&a1, &dot[i][1], sizeof(ivec));
        if constexpr (kWeightOffset != 0) {
          a0 -= zq[i * nblk + b];
          a1 -= zq[i * nblk + b];
        }
        const vec s = vec{} + dx[i * nblk + b];
        acc[i][0] = __builtin_convertvector(a0, vec) * s + acc[i][0];
        acc[i][1] = __builtin_convertvector(a1, vec) * s + acc[i][1];
      }
    }
    for (int i = 0; i < MR; ++i) store_row(acc[i][0], acc[i][1], y + i * ldy, ncols, sw, bias);
  }
};

template <int MR>
struct RowTail {
  template <typename... A>
  static void run(int rows, A&&... a) {
    if constexpr (MR > 0) {
      if (rows == MR) return W8A8Op<MR>::run(a...);
      RowTail<MR - 1>::run(rows, a...);
    }
  }
};

}  // namespace

// What the packed weight adds to each int8 code (128 where vpdpbusd takes them as u8).
int64_t w8a8_code_offset() { return kWeightOffset; }

torch::Tensor w8a8_linear(torch::Tensor x, torch::Tensor qp, torch::Tensor scale, int64_t N,
                          c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "w8a8_linear: x must be contiguous fp32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), P = (N + kNB - 1) / kNB;
  const int64_t nblk = (K + kBlock - 1) / kBlock, K4 = nblk * kBlock / 4;
  TORCH_CHECK(qp.dtype() == torch::kUInt8 && qp.is_contiguous() &&
                  qp.sizes() == torch::IntArrayRef({P, K4, kNB, 4}),
              "w8a8_linear: weight must be uint8 [", P, ", ", K4, ", ", kNB, ", 4] for x [", M,
              ", ", K, "] and N=", N);
  TORCH_CHECK(scale.dtype() == torch::kFloat32 && scale.is_contiguous() &&
                  scale.numel() == P * kNB, "w8a8_linear: scale must be fp32 [", P * kNB, "]");
  const float* bp = nullptr;
  if (bias) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == N && bias->dtype() == torch::kFloat32,
                "w8a8_linear: bias must be contiguous fp32 [", N, "]");
    bp = bias->data_ptr<float>();
  }
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const BlockQuantizedX qx = quantize_x(x.data_ptr<float>(), M, K, nblk);
  float* yp = y.data_ptr<float>();
  const uint8_t* q = qp.data_ptr<uint8_t>();
  const float* sw = scale.data_ptr<float>();
  balanced_for(P, [&](BalancedTurn& turn) {
    for (int64_t p; (p = turn.next()) >= 0;) {
      const int64_t n = p * kNB, ncols = std::min<int64_t>(kNB, N - n);
      const uint8_t* pw = q + p * K4 * kNB * 4;
      const float* bn = bp ? bp + n : nullptr;
      int64_t m = 0;
      for (; m + kMRW <= M; m += kMRW)
        W8A8Op<kMRW>::run(qx, m, nblk, pw, yp + m * N + n, N, ncols, sw + n, bn);
      if (m < M)
        RowTail<kMRW - 1>::run(static_cast<int>(M - m), qx, m, nblk, pw, yp + m * N + n, N,
                               ncols, sw + n, bn);
    }
  }, M >= kStealRows);
  return y;
}

// rows of one expert per work item of the grouped kernel (a multiple of both kMRW)
constexpr int64_t kGroupRowTile = 192;

// The experts of a MoE layer in one call (grouped_cpu.h): qp uint8 [E, P, K32 / 4, NB, 4] and
// scale [E, P * NB] (expert e's w8a8_linear weight), x's rows sorted by expert, offsets
// [E + 1]. Every row is quantized once, per 32 values as w8a8_linear does, and runs the same
// micro-kernel (a row's result does not depend on its batch): bit for bit w8a8_linear once
// per expert.
torch::Tensor w8a8_grouped_linear(torch::Tensor x, torch::Tensor qp, torch::Tensor scale,
                                  int64_t N, torch::Tensor offsets) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "w8a8_grouped_linear: x must be contiguous fp32 [R, K]");
  const int64_t R = x.size(0), K = x.size(1), P = (N + kNB - 1) / kNB;
  const int64_t nblk = (K + kBlock - 1) / kBlock, K4 = nblk * kBlock / 4;
  TORCH_CHECK(qp.dtype() == torch::kUInt8 && qp.is_contiguous() && qp.dim() == 5 &&
                  qp.size(1) == P && qp.size(2) == K4 && qp.size(3) == kNB && qp.size(4) == 4,
              "w8a8_grouped_linear: weights must be uint8 [E, ", P, ", ", K4, ", ", kNB,
              ", 4] for x [", R, ", ", K, "] and N=", N);
  const int64_t E = qp.size(0);
  TORCH_CHECK(scale.dtype() == torch::kFloat32 && scale.is_contiguous() &&
                  scale.numel() == E * P * kNB,
              "w8a8_grouped_linear: scale must be fp32 [", E, ", ", P * kNB, "]");
  const int64_t* off = checked_offsets(offsets, E, R);
  auto y = torch::empty({R, N}, x.options());
  if (R == 0) return y;
  const BlockQuantizedX qx = quantize_x(x.data_ptr<float>(), R, K, nblk);
  float* yp = y.data_ptr<float>();
  const uint8_t* q = qp.data_ptr<uint8_t>();
  const float* sw = scale.data_ptr<float>();
  run_tiles(group_tiles(off, E, P, kGroupRowTile), [&](const GroupTile* t, const GroupTile* end) {
    for (; t < end; ++t) {
      const int64_t n = t->col * kNB, ncols = std::min<int64_t>(kNB, N - n);
      const uint8_t* pw = q + (t->expert * P + t->col) * K4 * kNB * 4;
      const float* sn = sw + t->expert * P * kNB + n;
      int64_t m = t->row0;
      const int64_t last = t->row0 + t->rows;
      for (; m + kMRW <= last; m += kMRW)
        W8A8Op<kMRW>::run(qx, m, nblk, pw, yp + m * N + n, N, ncols, sn, nullptr);
      if (m < last)
        RowTail<kMRW - 1>::run(static_cast<int>(last - m), qx, m, nblk, pw, yp + m * N + n, N,
                               ncols, sn, nullptr);
    }
  });
  return y;
}

#pragma GCC pop_options

void register_w8a8_kernels(pybind11::module_& m) {
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("w8a8_code_offset", &w8a8_code_offset, nogil,
        "what the W8A8 packed weight adds to each int8 code (128 for VNNI's u8 codes, else 0)");
  m.def("w8a8_linear", &w8a8_linear, nogil,
        "y = x @ W^T (+ bias), W int8 per output channel, x quantized per 32 values to int8, "
        "integer dot products (W8A8)");
  m.def("w8a8_grouped_linear", &w8a8_grouped_linear, nogil,
        "MoE experts in one call: rows of x (quantized per 32 values) sorted by expert "
        "(offsets [E + 1]) times their expert's W8A8 weight (stacked [E, P, K32 / 4, NB, 4])");
}
