// The int8-activation panels (quant_a8_panels_cpu.cpp) on AMX-int8 tiles, 16 rows at a time:
// per 32-value block, TDPBSUD of 16 rows of s8 activations (tile A, one block wide) by a
// column half of the panel's u8 codes (tile B, 8 k-quads x 16 columns) into a 16 x 16 int32
// tile C, stored; then the block's epilogue on 16 fp32 accumulator vectors, instruction for
// instruction the VNNI micro-kernel's (same scales, same order): the two paths give the same
// bits, so rows may go either way whatever the batch. Q8_0's panel layout already is B tiles
// (lane rows of 4-byte column quads, u8 = s8 + 128 under VNNI); a 4-bit panel's nibbles are
// unpacked once per call into B tiles, shared by all of the call's row tiles.
//
// The file's scale every 32 values makes each block's int32 sums leave the tiles (a store and
// an epilogue of a conversion, a multiply and two FMAs a vector), so the schedule decides the
// speed. Measured on a Sapphire Rapids class Xeon (docs/benchmarks.md): all blocks' sums
// stored, then the epilogues, 0.65-0.90x VNNI; one pass with block j + 1's product beside
// block j's epilogue, 1.00-1.12x at 64 rows (2026-12-06, session 34), but the store of
// block j + 1's sums sat right behind its product, so the tile unit waited out the product's
// latency every block (the samples of a profile sat after TILESTORED). Now (session 35) the
// products run a block further ahead: block j + 1's product is issued, then block j's store
// (its product issued a block earlier and done by now), then block j - 1's epilogue: 1.10-
// 1.25x VNNI at 64 rows by shape and format (2 threads), 1.03-1.18x at 32, 0.91-1.00x at 16;
// the offline run (64 x 128/128) 1.07x. So "auto" runs the tiles where the CPU has AMX-int8,
// for calls of kTileCallRows rows or more; PAGEDLLM_INT8_TILES=off keeps VNNI.
//
// Built with AVX-512 VNNI (the epilogue is the VNNI path's, 16 columns a vector); the tiles
// are AMX's (HwTiles) in an AMX build, or the software model (EmuTiles) for tests anywhere.
// Included inside quant_a8_panels_cpu.cpp's anonymous namespace, after its micro-kernels.
#pragma once
#include <atomic>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "amx_tiles_cpu.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define PAGEDLLM_A8P_TILES 1
constexpr int64_t kTileRows = 16;
// Rows from which a call's whole 16-row tiles take the tiles (fewer: all VNNI; at 16 rows
// the tiles ran 0.91-1.00x VNNI, at 32 1.03-1.18x).
constexpr int64_t kTileCallRows = 32;

// Tiles 0 / 3: C (16 x 16 int32) of sets 0 / 1; 4 / 5: A (16 rows x 32 s8); 6 / 7: B (8
// k-quads x 16 columns x 4 u8). Blocks alternate between the two sets, so a block's product
// need not wait for the previous block's sums to leave their tile. (Tiles 1 and 2 are
// configured, unused.)
constexpr TileConfig a8_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  for (int t = 4; t < 6; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 32;
  for (int t = 6; t < 8; ++t) cfg.rows[t] = 8, cfg.colsb[t] = 64;
  return cfg;
}
constexpr TileConfig kA8Tiles = a8_tile_config();  // built once, at compile time

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
    thread_local Filled<uint8_t> buf;  // 64-byte aligned: a tile row a cache line
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

// Block j's product of 16 rows by one column half into tile set S (C tile 3 S, A tile 4 + S,
// B tile 6 + S); its sums stay in C until a later store.
template <typename T, int S>
inline void block_product(const int8_t* xa, int64_t K, const uint8_t* b, int64_t stride) {
  T::template zero<3 * S>();
  T::template load<4 + S>(xa, K);
  T::template load<6 + S>(b, stride);
  T::template dpbsud<3 * S, 4 + S, 6 + S>();
}

// Tile set S's sums to c [16][16].
template <typename T, int S>
inline void block_store(int32_t* c) {
  T::template store<3 * S>(c, 64);
}

// 16 rows of quantized x over one panel, a column half at a time in one pass over the blocks,
// three blocks in flight: step j issues block j + 1's product (tile set (j + 1) % 2), stores
// block j's sums (set j % 2, issued a step earlier) to an L1 buffer of their own, and runs
// block j - 1's epilogue from the other buffer, while the out-of-order core overlaps the
// three. The 16 accumulator vectors stay in registers (the epilogue written out here: with the
// accumulators in an array passed to a helper by reference, GCC kept them in memory, ~1.3x
// slower in a loop of it).
template <int F, typename T>
__attribute__((noinline)) void tile_rows16(const int8_t* xq, int64_t K, const float* dx,
                                           const int32_t* sq, const float* fq, int64_t nb,
                                           const BTiles& bt, const uint16_t* d,
                                           const uint16_t* mo, float* y, int64_t ldy,
                                           int64_t ncols) {
  for (int h = 0; h < 2 && 16 * h < ncols; ++h) {
    alignas(64) int32_t c[2][256];
    V acc[kTileRows];
#pragma GCC unroll 16
    for (int r = 0; r < kTileRows; ++r) acc[r] = vzero();
    block_product<T, 0>(xq, K, bt.at(0, h), bt.stride);
    for (int64_t j = 0; j <= nb; ++j) {
      if (j + 1 < nb) {
        const int8_t* xa = xq + 32 * (j + 1);
        if (j % 2) block_product<T, 0>(xa, K, bt.at(j + 1, h), bt.stride);
        else block_product<T, 1>(xa, K, bt.at(j + 1, h), bt.stride);
      }
      if (j < nb) {
        if (j % 2) block_store<T, 1>(c[1]);
        else block_store<T, 0>(c[0]);
      }
      if (j == 0) continue;
      const int64_t e = j - 1;  // the block whose epilogue runs now
      const int32_t* cb = c[e % 2];
      const V dv = scale_v<F>(d, e * kNB + 16 * h);
      const V mv = kAffine<F> ? scale_v<F>(mo, e * kNB + 16 * h) : vzero();
#pragma GCC unroll 16
      for (int r = 0; r < kTileRows; ++r) {  // micro<F, MR>'s epilogue, instruction for instruction
        VI a = _mm512_load_si512(cb + 16 * r);
        if constexpr (kZero<F> != 0) a = isub(a, iset(kZero<F> * sq[r * nb + e]));
        acc[r] = vfma(vcvt(a), vmul(dv, vset(dx[r * nb + e])), acc[r]);
        if constexpr (kAffine<F>) acc[r] = vfma(mv, vset(fq[r * nb + e]), acc[r]);
      }
    }
    const int64_t n = std::min<int64_t>(16, ncols - 16 * h);
#pragma GCC unroll 16
    for (int r = 0; r < kTileRows; ++r) {
      if (n == 16) {
        vstore(y + r * ldy + 16 * h, acc[r]);
        continue;
      }
      float out[16];
      vstore(out, acc[r]);
      std::memcpy(y + r * ldy + 16 * h, out, n * sizeof(float));
    }
  }
}

// Rows [m, m + 16 k) of a panel call on tiles (y: row m's outputs, row stride ldy): returns
// the first row left for the VNNI rows. Q6_K, whose scale changes every 16 values, keeps
// VNNI: with half blocks as the tiles' units (a product, a store and an epilogue each; A 16
// x 16, B 4 k-quads) a prototype gave VNNI's bits at 0.81-0.88x its speed, 32-128 rows
// (Sapphire Rapids class, 2 threads, session 37).
template <int F>
int64_t tile_rows_of_panel(TileMode mode, const QuantizedX& qx, int64_t m, int64_t end,
                           const uint8_t* pc, const uint16_t* pd, const uint16_t* pm, float* y,
                           int64_t ldy, int64_t ncols) {
  if (kScalesPerBlock<F> != 1 || mode == TileMode::kOff || end - m < kTileRows) return m;
  const BTiles bt = b_tiles<F>(pc, qx.nblk);
  const int64_t K = qx.K, nb = qx.nblk;
  for (const int64_t first = m; m + kTileRows <= end; m += kTileRows) {
    float* ym = y + (m - first) * ldy;
    auto rows = [&](auto tiles) {
      tile_rows16<F, decltype(tiles)>(qx.q.data() + m * K, K, qx.d.data() + m * nb,
                                      qx.sum.data() + m * nb, qx.f32.data() + m * nb, nb, bt,
                                      pd, pm, ym, ldy, ncols);
    };
#if PAGEDLLM_HAVE_AMX
    if (mode == TileMode::kAmx) {
      rows(HwTiles{});
      continue;
    }
#endif
    rows(EmuTiles{});
  }
  return m;
}
#else
#define PAGEDLLM_A8P_TILES 0
constexpr int64_t kTileRows = 16;
constexpr int64_t kTileCallRows = 32;
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

// The tiles a call of `rows` rows runs its whole 16-row tiles on: the ones chosen now from
// kTileCallRows rows, else none (VNNI alone).
TileMode tiles_for_rows(int64_t rows) {
  return rows >= kTileCallRows ? tile_mode() : TileMode::kOff;
}

// The tiles' name: "amx", "emulated" or "off".
std::string int8_tiles() { return tile_mode_name(tile_mode()); }

// Chooses the tiles ("auto": AMX where this build, the CPU and the OS run it, else off; "amx";
// "emulated"; "off"); a choice this build or kernel cannot run is a ValueError naming why.
// Returns the tiles now in use.
std::string set_int8_tiles(const std::string& name) {
  const TileMode mode = choose_tiles(
      "int8 tiles", name, PAGEDLLM_A8P_TILES && PAGEDLLM_HAVE_AMX,
      "these kernels were built without AMX-int8 (the CPU or PAGEDLLM_CPU_MARCH lacks "
      "amx_int8, or the build lacks AVX-512 VNNI)",
      PAGEDLLM_A8P_TILES, "the tile kernels need an AVX-512 VNNI build", /*auto_amx=*/true);
  g_tile_mode.store(static_cast<int>(mode), std::memory_order_relaxed);
  return int8_tiles();
}
