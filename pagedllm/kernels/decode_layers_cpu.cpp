// A decode step through all layers of a Llama-family decoder in one call (CPU, fp32).
//
// The per-layer work is the same kernels the Python layers call, in the same order, so the
// result is identical to the bit; what goes away is Python's share: ~10 module calls and
// ~10 op dispatches per layer (~3-5 us each on this CPU, 1.5-2.5 ms of a ~13 ms SmolLM2
// decode step). Per layer, with residual r (pagedllm/model/models/llama.py):
//
//   h = norm(x + r)            add_rms_norm_ (first layer: r = x, h = rms_norm(x))
//   qkv = h W_qkv ; RoPE(q, k) ; a = attention(write K/V, q)      paged_decode_attention_qkv
//                              (Qwen3, Gemma 3: each q and k head RMS-normalized before RoPE)
//   h = norm(a W_o + r)        add_rms_norm_
//   x = silu_mul(h W_gate_up) W_down   (or a mixture-of-experts block: moe_decode_cpu.h)
//
// Gemma 3's layer (pagedllm/model/models/gemma3.py) norms by (1 + w) and wraps both halves:
//
//   h = norm(norm_post(a W_o) + r)                  rms_norm, add_rms_norm_ (pre-FF norm)
//   x = norm_post_ff(gelu_tanh_mul(h W_gate_up) W_down)
//
// Each layer reads the block tables of its KV group (core/kv_groups.py: Gemma 3's sliding
// layers keep their own), attends within its window and rotates by its RoPE table (Gemma 3:
// base 10k on sliding layers, 1M on full ones).
//
// A `LinearRef` is one linear layer's weight in the form its kernel takes: packed fp32
// panels (gemm_cpu.cpp), GGUF panels (quant_gguf_cpu.cpp), GGUF panels with int8
// activations (quant_a8_panels_cpu.cpp) or a bf16 [N, K] matrix (bf16_linear_cpu.cpp);
// pagedllm/model/fused_decode.py builds them. Kind kExtern calls a kernel of the "int" module
// (int8, W8A8, int4 weights) through the address it handed out (extern_linear_cpu.h).
#include <torch/csrc/utils/pybind.h>  // register_*(m): pybind11, torch's Tensor casters
#include "torch_lite_cpu.h"
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "extern_linear_cpu.h"
#include "kernels_cpu.h"

namespace {

enum LinearKind : int64_t {
  kPacked = 0, kGGUFPanels = 1, kA8Panels = 3, kBf16 = 4, kExtern = 5  // 2: GGUF rows, gone
};

// The tensors a kind's kernel takes (0: not a kind, or kExtern, whose kernel takes its own);
// a `LinearRef` and an `ExpertsRef` (moe_decode_cpu.h) of one kind hold the same fields.
inline size_t tensors_of_kind(int64_t kind) {
  switch (kind) {
    case kPacked: case kBf16: return 1;
    case kGGUFPanels: return 5;
    case kA8Panels: return 3;
    default: return 0;
  }
}

struct LinearRef {
  int64_t kind, fmt, N, K, rows;  // rows: the kernel's in-register / int8 row limit (kExtern:
                                  // the kernel's integer argument)
  std::vector<torch::Tensor> t;
  c10::optional<torch::Tensor> bias;
  ExternLinearFn fn = nullptr;  // kExtern's kernel

  LinearRef(int64_t kind_, int64_t fmt_, int64_t N_, int64_t K_, int64_t rows_,
            std::vector<torch::Tensor> t_, c10::optional<torch::Tensor> bias_, int64_t fn_ = 0)
      : kind(kind_), fmt(fmt_), N(N_), K(K_), rows(rows_), t(std::move(t_)), bias(std::move(bias_)),
        fn(reinterpret_cast<ExternLinearFn>(fn_)) {
    const size_t want = tensors_of_kind(kind);
    if (kind == kExtern) {
      TORCH_CHECK(fn && !t.empty(), "LinearRef: kind ", kind,
                  " takes a kernel address (the int module's extern_linear) and its tensors");
    } else {
      TORCH_CHECK(want && t.size() == want, "LinearRef: kind ", kind, " takes ", want, " tensors");
    }
  }

  // Whether the kernel asks for a plan's lines as it goes: the int8-activation panels.
  bool carries_plans() const { return kind == kA8Panels; }

  // `plan` (or none): lines the kernel asks for as it goes (prefetch_plan_cpu.h) where it
  // carries_plans(); the other kinds ignore it.
  torch::Tensor operator()(const torch::Tensor& x, PrefetchPlan* plan = nullptr) const {
    if (kind == kPacked) return packed_linear(x, t[0], N, bias);
    if (kind == kExtern) {
      torch::Tensor y = fn(x, t, N, rows);
      if (bias) y.add_(*bias);
      return y;
    }
    if (kind == kBf16) return bf16_linear(x, t[0], bias, rows);  // rows: its torch_rows
    torch::Tensor y = kind == kGGUFPanels
                          ? gguf_linear(x, fmt, N, t[0], t[1], t[2], t[3], t[4], rows)
                          : a8_panel_linear_prefetching(x, fmt, t[0], t[1], t[2], N, plan);
    if (bias) y.add_(*bias);
    return y;
  }
};

#include "moe_decode_cpu.h"  // MoERef, which holds LinearRefs

struct DecodeLayer {
  torch::Tensor in_norm, post_norm;
  LinearRef qkv, o;
  std::optional<torch::Tensor> q_norm, k_norm;  // per-head norms of q and k (Qwen3, Gemma 3)
  std::optional<LinearRef> gate_up, down;  // a dense MLP, or
  std::optional<MoERef> moe;               // a mixture-of-experts block
  // Gemma 3's layer (the header): its norms before and after the MLP; with them every norm
  // of the layer is Gemma's and the MLP's gate is GELU (tanh).
  std::optional<torch::Tensor> pre_ff_norm, post_ff_norm;
  int64_t window, rope;  // its own sliding window (0: its KV group's), its RoPE table

  DecodeLayer(torch::Tensor in_norm_, torch::Tensor post_norm_, LinearRef qkv_, LinearRef o_,
              std::optional<torch::Tensor> q_norm_, std::optional<torch::Tensor> k_norm_,
              std::optional<LinearRef> gate_up_, std::optional<LinearRef> down_,
              std::optional<MoERef> moe_, std::optional<torch::Tensor> pre_ff_norm_,
              std::optional<torch::Tensor> post_ff_norm_, int64_t window_, int64_t rope_)
      : in_norm(std::move(in_norm_)), post_norm(std::move(post_norm_)), qkv(std::move(qkv_)),
        o(std::move(o_)), q_norm(std::move(q_norm_)), k_norm(std::move(k_norm_)),
        gate_up(std::move(gate_up_)), down(std::move(down_)), moe(std::move(moe_)),
        pre_ff_norm(std::move(pre_ff_norm_)), post_ff_norm(std::move(post_ff_norm_)),
        window(window_), rope(rope_) {
    TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "DecodeLayer: q and k norms or none");
    TORCH_CHECK(pre_ff_norm.has_value() == post_ff_norm.has_value(),
                "DecodeLayer: Gemma's pre- and post-feed-forward norms or neither");
    TORCH_CHECK(moe.has_value() != (gate_up.has_value() && down.has_value()),
                "DecodeLayer: a dense MLP (gate_up, down) or a MoE block");
    TORCH_CHECK(!gemma() || !moe, "DecodeLayer: Gemma's layer has a dense MLP");
    TORCH_CHECK(window >= 0 && rope >= 0, "DecodeLayer: window and rope must be >= 0");
  }

  bool gemma() const { return pre_ff_norm.has_value(); }

  torch::Tensor mlp(const torch::Tensor& h) const {
    if (moe) return (*moe)(h);
    if (gemma()) return (*down)(gelu_tanh_mul((*gate_up)(h)));
    if (panel_mlp())  // one call, the same bits (a8_panel_mlp)
      return a8_panel_mlp(h, gate_up->fmt, gate_up->t[0], gate_up->t[1], gate_up->t[2],
                          down->fmt, down->t[0], down->t[1], down->t[2], down->K, down->N);
    return (*down)(silu_mul((*gate_up)(h)));
  }

  // Both halves int8-activation panels without biases, of matching sizes (a panel matrix's
  // input is whole 32-value blocks): a8_panel_mlp runs them.
  bool panel_mlp() const {
    return gate_up && down && gate_up->kind == kA8Panels && down->kind == kA8Panels &&
           !gate_up->bias && !down->bias && gate_up->N == 2 * down->K;
  }
};

// The step's KV side: every layer's K and V pools (and their scales: empty lists for a cache
// without them) and KV group, and each group's slots [T], block tables [T, W] and window (0:
// none); seq_lens [T] are every group's.
struct StepKV {
  const std::vector<torch::Tensor>& k, & v, & k_scales, & v_scales;
  const std::vector<int64_t>& layer_groups;
  const std::vector<torch::Tensor>& slots, & tables;
  const std::vector<int64_t>& windows;
  const torch::Tensor& seq_lens;

  void check(size_t L) const {
    TORCH_CHECK(k.size() == L && v.size() == L && layer_groups.size() == L,
                "decode_layers: one K and V cache and KV group per layer");
    TORCH_CHECK(k_scales.empty() || (k_scales.size() == L && v_scales.size() == L),
                "decode_layers: scales for every layer or none");
    const size_t G = tables.size();
    TORCH_CHECK(G > 0 && slots.size() == G && windows.size() == G,
                "decode_layers: slots, block tables and a window for every KV group");
    for (int64_t g : layer_groups)
      TORCH_CHECK(g >= 0 && static_cast<size_t>(g) < G, "decode_layers: KV group ", g,
                  " has no block tables");
  }
};

// A layer's window within its group's: the smaller of the two that are set (0: none), as
// AttentionMetadata.for_window combines them.
inline int64_t layer_window(int64_t own, int64_t group) {
  return own == 0 ? group : group == 0 ? own : std::min(own, group);
}

// K/V bytes per thread the QKV projection asks for ahead of a layer's attention (the first
// each thread's attention reads): half a Zen 4 core's L2. One stream of 256 / 1,000 tokens
// (0.2 / 0.75 MiB a layer) fits whole; a large batch gets its first rows warm. One stream,
// SmolLM2 Q4_1, 2 threads, Zen 4: attention 27 -> 14-15 us a layer at ~256 tokens, the
// projection 12 -> 16-19 us (it now reads those bytes too): +3.8% a token. No gain at 1,000
// tokens (those rows streamed near the bandwidth already); docs/benchmarks.md has the runs.
constexpr int64_t kKVPrefetchBytes = 512 * 1024;

// x [T, hidden] (the embeddings; overwritten) -> (h, residual) of the last layer, before the
// final norm, or (norm(h + residual), h + residual) with `final_norm` (the model's RMSNorm, of
// the layers' kind: the same call as model/layers/norm.py's). Every row is a decode; halves:
// the rows' RoPE rows [T, rot] of each table the layers name.
std::tuple<torch::Tensor, torch::Tensor> decode_layers(
    torch::Tensor x, const std::vector<DecodeLayer>& layers, int64_t H, int64_t KVH, int64_t d,
    double scale, double eps, const std::vector<torch::Tensor>& halves, const StepKV& kv,
    const c10::optional<torch::Tensor>& final_norm) {
  const size_t L = layers.size();
  kv.check(L);
  const bool quant = !kv.k_scales.empty();
  torch::Tensor residual, h;
  for (size_t i = 0; i < L; ++i) {
    const DecodeLayer& l = layers[i];
    const bool gemma = l.gemma();
    const int64_t g = kv.layer_groups[i];
    const int64_t window = layer_window(l.window, kv.windows[g]);
    TORCH_CHECK(static_cast<size_t>(l.rope) < halves.size(), "decode_layers: layer ", i,
                " names RoPE table ", l.rope, " of ", halves.size());
    if (i == 0) {
      residual = x;
      h = rms_norm(x, l.in_norm, eps, gemma);
    } else {
      add_rms_norm_(x, residual, l.in_norm, eps, gemma);
      h = x;
    }
    // this layer's K/V rows, asked for while the projection streams its weights
    std::optional<PrefetchPlan> plan;
    if (l.qkv.carries_plans())
      plan.emplace(decode_kv_prefetch(kv.k[i], kv.v[i], kv.tables[g], kv.seq_lens, window,
                                      at::get_num_threads(), kKVPrefetchBytes));
    torch::Tensor qkv = l.qkv(h, plan ? &*plan : nullptr);
    if (l.q_norm) head_rms_norms_(qkv, *l.q_norm, *l.k_norm, H, KVH, d, eps, gemma);
    rotary_qk_(qkv, halves[l.rope], H, KVH, d);
    c10::optional<torch::Tensor> ks, vs;
    if (quant) ks = kv.k_scales[i], vs = kv.v_scales[i];
    torch::Tensor a = paged_decode_attention_qkv(qkv, kv.k[i], kv.v[i], ks, vs, kv.slots[g],
                                                 kv.tables[g], kv.seq_lens, H, scale, window);
    h = l.o(a);
    if (gemma) {
      h = rms_norm(h, l.post_norm, eps, true);
      add_rms_norm_(h, residual, *l.pre_ff_norm, eps, true);
      x = rms_norm(l.mlp(h), *l.post_ff_norm, eps, true);
    } else {
      add_rms_norm_(h, residual, l.post_norm, eps);
      x = l.mlp(h);
    }
  }
  if (final_norm) add_rms_norm_(x, residual, *final_norm, eps, L && layers.back().gemma());
  return {x, residual};
}

// A token embedding table as decode_steps looks rows up, with the kernel each format's
// Python `embedding` calls (the same rows): kPacked here means a dense fp32 table [N, K]
// (rows copied, as F.embedding does), kBf16 a bf16 table (rows widened, as .float() does),
// kGGUFPanels gguf_embedding, kA8Panels a8_panel_rows; the tensors of
// a LinearRef of that kind.
struct EmbedRef {
  int64_t kind, fmt, N, K;
  std::vector<torch::Tensor> t;

  EmbedRef(int64_t kind_, int64_t fmt_, int64_t N_, int64_t K_, std::vector<torch::Tensor> t_)
      : kind(kind_), fmt(fmt_), N(N_), K(K_), t(std::move(t_)) {
    const size_t want = tensors_of_kind(kind);
    TORCH_CHECK(want && t.size() == want, "EmbedRef: kind ", kind, " takes ", want, " tensors");
  }

  torch::Tensor operator()(const torch::Tensor& ids) const {
    switch (kind) {
      case kA8Panels: return a8_panel_rows(ids, fmt, t[0], t[1], t[2], N, K);
      case kGGUFPanels: return gguf_embedding(ids, fmt, N, t[0], t[1], t[2], t[3], t[4]);
      case kBf16: return t[0].index_select(0, ids).to(torch::kFloat);
      default: return t[0].index_select(0, ids);
    }
  }
};

#include "step_sampler_cpu.h"  // greedy_rows, StepSampler

// Up to `steps` decode steps of every row in one call (`num_scheduler_steps`): each
// step looks the rows' tokens up in `embed` (times `embed_scale` unless it is 1: Gemma's
// sqrt(hidden), rounded to float as the model rounds it), runs decode_layers (the final norm
// included), `lm_head` and `sampler`, and feeds the tokens back; step i writes K/V at
// position seq_lens[b] - 1 + i, whose slot comes from each KV group's `block_tables` (which
// must already cover every step). The same kernels in the same order as one step at a time,
// so the same tokens. Returns tokens [B, n]: n < steps when a row sampled one of its stop ids
// (stop_ids[off[b], off[b + 1])) at step n - 1, or `sampler` refused step n (that step's KV is
// written but it is not counted: the caller runs it again on its own, which reports a row
// whose logits are not finite). halves: each RoPE table's [steps, B, rot], each step's rows.
torch::Tensor decode_steps(
    torch::Tensor ids, const std::vector<DecodeLayer>& layers, const EmbedRef& embed,
    double embed_scale, const LinearRef& lm_head, torch::Tensor final_norm, int64_t vocab,
    int64_t H, int64_t KVH, int64_t d, double scale, double eps,
    const std::vector<torch::Tensor>& halves, const std::vector<torch::Tensor>& k_caches,
    const std::vector<torch::Tensor>& v_caches, const std::vector<torch::Tensor>& k_scales,
    const std::vector<torch::Tensor>& v_scales, const std::vector<int64_t>& layer_groups,
    const std::vector<torch::Tensor>& block_tables, torch::Tensor seq_lens, int64_t block_size,
    const std::vector<int64_t>& windows, torch::Tensor stop_ids, torch::Tensor stop_offsets,
    int64_t steps, c10::optional<torch::Tensor> temperature, c10::optional<torch::Tensor> top_k,
    c10::optional<torch::Tensor> top_p, c10::optional<torch::Tensor> u, int64_t candidates) {
  const int64_t B = ids.size(0);
  const size_t G = block_tables.size();
  TORCH_CHECK(ids.dtype() == torch::kInt64 && ids.dim() == 1 && seq_lens.numel() == B &&
                  seq_lens.dtype() == torch::kInt64 && stop_offsets.numel() == B + 1 &&
                  stop_ids.dtype() == torch::kInt64 && stop_offsets.dtype() == torch::kInt64,
              "decode_steps: int64 ids [B], seq_lens [B], stop ids and offsets [B + 1]");
  for (const torch::Tensor& t : block_tables)
    TORCH_CHECK(t.dtype() == torch::kInt64 && t.is_contiguous() && t.dim() == 2 &&
                    t.size(0) == B, "decode_steps: int64 block tables [B, W] per KV group");
  for (const torch::Tensor& t : halves)
    TORCH_CHECK(t.dim() == 3 && t.size(0) >= steps && t.size(1) == B,
                "decode_steps: halves must be [steps, B, rotary]");
  TORCH_CHECK(!temperature.has_value() ||
                  (temperature->numel() == B && temperature->dtype() == torch::kFloat32 &&
                   temperature->is_contiguous() && u.has_value() && u->dim() == 2 &&
                   u->size(0) >= steps && u->size(1) == B && u->dtype() == at::kDouble &&
                   u->is_contiguous()),
              "decode_steps: temperature [B] float32 comes with u [steps, B] float64");
  const StepSampler sampler{temperature, top_k, top_p, u, candidates};
  const int64_t* so = stop_offsets.data_ptr<int64_t>();
  const int64_t* sid = stop_ids.data_ptr<int64_t>();
  torch::Tensor lens = seq_lens.clone(), cur = ids.contiguous().clone();
  std::vector<torch::Tensor> slots;
  for (size_t g = 0; g < G; ++g) slots.push_back(torch::empty({B}, ids.options()));
  torch::Tensor tokens = torch::empty({B, steps}, ids.options());
  int64_t* lp = lens.data_ptr<int64_t>();
  int64_t* cp = cur.data_ptr<int64_t>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  const StepKV kv{k_caches, v_caches, k_scales, v_scales, layer_groups, slots, block_tables,
                  windows, lens};
  std::vector<int64_t> next(B);
  std::vector<torch::Tensor> step_halves(halves.size());
  int64_t n = 0;
  for (; n < steps; ++n) {
    for (size_t g = 0; g < G; ++g) {
      const int64_t W = block_tables[g].size(1);
      const int64_t* bt = block_tables[g].data_ptr<int64_t>();
      int64_t* sp = slots[g].data_ptr<int64_t>();
      for (int64_t b = 0; b < B; ++b) {
        const int64_t pos = lp[b] - 1;
        TORCH_CHECK(pos / block_size < W, "decode_steps: the block table does not cover step ", n);
        sp[b] = bt[b * W + pos / block_size] * block_size + pos % block_size;
      }
    }
    for (size_t r = 0; r < halves.size(); ++r) step_halves[r] = halves[r][n];
    torch::Tensor x = embed(cur);
    if (embed_scale != 1.0) x.mul_(embed_scale);
    auto hr = decode_layers(x, layers, H, KVH, d, scale, eps, step_halves, kv, final_norm);
    if (!sampler(lm_head(std::get<0>(hr)).contiguous(), vocab, n, next.data())) break;
    bool stop = false;
    for (int64_t b = 0; b < B; ++b) {
      tp[b * steps + n] = cp[b] = next[b];
      stop |= std::find(sid + so[b], sid + so[b + 1], next[b]) != sid + so[b + 1];
      ++lp[b];
    }
    if (stop) {
      ++n;
      break;
    }
  }
  return tokens.narrow(1, 0, n).contiguous();
}

// decode_layers as Python calls it: the StepKV's parts as arguments.
std::tuple<torch::Tensor, torch::Tensor> decode_layers_py(
    torch::Tensor x, const std::vector<DecodeLayer>& layers, int64_t H, int64_t KVH, int64_t d,
    double scale, double eps, const std::vector<torch::Tensor>& halves,
    const std::vector<torch::Tensor>& k_caches, const std::vector<torch::Tensor>& v_caches,
    const std::vector<torch::Tensor>& k_scales, const std::vector<torch::Tensor>& v_scales,
    const std::vector<int64_t>& layer_groups, const std::vector<torch::Tensor>& slots,
    const std::vector<torch::Tensor>& block_tables, torch::Tensor seq_lens,
    const std::vector<int64_t>& windows, c10::optional<torch::Tensor> final_norm) {
  const StepKV kv{k_caches, v_caches, k_scales, v_scales, layer_groups, slots, block_tables,
                  windows, seq_lens};
  return decode_layers(std::move(x), layers, H, KVH, d, scale, eps, halves, kv, final_norm);
}

}  // namespace

void register_decode_layers(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<LinearRef>(m, "LinearRef", "one linear layer's weight as its C++ kernel takes it")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, std::vector<torch::Tensor>,
                    c10::optional<torch::Tensor>, int64_t>(),
           py::arg("kind"), py::arg("fmt"), py::arg("N"), py::arg("K"), py::arg("rows"),
           py::arg("tensors"), py::arg("bias"), py::arg("fn") = 0)
      .def("__call__", [](const LinearRef& r, const torch::Tensor& x) { return r(x); },
           py::call_guard<py::gil_scoped_release>());
  register_moe_refs(m);
  py::class_<DecodeLayer>(m, "DecodeLayer",
                          "the weights of one Llama-family or Gemma 3 decoder layer")
      .def(py::init<torch::Tensor, torch::Tensor, LinearRef, LinearRef,
                    std::optional<torch::Tensor>, std::optional<torch::Tensor>,
                    std::optional<LinearRef>, std::optional<LinearRef>, std::optional<MoERef>,
                    std::optional<torch::Tensor>, std::optional<torch::Tensor>, int64_t,
                    int64_t>(),
           py::arg("in_norm"), py::arg("post_norm"), py::arg("qkv"), py::arg("o"),
           py::arg("q_norm") = py::none(), py::arg("k_norm") = py::none(),
           py::arg("gate_up") = py::none(), py::arg("down") = py::none(),
           py::arg("moe") = py::none(), py::arg("pre_ff_norm") = py::none(),
           py::arg("post_ff_norm") = py::none(), py::arg("window") = 0, py::arg("rope") = 0);
  py::class_<EmbedRef>(m, "EmbedRef", "a token embedding table as decode_steps looks rows up")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, std::vector<torch::Tensor>>(),
           py::arg("kind"), py::arg("fmt"), py::arg("N"), py::arg("K"), py::arg("tensors"));
  m.def("decode_steps", &decode_steps, py::call_guard<py::gil_scoped_release>(),
        "up to `steps` decode steps in one call, greedy or (with temperature [B] and u "
        "[steps, B]) sampled: the tokens [B, n] (n < steps after a stop id, or before a step "
        "whose logits are not finite)");
  m.def("greedy_rows",
        [](const torch::Tensor& logits) {
          TORCH_CHECK(logits.dim() == 2 && logits.dtype() == torch::kFloat32 &&
                          logits.is_contiguous() && logits.size(1) > 0,
                      "greedy_rows: logits must be contiguous fp32 [B, V], V > 0");
          auto ids = torch::empty({logits.size(0)}, torch::dtype(torch::kInt64));
          greedy_rows(logits, logits.size(1), ids.data_ptr<int64_t>());
          return ids;
        },
        py::call_guard<py::gil_scoped_release>(),
        "each row's first maximum (numpy's and torch's argmax), or -1 where the row is not "
        "finite (a NaN or +inf anywhere, or an infinite maximum); the rows in parallel");
  m.def("decode_layers", &decode_layers_py, py::call_guard<py::gil_scoped_release>(),
        "a decode step through every decoder layer: (h, residual) before the final norm, or "
        "after it when final_norm (the model's RMSNorm weight) is given");
}
