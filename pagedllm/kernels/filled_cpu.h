// Filled<T>: a std::vector whose elements start uninitialized, for storage a kernel writes
// completely before reading it (the activation quantizer's rows, per-thread scratch kept
// from call to call: `thread_local Filled<float> buf; buf.resize(n);` neither zero-fills the
// new elements nor, once grown, allocates). Included at file scope, before any anonymous
// namespace that uses it.
//
// Why: a vector's zero fill was 2-2.5% of a prefill or a 64-row decode step, on one thread
// (quantize_x's buffers; perf, Zen 4). 64-byte aligned: the AMX-int8 panels load 32-byte
// pieces of the int8 rows as tile rows (a8_panel_tiles_cpu.h), and malloc's 16-byte alignment
// split half of them across two cache lines.
#pragma once
#include <cstddef>
#include <memory>
#include <new>
#include <utility>
#include <vector>

template <typename T>
struct Uninitialized : std::allocator<T> {
  template <typename U> struct rebind { using other = Uninitialized<U>; };
  Uninitialized() = default;
  template <typename U> Uninitialized(const Uninitialized<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, size_t) noexcept { ::operator delete(p, std::align_val_t(64)); }
  template <typename U> void construct(U* p) noexcept { ::new (static_cast<void*>(p)) U; }
  template <typename U, typename... A> void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};
template <typename T> using Filled = std::vector<T, Uninitialized<T>>;
