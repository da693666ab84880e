// The paged cache (include/phasekv/cache/paged_cache.hpp) against the write path alone, and the
// cost of fork() against context length. One stream: the DeepSeek-V4 CSA preset (S=4, W=8, 512
// channels, one KV head, vector gates with a per-slot bias, RMSNorm, RoPE after pooling).
//
//   append/prefill   one 4096-token chunk per iteration into a fresh sequence (then freed)
//   append/decode    4096 one-token appends per iteration into a fresh sequence (then freed)
//   write_path/...   the same compressor and inputs with a sink that copies each entry into a
//                    flat fp32 array — what the paged cache adds is the difference
//   fork/ctx/page    fork() + free() of a sequence of `ctx` tokens: O(pages), not O(tokens × channels)
//   deep_copy/ctx    memcpy of that sequence's entries: what a fork that copied them would cost
//   snapshot/ctx     snapshot_into() of a 128K-token sequence in the DeepSeek-V4 CSA decode shape
//                    (decode_workload.hpp: K/V and indexer streams, 128-token window; fp32) into
//                    a reused buffer
//   restore/ctx      restore() of that snapshot into another cache (then freed, untimed)
//
// Counters: `vs_write_path` is the paged cache's token rate divided by the write path's. This
// machine is shared, so the two are measured in pairs: every iteration also runs the write path
// once with the benchmark's timer paused, both timed with steady_clock, and the counter is the
// ratio of the accumulated times (same period, same cache state). For fork: `pages` in the
// sequence, `per_page` = time per page, `entry_MiB` of entries shared instead of copied. For
// snapshot and restore: `of_memcpy` = the time of a memcpy of the same byte count (buffer to
// buffer, both already faulted in) divided by theirs, paired per iteration like vs_write_path,
// with each thread's CPU time; `MiB` of snapshot.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include <phasekv/cache/paged_cache.hpp>
#include <phasekv/cache/snapshot.hpp>
#include <phasekv/models/deepseek_v4.hpp>

#include "decode_workload.hpp"
#include "machine_limits.hpp"

namespace {

using namespace phasekv;

using csa_stream = stream_compressor<presets::deepseek_v4_csa_policy>;
using csa_cache = paged_cache<csa_stream>;

constexpr std::int64_t kBlock = 4096;  // tokens of generated input, reused cyclically for longer contexts

csa_stream make_stream() {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> bias(-1.0f, 1.0f), weight(0.5f, 1.5f);
  const geometry g = presets::deepseek_v4_csa_layer.geom;
  const stream_config c = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
  stream_params p;
  p.slot_bias.resize(static_cast<std::size_t>(c.kv_heads * g.window * c.channels));
  p.norm_weight.resize(static_cast<std::size_t>(c.channels));
  for (float& v : p.slot_bias) v = bias(rng);
  for (float& v : p.norm_weight) v = weight(rng);
  return csa_stream(g, c, std::move(p));
}

// kBlock tokens of payload and gate logits (32 MiB), shared by every benchmark.
struct inputs {
  csa_stream stream = make_stream();
  std::vector<float> payload, logits;

  inputs() {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    payload.resize(static_cast<std::size_t>(kBlock * stream.payload_floats_per_token()));
    logits.resize(static_cast<std::size_t>(kBlock * stream.logit_floats_per_token()));
    for (float& v : payload) v = normal(rng);
    for (float& v : logits) v = normal(rng);
  }
  // Tokens [first, first + n) of the block; first + n ≤ kBlock.
  token_chunk chunk(std::int64_t first, std::int64_t n) const {
    const std::int64_t p = stream.payload_floats_per_token(), l = stream.logit_floats_per_token();
    return token_chunk{n, {payload.data() + first * p, static_cast<std::size_t>(n * p)},
                       {logits.data() + first * l, static_cast<std::size_t>(n * l)}};
  }
  std::int64_t floats_per_entry() const { return stream.floats_per_entry(); }
};

const inputs& shared_inputs() {
  static const inputs in;
  return in;
}

cache_config make_config(std::int64_t page_size, std::int64_t pages, storage_type storage) {
  cache_config c;
  c.name = "bench";
  c.page_size = page_size;
  c.pages = pages;
  c.storage = storage;
  return c;
}

// ---- the write path alone ---------------------------------------------------------------------

// kBlock tokens through a fresh state, each entry copied into a flat fp32 array (the bytes a
// cache must store at least once). decode: one token per append.
struct write_path {
  const inputs& in = shared_inputs();
  std::vector<float> entries = std::vector<float>(static_cast<std::size_t>(kBlock / 4 * in.floats_per_entry()));

  void run(bool decode) {
    stream_state s = in.stream.make_state();
    const auto sink = [&](const entry_view& e) {
      std::memcpy(entries.data() + e.index * in.floats_per_entry(), e.values,
                  static_cast<std::size_t>(in.floats_per_entry()) * sizeof(float));
    };
    if (decode)
      for (std::int64_t t = 0; t < kBlock; ++t) in.stream.append(s, in.chunk(t, 1), sink);
    else
      in.stream.append(s, in.chunk(0, kBlock), sink);
    benchmark::DoNotOptimize(entries.data());
    benchmark::ClobberMemory();
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_write_path(benchmark::State& state, bool decode) {
  write_path w;
  for (auto _ : state) w.run(decode);
  state.SetItemsProcessed(state.iterations() * kBlock);  // tokens
}

// ---- appends through the paged cache ----------------------------------------------------------

void BM_append(benchmark::State& state, bool decode, storage_type storage) {
  const inputs& in = shared_inputs();
  const std::int64_t page_size = 64;
  csa_cache cache(layer_compressor<csa_stream>(in.stream), make_config(page_size, kBlock / 4 / page_size, storage));
  write_path baseline;
  double paged_seconds = 0.0, baseline_seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const sequence_id id = cache.create();
    if (decode)
      for (std::int64_t t = 0; t < kBlock; ++t) cache.append(id, {in.chunk(t, 1)});
    else
      cache.append(id, {in.chunk(0, kBlock)});
    benchmark::DoNotOptimize(cache.pool(0).base());
    benchmark::ClobberMemory();
    cache.free(id);
    paged_seconds += seconds_since(t0);

    state.PauseTiming();
    const auto t1 = std::chrono::steady_clock::now();
    baseline.run(decode);
    baseline_seconds += seconds_since(t1);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kBlock);  // tokens
  state.counters["vs_write_path"] = paged_seconds > 0.0 ? baseline_seconds / paged_seconds : 0.0;
}

// ---- fork against context length ----------------------------------------------------------------

// One prefilled sequence of `tokens` tokens, kept between the calls Google Benchmark makes for
// the same arguments (prefilling 128K tokens takes a while).
struct prefilled {
  std::int64_t tokens, page_size;
  csa_cache cache;
  sequence_id id;

  prefilled(std::int64_t context, std::int64_t page)
      : tokens(context),
        page_size(page),
        cache(layer_compressor<csa_stream>(shared_inputs().stream),
              make_config(page, (context / 4 + page - 1) / page + 1, storage_type::f32)),
        id(cache.create()) {
    for (std::int64_t done = 0; done < tokens; done += kBlock)
      cache.append(id, {shared_inputs().chunk(0, std::min(kBlock, tokens - done))});
  }
};

prefilled& prefilled_for(std::int64_t tokens, std::int64_t page_size) {
  static std::unique_ptr<prefilled> current;
  if (!current || current->tokens != tokens || current->page_size != page_size) {
    current.reset();
    current = std::make_unique<prefilled>(tokens, page_size);
  }
  return *current;
}

void BM_fork(benchmark::State& state) {
  prefilled& p = prefilled_for(state.range(0), state.range(1));
  for (auto _ : state) {
    const sequence_id child = p.cache.fork(p.id);
    benchmark::DoNotOptimize(child);
    p.cache.free(child);
  }
  const auto pages = static_cast<double>(p.cache.page_table(p.id, 0).size());
  state.counters["pages"] = pages;
  state.counters["entry_MiB"] =
      static_cast<double>(p.cache.memory(p.id).entry_bytes) / static_cast<double>(1 << 20);
  state.counters["per_page"] =
      benchmark::Counter(pages, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// What a fork would cost if it copied the entries (tokens/S × 512 fp32 channels).
void BM_deep_copy(benchmark::State& state) {
  const std::int64_t entries = state.range(0) / 4;
  const auto bytes = static_cast<std::size_t>(entries * shared_inputs().floats_per_entry()) * sizeof(float);
  std::vector<char> from(bytes, 1), to(bytes, 0);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::DoNotOptimize(to.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
}

// ---- snapshot and restore against memcpy ----------------------------------------------------------

// The 128K-token sequence of bench_read's decode step, filled once.
bench::sparse_workload& snapshot_workload() {
  static const std::unique_ptr<bench::sparse_workload> w = [] {
    auto p = std::make_unique<bench::sparse_workload>("snapshot", bench::kMaxContext, 64);
    p->fill();
    return p;
  }();
  return *w;
}

void report_of_memcpy(benchmark::State& state, std::size_t bytes, double seconds, double memcpy_total) {
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
  state.counters["MiB"] = static_cast<double>(bytes) / static_cast<double>(1 << 20);
  state.counters["of_memcpy"] = seconds > 0.0 ? memcpy_total / seconds : 0.0;
}

void BM_snapshot(benchmark::State& state) {
  bench::sparse_workload& w = snapshot_workload();
  const std::size_t size = snapshot_size(w.cache, w.seq);
  std::vector<std::byte> buffer(size), scratch(size);  // value-initialised: every page faulted in
  snapshot_into(w.cache, w.seq, buffer);
  double seconds = 0.0, baseline = 0.0;
  for (auto _ : state) {
    const double t0 = bench::thread_seconds();
    snapshot_into(w.cache, w.seq, buffer);
    benchmark::DoNotOptimize(buffer.data());
    benchmark::ClobberMemory();
    seconds += bench::thread_seconds() - t0;
    state.PauseTiming();
    baseline += bench::memcpy_seconds(buffer, scratch);
    state.ResumeTiming();
  }
  report_of_memcpy(state, size, seconds, baseline);
}

void BM_restore(benchmark::State& state) {
  bench::sparse_workload& w = snapshot_workload();
  const std::vector<std::byte> bytes = snapshot(w.cache, w.seq);
  std::vector<std::byte> scratch(bytes.size());
  bench::csa_cache destination(bench::csa_layer(), bench::decode_cache_config("restored", bench::kMaxContext, 64));
  destination.free(restore(destination, bytes));
  double seconds = 0.0, baseline = 0.0;
  for (auto _ : state) {
    const double t0 = bench::thread_seconds();
    const sequence_id id = restore(destination, bytes);
    benchmark::DoNotOptimize(destination.pool(0).base());
    benchmark::ClobberMemory();
    seconds += bench::thread_seconds() - t0;
    state.PauseTiming();
    destination.free(id);
    baseline += bench::memcpy_seconds(bytes, scratch);
    state.ResumeTiming();
  }
  report_of_memcpy(state, bytes.size(), seconds, baseline);
}

}  // namespace

BENCHMARK_CAPTURE(BM_write_path, prefill, false)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_append, prefill_f32, false, storage_type::f32)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_append, prefill_bf16, false, storage_type::bf16)->Unit(benchmark::kMicrosecond)->UseRealTime();
// DeepSeek-V4's FP8 entries (584 bytes each): the quantization is the write path's extra work.
BENCHMARK_CAPTURE(BM_append, prefill_fp8, false, storage_type::fp8_e4m3_block)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_write_path, decode, true)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_append, decode_f32, true, storage_type::f32)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_append, decode_bf16, true, storage_type::bf16)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_fork)
    ->ArgNames({"ctx", "page"})
    ->ArgsProduct({{4096, 16384, 65536, 131072}, {64, 16}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_deep_copy)
    ->ArgName("ctx")
    ->Arg(4096)
    ->Arg(16384)
    ->Arg(65536)
    ->Arg(131072)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

BENCHMARK(BM_snapshot)->ArgName("ctx")->Arg(bench::kMaxContext)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_restore)->ArgName("ctx")->Arg(bench::kMaxContext)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
