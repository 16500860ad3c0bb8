// AMX tiles for the int8-activation GEMMs: the tile instructions behind one small policy type,
// the tile configuration, the kernel's permission to use tile state, and a software model of
// the tiles with the same bits out.
//
// Intel's AMX (Sapphire Rapids on) adds eight tile registers of up to 16 rows x 64 bytes and
// TDPBSUD, which adds to a 16 x 16 int32 tile C the dot products of 16 rows of 64 s8 values
// (tile A) with 16 columns of 64 u8 values (tile B, stored as 16 rows of 4-byte column
// quads: B[k / 4][4 n + k % 4]): 16,384 multiply-adds an instruction, 16x VNNI's vpdpbusd.
// The int8-activation panel kernels (quant_a8_panels_cpu.cpp) run 16-row tiles through it and
// keep vpdpbusd for the rest of the rows; the integers are exact either way, and the fp32
// epilogue is the same instructions in the same order, so a row's result does not depend on
// which unit ran it (batch-invariant, and bit-equal to the VNNI path: tests check it).
//
// The same tiles run TDPBF16PS for the GGUF panels' prompt rows (prompt_tiles_cpu.cpp): bf16
// pairs, fp32 sums, 16,384 multiply-adds an instruction on weights dequantized per call.
//
// HwTiles issues the instructions (a build for a CPU with AMX: -march=native on Sapphire
// Rapids, or PAGEDLLM_CPU_MARCH=sapphirerapids); EmuTiles computes the same in plain C++, so
// the tile layouts and the epilogue are tested on every CPU (PAGEDLLM_INT8_TILES=emulated,
// ~1000x slower: for tests). Which one runs is chosen at run time (int8_tiles / set_int8_tiles
// in quant_a8_panels_cpu.cpp, PAGEDLLM_INT8_TILES in kernels/cpu_features.py).
// Included inside the kernel file's anonymous namespace, after <immintrin.h>.
#pragma once
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

// Palette 1's configuration block (64 bytes, the layout LDTILECFG reads).
struct TileConfig {
  uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

// Which tiles the int8-activation kernels use at run time (kVector: the bf16 tiles on AVX-512
// BF16 vectors, VecTiles below; prompt rows only).
enum class TileMode : int { kOff = 0, kAmx = 1, kEmulated = 2, kVector = 3 };

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define PAGEDLLM_HAVE_AMX 1
// Linux hands a process the 8 KB of tile state only when it asks (arch_prctl
// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA; kernel 5.16 on): once, for every thread. Without
// it the first tile instruction faults.
inline bool amx_permitted() {
  static std::once_flag once;
  static bool granted = false;
  std::call_once(once, [] {
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    granted = syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  });
  return granted;
}

// The tile intrinsics name their register in the instruction text (GCC stringizes the
// argument), so each register a kernel uses gets its own specialization below.
struct HwTiles {
  static void config(const TileConfig& cfg) {
    // GCC 12 dropped the stores that fill cfg as dead before LDTILECFG (llama.cpp's AMX crash):
    // the empty asm says the block is read here
    asm volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
  }
  static void release() { _tile_release(); }
  template <int T> static void zero();
  template <int T> static void load(const void* p, int64_t stride);
  template <int T> static void store(void* p, int64_t stride);
  template <int C, int A, int B> static void dpbsud();
  template <int C, int A, int B> static void dpbf16ps();
};

#define PAGEDLLM_TILE_REGISTER(T)                                                             \
  template <> inline void HwTiles::zero<T>() { _tile_zero(T); }                               \
  template <> inline void HwTiles::load<T>(const void* p, int64_t s) { _tile_loadd(T, p, s); } \
  template <> inline void HwTiles::store<T>(void* p, int64_t s) { _tile_stored(T, p, s); }
PAGEDLLM_TILE_REGISTER(0)
PAGEDLLM_TILE_REGISTER(1)
PAGEDLLM_TILE_REGISTER(2)
PAGEDLLM_TILE_REGISTER(3)
PAGEDLLM_TILE_REGISTER(4)
PAGEDLLM_TILE_REGISTER(5)
PAGEDLLM_TILE_REGISTER(6)
PAGEDLLM_TILE_REGISTER(7)
#undef PAGEDLLM_TILE_REGISTER
template <> inline void HwTiles::dpbsud<0, 4, 6>() { _tile_dpbsud(0, 4, 6); }
template <> inline void HwTiles::dpbsud<1, 4, 7>() { _tile_dpbsud(1, 4, 7); }
template <> inline void HwTiles::dpbsud<2, 5, 6>() { _tile_dpbsud(2, 5, 6); }
template <> inline void HwTiles::dpbsud<3, 5, 7>() { _tile_dpbsud(3, 5, 7); }
#if defined(__AMX_BF16__)
#define PAGEDLLM_HAVE_AMX_BF16 1
template <> inline void HwTiles::dpbf16ps<0, 4, 6>() { _tile_dpbf16ps(0, 4, 6); }
template <> inline void HwTiles::dpbf16ps<1, 4, 7>() { _tile_dpbf16ps(1, 4, 7); }
template <> inline void HwTiles::dpbf16ps<2, 5, 6>() { _tile_dpbf16ps(2, 5, 6); }
template <> inline void HwTiles::dpbf16ps<3, 5, 7>() { _tile_dpbf16ps(3, 5, 7); }
#endif
#else
#define PAGEDLLM_HAVE_AMX 0
inline bool amx_permitted() { return false; }
#endif
#ifndef PAGEDLLM_HAVE_AMX_BF16
#define PAGEDLLM_HAVE_AMX_BF16 0
#endif

// A TileMode's name: "amx", "emulated" or "off".
inline std::string tile_mode_name(TileMode mode) {
  switch (mode) {
    case TileMode::kAmx: return "amx";
    case TileMode::kEmulated: return "emulated";
    case TileMode::kVector: return "vector";
    default: return "off";
  }
}

// The TileMode `name` chooses for `what` (say "int8 tiles"): off is off; auto is amx where
// `auto_amx` (the family's tiles were measured faster than its other path on an AMX machine),
// the build has them and the OS grants the tile state, else vector where the family has that
// form and the build has it, else off; amx where the build has them (else `amx_missing` says
// what it lacks) and the OS grants the tile state; emulated where the kernel is built (else
// `emulated_missing`); vector for a family that has the form (`vector_missing` not null:
// what the build lacks when `vector_built` is false). Anything else, or a choice that cannot
// run, is std::invalid_argument (a ValueError in Python).
inline TileMode choose_tiles(const std::string& what, const std::string& name, bool amx_built,
                             const char* amx_missing, bool emulated_built,
                             const char* emulated_missing, bool auto_amx = false,
                             bool vector_built = false, const char* vector_missing = nullptr) {
  const bool has_vector = vector_missing != nullptr;  // the family's vector form
  if (name == "auto") {
    if (auto_amx && amx_built && amx_permitted()) return TileMode::kAmx;
    return has_vector && vector_built ? TileMode::kVector : TileMode::kOff;
  }
  if (name == "off") return TileMode::kOff;
  if (name == "vector" && has_vector) {
    if (!vector_built) throw std::invalid_argument(what + " 'vector': " + vector_missing);
    return TileMode::kVector;
  }
  if (name == "amx") {
    if (!amx_built) throw std::invalid_argument(what + " 'amx': " + amx_missing);
    if (!amx_permitted())
      throw std::invalid_argument(what + " 'amx': the operating system refused the tile state "
                                  "(arch_prctl ARCH_REQ_XCOMP_PERM; Linux >= 5.16 grants it)");
    return TileMode::kAmx;
  }
  if (name == "emulated") {
    if (!emulated_built) throw std::invalid_argument(what + " 'emulated': " + emulated_missing);
    return TileMode::kEmulated;
  }
  throw std::invalid_argument(what + " must be auto, amx, emulated" +
                              (has_vector ? ", vector" : "") + " or off, got '" + name + "'");
}

// The tiles in software: each thread's eight registers, the instructions' definitions.
struct EmuTiles {
  struct Tile {
    int rows = 0, colsb = 0;
    uint8_t b[16][64] = {};
  };
  static Tile* regs() {
    thread_local Tile t[8];
    return t;
  }
  static void config(const TileConfig& cfg) {
    for (int t = 0; t < 8; ++t) {
      regs()[t] = Tile{};
      regs()[t].rows = cfg.rows[t];
      regs()[t].colsb = cfg.colsb[t];
    }
  }
  static void release() {
    for (int t = 0; t < 8; ++t) regs()[t] = Tile{};
  }
  template <int T> static void zero() { std::memset(regs()[T].b, 0, sizeof(regs()[T].b)); }
  template <int T> static void load(const void* p, int64_t stride) {
    Tile& t = regs()[T];
    for (int r = 0; r < t.rows; ++r)
      std::memcpy(t.b[r], static_cast<const uint8_t*>(p) + r * stride, t.colsb);
  }
  template <int T> static void store(void* p, int64_t stride) {
    const Tile& t = regs()[T];
    for (int r = 0; r < t.rows; ++r)
      std::memcpy(static_cast<uint8_t*>(p) + r * stride, t.b[r], t.colsb);
  }
  // C[r][n] += sum_k s8 A[r][k] * u8 B[k / 4][4 n + k % 4]
  template <int C, int A, int B> static void dpbsud() {
    Tile &c = regs()[C], &a = regs()[A], &b = regs()[B];
    for (int r = 0; r < c.rows; ++r)
      for (int n = 0; n < c.colsb / 4; ++n) {
        int32_t acc;
        std::memcpy(&acc, c.b[r] + 4 * n, 4);
        for (int k = 0; k < a.colsb; ++k)
          acc += static_cast<int8_t>(a.b[r][k]) * static_cast<int32_t>(b.b[k / 4][4 * n + k % 4]);
        std::memcpy(c.b[r] + 4 * n, &acc, 4);
      }
  }
  // C[r][n] (fp32) += A[r][2k] B[k][2n] + A[r][2k + 1] B[k][2n + 1] over the k pairs, bf16
  // values, each product exact in fp32 and added in that order (TDPBF16PS's definition;
  // the hardware also flushes denormals, which this model keeps)
  template <int C, int A, int B> static void dpbf16ps() {
    Tile &c = regs()[C], &a = regs()[A], &b = regs()[B];
    auto bf16 = [](const uint8_t* p) {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    };
    for (int r = 0; r < c.rows; ++r)
      for (int n = 0; n < c.colsb / 4; ++n) {
        float acc;
        std::memcpy(&acc, c.b[r] + 4 * n, 4);
        for (int k = 0; k < a.colsb / 4; ++k) {
          acc += bf16(a.b[r] + 4 * k) * bf16(b.b[k] + 4 * n);
          acc += bf16(a.b[r] + 4 * k + 2) * bf16(b.b[k] + 4 * n + 2);
        }
        std::memcpy(c.b[r] + 4 * n, &acc, 4);
      }
  }
};

// The bf16 tiles on AVX-512 BF16 vectors (Zen 4 on, Cooper Lake): TDPBF16PS as 256 VDPBF16PS
// a product, for CPUs without AMX. A load keeps the operand's address (the kernels leave an
// operand in place until the products that read it are done); the C tiles live in memory (L1,
// 4 KB a thread). C row r's 16 lanes take the k pairs in order, each VDPBF16PS adding one
// pair's two products (exact in fp32) to the lane: the tiles' sums in their order. Loads go
// to tiles 4-7 and products to C tiles 0-3, as every bf16 kernel here uses them.
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define PAGEDLLM_HAVE_VEC_BF16 1
struct VecTiles {
  struct State {
    alignas(64) float c[4][16][16];
    const uint8_t* p[8];
    int64_t stride[8];
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static void config(const TileConfig&) {}
  static void release() {}
  template <int T> static void zero() {
    static_assert(T < 4, "C tiles are 0-3");
    for (int r = 0; r < 16; ++r) _mm512_store_ps(state().c[T][r], _mm512_setzero_ps());
  }
  template <int T> static void load(const void* p, int64_t stride) {
    static_assert(T >= 4 && T < 8, "operands are tiles 4-7");
    state().p[T] = static_cast<const uint8_t*>(p);
    state().stride[T] = stride;
  }
  template <int T> static void store(void* p, int64_t stride) {
    static_assert(T < 4, "C tiles are 0-3");
    for (int r = 0; r < 16; ++r)
      _mm512_storeu_ps(static_cast<uint8_t*>(p) + r * stride, _mm512_load_ps(state().c[T][r]));
  }
  template <int C, int A, int B> static void dpbf16ps() {
    State& s = state();
    __m512bh b[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k)
      b[k] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(s.p[B] + k * s.stride[B]));
    const uint8_t* a = s.p[A];
    const int64_t sa = s.stride[A];
    for (int r0 = 0; r0 < 16; r0 += 8) {  // 8 rows' chains at a time: the adds' latency
      __m512 acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = _mm512_load_ps(s.c[C][r0 + i]);
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k)
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          // the A pair as the instruction's broadcast memory operand (GCC does not fold an
          // _mm512_set1_epi32 into it: one instruction less a product)
          const int32_t* pair = reinterpret_cast<const int32_t*>(a + (r0 + i) * sa + 4 * k);
          asm("vdpbf16ps %[m]%{1to16%}, %[b], %[acc]"
              : [acc] "+v"(acc[i])
              : [b] "v"(b[k]), [m] "m"(*pair));
        }
      for (int i = 0; i < 8; ++i) _mm512_store_ps(s.c[C][r0 + i], acc[i]);
    }
  }
};
#else
#define PAGEDLLM_HAVE_VEC_BF16 0
#endif

// f(tiles) with the bf16 tile type of `mode`: HwTiles{} (AMX-bf16), VecTiles{} (AVX-512 BF16)
// or EmuTiles{} (the software model). The bf16 kernels' one dispatch (prompt_tiles_cpu.cpp's
// matrices, varlen_tiles_cpu.h's attention).
template <typename Fn>
void with_bf16_tiles(TileMode mode, Fn&& f) {
#if PAGEDLLM_HAVE_AMX_BF16
  if (mode == TileMode::kAmx) return f(HwTiles{});
#endif
#if PAGEDLLM_HAVE_VEC_BF16
  if (mode == TileMode::kVector) return f(VecTiles{});
#endif
  f(EmuTiles{});
}

// The tile configuration of `mode` loaded for the lifetime of the object (one thread's share
// of a kernel call), released after: another library's AMX code (oneDNN's bf16 matmul)
// configures the tiles its own way, so no configuration is assumed to survive between calls.
class TileScope {
 public:
  TileScope(TileMode mode, const TileConfig& cfg) : mode_(mode) {
    if (mode_ == TileMode::kEmulated) EmuTiles::config(cfg);
#if PAGEDLLM_HAVE_AMX
    if (mode_ == TileMode::kAmx) HwTiles::config(cfg);
#endif
  }
  ~TileScope() {
    if (mode_ == TileMode::kEmulated) EmuTiles::release();
#if PAGEDLLM_HAVE_AMX
    if (mode_ == TileMode::kAmx) HwTiles::release();
#endif
  }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;

 private:
  TileMode mode_;
};
