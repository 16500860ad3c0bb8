// Top-k / top-p thresholds of a sampling step on the CPU (model/layers/top_k_top_p.py): each
// row's m largest values of logits / temperature, its probability mass over its maximum, and
// the threshold rule in float64, in one call, without writing the scaled [B, V] logits.
//
//   top_values        the m largest, ascending: a cut tau from a sample of every 16th value,
//                     the values >= tau collected in one vector pass, a radix sort of those;
//                     a row with a NaN or +inf (or too few values above the cut) takes the keys path
//                     (order-preserving integer keys: a total order, NaN above +inf, numpy's)
//   top_k_top_p_thresholds   per row: top_values + the mass + `_thresholds`' rule, then 8x
//                     as many values where the m do not decide it (the k-th value or the
//                     nucleus may lie past them), then all of them sorted
//
// numpy's partition copied the [B, V] scaled logits and torch's exp and sum wrote two more,
// with ~15 small torch ops on the candidates after: ~25 ms a step at 64 rows, ~1 ms at one row
// on a Zen 3 core pair; here ~6-7 and ~0.3 ms. The division is torch's bit for bit (no
// reciprocal math), so the thresholds are those of the values torch would compute.
#include <torch/csrc/utils/pybind.h>  // register_top_k_top_p_kernels(m): pybind11, Tensor casters
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
// A true division (see sampling_cpu.cpp), and comparisons with infinity kept: under the build's
// -ffinite-math-only GCC 13 folds `x > -inf` to true (seen on a Sapphire Rapids host, where a
// top-p row's total came from its 1,024 candidates instead of its whole mass); GCC 12 did not.
#pragma GCC optimize("no-unsafe-math-optimizations", "no-finite-math-only")

namespace {

#include "simd_cpu.h"
#include "sampling_rows_cpu.h"

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

// The m largest of the n values x (m < n) into out, ascending, for any row (NaN included: the
// keys order it above +inf, as numpy's sort): a histogram of the keys' top bits finds the
// bucket holding the m-th largest; every key above it is taken, and the rest come from that
// bucket by nth_element; the m keys are then radix-sorted.
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
  radix_sort(keys, side, m);
  for (int64_t i = 0; i < m; ++i) out[i] = from_key(keys[i]);
}

constexpr int64_t kSampleStride = 16;  // every 16th value estimates where the m largest start

// top_values_keys' answer for a row without NaN or +inf, faster: the histogram's increments hit a
// few hot buckets (each waits for the last: ~130 us a 49,152-token row on Zen 3). A sample of
// every 16th value gives a cut tau that ~1.25 m values (at least m, by a 3-sigma margin on the
// sample's count) clear; one vector pass collects the values >= tau, and a radix sort of
// those few gives the m largest (std::sort's branches cost ~35 us for 1,024 values). false
// where the cut leaves fewer than m (a row of mostly -inf, a tiny row): the caller takes the
// keys.
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

// x > -inf (false for NaN), by the bits: a comparison with an infinity may be folded to true
// under -ffinite-math-only (GCC 13 does; see the pragma above).
inline bool above_neg_inf(double x) {
  uint64_t b;
  std::memcpy(&b, &x, 8);
  return b != 0xfff0000000000000ull && (b & 0x7fffffffffffffffull) <= 0x7ff0000000000000ull;
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
    const double total = above_neg_inf(lo) ? sum : mass;
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

// The m largest of a row's n scaled values x (scale_row's output; `finite` its answer) into
// out, ascending; m == n sorts them all.
void select_top(const float* x, int64_t n, int64_t m, bool finite, uint32_t* keys,
                uint32_t* side, float* cand, float* out) {
  if (m >= n) {
    for (int64_t i = 0; i < n; ++i) keys[i] = order_key(x[i]);
    radix_sort(keys, side, n);
    for (int64_t i = 0; i < n; ++i) out[i] = from_key(keys[i]);
  } else if (!(finite && top_values_sampled(x, n, m, cand, side, out))) {
    top_values_keys(x, n, m, keys, side, out);
  }
}

// One thread's buffers for rows of V values (scratch slots 0-3), and a row's first steps:
// x = logits / t into `x` (scale_row), then its n largest into `out` (select_top).
struct RowBuffers {
  int64_t V, padded;
  float* x;
  uint32_t *keys, *side;
  float* cand;

  explicit RowBuffers(int64_t V_)
      : V(V_), padded((V_ + kChunk - 1) / kChunk * kChunk), x(scratch<float, 0>(padded)),
        keys(scratch<uint32_t, 1>(V_)), side(scratch<uint32_t, 2>(V_)),
        cand(scratch<float, 3>(V_)) {}

  bool scale(const float* l, float t) {  // false: the row holds a NaN or +inf
    float mx;
    return scale_row(l, V, t, -kInf, x, &mx);
  }
  void top(int64_t n, bool finite, float* out) { select_top(x, V, n, finite, keys, side, cand, out); }
  double mass(float top_value) const { return exp_sum_row(x, padded / kChunk, top_value); }
};

}  // namespace

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
  const float* tp = row_arg<float>(temperature, B, torch::kFloat32, "top_values", "temperature");
  auto values = torch::empty({B, m}, logits.options());
  auto mass = torch::empty({with_mass ? B : 0}, torch::TensorOptions().dtype(at::kDouble));
  const float* l = logits.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  double* mp = mass.data_ptr<double>();
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    RowBuffers rb(V_);
    for (int64_t r = begin; r < end; ++r) {
      const float t = tp == nullptr || tp[r] == 0.f ? 1.f : tp[r];
      rb.top(m, rb.scale(l + r * V_, t), vp + r * m);
      if (with_mass) mp[r] = rb.mass(vp[r * m + m - 1]);
    }
  });
  return {values, mass};
}

// Each row's top-k / top-p threshold on logits / temperature [B] float64 (top_k_top_p.py's
// rule, `cut_row`): from the row's m largest values (top_values' selection and the row's mass
// over its maximum), then from 8x as many where those do not decide it (its k-th value or its
// nucleus lies past them), then from all its values sorted. k [B] int64 (V: off) and p [B]
// (1: off) optional. One function for a sampling step and the multi-step decode's draws, so
// both cut every row alike.
torch::Tensor top_k_top_p_thresholds(torch::Tensor logits, c10::optional<torch::Tensor> temperature,
                                     c10::optional<torch::Tensor> k,
                                     c10::optional<torch::Tensor> p, int64_t m) {
  TORCH_CHECK(logits.dim() == 2 && logits.dtype() == torch::kFloat32 && logits.is_contiguous(),
              "top_k_top_p_thresholds: logits must be contiguous fp32 [B, V]");
  const int64_t B = logits.size(0), V_ = logits.size(1);
  TORCH_CHECK(m > 0, "top_k_top_p_thresholds: m=", m, " must be positive");
  const char* fn = "top_k_top_p_thresholds";
  const float* tp = row_arg<float>(temperature, B, torch::kFloat32, fn, "temperature");
  const int64_t* kp = row_arg<int64_t>(k, B, torch::kInt64, fn, "k");
  const float* pp = row_arg<float>(p, B, torch::kFloat32, fn, "p");
  auto lo = torch::empty({B}, torch::TensorOptions().dtype(at::kDouble));
  double* lp = lo.data_ptr<double>();
  const float* l = logits.data_ptr<float>();
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    RowBuffers rb(V_);
    float* top = scratch<float, 5>(V_);
    double* e = scratch<double, 4>(V_);
    for (int64_t r = begin; r < end; ++r) {
      const float t = tp == nullptr || tp[r] == 0.f ? 1.f : tp[r];
      const int64_t kr = kp != nullptr ? kp[r] : V_;
      const double pr = pp != nullptr ? pp[r] : 1.0;
      const bool finite = rb.scale(l + r * V_, t);
      double mass = 0.0;
      for (int64_t n = std::min(m, V_);; n = std::min(8 * n, V_)) {
        rb.top(n, finite, top);
        if (pp != nullptr && n == std::min(m, V_))  // the row's mass over its largest value
          mass = rb.mass(top[n - 1]);
        bool decided;
        cut_row(top, n, V_, kr, pr, mass, e, lp + r, &decided);
        if (decided || n == V_) break;
      }
    }
  });
  return lo;
}

#pragma GCC pop_options

void register_top_k_top_p_kernels(pybind11::module_& m) {
  m.def("top_values", &top_values, pybind11::call_guard<pybind11::gil_scoped_release>(),
        "(each row's m largest values of logits / temperature, ascending [B, m]; with "
        "with_mass each row's float64 sum of e^(x - max) [B])");
  m.def("top_k_top_p_thresholds", &top_k_top_p_thresholds,
        pybind11::call_guard<pybind11::gil_scoped_release>(),
        "each row's top-k / top-p threshold on logits / temperature [B] float64, from its m "
        "largest values, 8x as many where those do not decide it, else all of them");
}
