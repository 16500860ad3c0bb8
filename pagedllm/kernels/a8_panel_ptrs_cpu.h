// A GGUF panel matrix's tensors as plain pointers, and the one dispatch from a run-time panel
// format to the kernels' templates: shared by the int8-activation panels
// (quant_a8_panels_cpu.cpp) and their prompt rows' bf16 tiles (prompt_tiles_cpu.cpp).
// Included inside the kernel file's anonymous namespace, after simd_cpu.h (V, vload, f16x),
// gguf_formats_cpu.h (kQ8_0 ...), <type_traits> and the torch headers.
#pragma once

// Panel formats whose scales are fp32: Q4_K's sub-block scale d x sc and offset -dmin x m and
// Q6_K's d x sc are exact in fp32 (11 x 6 or 8 bits), not in the other formats' fp16 (the
// file's own scales). Scale arrays travel as uint16_t pointers to their bits either way;
// scale_at steps by whole scales.
template <int F> constexpr bool kF32Scales = F == kQ4_K || F == kQ6_K;
// Formats with an offset per block and column (w = d c + m): Q4_1, Q4_K.
template <int F> constexpr bool kAffine = F == kQ4_1 || F == kQ4_K;
// Scales per 32-value block and column: Q6_K's change every 16 values (d [P, K / 32, 2, kNB]:
// the block's two halves), the others' every 32.
template <int F> constexpr int kScalesPerBlock = F == kQ6_K ? 2 : 1;
template <int F>
inline const uint16_t* scale_at(const uint16_t* s, int64_t i) {
  return s + (kF32Scales<F> ? 2 : 1) * i;
}
inline bool affine_format(int64_t fmt) { return fmt == kQ4_1 || fmt == kQ4_K; }
inline bool f32_scale_format(int64_t fmt) { return fmt == kQ4_K || fmt == kQ6_K; }
inline int64_t scales_per_block(int64_t fmt) { return fmt == kQ6_K ? 2 : 1; }

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// A vector of scales (simd_cpu.h's V) from index i of a panel's scale array: fp16 bits
// converted, or Q4_K's / Q6_K's fp32.
template <int F>
inline V scale_v(const uint16_t* s, int64_t i) {
  if constexpr (kF32Scales<F>) return vload(reinterpret_cast<const float*>(s) + i);
  else return f16x(s + i);
}
#endif

// A panel matrix's storage as the kernels read it: codes, the scales d and the affine formats'
// offsets m (null for the others), fp16 or (Q4_K, Q6_K) fp32 bits.
struct PanelPtrs {
  const uint8_t* codes;
  const uint16_t *d, *m;
  PanelPtrs(int64_t fmt, const torch::Tensor& codes_, const torch::Tensor& d_,
            const torch::Tensor& m_)
      : codes(codes_.data_ptr<uint8_t>()), d(scale_bits(fmt, d_)),
        m(affine_format(fmt) ? scale_bits(fmt, m_) : nullptr) {}
  static const uint16_t* scale_bits(int64_t fmt, const torch::Tensor& t) {
    if (f32_scale_format(fmt)) return reinterpret_cast<const uint16_t*>(t.data_ptr<float>());
    return reinterpret_cast<const uint16_t*>(t.data_ptr<at::Half>());
  }
};

// f(std::integral_constant<int, F>{}) for the panel format fmt (Q8_0, Q4_0, Q4_K, Q6_K, else
// Q4_1): the kernels' one dispatch from a run-time format to their template.
template <typename Fn>
void with_format(int64_t fmt, Fn&& f) {
  if (fmt == kQ6_K) f(std::integral_constant<int, kQ6_K>{});
  else if (fmt == kQ8_0) f(std::integral_constant<int, kQ8_0>{});
  else if (fmt == kQ4_0) f(std::integral_constant<int, kQ4_0>{});
  else if (fmt == kQ4_K) f(std::integral_constant<int, kQ4_K>{});
  else f(std::integral_constant<int, kQ4_1>{});
}
