// Write-path throughput: tokens per second through each pooling policy at 512 channels and one
// KV head (S=4, W=8, per-branch inputs), and through the DeepSeek-V4 CSA preset — as a prefill
// (one kPrefill-token chunk) and as decode (kDecode tokens, one per append).
//
// Each benchmark also reports `of_bandwidth_bound`: the time the same bytes would take at this
// machine's main-memory read bandwidth, over the time taken — counting what the write path must
// move: the payload and logit bytes it reads and the entry bytes it writes (the sink stores each
// entry at its own place, as a cache would). Writes are priced at the read bandwidth (they are
// 6% of the bytes for gated pooling, 11% for mean). The bandwidth is measured in the same run
// (bench::read_bandwidth(), machine_limits.hpp: four streams over 256 MiB, the best seen so far
// in the run) and shown
// as the read_GBps counter; bytes_per_second counts the same bytes moved.
//
// kPrefill = 32768 tokens so that every policy's input is several times the 32 MiB L3 (gated:
// 8 KiB a token → 256 MiB; mean: 4 KiB → 128 MiB) and each iteration streams it from memory,
// which is the case the bound describes. At 4096 tokens the gated input (32 MiB) straddled the
// L3 and the mean one (16 MiB) fit, so mean pooling reported 1.7× its "bound". Decode keeps
// 4096 tokens: it measures the per-append overhead, and its ratio is for comparison only — an
// engine hands over each token just after computing it, from cache, so no memory bound applies.
//
// prefill_bf16 gives the same prefill its payload and logits as bf16 bits (token_chunk::
// payload_bf16 / logits_bf16), as a DeepSeek-V4 host holds them: half the input bytes, and the
// bound counts those (2 bytes an input element; entries are still written in fp32). Its inputs
// are the fp32 ones rounded to bf16, and its entries are those of the fp32 path on the widened
// values, bit for bit (tests/test_compress_bf16_inputs.cpp), so only the bytes differ.
// prefill_warm and prefill_bf16_warm run the same prefill on kWarm tokens whose inputs stay in
// the caches between iterations: the arithmetic alone, the floor under the prefill from memory
// (their of_bandwidth_bound is for comparison only).
//
// point_* run the same poolings as pooling policies of the host's (examples/pools/builtin_twins.hpp,
// on the built-ins' kernels, bit-identical entries): their time over the built-in's is what the
// extension point costs (run_all: *_point_over_fused_time).

#include <benchmark/benchmark.h>


#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <phasekv/phasekv.hpp>
#include <phasekv/tools/bench.hpp>

#include "../examples/pools/builtin_twins.hpp"
#include "machine_limits.hpp"

namespace {

using namespace phasekv;

constexpr std::int64_t kChannels = 512;
constexpr std::int64_t kPrefill = 32768;
constexpr std::int64_t kDecode = 4096;
constexpr std::int64_t kWarm = 1024;  // DeepSeek-V4 CSA: 8 MiB of fp32 inputs, 4 MiB of bf16

using bench::read_bandwidth;  // tools/machine_limits.hpp: re-measured per call, best so far

// The inputs, the sink and the bytes a pass must move: phasekv::bench::write_fixture
// (tools/bench.hpp), the fixture phasekv-bench measures any stream's write path with.
template <class Compressor>
using fixture = bench::write_fixture<Compressor>;

// `bandwidth`: read_bandwidth() taken before the benchmark ran.
template <class Compressor>
void report(benchmark::State& state, const fixture<Compressor>& f, std::int64_t tokens, double bandwidth) {
  state.SetItemsProcessed(state.iterations() * tokens);
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(f.bytes_moved(tokens)));
  state.counters["of_bandwidth_bound"] =
      benchmark::Counter(f.bytes_moved(tokens) / bandwidth, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["read_GBps"] = bandwidth * 1e-9;
}

// One prefill of kPrefill tokens per iteration, into a fresh state.
template <class Compressor>
void prefill(benchmark::State& state, Compressor c, bool bf16 = false, std::int64_t tokens = kPrefill) {
  const double bandwidth = read_bandwidth();
  fixture<Compressor> f(std::move(c), tokens, bf16);
  for (auto _ : state) f.prefill(tokens);
  report(state, f, tokens, bandwidth);
}

// The same with bf16 payload and logits; and both on inputs that stay in the caches.
template <class Compressor>
void prefill_bf16(benchmark::State& state, Compressor c) {
  prefill(state, std::move(c), true);
}
template <class Compressor>
void prefill_warm(benchmark::State& state, Compressor c) {
  prefill(state, std::move(c), false, kWarm);
}
template <class Compressor>
void prefill_bf16_warm(benchmark::State& state, Compressor c) {
  prefill(state, std::move(c), true, kWarm);
}

// Token-by-token appends of kDecode tokens.
template <class Compressor>
void decode(benchmark::State& state, Compressor c) {
  const double bandwidth = read_bandwidth();
  fixture<Compressor> f(std::move(c), kDecode);
  for (auto _ : state) f.decode(kDecode);
  report(state, f, kDecode, bandwidth);
}

stream_config config(bool rope) {
  stream_config c;
  c.name = "bench";
  c.channels = kChannels;
  c.rope.channels = rope ? 64 : 0;
  return c;
}
const geometry kGeom{4, 8};

stream_params profile() {
  stream_params p;
  p.slot_profile.assign(8, 1.0f);
  return p;
}

template <class Policy>
stream_compressor<Policy> make(bool rope = false, stream_params p = {}) {
  return stream_compressor<Policy>(kGeom, config(rope), std::move(p));
}
stream_compressor<presets::deepseek_v4_csa_policy> dsv4() {
  return stream_compressor<presets::deepseek_v4_csa_policy>(
      presets::deepseek_v4_csa_layer.geom, presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer));
}

// The same poolings through the extension point (examples/pools/builtin_twins.hpp): their
// entries are the built-ins' bit for bit, so these time the point alone.
stream_compressor<compressor_policy<phasekv_examples::mean_twin>> point_mean() {
  return stream_compressor<compressor_policy<phasekv_examples::mean_twin>>(kGeom, config(false));
}
stream_compressor<compressor_policy<phasekv_examples::vector_gated_twin>> point_vector_gates() {
  return stream_compressor<compressor_policy<phasekv_examples::vector_gated_twin>>(
      kGeom, config(false), {}, phasekv_examples::vector_gated_twin(1, kGeom.window, kChannels));
}
using point_dsv4_policy = compressor_policy<phasekv_examples::vector_gated_twin, rope_after_pool, rms_norm>;
stream_compressor<point_dsv4_policy> point_dsv4() {
  const geometry g = presets::deepseek_v4_csa_layer.geom;
  const stream_config c = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
  return stream_compressor<point_dsv4_policy>(g, c, {}, phasekv_examples::vector_gated_twin(c.kv_heads, g.window, c.channels));
}

using mean = compressor_policy<mean_pool>;
using fixed = compressor_policy<fixed_weight_pool>;
using scalar_gates = compressor_policy<scalar_gated_pool>;
using vector_gates = compressor_policy<vector_gated_pool>;
using mean_rope_before = compressor_policy<mean_pool, rope_before_pool>;
using vector_gates_norm_rope_after = compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>;

}  // namespace

BENCHMARK_CAPTURE(prefill, mean, make<mean>())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill, fixed, make<fixed>(false, profile()))->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill, scalar_gates, make<scalar_gates>())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill, vector_gates, make<vector_gates>())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill, mean_rope_before, make<mean_rope_before>(true))->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill, vector_gates_norm_rope_after, make<vector_gates_norm_rope_after>(true))
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill, deepseek_v4_csa, dsv4())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill_bf16, deepseek_v4_csa, dsv4())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill_warm, deepseek_v4_csa, dsv4())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill_bf16_warm, deepseek_v4_csa, dsv4())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill, point_mean, point_mean())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill, point_vector_gates, point_vector_gates())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill, point_deepseek_v4_csa, point_dsv4())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill_bf16, point_deepseek_v4_csa, point_dsv4())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(prefill_warm, point_deepseek_v4_csa, point_dsv4())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(decode, mean, make<mean>())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(decode, vector_gates, make<vector_gates>())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(decode, deepseek_v4_csa, dsv4())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(decode, point_deepseek_v4_csa, point_dsv4())->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  char gbps[32];
  std::snprintf(gbps, sizeof gbps, "%.1f", read_bandwidth() * 1e-9);
  benchmark::AddCustomContext("main_memory_read_GBps_at_start", gbps);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
