// Fused element-wise ops for the fp32 CPU forward pass. Each replaces 3-16 small torch ops per
// layer; at decode batch sizes those ops cost more in dispatch and passes over memory than
// they compute (about 5 ms of a 30 ms single-sequence step for SmolLM2's 30 layers).
//   add_rms_norm_   residual += x; x = rmsnorm(residual) * w          (in place, both)
//   rms_norm        rmsnorm(x) * w                                     (new tensor)
//                   (gemma: * (1 + w), Gemma's norms, which HF stores as the offset from 1)
//   head_rms_norms_ rms_norm over each q and each k head of fused qkv rows (in place)
//   rotary_qk_      NeoX-style RoPE on the q and k heads of fused qkv rows (in place)
//   silu_mul        silu(gate) * up over fused [gate | up] rows        (new tensor)
//   gelu_tanh_mul   gelu_tanh(gate) * up, the same way (Gemma's MLP)    (new tensor)
// Arithmetic follows HF Llama's fp32 formulas; each row is processed the same way whatever
// the batch, so results do not depend on batch composition.
#include "torch_lite_cpu.h"
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>

namespace {

int64_t grain_rows(int64_t row_elems) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(row_elems, 1)); }

// out = rmsnorm(x) * w, or * (1 + w) (Gemma: HF's `normed * (1.0 + weight)`, the same order).
template <bool Gemma>
void norm_row(const float* x, const float* w, float* out, int64_t n, float eps) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (Gemma) out[i] = (x[i] * inv) * (1.f + w[i]);
    else out[i] = w[i] * (x[i] * inv);
  }
}

// norm_row of the kind a call asks for (the branch outside the row's loop).
void norm_row(bool gemma, const float* x, const float* w, float* out, int64_t n, double eps) {
  if (gemma) norm_row<true>(x, w, out, n, static_cast<float>(eps));
  else norm_row<false>(x, w, out, n, static_cast<float>(eps));
}

void check_rows(const torch::Tensor& x, const torch::Tensor& w, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(), name,
              ": x must be contiguous fp32 [T, hidden]");
  TORCH_CHECK(w.dtype() == torch::kFloat32 && w.is_contiguous() && w.numel() == x.size(1), name,
              ": weight must be fp32 [hidden]");
}

}  // namespace

void add_rms_norm_(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps,
                   bool gemma) {
  check_rows(x, weight, "add_rms_norm_");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.is_contiguous() &&
              residual.dtype() == torch::kFloat32, "add_rms_norm_: residual must match x");
  const int64_t T = x.size(0), n = x.size(1);
  float* xp = x.data_ptr<float>();
  float* rp = residual.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  at::parallel_for(0, T, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* r = rp + t * n;
      float* xr = xp + t * n;
      for (int64_t i = 0; i < n; ++i) r[i] += xr[i];
      norm_row(gemma, r, wp, xr, n, eps);
    }
  });
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps, bool gemma) {
  check_rows(x, weight, "rms_norm");
  const int64_t T = x.size(0), n = x.size(1);
  auto out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) norm_row(gemma, xp + t * n, wp, op + t * n, n, eps);
  });
  return out;
}

// Each q head (weight q_w) and k head (k_w) of qkv rows [T, (H + 2 KVH) d] RMS-normalized in
// place, a head row as rms_norm does a row (the same bits: Qwen3's and Gemma 3's q / k norms,
// one call where a copy out, the norm and a copy back per q and k took ~12 torch dispatches).
void head_rms_norms_(torch::Tensor qkv, torch::Tensor q_w, torch::Tensor k_w, int64_t H,
                     int64_t KVH, int64_t d, double eps, bool gemma) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.dtype() == torch::kFloat32 && qkv.is_contiguous() &&
              qkv.size(1) == (H + 2 * KVH) * d,
              "head_rms_norms_: qkv must be contiguous fp32 [T, (H + 2 KVH) * d]");
  for (const auto* w : {&q_w, &k_w})
    TORCH_CHECK(w->dtype() == torch::kFloat32 && w->is_contiguous() && w->numel() == d,
                "head_rms_norms_: the q / k norm weights must be fp32 [head_dim]");
  const int64_t T = qkv.size(0), heads = H + KVH, row = (H + 2 * KVH) * d;
  float* p = qkv.data_ptr<float>();
  const float *qw = q_w.data_ptr<float>(), *kw = k_w.data_ptr<float>();
  at::parallel_for(0, T * heads, grain_rows(d), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / heads, h = i % heads;
      float* x = p + t * row + h * d;
      norm_row(gemma, x, h < H ? qw : kw, x, d, eps);
    }
  });
}

// qkv [T, (H + 2 * KVH) * d]; halves [T, rot] = cos | sin of the rot / 2 frequencies.
// Rotates the first `rot` features of each of the H + KVH q and k heads; v is untouched.
void rotary_qk_(torch::Tensor qkv, torch::Tensor halves, int64_t num_heads,
                int64_t num_kv_heads, int64_t head_dim) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.dtype() == torch::kFloat32 && qkv.is_contiguous() &&
              qkv.size(1) == (num_heads + 2 * num_kv_heads) * head_dim,
              "rotary_qk_: qkv must be contiguous fp32 [T, (H + 2 KVH) * d]");
  TORCH_CHECK(halves.dim() == 2 && halves.dtype() == torch::kFloat32 && halves.is_contiguous() &&
              halves.size(0) == qkv.size(0) && halves.size(1) % 2 == 0 &&
              halves.size(1) <= head_dim, "rotary_qk_: halves must be contiguous fp32 [T, rot]");
  const int64_t T = qkv.size(0), row = qkv.size(1), rot = halves.size(1), half = rot / 2;
  const int64_t heads = num_heads + num_kv_heads;
  float* qp = qkv.data_ptr<float>();
  const float* hp = halves.data_ptr<float>();
  at::parallel_for(0, T, grain_rows(heads * rot), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = hp + t * rot;
      const float* s = c + half;
      for (int64_t h = 0; h < heads; ++h) {
        float* x = qp + t * row + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * c[i] - x2 * s[i];
          x[i + half] = x2 * c[i] + x1 * s[i];
        }
      }
    }
  });
}

// Out of line, so every caller (silu_mul, a8_panel_mlp's epilogue) runs the same instructions
// and gets the same bits for the same values. e^-g is taken at most at e^88 (finite in fp32):
// under -ffast-math the vector expf's overflow to inf made every gate below -88 NaN (the MLP's
// whole row then, through the down projection), where silu is -0 to fp32's precision.
__attribute__((noinline)) void silu_mul_span(const float* g, const float* u, float* o,
                                             int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.f + std::exp(std::min(-g[i], 88.f))) * u[i];
}

// o[i] = gelu_tanh(g[i]) u[i]: torch's gelu(approximate="tanh"), 0.5 g (1 + tanh(sqrt(2 / pi)
// (g + 0.044715 g^3))), with glibc's vector tanhf. The cube is taken of g clamped to +-20:
// beyond it tanh is +-1 in fp32 either way, and an overflowing g^3 (inf, which -ffast-math
// assumes away) cannot reach the tanh.
__attribute__((noinline)) void gelu_tanh_mul_span(const float* g, const float* u, float* o,
                                                  int64_t n) {
  constexpr float kAlpha = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i], c = std::min(std::max(x, -20.f), 20.f);
    o[i] = 0.5f * x * (1.f + std::tanh(kAlpha * (c + 0.044715f * c * c * c))) * u[i];
  }
}

// fused [gate | up] rows [T, 2 n] -> span(gate, up) [T, n], a row per task
template <typename Span>
torch::Tensor gated(torch::Tensor gate_up, const char* name, Span span) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.dtype() == torch::kFloat32 &&
              gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              name, ": gate_up must be contiguous fp32 [T, 2 * inter]");
  const int64_t T = gate_up.size(0), n = gate_up.size(1) / 2;
  auto out = torch::empty({T, n}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* g = gp + t * 2 * n;
      span(g, g + n, op + t * n, n);
    }
  });
  return out;
}

torch::Tensor gelu_tanh_mul(torch::Tensor gate_up) {
  return gated(std::move(gate_up), "gelu_tanh_mul", gelu_tanh_mul_span);
}

torch::Tensor silu_mul(torch::Tensor gate_up) {
  return gated(std::move(gate_up), "silu_mul", silu_mul_span);
}
