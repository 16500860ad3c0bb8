// GGUF Q6_K weight rows against int8-quantized activations a whole 256-value super-block at a
// time, AVX-512BW or AVX2 (quant_gguf_a8_cpu.cpp includes this inside its anonymous
// namespace, after its helpers; its dot_rows<kQ6_K, MT> calls q6_k_rows).
//
// A super-block: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (one per 16
// values), fp16 d; value v = d sc[v / 16] (q - 32). The 32-value dot_rows of the other
// formats spends ~25 instructions a 32-value block on Q6_K (two scales per block, each turned
// to float, a scalar offset per half): ~10 GB/s at one row, a tenth of Gemma 3 270M's
// one-stream step for 4% of its bytes. Here, per 64 values and row:
//
//   p = maddubs(codes 0..63, x)               pairs of code x value         (int16, exact)
//   s = madd(p, scales as int16)              4 values x their scale        (int32, exact)
//   t += float(s) * dx (its 32-value block's x scale)
//
// and per super-block y += d t, y -= 32 d sum(sc x) through the activations' 16-value sums
// (QuantizedX::f): ~60 instructions for 256 values at one row (AVX2: ~90, 32 values a step).
#pragma once

#if defined(__AVX512BW__)

// Codes of 64 values a quarter: [0..63], [64..127] of each 128-value half h (the header's
// layout: ql[64 h + l] low nibble -> 128 h + l, its high nibble -> 128 h + 64 + l, qh[32 h + l]
// bits 2 t .. 2 t + 1 -> 128 h + 32 t + l).
inline void q6_k_codes(const uint8_t* bp, __m512i codes[4]) {
  const __m512i low4 = _mm512_set1_epi8(15), bits45 = _mm512_set1_epi8(0x30);
  // qh in both 256-bit halves; bits 0-1 / 2-3 to 4-5 (the first quarter's two 32-value
  // thirds), bits 4-5 / 6-7 (the second's): 16-bit shifts, the spill masked off
  const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i down = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  for (int h = 0; h < 2; ++h) {
    const __m512i ql = _mm512_loadu_si512(bp + 64 * h);
    const __m512i qh = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + 128 + 32 * h)));
    const __m512i hi_a = _mm512_and_si512(_mm512_sllv_epi16(qh, up), bits45);
    const __m512i hi_b = _mm512_and_si512(_mm512_srlv_epi16(qh, down), bits45);
    codes[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4), hi_a);
    codes[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), hi_b);
  }
}

template <int MT>
void q6_k_rows(const uint8_t* row, const QuantizedX& qx, int64_t m0, float* y, int64_t ldy) {
  const int64_t nb = qx.nblk, K = qx.K, nsb = K / 256;
  __m512 acc[MT], off[MT];
  for (int i = 0; i < MT; ++i) acc[i] = off[i] = _mm512_setzero_ps();
  // int16 scale lanes of quarter q: lane e (values 2e, 2e + 1 of the 64) -> sub-block 4q + e/8
  __m512i sidx[4];
  // dx lanes of quarter q: lane l (values 4l .. 4l + 3) -> 32-value block 2q + l/8
  __m512i didx[4];
  for (int q = 0; q < 4; ++q) {
    alignas(64) int16_t s[32];
    alignas(64) int32_t dl[16];
    for (int e = 0; e < 32; ++e) s[e] = static_cast<int16_t>(4 * q + e / 8);
    for (int l = 0; l < 16; ++l) dl[l] = 2 * q + l / 8;
    sidx[q] = _mm512_load_si512(s);
    didx[q] = _mm512_load_si512(dl);
  }
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* bp = row + sb * 210;
    const __m256i sc16 = _mm256_cvtepi8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(bp + 192)));
    const __m512i sc = _mm512_castsi256_si512(sc16);
    const __m512 d = _mm512_set1_ps(half(bp + 208));
    const __m512 scd = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(sc16)), d);
    __m512i codes[4], scq[4];
    q6_k_codes(bp, codes);
    for (int q = 0; q < 4; ++q) scq[q] = _mm512_permutexvar_epi16(sidx[q], sc);
#pragma GCC unroll 4
    for (int i = 0; i < MT; ++i) {
      const int64_t m = m0 + i;
      const int8_t* xp = qx.q.data() + m * K + 256 * sb;
      const __m512 dx = _mm512_castps256_ps512(_mm256_loadu_ps(qx.d.data() + m * nb + 8 * sb));
      __m512 t = _mm512_setzero_ps();
      for (int q = 0; q < 4; ++q) {
        const __m512i p = _mm512_maddubs_epi16(codes[q], _mm512_loadu_si512(xp + 64 * q));
        const __m512i s = _mm512_madd_epi16(p, scq[q]);
        t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(didx[q], dx), t);
      }
      acc[i] = _mm512_fmadd_ps(t, d, acc[i]);
      off[i] = _mm512_fmadd_ps(scd, _mm512_loadu_ps(qx.f.data() + m * 2 * nb + 16 * sb), off[i]);
    }
  }
  for (int i = 0; i < MT; ++i)
    y[i * ldy] = _mm512_reduce_add_ps(_mm512_fmadd_ps(off[i], _mm512_set1_ps(-32.f), acc[i]));
}

#else  // AVX2: 32 values a step, the same sums

// Codes of the super-block's eight 32-value blocks, in value order (q6_k_codes' layout).
inline void q6_k_codes(const uint8_t* bp, __m256i codes[8]) {
  const __m256i low4 = _mm256_set1_epi8(15), bits45 = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; ++h) {
    const __m256i ql0 = load256(bp + 64 * h), ql1 = load256(bp + 64 * h + 32);
    const __m256i qh = load256(bp + 128 + 32 * h);
    __m256i* c = codes + 4 * h;
    c[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4),
                           _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
    c[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                           _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
    c[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                           _mm256_and_si256(qh, bits45));
    c[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
  }
}

template <int MT>
void q6_k_rows(const uint8_t* row, const QuantizedX& qx, int64_t m0, float* y, int64_t ldy) {
  const int64_t nb = qx.nblk, K = qx.K, nsb = K / 256;
  __m256 acc[MT], off[MT];
  for (int i = 0; i < MT; ++i) acc[i] = off[i] = _mm256_setzero_ps();
  // int16 scale lanes of a block: lanes 0-7 its first 16 values' scale, 8-15 the second's
  const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* bp = row + sb * 210;
    const __m256i sc16 = _mm256_cvtepi8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(bp + 192)));
    const __m256 d = _mm256_set1_ps(half(bp + 208));
    const __m256 scd0 = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(sc16))), d);
    const __m256 scd1 = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(sc16, 1))), d);
    __m256i codes[8], scb[8];
    q6_k_codes(bp, codes);
    for (int b = 0; b < 8; ++b)  // the block's two scales (one int32 lane of sc16) spread
      scb[b] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(b)), pick);
#pragma GCC unroll 4
    for (int i = 0; i < MT; ++i) {
      const int64_t m = m0 + i;
      const uint8_t* xp = reinterpret_cast<const uint8_t*>(qx.q.data() + m * K + 256 * sb);
      const float* dx = qx.d.data() + m * nb + 8 * sb;
      __m256 t = _mm256_setzero_ps();
      for (int b = 0; b < 8; ++b) {
        const __m256i p = _mm256_maddubs_epi16(codes[b], load256(xp + 32 * b));
        const __m256i s = _mm256_madd_epi16(p, scb[b]);
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(dx + b), t);
      }
      acc[i] = _mm256_fmadd_ps(t, d, acc[i]);
      const float* f = qx.f.data() + m * 2 * nb + 16 * sb;
      off[i] = _mm256_fmadd_ps(scd0, _mm256_loadu_ps(f), off[i]);
      off[i] = _mm256_fmadd_ps(scd1, _mm256_loadu_ps(f + 8), off[i]);
    }
  }
  for (int i = 0; i < MT; ++i)
    y[i * ldy] = hsum(_mm256_fmadd_ps(off[i], _mm256_set1_ps(-32.f), acc[i]));
}

#endif
