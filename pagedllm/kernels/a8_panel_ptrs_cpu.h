// A GGUF panel matrix's tensors as plain pointers, and the one dispatch from a run-time panel
// format to the kernels' templates: shared by the int8-activation panels
// (quant_a8_panels_cpu.cpp) and their prompt rows' bf16 tiles (prompt_tiles_cpu.cpp).
// Included inside the kernel file's anonymous namespace, after gguf_formats_cpu.h (kQ8_0 ...),
// <type_traits> and the torch headers.
#pragma once

// A panel matrix's storage as the kernels read it: codes, the fp16 scales d and Q4_1's fp16
// offsets m (null for the other formats).
struct PanelPtrs {
  const uint8_t* codes;
  const uint16_t *d, *m;
  PanelPtrs(int64_t fmt, const torch::Tensor& codes_, const torch::Tensor& d_,
            const torch::Tensor& m_)
      : codes(codes_.data_ptr<uint8_t>()), d(half_bits(d_)),
        m(fmt == kQ4_1 ? half_bits(m_) : nullptr) {}
  static const uint16_t* half_bits(const torch::Tensor& t) {
    return reinterpret_cast<const uint16_t*>(t.data_ptr<at::Half>());
  }
};

// f(std::integral_constant<int, F>{}) for the panel format fmt (Q8_0, Q4_0, else Q4_1): the
// kernels' one dispatch from a run-time format to their template.
template <typename Fn>
void with_format(int64_t fmt, Fn&& f) {
  if (fmt == kQ8_0) f(std::integral_constant<int, kQ8_0>{});
  else if (fmt == kQ4_0) f(std::integral_constant<int, kQ4_0>{});
  else f(std::integral_constant<int, kQ4_1>{});
}
