// What the sampling kernels share (sampling_cpu.cpp: the draw; top_k_top_p_cpu.cpp: the
// thresholds): a row's scratch, e^(x - max) summed in float64 per chunk of kChunk tokens (the
// same sums for a row's draw and its mass), and a NaN test that -ffast-math cannot fold.
// Included inside each file's anonymous namespace after simd_cpu.h, under its pragma (no
// unsafe math: sums in a fixed order, a true division).
#pragma once

constexpr int64_t kChunk = 64;  // tokens per float64 partial sum

// A row's scratch (slot `S` of this thread, at least n elements), kept between calls: fresh
// vocabulary-sized buffers cost a page fault per 4 KiB at every step.
template <typename E, int S>
E* scratch(int64_t n) {
  thread_local std::vector<E> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}
constexpr float kInf = std::numeric_limits<float>::infinity();

// The data of an optional per-row argument [B] of dtype dt (nullptr when absent); `fn` and
// `name` say which in the error.
template <typename E>
const E* row_arg(const c10::optional<torch::Tensor>& t, int64_t B, at::ScalarType dt,
                 const char* fn, const char* name) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->dim() == 1 && t->size(0) == B && t->dtype() == dt && t->is_contiguous(), fn,
              ": ", name, " must be contiguous [", B, "] of ", dt);
  return static_cast<const E*>(t->data_ptr());
}

// NaN or +inf, by the bits: -ffast-math (the build's) folds std::isnan to false.
inline bool nan_or_inf(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return (b & 0x7fffffffu) >= 0x7f800000u && b != 0xff800000u;
}

#if PAGEDLLM_GGUF_SIMD
#if defined(__AVX512F__)
using VD = __m512d;
inline VD dzero() { return _mm512_setzero_pd(); }
// acc + the kVW floats of v widened to float64 (lower half + upper half, then acc)
inline VD dacc(VD acc, V v) {
  const VD lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  const VD hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  return _mm512_add_pd(acc, _mm512_add_pd(lo, hi));
}
inline double dsum(VD a) {
  alignas(64) double t[8];
  _mm512_store_pd(t, a);
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
#else
using VD = __m256d;
inline VD dzero() { return _mm256_setzero_pd(); }
inline VD dacc(VD acc, V v) {
  const VD lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
  const VD hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
  return _mm256_add_pd(acc, _mm256_add_pd(lo, hi));
}
inline double dsum(VD a) {
  alignas(32) double t[4];
  _mm256_store_pd(t, a);
  return (t[0] + t[1]) + (t[2] + t[3]);
}
#endif
static_assert(kChunk % kVW == 0, "a chunk is whole vectors");

// e^(x - mx) of one chunk's kept x (lo <= x, x not -inf; 0 for the rest) into e (may be x;
// nullptr: not stored); returns their float64 sum. -inf needs its own test: lo = -inf lets
// it through, and vexp_le0 floors at ~1e-38 where e^(-inf) must be 0.
double chunk_exp(const float* x, float* e, float lo, float mx) {
  const V vlo = vset(lo), vm = vset(mx), ninf = vset(-kInf);
  VD acc = dzero();
  for (int64_t i = 0; i < kChunk; i += kVW) {
    const V xi = vload(x + i);
    V ei = vsel(vle(vlo, xi), vexp_le0(vsub(xi, vm)), vzero());
    ei = vsel(vle(xi, ninf), vzero(), ei);
    if (e != nullptr) vstore(e + i, ei);
    acc = dacc(acc, ei);
  }
  return dsum(acc);
}
#else
double chunk_exp(const float* x, float* e, float lo, float mx) {
  double s = 0.0;
  for (int64_t i = 0; i < kChunk; ++i) {
    const float ei = x[i] >= lo && x[i] > -kInf ? std::exp(x[i] - mx) : 0.f;
    if (e != nullptr) e[i] = ei;
    s += ei;
  }
  return s;
}
#endif

#if PAGEDLLM_GGUF_SIMD
// Vector i.. of the row divided by t (values past n read as -inf: never kept, e = 0).
inline V load_x(const float* l, int64_t n, int64_t i, V t) {
  if (i + kVW <= n) return vdiv(vload(l + i), t);
  float tail[kVW];
  for (int k = 0; k < kVW; ++k) tail[k] = i + k < n ? l[i + k] : -kInf;
  return vdiv(vload(tail), t);
}
#endif

// A row's first pass: x = l / t (torch's division) into x, padded with -inf to whole chunks,
// and *mx the largest x >= lo; false if the row holds a NaN or +inf (x is complete either way).
bool scale_row(const float* l, int64_t n, float t, float lo, float* x, float* mx) {
  const int64_t padded = (n + kChunk - 1) / kChunk * kChunk;
#if PAGEDLLM_GGUF_SIMD
  const V vt = vset(t), vlo = vset(lo), big = vset(FLT_MAX);
  V m = vset(-kInf);
  M ok = vle(vset(0.f), vset(0.f));  // all lanes
  for (int64_t i = 0; i < padded; i += kVW) {
    const V xi = load_x(l, n, i, vt);
    ok = mand(ok, vle(xi, big));  // false for NaN and +inf
    m = vmax(m, vsel(vle(vlo, xi), xi, vset(-kInf)));
    vstore(x + i, xi);
  }
  float lanes[kVW];
  vstore(lanes, m);
  float r = -kInf;
  for (int k = 0; k < kVW; ++k) r = lanes[k] > r ? lanes[k] : r;
  *mx = r;
  return mall(ok);
#else
  bool ok = true;
  *mx = -kInf;
  for (int64_t i = 0; i < padded; ++i) {
    x[i] = i < n ? l[i] / t : -kInf;
    ok = ok && !nan_or_inf(x[i]);
    if (x[i] >= lo && x[i] > *mx) *mx = x[i];
  }
  return ok;
#endif
}

// sum_i e^(x_i - m) over one row scale_row wrote (its `chunks` whole chunks, -inf adding 0),
// chunk by chunk as sample_row sums.
double exp_sum_row(const float* x, int64_t chunks, float m) {
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total += chunk_exp(x + c * kChunk, nullptr, -kInf, m);
  return total;
}
