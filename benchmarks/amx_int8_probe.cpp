// A measurement before a kernel: the int8-activation GEMM of a Q4_1 panel (the default path's
// prefill) with AMX-int8 tiles against the AVX-512 VNNI micro-kernel the engine runs
// (pagedllm/kernels/quant_a8_panels_cpu.cpp), on the same data, with the same per-32-value
// block epilogue, so the two must agree bit for bit. Built and run by amx_int8_probe.py.
//
//   y[m, n] = sum_j  dot_j(m, n) * (d[n, j] * dx[m, j])  +  mn[n, j] * f[m, j]
//   dot_j   = sum over block j's 32 k of q[m, k] * c[n, k]   (q int8 activations, c 0..15)
//
// VNNI: 6 rows x 32 columns a call, the panel's packed nibbles (4-byte lanes, as the engine
// stores them), vpdpbusd of the codes by broadcast activation quads. AMX: the panel's nibbles
// unpacked once per call into B tiles (8 rows x 16 columns x 4 bytes a block), then per 16
// rows and block one TDPBSUD (A: 16 x 32 activation bytes, s8; B: u8 codes) into a 16 x 16
// int32 tile, stored and applied to 16 fp32 accumulator registers in the block's order. The
// question it answers: does the per-block epilogue leave AMX enough of its 4x-16x peak to
// beat VNNI at prefill sizes (llama.cpp's AMX path, with the same per-32 scales, was no
// faster than our VNNI prefill on the Xeon).
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int kNB = 32;  // panel width (the engine's AVX-512 panels)
constexpr int kMR = 6;   // VNNI rows a call (the engine's kMRQ on AVX-512)

struct Problem {
  int M, N, K, nb;
  std::vector<int8_t> q;       // [M, K]
  std::vector<float> dx, f;    // [M, nb]: activation scale, dx * sum(q) of the block
  std::vector<uint8_t> codes;  // [P, nb, 4, kNB, 4] packed nibbles (the engine's layout)
  std::vector<float> d, mn;    // [P, nb, kNB]: weight scale, Q4_1 offset
};

Problem make_problem(int M, int N, int K, uint32_t seed) {
  Problem p{M, N, K, K / 32, {}, {}, {}, {}, {}, {}};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> qd(-127, 127), cd(0, 15);
  std::uniform_real_distribution<float> sd(0.001f, 0.02f), md(-0.1f, 0.1f);
  p.q.resize(size_t(M) * K);
  for (auto& v : p.q) v = static_cast<int8_t>(qd(rng));
  p.dx.resize(size_t(M) * p.nb);
  p.f.resize(size_t(M) * p.nb);
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < p.nb; ++j) {
      int s = 0;
      for (int k = 0; k < 32; ++k) s += p.q[size_t(m) * K + 32 * j + k];
      p.dx[size_t(m) * p.nb + j] = sd(rng);
      p.f[size_t(m) * p.nb + j] = p.dx[size_t(m) * p.nb + j] * static_cast<float>(s);
    }
  const int P = N / kNB;
  p.codes.resize(size_t(P) * p.nb * 4 * kNB * 4);
  for (auto& v : p.codes) v = static_cast<uint8_t>(cd(rng) | (cd(rng) << 4));
  p.d.resize(size_t(P) * p.nb * kNB);
  p.mn.resize(p.d.size());
  for (auto& v : p.d) v = sd(rng);
  for (auto& v : p.mn) v = md(rng);
  return p;
}

inline __m512i nib_lo(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi8(15)); }
inline __m512i nib_hi(__m512i v) {
  return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15));
}

// The engine's micro<Q4_1, MR>: rows [m, m + MR) x panel pp, u8 codes x s8 activations.
template <int MR>
void vnni_micro(const Problem& p, int m, int pp, float* y) {
  const int K = p.K, nb = p.nb;
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const uint8_t* pc = p.codes.data() + size_t(pp) * nb * 4 * kNB * 4;
  const float* pd = p.d.data() + size_t(pp) * nb * kNB;
  const float* pm = p.mn.data() + size_t(pp) * nb * kNB;
  for (int j = 0; j < nb; ++j) {
    __m512i dot[MR][2];
    for (int i = 0; i < MR; ++i) dot[i][0] = dot[i][1] = _mm512_setzero_si512();
    const uint8_t* wj = pc + size_t(j) * 4 * kNB * 4;
    for (int g = 0; g < 4; ++g) {
      const __m512i w0 = _mm512_loadu_si512(wj + g * kNB * 4);
      const __m512i w1 = _mm512_loadu_si512(wj + g * kNB * 4 + 64);
      for (int i = 0; i < MR; ++i) {
        int32_t xa, xb;
        const int8_t* xr = p.q.data() + size_t(m + i) * K + 32 * j + 8 * g;
        std::memcpy(&xa, xr, 4);
        std::memcpy(&xb, xr + 4, 4);
        const __m512i va = _mm512_set1_epi32(xa), vb = _mm512_set1_epi32(xb);
        dot[i][0] = _mm512_dpbusd_epi32(dot[i][0], nib_lo(w0), va);
        dot[i][0] = _mm512_dpbusd_epi32(dot[i][0], nib_hi(w0), vb);
        dot[i][1] = _mm512_dpbusd_epi32(dot[i][1], nib_lo(w1), va);
        dot[i][1] = _mm512_dpbusd_epi32(dot[i][1], nib_hi(w1), vb);
      }
    }
    const __m512 d0 = _mm512_loadu_ps(pd + j * kNB), d1 = _mm512_loadu_ps(pd + j * kNB + 16);
    const __m512 m0 = _mm512_loadu_ps(pm + j * kNB), m1 = _mm512_loadu_ps(pm + j * kNB + 16);
    for (int i = 0; i < MR; ++i) {
      const __m512 s = _mm512_set1_ps(p.dx[size_t(m + i) * nb + j]);
      const __m512 fv = _mm512_set1_ps(p.f[size_t(m + i) * nb + j]);
      acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][0]), _mm512_mul_ps(d0, s), acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][1]), _mm512_mul_ps(d1, s), acc[i][1]);
      acc[i][0] = _mm512_fmadd_ps(m0, fv, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(m1, fv, acc[i][1]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm512_storeu_ps(y + size_t(m + i) * p.N + pp * kNB, acc[i][0]);
    _mm512_storeu_ps(y + size_t(m + i) * p.N + pp * kNB + 16, acc[i][1]);
  }
}

void vnni_gemm(const Problem& p, float* y) {
  const int P = p.N / kNB;
#pragma omp parallel for schedule(static)
  for (int pp = 0; pp < P; ++pp) {
    int m = 0;
    for (; m + kMR <= p.M; m += kMR) vnni_micro<kMR>(p, m, pp, y);
    for (; m < p.M; ++m) vnni_micro<1>(p, m, pp, y);
  }
}

#if defined(PROBE_EMULATE_AMX)
// The tile instructions in software (-DPROBE_EMULATE_AMX), to check the layouts and the
// epilogue on a CPU without AMX: the same code below, the same bits out, ~1000x slower.
#define HAVE_AMX_PATH 1
struct Tile {
  int rows = 0, colsb = 0;
  alignas(64) uint8_t b[16][64] = {};
};
thread_local Tile tmm[8];
inline void emu_config(const void* cfg) {
  const uint8_t* c = static_cast<const uint8_t*>(cfg);
  for (int t = 0; t < 8; ++t) {
    uint16_t colsb;
    std::memcpy(&colsb, c + 16 + 2 * t, 2);
    tmm[t].colsb = colsb;
    tmm[t].rows = c[48 + t];
  }
}
inline void emu_zero(int t) { std::memset(tmm[t].b, 0, sizeof(tmm[t].b)); }
inline void emu_load(int t, const void* base, long stride) {
  for (int r = 0; r < tmm[t].rows; ++r)
    std::memcpy(tmm[t].b[r], static_cast<const uint8_t*>(base) + r * stride, tmm[t].colsb);
}
inline void emu_store(int t, void* base, long stride) {
  for (int r = 0; r < tmm[t].rows; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, tmm[t].b[r], tmm[t].colsb);
}
// C[r][n] += sum_k s8 A[r][k] * u8 B[k / 4][4 n + k % 4]  (TDPBSUD)
inline void emu_dpbsud(int c, int a, int b) {
  for (int r = 0; r < tmm[c].rows; ++r)
    for (int n = 0; n < tmm[c].colsb / 4; ++n) {
      int32_t acc;
      std::memcpy(&acc, tmm[c].b[r] + 4 * n, 4);
      for (int k = 0; k < tmm[a].colsb; ++k)
        acc += static_cast<int8_t>(tmm[a].b[r][k]) * static_cast<int32_t>(tmm[b].b[k / 4][4 * n + k % 4]);
      std::memcpy(tmm[c].b[r] + 4 * n, &acc, 4);
    }
}
#undef _tile_loadconfig
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbsud
#undef _tile_release
#define _tile_loadconfig(cfg) emu_config(cfg)
#define _tile_zero(t) emu_zero(t)
#define _tile_loadd(t, base, stride) emu_load(t, base, stride)
#define _tile_stored(t, base, stride) emu_store(t, base, stride)
#define _tile_dpbsud(c, a, b) emu_dpbsud(c, a, b)
#define _tile_release() ((void)0)
inline bool amx_permitted() { return true; }
#elif defined(__AMX_INT8__) && defined(__AMX_TILE__)
#define HAVE_AMX_PATH 1
bool amx_permitted() {
  constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
}
#endif

#if defined(HAVE_AMX_PATH)
struct TileConfig {
  uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: 0 = C (16 x 16 int32), 1 = A (16 rows x 32 s8), 2 = B (8 rows x 64 u8: 16 columns x 4).
void load_tile_config() {
  TileConfig cfg;
  cfg.rows[0] = 16, cfg.colsb[0] = 64;
  cfg.rows[1] = 16, cfg.colsb[1] = 32;
  cfg.rows[2] = 8, cfg.colsb[2] = 64;
  // GCC 12 dropped these stores as dead before _tile_loadconfig (llama.cpp's AMX crash): keep them
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

// Panel pp's codes as B tiles: [nb][2 column halves][8 k-quads][16 columns][4] u8 codes.
void unpack_panel(const Problem& p, int pp, uint8_t* b) {
  const uint8_t* pc = p.codes.data() + size_t(pp) * p.nb * 4 * kNB * 4;
  for (int j = 0; j < p.nb; ++j)
    for (int h = 0; h < 2; ++h)
      for (int u = 0; u < 4; ++u) {
        // lane u holds codes 8u + b (low nibbles: k-quad 2u) and 8u + 4 + b (high: 2u + 1)
        const __m512i w = _mm512_loadu_si512(pc + (size_t(j) * 4 + u) * kNB * 4 + h * 64);
        uint8_t* dst = b + ((size_t(j) * 2 + h) * 8 + 2 * u) * 64;
        _mm512_storeu_si512(dst, nib_lo(w));
        _mm512_storeu_si512(dst + 64, nib_hi(w));
      }
}

// body(pp, m0, h, bt) for every panel pp, 16-row tile m0 and 16-column half h, across the
// OpenMP team: each thread loads its tile configuration and unpacks a panel's B tiles (bt)
// once for all its row tiles.
template <typename Body>
void each_tile(const Problem& p, Body body) {
  const int P = p.N / kNB;
#pragma omp parallel
  {
    load_tile_config();
    std::vector<uint8_t> bt(size_t(p.nb) * 2 * 8 * 64);
#pragma omp for schedule(static)
    for (int pp = 0; pp < P; ++pp) {
      unpack_panel(p, pp, bt.data());
      for (int m0 = 0; m0 + 16 <= p.M; m0 += 16)
        for (int h = 0; h < 2; ++h) body(pp, m0, h, bt.data());
    }
    _tile_release();
  }
}

// C += A . B for block j: rows m0.. of the activations, column half h of the panel's codes.
inline void block_dot(const Problem& p, const uint8_t* bt, int m0, int h, int j) {
  _tile_loadd(1, p.q.data() + size_t(m0) * p.K + 32 * j, p.K);
  _tile_loadd(2, bt + (size_t(j) * 2 + h) * 8 * 64, 64);
  _tile_dpbsud(0, 1, 2);
}

void amx_gemm(const Problem& p, float* y) {
  const int nb = p.nb;
  each_tile(p, [&](int pp, int m0, int h, const uint8_t* bt) {
    alignas(64) int32_t c[16 * 16];
    const float* pd = p.d.data() + size_t(pp) * nb * kNB;
    const float* pm = p.mn.data() + size_t(pp) * nb * kNB;
    __m512 acc[16];
    for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
    for (int j = 0; j < nb; ++j) {
      _tile_zero(0);
      block_dot(p, bt, m0, h, j);
      _tile_stored(0, c, 64);
      const __m512 dv = _mm512_loadu_ps(pd + j * kNB + 16 * h);
      const __m512 mv = _mm512_loadu_ps(pm + j * kNB + 16 * h);
      for (int r = 0; r < 16; ++r) {
        const __m512 s = _mm512_set1_ps(p.dx[size_t(m0 + r) * nb + j]);
        const __m512 fv = _mm512_set1_ps(p.f[size_t(m0 + r) * nb + j]);
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * r));
        acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dv, s), acc[r]);
        acc[r] = _mm512_fmadd_ps(mv, fv, acc[r]);
      }
    }
    for (int r = 0; r < 16; ++r)
      _mm512_storeu_ps(y + size_t(m0 + r) * p.N + pp * kNB + 16 * h, acc[r]);
  });
}

// The ceiling: the same tiles with no per-block epilogue (one int32 sum over all of K, then
// y = float(sum)), as if the weights carried one scale per output row and the activations one
// per row, which is not the GGUF file's numerics. How much of AMX the per-32 scales cost.
void amx_ceiling(const Problem& p, float* y) {
  each_tile(p, [&](int pp, int m0, int h, const uint8_t* bt) {
    alignas(64) int32_t c[16 * 16];
    _tile_zero(0);
    for (int j = 0; j < p.nb; ++j) block_dot(p, bt, m0, h, j);
    _tile_stored(0, c, 64);
    for (int r = 0; r < 16; ++r)
      _mm512_storeu_ps(y + size_t(m0 + r) * p.N + pp * kNB + 16 * h,
                       _mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * r)));
  });
}

// sum_k q[m, k] c[n, k] from the packed codes, one output (checks amx_ceiling).
int32_t int_dot(const Problem& p, int m, int n) {
  const int pp = n / kNB, col = n % kNB;
  int32_t s = 0;
  for (int j = 0; j < p.nb; ++j)
    for (int u = 0; u < 4; ++u)
      for (int b = 0; b < 4; ++b) {
        const uint8_t byte = p.codes[(((size_t(pp) * p.nb + j) * 4 + u) * kNB + col) * 4 + b];
        s += p.q[size_t(m) * p.K + 32 * j + 8 * u + b] * (byte & 15);
        s += p.q[size_t(m) * p.K + 32 * j + 8 * u + 4 + b] * (byte >> 4);
      }
  return s;
}
#endif

double best_ms(void (*fn)(const Problem&, float*), const Problem& p, float* y, int reps) {
  fn(p, y);  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(p, y);
    best = std::min(best, std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

// argv: M N K reps; prints one JSON object.
int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s M N K reps\n", argv[0]);
    return 2;
  }
  const int M = std::atoi(argv[1]), N = std::atoi(argv[2]), K = std::atoi(argv[3]);
  const int reps = std::atoi(argv[4]);
  if (M % 16 || N % kNB || K % 32) {
    std::fprintf(stderr, "M must be a multiple of 16, N of %d, K of 32\n", kNB);
    return 2;
  }
#if defined(HAVE_AMX_PATH)
  const bool amx_ok = amx_permitted();  // before any thread exists (process-wide anyway)
#endif
  const Problem p = make_problem(M, N, K, 1234);
  std::vector<float> yv(size_t(M) * N), ya(size_t(M) * N, -1.f);
  const double gop = 2.0 * M * N * K / 1e9;
  const double vnni = best_ms(vnni_gemm, p, yv.data(), reps);
  std::printf("{\"M\": %d, \"N\": %d, \"K\": %d, \"threads\": %d, \"vnni_ms\": %.4f, "
              "\"vnni_gops\": %.1f", M, N, K, omp_get_max_threads(), vnni, gop / vnni * 1e3);
#if defined(PROBE_EMULATE_AMX)
  std::printf(", \"amx_emulated\": true");
#endif
#if defined(HAVE_AMX_PATH)
  if (!amx_ok) {
    std::printf(", \"amx\": \"refused by the kernel (arch_prctl XTILEDATA)\"}\n");
    return 0;
  }
  const double amx = best_ms(amx_gemm, p, ya.data(), reps);
  size_t differ = 0;
  for (size_t i = 0; i < yv.size(); ++i) differ += std::memcmp(&yv[i], &ya[i], 4) != 0;
  std::vector<float> yc(size_t(M) * N);
  const double ceiling = best_ms(amx_ceiling, p, yc.data(), reps);
  size_t ceiling_wrong = 0;
  for (int m = 0; m < M; m += std::max(1, M / 8))
    for (int n = 0; n < N; n += std::max(1, N / 64))
      ceiling_wrong += yc[size_t(m) * N + n] != static_cast<float>(int_dot(p, m, n));
  std::printf(", \"amx_ms\": %.4f, \"amx_gops\": %.1f, \"amx_over_vnni\": %.2f, "
              "\"outputs_differing\": %zu, \"amx_no_block_scales_gops\": %.1f, "
              "\"amx_no_block_scales_wrong\": %zu}\n", amx, gop / amx * 1e3, vnni / amx,
              differ, gop / ceiling * 1e3, ceiling_wrong);
  return differ == 0 && ceiling_wrong == 0 ? 0 : 1;
#else
  std::printf(", \"amx\": \"not built (no -mamx-int8: the CPU lacks AMX)\"}\n");
  return 0;
#endif
}
