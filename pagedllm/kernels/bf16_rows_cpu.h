// fp32 -> bf16 for AMX-bf16 tile operands and the aligned buffer they live in, shared by the
// GGUF panels' prompt rows (prompt_tiles_cpu.cpp) and the prompt rows' attention
// (varlen_tiles_cpu.h).
// Included inside the kernel file's anonymous namespace, after simd_cpu.h (AVX-512 builds)
// and torch_lite_cpu.h (TORCH_CHECK), <cstdlib> (std::aligned_alloc).
#pragma once

// bf16 values on 64-byte boundaries, so each 64-byte row of a tile is one cache line; grows,
// never shrinks (a thread's panel buffer is reused across calls).
class Bf16Buffer {
 public:
  Bf16Buffer() = default;
  Bf16Buffer(const Bf16Buffer&) = delete;
  Bf16Buffer& operator=(const Bf16Buffer&) = delete;
  ~Bf16Buffer() { std::free(p_); }
  uint16_t* reserve(int64_t n) {
    if (n > n_) {
      std::free(p_);
      p_ = static_cast<uint16_t*>(std::aligned_alloc(64, (n * 2 + 63) / 64 * 64));
      TORCH_CHECK(p_ != nullptr, "bf16 tile operands: out of memory for ", n, " bf16 values");
      n_ = n;
    }
    return p_;
  }

 private:
  uint16_t* p_ = nullptr;
  int64_t n_ = 0;
};

#if defined(__AVX512F__) && defined(__AVX512BW__)
// bf16 bits of 16 floats (round to nearest even; NaN -> 0x7fc0, as torch rounds) in the low
// half of each 32-bit lane.
inline VI bf16_bits(V x) {
  const VI u = _mm512_castps_si512(x);
  const VI lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), iset(1));
  const VI r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(iset(0x7fff), lsb)), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, iset(0x7fffffff)), iset(0x7f800000));
  return _mm512_mask_blend_epi32(nan, r, iset(0x7fc0));
}

#if defined(__AVX512BF16__)
// One B tile row: column n's bf16 pair (even k, odd k) in lane n. VCVTNE2PS2BF16 rounds both
// vectors (to nearest even, as bf16_bits) into [even 0-15 | odd 0-15]; one word permute
// interleaves them: 2 instructions where bf16_bits takes 8 a vector (the prompt tiles
// dequantize every panel per call with it).
inline VI pair_row(V even, V odd) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const VI both = reinterpret_cast<VI>(_mm512_cvtne2ps_pbh(odd, even));
  return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), both);
}

// 16 floats as 16 bf16 values at dst.
inline void store_bf16(uint16_t* dst, V x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
}

// 32 floats (lo, then hi) as 32 bf16 values in order, one vector.
inline VI bf16_32(V lo, V hi) { return reinterpret_cast<VI>(_mm512_cvtne2ps_pbh(hi, lo)); }
#else
// One B tile row: column n's bf16 pair (even k, odd k) in lane n.
inline VI pair_row(V even, V odd) {
  return _mm512_or_si512(bf16_bits(even), _mm512_slli_epi32(bf16_bits(odd), 16));
}

// 16 floats as 16 bf16 values at dst.
inline void store_bf16(uint16_t* dst, V x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(bf16_bits(x)));
}

// 32 floats (lo, then hi) as 32 bf16 values in order, one vector.
inline VI bf16_32(V lo, V hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(bf16_bits(lo))),
                            _mm512_cvtepi32_epi16(bf16_bits(hi)), 1);
}
#endif
#endif
