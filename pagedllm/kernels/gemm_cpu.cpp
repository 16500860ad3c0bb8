// fp32 linear layer for CPU: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), over a weight packed once
// at load time into panels of NB output columns: packed[N / NB, K, NB] (N padded with zeros).
//
// Why: at the row counts of decoding (M = 1..64) `torch.mm` on this class of CPU reaches
// 15-35 GB/s of weight reads at M = 1 but only 4-20% of peak FLOPs at M = 4-64 (measured in
// docs/benchmarks.md). Here one micro-kernel serves every M: for each panel, MR rows of x are
// broadcast one k at a time against two vectors of the panel's k-th row, accumulating MR x NB
// outputs in registers. The panel is read sequentially (full memory bandwidth when M is small)
// and stays in L2 while all M rows pass over it (FLOP-bound when M is large).
//
// Each output is a plain k-ordered fp32 FMA chain in one vector lane, whatever M, the row's
// position in the batch, or MR: results are bit-identical across batch compositions
// (batch-invariant). Reassociation is switched off for this file so that stays true under
// -ffast-math.
#include "torch_lite_cpu.h"
#include <ATen/Parallel.h>
#include "balanced_for_cpu.h"  // balanced_for: threads that finish together
#include <algorithm>
#include <cstdint>

#include "grouped_cpu.h"

#pragma GCC push_options
#pragma GCC optimize("no-associative-math")

#if defined(__AVX512F__)
constexpr int kVW = 16, kMR = 8;  // 16 zmm accumulators
#elif defined(__AVX__)
constexpr int kVW = 8, kMR = 6;   // 12 of the 16 ymm registers
#else
constexpr int kVW = 4, kMR = 4;
#endif
constexpr int kNB = 2 * kVW;  // panel width: two vectors
// rows of one expert per work item of grouped_packed_linear (a panel stays in L2 across them)
constexpr int64_t kGroupRowTile = 256;
typedef float vec __attribute__((vector_size(kVW * 4)));

int64_t gemm_panel_width() { return kNB; }

torch::Tensor pack_linear_weight(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.dtype() == torch::kFloat32, "pack_linear_weight: fp32 [N, K]");
  const int64_t N = w.size(0), K = w.size(1), P = (N + kNB - 1) / kNB;
  auto padded = torch::zeros({P * kNB, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  return padded.view({P, kNB, K}).transpose(1, 2).contiguous();
}

template <int MR>
static inline void micro(const float* x, int64_t ldx, const float* wp, int64_t K, float* y,
                         int64_t ldy, int64_t ncols, const float* bias) {
  vec acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vec{};
  for (int64_t k = 0; k < K; ++k) {
    const vec w0 = *reinterpret_cast<const vec*>(wp + k * kNB);
    const vec w1 = *reinterpret_cast<const vec*>(wp + k * kNB + kVW);
    for (int i = 0; i < MR; ++i) {
      const vec xb = vec{} + x[i * ldx + k];
      acc[i][0] += xb * w0;
      acc[i][1] += xb * w1;
    }
  }
  for (int i = 0; i < MR; ++i) {
    float out[kNB];
    __builtin_memcpy(out, &acc[i][0], sizeof(vec));
    __builtin_memcpy(out + kVW, &acc[i][1], sizeof(vec));
    float* yr = y + i * ldy;
    if (bias) {
      for (int64_t j = 0; j < ncols; ++j) yr[j] = out[j] + bias[j];
    } else {
      for (int64_t j = 0; j < ncols; ++j) yr[j] = out[j];
    }
  }
}

// The M % MR leftover rows: pick the micro-kernel with exactly that many rows.
template <int MR>
static inline void micro_tail(int rows, const float* x, int64_t ldx, const float* wp, int64_t K,
                              float* y, int64_t ldy, int64_t ncols, const float* bias) {
  if constexpr (MR > 0) {
    if (rows == MR) return micro<MR>(x, ldx, wp, K, y, ldy, ncols, bias);
    micro_tail<MR - 1>(rows, x, ldx, wp, K, y, ldy, ncols, bias);
  }
}

// Rows [0, M) of x against panel p of a packed weight w: y[:, p * NB ...] (+ bias).
static void panel_rows(const float* xp, int64_t M, int64_t K, const float* w, int64_t p,
                       int64_t N, float* yp, const float* bp) {
  const int64_t n = p * kNB, ncols = std::min<int64_t>(kNB, N - n);
  const float* pw = w + p * K * kNB;
  const float* bn = bp ? bp + n : nullptr;
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR) {
    micro<kMR>(xp + m * K, K, pw, K, yp + m * N + n, N, ncols, bn);
  }
  if (m < M) {
    micro_tail<kMR - 1>(static_cast<int>(M - m), xp + m * K, K, pw, K, yp + m * N + n, N,
                        ncols, bn);
  }
}

torch::Tensor packed_linear(torch::Tensor x, torch::Tensor packed, int64_t N,
                            c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "packed_linear: x must be contiguous fp32 [M, K]");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kNB && packed.is_contiguous() &&
              packed.size(1) == x.size(1) && packed.size(0) * kNB >= N,
              "packed_linear: weight not packed for this input");
  if (bias) TORCH_CHECK(bias->is_contiguous() && bias->numel() == N && bias->dtype() == torch::kFloat32);
  const int64_t M = x.size(0), K = x.size(1), P = (N + kNB - 1) / kNB;
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* w = packed.data_ptr<float>();
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  balanced_for(P, [&](BalancedTurn& turn) {
    for (int64_t p; (p = turn.next()) >= 0;) panel_rows(xp, M, K, w, p, N, yp, bp);
  }, M >= kStealRows);
  return y;
}

// The experts of a MoE layer in one call (grouped_cpu.h): packed [E, P, K, NB], x's rows
// sorted by expert, offsets [E + 1]; each item is panel_rows over one expert's rows.
torch::Tensor grouped_packed_linear(torch::Tensor x, torch::Tensor packed, int64_t N,
                                    torch::Tensor offsets) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.is_contiguous(),
              "grouped_packed_linear: x must be contiguous fp32 [R, K]");
  TORCH_CHECK(packed.dim() == 4 && packed.size(3) == kNB && packed.is_contiguous() &&
                  packed.size(2) == x.size(1) && packed.size(1) * kNB >= N &&
                  packed.dtype() == torch::kFloat32,
              "grouped_packed_linear: weights not packed [E, P, K, NB] for this input");
  const int64_t E = packed.size(0), P = packed.size(1), K = x.size(1), R = x.size(0);
  const int64_t* off = checked_offsets(offsets, E, R);
  auto y = torch::empty({R, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* w = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  run_tiles(group_tiles(off, E, P, kGroupRowTile), [&](const GroupTile* t, const GroupTile* end) {
    for (; t < end; ++t)
      panel_rows(xp + t->row0 * K, t->rows, K, w + t->expert * P * K * kNB, t->col, N,
                 yp + t->row0 * N, nullptr);
  });
  return y;
}

#pragma GCC pop_options
