"""Where the OS and the host put this process's first two CPUs relative to each other: the
time for a cache line to go from one to the other and back (two threads pinned to them, one
atomic word bounced). On this project's 2-vCPU VMs it reads ~80 ns while the vCPUs share a
die and ~350 ns while they sit on two, and it changes every few seconds to minutes; a
multi-threaded number means little without it (docs/benchmarks.md, session 28).

    python benchmarks/placement.py        # prints the round trip, in ns

`round_trip_ns()` is what the benchmarks record beside their rounds (vllm_turns.py).
"""

from __future__ import annotations

import os
import statistics

_SOURCE = r"""
#include <torch/extension.h>
#include <pthread.h>
#include <sched.h>
#include <atomic>
#include <chrono>
#include <thread>

namespace {
std::atomic<long> word{0};
bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}
}  // namespace

// ns a line takes from cpu a to cpu b and back, over n bounces; -1 if a thread cannot be
// pinned. Both ends run on threads of their own: the caller's affinity stays as it was (a
// process it starts afterwards inherits it).
double round_trip_ns(int64_t a, int64_t b, int64_t n) {
  word.store(0);
  std::atomic<bool> failed{false};
  auto stop = [&] { return failed.load(std::memory_order_relaxed); };
  std::thread far([&] {
    if (!pin(static_cast<int>(b))) { failed = true; return; }
    for (long i = 0; i < n && !stop(); ++i) {
      while (word.load(std::memory_order_acquire) != 2 * i + 1 && !stop()) {}
      word.store(2 * i + 2, std::memory_order_release);
    }
  });
  double ns = -1;
  std::thread near([&] {
    if (!pin(static_cast<int>(a))) { failed = true; return; }
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n && !stop(); ++i) {
      word.store(2 * i + 1, std::memory_order_release);
      while (word.load(std::memory_order_acquire) != 2 * i + 2 && !stop()) {}
    }
    ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
  });
  near.join();
  far.join();
  return stop() ? -1 : ns;
}
"""


def _module():
    from torch.utils.cpp_extension import load_inline

    return load_inline("pagedllm_bench_placement", cpp_sources=_SOURCE,
                       functions=["round_trip_ns"], extra_cflags=["-O2"], verbose=False)


def round_trip_ns(bounces: int = 20000, repeats: int = 3) -> float | None:
    """Median ns of a cache line's trip between this process's first two CPUs and back, or
    None with fewer than two CPUs (or where threads cannot be pinned)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    mod = _module()
    times = [mod.round_trip_ns(cpus[0], cpus[1], bounces) for _ in range(repeats)]
    return None if min(times) < 0 else statistics.median(times)


if __name__ == "__main__":
    ns = round_trip_ns()
    print("fewer than two CPUs" if ns is None else f"{ns:.0f} ns there and back")
