// SIMD vocabulary and the fp32 panel micro-kernel shared by the GGUF kernels
// (quant_gguf_cpu.cpp: weights in panels; the int8-activation panels) and the
// varlen attention kernel and the sampler (varlen_attention_cpu.cpp, sampling_cpu.cpp: lane
// masks and e^x).
// Included inside each file's anonymous namespace, after <immintrin.h>, <cstdint> and
// <cstring>, under that file's `#pragma GCC optimize` (no FMA contraction, no reassociation):
// every definition here is internal to the file that includes it.
//
// V is one vector of kVW floats (AVX-512: 16, AVX2: 8); a panel is kNB = 2 kVW output columns;
// kMR rows of x share one pass over a panel in the micro-kernels.
#pragma once

#if defined(__AVX512F__)
#define PAGEDLLM_GGUF_SIMD 1
constexpr int kVW = 16, kMR = 8;
using V = __m512;
using VI = __m512i;
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vset(float x) { return _mm512_set1_ps(x); }
inline V vzero() { return _mm512_setzero_ps(); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vcvt(VI a) { return _mm512_cvtepi32_ps(a); }
inline VI u8x(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VI i8x(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline V f16x(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline VI iset(int x) { return _mm512_set1_epi32(x); }
inline VI iand(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI ior(VI a, VI b) { return _mm512_or_si512(a, b); }
inline VI isub(VI a, VI b) { return _mm512_sub_epi32(a, b); }
inline VI iadd(VI a, VI b) { return _mm512_add_epi32(a, b); }
inline VI isrl4(VI a) { return _mm512_srli_epi32(a, 4); }
inline VI isll4(VI a) { return _mm512_slli_epi32(a, 4); }
inline VI isrlv(VI a, VI s) { return _mm512_srlv_epi32(a, s); }
inline VI lanes_times(int b) { return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(b)); }
inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V vfloor(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline V vpow2(V n) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23)); }
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PAGEDLLM_GGUF_SIMD 1
constexpr int kVW = 8, kMR = 6;
using V = __m256;
using VI = __m256i;
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V vset(float x) { return _mm256_set1_ps(x); }
inline V vzero() { return _mm256_setzero_ps(); }
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
inline V vcvt(VI a) { return _mm256_cvtepi32_ps(a); }
inline VI u8x(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline VI i8x(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline V f16x(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VI iset(int x) { return _mm256_set1_epi32(x); }
inline VI iand(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI ior(VI a, VI b) { return _mm256_or_si256(a, b); }
inline VI isub(VI a, VI b) { return _mm256_sub_epi32(a, b); }
inline VI iadd(VI a, VI b) { return _mm256_add_epi32(a, b); }
inline VI isrl4(VI a) { return _mm256_srli_epi32(a, 4); }
inline VI isll4(VI a) { return _mm256_slli_epi32(a, 4); }
inline VI isrlv(VI a, VI s) { return _mm256_srlv_epi32(a, s); }
inline VI lanes_times(int b) { return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(b)); }
inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }
inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V vfloor(V a) { return _mm256_floor_ps(a); }
inline V vpow2(V n) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)); }
#else
#define PAGEDLLM_GGUF_SIMD 0
constexpr int kVW = 8, kMR = 1;
#endif
constexpr int kNB = 2 * kVW;  // panel width: two vectors

#if PAGEDLLM_GGUF_SIMD
template <int MR>
inline void store_tile(V (&acc)[MR][2], float* y, int64_t ldy, int64_t ncols) {
  for (int i = 0; i < MR; ++i) {
    float out[kNB];
    vstore(out, acc[i][0]);
    vstore(out + kVW, acc[i][1]);
    std::memcpy(y + i * ldy, out, ncols * sizeof(float));
  }
}

// fp32 micro-kernel over a dequantized panel [K, NB] (gemm_cpu.cpp's chain). noinline: inlined
// into a caller's parallel lambda, GCC 12 stored all 2 x MR accumulators to the stack at
// every k; as a function of its own the loop keeps them in registers.
template <int MR>
__attribute__((noinline)) void micro_f(const float* x, int64_t ldx, const float* wp, int64_t K,
                                       float* y, int64_t ldy, int64_t ncols) {
  V acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vzero();
  for (int64_t k = 0; k < K; ++k) {
    const V w0 = vload(wp + k * kNB), w1 = vload(wp + k * kNB + kVW);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V xb = vset(x[i * ldx + k]);
      acc[i][0] = vfma(xb, w0, acc[i][0]);
      acc[i][1] = vfma(xb, w1, acc[i][1]);
    }
  }
  store_tile<MR>(acc, y, ldy, ncols);
}

template <int MR>
void tail_f(int rows, const float* x, int64_t ldx, const float* wp, int64_t K, float* y,
            int64_t ldy, int64_t ncols) {
  if constexpr (MR > 0) {
    if (rows == MR) return micro_f<MR>(x, ldx, wp, K, y, ldy, ncols);
    tail_f<MR - 1>(rows, x, ldx, wp, K, y, ldy, ncols);
  }
}

// Lane masks: AVX-512 mask registers, AVX2 all-ones / all-zeros lanes.
#if defined(__AVX512F__)
using M = __mmask16;
inline M vle(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
inline M mand(M a, M b) { return static_cast<M>(a & b); }
inline V vsel(M m, V x, V y) { return _mm512_mask_blend_ps(m, y, x); }
inline bool mall(M m) { return m == 0xFFFF; }
inline uint32_t mbits(M m) { return m; }  // lane i's bit i
#else
using M = __m256;
inline M vle(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LE_OQ); }
inline M mand(M a, M b) { return _mm256_and_ps(a, b); }
inline V vsel(M m, V x, V y) { return _mm256_blendv_ps(y, x, m); }
inline bool mall(M m) { return _mm256_movemask_ps(m) == 0xFF; }
inline uint32_t mbits(M m) { return static_cast<uint32_t>(_mm256_movemask_ps(m)); }
#endif

// e^x for the x <= 0 the softmax feeds it (a score minus its running max): Cody-Waite
// reduction x = n ln2 + r and Cephes' expf polynomial for e^r (relative error ~1e-7); x below
// -87 gives ~1e-38.
inline V vexp_le0(V x) {
  x = vmax(x, vset(-87.f));
  const V n = vfloor(vfma(x, vset(1.44269504088896341f), vset(0.5f)));
  V r = vfma(n, vset(-0.693359375f), x);
  r = vfma(n, vset(2.12194440e-4f), r);
  V p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  p = vfma(vmul(p, r), r, vadd(r, vset(1.f)));
  return vmul(p, vpow2(n));
}

#endif  // PAGEDLLM_GGUF_SIMD
