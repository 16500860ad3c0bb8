// The int8-activation panels (quant_a8_panels_cpu.cpp) on AMX-int8 tiles, 32 or 16 rows at a
// time: per 32-value block, TDPBSUD of 16 rows of s8 activations (tile A, one block wide) by a
// column half of the panel's u8 codes (tile B, 8 k-quads x 16 columns) into 16 x 16 int32
// tiles C, stored; then the blocks' epilogue on 16 fp32 accumulator vectors, instruction for
// instruction the VNNI micro-kernel's (same scales, same order): the two paths give the same
// bits, so rows may go either way whatever the batch. Q8_0's panel layout already is B tiles
// (lane rows of 4-byte column quads, u8 = s8 + 128 under VNNI); a 4-bit panel's nibbles are
// unpacked once per call into B tiles, shared by all of the call's row tiles.
//
// Measured, not the default: on a Sapphire Rapids class Xeon (2026-12-04, SmolLM2's layer
// GEMMs in Q4_1, docs/benchmarks.md) every schedule tried ran at 0.65-0.90x the VNNI path's
// speed: the file's per-32-value scales need each block's int32 tile stored and converted
// (one tile product of 8,192 multiply-adds against ~80 vector instructions of epilogue),
// and the tiles without that epilogue reach only 1.8-3.2x VNNI (a tile load pair per
// product). "auto" therefore leaves them off; PAGEDLLM_INT8_TILES=amx runs them.
//
// Built with AVX-512 VNNI (the epilogue is the VNNI path's, 16 columns a vector); the tiles
// are AMX's (HwTiles) in an AMX build, or the software model (EmuTiles) for tests anywhere.
// Included inside quant_a8_panels_cpu.cpp's anonymous namespace, after its micro-kernels.
#pragma once
#include <atomic>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "amx_tiles_cpu.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define PAGEDLLM_A8P_TILES 1
constexpr int64_t kTileRows = 16;

// Tiles 0-3: C (16 x 16 int32), row tile r and column half h in tile 2 r + h; 4 / 5: A (16
// rows x 32 s8) of row tiles 0 / 1; 6 / 7: B (8 k-quads x 16 columns x 4 u8) of halves 0 / 1.
// Per block, up to 4 products from 4 tile loads (each A and B tile serves two products).
constexpr TileConfig a8_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  for (int t = 4; t < 6; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 32;
  for (int t = 6; t < 8; ++t) cfg.rows[t] = 8, cfg.colsb[t] = 64;
  return cfg;
}
constexpr TileConfig kA8Tiles = a8_tile_config();  // built once, at compile time

// 64-byte aligned storage for the tile sums (the epilogue's aligned vector loads).
template <typename U>
struct AlignedAlloc {
  using value_type = U;
  AlignedAlloc() = default;
  template <typename W> AlignedAlloc(const AlignedAlloc<W>&) {}
  U* allocate(size_t n) { return static_cast<U*>(::operator new(n * sizeof(U), std::align_val_t(64))); }
  void deallocate(U* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <typename W> bool operator==(const AlignedAlloc<W>&) const { return true; }
  template <typename W> bool operator!=(const AlignedAlloc<W>&) const { return false; }
};

// Where block j's B tile of column half h starts, and its row stride.
struct BTiles {
  const uint8_t* base;
  int64_t block, half, stride;
  const uint8_t* at(int64_t j, int h) const { return base + j * block + h * half; }
};

// Panel pc's codes as B tiles: Q8_0's in place; 4-bit codes unpacked into a per-thread buffer
// [nb][2 halves][8 k-quads][16 columns][4] (lane u of a block holds codes 8u + b in its low
// nibbles, k-quad 2u, and 8u + 4 + b in its high nibbles, k-quad 2u + 1).
template <int F>
BTiles b_tiles(const uint8_t* pc, int64_t nb) {
  if constexpr (F == kQ8_0) {
    return {pc, 8 * kNB * 4, 64, kNB * 4};
  } else {
    thread_local std::vector<uint8_t> buf;
    buf.resize(static_cast<size_t>(nb) * 1024);
    for (int64_t j = 0; j < nb; ++j)
      for (int h = 0; h < 2; ++h)
        for (int u = 0; u < 4; ++u) {
          const VI w = iload(pc + (j * 4 + u) * kNB * 4 + h * 64);
          uint8_t* dst = buf.data() + ((j * 2 + h) * 8 + 2 * u) * 64;
          _mm512_storeu_si512(dst, nib_lo(w));
          _mm512_storeu_si512(dst + 64, nib_hi(w));
        }
    return {buf.data(), 1024, 512, 64};
  }
}

// sums[j][2 r + h] = block j's 16 x 16 int32 sums of row tile r < RT (x rows 16 r.., stride K)
// by column half h, for every block: the tile pass of tile_rows.
template <typename T, int RT>
inline void tile_sums(const int8_t* xq, int64_t K, const BTiles& bt, int64_t nb, int32_t* sums) {
  for (int64_t j = 0; j < nb; ++j, sums += RT * 2 * 256) {
    T::template zero<0>();
    T::template zero<1>();
    T::template load<4>(xq + 32 * j, K);
    T::template load<6>(bt.at(j, 0), bt.stride);
    T::template load<7>(bt.at(j, 1), bt.stride);
    T::template dpbsud<0, 4, 6>();
    T::template dpbsud<1, 4, 7>();
    if constexpr (RT == 2) {
      T::template zero<2>();
      T::template zero<3>();
      T::template load<5>(xq + 16 * K + 32 * j, K);
      T::template dpbsud<2, 5, 6>();
      T::template dpbsud<3, 5, 7>();
    }
    T::template store<0>(sums, 64);
    T::template store<1>(sums + 256, 64);
    if constexpr (RT == 2) {
      T::template store<2>(sums + 512, 64);
      T::template store<3>(sums + 768, 64);
    }
  }
}

// acc[r] += block j's part of row r, as micro<F, MR> adds it.
template <int F>
inline void tile_epilogue(V (&acc)[kTileRows], const int32_t* c, int64_t j, int64_t nb,
                          const float* dx, const int32_t* sq, const float* fq, V dv, V mv) {
#pragma GCC unroll 16  // acc stays in 16 registers
  for (int r = 0; r < kTileRows; ++r) {
    VI a = _mm512_load_si512(c + 16 * r);
    if constexpr (kZero<F> != 0) a = isub(a, iset(kZero<F> * sq[r * nb + j]));
    acc[r] = vfma(vcvt(a), vmul(dv, vset(dx[r * nb + j])), acc[r]);
    if constexpr (F == kQ4_1) acc[r] = vfma(mv, vset(fq[r * nb + j]), acc[r]);
  }
}

// 16 RT rows of quantized x over one panel (micro<F, MR>'s arguments, the panel as B tiles),
// in two passes: every block's tile sums into a per-thread buffer, then per row tile and column
// half the fp32 epilogue over the buffer with 16 accumulators in registers. The fastest of four
// schedules measured on the Xeon (docs/benchmarks.md), all of them below VNNI's speed.
template <int F, typename T, int RT>
__attribute__((noinline)) void tile_rows(const int8_t* xq, int64_t K, const float* dx,
                                         const int32_t* sq, const float* fq, int64_t nb,
                                         const BTiles& bt, const uint16_t* d, const uint16_t* mo,
                                         float* y, int64_t ldy, int64_t ncols) {
  thread_local std::vector<int32_t, AlignedAlloc<int32_t>> buf;
  buf.resize(static_cast<size_t>(nb) * RT * 2 * 256);
  tile_sums<T, RT>(xq, K, bt, nb, buf.data());
  for (int r0 = 0; r0 < RT; ++r0)
    for (int h = 0; h < 2 && 16 * h < ncols; ++h) {
      const int64_t rows = 16 * r0;
      V acc[kTileRows];
#pragma GCC unroll 16
      for (int r = 0; r < kTileRows; ++r) acc[r] = vzero();
      for (int64_t b = 0; b < nb; ++b) {
        const V dv = f16v(d + b * kNB + 16 * h);
        const V mv = F == kQ4_1 ? f16v(mo + b * kNB + 16 * h) : vzero();
        tile_epilogue<F>(acc, buf.data() + (b * RT * 2 + 2 * r0 + h) * 256, b, nb,
                         dx + rows * nb, sq + rows * nb, fq + rows * nb, dv, mv);
      }
      const int64_t n = std::min<int64_t>(16, ncols - 16 * h);
#pragma GCC unroll 16
      for (int r = 0; r < kTileRows; ++r) {
        float out[16];
        vstore(out, acc[r]);
        std::memcpy(y + (rows + r) * ldy + 16 * h, out, n * sizeof(float));
      }
    }
}

// tile_rows<F, T, RT> on rows m.. of qx (RT = 2: 32 rows, 1: 16) into y (row m's outputs).
template <int F, typename T, int RT>
void tile_rows_at(const QuantizedX& qx, int64_t m, const BTiles& bt, const uint16_t* pd,
                  const uint16_t* pm, float* y, int64_t ldy, int64_t ncols) {
  const int64_t K = qx.K, nb = qx.nblk;
  tile_rows<F, T, RT>(qx.q.data() + m * K, K, qx.d.data() + m * nb, qx.sum.data() + m * nb,
                      qx.f32.data() + m * nb, nb, bt, pd, pm, y, ldy, ncols);
}

// Rows [m, m + 16 k) of a panel call on tiles (y: row m's outputs, row stride ldy): returns
// the first row left for the VNNI rows.
template <int F>
int64_t tile_rows_of_panel(TileMode mode, const QuantizedX& qx, int64_t m, int64_t end,
                           const uint8_t* pc, const uint16_t* pd, const uint16_t* pm, float* y,
                           int64_t ldy, int64_t ncols) {
  if (mode == TileMode::kOff || end - m < kTileRows) return m;
  const BTiles bt = b_tiles<F>(pc, qx.nblk);
  const int64_t first = m;
  // 16 RT rows from m on the mode's tiles
  auto rows = [&](auto rt) {
    constexpr int RT = decltype(rt)::value;
    float* ym = y + (m - first) * ldy;
#if PAGEDLLM_HAVE_AMX
    if (mode == TileMode::kAmx) return tile_rows_at<F, HwTiles, RT>(qx, m, bt, pd, pm, ym, ldy, ncols);
#endif
    tile_rows_at<F, EmuTiles, RT>(qx, m, bt, pd, pm, ym, ldy, ncols);
  };
  for (; m + 2 * kTileRows <= end; m += 2 * kTileRows) rows(std::integral_constant<int, 2>{});
  if (m + kTileRows <= end) {
    rows(std::integral_constant<int, 1>{});
    m += kTileRows;
  }
  return m;
}
#else
#define PAGEDLLM_A8P_TILES 0
constexpr int64_t kTileRows = 16;
constexpr TileConfig kA8Tiles{};
template <int F, typename QX>
int64_t tile_rows_of_panel(TileMode, const QX&, int64_t m, int64_t, const uint8_t*,
                           const uint16_t*, const uint16_t*, float*, int64_t, int64_t) {
  return m;
}
#endif

// The tiles the kernels use (a TileMode): none until set_int8_tiles chooses some.
std::atomic<int> g_tile_mode{static_cast<int>(TileMode::kOff)};

TileMode tile_mode() { return static_cast<TileMode>(g_tile_mode.load(std::memory_order_relaxed)); }

// The tiles' name: "amx", "emulated" or "off".
std::string int8_tiles() { return tile_mode_name(tile_mode()); }

// Chooses the tiles ("auto": where they were measured faster than VNNI, so far nowhere: off;
// "amx"; "emulated"; "off"); a choice this build or kernel cannot run is a ValueError naming
// why. Returns the tiles now in use.
std::string set_int8_tiles(const std::string& name) {
  const TileMode mode = choose_tiles(
      "int8 tiles", name, PAGEDLLM_A8P_TILES && PAGEDLLM_HAVE_AMX,
      "these kernels were built without AMX-int8 (the CPU or PAGEDLLM_CPU_MARCH lacks "
      "amx_int8, or the build lacks AVX-512 VNNI)",
      PAGEDLLM_A8P_TILES, "the tile kernels need an AVX-512 VNNI build");
  g_tile_mode.store(static_cast<int>(mode), std::memory_order_relaxed);
  return int8_tiles();
}
