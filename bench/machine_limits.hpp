#pragma once
// This machine's limits for the Google Benchmark programs: the one measurement code of
// include/phasekv/tools/machine_limits.hpp (read bandwidth, fp32 FMA, bf16 and int8 dot-product
// peaks of one core, measured in the same run; the roofline floor), which phasekv-bench and
// phasekv::bench::run (tools/bench.hpp) use too, plus the counters a benchmark reports a floor with
// and the paired in-run ratios the benchmarks share.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include <phasekv/tools/machine_limits.hpp>

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

// Wall-clock seconds (for work spread over several threads; thread_seconds() otherwise).
inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The baseline's time over the candidate's, on `clock` (seconds): in each of 9 rounds each is
// timed once, right after prepare(it) (untimed); the median of the rounds' ratios, which the
// machine's drift moves little.
template <class Clock, class Prepare, class Baseline, class Candidate>
double paired_rounds(Clock clock, Prepare&& prepare, Baseline&& baseline, Candidate&& candidate) {
  std::vector<double> ratios;
  for (int round = 0; round < 9; ++round) {
    prepare(baseline);
    double t0 = clock();
    baseline();
    const double base = clock() - t0;
    prepare(candidate);
    t0 = clock();
    candidate();
    ratios.push_back(base / (clock() - t0));
  }
  return median(ratios);
}

// paired_rounds, each side run once untimed right before its timed run (which brings its data in).
template <class Clock, class Baseline, class Candidate>
double paired_speedup(Clock clock, Baseline&& baseline, Candidate&& candidate) {
  return paired_rounds(clock, [](auto& run) { run(); }, baseline, candidate);
}

}  // namespace phasekv::bench
