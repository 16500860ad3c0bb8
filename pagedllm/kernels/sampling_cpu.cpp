// Random rows of a sampling step on the CPU: one draw per row by the inverse CDF, straight
// from the logits, with no [B, V] temporaries (model/layers/sampler.py, `_sample_random`).
//
// Per row, with t its temperature (0 counts as 1) and lo its threshold (top-k / top-p, or
// min_p's x_max + log(min_p), on the scaled logits; -inf without one):
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
#include <vector>

#pragma GCC push_options
// Sums in a fixed order (the same draw every time) and a true division by the temperature
// (torch's `logits / temperature` bit for bit; -ffast-math would multiply by a reciprocal).
// Comparisons with infinity kept too (-ffinite-math-only lets GCC 13 fold `x > -inf` to true).
#pragma GCC optimize("no-unsafe-math-optimizations", "no-finite-math-only")  // (no-reciprocal-math alone: ignored)

namespace {

#include "simd_cpu.h"
#include "sampling_rows_cpu.h"

// The first token of the row that is NaN or +inf (the row has one).
int64_t first_not_finite(const float* l, int64_t V) {
  int64_t i = 0;
  while (i < V - 1 && !nan_or_inf(l[i])) ++i;
  return i;
}

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

// log_min_p (-inf: none) raises lo to the row's largest x + log(min_p), torch's
// `amax + log(min_p)` in float32 (p < min_p p_max  <=>  x < x_max + log(min_p)).
int64_t sample_row(const float* l, int64_t V_, float t, float lo, float log_min_p, double u,
                   float* buf, double* part) {
  const int64_t chunks = (V_ + kChunk - 1) / kChunk;
  float mx;
  if (!scale_row(l, V_, t, lo, buf, &mx)) return first_not_finite(l, V_);
  lo = std::max(lo, mx + log_min_p);
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    part[c] = chunk_exp(buf + c * kChunk, buf + c * kChunk, lo, mx);
    total += part[c];
  }
  return locate(buf, part, chunks, V_, u * total);
}

}  // namespace

torch::Tensor sample_rows(torch::Tensor logits, c10::optional<torch::Tensor> temperature,
                          c10::optional<torch::Tensor> threshold, torch::Tensor u,
                          c10::optional<torch::Tensor> log_min_p) {
  TORCH_CHECK(logits.dim() == 2 && logits.dtype() == torch::kFloat32 && logits.is_contiguous(),
              "sample_rows: logits must be contiguous fp32 [B, V]");
  const int64_t B = logits.size(0), V_ = logits.size(1);
  TORCH_CHECK(V_ > 0, "sample_rows: empty rows");
  const char* fn = "sample_rows";
  const float* tp = row_arg<float>(temperature, B, torch::kFloat32, fn, "temperature");
  const float* lp = row_arg<float>(threshold, B, torch::kFloat32, fn, "threshold");
  const double* up = row_arg<double>(u, B, at::kDouble, fn, "u");
  const float* mp = row_arg<float>(log_min_p, B, torch::kFloat32, fn, "log_min_p");
  TORCH_CHECK(lp == nullptr || mp == nullptr, "sample_rows: min_p's cut comes before the "
              "thresholds (on the scaled logits): pass one or the other");
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
      out[r] = sample_row(l + r * V_, V_, t, lo, mp == nullptr ? -kInf : mp[r], up[r], buf, part);
    }
  });
  return ids;
}

#pragma GCC pop_options

void register_sampling_kernels(pybind11::module_& m) {
  m.def("sample_rows", &sample_rows, pybind11::call_guard<pybind11::gil_scoped_release>(),
        "one draw per row of fp32 logits [B, V] by the inverse CDF at u [B] (float64): "
        "logits / temperature [B] (0 counts as 1; None: 1), tokens below threshold [B] "
        "(None: none) and -inf never drawn; a row with a NaN / +inf draws its first one; "
        "log_min_p [B] (None: none) cuts below the row's largest + log(min_p)",
        pybind11::arg("logits"), pybind11::arg("temperature"), pybind11::arg("threshold"),
        pybind11::arg("u"), pybind11::arg("log_min_p") = pybind11::none());
}
