// One decode step of the read path in the DeepSeek-V4-Flash CSA shape: 64 query heads
// over 1 KV head of 512 tied K/V channels, lightning indexer of 64 heads × 128 channels, top-k
// 512, 128-token raw window, attention sink, S=4, W=8 — against a dense full-attention decode
// step over the raw uncompressed fp32 cache of the same context, both single-threaded.
//
//   BM_dense_decode/ctx/cold        flash-decode style baseline: blocks of kDenseBlock keys through
//                                   the reader's attention kernel, merged by an online softmax
//                                   (decode_workload.hpp). Reports its FLOP rate against this
//                                   machine's FMA peak measured in the same run (of_fma_peak).
//   BM_sparse_decode/ctx/page/cold  sparse_reader::read at position ctx − 1.
//                                   dense_over_sparse: the dense step's time over this step's,
//                                   measured back to back (see paired_ratio).
//                                   peak_dense_over_sparse: the same against a dense step running
//                                   at the measured FMA peak — a bound no dense kernel beats.
//                                   floor_ms / of_roofline: the step's roofline floor (indexer
//                                   keys, selected entries and window read at the measured
//                                   bandwidth, or its FLOPs at the FMA peak, whichever is longer;
//                                   machine_limits.hpp) and floor / time.
//   BM_sparse_decode_threads/ctx/threads  the same step through openmp_executor, wall time;
//                                   speedup = one thread's wall time over this, paired in-run.
//   BM_sparse_decode_bf16_indexer/ctx  the step with the indexer keys stored and scored in bf16
//                                   (reader_config::precision); fp32_over_bf16: the fp32 step's
//                                   time over this one's, paired in-run; its floor prices the
//                                   indexer at the measured bf16 dot-product peak.
//   BM_sparse_decode_fp8/ctx/cold   the step with the K/V entries stored as FP8 (fp8_e4m3_block:
//                                   584 bytes per entry instead of 2048, dequantized inside the
//                                   attention kernel); fp32_over_fp8: the fp32 step's time over
//                                   this one's, paired in-run (cold: caches evicted before each
//                                   timed step); attention_fp32_over_fp8: the same for reads
//                                   without selection of 2048-token caches (512 entries + the
//                                   window: the attention kernel alone); rel_error_vs_fp32: the output's
//                                   largest difference from the fp32 step's, relative to its
//                                   largest value (the FP8 rounding; the selection is the same,
//                                   checked). Its floor reads the selected entries' 584 bytes each.
//   BM_sparse_decode_v4_precision/ctx/cold  the step at DeepSeek-V4's precision: FP8 K/V entries and
//                                   the FP4 indexer (fp4_e2m1_hadamard keys, 68 bytes each instead
//                                   of 512; queries Hadamard-transformed and quantized per read;
//                                   exact int8 dot products, AVX-512 VNNI). fp32_over_v4: the fp32
//                                   step's time over this one's, paired in-run; same_selection:
//                                   the share of the fp32 step's selection it also selects (FP4
//                                   reorders near ties); indexer_bytes_per_token: 17; indexer_ms /
//                                   indexer_of_int8_peak: the FP4 scoring of every candidate alone
//                                   (the kernel page by page, warm) and its int8 floor over that
//                                   time. Its floor: the selected entries' 584 bytes and every
//                                   candidate's 68, the indexer's multiply-adds at the measured int8
//                                   dot-product peak, attention at the FMA peak.
//   BM_batched_decode               sparse_reader::read_batch over 32 sequences of 32K tokens in
//                                   the same shape, 16 of them forked from one shared 16K prefix
//                                   (batch_setup): of_roofline against the sum of the sequences'
//                                   floors (a shared page counts once per sequence that reads it);
//                                   singles_over_batch: 32 single reads' time over the batch's, paired
//                                   (each single read writes to its sequence's slot of the batch's
//                                   output, as the batch does; one reused buffer would stay in the
//                                   L2 while the batch writes 32 to memory).
//   BM_batched_decode_threads/threads:2  the same batch through openmp_executor(2), wall time;
//                                   speedup over one thread, paired in-run; of_two_core_roofline.
//   BM_batch_of_one                 one 32K sequence through read_batch (view_of included);
//                                   single_over_batch1: read(cache, seq)'s time over this, paired.
//   BM_batch_overhead               32 sequences of 4K tokens: one read_batch against 32 single
//                                   reads into the same output slots, paired; overhead_of_4k_read =
//                                   batch / singles − 1, the batch API's cost per sequence as a
//                                   fraction of a 4K read.
//   BM_decode_step                  an engine's decode step of one layer at DeepSeek-V4's precision
//                                   (FP8 K/V entries and window, FP4 indexer): the batch's 32
//                                   sequences (32K tokens, 16 forked as above) each get one new
//                                   token (append_batch), then each is read at it (read_batch):
//                                   of_roofline against the reads' floors plus the new tokens'
//                                   inputs and stored bytes (step_setup::floor); append_ms and
//                                   read_ms: each part alone (median of 9).
//   BM_decode_step_threads/threads:2  the same step with the appends and the reads through one
//                                   openmp_executor(2), wall time; speedup over one thread, paired
//                                   in-run; of_two_core_roofline.
//   BM_host_indices/ctx             a read of host-selected entries (read_request::indices, the
//                                   reader's own selection) against the attention part of the
//                                   reader's read (its time less entry_selector::select's), paired
//                                   in-run: host_over_attention; bit-identical outputs checked.
//   BM_selection/ctx/page           indexer scores + top-k alone (entry_selector::select);
//                                   per_entry constant across contexts = selection linear in n;
//                                   of_roofline against the indexer's own floor.
//   BM_top_k/ctx                    select_top_k alone, on those scores.
//
// cold = 1 evicts the caches (a 64 MiB walk, untimed) before every step: in a real decode step the
// other layers run in between, so a layer's cache is not in L2/L3 when it is read again. cold = 0
// reads the same cache again and again (warm L3 up to about 32 MiB of touched data).
//
// Times are CPU time of the one benchmark thread: the machine is shared and noisy (others compile
// on both cores), and wall time would count the time others hold the core. The in-run ratios use
// this thread's CPU clock too. Run with --benchmark_min_time=0.3 or more.
//
// Setup (untimed, once per context and page size, well under a second each) appends ctx tokens
// through the compressor in blocks of kBlock tokens, as sparse_workload::fill() in
// decode_workload.hpp describes: that header holds the shape, the inputs and the dense baseline,
// shared with peer/peer_dump.cpp so the PyTorch peer recomputes these very numbers. Setup also
// checks, once: the dense baseline against plain attention in double; the sparse read (ctx ≤ 16K)
// against plain attention in double over the entries it selected, the window and the sink; its
// output finite; and the selection stage's choice against the reader's own. A failed check
// skips the benchmarks.

#include <benchmark/benchmark.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <xsimd/xsimd.hpp>

#include <phasekv/phasekv.hpp>

#include "decode_workload.hpp"
#include "machine_limits.hpp"

namespace {

using namespace phasekv;
using namespace bench;  // decode_workload.hpp: the shape, the generator, the workloads

const std::vector<std::int64_t> kContexts = {4096, 16384, 65536, 131072};

// ---- limits and cache state, measured in this run -------------------------------------------

// Touches 64 MiB (twice the L3) one cache line at a time, so what a step reads next comes from memory.
void evict_caches() {
  static std::vector<float> buffer(std::size_t{16} << 20, 1.0f);
  float sum = 0.0f;
  for (std::size_t i = 0; i < buffer.size(); i += 16) sum += buffer[i];
  benchmark::DoNotOptimize(sum);
}

// ---- the dense baseline ----------------------------------------------------------------------

// dense_decoder (decode_workload.hpp) over a raw fp32 cache of kMaxContext tokens (tied K/V); a
// context of n tokens reads its first n.
dense_workload& dense() {
  static dense_workload d(kMaxContext);
  return d;
}

// Plain softmax attention in double over the given keys (rows of `kv`, tied K/V), with the sink.
std::vector<double> reference_attention(const float* queries, const std::vector<const float*>& kv, const float* sinks,
                                        std::int64_t heads, std::int64_t channels, double scale) {
  std::vector<double> out(static_cast<std::size_t>(heads * channels), 0.0), logits(kv.size());
  for (std::int64_t h = 0; h < heads; ++h) {
    double m = sinks[h];
    for (std::size_t i = 0; i < kv.size(); ++i) {
      double dot = 0.0;
      for (std::int64_t c = 0; c < channels; ++c) dot += static_cast<double>(queries[h * channels + c]) * kv[i][c];
      logits[i] = scale * dot;
      m = std::max(m, logits[i]);
    }
    double den = std::exp(sinks[h] - m);
    for (std::size_t i = 0; i < kv.size(); ++i) den += (logits[i] = std::exp(logits[i] - m));
    for (std::size_t i = 0; i < kv.size(); ++i)
      for (std::int64_t c = 0; c < channels; ++c) out[static_cast<std::size_t>(h * channels + c)] += logits[i] / den * kv[i][c];
  }
  return out;
}

// Largest |a − b| relative to max(1, max |b|).
double max_error(const float* a, const std::vector<double>& b) {
  double err = 0.0, scale = 1.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return err / scale;
}

// The dense baseline against the reference at 256 tokens (half a block) and 1280 (2.5 blocks).
const std::string& dense_check() {
  static const std::string error = [] {
    dense_workload& d = dense();
    for (std::int64_t tokens : {256, 1280}) {
      std::vector<const float*> rows;
      for (std::int64_t i = 0; i < tokens; ++i) rows.push_back(d.kv.data() + i * kChannels);
      const auto expected = reference_attention(d.queries.data(), rows, d.sinks.data(), kQueryHeads, kChannels,
                                                1.0 / std::sqrt(static_cast<double>(kChannels)));
      d.step(tokens);
      const double err = max_error(d.out.data(), expected);
      std::fprintf(stderr, "bench_read: dense baseline vs double reference at %lld tokens: max error %.2e\n",
                   static_cast<long long>(tokens), err);
      if (!(err <= 1e-4)) return "dense baseline differs from the reference by " + std::to_string(err);
    }
    return std::string();
  }();
  return error;
}

// ---- the sparse read -------------------------------------------------------------------------

// The benchmarked step (decode_workload.hpp) plus its checks: a failed check skips the benchmarks.
struct sparse_setup : sparse_workload {
  std::int64_t candidates = 0;
  entry_selector selector{cache, selection_of(reader.config())};  // the reader's selection stage alone
  std::vector<std::int32_t> selected = std::vector<std::int32_t>(static_cast<std::size_t>(kTopK));
  std::vector<float> scores;                                        // BM_top_k's input
  std::vector<scored_entry> top;
  std::string error;  // a failed check, reported by the benchmarks instead of timing wrong work

  sparse_setup(std::int64_t context, std::int64_t page) : sparse_workload("bench_read", context, page) {
    const double t0 = thread_seconds();
    fill();
    candidates = cache.compressors().geom().visible_entries(tokens - 1);
    check();
    std::fprintf(stderr, "bench_read: setup ctx=%lld page=%lld: %lld entries, %.2f s\n", static_cast<long long>(tokens),
                 static_cast<long long>(page_size), static_cast<long long>(candidates), thread_seconds() - t0);
  }

  selection_request selection() const {
    return {tokens - 1, span<const float>(indexer_queries), span<const float>(indexer_weights), kTopK};
  }
  std::int64_t select() { return selector.select(cache, seq, selection(), span<std::int32_t>(selected)); }

 private:
  // The reader's output against plain attention in double over the entries it selected, the window
  // and the sink (then de-rotated), and the selection stage's choice against the reader's.
  void check() {
    read_trace trace;
    reader.read(cache, seq, request(), out.data(), &trace);
    const std::int64_t n = select();
    bool same = n == static_cast<std::int64_t>(trace.selected.size());
    for (std::size_t i = 0; same && i < trace.selected.size(); ++i) same = selected[i] == trace.selected[i];
    if (!same) error = "entry_selector does not select the entries the reader selects";
    scores.resize(static_cast<std::size_t>(candidates));
    selector.score(cache, seq, selection(), scores);
    if (trace.candidates != candidates || static_cast<std::int64_t>(trace.selected.size()) != std::min(kTopK, candidates))
      error = "reader saw " + std::to_string(trace.candidates) + " candidates and selected " +
              std::to_string(trace.selected.size());
    for (float v : out)
      if (!std::isfinite(v)) error = "sparse output is not finite";
    if (tokens > 16384) return;  // the double reference is slow; the small contexts cover the maths

    std::vector<std::vector<float>> entries(trace.selected.size(), std::vector<float>(kChannels));
    std::vector<const float*> rows;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      cache.read_entry(seq, 0, trace.selected[i], entries[i].data());
      rows.push_back(entries[i].data());
    }
    std::vector<std::vector<float>> window;  // the values the window rows hold (FP8 rows dequantized)
    for (std::int64_t t = trace.window_first; t < tokens; ++t) {
      window.emplace_back(static_cast<std::size_t>(kChannels));
      cache.copy_window_key(seq, t, span<float>(window.back().data(), window.back().size()));
    }
    for (const std::vector<float>& row : window) rows.push_back(row.data());
    auto expected = reference_attention(queries.data(), rows, sinks.data(), kQueryHeads, kChannels,
                                        1.0 / std::sqrt(static_cast<double>(kChannels)));
    // De-rotate the RoPE channels by the query position, in double from the float angles the reader uses.
    const rope_rotation rope(presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer).rope, kChannels);
    std::vector<float> cos(static_cast<std::size_t>(rope.pairs())), sin(cos.size());
    rope.angles(static_cast<double>(tokens - 1), cos.data(), sin.data());
    for (std::int64_t h = 0; h < kQueryHeads; ++h)
      for (std::int64_t k = 0; k < rope.pairs(); ++k) {
        double& a = expected[static_cast<std::size_t>(h * kChannels + kChannels - rope.rotated_channels() + 2 * k)];
        double& b = *(&a + 1);
        const double c = cos[static_cast<std::size_t>(k)], s = -sin[static_cast<std::size_t>(k)];
        const double a0 = a, b0 = b;
        a = a0 * c - b0 * s;
        b = a0 * s + b0 * c;
      }
    const double err = max_error(out.data(), expected);
    std::fprintf(stderr, "bench_read: sparse read vs double reference at ctx=%lld page=%lld: max error %.2e\n",
                 static_cast<long long>(tokens), static_cast<long long>(page_size), err);
    if (!(err <= 1e-4)) error = "sparse read differs from the reference by " + std::to_string(err);
    check_selection(trace);
  }

  // The selection against indexer scores in double: every selected entry scores at least the k-th
  // best double score, less a rounding allowance (fp32 may swap near-ties at the boundary).
  void check_selection(const read_trace& trace) {
    std::vector<double> exact(static_cast<std::size_t>(candidates));
    std::vector<float> key(static_cast<std::size_t>(kIndexerChannels));
    for (std::int64_t j = 0; j < candidates; ++j) {
      cache.read_entry(seq, 1, j, key.data());
      double score = 0.0;
      for (std::int64_t h = 0; h < kIndexerHeads; ++h) {
        double dot = 0.0;
        for (std::int64_t c = 0; c < kIndexerChannels; ++c)
          dot += static_cast<double>(indexer_queries[static_cast<std::size_t>(h * kIndexerChannels + c)]) * key[c];
        score += indexer_weights[static_cast<std::size_t>(h)] * std::max(0.0, dot);
      }
      exact[static_cast<std::size_t>(j)] = score;
    }
    std::vector<double> sorted = exact;
    const std::int64_t k = std::min(kTopK, candidates);
    std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[static_cast<std::size_t>(k - 1)];
    for (std::int64_t j : trace.selected)
      if (exact[static_cast<std::size_t>(j)] < kth - 1e-5 * std::max(1.0, std::abs(kth)))
        error = "entry " + std::to_string(j) + " was selected but is not among the top " + std::to_string(k) +
                " by the double-precision indexer score";
  }
};

sparse_setup& sparse(std::int64_t tokens, std::int64_t page_size) {
  static std::map<std::pair<std::int64_t, std::int64_t>, std::unique_ptr<sparse_setup>> setups;
  auto& s = setups[{tokens, page_size}];
  if (!s) s = std::make_unique<sparse_setup>(tokens, page_size);
  return *s;
}

// ---- the in-run ratio --------------------------------------------------------------------------

// Warm: paired_speedup on this thread's clock. Cold: paired_rounds with the caches evicted before
// each timed run.
template <class Baseline, class Candidate>
double paired_step_speedup(bool cold, Baseline&& baseline, Candidate&& candidate) {
  if (!cold) return paired_speedup(thread_seconds, baseline, candidate);
  return paired_rounds(thread_seconds, [](auto&) { evict_caches(); }, baseline, candidate);
}

// Dense step time over sparse step time, measured back to back: each round times one dense step and
// then the mean of a few sparse steps on this thread's CPU clock, and the ratio is the median over
// rounds of the per-round ratios, so a change of load on the shared machine hits both sides of a
// ratio alike. Warm: each side runs once untimed first. Cold: caches evicted before every timed step.
double paired_ratio(std::int64_t tokens, std::int64_t page_size, bool cold) {
  static std::map<std::tuple<std::int64_t, std::int64_t, bool>, double> ratios;
  auto found = ratios.find({tokens, page_size, cold});
  if (found != ratios.end()) return found->second;
  dense_workload& d = dense();
  sparse_setup& s = sparse(tokens, page_size);
  const int rounds = tokens >= 65536 ? 5 : 9, sparse_steps = 4;
  std::vector<double> per_round;
  for (int r = 0; r < rounds; ++r) {
    if (cold) evict_caches();
    else d.step(tokens);
    double t0 = thread_seconds();
    d.step(tokens);
    const double dense_time = thread_seconds() - t0;
    double sparse_time = 0.0;
    if (!cold) s.step();
    for (int i = 0; i < sparse_steps; ++i) {
      if (cold) evict_caches();
      t0 = thread_seconds();
      s.step();
      sparse_time += thread_seconds() - t0;
    }
    per_round.push_back(dense_time / (sparse_time / sparse_steps));
  }
  return ratios[{tokens, page_size, cold}] = median(per_round);
}

// ---- benchmarks --------------------------------------------------------------------------------

// FLOPs of one dense step over `tokens` keys: Q·Kᵀ and P·V.
double dense_flops(std::int64_t tokens) { return 2.0 * 2.0 * kQueryHeads * kChannels * static_cast<double>(tokens); }

// Untimed cache eviction between steps for the cold variants.
template <class Step>
void run_steps(benchmark::State& state, bool cold, Step&& step) {
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      evict_caches();
      state.ResumeTiming();
    }
    step();
    benchmark::ClobberMemory();
  }
}

void BM_dense_decode(benchmark::State& state) {
  const std::int64_t tokens = state.range(0);
  const bool cold = state.range(1) != 0;
  if (!dense_check().empty()) return state.SkipWithError(dense_check().c_str());
  dense_workload& d = dense();
  run_steps(state, cold, [&] { d.step(tokens); });
  benchmark::DoNotOptimize(d.out.data());
  const double flops = dense_flops(tokens);
  state.counters["flops"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["of_fma_peak"] = benchmark::Counter(flops / fma_peak(), benchmark::Counter::kIsIterationInvariantRate);
  report_floor(bench::roofline{4.0 * static_cast<double>(tokens) * kChannels, flops}, state);
}



// The roofline floor of one sparse step (phasekv::bench::read_cost, tools/bench.hpp — the floor
// phasekv-bench reports): it must read every candidate's indexer key, the selected entries and the
// window rows, and do the indexer's and the attention's multiply-adds.
// With bf16 indexer keys: half their bytes, and the indexer's multiply-adds at the bf16 peak.
// With FP8 entries: 584 bytes per selected entry and per window row (both stored as FP8).
// With FP4 indexer keys: 68 bytes per key, and the indexer's multiply-adds at the int8 peak.
bench::roofline sparse_roofline(std::int64_t candidates, bool bf16_indexer = false, bool fp8_entries = false,
                                bool fp4_indexer = false) {
  read_cost c;
  c.query_heads = kQueryHeads;
  c.key_channels = c.value_channels = kChannels;
  c.top_k = kTopK;
  c.window_tokens = kWindow;
  // The window rows as stored: FP8 with the FP8 entries (decode_cache_config), fp32 otherwise.
  c.window_row_bytes = fp8_entries ? static_cast<double>(fp8_head_layout::of(kChannels, 64).bytes) : 4.0 * kChannels;
  c.indexer_heads = kIndexerHeads;
  c.indexer_channels = kIndexerChannels;
  c.entry_bytes = fp8_entries ? static_cast<double>(fp8_head_layout::of(kChannels, 64).bytes) : 4.0 * kChannels;
  c.indexer_key_bytes = fp4_indexer    ? static_cast<double>(fp4_head_layout::of(kIndexerChannels).bytes)
                        : bf16_indexer ? 2.0 * kIndexerChannels
                                       : 4.0 * kIndexerChannels;
  c.precision = fp4_indexer ? indexer_precision::fp4 : bf16_indexer ? indexer_precision::bf16 : indexer_precision::f32;
  return c.floor(candidates);
}

void BM_sparse_decode(benchmark::State& state) {
  const std::int64_t tokens = state.range(0), page_size = state.range(1);
  const bool cold = state.range(2) != 0;
  sparse_setup& s = sparse(tokens, page_size);
  if (!s.error.empty()) return state.SkipWithError(s.error.c_str());
  if (!dense_check().empty()) return state.SkipWithError(dense_check().c_str());
  const double ratio = paired_ratio(tokens, page_size, cold);
  run_steps(state, cold, [&] { s.step(); });
  benchmark::DoNotOptimize(s.out.data());
  state.counters["entries"] = static_cast<double>(s.candidates);
  state.counters["dense_over_sparse"] = ratio;
  // The same ratio against a dense step that ran at the measured FMA peak: a bound no dense kernel beats.
  state.counters["peak_dense_over_sparse"] =
      benchmark::Counter(dense_flops(tokens) / fma_peak(), benchmark::Counter::kIsIterationInvariantRate);
  report_floor(sparse_roofline(s.candidates), state);
}

// The same step on `threads` threads through the OpenMP executor (wall time: the work is spread
// over cores). speedup: one-thread wall time over this one, measured back to back in rounds, the
// median of the per-round ratios (as paired_ratio).
void BM_sparse_decode_threads(benchmark::State& state) {
  const std::int64_t tokens = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  sparse_setup& s = sparse(tokens, 64);
  if (!s.error.empty()) return state.SkipWithError(s.error.c_str());
  openmp_executor pool(threads);
  if (pool.concurrency() < threads) return state.SkipWithError("built without OpenMP: the executor is serial");
  sparse_reader parallel(s.cache, decode_reader_config("bench_read"));
  parallel.set_executor(pool);
  std::vector<float> out(s.out.size());
  auto wall = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  const double speedup = paired_speedup(wall, [&] { s.step(); }, [&] { parallel.read(s.cache, s.seq, s.request(), out.data()); });
  if (std::memcmp(out.data(), s.out.data(), out.size() * sizeof(float)) != 0)
    return state.SkipWithError("the threaded read differs from the serial one");
  for (auto _ : state) {
    parallel.read(s.cache, s.seq, s.request(), out.data());
    benchmark::ClobberMemory();
  }
  state.counters["speedup"] = speedup;
}

// The filled workload of `tokens` a benchmark keeps between its runs, built from `args` on first use.
template <class... Args>
std::unique_ptr<sparse_workload>& kept_workload(std::map<std::int64_t, std::unique_ptr<sparse_workload>>& kept,
                                                std::int64_t tokens, Args&&... args) {
  auto& w = kept[tokens];
  if (!w) {
    w = std::make_unique<sparse_workload>(std::forward<Args>(args)...);
    w->fill();
  }
  return w;
}

// How many of the fp32 step's selected entries another step selects too (each read once, traced,
// its output left in its `out`).
struct selection_overlap {
  std::size_t common = 0, fp32 = 0;
};
selection_overlap overlap_with_fp32(sparse_workload& w, sparse_setup& fp32) {
  read_trace trace, fp32_trace;
  w.reader.read(w.cache, w.seq, w.request(), w.out.data(), &trace);
  fp32.reader.read(fp32.cache, fp32.seq, fp32.request(), fp32.out.data(), &fp32_trace);
  std::vector<std::int64_t> a = trace.selected, b = fp32_trace.selected, common;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
  return {common.size(), b.size()};
}

// The step with the indexer keys stored and scored in bf16 (reader_config::precision), and
// fp32_over_bf16: the fp32 step's time over this one's, measured back to back in rounds (median).
// Checks: the output is finite, and the selection shares at least 90% of the fp32 step's (the
// rounding of queries and keys to bf16 reorders near-tied scores; test_read checks the maths).
void BM_sparse_decode_bf16_indexer(benchmark::State& state) {
  const std::int64_t tokens = state.range(0);
  sparse_setup& fp32 = sparse(tokens, 64);
  if (!fp32.error.empty()) return state.SkipWithError(fp32.error.c_str());
  static std::map<std::int64_t, std::unique_ptr<sparse_workload>> workloads;
  auto& w = kept_workload(workloads, tokens, "bench_read_bf16", tokens, 64, true);
  const selection_overlap shared = overlap_with_fp32(*w, fp32);
  if (10 * shared.common < 9 * shared.fp32) return state.SkipWithError("the bf16 indexer's selection strays from fp32's");
  for (float v : w->out)
    if (!std::isfinite(v)) return state.SkipWithError("the bf16-indexer output is not finite");
  const double speedup = paired_speedup(thread_seconds, [&] { fp32.step(); }, [&] { w->step(); });
  run_steps(state, false, [&] { w->step(); });
  benchmark::DoNotOptimize(w->out.data());
  state.counters["fp32_over_bf16"] = speedup;
  state.counters["same_selection"] = static_cast<double>(shared.common) / static_cast<double>(shared.fp32);
  report_floor(sparse_roofline(fp32.candidates, true), state);
}

// The step with FP8 K/V entries (see the header comment). Checks: the same selection as the fp32
// step (the indexer keys are fp32 in both), a finite output.
void BM_sparse_decode_fp8(benchmark::State& state) {
  const std::int64_t tokens = state.range(0);
  const bool cold = state.range(1) != 0;
  sparse_setup& fp32 = sparse(tokens, 64);
  if (!fp32.error.empty()) return state.SkipWithError(fp32.error.c_str());
  static std::map<std::int64_t, std::unique_ptr<sparse_workload>> workloads;
  auto& w = kept_workload(workloads, tokens, "bench_read_fp8", tokens, 64, false, storage_type::fp8_e4m3_block);
  read_trace fp8_trace, fp32_trace;
  w->reader.read(w->cache, w->seq, w->request(), w->out.data(), &fp8_trace);
  fp32.reader.read(fp32.cache, fp32.seq, fp32.request(), fp32.out.data(), &fp32_trace);
  if (fp8_trace.selected != fp32_trace.selected) return state.SkipWithError("the FP8 step selects other entries");
  double difference = 0.0, largest = 0.0;
  for (std::size_t i = 0; i < w->out.size(); ++i) {
    if (!std::isfinite(w->out[i])) return state.SkipWithError("the FP8 output is not finite");
    difference = std::max(difference, static_cast<double>(std::abs(w->out[i] - fp32.out[i])));
    largest = std::max(largest, static_cast<double>(std::abs(fp32.out[i])));
  }
  // The attention kernel alone: 2048-token caches read without selection at their last token
  // (512 entries and the window), fp32 against FP8.
  static sparse_workload small_fp32("bench_read_attention", 2048, 64), small_fp8("bench_read_attention_fp8", 2048, 64,
                                                                                  false, storage_type::fp8_e4m3_block);
  if (small_fp32.cache.tokens(small_fp32.seq) == 0) {
    small_fp32.fill();
    small_fp8.fill();
  }
  reader_config all = decode_reader_config("bench_read_attention");
  all.top_k = 0;
  all.indexer_stream = no_stream;
  all.indexer_heads = 0;
  sparse_reader attend_fp8(small_fp8.cache, all), attend_fp32(small_fp32.cache, all);
  read_request early = small_fp32.request();
  early.indexer_queries = {};
  early.indexer_weights = {};
  std::vector<float> out(w->out.size());
  const double attention =
      paired_step_speedup(cold, [&] { attend_fp32.read(small_fp32.cache, small_fp32.seq, early, out.data()); },
                     [&] { attend_fp8.read(small_fp8.cache, small_fp8.seq, early, out.data()); });
  const double speedup = paired_step_speedup(cold, [&] { fp32.step(); }, [&] { w->step(); });
  run_steps(state, cold, [&] { w->step(); });
  benchmark::DoNotOptimize(w->out.data());
  state.counters["fp32_over_fp8"] = speedup;
  state.counters["attention_fp32_over_fp8"] = attention;
  state.counters["rel_error_vs_fp32"] = difference / std::max(largest, 1e-30);
  state.counters["entry_bytes"] = static_cast<double>(w->cache.pool(0).layout().entry_stride_bytes);
  report_floor(sparse_roofline(fp32.candidates, false, true), state);
}

// The step at DeepSeek-V4's precision (see the header comment). Checks: a finite output, and a
// selection that shares at least a quarter of the fp32 step's (FP4 rounds queries and keys to
// 3 bits of magnitude; test_read_fp4.cpp checks the maths exactly).
void BM_sparse_decode_v4_precision(benchmark::State& state) {
  const std::int64_t tokens = state.range(0);
  const bool cold = state.range(1) != 0;
  sparse_setup& fp32 = sparse(tokens, 64);
  if (!fp32.error.empty()) return state.SkipWithError(fp32.error.c_str());
  static std::map<std::int64_t, std::unique_ptr<sparse_workload>> workloads;
  auto& w = kept_workload(workloads, tokens, "bench_read_v4", tokens, 64, false, storage_type::fp8_e4m3_block, true);
  const selection_overlap shared = overlap_with_fp32(*w, fp32);
  // A sanity bound only: on these random keys many scores lie within FP4's rounding of the cut,
  // so the selections differ in a good part (same_selection); unrelated selections would share
  // 512 / 32768 of their entries.
  if (4 * shared.common < shared.fp32) return state.SkipWithError("the FP4 indexer's selection strays from fp32's");
  for (float v : w->out)
    if (!std::isfinite(v)) return state.SkipWithError("the V4-precision output is not finite");

  // The FP4 scoring alone: every candidate's key, page by page, as the reader runs it (warm,
  // median of 9).
  const std::int64_t candidates = fp32.candidates;
  const page_pool& pool = w->cache.pool(1);
  const auto& table = w->cache.page_table(w->seq, 1);
  kernels::indexer_fp4_queries prepared;
  kernels::indexer_fp4::prepare(w->indexer_queries.data(), w->indexer_weights.data(), kIndexerHeads, kIndexerChannels,
                                prepared);
  std::vector<float> scores(static_cast<std::size_t>(candidates));
  auto score_all = [&] {
    auto page = [&](std::int64_t first) {
      return pool.base() + table[static_cast<std::size_t>(first / 64)] * pool.layout().page_stride_bytes;
    };
    for (std::int64_t first = 0; first < candidates; first += 64) {
      const bool more = first + 64 < candidates;
      kernels::indexer_fp4::score(prepared, page(first), pool.layout().entry_stride_bytes,
                                  std::min<std::int64_t>(64, candidates - first), scores.data() + first,
                                  more ? page(first + 64) : nullptr, more ? std::min<std::int64_t>(64, candidates - first - 64) : 0);
    }
    benchmark::DoNotOptimize(scores.data());
  };
  std::vector<double> indexer_times;
  score_all();
  for (int round = 0; round < 9; ++round) {
    const double t0 = thread_seconds();
    score_all();
    indexer_times.push_back(thread_seconds() - t0);
  }
  const double indexer_time = median(indexer_times);
  const double indexer_ops = 2.0 * kIndexerHeads * kIndexerChannels * static_cast<double>(candidates);

  const double speedup = paired_step_speedup(cold, [&] { fp32.step(); }, [&] { w->step(); });
  run_steps(state, cold, [&] { w->step(); });
  benchmark::DoNotOptimize(w->out.data());
  state.counters["fp32_over_v4"] = speedup;
  state.counters["same_selection"] = static_cast<double>(shared.common) / static_cast<double>(shared.fp32);
  state.counters["indexer_bytes_per_token"] =
      static_cast<double>(pool.layout().entry_stride_bytes) / static_cast<double>(w->cache.compressors().geom().stride);
  state.counters["entry_bytes"] = static_cast<double>(w->cache.pool(0).layout().entry_stride_bytes);
  state.counters["indexer_ms"] = 1e3 * indexer_time;
  state.counters["indexer_of_int8_peak"] = indexer_ops / int8_dot_peak() / indexer_time;
  state.counters["simd_indexer"] = prepared.shifted ? 1.0 : 0.0;
  report_floor(sparse_roofline(candidates, false, true, true), state);
}

// ---- batched decode ----------------------------------------------------------------------------

// `count` sequences of `context` tokens in one cache, the first `forked` of them forks of one shared
// prefix of `prefix` tokens (built once, then each fork grown on its own), the rest grown from
// empty; per sequence its own queries, indexer inputs and sinks, and a read at its last token.
// step() takes every sequence's view (as an engine does each step) and reads them in one batch.
struct batch_setup {
  std::int64_t count, context;
  bool v4;  // DeepSeek-V4's precision: FP8 K/V entries and window, FP4 indexer keys
  csa_cache cache;
  std::vector<sequence_id> seqs;
  std::vector<std::vector<float>> queries, indexer_queries, indexer_weights, sinks;
  std::vector<sequence_view> views;
  std::vector<read_item> items;
  std::vector<float> out, lse;
  std::vector<std::int32_t> physical;
  sparse_reader reader;
  std::int64_t candidates = 0;
  std::string error;

  // `spare` tokens more per sequence fit in the pool (the decode step appends them).
  static cache_config config(std::int64_t count, std::int64_t context, std::int64_t forked, std::int64_t prefix, bool v4,
                             std::int64_t spare) {
    const std::int64_t pages_per_sequence = (context + spare) / 4 / 64 + 1;
    cache_config c = decode_cache_config("bench_read_batch", context, 64, false,
                                         v4 ? storage_type::fp8_e4m3_block : storage_type::f32, v4);
    c.pages = count * pages_per_sequence - forked * (prefix / 4 / 64) + prefix / 4 / 64 + forked + 1;
    return c;
  }

  batch_setup(std::int64_t n, std::int64_t tokens, std::int64_t forked, std::int64_t prefix, bool v4_precision = false,
              std::int64_t spare = 0)
      : count(n),
        context(tokens),
        v4(v4_precision),
        cache(csa_layer(), config(n, tokens, forked, prefix, v4_precision, spare)),
        reader(cache, decode_reader_config("bench_read_batch", false, v4_precision)) {
    const double t0 = thread_seconds();
    seqs = fill_batch(cache, n, tokens, forked, prefix);  // tools/bench.hpp: phasekv-bench's batch
    for (std::int64_t s = 0; s < n; ++s) {
      read_inputs in(cache.shape(), reader.config(), static_cast<std::uint64_t>(1000 * s));
      queries.push_back(std::move(in.queries));
      indexer_queries.push_back(std::move(in.indexer_queries));
      indexer_weights.push_back(std::move(in.indexer_weights));
      sinks.push_back(std::move(in.sinks));
    }
    views.resize(static_cast<std::size_t>(n));
    items.resize(static_cast<std::size_t>(n));
    out.resize(static_cast<std::size_t>(n * kQueryHeads * kChannels));
    lse.resize(static_cast<std::size_t>(n * kQueryHeads));
    physical.resize(static_cast<std::size_t>(n * kTopK));
    for (std::int64_t s = 0; s < n; ++s) {
      read_item& it = items[static_cast<std::size_t>(s)];
      it.view = &views[static_cast<std::size_t>(s)];
      it.request = request(s);
      it.out = out.data() + s * kQueryHeads * kChannels;
      it.lse = lse.data() + s * kQueryHeads;
      it.selected_physical = physical.data() + s * kTopK;
    }
    candidates = cache.compressors().geom().visible_entries(tokens - 1);
    check();
    std::fprintf(stderr, "bench_read: batch setup: %lld sequences of %lld tokens (%lld forked from a %lld-token prefix), %lld pages per stream, %.2f s\n",
                 static_cast<long long>(n), static_cast<long long>(tokens), static_cast<long long>(forked),
                 static_cast<long long>(prefix), static_cast<long long>(cache.pool(0).used_pages()), thread_seconds() - t0);
  }

  // A read at the sequence's last token.
  read_request request(std::int64_t s) const {
    read_request r;
    r.position = cache.tokens(seqs[static_cast<std::size_t>(s)]) - 1;
    r.queries = span<const float>(queries[static_cast<std::size_t>(s)]);
    r.indexer_queries = span<const float>(indexer_queries[static_cast<std::size_t>(s)]);
    r.indexer_weights = span<const float>(indexer_weights[static_cast<std::size_t>(s)]);
    r.sinks = span<const float>(sinks[static_cast<std::size_t>(s)]);
    return r;
  }

  void step(sparse_reader& r) {
    for (std::size_t s = 0; s < seqs.size(); ++s) views[s] = cache.view_of(seqs[s]);
    r.read_batch(items);
  }

  // The same sequences read one by one (read(cache, seq) each), each into its slot of the batch's
  // output, as the batch writes it: a reused buffer would stay in the L2 while the batch writes
  // every sequence's output to memory.
  void read_singly() {
    for (std::int64_t s = 0; s < count; ++s)
      reader.read(cache, seqs[static_cast<std::size_t>(s)], request(s), out.data() + s * kQueryHeads * kChannels);
  }

  // The batch against single reads of the same sequences, bit for bit.
  void check() {
    step(reader);
    std::vector<float> single(static_cast<std::size_t>(kQueryHeads * kChannels));
    for (std::int64_t s = 0; s < count; ++s) {
      reader.read(cache, seqs[static_cast<std::size_t>(s)], request(s), single.data());
      if (std::memcmp(single.data(), out.data() + s * kQueryHeads * kChannels, single.size() * sizeof(float)) != 0)
        error = "the batched read of sequence " + std::to_string(s) + " differs from its single read";
    }
    for (float v : out)
      if (!std::isfinite(v)) error = "batched output is not finite";
  }

  // The batch's floor: the sum of its sequences' (sparse_roofline): every sequence reads its own
  // candidates' indexer keys, shared prefix pages included, and its own selection and window.
  bench::roofline floor() const {
    bench::roofline r = sparse_roofline(candidates, false, v4, v4);
    r.bytes *= static_cast<double>(count);
    r.flops *= static_cast<double>(count);
    r.bf16_flops *= static_cast<double>(count);
    r.int8_ops *= static_cast<double>(count);
    return r;
  }
};

constexpr std::int64_t kBatch = 32, kBatchContext = 32768, kBatchPrefix = 16384;

batch_setup& batched() {
  static batch_setup b(kBatch, kBatchContext, kBatch / 2, kBatchPrefix);
  return b;
}

void BM_batched_decode(benchmark::State& state) {
  batch_setup& b = batched();
  if (!b.error.empty()) return state.SkipWithError(b.error.c_str());
  // The same 32 sequences read one by one (read(cache, seq) each) against the batch, paired: what
  // batching costs or saves, apart from how close either comes to the floor.
  auto singles = [&] { b.read_singly(); };
  state.counters["singles_over_batch"] = paired_speedup(thread_seconds, singles, [&] { b.step(b.reader); });
  run_steps(state, false, [&] { b.step(b.reader); });
  benchmark::DoNotOptimize(b.out.data());
  state.counters["sequences"] = static_cast<double>(b.count);
  state.counters["entries"] = static_cast<double>(b.candidates);
  report_floor(b.floor(), state);
}

void BM_batched_decode_threads(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  batch_setup& b = batched();
  if (!b.error.empty()) return state.SkipWithError(b.error.c_str());
  openmp_executor pool(threads);
  if (pool.concurrency() < threads) return state.SkipWithError("built without OpenMP: the executor is serial");
  sparse_reader parallel(b.cache, decode_reader_config("bench_read_batch"));
  parallel.set_executor(pool);
  b.step(b.reader);
  const std::vector<float> serial_out = b.out;
  const double speedup = paired_speedup(wall_seconds, [&] { b.step(b.reader); }, [&] { b.step(parallel); });
  if (b.out != serial_out) return state.SkipWithError("the threaded batch differs from the serial one");
  for (auto _ : state) {
    b.step(parallel);
    benchmark::ClobberMemory();
  }
  state.counters["speedup"] = speedup;
  // The floor of `threads` cores: each core's share of the batch's floor.
  state.counters["of_two_core_roofline"] = benchmark::Counter(b.floor().floor_seconds() / threads,
                                                              benchmark::Counter::kIsIterationInvariantRate);
}

// One sequence through the batch API (its view taken, then read_batch with one item) against the
// single read of the same sequence.
void BM_batch_of_one(benchmark::State& state) {
  batch_setup& b = batched();
  if (!b.error.empty()) return state.SkipWithError(b.error.c_str());
  const std::size_t s = 0;
  auto one = [&] {
    b.views[s] = b.cache.view_of(b.seqs[s]);
    b.reader.read_batch(span<const read_item>(&b.items[s], 1));
  };
  const double ratio = paired_speedup(thread_seconds, [&] { b.reader.read(b.cache, b.seqs[s], b.request(0), b.out.data()); }, one);
  run_steps(state, false, one);
  state.counters["single_over_batch1"] = ratio;
}

// 32 sequences of 4K tokens: one batch against 32 single reads (each through read(cache, seq)).
void BM_batch_overhead(benchmark::State& state) {
  static batch_setup b(kBatch, 4096, 0, 0);
  if (!b.error.empty()) return state.SkipWithError(b.error.c_str());
  auto singles = [&] { b.read_singly(); };
  const double singles_over_batch = paired_speedup(thread_seconds, singles, [&] { b.step(b.reader); });
  run_steps(state, false, [&] { b.step(b.reader); });
  state.counters["overhead_of_4k_read"] = 1.0 / singles_over_batch - 1.0;
  report_floor(b.floor(), state);
}

// ---- the decode step ---------------------------------------------------------------------------

// An engine's decode step of one layer at DeepSeek-V4's precision: one new token appended to each
// of the 32 sequences of the batch (paged_cache::append_batch: both streams' compressors, every
// fourth token an entry, FP8 entries and window row, FP4 indexer key), then each sequence read at
// its new last token (read_batch). Every sequence gets the same token's inputs (their values do
// not change the timing). Each step grows the sequences by a token: the pool holds kSpareTokens
// more per sequence, and a benchmark that used them up reports it instead of a time.
constexpr std::int64_t kSpareTokens = 4096;

struct step_setup {
  batch_setup b{kBatch, kBatchContext, kBatch / 2, kBatchPrefix, true, kSpareTokens};
  std::vector<float> kv, kv_gates, ix, ix_gates, window;
  std::vector<csa_cache::append_item> appends;

  step_setup() {
    const csa_stream& kv_stream = b.cache.compressors().stream<0>();
    const csa_stream& ix_stream = b.cache.compressors().stream<1>();
    kv = random_vector(kv_stream.payload_floats_per_token(), 31);
    kv_gates = random_vector(kv_stream.logit_floats_per_token(), 32);
    ix = random_vector(ix_stream.payload_floats_per_token(), 33);
    ix_gates = random_vector(ix_stream.logit_floats_per_token(), 34);
    window = random_vector(kChannels, 35);
    for (const sequence_id seq : b.seqs) {
      csa_cache::append_item it;
      it.seq = seq;
      it.in = {token_chunk{1, span<const float>(kv), span<const float>(kv_gates)},
               token_chunk{1, span<const float>(ix), span<const float>(ix_gates)}};
      it.window_keys = span<const float>(window);
      appends.push_back(it);
    }
  }

  void append(executor& ex) { b.cache.append_batch(appends, ex); }
  void read(sparse_reader& r) {
    for (std::int64_t s = 0; s < b.count; ++s) b.items[static_cast<std::size_t>(s)].request.position = b.request(s).position;
    b.step(r);
  }
  void step(sparse_reader& r, executor& ex) {
    append(ex);
    read(r);
  }

  // The step's floor: the batch's reads (batch_setup::floor) and, per sequence, the new token's
  // inputs read and what it stores written — its window row, and a quarter of an entry of each
  // stream (one every S = 4 tokens). Not counted: the W − 1 earlier tokens' inputs the compressor
  // pools from its ring, and the pooling's arithmetic (a stricter floor).
  bench::roofline floor() const {
    bench::roofline r = b.floor();
    const double inputs = 4.0 * static_cast<double>(kv.size() + kv_gates.size() + ix.size() + ix_gates.size() + window.size());
    const double stored = static_cast<double>(fp8_head_layout::of(kChannels, 64).bytes) +
                          static_cast<double>(b.cache.pool(0).layout().entry_stride_bytes +
                                              b.cache.pool(1).layout().entry_stride_bytes) / 4.0;
    r.bytes += static_cast<double>(b.count) * (inputs + stored);
    return r;
  }
};

step_setup& decode_steps() {
  static step_setup s;
  return s;
}

void BM_decode_step(benchmark::State& state) {
  step_setup& s = decode_steps();
  if (!s.b.error.empty()) return state.SkipWithError(s.b.error.c_str());
  executor& serial = default_executor();
  try {
    // The append and the read apart: the median of 9 of each (warm).
    std::vector<double> appends, reads;
    for (int round = 0; round < 9; ++round) {
      double t0 = thread_seconds();
      s.append(serial);
      appends.push_back(thread_seconds() - t0);
      t0 = thread_seconds();
      s.read(s.b.reader);
      reads.push_back(thread_seconds() - t0);
    }
    run_steps(state, false, [&] { s.step(s.b.reader, serial); });
    state.counters["append_ms"] = 1e3 * median(appends);
    state.counters["read_ms"] = 1e3 * median(reads);
  } catch (const capacity_error&) {
    return state.SkipWithError("the decode step used up its spare pages: raise kSpareTokens");
  }
  benchmark::DoNotOptimize(s.b.out.data());
  for (float v : s.b.out)
    if (!std::isfinite(v)) return state.SkipWithError("the decode step's output is not finite");
  state.counters["sequences"] = static_cast<double>(s.b.count);
  state.counters["context"] = static_cast<double>(s.b.cache.tokens(s.b.seqs[0]));
  report_floor(s.floor(), state);
}

// The same step on `threads` threads: the appends' per-sequence work and the reads' pieces through
// one openmp_executor; speedup over one thread (wall time, paired in-run) and of_two_core_roofline.
void BM_decode_step_threads(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  step_setup& s = decode_steps();
  if (!s.b.error.empty()) return state.SkipWithError(s.b.error.c_str());
  openmp_executor pool(threads);
  if (pool.concurrency() < threads) return state.SkipWithError("built without OpenMP: the executor is serial");
  sparse_reader parallel(s.b.cache, decode_reader_config("bench_read_batch", false, true));
  parallel.set_executor(pool);
  executor& serial = default_executor();
  try {
    const double speedup =
        paired_speedup(wall_seconds, [&] { s.step(s.b.reader, serial); }, [&] { s.step(parallel, pool); });
    for (auto _ : state) {
      s.step(parallel, pool);
      benchmark::ClobberMemory();
    }
    state.counters["speedup"] = speedup;
  } catch (const capacity_error&) {
    return state.SkipWithError("the decode step used up its spare pages: raise kSpareTokens");
  }
  state.counters["of_two_core_roofline"] =
      benchmark::Counter(s.floor().floor_seconds() / threads, benchmark::Counter::kIsIterationInvariantRate);
}

// A read of the entries the host selected (read_request::indices: here the reader's own selection,
// logical ids) against the attention part of the reader's own read — its time less the selection
// stage's (entry_selector::select) — in 9 rounds, each timing the three back to back (each run
// twice, the second timed): host_over_attention is the median of the rounds' ratios. Checks first
// that the two reads agree bit for bit.
void BM_host_indices(benchmark::State& state) {
  sparse_setup& s = sparse(state.range(0), 64);
  if (!s.error.empty()) return state.SkipWithError(s.error.c_str());
  const std::int64_t n = s.select();
  read_request host = s.request();
  host.indexer_queries = {};
  host.indexer_weights = {};
  host.indices = span<const std::int32_t>(s.selected.data(), static_cast<std::size_t>(n));
  std::vector<float> out(s.out.size());
  auto host_read = [&] { s.reader.read(s.cache, s.seq, host, out.data()); };
  host_read();
  s.step();
  if (std::memcmp(out.data(), s.out.data(), out.size() * sizeof(float)) != 0)
    return state.SkipWithError("the read of the reader's own selection differs from its read");
  auto timed = [&](auto&& f) {
    f();
    const double t0 = thread_seconds();
    f();
    return thread_seconds() - t0;
  };
  std::vector<double> ratios, attention;
  for (int round = 0; round < 9; ++round) {
    const double full = timed([&] { s.step(); });
    const double select = timed([&] { benchmark::DoNotOptimize(s.select()); });
    const double mine = timed(host_read);
    ratios.push_back(mine / (full - select));
    attention.push_back(full - select);
  }
  run_steps(state, false, host_read);
  benchmark::DoNotOptimize(out.data());
  state.counters["host_over_attention"] = median(ratios);
  state.counters["attention_ms"] = 1e3 * median(attention);
}

void BM_selection(benchmark::State& state) {
  const std::int64_t tokens = state.range(0), page_size = state.range(1);
  sparse_setup& s = sparse(tokens, page_size);
  if (!s.error.empty()) return state.SkipWithError(s.error.c_str());
  for (auto _ : state) benchmark::DoNotOptimize(s.select());
  state.counters["entries"] = static_cast<double>(s.candidates);
  state.counters["per_entry"] = benchmark::Counter(static_cast<double>(s.candidates),
                                                   benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  const double flops = 2.0 * kIndexerHeads * kIndexerChannels * static_cast<double>(s.candidates);
  state.counters["flops"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  report_floor(bench::roofline{4.0 * kIndexerChannels * static_cast<double>(s.candidates), flops}, state);
}

void BM_top_k(benchmark::State& state) {
  sparse_setup& s = sparse(state.range(0), 64);
  if (!s.error.empty()) return state.SkipWithError(s.error.c_str());
  for (auto _ : state) {
    select_top_k(span<const float>(s.scores), kTopK, s.top);
    benchmark::DoNotOptimize(s.top.data());
  }
  state.counters["entries"] = static_cast<double>(s.candidates);
  state.counters["per_entry"] = benchmark::Counter(static_cast<double>(s.candidates),
                                                   benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

}  // namespace

BENCHMARK(BM_dense_decode)
    ->ArgNames({"ctx", "cold"})
    ->ArgsProduct({kContexts, {0, 1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sparse_decode)
    ->ArgNames({"ctx", "page", "cold"})
    ->ArgsProduct({kContexts, {64, 256}, {0, 1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sparse_decode_threads)
    ->ArgNames({"ctx", "threads"})
    ->ArgsProduct({{16384, 131072}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sparse_decode_bf16_indexer)->ArgName("ctx")->Arg(131072)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sparse_decode_fp8)
    ->ArgNames({"ctx", "cold"})
    ->ArgsProduct({{131072}, {0, 1}})
    ->Unit(benchmark::kMillisecond);
// 4096 as well: the context of the PyTorch peer's short V4-precision case (bench/peer/run).
BENCHMARK(BM_sparse_decode_v4_precision)
    ->ArgNames({"ctx", "cold"})
    ->ArgsProduct({{4096, 131072}, {0, 1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_batched_decode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_batched_decode_threads)->ArgName("threads")->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_batch_of_one)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_batch_overhead)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decode_step)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decode_step_threads)->ArgName("threads")->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_host_indices)->ArgName("ctx")->Arg(131072)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_selection)
    ->ArgNames({"ctx", "page"})
    ->ArgsProduct({kContexts, {64, 256}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_top_k)->ArgName("ctx")->ArgsProduct({kContexts})->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
