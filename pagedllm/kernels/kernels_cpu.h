// The C++ CPU kernels' entry points (defined in the .cpp files beside this one): the
// declarations bindings.cpp binds to Python and decode_layers_cpu.cpp calls directly.
#pragma once
#include "torch_lite_cpu.h"
#include <string>

#include "prefetch_plan_cpu.h"

void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                            torch::Tensor v_cache, torch::Tensor block_tables,
                            torch::Tensor seq_lens, double scale, int64_t window);
void paged_decode_attention_quant(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                                  torch::Tensor v_cache, torch::Tensor k_scale,
                                  torch::Tensor v_scale, torch::Tensor block_tables,
                                  torch::Tensor seq_lens, double scale, int64_t window);
torch::Tensor paged_decode_attention_qkv(torch::Tensor qkv, torch::Tensor k_cache,
                                         torch::Tensor v_cache,
                                         c10::optional<torch::Tensor> k_scale,
                                         c10::optional<torch::Tensor> v_scale, torch::Tensor slots,
                                         torch::Tensor block_tables, torch::Tensor seq_lens,
                                         int64_t H, double scale, int64_t window);
void quantize_into_cache(torch::Tensor x, torch::Tensor cache, torch::Tensor scales,
                         torch::Tensor slots);
void store_into_cache(torch::Tensor x, torch::Tensor cache, torch::Tensor slots);
// The K/V rows paged_decode_attention_qkv will read for rows of seq_lens[b] tokens (all but the
// new one's, which the call writes), per thread of `threads` in the order that thread reads
// them, at most `budget` bytes each (the first it reads); fp32 / float16 / 8-bit rows (an 8-bit
// cache's scales are not asked for).
PrefetchPlan decode_kv_prefetch(const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                                int64_t window, int64_t threads, int64_t budget);
int64_t gemm_panel_width();
torch::Tensor pack_linear_weight(torch::Tensor w);
torch::Tensor packed_linear(torch::Tensor x, torch::Tensor packed, int64_t N,
                            c10::optional<torch::Tensor> bias);
torch::Tensor bf16_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias,
                          int64_t torch_rows);
std::string bf16_linear_isa();
// The TileMode (amx_tiles_cpu.h) the prompt rows run on: GEMMs and attention alike
int prompt_tile_mode();
torch::Tensor grouped_packed_linear(torch::Tensor x, torch::Tensor packed, int64_t N,
                                    torch::Tensor offsets);
torch::Tensor bf16_grouped_linear(torch::Tensor x, torch::Tensor packed, int64_t N,
                                  torch::Tensor offsets, int64_t min_bf16_rows,
                                  const std::string& isa_name);
void add_rms_norm_(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps,
                   bool gemma = false);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps, bool gemma = false);
void head_rms_norms_(torch::Tensor qkv, torch::Tensor q_w, torch::Tensor k_w, int64_t H,
                     int64_t KVH, int64_t d, double eps, bool gemma = false);
void rotary_qk_(torch::Tensor qkv, torch::Tensor halves, int64_t num_heads,
                int64_t num_kv_heads, int64_t head_dim);
torch::Tensor silu_mul(torch::Tensor gate_up);
torch::Tensor gelu_tanh_mul(torch::Tensor gate_up);
// o[i] = silu(g[i]) u[i], i < n: silu_mul's arithmetic (one body for all its callers)
void silu_mul_span(const float* g, const float* u, float* o, int64_t n);
torch::Tensor gguf_linear(torch::Tensor x, int64_t fmt, int64_t N, torch::Tensor q, torch::Tensor d,
                          torch::Tensor sc, torch::Tensor m, torch::Tensor mi,
                          int64_t in_register_rows);
torch::Tensor gguf_embedding(torch::Tensor ids, int64_t fmt, int64_t N, torch::Tensor q,
                             torch::Tensor d, torch::Tensor sc, torch::Tensor m, torch::Tensor mi);
torch::Tensor a8_panel_rows(torch::Tensor ids, int64_t fmt, torch::Tensor codes, torch::Tensor d,
                            torch::Tensor m, int64_t N, int64_t K);
torch::Tensor a8_panel_linear(torch::Tensor x, int64_t fmt, torch::Tensor codes, torch::Tensor d,
                              torch::Tensor m, int64_t N);
// down(silu(gate) * up) over int8-activation panels ([gate | up] [2 I, K], down [N, I])
torch::Tensor a8_panel_mlp(torch::Tensor x, int64_t gu_fmt, torch::Tensor gu_codes,
                           torch::Tensor gu_d, torch::Tensor gu_m, int64_t down_fmt,
                           torch::Tensor down_codes, torch::Tensor down_d, torch::Tensor down_m,
                           int64_t I, int64_t N);
// Checks an [N, K] matrix in the int8-activation panel layout (codes, d, Q4_1's m) for `fn`.
void check_a8_panel_weight(const char* fn, int64_t fmt, const torch::Tensor& codes,
                           const torch::Tensor& d, const torch::Tensor& m, int64_t N, int64_t K);
// Checks a Llama MLP call of panel matrices for `fn`: x contiguous fp32 [M, K], the fused
// [gate | up] matrix [2 I, K], the down matrix [N, I], I whole 32-value blocks.
void check_a8_panel_mlp(const char* fn, const torch::Tensor& x, int64_t gu_fmt,
                        const torch::Tensor& gu_codes, const torch::Tensor& gu_d,
                        const torch::Tensor& gu_m, int64_t down_fmt,
                        const torch::Tensor& down_codes, const torch::Tensor& down_d,
                        const torch::Tensor& down_m, int64_t I, int64_t N);
// a8_panel_linear while `plan` (or none) asks for its lines between the weight panels
torch::Tensor a8_panel_linear_prefetching(torch::Tensor x, int64_t fmt, torch::Tensor codes,
                                          torch::Tensor d, torch::Tensor m, int64_t N,
                                          PrefetchPlan* plan);
torch::Tensor gguf_grouped_linear(torch::Tensor x, int64_t fmt, int64_t N, torch::Tensor q,
                                  torch::Tensor d, torch::Tensor sc, torch::Tensor m,
                                  torch::Tensor mi, torch::Tensor offsets,
                                  int64_t in_register_rows);
torch::Tensor a8_panel_grouped_linear(torch::Tensor x, int64_t fmt, torch::Tensor codes,
                                      torch::Tensor d, torch::Tensor m, int64_t N,
                                      torch::Tensor offsets);
torch::Tensor sample_rows(torch::Tensor logits, c10::optional<torch::Tensor> temperature,
                          c10::optional<torch::Tensor> threshold, torch::Tensor u,
                          c10::optional<torch::Tensor> log_min_p);
torch::Tensor top_k_top_p_thresholds(torch::Tensor logits, c10::optional<torch::Tensor> temperature,
                                     c10::optional<torch::Tensor> k,
                                     c10::optional<torch::Tensor> p, int64_t m);
