#pragma once
// Compile-time unrolling for kernels that keep small arrays of SIMD batches in registers.

#include <cstdint>
#include <type_traits>

// On a kernel that unrolls nested lambdas: inline everything it calls, so the batches those
// lambdas touch stay in registers. GCC 12 otherwise keeps a 4 × 6 tile of accumulators in
// memory, a load and a store around every FMA.
#if defined(__GNUC__)
#define PHASEKV_FLATTEN __attribute__((flatten))
#else
#define PHASEKV_FLATTEN
#endif

// On a kernel tile that must keep its own register allocation: inlined into a large caller (the
// reader's task lambda), GCC 12 runs out of registers for the fp32 indexer's 24 accumulators and
// 4 query batches, folds the query loads into every FMA (24 loads a channel instead of 4) and
// spills the row pointers. A call per tile costs nothing next to its thousands of FMAs.
#if defined(__GNUC__)
#define PHASEKV_NOINLINE __attribute__((noinline))
#else
#define PHASEKV_NOINLINE
#endif

// On simd::unroll itself, for Clang only: inside a `flatten` tile Clang 14 leaves one unroll<5>
// call (the tile's final stores) out of line, so the accumulator array's address escapes and it
// stays in memory — a store after every FMA. GCC needs no help, and forced inlining there makes
// its large kernels (the DeepSeek-V4-precision read) far slower.
#if defined(__clang__)
#define PHASEKV_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define PHASEKV_ALWAYS_INLINE inline
#endif

namespace phasekv::simd {

// Calls f(std::integral_constant<std::int64_t, i>) for i = 0 … N−1, fully unrolled, so arrays
// of batches indexed by i are indexed by constants and can live in registers.
template <std::int64_t N, class F>
PHASEKV_ALWAYS_INLINE void unroll(F&& f) noexcept {
  if constexpr (N > 0) {
    unroll<N - 1>(f);
    f(std::integral_constant<std::int64_t, N - 1>{});
  }
}

}  // namespace phasekv::simd
