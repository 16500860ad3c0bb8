// Python bindings of the CPU kernels (one extension module built from all sources).
#include <torch/extension.h>

void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                            torch::Tensor v_cache, torch::Tensor block_tables,
                            torch::Tensor seq_lens, double scale, int64_t window);
void paged_decode_attention_quant(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                                  torch::Tensor v_cache, torch::Tensor k_scale,
                                  torch::Tensor v_scale, torch::Tensor block_tables,
                                  torch::Tensor seq_lens, double scale, int64_t window);
void quantize_into_cache(torch::Tensor x, torch::Tensor cache, torch::Tensor scales,
                         torch::Tensor slots);
int64_t gemm_panel_width();
torch::Tensor pack_linear_weight(torch::Tensor w);
torch::Tensor packed_linear(torch::Tensor x, torch::Tensor packed, int64_t N,
                            c10::optional<torch::Tensor> bias);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "paged decode attention (CPU, fp32)");
  m.def("paged_decode_attention_quant", &paged_decode_attention_quant,
        "paged decode attention over an int8 / fp8 cache with float16 scales (CPU)");
  m.def("quantize_into_cache", &quantize_into_cache,
        "quantize K or V rows and store values and float16 scales at their slots (CPU)");
  m.def("gemm_panel_width", &gemm_panel_width, "output columns per packed weight panel");
  m.def("pack_linear_weight", &pack_linear_weight,
        "pack an fp32 [N, K] weight into [N / NB, K, NB] panels for packed_linear");
  m.def("packed_linear", &packed_linear, "y = x @ W^T (+ bias) over a packed weight (CPU)");
}
