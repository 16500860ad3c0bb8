// Rows of x quantized per 32 values to int8, llama.cpp's q8 activations, for the GGUF kernels
// with int8 activations (quant_a8_panels_cpu.cpp). Included inside each
// file's anonymous namespace, after <ATen/Parallel.h>, <immintrin.h>, <cstdint>, <vector> and
// filled_cpu.h (its buffers are Filled); needs AVX2.
//
// Block j of row m: d = max|x| / 127, q = round-half-even(x / d) in [-127, 127], x ~ d q.
#pragma once


// Rows of x quantized per 32 values: q int8 [M, K], d [M, K / 32] the scales, and the
// scaled code sums of each 16 values, f [M, K / 16], and of each 32, f32 [M, K / 32]
// (d * sum(q): the offset terms (B - S * zero) * sum(x) need them), and the code sums of
// each 32, sum [M, K / 32] (an offset of the weight codes needs them).
struct QuantizedX {
  int64_t K, nblk;
  Filled<int8_t> q;
  Filled<float> d, f, f32;
  Filled<int32_t> sum;
};

inline int sum4(__m128i s) {
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// Storage for M rows of K values (K a multiple of 32), every element left for the quantizer.
inline QuantizedX alloc_quantized(int64_t M, int64_t K) {
  const int64_t nb = K / 32;
  return QuantizedX{K, nb, Filled<int8_t>(M * K), Filled<float>(M * nb), Filled<float>(M * 2 * nb),
                    Filled<float>(M * nb), Filled<int32_t>(M * nb)};
}

// Where the quantizer writes (QuantizedX's storage), as plain pointers the caller copies into
// its thread's locals: read through qx, the int8 stores (which may alias anything) made every
// block reload qx's pointers from the calling thread's stack, whose cache line that thread
// keeps writing: 7.6% of a 64-row decode step (perf, Zen 4).
struct QuantizedOut {
  int8_t* q;
  float *d, *f, *f32;
  int32_t* sum;
  int64_t K, nb;
  explicit QuantizedOut(QuantizedX& qx)
      : q(qx.q.data()), d(qx.d.data()), f(qx.f.data()), f32(qx.f32.data()), sum(qx.sum.data()),
        K(qx.K), nb(qx.nblk) {}
};

// Block j of row m (its 32 values at xp) into `o`. Every quantizer of these rows (quantize_x,
// the fused MLP's SiLU epilogue) runs this one body: the same codes and scales for the same
// values wherever they are computed.
__attribute__((always_inline)) inline void quantize_block(const float* xp, const QuantizedOut o,
                                                         int64_t m, int64_t j) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(xp + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 mx = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  mx = _mm_max_ps(mx, _mm_movehl_ps(mx, mx));
  mx = _mm_max_ss(mx, _mm_movehdup_ps(mx));
  const float amx = _mm_cvtss_f32(mx);
  const float d = amx / 127.f, inv = amx > 0.f ? 127.f / amx : 0.f;
  __m256i i32[4];
  for (int i = 0; i < 4; ++i)
    i32[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m256i p16a = _mm256_packs_epi32(i32[0], i32[1]), p16b = _mm256_packs_epi32(i32[2], i32[3]);
  const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), perm);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q + m * o.K + 32 * j), q8);
  // |q| <= 127, so maddubs(1, q) sums pairs exactly (it treats q as signed)
  const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q8), ones16);
  const int lo = sum4(_mm256_castsi256_si128(s32)), hi = sum4(_mm256_extracti128_si256(s32, 1));
  const int64_t nb = o.nb;
  o.d[m * nb + j] = d;
  o.f[m * 2 * nb + 2 * j] = d * static_cast<float>(lo);
  o.f[m * 2 * nb + 2 * j + 1] = d * static_cast<float>(hi);
  o.f32[m * nb + j] = d * static_cast<float>(lo + hi);
  o.sum[m * nb + j] = lo + hi;
}

QuantizedX quantize_x(const float* x, int64_t M, int64_t K) {
  QuantizedX qx = alloc_quantized(M, K);
  const QuantizedOut out(qx);
  // rows in parallel from 32 on (prefill); a decode step's few rows stay on this thread
  at::parallel_for(0, M, 32, [x, out](int64_t m_begin, int64_t m_end) {
    const QuantizedOut o = out;  // this thread's copy (QuantizedOut says why)
    for (int64_t m = m_begin; m < m_end; ++m)
      for (int64_t j = 0; j < o.nb; ++j) quantize_block(x + m * o.K + 32 * j, o, m, j);
  });
  return qx;
}
