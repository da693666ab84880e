#pragma once
// This machine's limits, measured in the same run as the figures that are compared with them (a
// shared, noisy machine makes a ratio of two figures taken minutes apart mean little). The one
// measurement code behind phasekv-bench, phasekv::bench::run (tools/bench.hpp) and the Google
// Benchmark programs in bench/ (bench/machine_limits.hpp adds their counters).
//
//   read_bandwidth()  main-memory read bandwidth of one core, bytes/s: a STREAM-like sum over a
//                     256 MiB buffer (8× the L3 here) read as four concurrent streams (its quarters)
//                     with two SIMD accumulators each. One sequential stream reads 10–25% less
//                     (the memory system idles between the prefetcher's requests, while the write
//                     path reads 2·W rows at once), and a bound a kernel can beat is no bound. The
//                     bandwidth of a shared machine drifts by ±20% within minutes, so every call
//                     measures again (8 passes, ~0.1 s) and returns the best seen so far in the run:
//                     the most this core has shown it can read.
//   fma_peak()        fp32 FMA peak of one core, FLOP/s: twelve independent FMA chains (two FMA
//                     pipes × four cycles of latency need at least eight), each a named variable
//                     so GCC keeps them in registers (docs/DESIGN.md §8).
//   bf16_dot_peak()   bf16 dot-product peak of one core, FLOP/s (a multiply-add counts two), as
//                     fma_peak but with vdpbf16ps (two products per fp32 lane); fma_peak() in
//                     builds without AVX512-BF16, where bf16 work runs as fp32 FMAs.
//   int8_dot_peak()   int8 dot-product peak of one core, OP/s (a multiply-add counts two), as
//                     fma_peak but with vpdpbusd (AVX-512 VNNI: 64 u8 × s8 products per
//                     instruction, four summed into each int32 lane); fma_peak() in builds without
//                     VNNI, where the FP4 indexer's portable path runs instead.
//   roofline          a kernel's floor, max(bytes / bandwidth, flops / peak + bf16 flops / bf16
//                     peak + int8 ops / int8 peak): no implementation of that work on one core can
//                     take less time. efficiency = floor / time.
//
// Each peak is measured once per process and printed on stderr ("machine: …") when first taken.
// Times are CPU time of the calling thread (thread_seconds). POSIX (clock_gettime).

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "phasekv/detail/text.hpp"
#include "phasekv/kernels/indexer_bf16.hpp"
#include "phasekv/kernels/indexer_fp4.hpp"
#include "phasekv/detail/simd/config.hpp"  // PHASEKV_HAS_BF16_DOT, PHASEKV_HAS_INT8_DOT

namespace phasekv::bench {

// Keeps `value` (and the work that made it) from being optimised away: an empty asm statement that
// claims to read it from a register or memory (Google Benchmark's DoNotOptimize, written out).
template <class T>
inline void do_not_optimize(const T& value) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __asm__ __volatile__("" : : "r,m"(value) : "memory");
#else
  static_cast<void>(value);
#endif
}

// Where the measured limits are reported as they are taken ("machine: …" lines): stderr, or
// nowhere once set to null.
inline std::FILE*& limits_log() noexcept {
  static std::FILE* log = stderr;
  return log;
}
inline void log_limit(const std::string& what, double value, const char* unit) {
  if (limits_log() != nullptr)
    std::fputs(("machine: " + what + ": " + phasekv::detail::fixed(value, 1) + " " + unit + "\n").c_str(), limits_log());
}

inline double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline double read_bandwidth() {
  using batch = xsimd::batch<float>;
  constexpr std::size_t lanes = batch::size;
  static std::vector<float, xsimd::aligned_allocator<float>> buffer(std::size_t{64} << 20, 1.0f);  // 256 MiB
  static double best = 0.0;
  const std::size_t quarter = buffer.size() / 4;
  const double before = best;
  for (int pass = 0; pass < 8; ++pass) {
    batch a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f), a4(0.0f), a5(0.0f), a6(0.0f), a7(0.0f);
    const float* p0 = buffer.data();
    const float *p1 = p0 + quarter, *p2 = p1 + quarter, *p3 = p2 + quarter;
    const double t0 = thread_seconds();
    for (std::size_t k = 0; k < quarter; k += 2 * lanes) {
      a0 += batch::load_aligned(p0 + k);
      a1 += batch::load_aligned(p0 + k + lanes);
      a2 += batch::load_aligned(p1 + k);
      a3 += batch::load_aligned(p1 + k + lanes);
      a4 += batch::load_aligned(p2 + k);
      a5 += batch::load_aligned(p2 + k + lanes);
      a6 += batch::load_aligned(p3 + k);
      a7 += batch::load_aligned(p3 + k + lanes);
    }
    const double seconds = thread_seconds() - t0;
    const batch sum = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
    do_not_optimize(sum);
    best = std::max(best, static_cast<double>(buffer.size() * sizeof(float)) / seconds);
  }
  if (best > before) log_limit("main-memory read bandwidth of one core, best so far", best * 1e-9, "GB/s");
  return best;
}

inline double fma_peak() {
  static const double peak = [] {
    using batch = xsimd::batch<float>;
    constexpr std::int64_t steps = 4'000'000;
    const batch x(0.999999f), y(1e-7f);
    double best = 0.0;
    for (int pass = 0; pass < 5; ++pass) {
      batch a0(1.0f), a1(1.1f), a2(1.2f), a3(1.3f), a4(1.4f), a5(1.5f), a6(1.6f), a7(1.7f), a8(1.8f), a9(1.9f),
          a10(2.0f), a11(2.1f);
      const double t0 = thread_seconds();
      for (std::int64_t i = 0; i < steps; ++i) {
        a0 = xsimd::fma(a0, x, y), a1 = xsimd::fma(a1, x, y), a2 = xsimd::fma(a2, x, y), a3 = xsimd::fma(a3, x, y);
        a4 = xsimd::fma(a4, x, y), a5 = xsimd::fma(a5, x, y), a6 = xsimd::fma(a6, x, y), a7 = xsimd::fma(a7, x, y);
        a8 = xsimd::fma(a8, x, y), a9 = xsimd::fma(a9, x, y), a10 = xsimd::fma(a10, x, y), a11 = xsimd::fma(a11, x, y);
      }
      const double seconds = thread_seconds() - t0;
      const batch sum = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + ((a8 + a9) + (a10 + a11));
      do_not_optimize(sum);
      best = std::max(best, 12.0 * 2.0 * static_cast<double>(batch::size) * static_cast<double>(steps) / seconds);
    }
    log_limit("fp32 FMA peak of one core (" + std::to_string(batch::size) + " lanes), measured", best * 1e-9, "GFLOP/s");
    return best;
  }();
  return peak;
}

inline double bf16_dot_peak() {
#if PHASEKV_HAS_BF16_DOT
  static const double peak = [] {
    constexpr std::int64_t steps = 4'000'000;
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3F803F80), y = (__m512bh)_mm512_set1_epi32(0x33D633D6);
    double best = 0.0;
    for (int pass = 0; pass < 5; ++pass) {
      // Twelve different starts, as for the int8 peak: equal chains are merged into one by the
      // compiler (with equal starts this loop ran one vdpbf16ps a step and counted twelve).
      __m512 a0 = _mm512_set1_ps(1.0f), a1 = _mm512_set1_ps(1.1f), a2 = _mm512_set1_ps(1.2f), a3 = _mm512_set1_ps(1.3f),
             a4 = _mm512_set1_ps(1.4f), a5 = _mm512_set1_ps(1.5f), a6 = _mm512_set1_ps(1.6f), a7 = _mm512_set1_ps(1.7f),
             a8 = _mm512_set1_ps(1.8f), a9 = _mm512_set1_ps(1.9f), a10 = _mm512_set1_ps(2.0f), a11 = _mm512_set1_ps(2.1f);
      const double t0 = thread_seconds();
      for (std::int64_t i = 0; i < steps; ++i) {
        a0 = _mm512_dpbf16_ps(a0, x, y), a1 = _mm512_dpbf16_ps(a1, x, y), a2 = _mm512_dpbf16_ps(a2, x, y);
        a3 = _mm512_dpbf16_ps(a3, x, y), a4 = _mm512_dpbf16_ps(a4, x, y), a5 = _mm512_dpbf16_ps(a5, x, y);
        a6 = _mm512_dpbf16_ps(a6, x, y), a7 = _mm512_dpbf16_ps(a7, x, y), a8 = _mm512_dpbf16_ps(a8, x, y);
        a9 = _mm512_dpbf16_ps(a9, x, y), a10 = _mm512_dpbf16_ps(a10, x, y), a11 = _mm512_dpbf16_ps(a11, x, y);
      }
      const double seconds = thread_seconds() - t0;
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                       _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                                     _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
      do_not_optimize(sum);
      best = std::max(best, 12.0 * 4.0 * 16.0 * static_cast<double>(steps) / seconds);
    }
    log_limit("bf16 dot-product peak of one core, measured", best * 1e-9, "GFLOP/s");
    return best;
  }();
  return peak;
#else
  return fma_peak();
#endif
}

inline double int8_dot_peak() {
#if PHASEKV_HAS_INT8_DOT
  // As the kernel issues it (inline assembly): GCC 12's intrinsic copies each accumulator
  // through another register around every instruction, which can cost the loop its peak.
  using phasekv::kernels::dpbusd;
  static const double peak = [] {
    constexpr std::int64_t steps = 4'000'000;
    const __m512i x = _mm512_set1_epi32(0x01020304), y = _mm512_set1_epi32(0x01FF01FF);  // −2 a step: no overflow
    double best = 0.0;
    for (int pass = 0; pass < 5; ++pass) {
      // Twelve different starts: chains that start equal are one chain to the compiler (it merges
      // identical computations), which would time one instruction per step and count twelve.
      __m512i a0 = _mm512_set1_epi32(1), a1 = _mm512_set1_epi32(2), a2 = _mm512_set1_epi32(3),
              a3 = _mm512_set1_epi32(4), a4 = _mm512_set1_epi32(5), a5 = _mm512_set1_epi32(6),
              a6 = _mm512_set1_epi32(7), a7 = _mm512_set1_epi32(8), a8 = _mm512_set1_epi32(9),
              a9 = _mm512_set1_epi32(10), a10 = _mm512_set1_epi32(11), a11 = _mm512_set1_epi32(12);
      const double t0 = thread_seconds();
      for (std::int64_t i = 0; i < steps; ++i) {
        a0 = dpbusd(a0, x, y), a1 = dpbusd(a1, x, y), a2 = dpbusd(a2, x, y), a3 = dpbusd(a3, x, y);
        a4 = dpbusd(a4, x, y), a5 = dpbusd(a5, x, y), a6 = dpbusd(a6, x, y), a7 = dpbusd(a7, x, y);
        a8 = dpbusd(a8, x, y), a9 = dpbusd(a9, x, y), a10 = dpbusd(a10, x, y), a11 = dpbusd(a11, x, y);
      }
      const double seconds = thread_seconds() - t0;
      const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                           _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)),
                                                            _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11))));
      do_not_optimize(sum);
      best = std::max(best, 12.0 * 2.0 * 64.0 * static_cast<double>(steps) / seconds);
    }
    log_limit("int8 dot-product peak of one core, measured", best * 1e-9, "GOP/s");
    return best;
  }();
  return peak;
#else
  return fma_peak();
#endif
}

// The least time a kernel moving `bytes` to or from memory and doing `flops` in fp32,
// `bf16_flops` in bf16 dot products and `int8_ops` in int8 dot products can take on one core.
struct roofline {
  double bytes = 0.0;
  double flops = 0.0;
  double bf16_flops = 0.0;
  double int8_ops = 0.0;

  // The compute side alone: each kind of work at its peak.
  double compute_seconds() const {
    return flops / fma_peak() + (bf16_flops > 0.0 ? bf16_flops / bf16_dot_peak() : 0.0) +
           (int8_ops > 0.0 ? int8_ops / int8_dot_peak() : 0.0);
  }
  double floor_seconds() const { return std::max(bytes / read_bandwidth(), compute_seconds()); }
};

}  // namespace phasekv::bench
