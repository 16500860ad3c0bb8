// Rows of an 8-bit KV cache (int8, fp8 e4m3fn, fp8 e5m2) or a float16 one converted to fp32 and
// back, shared by the decode kernel (paged_attention_cpu.cpp) and the varlen kernel
// (varlen_attention_cpu.cpp). An 8-bit value is stored as value / scale with a float16 scale
// per token per KV head (pagedllm/model/layers/kv_quant.py); a float16 row has no scales
// (kScaled false): it is the fp32 row rounded to nearest, half the bytes of fp32.
#pragma once
#include "torch_lite_cpu.h"
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

// One float16 to fp32, exact (F16C's vcvtph2ps where the build has it: the portable bit
// manipulation cost ~5 ns per call, and a decode step converts two scales per token per head).
inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return c10::detail::fp16_ieee_to_fp32_value(h);
#endif
}

// Row<T>::load converts n stored values to fp32; the stored value is kMul times that.
// Row<T>::store is the quantizer's rounding of one already-scaled value.
template <typename T>
struct Row;

template <>
struct Row<int8_t> {
  static constexpr float kMul = 1.f, kMax = 127.f;
  static void load(const int8_t* s, float* d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    for (; i + 8 <= n; i += 8) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + i));
      _mm256_storeu_ps(d + i, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
    }
#endif
    for (; i < n; ++i) d[i] = static_cast<float>(s[i]);
  }
  static int8_t store(float y) {
    return static_cast<int8_t>(std::min(std::max(std::nearbyint(y), -kMax), kMax));
  }
};

// fp8 e5m2 is the high byte of a float16.
template <>
struct Row<c10::Float8_e5m2> {
  static constexpr float kMul = 1.f, kMax = 57344.f;
  static uint16_t bits(uint8_t x) { return static_cast<uint16_t>(x << 8); }
  static void load(const c10::Float8_e5m2* src, float* d, int64_t n) {
    const uint8_t* s = reinterpret_cast<const uint8_t*>(src);
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + i)));
      _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_slli_epi16(w, 8)));
    }
#endif
    for (; i < n; ++i) d[i] = half_to_float(bits(s[i]));
  }
  static c10::Float8_e5m2 store(float y) {
    return c10::Float8_e5m2(std::min(std::max(y, -kMax), kMax));
  }
};

// fp8 e4m3fn (exponent bias 7) moved into float16's bits (bias 15): sign to bit 15, exponent
// and mantissa to bits 13..7. That float16 is the value times 2^-8, subnormals included, so
// kMul = 256 (folded into the row's scale).
template <>
struct Row<c10::Float8_e4m3fn> {
  static constexpr float kMul = 256.f, kMax = 448.f;
  static uint16_t bits(uint8_t x) {
    return static_cast<uint16_t>(((x & 0x7F) << 7) | ((x & 0x80) << 8));
  }
  static void load(const c10::Float8_e4m3fn* src, float* d, int64_t n) {
    const uint8_t* s = reinterpret_cast<const uint8_t*>(src);
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
    const __m128i mag = _mm_set1_epi16(0x7F), sign = _mm_set1_epi16(0x80);
    for (; i + 8 <= n; i += 8) {
      const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + i)));
      const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, mag), 7),
                                     _mm_slli_epi16(_mm_and_si128(w, sign), 8));
      _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; ++i) d[i] = half_to_float(bits(s[i]));
  }
  static c10::Float8_e4m3fn store(float y) {
    return c10::Float8_e4m3fn(std::min(std::max(y, -kMax), kMax));
  }
};

// float16: the rounding of fp32 K / V (what torch's .to(float16) gives), no scale.
template <>
struct Row<c10::Half> {
  static constexpr float kMul = 1.f;
  static void load(const c10::Half* src, float* d, int64_t n) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
    for (; i < n; ++i) d[i] = half_to_float(s[i]);
  }
  static c10::Half store(float y) { return c10::Half(y); }
};

// Whether rows of T carry a scale per token per KV head (the 8-bit caches).
template <typename T>
constexpr bool kScaled = !std::is_same_v<T, float> && !std::is_same_v<T, c10::Half>;

// Calls run(T{}) with the element type of an 8-bit cache (int8, fp8 e4m3fn, fp8 e5m2).
template <typename F>
inline void dispatch_8bit(at::ScalarType dtype, const char* op, F&& run) {
  switch (dtype) {
    case at::kChar: run(int8_t{}); break;
    case at::kFloat8_e4m3fn: run(c10::Float8_e4m3fn{}); break;
    case at::kFloat8_e5m2: run(c10::Float8_e5m2{}); break;
    default: TORCH_CHECK(false, op, ": int8 or fp8 cache expected, got ", dtype);
  }
}

// Calls run(T{}) with the element type of an unscaled cache (fp32 or float16).
template <typename F>
inline void dispatch_16_32(at::ScalarType dtype, const char* op, F&& run) {
  switch (dtype) {
    case at::kFloat: run(float{}); break;
    case at::kHalf: run(c10::Half{}); break;
    default: TORCH_CHECK(false, op, ": fp32 or float16 cache (or an 8-bit one with scales) expected, got ", dtype);
  }
}
