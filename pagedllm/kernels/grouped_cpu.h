// Work items of a grouped expert GEMM (a MoE layer's experts, all in one kernel call): the
// rows of x arrive sorted by expert, expert e owning rows [offsets[e], offsets[e + 1]), and
// every weight is a stack of E same-shaped matrices, one pointer + stride reaching expert e.
//
//   x  [R, K]  rows of expert 0 | rows of expert 1 | ... (an expert may have none)
//   y  [R, N]  y[rows of e] = x[rows of e] @ W_e^T
//
// One OpenMP region (at::parallel_for) runs every (expert, row tile, column tile) item, so a
// decode step's few rows per expert still spread the experts' columns over all threads, and
// no thread waits at a barrier between experts. Each item runs the format's own per-panel
// code, the same dot products as its dense linear: results are bit-identical to calling
// that linear once per expert. Included by each kernel file (inside its anonymous namespace).
#pragma once
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <vector>

struct GroupTile {
  int64_t expert;  // which weight of the stack
  int64_t col;     // column tile (a panel of the format, or a run of weight rows)
  int64_t row0;    // first row of x / y of this item
  int64_t rows;    // rows in this item
  int64_t group_rows;  // rows the expert has in all (kernels that switch paths by M use it)
};

// Expert row ranges from offsets [E + 1] (int64, offsets[0] = 0, non-decreasing, last = R).
inline const int64_t* checked_offsets(const at::Tensor& offsets, int64_t E, int64_t R) {
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) == E + 1 && offsets.dtype() == at::kLong &&
                  offsets.is_contiguous() && offsets.device().is_cpu(),
              "grouped linear: offsets must be a contiguous CPU int64 tensor of E + 1 = ", E + 1,
              " row starts");
  const int64_t* o = offsets.data_ptr<int64_t>();
  TORCH_CHECK(o[0] == 0 && o[E] == R, "grouped linear: offsets must run from 0 to the ", R,
              " rows of x (got ", o[0], " .. ", o[E], ")");
  for (int64_t e = 0; e < E; ++e)
    TORCH_CHECK(o[e] <= o[e + 1], "grouped linear: offsets decrease at expert ", e);
  return o;
}

// Items of every expert with rows: column tiles 0..C-1 times row tiles of at most row_tile,
// C = cols(rows of the expert) (a kernel whose path depends on M tiles its columns by path).
template <typename Cols>
std::vector<GroupTile> group_tiles(const int64_t* offsets, int64_t E, Cols&& cols,
                                   int64_t row_tile) {
  std::vector<GroupTile> tiles;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e], C = cols(n);
    for (int64_t r = 0; r < n; r += row_tile)
      for (int64_t c = 0; c < C; ++c)
        tiles.push_back({e, c, offsets[e] + r, std::min(row_tile, n - r), n});
  }
  return tiles;
}

inline std::vector<GroupTile> group_tiles(const int64_t* offsets, int64_t E, int64_t C,
                                          int64_t row_tile) {
  return group_tiles(offsets, E, [C](int64_t) { return C; }, row_tile);
}

// fn(first, last) over one contiguous chunk of the items per thread, in one parallel region
// (a thread's scratch buffers are set up once, not per item). Chunks are cut at equal shares
// of the items' cost, rows + kTileCost each (a prefill's experts get very different row
// counts: equal numbers of items would leave a thread idle while another runs a large group).
constexpr int64_t kTileCost = 2;  // reading an item's weight tile, in rows of work

template <typename Fn>
void run_tiles(const std::vector<GroupTile>& tiles, Fn&& fn) {
  const int64_t n = static_cast<int64_t>(tiles.size());
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  std::vector<int64_t> cost(n + 1, 0);  // prefix sums
  for (int64_t i = 0; i < n; ++i) cost[i + 1] = cost[i] + tiles[i].rows + kTileCost;
  std::vector<int64_t> cut(threads + 1, n);
  cut[0] = 0;
  for (int64_t t = 1; t < threads; ++t)
    cut[t] = std::lower_bound(cost.begin(), cost.end(), cost[n] * t / threads) - cost.begin();
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      if (cut[t] < cut[t + 1]) fn(tiles.data() + cut[t], tiles.data() + cut[t + 1]);
  });
}
