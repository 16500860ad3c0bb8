// Integer dot products of int8 activations with int8 weights, four k at a time, for the W8A8
// kernels (quant_w8a8_cpu.cpp: int8 per output channel; quant_a8_panels_cpu.cpp: GGUF Q8_0;
// both take VNNI's u8 x s8 the other way round, weights offset to u8, and this dot4 on AVX2
// and AVX-512 BW).
// Included inside each file's anonymous namespace, after <immintrin.h>, <cstdint> and
// <cstring>, with kVW (floats per vector) defined.
//
// Weights sit in panels [.., kNB columns, 4 k] (the 4 consecutive k of one column in one
// 32-bit lane); `dot4(acc, xquad, w)` adds x[k..k+3] . w[col][k..k+3] to each of kVW int32
// lanes. Sums are exact. x is stored
//   * AVX-512 VNNI: as u8 = q + 128 (vpdpbusd multiplies u8 x s8); the caller subtracts
//     128 * (the column's code sum) afterwards (kXOffset);
//   * AVX2 / AVX-512 BW without VNNI: as s8; |x| x sign(w, x) keeps maddubs' int16 pair sums
//     unsaturated (llama.cpp's trick).
#pragma once

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr const char* kInt8DotIsa = "avx512_vnni";
constexpr bool kXOffset = true;
constexpr int kMR8 = 8;
typedef __m512i acc8;
inline acc8 zero8() { return _mm512_setzero_si512(); }
inline void dot4(acc8& acc, int32_t xquad, const int8_t* w) {
  acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(xquad), _mm512_loadu_si512(w));
}
#elif defined(__AVX512BW__)
constexpr const char* kInt8DotIsa = "avx512bw";
constexpr bool kXOffset = false;
constexpr int kMR8 = 6;
typedef __m512i acc8;
inline acc8 zero8() { return _mm512_setzero_si512(); }
inline void dot4(acc8& acc, int32_t xquad, const int8_t* w) {
  const __m512i xb = _mm512_set1_epi32(xquad), wv = _mm512_loadu_si512(w);
  // sign(w, x): -w where x < 0 (where x == 0, |x| = 0 zeroes the product anyway)
  const __m512i ws = _mm512_mask_sub_epi8(wv, _mm512_movepi8_mask(xb), _mm512_setzero_si512(), wv);
  const __m512i p = _mm512_maddubs_epi16(_mm512_abs_epi8(xb), ws);
  acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)));
}
#elif defined(__AVX2__)
constexpr const char* kInt8DotIsa = "avx2";
constexpr bool kXOffset = false;
constexpr int kMR8 = 4;
typedef __m256i acc8;
inline acc8 zero8() { return _mm256_setzero_si256(); }
inline void dot4(acc8& acc, int32_t xquad, const int8_t* w) {
  const __m256i xb = _mm256_set1_epi32(xquad);
  const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(xb),
      _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), xb));
  acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
#else
constexpr const char* kInt8DotIsa = "scalar";
constexpr bool kXOffset = false;
constexpr int kMR8 = 4;
struct acc8 { int32_t v[kVW]; };
inline acc8 zero8() { return acc8{}; }
inline void dot4(acc8& acc, int32_t xquad, const int8_t* w) {
  int8_t xs[4];
  std::memcpy(xs, &xquad, 4);
  for (int j = 0; j < kVW; ++j)
    for (int t = 0; t < 4; ++t) acc.v[j] += int32_t(xs[t]) * int32_t(w[4 * j + t]);
}
#endif
static_assert(sizeof(acc8) == kVW * 4, "one int32 accumulator lane per panel column");
