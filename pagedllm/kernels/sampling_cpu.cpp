// Random rows of a sampling step on the CPU: one draw per row by the inverse CDF, straight
// from the logits, with no [B, V] temporaries (model/layers/sampler.py, `_sample_random`).
//
// Per row, with t its temperature (0 counts as 1) and lo its threshold (top-k / top-p / min_p,
// on the scaled logits; -inf without one):
//
//   x_i = l_i / t                   IEEE division, torch's `logits / temperature` bit for bit
//   kept: x_i >= lo and x_i > -inf  (the thresholds' own rule: masked_fill(x < lo))
//   e_i = e^(x_i - max kept x)      0 for the rest
//   the first i whose cumulative sum of e (float64) exceeds u times the row's sum
//
// torch's path (softmax, a float64 cumsum, searchsorted, and a masked_fill per threshold)
// allocated and wrote four [B, V] tensors: for 64 rows of a 49,152-token vocabulary ~13-25 ms
// a step on a Zen 3 core pair, most of it page faults and the cumsum; here two passes over
// each row in L2 (x, then e in place), e summed in float64 per chunk of kChunk tokens, and the
// walk to u's token visits the chunk sums, then one chunk. A row's draw depends on its own
// logits, t, lo and u only (batch-invariant, the same whether or not rows are sampled
// together), which is what lets a seeded request's speculative verifier replay it.
//
// `top_values` gives top_k_top_p.py each row's largest values of logits / temperature and its
// probability mass (the same chunked float64 sums of e^(x - max)), where numpy's partition
// copied the [B, V] scaled logits and torch's exp and sum wrote two more: ~8 ms at 64 rows.
//
// A row holding a NaN or +inf draws its first such token, so that the sampled token's own
// logit reports the row as not finite (model/layers/sampler.py's contract with
// worker/sampling_rows.py).
#include <torch/csrc/utils/pybind.h>  // register_sampling_kernels(m): pybind11, Tensor casters
#include "torch_lite_cpu.h"
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#pragma GCC push_options
// Sums in a fixed order (the same draw every time) and a true division by the temperature
// (torch's `logits / temperature` bit for bit; -ffast-math would multiply by a reciprocal).
#pragma GCC optimize("no-unsafe-math-optimizations")  // (no-reciprocal-math alone: ignored)

namespace {

#include "simd_cpu.h"

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

// NaN or +inf, by the bits: -ffast-math (the build's) folds std::isnan to false.
inline bool nan_or_inf(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return (b & 0x7fffffffu) >= 0x7f800000u && b != 0xff800000u;
}

// The first token of the row that is NaN or +inf (the row has one).
int64_t first_not_finite(const float* l, int64_t V) {
  int64_t i = 0;
  while (i < V - 1 && !nan_or_inf(l[i])) ++i;
  return i;
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

// Vector j of the row (values past V read as -inf: never kept, e = 0).
inline V load_x(const float* l, int64_t V_, int64_t i, V t) {
  if (i + kVW <= V_) return vdiv(vload(l + i), t);
  float tail[kVW];
  for (int k = 0; k < kVW; ++k) tail[k] = i + k < V_ ? l[i + k] : -kInf;
  return vdiv(vload(tail), t);
}

// Pass 1: x into `buf` (padded to whole chunks), the row's largest kept x; false if the row
// holds a NaN or +inf.
bool scale_and_max(const float* l, int64_t V_, float t, float lo, float* buf, float* mx) {
  const V vt = vset(t), vlo = vset(lo), big = vset(FLT_MAX);
  V m = vset(-kInf);
  M ok = vle(vset(0.f), vset(0.f));  // all lanes
  const int64_t padded = (V_ + kChunk - 1) / kChunk * kChunk;
  for (int64_t i = 0; i < padded; i += kVW) {
    const V x = load_x(l, V_, i, vt);
    ok = mand(ok, vle(x, big));  // false for NaN and +inf
    m = vmax(m, vsel(vle(vlo, x), x, vset(-kInf)));
    vstore(buf + i, x);
  }
  float lanes[kVW];
  vstore(lanes, m);
  float r = -kInf;
  for (int k = 0; k < kVW; ++k) r = lanes[k] > r ? lanes[k] : r;
  *mx = r;
  return mall(ok);
}

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

// The token of a row whose e values (`e`, padded) and chunk sums (`part`) are known: the first
// whose running float64 sum exceeds target; rounding that leaves a chunk's walk short of its
// sum picks the chunk's last token with e > 0, and a target past every chunk the row's last.
int64_t locate(const float* e, const double* part, int64_t chunks, int64_t V_, double target) {
  double cum = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    if (!(cum + part[c] > target)) {
      cum += part[c];
      continue;
    }
    int64_t last = -1;
    for (int64_t i = c * kChunk; i < (c + 1) * kChunk && i < V_; ++i) {
      if (e[i] > 0.f) last = i;
      cum += e[i];
      if (cum > target && e[i] > 0.f) return i;
    }
    if (last >= 0) return last;
  }
  for (int64_t i = V_ - 1; i >= 0; --i)
    if (e[i] > 0.f) return i;
  return V_ - 1;  // nothing kept (every token -inf): the caller's finiteness check tells
}

int64_t sample_row(const float* l, int64_t V_, float t, float lo, double u, float* buf,
                   double* part) {
  const int64_t chunks = (V_ + kChunk - 1) / kChunk;
  float mx = -kInf;
#if PAGEDLLM_GGUF_SIMD
  if (!scale_and_max(l, V_, t, lo, buf, &mx)) return first_not_finite(l, V_);
#else
  for (int64_t i = 0; i < chunks * kChunk; ++i) {
    if (i < V_ && nan_or_inf(l[i])) return first_not_finite(l, V_);
    buf[i] = i < V_ ? l[i] / t : -kInf;
    if (buf[i] >= lo && buf[i] > mx) mx = buf[i];
  }
#endif
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    part[c] = chunk_exp(buf + c * kChunk, buf + c * kChunk, lo, mx);
    total += part[c];
  }
  return locate(buf, part, chunks, V_, u * total);
}

// sum_i e^(x_i - m) over one row, chunk by chunk as sample_row sums (-inf adds 0).
double exp_sum_row(const float* x, int64_t V_, float m) {
  double total = 0.0;
  int64_t i = 0;
  for (; i + kChunk <= V_; i += kChunk) total += chunk_exp(x + i, nullptr, -kInf, m);
  if (i < V_) {
    float tail[kChunk];
    for (int64_t k = 0; k < kChunk; ++k) tail[k] = i + k < V_ ? x[i + k] : -kInf;
    total += chunk_exp(tail, nullptr, -kInf, m);
  }
  return total;
}


// Order-preserving uint32 key of a float (NaN above +inf: a total order, so the selection
// below cannot be misled by a NaN the way a float comparison would).
inline uint32_t order_key(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}
inline float from_key(uint32_t k) {
  const uint32_t b = k & 0x80000000u ? k & 0x7fffffffu : ~k;
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

constexpr int kHistShift = 21;  // keys' top 11 bits: 2,048 buckets (8 KiB, in L1)

// The m largest of the n values x (m < n) into out, ascending, for any row (NaN included: the
// keys order it above +inf, as numpy's sort): a histogram of the keys' top bits finds the
// bucket holding the m-th largest; every key above it is taken, and the rest come from that
// bucket by nth_element.
void top_values_keys(const float* x, int64_t n, int64_t m, uint32_t* keys, uint32_t* side,
                     float* out) {
  uint32_t hist[1u << (32 - kHistShift)] = {};
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = order_key(x[i]);
    ++hist[keys[i] >> kHistShift];
  }
  int64_t above = 0;
  uint32_t b = (1u << (32 - kHistShift)) - 1;
  while (above + hist[b] < m) above += hist[b--];
  int64_t na = 0, nb = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t k = keys[i], kb = k >> kHistShift;
    if (kb > b) keys[na++] = k;  // na <= i: writes behind the read
    else if (kb == b) side[nb++] = k;
  }
  const int64_t need = m - above;
  std::nth_element(side, side + (nb - need), side + nb);
  std::memcpy(keys + na, side + (nb - need), need * sizeof(uint32_t));
  std::sort(keys, keys + m);
  for (int64_t i = 0; i < m; ++i) out[i] = from_key(keys[i]);
}

// keys[0, n) sorted ascending, LSD radix, 8 bits a pass (tmp: n more keys).
void radix_sort(uint32_t* keys, uint32_t* tmp, int64_t n) {
  for (int shift = 0; shift < 32; shift += 8) {
    int64_t count[257] = {};
    for (int64_t i = 0; i < n; ++i) ++count[((keys[i] >> shift) & 255) + 1];
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (int64_t i = 0; i < n; ++i) tmp[count[(keys[i] >> shift) & 255]++] = keys[i];
    std::swap(keys, tmp);
  }
  // four passes: the sorted keys are back in the caller's array
}

constexpr int64_t kSampleStride = 16;  // every 16th value estimates where the m largest start

// top_values_keys' answer for a row without NaN, faster: the histogram's increments hit a
// few hot buckets (each waits for the last: ~130 us a 49,152-token row on Zen 3). A sample of
// every 16th value gives a cut tau that ~1.25 m values (at least m, by a 3-sigma margin on the
// sample's count) clear; one vector pass collects the values >= tau, and a radix sort of
// those few gives the m largest (std::sort's branches cost ~35 us for 1,024 values). false where the cut leaves fewer than m (a row of
// mostly -inf, a tiny row): the caller takes the keys.
bool top_values_sampled(const float* x, int64_t n, int64_t m, float* cand, uint32_t* tmp,
                        float* out) {
  const int64_t ns = n / kSampleStride, per = m / kSampleStride;
  const int64_t want = per + per / 4 + 3 * static_cast<int64_t>(std::sqrt(static_cast<double>(per))) + 2;
  if (want >= ns) return false;
  for (int64_t i = 0; i < ns; ++i) cand[i] = x[i * kSampleStride];
  std::nth_element(cand, cand + (ns - want), cand + ns);
  const float tau = cand[ns - want];
  int64_t c = 0, i = 0;
#if PAGEDLLM_GGUF_SIMD
  const V vt = vset(tau);
  for (; i + kVW <= n; i += kVW) {
    uint32_t bits = mbits(vle(vt, vload(x + i)));
    while (bits) {
      cand[c++] = x[i + __builtin_ctz(bits)];
      bits &= bits - 1;
    }
  }
#endif
  for (; i < n; ++i)
    if (x[i] >= tau) cand[c++] = x[i];
  if (c < m) return false;
  uint32_t* keys = reinterpret_cast<uint32_t*>(cand);  // in place: same size
  for (int64_t j = 0; j < c; ++j) keys[j] = order_key(cand[j]);
  radix_sort(keys, tmp, c);
  for (int64_t j = 0; j < m; ++j) out[j] = from_key(keys[c - m + j]);
  return true;
}

// x = l / t for one row; false if the row holds a NaN.
bool scale_row(const float* l, int64_t n, float t, float* x) {
  int64_t i = 0;
  bool ok = true;
#if PAGEDLLM_GGUF_SIMD
  const V vt = vset(t);
  M all = vle(vset(0.f), vset(0.f));
  for (; i + kVW <= n; i += kVW) {
    const V xi = vdiv(vload(l + i), vt);
    all = mand(all, vle(xi, xi));  // false for NaN
    vstore(x + i, xi);
  }
  ok = mall(all);
#endif
  for (; i < n; ++i) {
    x[i] = l[i] / t;
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    ok = ok && (b & 0x7fffffffu) <= 0x7f800000u;  // not NaN
  }
  return ok;
}


// top_k_top_p.py's `_thresholds` for one row from its m largest values s (ascending), in
// float64 as there: the k-th largest (k < V), then the nucleus over what top-k keeps, each
// token kept while the mass ranked strictly above it is < p, the row's total from `mass`
// when top-k cut nothing (the m values hold only part of it). *decided is false when the
// k-th value or the nucleus may lie past the m values.
void cut_row(const float* s, int64_t m, int64_t V_, int64_t k, double p, double mass,
             double* e, double* lo_out, bool* decided) {
  double lo = -std::numeric_limits<double>::infinity();
  bool ok = true;
  if (k < V_) {
    lo = s[m - std::min<int64_t>(std::max<int64_t>(k, 1), m)];
    ok = k <= m;
  }
  if (p < 1.0) {
    const double top = s[m - 1];
    double sum = 0.0;
    for (int64_t i = 0; i < m; ++i) {
      e[i] = static_cast<double>(s[i]) >= lo ? std::exp(static_cast<double>(s[i]) - top) : 0.0;
      sum += e[i];
    }
    const double total = lo > -std::numeric_limits<double>::infinity() ? sum : mass;
    double cum = 0.0;
    int64_t kept = 0;
    for (int64_t i = m - 1; i >= 0; --i) {  // descending
      const double d = e[i] / total;
      cum += d;
      kept += cum - d < p;  // the mass ranked strictly above token i
    }
    lo = std::max(lo, static_cast<double>(s[m - std::max<int64_t>(kept, 1)]));
    ok = ok && cum >= p;
  }
  *lo_out = lo;
  *decided = ok;
}

}  // namespace

torch::Tensor sample_rows(torch::Tensor logits, c10::optional<torch::Tensor> temperature,
                          c10::optional<torch::Tensor> threshold, torch::Tensor u) {
  TORCH_CHECK(logits.dim() == 2 && logits.dtype() == torch::kFloat32 && logits.is_contiguous(),
              "sample_rows: logits must be contiguous fp32 [B, V]");
  const int64_t B = logits.size(0), V_ = logits.size(1);
  TORCH_CHECK(V_ > 0, "sample_rows: empty rows");
  auto vec = [&](const c10::optional<torch::Tensor>& t, const char* name, at::ScalarType dt)
      -> const void* {
    if (!t.has_value()) return nullptr;
    TORCH_CHECK(t->dim() == 1 && t->size(0) == B && t->dtype() == dt && t->is_contiguous(),
                "sample_rows: ", name, " must be contiguous [", B, "] of ", dt);
    return t->data_ptr();
  };
  const float* tp = static_cast<const float*>(vec(temperature, "temperature", torch::kFloat32));
  const float* lp = static_cast<const float*>(vec(threshold, "threshold", torch::kFloat32));
  const double* up = static_cast<const double*>(vec(u, "u", at::kDouble));
  const float* l = logits.data_ptr<float>();
  auto ids = torch::empty({B}, torch::TensorOptions().dtype(torch::kInt64));
  int64_t* out = ids.data_ptr<int64_t>();
  const int64_t chunks = (V_ + kChunk - 1) / kChunk;
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    float* buf = scratch<float, 0>(chunks * kChunk);
    double* part = scratch<double, 1>(chunks);
    for (int64_t r = begin; r < end; ++r) {
      const float t = tp == nullptr || tp[r] == 0.f ? 1.f : tp[r];
      const float lo = lp == nullptr ? -kInf : lp[r];
      out[r] = sample_row(l + r * V_, V_, t, lo, up[r], buf, part);
    }
  });
  return ids;
}

// Each row's m largest values of logits / temperature, ascending [B, m] fp32 (m < V), and with
// `with_mass` each row's sum of e^(x - max) over all of it [B] float64 (sample_row's chunks):
// what top_k_top_p.py's thresholds need, without materializing the scaled logits.
std::tuple<torch::Tensor, torch::Tensor> top_values(torch::Tensor logits,
                                                    c10::optional<torch::Tensor> temperature,
                                                    int64_t m, bool with_mass) {
  TORCH_CHECK(logits.dim() == 2 && logits.dtype() == torch::kFloat32 && logits.is_contiguous(),
              "top_values: logits must be contiguous fp32 [B, V]");
  const int64_t B = logits.size(0), V_ = logits.size(1);
  TORCH_CHECK(m > 0 && m < V_, "top_values: m=", m, " must be in [1, ", V_, ")");
  const float* tp = nullptr;
  if (temperature.has_value()) {
    TORCH_CHECK(temperature->dim() == 1 && temperature->size(0) == B &&
                    temperature->dtype() == torch::kFloat32 && temperature->is_contiguous(),
                "top_values: temperature must be contiguous fp32 [", B, "]");
    tp = temperature->data_ptr<float>();
  }
  auto values = torch::empty({B, m}, logits.options());
  auto mass = torch::empty({with_mass ? B : 0}, torch::TensorOptions().dtype(at::kDouble));
  const float* l = logits.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  double* mp = mass.data_ptr<double>();
  const int64_t padded = (V_ + kChunk - 1) / kChunk * kChunk;
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    float* x = scratch<float, 0>(padded);
    uint32_t* keys = scratch<uint32_t, 1>(V_);
    uint32_t* side = scratch<uint32_t, 2>(V_);
    float* cand = scratch<float, 3>(V_);
    for (int64_t r = begin; r < end; ++r) {
      const float t = tp == nullptr || tp[r] == 0.f ? 1.f : tp[r];
      if (!(scale_row(l + r * V_, V_, t, x) && top_values_sampled(x, V_, m, cand, side, vp + r * m)))
        top_values_keys(x, V_, m, keys, side, vp + r * m);
      if (with_mass) mp[r] = exp_sum_row(x, V_, vp[r * m + m - 1]);
    }
  });
  return {values, mass};
}

// Each row's top-k / top-p threshold on logits / temperature [B] float64 from its m largest
// values (top_values' selection and mass, `cut_row`), and whether those m decided it:
// top_k_top_p.py's first pass in one call. k [B] int64 (V: off) and p [B] (1: off) optional.
std::tuple<torch::Tensor, torch::Tensor> top_k_top_p_cut(
    torch::Tensor logits, c10::optional<torch::Tensor> temperature,
    c10::optional<torch::Tensor> k, c10::optional<torch::Tensor> p, int64_t m) {
  const int64_t B = logits.size(0), V_ = logits.size(1);
  auto vec = [&](const c10::optional<torch::Tensor>& t, const char* name,
                 at::ScalarType dt) -> const void* {
    if (!t.has_value()) return nullptr;
    TORCH_CHECK(t->dim() == 1 && t->size(0) == B && t->dtype() == dt && t->is_contiguous(),
                "top_k_top_p_cut: ", name, " must be contiguous [", B, "] of ", dt);
    return t->data_ptr();
  };
  const int64_t* kp = static_cast<const int64_t*>(vec(k, "k", torch::kInt64));
  const float* pp = static_cast<const float*>(vec(p, "p", torch::kFloat32));
  auto [top, mass] = top_values(logits, temperature, m, pp != nullptr);
  auto lo = torch::empty({B}, torch::TensorOptions().dtype(at::kDouble));
  auto decided = torch::empty({B}, torch::TensorOptions().dtype(at::kBool));
  const float* tp = top.data_ptr<float>();
  const double* mp = pp != nullptr ? mass.data_ptr<double>() : nullptr;
  double* lp = lo.data_ptr<double>();
  bool* dp = decided.data_ptr<bool>();
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    double* e = scratch<double, 4>(m);
    for (int64_t r = begin; r < end; ++r)
      cut_row(tp + r * m, m, V_, kp != nullptr ? kp[r] : V_, pp != nullptr ? pp[r] : 1.0,
              mp != nullptr ? mp[r] : 0.0, e, lp + r, dp + r);
  });
  return {lo, decided};
}

#pragma GCC pop_options

void register_sampling_kernels(pybind11::module_& m) {
  m.def("sample_rows", &sample_rows, pybind11::call_guard<pybind11::gil_scoped_release>(),
        "one draw per row of fp32 logits [B, V] by the inverse CDF at u [B] (float64): "
        "logits / temperature [B] (0 counts as 1; None: 1), tokens below threshold [B] "
        "(None: none) and -inf never drawn; a row with a NaN / +inf draws its first one");
  m.def("top_values", &top_values, pybind11::call_guard<pybind11::gil_scoped_release>(),
        "(each row's m largest values of logits / temperature, ascending [B, m]; with "
        "with_mass each row's float64 sum of e^(x - max) [B])");
  m.def("top_k_top_p_cut", &top_k_top_p_cut, pybind11::call_guard<pybind11::gil_scoped_release>(),
        "(each row's top-k / top-p threshold on logits / temperature [B] float64, whether its "
        "m largest values decided it [B] bool)");
}
