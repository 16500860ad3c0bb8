// Python bindings of the "core" CPU kernel family (kernels/cpu_ops.py FAMILIES; the "int"
// family, quant_int_cpu.cpp and quant_w8a8_cpu.cpp, is a module of its own).
#include <omp.h>
#include <torch/csrc/utils/pybind.h>  // PYBIND11_MODULE, torch's Tensor casters

#include "kernels_cpu.h"

void register_gguf_kernels(pybind11::module_& m);  // quant_gguf_cpu.cpp
void register_a8_panel_kernels(pybind11::module_& m);  // quant_a8_panels_cpu.cpp
void register_prompt_tiles(pybind11::module_& m);  // prompt_tiles_cpu.cpp
void register_decode_layers(pybind11::module_& m);  // decode_layers_cpu.cpp
void register_varlen_attention(pybind11::module_& m);  // varlen_attention_cpu.cpp
void register_bf16_grouped_kernels(pybind11::module_& m);  // grouped_bf16_cpu.cpp
void register_sampling_kernels(pybind11::module_& m);  // sampling_cpu.cpp
void register_top_k_top_p_kernels(pybind11::module_& m);  // top_k_top_p_cpu.cpp

// The calling thread's OpenMP team shrinks to one thread and its idle workers exit: the
// server's main thread calls this once the engine thread has taken over, so that a stray
// parallel region there cannot start a second team (with more OpenMP threads than CPUs
// libgomp stops spinning workers between regions; see cpu_ops.run_in_passing_thread).
void release_thread_team() {
  omp_set_num_threads(1);
#pragma omp parallel
  {
  }
}

// Every kernel runs without the GIL (like torch's own ops): the server's event loop thread keeps
// answering HTTP and flushing streams while the engine thread is inside a long kernel call.
// Arguments are converted before the GIL is released and the result after it is re-taken.
#define kNoGil py::call_guard<py::gil_scoped_release>()

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, kNoGil, "paged decode attention (CPU, fp32)");
  m.def("paged_decode_attention_quant", &paged_decode_attention_quant, kNoGil,
        "paged decode attention over an int8 / fp8 cache with float16 scales (CPU)");
  m.def("paged_decode_attention_qkv", &paged_decode_attention_qkv, kNoGil,
        "write the new K/V of fused qkv decode rows into the cache, then paged decode attention");
  m.def(
      "decode_kv_prefetch_spans",
      [](const torch::Tensor& k_cache, const torch::Tensor& v_cache,
         const torch::Tensor& block_tables, const torch::Tensor& seq_lens, int64_t window,
         int64_t threads, int64_t budget) {
        const PrefetchPlan plan =
            decode_kv_prefetch(k_cache, v_cache, block_tables, seq_lens, window, threads, budget);
        const char* k = static_cast<const char*>(k_cache.data_ptr());
        const char* v = static_cast<const char*>(v_cache.data_ptr());
        std::vector<std::vector<std::tuple<int64_t, int64_t, int64_t>>> out;
        for (const auto& mine : plan.spans()) {
          out.emplace_back();
          for (const PrefetchSpan& s : mine) {
            const bool in_k = s.p >= k && s.p < k + k_cache.nbytes();
            out.back().emplace_back(in_k ? 0 : 1, s.p - (in_k ? k : v), s.bytes);
          }
        }
        return out;
      },
      "test hook: decode_kv_prefetch's spans as (0 = K / 1 = V pool, byte offset, bytes) per "
      "thread");
  m.def("quantize_into_cache", &quantize_into_cache, kNoGil,
        "quantize K or V rows and store values and float16 scales at their slots (CPU)");
  m.def("store_into_cache", &store_into_cache, kNoGil,
        "store fp32 K or V rows at their slots of an fp32 or float16 cache (CPU)");
  m.def("gemm_panel_width", &gemm_panel_width, kNoGil, "output columns per packed weight panel");
  m.def("pack_linear_weight", &pack_linear_weight, kNoGil,
        "pack an fp32 [N, K] weight into [N / NB, K, NB] panels for packed_linear");
  m.def("packed_linear", &packed_linear, kNoGil, "y = x @ W^T (+ bias) over a packed weight (CPU)");
  m.def("bf16_linear", &bf16_linear, kNoGil,
        "y = x @ W^T (+ bias) over a bf16 weight [N, K]: fp32 x below torch_rows rows, bf16 x "
        "through torch's bf16 matmul from torch_rows rows on (0: never); y fp32");
  m.def("bf16_linear_isa", &bf16_linear_isa, kNoGil,
        "the instructions of bf16_linear's kernel: avx512, avx2 or scalar");
  m.def("grouped_packed_linear", &grouped_packed_linear, kNoGil,
        "MoE experts in one call: rows of x sorted by expert (offsets [E + 1]) times their "
        "expert's packed weight [E, P, K, NB]");
  m.def("add_rms_norm_", &add_rms_norm_, kNoGil,
        "residual += x; x = rmsnorm(residual) * w, or * (1 + w) if gemma (in place)");
  m.def("rms_norm", &rms_norm, kNoGil, "rmsnorm(x) * w, or * (1 + w) if gemma");
  m.def("head_rms_norms_", &head_rms_norms_, kNoGil,
        "rms_norm over each q head (q_w) and k head (k_w) of fused qkv rows, in place");
  m.def("rotary_qk_", &rotary_qk_, kNoGil, "NeoX RoPE on the q and k heads of fused qkv rows (in place)");
  m.def("silu_mul", &silu_mul, kNoGil, "silu(gate) * up over fused [gate | up] rows");
  m.def("gelu_tanh_mul", &gelu_tanh_mul, kNoGil,
        "gelu(gate, approximate='tanh') * up over fused [gate | up] rows");
  m.def("release_thread_team", &release_thread_team, kNoGil,
        "the calling thread's OpenMP team: one thread from now on, idle workers released");
  register_gguf_kernels(m);
  register_a8_panel_kernels(m);
  register_prompt_tiles(m);
  register_decode_layers(m);
  register_varlen_attention(m);
  register_bf16_grouped_kernels(m);
  register_sampling_kernels(m);
  register_top_k_top_p_kernels(m);
}
