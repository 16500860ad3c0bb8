// Integer-quantized linear layers for CPU (AWQ / GPTQ int4 with group scales and zeros, int8
// per output channel; W8A8 is quant_w8a8_cpu.cpp, registered here): y[M, N] = x[M, K] @ W[N, K]^T (+ bias), W held quantized in
// panels of NB output columns, packed once at load time (pagedllm/model/layers/quant/*.py):
//
//   int4   qp uint8 [P, K, NB/2]  byte j of row k = col j (low nibble) | col j + NB/2 (high)
//          zp uint8 [P, G, NB], sp fp16 [P, G, NB]  w = (q - z) * s  for the group g = k / gs
//   int8   qp int8  [P, K, NB], scale fp32 [P * NB]  w = q * scale[n]
//
// Weight-only formats (int4, int8) run one of two paths, chosen by M, with the same arithmetic:
//   * small M (decode): the micro-kernel dequantizes each k row of the panel in registers and
//     feeds it to MR rows of x; the quantized bytes are read once, straight from memory;
//   * large M (prefill, big batches): a chunk of the panel is dequantized into a per-thread
//     scratch (about 256 KiB, stays in L2) and the fp32 micro-kernel runs all M rows over it.
// Both compute the dequantized weight the same way ((q - z) * s, one rounding, equal to the
// Python `dequantize()`) and the same k-ordered FMA chain per output (as gemm_cpu.cpp), so a
// row's result does not depend on M or on its batch (batch-invariant).
//
#include <torch/csrc/utils/pybind.h>  // PYBIND11_MODULE, torch's Tensor casters
#include "torch_lite_cpu.h"
#include <ATen/Parallel.h>
#include "balanced_for_cpu.h"  // balanced_for: threads that finish together
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "extern_linear_cpu.h"
#include "grouped_cpu.h"

#pragma GCC push_options
#pragma GCC optimize("no-associative-math")

namespace {

#if defined(__AVX512F__)
constexpr int kVW = 16, kMR = 8;
#elif defined(__AVX__)
constexpr int kVW = 8, kMR = 6;
#else
constexpr int kVW = 4, kMR = 4;
#endif
constexpr int kNB = 2 * kVW;
constexpr int64_t kScratchBytes = 256 * 1024;
constexpr int64_t kKC = kScratchBytes / (kNB * 4);  // k rows of a panel per scratch chunk
constexpr int64_t kScratchMinM = 16;                // M from which the scratch path runs

typedef float vec __attribute__((vector_size(kVW * 4)));
typedef int32_t ivec __attribute__((vector_size(kVW * 4)));

template <typename T>
inline T load(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Widening loads of kVW bytes / halves. GCC 12 lowers __builtin_convertvector from byte and
// _Float16 vectors to scalar code, so these use the vpmovsx/zx and vcvtph2ps intrinsics.
inline ivec load_i8(const int8_t* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<ivec>(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return reinterpret_cast<ivec>(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  ivec v;
  for (int j = 0; j < kVW; ++j) v[j] = p[j];
  return v;
#endif
}

inline ivec load_u8(const uint8_t* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<ivec>(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return reinterpret_cast<ivec>(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  ivec v;
  for (int j = 0; j < kVW; ++j) v[j] = p[j];
  return v;
#endif
}

inline vec load_f16(const _Float16* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<vec>(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(__F16C__)
  return reinterpret_cast<vec>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  vec v;
  for (int j = 0; j < kVW; ++j) v[j] = static_cast<float>(p[j]);
  return v;
#endif
}

// Epilogue shared by the weight-only kernels: y = acc (* colscale) (+ bias) for the panel's real
// columns; `cscale` is padded to whole panels, `bias` is not (vector path for full panels only).
inline void store_row(vec a0, vec a1, float* yr, int64_t ncols, const float* cscale,
                      const float* bias) {
  if (cscale) {
    a0 *= load<vec>(cscale);
    a1 *= load<vec>(cscale + kVW);
  }
  if (ncols == kNB) {
    if (bias) {
      a0 += load<vec>(bias);
      a1 += load<vec>(bias + kVW);
    }
    std::memcpy(yr, &a0, sizeof(vec));
    std::memcpy(yr + kVW, &a1, sizeof(vec));
    return;
  }
  float out[kNB];
  std::memcpy(out, &a0, sizeof(vec));
  std::memcpy(out + kVW, &a1, sizeof(vec));
  for (int64_t j = 0; j < ncols; ++j) yr[j] = bias ? out[j] + bias[j] : out[j];
}

// fp32 micro-kernel over a dequantized scratch chunk [kc, NB]; accumulates onto `y` when
// `first` is false (the chunk continues the same k-ordered chain), epilogue on the last chunk.
template <int MR>
inline void micro_f32(const float* x, int64_t ldx, const float* wp, int64_t kc, float* y,
                      int64_t ldy, int64_t ncols, bool first, bool last, const float* cscale,
                      const float* bias) {
  vec acc[MR][2];
  for (int i = 0; i < MR; ++i) {
    if (first) {
      acc[i][0] = acc[i][1] = vec{};
    } else {
      float in[kNB] = {};
      std::memcpy(in, y + i * ldy, ncols * 4);
      acc[i][0] = load<vec>(in);
      acc[i][1] = load<vec>(in + kVW);
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    const vec w0 = load<vec>(wp + k * kNB), w1 = load<vec>(wp + k * kNB + kVW);
    for (int i = 0; i < MR; ++i) {
      const vec xb = vec{} + x[i * ldx + k];
      acc[i][0] += xb * w0;
      acc[i][1] += xb * w1;
    }
  }
  for (int i = 0; i < MR; ++i) {
    if (last) {
      store_row(acc[i][0], acc[i][1], y + i * ldy, ncols, cscale, bias);
    } else {
      store_row(acc[i][0], acc[i][1], y + i * ldy, ncols, nullptr, nullptr);
    }
  }
}

// ---------------------------------------------------------------- int4, group scales/zeros
struct Int4Panel {
  const uint8_t* q;   // [K, NB/2]
  const uint8_t* z;   // [G, NB]
  const _Float16* s;  // [G, NB]
  int64_t gs;
};

inline void int4_group(const Int4Panel& p, int64_t g, ivec& z0, ivec& z1, vec& s0, vec& s1) {
  z0 = load_u8(p.z + g * kNB);
  z1 = load_u8(p.z + g * kNB + kVW);
  s0 = load_f16(p.s + g * kNB);
  s1 = load_f16(p.s + g * kNB + kVW);
}

inline void int4_row(const Int4Panel& p, int64_t k, const ivec z0, const ivec z1, const vec s0,
                     const vec s1, vec& w0, vec& w1) {
  const ivec b = load_u8(p.q + k * (kNB / 2));
  w0 = __builtin_convertvector((b & 15) - z0, vec) * s0;
  w1 = __builtin_convertvector((b >> 4) - z1, vec) * s1;
}

template <int MR>
inline void micro_int4(const float* x, int64_t ldx, const Int4Panel& p, int64_t K, float* y,
                       int64_t ldy, int64_t ncols, const float* bias) {
  vec acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vec{};
  for (int64_t k0 = 0; k0 < K; k0 += p.gs) {
    ivec z0, z1;
    vec s0, s1;
    int4_group(p, k0 / p.gs, z0, z1, s0, s1);
    for (int64_t k = k0; k < k0 + p.gs; ++k) {
      vec w0, w1;
      int4_row(p, k, z0, z1, s0, s1, w0, w1);
      for (int i = 0; i < MR; ++i) {
        const vec xb = vec{} + x[i * ldx + k];
        acc[i][0] += xb * w0;
        acc[i][1] += xb * w1;
      }
    }
  }
  for (int i = 0; i < MR; ++i) store_row(acc[i][0], acc[i][1], y + i * ldy, ncols, nullptr, bias);
}

void dequant_int4(const Int4Panel& p, int64_t k0, int64_t kc, float* out) {
  ivec z0, z1;
  vec s0, s1;
  int64_t g = -1;
  for (int64_t k = k0; k < k0 + kc; ++k) {
    if (k / p.gs != g) int4_group(p, g = k / p.gs, z0, z1, s0, s1);
    vec w0, w1;
    int4_row(p, k, z0, z1, s0, s1, w0, w1);
    std::memcpy(out + (k - k0) * kNB, &w0, sizeof(vec));
    std::memcpy(out + (k - k0) * kNB + kVW, &w1, sizeof(vec));
  }
}

// ---------------------------------------------------------------- int8 per output channel
template <int MR>
inline void micro_int8(const float* x, int64_t ldx, const int8_t* q, int64_t K, float* y,
                       int64_t ldy, int64_t ncols, const float* cscale, const float* bias) {
  vec acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vec{};
  for (int64_t k = 0; k < K; ++k) {
    const vec w0 = __builtin_convertvector(load_i8(q + k * kNB), vec);
    const vec w1 = __builtin_convertvector(load_i8(q + k * kNB + kVW), vec);
    for (int i = 0; i < MR; ++i) {
      const vec xb = vec{} + x[i * ldx + k];
      acc[i][0] += xb * w0;
      acc[i][1] += xb * w1;
    }
  }
  for (int i = 0; i < MR; ++i) store_row(acc[i][0], acc[i][1], y + i * ldy, ncols, cscale, bias);
}

void dequant_int8(const int8_t* q, int64_t k0, int64_t kc, float* out) {
  for (int64_t k = k0; k < k0 + kc; ++k) {
    const vec w0 = __builtin_convertvector(load_i8(q + k * kNB), vec);
    const vec w1 = __builtin_convertvector(load_i8(q + k * kNB + kVW), vec);
    std::memcpy(out + (k - k0) * kNB, &w0, sizeof(vec));
    std::memcpy(out + (k - k0) * kNB + kVW, &w1, sizeof(vec));
  }
}

// ---------------------------------------------------------------- drivers
template <template <int> class Op, int MR = kMR>
struct RowTail {
  template <typename... A>
  static void run(int rows, A&&... a) {
    if constexpr (MR > 0) {
      if (rows == MR) return Op<MR>::run(a...);
      RowTail<Op, MR - 1>::run(rows, a...);
    }
  }
};

template <int MR>
struct F32Op {
  static void run(const float* x, int64_t ldx, float* y, int64_t ldy, const float* wp,
                  int64_t kc, int64_t ncols, bool first, bool last, const float* cs,
                  const float* b) {
    micro_f32<MR>(x, ldx, wp, kc, y, ldy, ncols, first, last, cs, b);
  }
};
template <int MR>
struct Int4Op {
  static void run(const float* x, int64_t ldx, float* y, int64_t ldy, const Int4Panel& p,
                  int64_t K, int64_t ncols, const float* b) {
    micro_int4<MR>(x, ldx, p, K, y, ldy, ncols, b);
  }
};
template <int MR>
struct Int8Op {
  static void run(const float* x, int64_t ldx, float* y, int64_t ldy, const int8_t* q,
                  int64_t K, int64_t ncols, const float* cs, const float* b) {
    micro_int8<MR>(x, ldx, q, K, y, ldy, ncols, cs, b);
  }
};

// All M rows over one panel with the in-register kernel `Op`.
template <template <int> class Op, typename... A>
inline void rows_direct(int64_t M, const float* x, int64_t K, float* y, int64_t N, A... a) {
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR) Op<kMR>::run(x + m * K, K, y + m * N, N, a...);
  if (m < M) RowTail<Op, kMR - 1>::run(static_cast<int>(M - m), x + m * K, K, y + m * N, N, a...);
}

// All M rows over one panel through the scratch: `dequant(k0, kc, scratch)` fills a chunk.
template <typename Dequant>
inline void rows_scratch(int64_t M, const float* x, int64_t K, float* y, int64_t N,
                         int64_t ncols, const float* cs, const float* b, Dequant dequant) {
  thread_local std::vector<float> scratch;
  scratch.resize(kKC * kNB);
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t kc = std::min(kKC, K - k0);
    dequant(k0, kc, scratch.data());
    const bool first = k0 == 0, last = k0 + kc == K;
    int64_t m = 0;
    for (; m + kMR <= M; m += kMR) {
      micro_f32<kMR>(x + m * K + k0, K, scratch.data(), kc, y + m * N, N, ncols, first, last,
                     cs, b);
    }
    if (m < M) {
      RowTail<F32Op, kMR - 1>::run(static_cast<int>(M - m), x + m * K + k0, K, y + m * N, N,
                                   scratch.data(), kc, ncols, first, last, cs, b);
    }
  }
}

void check_x(const torch::Tensor& x, const char* who) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(), who,
              ": x must be contiguous fp32 [M, K]");
}

const float* bias_ptr(const c10::optional<torch::Tensor>& bias, int64_t N) {
  if (!bias) return nullptr;
  TORCH_CHECK(bias->is_contiguous() && bias->numel() == N && bias->dtype() == torch::kFloat32,
              "bias must be contiguous fp32 [N]");
  return bias->data_ptr<float>();
}

}  // namespace

int64_t quant_panel_width() { return kNB; }

torch::Tensor int4_linear(torch::Tensor x, torch::Tensor qp, torch::Tensor zp, torch::Tensor sp,
                          int64_t N, int64_t group_size, c10::optional<torch::Tensor> bias,
                          int64_t scratch_min_m) {
  check_x(x, "int4_linear");
  const int64_t M = x.size(0), K = x.size(1), P = (N + kNB - 1) / kNB;
  TORCH_CHECK(group_size > 0 && K % group_size == 0, "int4_linear: K % group_size != 0");
  const int64_t G = K / group_size;
  TORCH_CHECK(qp.dtype() == torch::kUInt8 && qp.is_contiguous() && qp.dim() == 3 &&
                  qp.size(0) == P && qp.size(1) == K && qp.size(2) == kNB / 2,
              "int4_linear: qweight not packed for this input");
  TORCH_CHECK(zp.dtype() == torch::kUInt8 && zp.is_contiguous() && zp.numel() == P * G * kNB,
              "int4_linear: zeros not packed for this input");
  TORCH_CHECK(sp.dtype() == torch::kFloat16 && sp.is_contiguous() && sp.numel() == P * G * kNB,
              "int4_linear: scales not packed for this input");
  const float* bp = bias_ptr(bias, N);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const uint8_t* q = qp.data_ptr<uint8_t>();
  const uint8_t* z = zp.data_ptr<uint8_t>();
  const _Float16* s = reinterpret_cast<const _Float16*>(sp.data_ptr<at::Half>());
  const int64_t min_m = scratch_min_m < 0 ? kScratchMinM : scratch_min_m;
  balanced_for(P, [&](BalancedTurn& turn) {
    for (int64_t p; (p = turn.next()) >= 0;) {
      const int64_t n = p * kNB, ncols = std::min<int64_t>(kNB, N - n);
      const Int4Panel panel{q + p * K * (kNB / 2), z + p * G * kNB, s + p * G * kNB, group_size};
      const float* bn = bp ? bp + n : nullptr;
      if (M >= min_m) {
        rows_scratch(M, xp, K, yp + n, N, ncols, nullptr, bn,
                     [&](int64_t k0, int64_t kc, float* out) { dequant_int4(panel, k0, kc, out); });
      } else {
        rows_direct<Int4Op>(M, xp, K, yp + n, N, panel, K, ncols, bn);
      }
    }
  }, M >= kStealRows);
  return y;
}

torch::Tensor int8_linear(torch::Tensor x, torch::Tensor qp, torch::Tensor scale, int64_t N,
                          c10::optional<torch::Tensor> bias, int64_t scratch_min_m) {
  check_x(x, "int8_linear");
  const int64_t M = x.size(0), K = x.size(1), P = (N + kNB - 1) / kNB;
  TORCH_CHECK(qp.dtype() == torch::kInt8 && qp.is_contiguous() && qp.dim() == 3 &&
                  qp.size(0) == P && qp.size(1) == K && qp.size(2) == kNB,
              "int8_linear: weight not packed for this input");
  TORCH_CHECK(scale.dtype() == torch::kFloat32 && scale.is_contiguous() &&
                  scale.numel() == P * kNB, "int8_linear: scale must be fp32 [P * NB]");
  const float* bp = bias_ptr(bias, N);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int8_t* q = qp.data_ptr<int8_t>();
  const float* sc = scale.data_ptr<float>();
  const int64_t min_m = scratch_min_m < 0 ? kScratchMinM : scratch_min_m;
  balanced_for(P, [&](BalancedTurn& turn) {
    for (int64_t p; (p = turn.next()) >= 0;) {
      const int64_t n = p * kNB, ncols = std::min<int64_t>(kNB, N - n);
      const int8_t* pq = q + p * K * kNB;
      const float* bn = bp ? bp + n : nullptr;
      if (M >= min_m) {
        rows_scratch(M, xp, K, yp + n, N, ncols, sc + n, bn,
                     [&](int64_t k0, int64_t kc, float* out) { dequant_int8(pq, k0, kc, out); });
      } else {
        rows_direct<Int8Op>(M, xp, K, yp + n, N, pq, K, ncols, sc + n, bn);
      }
    }
  }, M >= kStealRows);
  return y;
}

void register_w8a8_kernels(pybind11::module_& m);  // quant_w8a8_cpu.cpp

// rows of one expert per work item of the grouped int8 kernels
constexpr int64_t kGroupRowTile = 256;

// The experts of a MoE layer in one call (grouped_cpu.h): qp [E, P, K, NB] int8 and scale
// [E, P * NB] (expert e's int8_linear weight), x's rows sorted by expert, offsets [E + 1]. An
// expert's path (direct or scratch) is chosen by all its rows, as int8_linear's: bit for bit
// int8_linear once per expert.
torch::Tensor int8_grouped_linear(torch::Tensor x, torch::Tensor qp, torch::Tensor scale,
                                  int64_t N, torch::Tensor offsets, int64_t scratch_min_m) {
  check_x(x, "int8_grouped_linear");
  const int64_t R = x.size(0), K = x.size(1), P = (N + kNB - 1) / kNB;
  TORCH_CHECK(qp.dtype() == torch::kInt8 && qp.is_contiguous() && qp.dim() == 4 &&
                  qp.size(1) == P && qp.size(2) == K && qp.size(3) == kNB,
              "int8_grouped_linear: weights not packed [E, P, K, NB] for this input");
  const int64_t E = qp.size(0);
  TORCH_CHECK(scale.dtype() == torch::kFloat32 && scale.is_contiguous() &&
                  scale.numel() == E * P * kNB, "int8_grouped_linear: scale must be fp32 [E, P * NB]");
  const int64_t* off = checked_offsets(offsets, E, R);
  auto y = torch::empty({R, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int8_t* q = qp.data_ptr<int8_t>();
  const float* sc = scale.data_ptr<float>();
  const int64_t min_m = scratch_min_m < 0 ? kScratchMinM : scratch_min_m;
  run_tiles(group_tiles(off, E, P, kGroupRowTile), [&](const GroupTile* t, const GroupTile* end) {
    for (; t < end; ++t) {
      const int64_t n = t->col * kNB, ncols = std::min<int64_t>(kNB, N - n);
      const int8_t* pq = q + (t->expert * P + t->col) * K * kNB;
      const float* cs = sc + t->expert * P * kNB + n;
      const float* xr = xp + t->row0 * K;
      float* yr = yp + t->row0 * N + n;
      if (t->group_rows >= min_m) {
        rows_scratch(t->rows, xr, K, yr, N, ncols, cs, nullptr,
                     [&](int64_t k0, int64_t kc, float* out) { dequant_int8(pq, k0, kc, out); });
      } else {
        rows_direct<Int8Op>(t->rows, xr, K, yr, N, pq, K, ncols, cs, nullptr);
      }
    }
  });
  return y;
}

torch::Tensor w8a8_linear(torch::Tensor x, torch::Tensor qp, torch::Tensor scale, int64_t N,
                          c10::optional<torch::Tensor> bias);  // quant_w8a8_cpu.cpp

// The kernels above as the core module's decode loop calls them (extern_linear_cpu.h); the
// tensors are the Python weight's (model/layers/quant/int8.py, int4.py), in kernel order.
torch::Tensor int8_extern(const torch::Tensor& x, const std::vector<torch::Tensor>& t, int64_t N,
                          int64_t) {
  return int8_linear(x, t.at(0), t.at(1), N, c10::nullopt, -1);
}
torch::Tensor w8a8_extern(const torch::Tensor& x, const std::vector<torch::Tensor>& t, int64_t N,
                          int64_t) {
  return w8a8_linear(x, t.at(0), t.at(1), N, c10::nullopt);
}
torch::Tensor int4_extern(const torch::Tensor& x, const std::vector<torch::Tensor>& t, int64_t N,
                          int64_t group_size) {
  return int4_linear(x, t.at(0), t.at(1), t.at(2), N, group_size, c10::nullopt, -1);
}

// The address of kernel `name` ("int8", "w8a8", "int4") as an ExternLinearFn.
int64_t extern_linear(const std::string& name) {
  ExternLinearFn fn = name == "int8" ? &int8_extern : name == "w8a8" ? &w8a8_extern
                      : name == "int4" ? &int4_extern : nullptr;
  TORCH_CHECK(fn != nullptr, "extern_linear: no kernel named '", name, "' (int8, w8a8, int4)");
  return reinterpret_cast<int64_t>(fn);
}

// The "int" kernel family's own extension module (kernels/cpu_ops.py FAMILIES): built only
// when an AWQ / GPTQ / int8 model loads. The W8A8 file's panels must be as wide as these
// (it defines kVW the same way; w8a8_linear checks the packed shape).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("quant_panel_width", &quant_panel_width, nogil,
        "output columns per panel of the int4 / int8 / W8A8 packed weights");
  m.def("int4_linear", &int4_linear, nogil,
        "y = x @ W^T (+ bias), W int4 with group scales and zeros (AWQ / GPTQ, repacked)");
  m.def("int8_linear", &int8_linear, nogil,
        "y = x @ W^T (+ bias), W int8 with one scale per output channel (weight-only)");
  m.def("int8_grouped_linear", &int8_grouped_linear, nogil,
        "MoE experts in one call: rows of x sorted by expert (offsets [E + 1]) times their "
        "expert's int8 weight (stacked [E, P, K, NB])");
  m.def("extern_linear", &extern_linear,
        "the address of kernel name (int8, w8a8, int4) for the core module's decode loop "
        "(LinearRef kind 5, kernels/extern_linear_cpu.h)");
  register_w8a8_kernels(m);
}

#pragma GCC pop_options
