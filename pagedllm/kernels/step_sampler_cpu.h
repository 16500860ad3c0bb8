// How the C++ decode steps (decode_layers_cpu.cpp's decode_steps) pick each step's tokens:
// the greedy argmax, or the sampler's C++ draw (sampling_cpu.cpp, top_k_top_p_cpu.cpp) on the
// same logits as model/layers/sampler.py's one step. decode_layers_cpu.cpp includes this
// after its own includes (torch, ATen/Parallel.h, <cstring>, kernels_cpu.h), inside its
// anonymous namespace.
#pragma once

// By the bits: these kernels build with -ffast-math, under which std::isnan, std::isfinite
// and comparisons with infinities may fold to constants.
inline uint32_t bits_of(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return bits;
}
inline bool not_finite(float x) { return (bits_of(x) & 0x7f800000u) == 0x7f800000u; }
inline bool nan_or_plus_inf(float x) { return not_finite(x) && bits_of(x) != 0xff800000u; }

// Row's first maximum over [0, n), or -1 (greedy_rows). Two passes the compiler vectorizes: the
// maximum and the not-finite flag, then the first 64-value block holding the maximum, searched
// value by value. The scalar loop it replaces compared each value with row[best] in turn:
// ~48 us for SmolLM2's 49,152 logits, ~1% of a one-stream token.
int64_t greedy_row(const float* row, int64_t n) {
  float m = row[0];
  uint32_t bad = 0;
  for (int64_t v = 0; v < n; ++v) {
    m = row[v] > m ? row[v] : m;
    bad |= nan_or_plus_inf(row[v]);
  }
  if (bad || not_finite(m)) return -1;
  constexpr int64_t kBlock = 64;
  for (int64_t v0 = 0; v0 < n; v0 += kBlock) {
    const int64_t v1 = std::min(n, v0 + kBlock);
    bool here = false;
    for (int64_t v = v0; v < v1; ++v) here |= row[v] == m;
    if (!here) continue;
    for (int64_t v = v0; v < v1; ++v)
      if (row[v] == m) return v;
  }
  return -1;  // (not reached: m is one of the values)
}

// Row b's greedy token over logits [B, N] restricted to [0, vocab): the first maximum (numpy's
// and torch's argmax), or -1 when the row is not finite there (a NaN anywhere, or an infinite
// maximum): the sampler's host path reports such a row as an error.
void greedy_rows(const torch::Tensor& logits, int64_t vocab, int64_t* out) {
  const int64_t B = logits.size(0), N = logits.size(1);
  const float* lp = logits.data_ptr<float>();
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) out[b] = greedy_row(lp + b * N, vocab);
  });
}

// How decode_steps picks a step's tokens [B] (`next`): each row's greedy token, or with
// `temperature` [B] the draw of the rows whose temperature is not 0, by the kernels
// model/layers/sampler.py calls for one step on the same logits (top_k_top_p_thresholds from
// the rows' `candidates` largest values on, rounded to float; sample_rows at the step's row of
// `u` [steps, B]): the same tokens as one step at a time. false, and the run stops before this
// step (the caller then runs it the ordinary way, which reports the row), when a row's logits
// are not finite.
struct StepSampler {
  c10::optional<torch::Tensor> temperature, top_k, top_p, u;
  int64_t candidates;

  bool operator()(const torch::Tensor& logits, int64_t vocab, int64_t step, int64_t* next) const {
    const int64_t B = logits.size(0);
    greedy_rows(logits, vocab, next);
    if (std::any_of(next, next + B, [](int64_t t) { return t < 0; })) return false;
    if (!temperature.has_value()) return true;
    const torch::Tensor l =
        logits.size(1) == vocab ? logits : logits.narrow(1, 0, vocab).contiguous();
    const float* t = temperature->data_ptr<float>();
    c10::optional<torch::Tensor> lo;
    if (top_k.has_value() || top_p.has_value())
      lo = top_k_top_p_thresholds(l, temperature, top_k, top_p, candidates).to(torch::kFloat);
    const torch::Tensor ids = sample_rows(l, temperature, lo, (*u)[step], c10::nullopt);
    const int64_t* ip = ids.data_ptr<int64_t>();
    const float* lp = l.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) {
      if (t[b] == 0.f) continue;
      if (not_finite(lp[b * vocab + ip[b]])) return false;  // the sampler's finiteness test
      next[b] = ip[b];
    }
    return true;
  }
};
