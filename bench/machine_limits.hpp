#pragma once
// This machine's limits for the Google Benchmark programs: the one measurement code of
// include/phasekv/testing/machine_limits.hpp (read bandwidth, fp32 FMA, bf16 and int8 dot-product
// peaks of one core, measured in the same run; the roofline floor), which phasekv-bench and
// phasekv::bench::run (testing/bench.hpp) use too, plus the counters a benchmark reports a floor with.

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include <phasekv/testing/machine_limits.hpp>

namespace phasekv::bench {

// Counters for a benchmark: the floor (floor_ms, seconds per iteration) and floor / measured time
// (of_roofline).
inline void report_floor(const roofline& r, benchmark::State& state) {
  const double floor = r.floor_seconds();
  state.counters["floor_ms"] = 1e3 * floor;
  state.counters["of_roofline"] = benchmark::Counter(floor, benchmark::Counter::kIsIterationInvariantRate);
}

// A memcpy of `from` into `to` (both faulted in), timed with the thread's CPU time: the baseline a
// snapshot or restore of the same bytes is reported against (of_memcpy).
inline double memcpy_seconds(const std::vector<std::byte>& from, std::vector<std::byte>& to) {
  const double t0 = thread_seconds();
  std::memcpy(to.data(), from.data(), from.size());
  benchmark::DoNotOptimize(to.data());
  benchmark::ClobberMemory();
  return thread_seconds() - t0;
}

}  // namespace phasekv::bench
