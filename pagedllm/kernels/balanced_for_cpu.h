// A parallel loop whose threads finish together when the cores run at different speeds.
//
// at::parallel_for gives thread t a fixed share of the items and ends when the slowest thread
// ends its share. On the shared VMs these kernels run on, the two vCPUs do not run at one
// speed: the same single-thread loop pinned to each, at the same time, took 60 and 72 ms (a
// Sapphire Rapids class VM; each vCPU's speed moves minute to minute with the host's other
// work), and every parallel region then waited on the slower one.
//
// balanced_for keeps at::parallel_for's shares (the same ceil(n / T) contiguous items a
// thread, so a kernel's rows and prefetch plans stay with the thread that reads them next): a
// thread takes runs of its own share from the front (half of what is left), and once done
// takes the other threads' remaining items one at a time from the back of their shares.
// Which thread runs an item never changes its result: the items write disjoint outputs with
// the same instructions.
//
// SmolLM2 Q4_1, 2 threads, that VM, one process alternating the variants (ABBA): offline 64 x
// 128/128 1.005-1.52x faster than the fixed shares with items taken one by one (median of 10
// rounds ~1.25x; the gain is the vCPUs' speed gap at the time), and 1.10x against 1.03x for
// one by one in a later run of 4 rounds (runs from the front: fewer cache lines crossing);
// a 2,000-token prefill 1.04x, 512 tokens 1.00x. One stream keeps the fixed shares
// (kStealRows).
#pragma once
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

// Each thread's share as [front, back) in one 64-bit word, front in the low half: its owner
// takes from the front, the others from the back, each with one compare-and-swap.
class WorkShares {
 public:
  WorkShares(int64_t n, int64_t threads, bool steal = true)
      : WorkShares(n, threads, (n + threads - 1) / threads, steal) {}
  // thread t owning items [t chunk, (t + 1) chunk) (threads x chunk >= n); without `steal` a
  // thread takes its whole share at once and nothing else (at::parallel_for's split)
  WorkShares(int64_t n, int64_t threads, int64_t chunk, bool steal)
      : n_(n), threads_(threads), chunk_(chunk), steal_(steal), shares_(new Share[threads]) {
    for (int64_t t = 0; t < threads; ++t) {
      const int64_t front = std::min(n, t * chunk_), back = std::min(n, front + chunk_);
      shares_[t].word.store(pack(front, back), std::memory_order_relaxed);
    }
  }

  int64_t threads() const { return threads_; }
  // thread t's own items [first(t), first(t) + own(t)), as at::parallel_for splits them
  int64_t first(int64_t t) const { return std::min(n_, t * chunk_); }
  int64_t own(int64_t t) const { return std::min(n_, first(t) + chunk_) - first(t); }

  // The next items for thread t: a run [first, *end) from its own share's front (half of
  // what is left there, at least one: a few compare-and-swaps a share, however small its
  // items, while its last items still go one by one), else one item from another share's
  // back; -1 when none is left.
  int64_t take(int64_t t, int64_t* end) {
    const int64_t own = take_front(shares_[t].word, end, steal_);
    if (own >= 0 || !steal_) return own;
    for (int64_t i = 1; i < threads_; ++i) {
      const int64_t other = take_back(shares_[(t + i) % threads_].word);
      if (other >= 0) return *end = other + 1, other;
    }
    return -1;
  }

  // thread t's next own item if it is still there (not taken), else -1: a hint for prefetching
  int64_t peek(int64_t t) const {
    const uint64_t w = shares_[t].word.load(std::memory_order_relaxed);
    return lo(w) < hi(w) ? static_cast<int64_t>(lo(w)) : -1;
  }

 private:
  struct alignas(64) Share {  // a cache line each: the owner's takes stay on its own line
    std::atomic<uint64_t> word{0};
  };
  static uint64_t pack(int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) | (static_cast<uint64_t>(back) << 32);
  }
  static uint32_t lo(uint64_t w) { return static_cast<uint32_t>(w); }
  static uint32_t hi(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
  static int64_t take_front(std::atomic<uint64_t>& word, int64_t* end, bool steal) {
    uint64_t w = word.load(std::memory_order_relaxed);
    while (lo(w) < hi(w)) {
      const uint32_t left = hi(w) - lo(w), run = steal ? std::max<uint32_t>(1, left / 2) : left;
      if (word.compare_exchange_weak(w, pack(lo(w) + run, hi(w)), std::memory_order_relaxed)) {
        *end = lo(w) + run;
        return lo(w);
      }
    }
    return -1;
  }
  static int64_t take_back(std::atomic<uint64_t>& word) {
    uint64_t w = word.load(std::memory_order_relaxed);
    while (lo(w) < hi(w))
      if (word.compare_exchange_weak(w, pack(lo(w), hi(w) - 1), std::memory_order_relaxed))
        return hi(w) - 1;
    return -1;
  }

  int64_t n_, threads_, chunk_;
  bool steal_;
  std::unique_ptr<Share[]> shares_;
};

// What a thread of balanced_for holds: its number and the shares it takes items from.
class BalancedTurn {
 public:
  BalancedTurn(WorkShares& shares, int64_t t) : shares_(shares), t_(t) {}
  // the next item this thread runs, -1 when all are taken
  int64_t next() {
    if (at_ < end_) return at_++;
    const int64_t first = shares_.take(t_, &end_);
    if (first < 0) return at_ = end_ = 0, -1;
    at_ = first + 1;
    return first;
  }
  // The next run of consecutive items [first, *end) this thread runs (the rest of its last
  // run, a run of its own share or one item of another's), -1 when all are taken: for items
  // whose neighbours are cheaper together.
  int64_t next_run(int64_t* end) {
    if (at_ >= end_) {
      const int64_t first = shares_.take(t_, &end_);
      if (first < 0) return at_ = end_ = 0, -1;
      at_ = first;
    }
    const int64_t first = at_;
    *end = at_ = end_;
    return first;
  }
  // this thread's next own item while it is still there, else -1 (a prefetch hint)
  int64_t peek() const { return at_ < end_ ? at_ : shares_.peek(t_); }
  int64_t thread() const { return t_; }
  // this thread's own items [first(), first() + own()) (what at::parallel_for would give it)
  int64_t first() const { return shares_.first(t_); }
  int64_t own() const { return shares_.own(t_); }

 private:
  WorkShares& shares_;
  int64_t t_;
  int64_t at_ = 0, end_ = 0;  // the run taken last: items [at_, end_) still to run
};

// Rows of a batch from which its kernels' threads take each other's items. Below, a region is a
// few microseconds, about what a taken item's cache lines cost crossing between the vCPUs
// (200-2,000 ns there and back on the VM above): one stream's decode (one row) ran 1.02x
// slower stealing and 1.04x taking items one by one, within that VM's noise (two identical
// builds differed by 2-3%), so one stream keeps the fixed split rather than risk it.
constexpr int64_t kStealRows = 8;

// The threads balanced_for runs n items on: at most one an item.
inline int64_t balanced_threads(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
}

// balanced_for over shares the caller laid out (WorkShares' three-argument form): body(turn)
// once per thread of shares.threads().
template <typename Body>
void balanced_for(WorkShares& shares, Body&& body) {
  at::parallel_for(0, shares.threads(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      BalancedTurn turn(shares, t);
      body(turn);
    }
  });
}

// body(BalancedTurn&) once per thread, in one parallel region over items [0, n): the body sets
// up its buffers once, then runs `for (int64_t i; (i = turn.next()) >= 0;)`. Runs on the
// calling thread alone (taking every item) inside another parallel region or with one thread.
// Without `steal`, at::parallel_for's split (callers pass rows >= kStealRows).
template <typename Body>
void balanced_for(int64_t n, Body&& body, bool steal = true) {
  if (n <= 0) return;
  WorkShares shares(n, balanced_threads(n), steal);
  balanced_for(shares, body);
}
