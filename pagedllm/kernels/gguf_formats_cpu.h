// The GGUF block formats the GGUF kernels handle (quant_gguf_cpu.cpp: panels, exact;
// quant_a8_panels_cpu.cpp and prompt_tiles_cpu.cpp: int8-activation panels). Included inside
// each file's anonymous namespace, after <cstdint>.
//
// A weight is w = S (code - zero) + B, with S = d (x sub-scale for K types) per `group` values
// along K, and B (affine formats only) = m (Q4_1) or -dmin x sub-min (Q4_K).
#pragma once

enum Fmt : int64_t { kQ4_0 = 0, kQ4_1 = 1, kQ5_0 = 2, kQ8_0 = 3, kQ4_K = 4, kQ6_K = 5 };

// values and bytes of one GGUF block, bits per code, zero, values per scale along K, K-type
// (sub-scales in 256-value super-blocks), offset after scaling
template <int F> struct Traits;
template <> struct Traits<kQ4_0> { static constexpr int values = 32, bytes = 18, bits = 4, zero = 8, group = 32; static constexpr bool kq = false, affine = false; };
template <> struct Traits<kQ4_1> { static constexpr int values = 32, bytes = 20, bits = 4, zero = 0, group = 32; static constexpr bool kq = false, affine = true; };
template <> struct Traits<kQ5_0> { static constexpr int values = 32, bytes = 22, bits = 5, zero = 16, group = 32; static constexpr bool kq = false, affine = false; };
template <> struct Traits<kQ8_0> { static constexpr int values = 32, bytes = 34, bits = 8, zero = 0, group = 32; static constexpr bool kq = false, affine = false; };
template <> struct Traits<kQ4_K> { static constexpr int values = 256, bytes = 144, bits = 4, zero = 0, group = 32; static constexpr bool kq = true, affine = true; };
template <> struct Traits<kQ6_K> { static constexpr int values = 256, bytes = 210, bits = 6, zero = 32, group = 16; static constexpr bool kq = true, affine = false; };
constexpr int kSuper = 256;  // K-type super-block
