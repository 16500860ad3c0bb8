// A prefetch that rides along another kernel's loop: lines a later kernel will read, asked for
// a few at a time between the units of a memory-bound kernel's work, so they arrive while that
// kernel streams its own bytes instead of stalling the later one.
//
// What uses it: a decode step's attention reads each sequence's K/V rows right after the QKV
// projection, and by then the rest of the step's weights (~90 MB for SmolLM2 Q4_1, 3x the L3)
// have pushed them out of every cache. From memory the attention kernel ran 2-3x its in-cache
// time (one sequence of 256 tokens: ~27 us a layer in a step against ~13 in cache, 2 threads,
// Zen 4): a few hundred KiB in 6 KiB blocks anywhere in the pool is latency, not bandwidth.
// decode_layers_cpu.cpp hands the QKV projection a plan of those rows (decode_kv_prefetch in
// paged_attention_cpu.cpp), and the projection's weight panels ask for them as they go.
#pragma once
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

// bytes [p, p + bytes) of one read
struct PrefetchSpan {
  const char* p;
  int64_t bytes;
};

// spans[t]: what thread t of the kernel's parallel region asks for, in the order the later
// kernel's thread t reads it. Each thread advances only its own cursor.
class PrefetchPlan {
 public:
  explicit PrefetchPlan(std::vector<std::vector<PrefetchSpan>> spans)
      : spans_(std::move(spans)), lines_(spans_.size(), 0), cursors_(spans_.size()) {
    for (size_t t = 0; t < spans_.size(); ++t)
      for (const PrefetchSpan& s : spans_[t]) lines_[t] += (s.bytes + kLine - 1) / kLine;
  }

  const std::vector<std::vector<PrefetchSpan>>& spans() const { return spans_; }

  // The calling thread (at::get_thread_num()) is about to run unit `done` of its `of` units:
  // it asks for its lines up to (done + 1) / of of them, so the last are asked for with one
  // unit still to run.
  void advance(int64_t done, int64_t of) {
    const size_t t = static_cast<size_t>(at::get_thread_num());
    if (t >= spans_.size() || of <= 0) return;
    Cursor& c = cursors_[t];
    const std::vector<PrefetchSpan>& mine = spans_[t];
    const int64_t target = lines_[t] * std::min(done + 1, of) / of;
    while (c.issued < target && c.span < mine.size()) {
      if (c.off >= mine[c.span].bytes) {
        ++c.span, c.off = 0;
        continue;
      }
      __builtin_prefetch(mine[c.span].p + c.off, 0, 3);  // into L1 and L2: measured ahead of L2 only
      c.off += kLine, ++c.issued;
    }
  }

 private:
  static constexpr int64_t kLine = 64;
  struct alignas(64) Cursor {  // one cache line each: threads write only their own
    size_t span = 0;
    int64_t off = 0, issued = 0;
  };
  std::vector<std::vector<PrefetchSpan>> spans_;
  std::vector<int64_t> lines_;
  std::vector<Cursor> cursors_;
};
