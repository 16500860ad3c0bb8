// GGUF Q8_0 / Q4_0 / Q4_1 matrices in the int8-activation panels (quant_a8_panels_cpu.cpp's
// layout, the default path's weights) times a step's prompt rows on AMX-bf16 tiles.
//
// Why: on a Sapphire Rapids class Xeon the int8 panels prefill at about half the speed of
// oneDNN's AMX-bf16 matmul over bf16 weights (2026-12-04: 1,406 against 2,389 tok/s through the
// engine), and AMX-int8 tiles do not help them: the file's scale every 32 values costs an fp32
// epilogue per tile product (docs/benchmarks.md). Weights dequantized to bf16 carry their
// scales, so a tile sum runs over all of K with no epilogue. The weights stay quantized in
// memory: each thread dequantizes one panel (32 output columns x K) at a time into B tiles and
// runs every row of the call through it (a 512-token prompt reuses each panel 512 times).
//
//   x rows  -> bf16 [Mp, K] (RNE; rows past M are zero)              tiles 4 / 5: A, 16 rows x 32
//   panel p -> bf16 B tiles [K / 32][2 halves][16 k-pairs][16 col][2]  tiles 6 / 7: B
//   C[16 r + i][16 h + n] += sum_k A[i][k] B[k][n]   (TDPBF16PS)     tiles 0-3: C, 16 x 16 fp32
//
// A row's result is the same sequence of tile products whichever other rows share its call
// (lanes of a tile are independent): prompt rows are batch-invariant among themselves. They
// are not bit-equal to the int8 path, so the engine sends a row here by what it is (a prompt
// position: pagedllm/model/layers/quant/prompt_rows.py), never by the size of its batch.
//
// HwTiles (an AMX-bf16 build: -march=native on Sapphire Rapids on) or EmuTiles (the software
// model: tests on any AVX-512 build) run the tiles; PAGEDLLM_PROMPT_TILES chooses
// (kernels/cpu_features.py). AVX-512 BW builds only (the dequantization's vectors).
#include <torch/csrc/utils/pybind.h>  // register_prompt_tiles(m): pybind11, Tensor casters
#include "torch_lite_cpu.h"
#include "kernels_cpu.h"  // check_a8_panel_weight
#include "balanced_for_cpu.h"  // balanced_for: threads that finish together
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#pragma GCC push_options
// d * code + m in two roundings, as the panels' exact rows (a8_panel_rows) compute them; sums
// in the tiles' order
#pragma GCC optimize("no-associative-math", "fp-contract=off")

namespace {
#include "simd_cpu.h"

#include "gguf_formats_cpu.h"
#include "int8_dot_cpu.h"  // kXOffset: Q8_0 codes stored + 128 under VNNI
#include "amx_tiles_cpu.h"
#include "bf16_rows_cpu.h"
#include "a8_panel_ptrs_cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define PAGEDLLM_PROMPT_TILES 1
static_assert(kNB == 32, "an AVX-512 panel is two 16-column halves");

// Tiles 0-3: C, row tile r (of two) and column half h in tile 2 r + h; 4 / 5: A of row tiles
// 0 / 1; 6 / 7: B of halves 0 / 1. All 16 rows x 64 bytes.
constexpr TileConfig bf16_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  return cfg;
}
constexpr TileConfig kBf16Tiles = bf16_tile_config();

// 4-byte lanes per block in a panel: Q8_0's and Q6_K's 32 codes, or a 4-bit block's two
// nibbles a byte.
template <int F> constexpr int kLanes = F == kQ8_0 || F == kQ6_K ? 8 : 4;

// Weights of one column half from 16 integer codes: d * (code - z), or d * code + m (Q4_1,
// Q4_K) (Q6_K: code_of has taken its 32 off).
template <int F>
inline V weights(VI codes, V dv, V mv) {
  constexpr int z = F == kQ4_0 ? 8 : 0;
  const V w = _mm512_mul_ps(vcvt(_mm512_sub_epi32(codes, iset(z))), dv);
  return kAffine<F> ? _mm512_add_ps(w, mv) : w;
}

// Byte b of each 32-bit lane of w as a code: 4-bit (low or high nibble), Q8_0's s8 (stored
// + 128 under VNNI, else as s8 bytes) or Q6_K's q - 32 (stored as q).
template <int F>
inline VI code_of(VI w, int b, bool high) {
  // byte b as u8, less what the layout added
  auto less = [&](int z) {
    return _mm512_sub_epi32(_mm512_and_si512(_mm512_srlv_epi32(w, iset(8 * b)), iset(255)),
                            iset(z));
  };
  if constexpr (F == kQ6_K) {
    return less(32);
  } else if constexpr (F == kQ8_0) {
    if constexpr (kXOffset) return less(128);
    return _mm512_srai_epi32(_mm512_sllv_epi32(w, iset(24 - 8 * b)), 24);
  } else {
    return _mm512_and_si512(_mm512_srlv_epi32(w, iset(8 * b + (high ? 4 : 0))), iset(15));
  }
}

// Panel pc (nb blocks) as bf16 B tiles in buf [nb][2][16][16][2]: pair row t of block j holds
// k = 2t, 2t + 1 of the block. Q8_0 lane g holds codes 4g .. 4g + 3 (pair rows 2g, 2g + 1);
// a 4-bit lane u holds 8u + b in its low nibbles and 8u + 4 + b in its high ones (pair rows
// 4u, 4u + 1 and 4u + 2, 4u + 3). The scale goes into the bf16 values, so Q6_K's scale every
// 16 values (lanes 0-3, 4-7) is only another scale vector.
template <int F>
void dequantize_panel(const uint8_t* pc, const uint16_t* pd, const uint16_t* pm, int64_t nb,
                      uint16_t* buf) {
  constexpr int lanes = kLanes<F>, H = kScalesPerBlock<F>;
  for (int64_t j = 0; j < nb; ++j)
    for (int h = 0; h < 2; ++h) {
      V dv = scale_v<F>(pd, j * H * kNB + 16 * h);
      const V mv = kAffine<F> ? scale_v<F>(pm, j * kNB + 16 * h) : vzero();
      uint16_t* tile = buf + (j * 2 + h) * 512;
      for (int g = 0; g < lanes; ++g) {
        if (H == 2 && g == lanes / 2) dv = scale_v<F>(pd, (j * H + 1) * kNB + 16 * h);
        const VI w = _mm512_loadu_si512(pc + ((j * lanes + g) * kNB + 16 * h) * 4);
        auto put = [&](int row, bool high, int b) {
          const V even = weights<F>(code_of<F>(w, b, high), dv, mv);
          const V odd = weights<F>(code_of<F>(w, b + 1, high), dv, mv);
          _mm512_storeu_si512(tile + row * 32, pair_row(even, odd));
        };
        if constexpr (F == kQ8_0 || F == kQ6_K) {
          put(2 * g, false, 0);
          put(2 * g + 1, false, 2);
        } else {
          put(4 * g, false, 0);
          put(4 * g + 1, false, 2);
          put(4 * g + 2, true, 0);
          put(4 * g + 3, true, 2);
        }
      }
    }
}

// Rows as A tiles: bf16 [Mp / 16][K / 32][16 rows][32 values], each tile's 1 KB contiguous
// (tile loads of one stride-64 run, not 16 rows K apart). Row tile t starts at t * 16 K, so
// rows m.. of the layout (m a multiple of 16) start at m * K as in a row-major matrix.
inline uint16_t* tile_row(uint16_t* base, int64_t m, int64_t K) {
  return base + (m / 16) * 16 * K + (m % 16) * 32;
}

// Row `src` (K fp32 values) into the A tiles' row at dst (tile_row), rounded to nearest even.
inline void put_row(uint16_t* dst, const float* src, int64_t K) {
  for (int64_t k = 0; k < K; k += 32) {
    store_bf16(dst + 16 * k, vload(src + k));
    store_bf16(dst + 16 * k + 16, vload(src + k + 16));
  }
}

// Zeroes the A tiles' row at dst (a padding row past M).
inline void zero_row(uint16_t* dst, int64_t K) {
  for (int64_t k = 0; k < K; k += 32) std::memset(dst + 16 * k, 0, 32 * sizeof(uint16_t));
}

// x [M, K] fp32 -> A tiles of Mp rows (tile_row), rows M .. Mp - 1 zero.
void rows_to_bf16(const float* x, int64_t M, int64_t Mp, int64_t K, uint16_t* out) {
  at::parallel_for(0, Mp, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      if (m >= M)
        zero_row(tile_row(out, m, K), K);
      else
        put_row(tile_row(out, m, K), x + m * K, K);
    }
  });
}

// Lines a later pass will use, asked for a share at each of this pass's nb steps: output lines
// it will write (PREFETCHW, rows_of / tile_rows_of), so they are in L1 by the time that pass
// stores its tiles, or a kept panel it will read (panel_share). Without the first, each
// of a pass's 64 line stores waited for its line to be read first (the output outgrows L2
// beside the rows and panels): on a Sapphire Rapids class Xeon the stores took 35-60% of the
// loop's time (K 576 x N 960 x 320 rows, one core: 1,055 GF/s with plain stores, 1,722 with
// the lines asked for, 2,116 with no output at all); a 512-token prefill 1.05x.
struct LinesAhead {
  const char* base = nullptr;  // null: nothing to ask for
  int64_t lines = 0, per_group = 1, group_stride = 0, per_step = 0;

  LinesAhead() = default;
  // `rows` rows of a 32-column panel's fp32 output at y (row stride ldy): two lines a row.
  static LinesAhead rows_of(float* y, int64_t ldy, int64_t rows, int64_t nb) {
    return LinesAhead(y, 2 * rows, 2, ldy * 4, nb);
  }
  // Rows m .. m + rows - 1 of one 32-value block of A tiles (tile_row; `at` = the block's
  // row m): a line a row, 16 rows (1 KB) together, a row tile every 16 K values.
  static LinesAhead tile_rows_of(uint16_t* at, int64_t K, int64_t rows, int64_t nb) {
    return LinesAhead(at, rows, 16, 16 * K * 2, nb);
  }
  // Pass `pass` of `passes`' share of a kept panel (nb blocks of B tiles at p) to be read
  // (PREFETCHT1: into L2, the panel's first pass loads its tiles from there); null p: none.
  static LinesAhead panel_share(const uint16_t* p, int64_t nb, int64_t pass, int64_t passes) {
    if (!p) return LinesAhead();
    const int64_t lines = nb * 32, first = pass * lines / passes;
    LinesAhead o(reinterpret_cast<const char*>(p) + first * 64,
                 (pass + 1) * lines / passes - first, 1, 64, nb);  // a line a group: contiguous
    o.read = true;
    return o;
  }
  // Pass step j's share of the lines.
  void step(int64_t j) const {
    for (int64_t l = j * per_step; base && l < std::min(lines, (j + 1) * per_step); ++l) {
      const char* p = base + (l / per_group) * group_stride + (l % per_group) * 64;
      if (read)
        asm volatile("prefetcht1 %0" ::"m"(*p));
      else
        asm volatile("prefetchw %0" ::"m"(*p));  // GCC 12 dropped __builtin_prefetch(p, 1) here
    }
  }

 private:
  bool read = false;
  LinesAhead(const void* p, int64_t n, int64_t group, int64_t stride, int64_t nb)
      : base(static_cast<const char*>(p)), lines(std::max<int64_t>(0, n)), per_group(group),
        group_stride(stride), per_step((std::max<int64_t>(0, n) + nb - 1) / nb) {}
};

// No vector work between a tile pass's steps.
struct NoWork {
  void operator()(int64_t) const {}
};

// Rows m .. m + 16 RT - 1 of xa times one dequantized panel (bt, nb blocks) into y (row
// stride ldy): the four C tiles stay in their registers over all of K; `next` (the output
// lines of the pass after this one) and `ahead` (a share of the next panel) asked for as it
// goes, and `between(j)` after step j's products: vector work of the caller's that the core
// runs while the matrix unit works on them.
template <typename T, int RT, typename Between = NoWork>
void tile_pass(const uint16_t* xa, int64_t K, const uint16_t* bt, int64_t nb, float* y,
               int64_t ldy, int64_t ncols, const LinesAhead& next = LinesAhead(),
               const LinesAhead& ahead = LinesAhead(), Between&& between = Between()) {
  T::template zero<0>();
  T::template zero<1>();
  if constexpr (RT == 2) {
    T::template zero<2>();
    T::template zero<3>();
  }
  for (int64_t j = 0; j < nb; ++j) {
    next.step(j);
    ahead.step(j);
    T::template load<4>(xa + 512 * j, 64);
    T::template load<6>(bt + (2 * j) * 512, 64);
    T::template load<7>(bt + (2 * j + 1) * 512, 64);
    T::template dpbf16ps<0, 4, 6>();
    T::template dpbf16ps<1, 4, 7>();
    if constexpr (RT == 2) {
      T::template load<5>(xa + 16 * K + 512 * j, 64);
      T::template dpbf16ps<2, 5, 6>();
      T::template dpbf16ps<3, 5, 7>();
    }
    between(j);
  }
  auto out = [&](auto tile, int r, int h) {
    constexpr int C = decltype(tile)::value;
    if (ncols == kNB) return T::template store<C>(y + 16 * r * ldy + 16 * h, ldy * 4);
    alignas(64) float tmp[16][16];  // a partial panel: its own columns only
    T::template store<C>(tmp, 64);
    const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, ncols - 16 * h));
    for (int i = 0; i < 16; ++i) std::memcpy(y + (16 * r + i) * ldy + 16 * h, tmp[i], n * 4);
  };
  out(std::integral_constant<int, 0>{}, 0, 0);
  out(std::integral_constant<int, 1>{}, 0, 1);
  if constexpr (RT == 2) {
    out(std::integral_constant<int, 2>{}, 1, 0);
    out(std::integral_constant<int, 3>{}, 1, 1);
  }
}

// Rows 0 .. Mp - 1 of xa through one panel into y, 32 rows a pass; each pass asks for the next
// pass's output lines (the last one for `after`: the next panel's first pass, or nothing) and
// for its share of `upcoming`, the next panel's kept B tiles (or null).
template <typename T>
void panel_rows(const uint16_t* xa, int64_t Mp, int64_t K, const uint16_t* bt, int64_t nb,
                float* y, int64_t ldy, int64_t ncols, const LinesAhead& after = LinesAhead(),
                const uint16_t* upcoming = nullptr) {
  const int64_t passes = (Mp + 31) / 32;
  auto ahead = [&](int64_t m) { return LinesAhead::panel_share(upcoming, nb, m / 32, passes); };
  const bool full = ncols == kNB;  // a partial panel stores through a buffer of its own
  auto next = [&](int64_t m) {
    if (!full) return LinesAhead();
    if (m >= Mp) return after;
    return LinesAhead::rows_of(y + m * ldy, ldy, std::min<int64_t>(32, Mp - m), nb);
  };
  int64_t m = 0;
  for (; m + 32 <= Mp; m += 32)
    tile_pass<T, 2>(xa + m * K, K, bt, nb, y + m * ldy, ldy, ncols, next(m + 32), ahead(m));
  if (m < Mp) tile_pass<T, 1>(xa + m * K, K, bt, nb, y + m * ldy, ldy, ncols, next(Mp), ahead(m));
}

// A panel-layout matrix of format F whose panels are B tiles of nb blocks: kept (`tiles`, every
// panel's, a8_panel_bf16_tiles) or dequantized when a call needs them.
template <int F>
struct Panels {
  const uint8_t* codes;
  const uint16_t* d;
  const uint16_t* m;  // Q4_1's / Q4_K's offsets, else null
  int64_t nb;
  const uint16_t* tiles;  // null: dequantize per call
  int64_t values() const { return nb * 1024; }  // bf16 values of one panel's B tiles
  void dequantize(int64_t p, uint16_t* buf) const {
    dequantize_panel<F>(codes + p * nb * kLanes<F> * kNB * 4,
                        scale_at<F>(d, p * nb * kScalesPerBlock<F> * kNB),
                        m ? scale_at<F>(m, p * nb * kNB) : nullptr, nb, buf);
  }
  // Panel p's B tiles: the kept ones, or dequantized into buf.
  const uint16_t* panel(int64_t p, uint16_t* buf) const {
    if (tiles) return tiles + p * values();
    dequantize(p, buf);
    return buf;
  }
};

// Bytes of x rows (bf16) one pass over a thread's panels keeps in its L2 (2 MB a core on a
// Sapphire Rapids class Xeon), and bytes of dequantized panels a thread holds at once.
constexpr int64_t kChunkBytes = 384 << 10;
constexpr int64_t kGroupBytes = 4 << 20;

// Rows a thread from which the tile GEMMs over kept tiles split a call's rows instead of its
// panels: each thread reads every panel (from L3, asked for ahead) but only its own rows,
// where split by panels each thread read every row, half of them written by the other core.
// SmolLM2 Q4_1, 2 threads, Sapphire Rapids class VM, one process alternating the splits:
// prefill 384 tokens (192 rows a thread) 1.065x, 448 1.056x, 512 1.05x, 600 1.03x, 2,000
// 1.02x; 352 (176 a thread) 1.04x, 320 (160) 0.975x, 256 (128) 0.95x.
constexpr int64_t kRowSplitRows = 192;

// The loop of both tile GEMMs: `items` (each W panels: panel_of(i, w)) split among the
// threads over Mp rows of K values. A thread takes a group of its items' B tiles (all of its
// items when the matrix keeps its tiles; else as many as kGroupBytes holds, dequantized),
// then runs the rows through them a chunk at a time: body(tiles, i, the item's W panels, m0,
// rows) for each item of the group and chunk of rows (at most kChunkBytes, kept in L2 while
// the group passes over it; each panel stays in L1 over the chunk's rows). Streaming all
// rows past each panel in turn read them from L3 once per panel as soon as they outgrew L2
// (a 512-token prompt at K = 1,536, 2,048 rows at K = 576): 0.5-0.7x oneDNN's bf16 matmul
// there, 0.8-0.9x the chunked loop's time; chunks of 1 MB ran as fast as 384 KB through the
// engine and up to 2x slower alone while the machine's other tenants were busy. A row's sums
// are the same tile products in the same order whatever the chunk and group sizes.
template <int W, int F, typename PanelOf, typename Body>
void tile_items(const Panels<F>& w, int64_t items, PanelOf panel_of, int64_t Mp, int64_t K,
                TileMode mode, Body body) {
  const int64_t pv = w.values();
  const int64_t chunk = std::max<int64_t>(32, kChunkBytes / (K * 2) / 32 * 32);
  const int64_t chunks = (Mp + chunk - 1) / chunk;
  struct Unit {
    int64_t item, m0, rows;
    int64_t g0 = 0, gs = 0;  // split by panels: the item's group [g0, g0 + gs) of its share
  };
  // Kept tiles: the W panels of `item` into out (no dequantization).
  auto kept = [&](int64_t item, const uint16_t** out) {
    for (int k = 0; k < W; ++k) out[k] = w.panel(panel_of(item, k), nullptr);
  };
  // Kept tiles: the panels of this thread's next unit when it is another item, asked for
  // while this one runs (null otherwise); a panel read from memory at its first pass stalled
  // the tiles (512-token prefill 1.03-1.04x, 2,000 tokens 1.005x, same bits).
  auto upcoming_of = [&](const BalancedTurn& turn, int64_t item, auto unit_of,
                         const uint16_t** out) {
    std::fill(out, out + W, nullptr);
    const int64_t v = w.tiles ? turn.peek() : -1;
    if (v < 0) return;
    if (const int64_t next = unit_of(v).item; next != item) kept(next, out);
  };
  if (const int64_t T = at::get_num_threads(); w.tiles && T > 1 && Mp >= kRowSplitRows * T) {
    // Kept tiles and a long prompt: thread t owns rows [t rpt, (t + 1) rpt) (about
    // rows_to_bf16's split, so it reads the A rows it wrote and writes the output rows the
    // next kernels give it) x every item, a chunk of its rows at a time, items in turn.
    const int64_t rpt = (Mp + 32 * T - 1) / (32 * T) * 32, c = std::min(chunk, rpt);
    const int64_t cpt = (rpt + c - 1) / c;  // chunks a thread
    auto unit_of = [&](int64_t u) {
      const int64_t t = u / (cpt * items), l = u % (cpt * items), m0 = t * rpt + (l / items) * c;
      return Unit{l % items, m0, std::min({c, (t + 1) * rpt - m0, Mp - m0})};
    };
    WorkShares units(T * cpt * items, T, cpt * items, true);
    balanced_for(units, [&](BalancedTurn& turn) {
      const TileScope scope(mode, kBf16Tiles);
      with_bf16_tiles(mode, [&](auto tiles) {
        for (int64_t u; (u = turn.next()) >= 0;) {
          const Unit n = unit_of(u);
          if (n.rows <= 0) continue;  // past Mp: the last threads' shares may end early
          const uint16_t *pan[W], *upcoming[W];
          kept(n.item, pan);
          upcoming_of(turn, n.item, unit_of, upcoming);
          body(tiles, n.item, pan, n.m0, n.rows, upcoming);
        }
      });
    });
    return;
  }
  // dequantized, one chunk: each item straight from its dequantization (in L1) over every row
  const int64_t group = w.tiles ? items
                        : Mp <= chunk ? 1
                                      : std::max<int64_t>(1, kGroupBytes / (W * pv * 2));
  // Units of work: (item, chunk of rows). Thread t owns items [t share, (t + 1) share) and
  // runs their units group by group, chunk by chunk within a group, item by item within a
  // chunk; a thread done with its own takes another's units from the back (balanced_for_cpu.h).
  const int64_t threads = balanced_threads(items), share = (items + threads - 1) / threads;
  auto unit_of = [&](int64_t u) {
    const int64_t o0 = u / (share * chunks) * share, l = u - o0 * chunks;
    const int64_t gi = l / (group * chunks), g0 = o0 + gi * group;
    const int64_t gs = std::min(group, std::min(items, o0 + share) - g0);
    const int64_t r = l - gi * group * chunks, m0 = (r / gs) * chunk;
    return Unit{g0 + r % gs, m0, std::min(chunk, Mp - m0), g0, gs};
  };
  WorkShares units(items * chunks, threads, share * chunks, true);
  balanced_for(units, [&](BalancedTurn& turn) {
    const TileScope scope(mode, kBf16Tiles);
    thread_local Bf16Buffer buffer, taken;
    thread_local std::vector<const uint16_t*> panels;
    const uint16_t* other[W];  // an item of another thread's share
    with_bf16_tiles(mode, [&](auto tiles) {
      int64_t ready = -1;  // first item of the group whose panels `panels` holds
      for (int64_t u; (u = turn.next()) >= 0;) {
        const Unit n = unit_of(u);
        const int64_t i = n.item;
        const uint16_t* const* pan = other;
        if (u / (share * chunks) == turn.thread()) {
          if (n.g0 != ready) {
            uint16_t* bt = w.tiles ? nullptr : buffer.reserve(W * n.gs * pv);
            panels.resize(W * n.gs);
            for (int64_t j = 0; j < n.gs * W; ++j)
              panels[j] = w.panel(panel_of(n.g0 + j / W, j % W), bt ? bt + j * pv : nullptr);
            ready = n.g0;
          }
          pan = panels.data() + W * (i - n.g0);
        } else {
          uint16_t* bt = w.tiles ? nullptr : taken.reserve(W * pv);
          for (int k = 0; k < W; ++k) other[k] = w.panel(panel_of(i, k), bt ? bt + k * pv : nullptr);
        }
        const uint16_t* upcoming[W];
        upcoming_of(turn, i, unit_of, upcoming);
        body(tiles, i, pan, n.m0, n.rows, upcoming);
      }
    });
  });
}

// Every panel of the matrix over the rows of xa (A tiles of Mp rows, Mp a multiple of 16);
// y [Mp, N].
template <int F>
void linear_impl(const uint16_t* xa, int64_t Mp, int64_t K, const Panels<F>& w, int64_t N,
                 float* y, TileMode mode) {
  const int64_t nb = K / 32;
  tile_items<1>(w, (N + kNB - 1) / kNB, [](int64_t p, int) { return p; }, Mp, K, mode,
                [&](auto tiles, int64_t p, const uint16_t* const* panel, int64_t m0,
                    int64_t rows, const uint16_t* const* upcoming) {
                  using T = decltype(tiles);
                  // the next panel's first pass over these rows: usually this thread's next
                  const int64_t q = p + 1;
                  const LinesAhead after =
                      (q + 1) * kNB <= N ? LinesAhead::rows_of(y + m0 * N + q * kNB, N,
                                                               std::min<int64_t>(32, rows), nb)
                                         : LinesAhead();
                  panel_rows<T>(xa + m0 * K, rows, K, panel[0], nb, y + m0 * N + p * kNB, N,
                                std::min<int64_t>(kNB, N - p * kNB), after, upcoming[0]);
                });
}

// h (A tiles of Mp rows of I) = silu(x Wg^T) * (x Wu^T) for the fused [gate | up] panels
// (2 I rows, I a multiple of 32): gate panel q and up panel I / 32 + q together, their 32 x
// 32 tile sums through SiLU in L1 and straight into h's block q as bf16, rows M .. Mp - 1
// zero. The values of linear_impl's fp32 [Mp, 2 I], silu_mul and the rounding rows_to_bf16
// does, without writing and reading the fp32 product (25 MB at 2,048 rows of SmolLM2).
// A pass's SiLU runs during the next pass's tile products (a row a step, double-buffered
// sums): run after them, the vector work and the matrix unit took turns. SmolLM2's MLP in
// Q4_1 on a Sapphire Rapids class Xeon, one process alternating: 512 rows 1.08x (2 threads)
// and 1.12x (1 thread), 2,048 rows 1.13x; a 512-token prefill 1.06x. Same bits (SiLU is
// elementwise, and a row's 32 values take the same vector code as the whole pass did).
template <int F>
void gate_up_silu(const uint16_t* xa, int64_t M, int64_t Mp, int64_t K, const Panels<F>& w,
                  int64_t I, uint16_t* h, TileMode mode) {
  const int64_t nb = K / 32, Q = I / kNB;
  tile_items<2>(w, Q, [Q](int64_t q, int k) { return q + k * Q; }, Mp, K, mode,
                [&](auto tiles, int64_t q, const uint16_t* const* pair, int64_t m0,
                    int64_t rows, const uint16_t* const* upcoming) {
    using T = decltype(tiles);
    alignas(64) float g[2][32][32], u[2][32][32];
    const int64_t passes = (rows + 31) / 32;
    // the next item's gate (during gate passes) and up (during up passes) panels, a share a pass
    auto ahead = [&](int k, int64_t m) {
      return LinesAhead::panel_share(upcoming[k], nb, (m - m0) / 32, passes);
    };
    // A pass whose sums wait for SiLU (none: n 0): row r of it goes to h during step r of the
    // next pass's gate and up tile passes (2 nb steps), the vector work beside the products.
    struct Done {
      int64_t m = 0, n = 0, real = 0;
      int b = 0;
    } done;
    auto finish = [&](const Done& p, int64_t r) {
      if (r >= p.n) return;
      uint16_t* dst = tile_row(h, p.m + r, I) + 16 * kNB * q;
      if (r >= p.real) {
        std::memset(dst, 0, kNB * sizeof(uint16_t));
        return;
      }
      alignas(64) float o[kNB];
      silu_mul_span(g[p.b][r], u[p.b][r], o, kNB);
      store_bf16(dst, vload(o));
      store_bf16(dst + 16, vload(o + 16));
    };
    for (int64_t m = m0; m < m0 + rows; m += 32) {
      const int64_t n = std::min<int64_t>(32, m0 + rows - m);
      const int b = ((m - m0) / 32) % 2;  // this pass's sums; the previous pass's in 1 - b
      // this pass's h rows (the gate pass) and the next pass's (the up pass) asked for
      const int64_t after = m + 32 < m0 + rows ? std::min<int64_t>(32, m0 + rows - m - 32) : 0;
      const LinesAhead here =
          m == m0 ? LinesAhead::tile_rows_of(tile_row(h, m, I) + 16 * kNB * q, I, n, nb)
                  : LinesAhead();
      const LinesAhead next =
          after ? LinesAhead::tile_rows_of(tile_row(h, m + 32, I) + 16 * kNB * q, I, after, nb)
                : LinesAhead();
      const Done prev = done;
      auto passes_of = [&](auto rt) {  // the gate and up passes of 16 RT rows
        constexpr int RT = decltype(rt)::value;
        tile_pass<T, RT>(xa + m * K, K, pair[0], nb, &g[b][0][0], 32, kNB, here, ahead(0, m),
                         [&](int64_t j) { finish(prev, j); });
        tile_pass<T, RT>(xa + m * K, K, pair[1], nb, &u[b][0][0], 32, kNB, next, ahead(1, m),
                         [&](int64_t j) { finish(prev, nb + j); });
      };
      if (n == 32)
        passes_of(std::integral_constant<int, 2>{});
      else
        passes_of(std::integral_constant<int, 1>{});
      for (int64_t r = 2 * nb; r < prev.n; ++r) finish(prev, r);  // K under 512: the rest
      done = {m, n, std::max<int64_t>(0, std::min(n, M - m)), b};
    }
    for (int64_t r = 0; r < done.n; ++r) finish(done, r);
  });
}
#else
#define PAGEDLLM_PROMPT_TILES 0
#endif

// The tiles the prompt rows run on (a TileMode): none until set_prompt_tiles chooses some.
std::atomic<int> g_prompt_tiles{static_cast<int>(TileMode::kOff)};

TileMode prompt_mode() {
  return static_cast<TileMode>(g_prompt_tiles.load(std::memory_order_relaxed));
}

}  // namespace

// The tiles' name: "amx", "emulated" or "off".
std::string prompt_tiles() { return tile_mode_name(prompt_mode()); }

// The prompt rows' TileMode as an int, for the prompt rows' attention (varlen_attention_cpu).
int prompt_tile_mode() { return static_cast<int>(prompt_mode()); }

// Chooses the prompt rows' tiles: "auto" (amx where the build and OS can run them: on a
// Sapphire Rapids class Xeon they prefill 1.4-1.6x the int8 panels' speed and score a lower
// perplexity, docs/benchmarks.md; else vector where the build has AVX-512 BF16; else off),
// "amx", "vector" (VecTiles: the prompt rows' attention only, the engine keeps their matrices
// on the int8 panels, which out-run bf16 vectors there: on a Zen 4 class VM a 2,000-token
// prefill 1.2x and a 512-token one 1.1x faster than with the tiles off), "emulated", "off".
// A choice this build, CPU or OS cannot run is a ValueError saying why. Returns the tiles
// now in use.
std::string set_prompt_tiles(const std::string& name) {
  const TileMode mode = choose_tiles(
      "prompt tiles", name, PAGEDLLM_PROMPT_TILES && PAGEDLLM_HAVE_AMX_BF16,
      "these kernels were built without AMX-bf16 (the CPU or PAGEDLLM_CPU_MARCH lacks "
      "amx_bf16, or the build lacks AVX-512 BW)",
      PAGEDLLM_PROMPT_TILES, "the kernel needs an AVX-512 BW build", /*auto_amx=*/true,
      PAGEDLLM_PROMPT_TILES && PAGEDLLM_HAVE_VEC_BF16,
      "these kernels were built without AVX-512 BF16 (the CPU or PAGEDLLM_CPU_MARCH lacks "
      "avx512_bf16, or the build lacks AVX-512 BW)");
  g_prompt_tiles.store(static_cast<int>(mode), std::memory_order_relaxed);
  return prompt_tiles();
}

// bf16 values of an N x K matrix's B tiles: its panels of 32 columns, K / 32 blocks of 1,024
// values each.
static int64_t tile_values(int64_t N, int64_t K) { return (N + 31) / 32 * (K / 32) * 1024; }

// The B tiles a matrix of N x K keeps (a8_panel_bf16_tiles' tensor), or null for an empty
// tensor: the call dequantizes its panels.
static const uint16_t* kept_tiles(const char* fn, const torch::Tensor& tiles, int64_t N,
                                  int64_t K) {
  if (tiles.numel() == 0) return nullptr;
  const int64_t want = tile_values(N, K);
  TORCH_CHECK(tiles.dtype() == torch::kInt16 && tiles.is_contiguous() && tiles.numel() == want,
              fn, ": tiles must be a8_panel_bf16_tiles' contiguous int16 tensor of ", want,
              " values for this matrix (or empty)");
  return reinterpret_cast<const uint16_t*>(tiles.data_ptr<int16_t>());
}

// A call's rows x [M, K] (fp32, contiguous) as bf16 A tiles of Mp = M rounded up to a tile
// (rows past M zero), on the prompt tiles chosen now (none chosen: an error naming `fn`).
struct TileRows {
  TileMode mode;
  int64_t M, K, Mp;
  Bf16Buffer buffer;
  uint16_t* xa = nullptr;
  TileRows(const char* fn, const torch::Tensor& x)
      : mode(prompt_mode()), M(x.size(0)), K(x.size(1)), Mp((M + 15) / 16 * 16) {
    TORCH_CHECK(mode != TileMode::kOff, fn, ": no prompt tiles chosen (set_prompt_tiles: amx "
                "or emulated)");
#if PAGEDLLM_PROMPT_TILES
    xa = buffer.reserve(Mp * K);
    rows_to_bf16(x.data_ptr<float>(), M, Mp, K, xa);
#endif
  }
};

// Every panel of a panel-layout matrix (a8_panel_linear's arguments) as the prompt tiles' B
// tiles, int16 [P * K / 32 * 1024] of bf16 bits: the values a call dequantizes, kept so that
// calls skip the dequantization (2 bytes a weight; model/layers/quant/prompt_tile_weights.py).
torch::Tensor a8_panel_bf16_tiles(int64_t fmt, torch::Tensor codes, torch::Tensor d,
                                  torch::Tensor m, int64_t N, int64_t K) {
  check_a8_panel_weight("a8_panel_bf16_tiles", fmt, codes, d, m, N, K);
  const int64_t P = (N + 31) / 32, pv = tile_values(32, K);  // panels, values a panel
  auto tiles = torch::empty({tile_values(N, K)}, torch::dtype(torch::kInt16));
#if PAGEDLLM_PROMPT_TILES
  const PanelPtrs w(fmt, codes, d, m);
  auto* out = reinterpret_cast<uint16_t*>(tiles.data_ptr<int16_t>());
  with_format(fmt, [&](auto f) {
    constexpr int F = decltype(f)::value;
    const Panels<F> panels{w.codes, w.d, w.m, K / 32, nullptr};
    at::parallel_for(0, P, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) panels.dequantize(p, out + p * pv);
    });
  });
#else
  TORCH_CHECK(false, "a8_panel_bf16_tiles: the kernel needs an AVX-512 BW build");
#endif
  return tiles;
}

// y [M, N] = bf16(x) @ bf16(W)^T in fp32 sums on the chosen tiles, W the panel-layout matrix
// (a8_panel_linear's arguments) dequantized exactly and rounded to bf16; `tiles` its kept B
// tiles (a8_panel_bf16_tiles) or empty.
torch::Tensor a8_panel_bf16_linear(torch::Tensor x, int64_t fmt, torch::Tensor codes,
                                   torch::Tensor d, torch::Tensor m, int64_t N,
                                   torch::Tensor tiles) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "a8_panel_bf16_linear: x must be contiguous fp32 [M, K]");
  check_a8_panel_weight("a8_panel_bf16_linear", fmt, codes, d, m, N, x.size(1));
  const uint16_t* kept = kept_tiles("a8_panel_bf16_linear", tiles, N, x.size(1));
  TileRows rows("a8_panel_bf16_linear", x);
  auto y = torch::empty({rows.Mp, N}, x.options());
#if PAGEDLLM_PROMPT_TILES
  const PanelPtrs w(fmt, codes, d, m);
  float* yp = y.data_ptr<float>();
  with_format(fmt, [&](auto f) {
    constexpr int F = decltype(f)::value;
    linear_impl<F>(rows.xa, rows.Mp, rows.K, Panels<F>{w.codes, w.d, w.m, rows.K / 32, kept},
                   N, yp, rows.mode);
  });
#endif
  return y.narrow(0, 0, rows.M);
}

// y = silu(x Wg^T) * (x Wu^T) @ Wd^T for a Llama MLP of panel matrices ([2 I, K] fused
// [gate | up], [N, I] down) on the prompt tiles: the bits of a8_panel_bf16_linear, silu_mul,
// a8_panel_bf16_linear in one call, without the fp32 intermediate [M, I] and its second pass
// to bf16 (on SmolLM2's 512-token prefill the separate SiLU and conversion passes were ~4%).
torch::Tensor a8_panel_bf16_mlp(torch::Tensor x, int64_t gu_fmt, torch::Tensor gu_codes,
                                torch::Tensor gu_d, torch::Tensor gu_m, int64_t down_fmt,
                                torch::Tensor down_codes, torch::Tensor down_d,
                                torch::Tensor down_m, int64_t I, int64_t N,
                                torch::Tensor gu_tiles, torch::Tensor down_tiles) {
  check_a8_panel_mlp("a8_panel_bf16_mlp", x, gu_fmt, gu_codes, gu_d, gu_m, down_fmt, down_codes,
                     down_d, down_m, I, N);
  const int64_t K = x.size(1);
  const uint16_t* gu_kept = kept_tiles("a8_panel_bf16_mlp (gate_up)", gu_tiles, 2 * I, K);
  const uint16_t* down_kept = kept_tiles("a8_panel_bf16_mlp (down)", down_tiles, N, I);
  TileRows rows("a8_panel_bf16_mlp", x);
  const int64_t M = rows.M, Mp = rows.Mp;
  const TileMode mode = rows.mode;
  const uint16_t* xa = rows.xa;
  auto y = torch::empty({Mp, N}, x.options());
#if PAGEDLLM_PROMPT_TILES
  Bf16Buffer hidden;
  const PanelPtrs wg(gu_fmt, gu_codes, gu_d, gu_m), wd(down_fmt, down_codes, down_d, down_m);
  uint16_t* ha = hidden.reserve(Mp * I);
  with_format(gu_fmt, [&](auto f) {
    constexpr int F = decltype(f)::value;
    gate_up_silu<F>(xa, M, Mp, K, Panels<F>{wg.codes, wg.d, wg.m, K / 32, gu_kept}, I, ha,
                    mode);
  });
  with_format(down_fmt, [&](auto f) {
    constexpr int F = decltype(f)::value;
    linear_impl<F>(ha, Mp, I, Panels<F>{wd.codes, wd.d, wd.m, I / 32, down_kept}, N,
                   y.data_ptr<float>(), mode);
  });
#endif
  return y.narrow(0, 0, M);
}

#pragma GCC pop_options

void register_prompt_tiles(pybind11::module_& m) {
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("prompt_tiles", &prompt_tiles,
        "the tiles the GGUF panels' prompt rows run on: amx, emulated or off");
  m.def("set_prompt_tiles", &set_prompt_tiles,
        "choose the prompt rows' tiles (auto, amx, emulated: the software model for tests, "
        "off); returns the tiles now in use");
  m.def("a8_panel_bf16_tiles", &a8_panel_bf16_tiles, nogil,
        "every panel of a GGUF panel matrix as the prompt tiles' bf16 B tiles (int16 bits), "
        "for a8_panel_bf16_linear / _mlp to skip their dequantization");
  m.def("a8_panel_bf16_mlp", &a8_panel_bf16_mlp, nogil,
        "a Llama MLP of GGUF panel matrices on the prompt tiles: the bits of "
        "a8_panel_bf16_linear, silu_mul, a8_panel_bf16_linear in one call");
  m.def("a8_panel_bf16_linear", &a8_panel_bf16_linear, nogil,
        "y = bf16(x) @ bf16(W)^T on AMX-bf16 tiles (or their software model), W GGUF Q8_0 / "
        "Q4_0 / Q4_1 in the int8-activation panels, dequantized a panel at a time");
}
