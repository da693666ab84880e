// Write-path throughput: tokens per second through each pooling policy at 512 channels and one
// KV head (S=4, W=8, per-branch inputs), and through the DeepSeek-V4 CSA preset — as a prefill
// (one 4096-token chunk) and as decode (one token per append).
//
// Each benchmark also reports `of_read_bw`: the fraction of this machine's main-memory read
// bandwidth it reaches, counting the payload and logit bytes it must read. The bandwidth is
// measured once, in the same run, with a plain streaming sum over a 256 MiB buffer.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include <phasekv/phasekv.hpp>

namespace {

using namespace phasekv;

constexpr std::int64_t kChannels = 512;
constexpr std::int64_t kPrefill = 4096;

// Main-memory read bandwidth in bytes/s: best of a few passes of an 8-accumulator sum.
double read_bandwidth() {
  static const double bw = [] {
    std::vector<float> buf(std::size_t{64} << 20, 1.0f);  // 256 MiB
    double best = 0.0;
    for (int pass = 0; pass < 4; ++pass) {
      const auto t0 = std::chrono::steady_clock::now();
      float a[8] = {};
      for (std::size_t k = 0; k < buf.size(); k += 8)
        for (int l = 0; l < 8; ++l) a[l] += buf[k + l];
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      benchmark::DoNotOptimize(a);
      best = std::max(best, static_cast<double>(buf.size() * sizeof(float)) / s);
    }
    return best;
  }();
  return bw;
}

template <class Compressor>
struct fixture {
  Compressor compressor;
  std::vector<float> payload, logits, out;

  explicit fixture(Compressor c, std::int64_t tokens) : compressor(std::move(c)) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    payload.resize(static_cast<std::size_t>(tokens * compressor.payload_floats_per_token()));
    logits.resize(static_cast<std::size_t>(tokens * compressor.logit_floats_per_token()));
    for (float& v : payload) v = normal(rng);
    for (float& v : logits) v = normal(rng);
    out.resize(static_cast<std::size_t>(compressor.floats_per_entry()));
  }
  token_chunk chunk(std::int64_t first, std::int64_t tokens) const {
    return token_chunk{tokens,
                       {payload.data() + first * compressor.payload_floats_per_token(),
                        static_cast<std::size_t>(tokens * compressor.payload_floats_per_token())},
                       {logits.data() + first * compressor.logit_floats_per_token(),
                        static_cast<std::size_t>(tokens * compressor.logit_floats_per_token())}};
  }
  std::size_t bytes_per_token() const {
    return static_cast<std::size_t>(compressor.payload_floats_per_token() + compressor.logit_floats_per_token()) *
           sizeof(float);
  }
};

template <class Compressor>
void report(benchmark::State& state, const fixture<Compressor>& f, std::int64_t tokens) {
  state.SetItemsProcessed(state.iterations() * tokens);
  state.SetBytesProcessed(state.iterations() * tokens * static_cast<std::int64_t>(f.bytes_per_token()));
  state.counters["of_read_bw"] = benchmark::Counter(
      static_cast<double>(f.bytes_per_token()) * static_cast<double>(tokens) / read_bandwidth(),
      benchmark::Counter::kIsIterationInvariantRate);
}

// One prefill of kPrefill tokens per iteration, into a fresh state; entries copied out as a
// cache would store them.
template <class Compressor>
void prefill(benchmark::State& state, Compressor c) {
  fixture<Compressor> f(std::move(c), kPrefill);
  const token_chunk chunk = f.chunk(0, kPrefill);
  for (auto _ : state) {
    stream_state s = f.compressor.make_state();
    f.compressor.append(s, chunk, [&](const entry_view& e) { std::copy_n(e.values, f.out.size(), f.out.data()); });
    benchmark::DoNotOptimize(f.out.data());
  }
  report(state, f, kPrefill);
}

// Token-by-token appends over the same kPrefill tokens.
template <class Compressor>
void decode(benchmark::State& state, Compressor c) {
  fixture<Compressor> f(std::move(c), kPrefill);
  for (auto _ : state) {
    stream_state s = f.compressor.make_state();
    for (std::int64_t t = 0; t < kPrefill; ++t)
      f.compressor.append(s, f.chunk(t, 1), [&](const entry_view& e) { std::copy_n(e.values, f.out.size(), f.out.data()); });
    benchmark::DoNotOptimize(f.out.data());
  }
  report(state, f, kPrefill);
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
  return stream_compressor<presets::deepseek_v4_csa_policy>(presets::deepseek_v4_csa_geometry(),
                                                            presets::deepseek_v4_csa_kv());
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
BENCHMARK_CAPTURE(decode, mean, make<mean>())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(decode, vector_gates, make<vector_gates>())->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(decode, deepseek_v4_csa, dsv4())->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
