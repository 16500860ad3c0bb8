// A mixture-of-experts block as the C++ decode loop runs it (decode_layers_cpu.cpp includes
// this after its `LinearRef`, inside its anonymous namespace; the block is also callable from
// Python for tests). The same ops in the same order as the Python block
// (pagedllm/model/layers/moe/layer.py, router.py, experts.py), so the result is equal to the
// bit; what goes away is Python's ~35 us per layer of module calls, small tensors and host
// reads around the experts' two grouped GEMMs:
//
//   logits = x W_router                      [T, E]   a LinearRef
//   p = softmax(logits) ; w, ids = topk(p, k)         (w /= sum(w) when renormalized)
//   order = assignments t * k + j stably sorted by expert id (a counting sort on the host)
//   xs = x[order / k]                        [R = T * k, H], the rows of expert 0, 1, ...
//   out = down(silu_mul(gate_up(xs)))        two grouped calls (grouped_cpu.h), `ExpertsRef`
//   out *= w.flat[order] ; y[t] = 0 + each of token t's rows, in expert order
//   (+ sigmoid(x W_gate) * shared(x): Qwen2-MoE's shared expert)
//
// Routing and the weighting call ATen's own ops (softmax, topk, sum, div, mul_), a few us a
// layer: hand-written versions would not match torch's vectorized exp, its tie order or its
// reduction order to the bit, and the kernels are built with -ffast-math (a product fused
// into the next add) where torch's are not. The sums of the combine are plain adds in
// index_add_'s order, written out here.
#pragma once
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

// One projection (gate|up, or down) of all E experts, stacked as its format's grouped kernel
// takes it (moe/grouped.py, grouped_quant.py build it): the kinds and tensors of `LinearRef`,
// one more leading dimension over the experts.
struct ExpertsRef {
  int64_t kind, fmt, N, K, rows;
  std::vector<torch::Tensor> t;

  ExpertsRef(int64_t kind_, int64_t fmt_, int64_t N_, int64_t K_, int64_t rows_,
             std::vector<torch::Tensor> t_)
      : kind(kind_), fmt(fmt_), N(N_), K(K_), rows(rows_), t(std::move(t_)) {
    const size_t want = tensors_of_kind(kind);
    TORCH_CHECK(want && t.size() == want, "ExpertsRef: kind ", kind, " takes ", want, " tensors");
    TORCH_CHECK(t[0].dim() >= 1 && t[0].size(0) > 0,
                "ExpertsRef: tensors must be stacked [E, ...]");
  }

  int64_t experts() const { return t[0].size(0); }

  // rows xs [R, K] sorted by expert (offsets [E + 1]) -> [R, N]
  torch::Tensor operator()(const torch::Tensor& xs, const torch::Tensor& offsets) const {
    switch (kind) {
      case kPacked: return grouped_packed_linear(xs, t[0], N, offsets);
      case kGGUFPanels:
        return gguf_grouped_linear(xs, fmt, N, t[0], t[1], t[2], t[3], t[4], offsets, rows);
      // rows: the group size from which x is rounded for the bf16 dot product; this CPU's ISA
      case kBf16: return bf16_grouped_linear(xs, t[0], N, offsets, rows, "");
      default: return a8_panel_grouped_linear(xs, fmt, t[0], t[1], t[2], N, offsets);
    }
  }
};

// Qwen2-MoE's shared expert: a SwiGLU MLP every token takes, scaled by sigmoid(x W_gate).
struct SharedExpertRef {
  LinearRef gate_up, down;
  std::optional<LinearRef> gate;
};

struct MoERef {
  LinearRef router;
  ExpertsRef gate_up, down;
  int64_t top_k;
  bool renormalize;
  std::optional<SharedExpertRef> shared;

  MoERef(LinearRef router_, ExpertsRef gate_up_, ExpertsRef down_, int64_t top_k_,
         bool renormalize_, std::optional<SharedExpertRef> shared_)
      : router(std::move(router_)), gate_up(std::move(gate_up_)), down(std::move(down_)),
        top_k(top_k_), renormalize(renormalize_), shared(std::move(shared_)) {
    const int64_t E = gate_up.experts();
    TORCH_CHECK(down.experts() == E && router.N == E, "MoERef: the router scores ", router.N,
                " experts, the stacks hold ", E, " and ", down.experts());
    TORCH_CHECK(1 <= top_k && top_k <= E, "MoERef: top_k must be in [1, ", E, "], got ", top_k);
    TORCH_CHECK(gate_up.N == 2 * down.K && down.N == gate_up.K,
                "MoERef: gate_up [", gate_up.N, ", ", gate_up.K, "] and down [", down.N, ", ",
                down.K, "] are not one SwiGLU expert");
  }

  // x [T, H] contiguous fp32 -> [T, H]
  torch::Tensor operator()(const torch::Tensor& x) const {
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.dtype() == torch::kFloat32 &&
                    x.size(1) == gate_up.K,
                "MoERef: x must be contiguous fp32 [T, ", gate_up.K, "]");
    const int64_t T = x.size(0), H = x.size(1), k = top_k, R = T * k, E = gate_up.experts();
    // router.py's select_experts: softmax, topk (ties as torch.topk breaks them), renormalize
    auto [w, ids] = router(x).softmax(-1).topk(k, -1);
    if (renormalize) w = w.div(w.sum(-1, true));
    w = w.contiguous(), ids = ids.contiguous();
    const int64_t* id = ids.data_ptr<int64_t>();
    const float* wp = w.data_ptr<float>();
    // experts.py's group_by_expert: a stable counting sort of the assignments by expert
    torch::Tensor offsets = torch::empty({E + 1}, x.options().dtype(torch::kInt64));
    int64_t* off = offsets.data_ptr<int64_t>();
    std::fill(off, off + E + 1, 0);
    for (int64_t a = 0; a < R; ++a) ++off[id[a] + 1];
    for (int64_t e = 0; e < E; ++e) off[e + 1] += off[e];
    std::vector<int64_t> next(off, off + E), order(R);
    for (int64_t a = 0; a < R; ++a) order[next[id[a]]++] = a;
    torch::Tensor xs = torch::empty({R, H}, x.options());
    torch::Tensor ws = torch::empty({R, 1}, x.options());
    std::vector<int64_t> token(R);
    const float* xp = x.data_ptr<float>();
    float* xsp = xs.data_ptr<float>();
    float* wsp = ws.data_ptr<float>();
    for (int64_t j = 0; j < R; ++j) {
      token[j] = order[j] / k;
      wsp[j] = wp[order[j]];
      std::memcpy(xsp + j * H, xp + token[j] * H, H * sizeof(float));
    }
    torch::Tensor out = down(silu_mul(gate_up(xs, offsets)), offsets);
    out.mul_(ws);  // ATen's product, rounded on its own (a loop here could fuse it into the adds)
    // y = zeros, then each row added to its token's in row (expert) order: index_add_'s sums
    // (~1 us an op a row in ATen). Columns split over threads: each sum keeps its order.
    torch::Tensor y = torch::zeros({T, H}, x.options());
    const float* op = out.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, H, std::max<int64_t>(64, (int64_t{1} << 16) / std::max<int64_t>(R, 1)),
                     [&](int64_t c0, int64_t c1) {
      for (int64_t j = 0; j < R; ++j) {
        const float* o = op + j * H;
        float* yr = yp + token[j] * H;
        for (int64_t c = c0; c < c1; ++c) yr[c] += o[c];
      }
    });
    if (shared) {
      torch::Tensor s = shared->down(silu_mul(shared->gate_up(x)));
      if (shared->gate) s = (*shared->gate)(x).sigmoid().mul(s);
      y = y.add(s);
    }
    return y;
  }
};

inline void register_moe_refs(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<ExpertsRef>(m, "ExpertsRef",
                         "one projection of all experts, stacked as its grouped kernel takes it")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, std::vector<torch::Tensor>>(),
           py::arg("kind"), py::arg("fmt"), py::arg("N"), py::arg("K"), py::arg("rows"),
           py::arg("tensors"))
      .def("__call__", &ExpertsRef::operator(), py::call_guard<py::gil_scoped_release>());
  py::class_<SharedExpertRef>(m, "SharedExpertRef", "a shared expert and its optional gate")
      .def(py::init<LinearRef, LinearRef, std::optional<LinearRef>>(), py::arg("gate_up"),
           py::arg("down"), py::arg("gate"));
  py::class_<MoERef>(m, "MoERef", "a mixture-of-experts block of the C++ decode loop")
      .def(py::init<LinearRef, ExpertsRef, ExpertsRef, int64_t, bool,
                    std::optional<SharedExpertRef>>(),
           py::arg("router"), py::arg("gate_up"), py::arg("down"), py::arg("top_k"),
           py::arg("renormalize"), py::arg("shared"))
      .def("__call__", &MoERef::operator(), py::call_guard<py::gil_scoped_release>());
}
