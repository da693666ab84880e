#pragma once
// Software prefetch, for kernels that read short rows from places the hardware prefetchers
// cannot guess: the rows of the next entry (kernels/pooling.hpp), the keys of the next
// tile of selected entries (kernels/attention.hpp).

#include <cstdint>

namespace phasekv::simd {

// One prefetch of the line holding `p` into all cache levels. Not __builtin_prefetch: GCC 12
// counts it as free of side effects, so a lambda that only prefetches is judged to do nothing
// and its call is deleted (inside simd::unroll, most of a tile's row prefetches vanish). An asm
// volatile is never deleted.
// The address goes in as a register, not as a memory operand: a prefetch may name any address
// (past an array's end, an unmapped page), and nothing here should read as a dereference.
inline void prefetch_line(const void* p) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm volatile("prefetcht0 (%0)" : : "r"(p));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm volatile("prfm pldl1keep, [%0]" : : "r"(p));
#elif defined(__GNUC__)
  __builtin_prefetch(p, 0, 3);
#else
  (void)p;
#endif
}

// Floats per cache line (64 bytes on every x86 and most ARM cores; a wrong guess only wastes or
// skips prefetches).
inline constexpr std::int64_t line_floats = 16;

// Asks for the cache lines of floats [p, p + n) to be loaded into all cache levels (the write
// path gains nothing from L2-only or non-temporal hints: bench/RESULTS.md).
inline void prefetch(const float* p, std::int64_t n) noexcept {
  for (std::int64_t k = 0; k < n; k += line_floats) prefetch_line(p + k);
}

// The same for bytes [p, p + bytes).
inline void prefetch_bytes(const void* p, std::int64_t bytes) noexcept {
  for (std::int64_t k = 0; k < bytes; k += 64) prefetch_line(static_cast<const char*>(p) + k);
}

}  // namespace phasekv::simd

namespace phasekv::simd {

// A row to prefetch, whatever its element type: `bytes` bytes per channel (4 for fp32 rows, 2
// for bf16), so a kernel stepping over channels prefetches the right span of bytes.
struct prefetch_row {
  const unsigned char* data = nullptr;
  std::int64_t bytes = 4;
};

// Prefetches channels [c, c + N) of a row, N fixed at compile time: one prefetch per 64-byte
// step, unrolled for each element size. (A loop over the runtime byte count — the generic
// prefetch_bytes — costs ~10 scalar instructions a row inside the pooling kernels' channel loop,
// a cost the vector-gated prefill feels: bench/RESULTS.md.)
template <std::int64_t N>
inline void prefetch(const prefetch_row& row, std::int64_t c) noexcept {
  const unsigned char* p = row.data + c * row.bytes;
  if (row.bytes == 2) {
    for (std::int64_t k = 0; k < 2 * N; k += 64) prefetch_line(p + k);
  } else {
    for (std::int64_t k = 0; k < 4 * N; k += 64) prefetch_line(p + k);
  }
}

}  // namespace phasekv::simd
