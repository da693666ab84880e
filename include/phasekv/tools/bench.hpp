#pragma once
// Microbenchmarks of one layer of a layer kind (models/layer_kind.hpp), its poolings built-in or
// yours, through the model front door:
//
//   pooling_registry poolings = pooling_registry::builtins();  // and poolings.add<my_pool>("mine", …)
//   phasekv::bench::results r = phasekv::bench::run(kind, poolings, run_config);
//   std::fputs(r.table().c_str(), stdout);      // or r.json()
//
// measures in one run this machine's limits (machine_limits.hpp: main-memory read bandwidth, fp32
// FMA, bf16 and int8 dot-product peaks of one core) and then
//
//   prefill write  each stream's write path over one chunk of `prefill_tokens` tokens into a fresh
//                  state, its inputs streamed from memory (write_fixture); floor: the inputs read
//                  and the fp32 entries written, at the bandwidth — and, for a pooling of the
//                  host's, its arithmetic at the FMA peak when it states it (a member
//                  `double flops_per_entry(std::int64_t window, std::int64_t channels) const`: the
//                  FLOPs, a multiply-add counting 2, of one entry of one KV head); a host pooling
//                  that does not has no floor (NaN: JSON null, bound "unknown"), since its
//                  arithmetic may outweigh the bytes by any factor
//   decode write   each stream's write path over `decode_tokens` one-token appends; the same floor
//                  (for comparison only: an engine hands a decode step's inputs over from cache)
//   read           one read at the last token of a `context`-token sequence (read_workload: the
//                  cache filled by fill_random_tokens, the request from read_inputs); floor
//                  (read_cost): the indexer keys of every candidate, the selected entries, the
//                  window and the queries at the bandwidth, or the indexer's multiply-adds at the
//                  peak of its precision plus attention's at the FMA peak, whichever is longer
//   batched read   read_batch over `batch` sequences of `batch_context` tokens, half of them forked
//                  from one prefix of half that length (fill_batch); floor: the sum of theirs
//
// each as time per operation, bytes per token (moved, by the floor's count) and the fraction of
// its floor reached (floor / time: 1 would be the machine's limit). Times are CPU time of the
// calling thread, or wall time when the reads run on an executor of several threads (whose floor
// is then shared among them). Each figure is timed in `repetitions` runs of `min_time /
// repetitions` seconds (at least one call each): its time is the median of the runs' times per
// call, with their minimum and maximum as the spread, and per token (time / tokens).
//
// results::json() ("phasekv.bench/2") holds the configuration as fields (geometry, each stream's
// shape and storage, the reader, the run's sizes; a program adds its own, e.g. the policy), the
// environment (environment_of: phasekv's version, the compiler, its flags as the program states
// them, the kernels compiled in, the CPU, the command line, the UTC date) and every figure.
//
// One measurement code: bench/'s Google Benchmark programs (bench_write.cpp, bench_read.cpp) time the
// DeepSeek-V4 CSA shape with these same workloads, inputs and floors, so `phasekv-bench --preset
// deepseek_v4_csa` and `bench/run_all` report the same figures within the machine's noise
// (prefill_deepseek_v4_csa_of_bandwidth_bound, decode_write_…, decode_128k_of_roofline,
// batched_decode_32x32k_of_roofline). It lives with the installed headers rather than in bench/ so
// that a host's own program calls run() on its own kinds and poolings after find_package(phasekv),
// and so that the installed phasekv-bench and the repository's benchmarks compile the one copy.
// POSIX (thread CPU clock).

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/erased_stream.hpp"
#include "phasekv/compress/pooling_registry.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/core/executor.hpp"
#include "phasekv/detail/text.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/models/layer_kind.hpp"
#include "phasekv/models/model_cache.hpp"
#include "phasekv/read/sparse_reader.hpp"
#include "phasekv/detail/simd/config.hpp"
#include "phasekv/tools/machine_limits.hpp"
#include "phasekv/version.hpp"

namespace phasekv::bench {

namespace run_detail {

template <class Layer, class F, std::size_t... K>
void for_each_stream(const Layer& layer, F& f, std::index_sequence<K...>) {
  (f(K, layer.template stream<K>()), ...);
}
// f(k, stream k's compressor) for every stream of a layer_compressor.
template <class Layer, class F>
void for_each_stream(const Layer& layer, F&& f) {
  for_each_stream(layer, f, std::make_index_sequence<Layer::stream_count>{});
}

}  // namespace run_detail

// ---- inputs ------------------------------------------------------------------------------------

// splitmix64: a cache fill draws tens of millions of floats, faster than <random>'s engines.
struct fast_random {
  std::uint64_t state;
  explicit fast_random(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }  // [−1, 1)
  void fill(std::vector<float>& v) {
    for (float& x : v) x = uniform();
  }
};

inline std::vector<float> random_vector(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  fast_random(seed).fill(v);
  return v;
}

// A cache fill's inputs, in blocks of 1024 tokens. Stream 0's inputs are one random block appended
// cyclically (seeds 1 and 2; the content of the entries does not change the timing), the other
// streams' — an indexer's keys — fresh for every block from `seed`, so their scores are not
// periodic (periodic scores would feed top-k an unrealistically tie-heavy input); the window's key
// and value rows one block each, cyclic (seeds 3 and 4).
class random_token_blocks {
 public:
  static constexpr std::int64_t block = 1024;

  // Per stream its payload and logit floats per token; the window's key and value floats per token.
  random_token_blocks(std::vector<std::int64_t> payload, std::vector<std::int64_t> logits, std::int64_t window_keys,
                      std::int64_t window_values, std::uint64_t seed)
      : payload_(std::move(payload)),
        logits_(std::move(logits)),
        window_keys_(window_keys),
        window_values_(window_values),
        in_(payload_.size()),
        gates_(payload_.size()),
        chunks_(payload_.size()),
        keys_(random_vector(block * window_keys, 3)),
        values_(random_vector(block * window_values, 4)),
        rng_(seed) {
    for (std::size_t k = 0; k < payload_.size(); ++k) {
      in_[k].resize(static_cast<std::size_t>(block * payload_[k]));
      gates_[k].resize(static_cast<std::size_t>(block * logits_[k]));
    }
    if (!in_.empty()) {  // stream 0's one block, drawn once
      in_[0] = random_vector(block * payload_[0], 1);
      gates_[0] = random_vector(block * logits_[0], 2);
    }
  }

  // The next block's first n ≤ 1024 tokens: a chunk per stream (valid until the next call).
  span<const token_chunk> next(std::int64_t n) {
    for (std::size_t k = 0; k < chunks_.size(); ++k) {
      if (k > 0) {
        rng_.fill(in_[k]);
        rng_.fill(gates_[k]);
      }
      chunks_[k] = token_chunk{n, span<const float>(in_[k].data(), static_cast<std::size_t>(n * payload_[k])),
                               span<const float>(gates_[k].data(), static_cast<std::size_t>(n * logits_[k]))};
    }
    return span<const token_chunk>(chunks_);
  }
  span<const float> window_keys(std::int64_t n) const {
    return span<const float>(keys_.data(), static_cast<std::size_t>(n * window_keys_));
  }
  span<const float> window_values(std::int64_t n) const {
    return span<const float>(values_.data(), static_cast<std::size_t>(n * window_values_));
  }

 private:
  std::vector<std::int64_t> payload_, logits_;
  std::int64_t window_keys_, window_values_;
  std::vector<std::vector<float>> in_, gates_;
  std::vector<token_chunk> chunks_;
  std::vector<float> keys_, values_;
  fast_random rng_;
};

// Appends `tokens` tokens to `seq` through every stream in blocks of random_token_blocks' inputs;
// `progress(done)` after each block.
template <class Cache>
void fill_random_tokens(Cache& cache, sequence_id seq, std::int64_t tokens, std::uint64_t seed,
                        const std::function<void(std::int64_t)>& progress = {}) {
  constexpr std::size_t N = Cache::stream_count;
  std::vector<std::int64_t> payload(N), logits(N);
  run_detail::for_each_stream(cache.compressors(), [&](std::size_t k, const auto& c) {
    payload[k] = c.payload_floats_per_token();
    logits[k] = c.logit_floats_per_token();
  });
  const raw_window_config& w = cache.config().window;
  random_token_blocks inputs(payload, logits, w.tokens > 0 ? w.kv_heads * w.key_channels : 0,
                             w.tokens > 0 ? w.kv_heads * w.value_channels : 0, seed);
  for (std::int64_t done = 0; done < tokens; done += random_token_blocks::block) {
    const std::int64_t n = std::min(random_token_blocks::block, tokens - done);
    const span<const token_chunk> next = inputs.next(n);
    typename Cache::chunks chunks;
    std::copy(next.begin(), next.end(), chunks.begin());
    cache.append(seq, chunks, inputs.window_keys(n), inputs.window_values(n));
    if (progress) progress(done + n);
  }
}

// The same on layer 0 of a model (run() measures one-layer models), each block one committed step:
// the model holds what a paged_cache of the layer filled from the same seed holds.
inline void fill_random_tokens(model_cache& model, sequence_id seq, std::int64_t tokens, std::uint64_t seed,
                               const std::function<void(std::int64_t)>& progress = {}) {
  const std::size_t n_streams = model.shape(0).streams.size();
  std::vector<std::int64_t> payload(n_streams), logits(n_streams);
  for (std::size_t k = 0; k < n_streams; ++k) {
    payload[k] = model.stream(0, k).payload_floats_per_token();
    logits[k] = model.stream(0, k).logit_floats_per_token();
  }
  const raw_window_config& w = model.kind_of(0).window;
  random_token_blocks inputs(payload, logits, w.tokens > 0 ? w.kv_heads * w.key_channels : 0,
                             w.tokens > 0 ? w.kv_heads * w.value_channels : 0, seed);
  for (std::int64_t done = 0; done < tokens; done += random_token_blocks::block) {
    const std::int64_t n = std::min(random_token_blocks::block, tokens - done);
    const layer_append row{inputs.next(n), inputs.window_keys(n), inputs.window_values(n)};
    model_step step = model.begin({seq}, n);
    step.append(0, span<const layer_append>(&row, 1));
    step.commit();
    if (progress) progress(done + n);
  }
}

// One read's request inputs from seeds seed + 21 … 24: queries [query_heads][key channels],
// indexer queries [indexer_heads][indexer channels] and weights (positive, in [0, 1/heads)) when
// the reader selects with an indexer, sinks [query_heads] with a sink.
struct read_inputs {
  std::vector<float> queries, indexer_queries, indexer_weights, sinks;

  read_inputs() = default;
  read_inputs(const layer_shape& shape, const reader_config& given, std::uint64_t seed = 0) {
    const reader_config rc = resolve_reader_streams(shape.streams, given, given.name);
    const std::int64_t key_channels = rc.key_stream == no_stream ? shape.window.key_channels : shape.streams[rc.key_stream].channels;
    queries = random_vector(rc.query_heads * key_channels, seed + 21);
    if (rc.top_k > 0 && rc.indexer_stream != no_stream) {
      indexer_queries = random_vector(rc.indexer_heads * shape.streams[rc.indexer_stream].channels, seed + 22);
      indexer_weights = random_vector(rc.indexer_heads, seed + 23);
      for (float& x : indexer_weights) x = 0.5f * (x + 1.0f) / static_cast<float>(rc.indexer_heads);
    }
    if (rc.sink) sinks = random_vector(rc.query_heads, seed + 24);
  }
  read_request request(std::int64_t position) const {
    read_request r;
    r.position = position;
    r.queries = span<const float>(queries);
    r.indexer_queries = span<const float>(indexer_queries);
    r.indexer_weights = span<const float>(indexer_weights);
    r.sinks = span<const float>(sinks);
    return r;
  }
};

// Pages for `sequences` sequences of `tokens` tokens each (and a spare page each), per stream.
inline std::int64_t pages_for(const geometry& g, std::int64_t page_size, std::int64_t tokens, std::int64_t sequences) {
  return sequences * ((g.completed_entries(tokens) + page_size - 1) / page_size + 1) + 1;
}

// A read at the last of `tokens` tokens: the cache (empty until fill()), its reader, the request's
// inputs (read_inputs, seed 0) and the output.
template <class Cache>
struct read_workload {
  std::int64_t tokens, page_size;
  Cache cache;
  sequence_id seq;
  sparse_reader reader;
  std::vector<float> queries, indexer_queries, indexer_weights, sinks, out;

  read_workload(typename Cache::layer layer, cache_config config, reader_config rc, std::int64_t context)
      : tokens(context),
        page_size(config.page_size),
        cache(std::move(layer), std::move(config)),
        seq(cache.create()),
        reader(cache, std::move(rc)) {
    read_inputs in(cache.shape(), reader.config());
    queries = std::move(in.queries);
    indexer_queries = std::move(in.indexer_queries);
    indexer_weights = std::move(in.indexer_weights);
    sinks = std::move(in.sinks);
    out.resize(static_cast<std::size_t>(reader.output_floats()));
  }
  read_workload(const read_workload&) = delete;  // the reader was made for this cache
  read_workload& operator=(const read_workload&) = delete;

  // Appends the tokens (fill_random_tokens, seeded by the context and the page size).
  void fill(const std::function<void(std::int64_t)>& progress = {}) {
    fill_random_tokens(cache, seq, tokens, static_cast<std::uint64_t>(tokens * 1000 + page_size), progress);
  }
  read_request request() const {
    read_request r;
    r.position = tokens - 1;
    r.queries = span<const float>(queries);
    r.indexer_queries = span<const float>(indexer_queries);
    r.indexer_weights = span<const float>(indexer_weights);
    r.sinks = span<const float>(sinks);
    return r;
  }
  void step() { reader.read(cache, seq, request(), out.data()); }
};

// `count` sequences of `tokens` tokens: the first `forked` forked from one `prefix`-token sequence
// (seed 7; then freed, its pages held by the forks) and each continued, the rest made alone;
// sequence s's own tokens from seed 100 + s.
template <class Cache>
std::vector<sequence_id> fill_batch(Cache& cache, std::int64_t count, std::int64_t tokens, std::int64_t forked,
                                    std::int64_t prefix, const std::function<void(std::int64_t)>& progress = {}) {
  std::vector<sequence_id> seqs;
  std::int64_t done = 0;
  auto step = [&](std::int64_t) {
    if (progress) progress(++done);
  };
  if (forked > 0) {
    const sequence_id shared = cache.create();
    fill_random_tokens(cache, shared, prefix, 7);
    for (std::int64_t s = 0; s < forked; ++s) {
      seqs.push_back(cache.fork(shared));
      fill_random_tokens(cache, seqs.back(), tokens - prefix, static_cast<std::uint64_t>(100 + s));
      step(s);
    }
    cache.free(shared);
  }
  for (std::int64_t s = forked; s < count; ++s) {
    seqs.push_back(cache.create());
    fill_random_tokens(cache, seqs.back(), tokens, static_cast<std::uint64_t>(100 + s));
    step(s);
  }
  return seqs;
}

// The write path's inputs for `tokens` tokens of one stream: standard normals (a 4 MiB pool,
// repeated from a different start per buffer — drawing 64M normals would take seconds, and the
// kernels have no data-dependent paths), as fp32 or rounded to bf16 bits; a sink storing each
// entry at its own place, as a cache would.
template <class Compressor>
struct write_fixture {
  Compressor compressor;
  std::vector<float> payload, logits, entries;
  std::vector<std::uint16_t> payload_bf16, logits_bf16;  // bf16 inputs only: the fp32 ones rounded
  bool bf16 = false;

  static void fill_normal(std::vector<float>& v, std::size_t start) {
    static const std::vector<float> pool = [] {
      std::mt19937 rng(1);
      std::normal_distribution<float> normal;
      std::vector<float> p(std::size_t{1} << 20);
      for (float& x : p) x = normal(rng);
      return p;
    }();
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = pool[(start + k) % pool.size()];
  }

  write_fixture(Compressor c, std::int64_t tokens, bool bf16_inputs = false) : compressor(std::move(c)), bf16(bf16_inputs) {
    payload.resize(static_cast<std::size_t>(tokens * compressor.payload_floats_per_token()));
    logits.resize(static_cast<std::size_t>(tokens * compressor.logit_floats_per_token()));
    fill_normal(payload, 0);
    fill_normal(logits, 12345);
    entries.resize(static_cast<std::size_t>(compressor.geom().completed_entries(tokens) * entry_floats()));
    if (bf16) {  // sized once, as the fp32 buffers are (no reallocation while growing)
      payload_bf16.resize(payload.size());
      logits_bf16.resize(logits.size());
      for (std::size_t k = 0; k < payload.size(); ++k) payload_bf16[k] = float_to_bf16(payload[k]);
      for (std::size_t k = 0; k < logits.size(); ++k) logits_bf16[k] = float_to_bf16(logits[k]);
      std::vector<float>().swap(payload);  // the fp32 copies would only take memory
      std::vector<float>().swap(logits);
    }
    // One read of every input before anything is timed: the first read of freshly written pages
    // can stall (on a virtual machine, many times longer than the later passes).
    std::uint64_t sum = 0;
    for (const float x : payload) sum += static_cast<std::uint64_t>(x != 0.0f);
    for (const float x : logits) sum += static_cast<std::uint64_t>(x != 0.0f);
    for (const std::uint16_t x : payload_bf16) sum += x;
    for (const std::uint16_t x : logits_bf16) sum += x;
    do_not_optimize(sum);
  }
  std::int64_t entry_floats() const { return compressor.floats_per_entry(); }
  token_chunk chunk(std::int64_t first, std::int64_t tokens) const {
    const std::int64_t p = compressor.payload_floats_per_token(), l = compressor.logit_floats_per_token();
    token_chunk c;
    c.tokens = tokens;
    if (bf16) {
      c.payload_bf16 = {payload_bf16.data() + first * p, static_cast<std::size_t>(tokens * p)};
      c.logits_bf16 = {logits_bf16.data() + first * l, static_cast<std::size_t>(tokens * l)};
    } else {
      c.payload = {payload.data() + first * p, static_cast<std::size_t>(tokens * p)};
      c.logits = {logits.data() + first * l, static_cast<std::size_t>(tokens * l)};
    }
    return c;
  }
  void store(const entry_view& e) { std::copy_n(e.values, entry_floats(), entries.data() + e.index * entry_floats()); }
  // One prefill of `tokens` tokens into a fresh state; `tokens` one-token appends.
  void prefill(std::int64_t tokens) {
    stream_state s = compressor.make_state();
    compressor.append(s, chunk(0, tokens), [&](const entry_view& e) { store(e); });
    do_not_optimize(entries.data());
  }
  void decode(std::int64_t tokens) {
    stream_state s = compressor.make_state();
    for (std::int64_t t = 0; t < tokens; ++t) compressor.append(s, chunk(t, 1), [&](const entry_view& e) { store(e); });
    do_not_optimize(entries.data());
  }
  // Bytes one pass over `tokens` tokens must move: inputs read (4 or 2 bytes an element), entries
  // written (fp32).
  double bytes_moved(std::int64_t tokens) const {
    const double read = static_cast<double>(tokens * (compressor.payload_floats_per_token() + compressor.logit_floats_per_token()));
    const double written = static_cast<double>(compressor.geom().completed_entries(tokens) * entry_floats());
    return read * (bf16 ? sizeof(std::uint16_t) : sizeof(float)) + written * sizeof(float);
  }
};

// ---- floors ------------------------------------------------------------------------------------

// What one read must move and compute. selected = min(top_k, candidates) (all candidates without
// selection), keys = selected + the window's tokens:
//   bytes  = indexer key bytes · candidates + entry bytes · selected + window row bytes · window tokens
//            + 4 · (query_heads · (key + value channels) + indexer_heads · (indexer channels + 1))
//                                                                     (queries, output, weights)
//   flops  = 2 · query_heads · (key + value channels) · keys          (q·k and p·v, at the FMA peak)
//          + 2 · indexer_heads · indexer channels · candidates        (at the peak of its precision)
// Entry, key and window row bytes are the stored ones (page_layout::entry_stride_bytes: FP8 584
// for a 512-channel entry, FP4 68 for a 128-channel key; an FP8 window row 584, an fp32 one 2048).
// A window-only layer (no key stream) reads its window alone: its channels are the window's.
struct read_cost {
  std::int64_t query_heads = 0, key_channels = 0, value_channels = 0, top_k = 0;
  std::int64_t window_tokens = 0;
  std::int64_t indexer_heads = 0, indexer_channels = 0;
  double entry_bytes = 0.0, indexer_key_bytes = 0.0;
  double window_row_bytes = 0.0;  // stored bytes of one window token (keys, and values untied)
  indexer_precision precision = indexer_precision::f32;

  // The cost of `reader`'s reads of a layer: `entry_stride_bytes[k]` is stream k's stored entry size.
  static read_cost of(const layer_shape& shape, const reader_config& given, const std::vector<std::int64_t>& entry_stride_bytes) {
    const reader_config reader = resolve_reader_streams(shape.streams, given, given.name);
    read_cost c;
    c.query_heads = reader.query_heads;
    c.top_k = reader.top_k;
    c.window_tokens = shape.window.tokens;
    if (shape.window.tokens > 0)
      c.window_row_bytes = static_cast<double>(raw_window::ring_bytes(shape.window, 0) / shape.window.tokens);
    if (reader.key_stream == no_stream) {  // window-only
      c.key_channels = shape.window.key_channels;
      c.value_channels = shape.window.value_channels > 0 ? shape.window.value_channels : shape.window.key_channels;
      c.top_k = 0;
      return c;
    }
    c.key_channels = shape.streams[reader.key_stream].channels;
    c.value_channels = shape.streams[reader.value_stream].channels;
    c.entry_bytes = static_cast<double>(entry_stride_bytes[reader.key_stream]);
    if (reader.value_stream != reader.key_stream) c.entry_bytes += static_cast<double>(entry_stride_bytes[reader.value_stream]);
    if (reader.top_k > 0 && reader.indexer_stream != no_stream) {
      c.indexer_heads = reader.indexer_heads;
      c.indexer_channels = shape.streams[reader.indexer_stream].channels;
      c.indexer_key_bytes = static_cast<double>(entry_stride_bytes[reader.indexer_stream]);
      c.precision = reader.precision;
    }
    return c;
  }

  roofline floor(std::int64_t candidates) const {
    const double n = static_cast<double>(candidates);
    const double selected = top_k > 0 ? std::min(static_cast<double>(top_k), n) : n;
    const double keys = selected + static_cast<double>(window_tokens);
    const double indexer_flops = 2.0 * static_cast<double>(indexer_heads * indexer_channels) * n;
    roofline r;
    r.bytes = indexer_key_bytes * n + selected * entry_bytes + window_row_bytes * static_cast<double>(window_tokens) +
              4.0 * (static_cast<double>(query_heads * (key_channels + value_channels)) +
                     static_cast<double>(indexer_heads * (indexer_channels + 1)));
    r.flops = 2.0 * static_cast<double>(query_heads * (key_channels + value_channels)) * keys;
    (precision == indexer_precision::fp4 ? r.int8_ops : precision == indexer_precision::bf16 ? r.bf16_flops : r.flops) +=
        indexer_flops;
    return r;
  }
};

// ---- timing ------------------------------------------------------------------------------------

// Per-call times of `repetitions` runs of f, each run calling f until `min_time / repetitions`
// seconds have passed (at least once), after one untimed call; sorted, so the median, minimum and
// maximum are at hand.
struct repeated_timing {
  std::vector<double> per_call;  // seconds per call of each run, ascending
  std::int64_t calls = 0;        // timed calls in all
  double median() const {
    const std::size_t n = per_call.size();
    return n == 0 ? 0.0 : n % 2 ? per_call[n / 2] : 0.5 * (per_call[n / 2 - 1] + per_call[n / 2]);
  }
};

template <class F>
repeated_timing time_repetitions(F&& f, double min_time, std::int64_t repetitions, bool wall = false) {
  auto now = [wall] {
    return wall ? std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count()
                : thread_seconds();
  };
  f();
  repeated_timing t;
  const double each = min_time / static_cast<double>(std::max<std::int64_t>(1, repetitions));
  for (std::int64_t r = 0; r < std::max<std::int64_t>(1, repetitions); ++r) {
    std::int64_t calls = 0;
    const double t0 = now();
    double elapsed = 0.0;
    do {
      f();
      ++calls;
      elapsed = now() - t0;
    } while (elapsed < each);
    t.per_call.push_back(elapsed / static_cast<double>(calls));
    t.calls += calls;
  }
  std::sort(t.per_call.begin(), t.per_call.end());
  return t;
}

// ---- environment -------------------------------------------------------------------------------

// Where and how a result was measured, for a results file that stands alone.
struct environment_info {
  std::string version = PHASEKV_VERSION_STRING;  // phasekv's
  std::string compiler;   // e.g. "GCC 12.2.0", "Clang 14.0.6"
  std::string flags;      // the compile flags, as the program states them (empty: not stated)
  std::string kernels;    // simd::compiled_isa_report() of the measuring code
  std::string cpu;        // the CPU's model name (Linux: /proc/cpuinfo), "" where unknown
  std::int64_t hardware_threads = 0;
  std::string command;    // the command line
  std::string date_utc;   // ISO 8601, e.g. "2026-01-31T12:00:00Z"
};

// This process's environment; `compiled` is the caller's PHASEKV_SIMD_KERNELS (detail/simd/config.hpp).
inline environment_info environment_of(std::string command, std::string flags,
                                       unsigned compiled = PHASEKV_SIMD_KERNELS) {
  environment_info e;
#if defined(__clang__)
  e.compiler = "Clang " __clang_version__;
#elif defined(__GNUC__)
  e.compiler = "GCC " __VERSION__;
#endif
  e.flags = std::move(flags);
  e.kernels = simd::compiled_isa_report(compiled);
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      e.cpu = line.substr(line.find(':') + 1);
      e.cpu.erase(0, e.cpu.find_first_not_of(' '));
      break;
    }
  }
  e.hardware_threads = static_cast<std::int64_t>(std::thread::hardware_concurrency());
  e.command = std::move(command);
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
#if defined(_WIN32)
  gmtime_s(&utc, &now);
#else
  gmtime_r(&now, &utc);
#endif
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  e.date_utc = text;
  return e;
}

// ---- run ---------------------------------------------------------------------------------------

struct run_config {
  std::int64_t prefill_tokens = 32768;  // one chunk: several times the L3 at DeepSeek-V4's shape
  std::int64_t decode_tokens = 4096;    // one-token appends
  bool bf16_inputs = false;             // the prefill's payload and logits as bf16 bits
  std::int64_t context = 131072;        // the read's sequence
  std::int64_t batch = 32;              // sequences of the batched read (0: none)
  std::int64_t batch_context = 32768;   // tokens of each
  double min_time = 0.3;                // seconds each figure is timed for, at least, over all repetitions
  std::int64_t repetitions = 5;         // timed runs per figure: the median and the spread over them
  executor* reads_on = nullptr;         // the reads' executor (null: this thread)
  std::int64_t threads = 1;             // the executor's threads: wall time, the floor shared
  // Called with a line of progress (a phase starting, a long fill's share done); null: silent.
  std::function<void(const std::string&)> progress;

  void validate() const {
    using phasekv::detail::require;
    require(prefill_tokens >= 0 && prefill_tokens <= (std::int64_t{1} << 24), "run_config.prefill_tokens", prefill_tokens,
            "must lie in [0, 2^24] (0: no prefill)");
    require(decode_tokens >= 0 && decode_tokens <= (std::int64_t{1} << 24), "run_config.decode_tokens", decode_tokens,
            "must lie in [0, 2^24] (0: no decode)");
    require(context >= 0 && context <= (std::int64_t{1} << 26), "run_config.context", context, "must lie in [0, 2^26] (0: no read)");
    require(batch >= 0 && batch <= 4096, "run_config.batch", batch, "must lie in [0, 4096] (0: no batched read)");
    require(batch_context >= 1 && batch_context <= (std::int64_t{1} << 24), "run_config.batch_context", batch_context,
            "must lie in [1, 2^24]");
    require(std::isfinite(min_time) && min_time >= 0.0 && min_time <= 3600.0, "run_config.min_time", min_time,
            "must lie in [0, 3600] seconds");
    require(threads >= 1 && threads <= 1024, "run_config.threads", threads, "must lie in [1, 1024]");
    require(repetitions >= 1 && repetitions <= 1000, "run_config.repetitions", repetitions, "must lie in [1, 1000]");
  }
};

// One measured figure.
struct figure {
  std::string name;           // "prefill write 'csa.kv'", "read", "batched read"
  std::string kind;           // prefill_write, decode_write, read, batched_read
  std::string stream;         // the stream written (writes)
  std::int64_t tokens = 0;    // tokens per operation: written, or of the context read (× sequences)
  double seconds = 0.0;       // per operation: the median over the repetitions
  double seconds_min = 0.0, seconds_max = 0.0;  // the fastest and slowest repetition
  std::int64_t repetitions = 0, calls = 0;      // timed runs, and calls in all
  roofline work;              // what one operation must move and compute
  double floor_seconds = 0.0;
  double of_roofline = 0.0;   // floor / seconds
  std::string bound;          // "bandwidth" or "compute": which side of the floor is longer
  double bytes_per_token() const { return tokens > 0 ? work.bytes / static_cast<double>(tokens) : 0.0; }
  double seconds_per_token() const { return tokens > 0 ? seconds / static_cast<double>(tokens) : 0.0; }
};

struct machine {
  double read_bandwidth = 0.0, fma_peak = 0.0, bf16_dot_peak = 0.0, int8_dot_peak = 0.0;  // bytes/s, FLOP/s, OP/s
};

struct results {
  std::string configuration;  // a description in words
  // The configuration as fields: (name, a JSON value), in order; run() fills the layer's and the
  // run's, a program appends its own (set()).
  std::vector<std::pair<std::string, std::string>> settings;
  environment_info environment;  // run() leaves the command and flags empty: environment_of(...)
  bench::machine limits;
  std::vector<figure> figures;
  double cache_bytes_per_token = 0.0;  // stored entries of every stream, per token (the read's sequence)

  std::string table() const {
    using phasekv::detail::fixed;
    using phasekv::detail::right;
    std::string out = "phasekv-bench: " + configuration + "\n";
    out += "machine (one core, measured in this run): read bandwidth " + fixed(limits.read_bandwidth * 1e-9, 1) +
           " GB/s, fp32 FMA " + fixed(limits.fma_peak * 1e-9, 1) + " GFLOP/s, bf16 dot " +
           fixed(limits.bf16_dot_peak * 1e-9, 1) + " GFLOP/s, int8 dot " + fixed(limits.int8_dot_peak * 1e-9, 1) + " GOP/s\n";
    if (cache_bytes_per_token > 0.0) out += "cache: " + fixed(cache_bytes_per_token, 1) + " bytes of entries per token\n";
    std::size_t width = 11;
    for (const figure& f : figures) width = std::max(width, f.name.size());
    std::int64_t repeated = 0;
    for (const figure& f : figures) repeated = std::max(repeated, f.repetitions);
    out += "time: the median of " + std::to_string(repeated) + " repetitions; spread: (slowest - fastest) / median\n";
    out += "\n" + f_left("measurement", width) + right("time", 12) + right("spread", 8) + right("per token", 11) +
           right("tokens", 9) + right("bytes/token", 12) + right("floor", 11) + right("of floor", 9) + "  bound\n";
    for (const figure& f : figures) {
      const double spread = f.seconds > 0.0 ? (f.seconds_max - f.seconds_min) / f.seconds : 0.0;
      out += f_left(f.name, width) + right(duration(f.seconds), 12) + right(fixed(100.0 * spread, 1) + "%", 8) +
             right(duration(f.seconds_per_token()), 11) + right(std::to_string(f.tokens), 9) +
             right(fixed(f.bytes_per_token(), 1), 12) +
             right(std::isfinite(f.floor_seconds) ? duration(f.floor_seconds) : "n/a", 11) +
             right(std::isfinite(f.of_roofline) ? fixed(f.of_roofline, 3) : "n/a", 9) + "  " + f.bound + "\n";
    }
    return out;
  }

  // Appends (or replaces) a configuration field; `json_value` is JSON text (a number, a quoted
  // string from json_string, an object, …).
  void set(const std::string& name, std::string json_value) {
    for (auto& [key, value] : settings)
      if (key == name) {
        value = std::move(json_value);
        return;
      }
    settings.emplace_back(name, std::move(json_value));
  }

  std::string json() const {
    using phasekv::detail::json_number;
    using phasekv::detail::json_string;
    std::string out = "{\n  \"format\": \"phasekv.bench/2\",\n  \"configuration\": {\"description\": " +
                      json_string(configuration);
    for (const auto& [key, value] : settings) out += ",\n    " + json_string(key) + ": " + value;
    const environment_info& e = environment;
    out += "},\n  \"environment\": {\"phasekv_version\": " + json_string(e.version) +
           ", \"compiler\": " + json_string(e.compiler) + ", \"flags\": " + json_string(e.flags) +
           ",\n    \"kernels\": " + json_string(e.kernels) + ",\n    \"cpu\": " + json_string(e.cpu) +
           ", \"hardware_threads\": " + std::to_string(e.hardware_threads) + ",\n    \"command\": " +
           json_string(e.command) + ", \"date_utc\": " + json_string(e.date_utc) + "},\n";
    out += "  \"machine\": {\"read_bandwidth_bytes_per_s\": " + json_number(limits.read_bandwidth) +
           ", \"fma_peak_flops\": " + json_number(limits.fma_peak) + ", \"bf16_dot_peak_flops\": " +
           json_number(limits.bf16_dot_peak) + ", \"int8_dot_peak_ops\": " + json_number(limits.int8_dot_peak) + "},\n";
    out += "  \"cache_bytes_per_token\": " + json_number(cache_bytes_per_token) + ",\n  \"figures\": [";
    for (std::size_t i = 0; i < figures.size(); ++i) {
      const figure& f = figures[i];
      out += std::string(i ? "," : "") + "\n    {\"name\": " + json_string(f.name) + ", \"kind\": " + json_string(f.kind) +
             ", \"stream\": " + json_string(f.stream) + ", \"tokens\": " + std::to_string(f.tokens) +
             ",\n     \"seconds\": " + json_number(f.seconds) + ", \"seconds_min\": " + json_number(f.seconds_min) +
             ", \"seconds_max\": " + json_number(f.seconds_max) + ", \"seconds_per_token\": " +
             json_number(f.seconds_per_token()) + ", \"repetitions\": " + std::to_string(f.repetitions) +
             ", \"calls\": " + std::to_string(f.calls) + ",\n     \"bytes\": " + json_number(f.work.bytes) +
             ", \"bytes_per_token\": " + json_number(f.bytes_per_token()) + ", \"flops\": " + json_number(f.work.flops) +
             ", \"bf16_flops\": " + json_number(f.work.bf16_flops) + ", \"int8_ops\": " + json_number(f.work.int8_ops) +
             ", \"floor_seconds\": " + json_number(f.floor_seconds) + ", \"of_roofline\": " + json_number(f.of_roofline) +
             ", \"bound\": " + json_string(f.bound) + "}";
    }
    return out + "\n  ]\n}\n";
  }

 private:
  static std::string f_left(const std::string& s, std::size_t width) { return s + std::string(width + 2 - std::min(width, s.size()), ' '); }
  static std::string duration(double s) {
    using phasekv::detail::fixed;
    return s >= 1.0 ? fixed(s, 3) + " s" : s >= 1e-3 ? fixed(s * 1e3, 3) + " ms" : fixed(s * 1e6, 2) + " us";
  }
};

// ---- a layer kind on the front door -------------------------------------------------------------

namespace run_detail {

// What one pass of `tokens` tokens through `stream` must move and compute; `known` false when the
// floor cannot be priced (a host pooling that does not state its FLOPs).
template <class Fixture>
roofline write_work(const erased_stream& stream, const Fixture& f, std::int64_t tokens, bool& known) {
  roofline work{f.bytes_moved(tokens)};
  const double flops = stream.kernel().pooling_flops_per_entry();
  known = !std::isnan(flops);
  if (known && flops > 0.0)
    work.flops = static_cast<double>(stream.geom().completed_entries(tokens)) *
                 static_cast<double>(stream.config().kv_heads) * flops;
  return work;
}

// `bandwidth`: read_bandwidth() as the figure's Google Benchmark twin takes it (before the writes,
// after the reads).
inline figure make_figure(std::string name, std::string kind, std::string stream, std::int64_t tokens,
                          const repeated_timing& timing, const roofline& work, std::int64_t threads, double bandwidth) {
  figure f;
  f.name = std::move(name);
  f.kind = std::move(kind);
  f.stream = std::move(stream);
  f.tokens = tokens;
  const double seconds = timing.median();
  f.seconds = seconds;
  f.seconds_min = timing.per_call.empty() ? 0.0 : timing.per_call.front();
  f.seconds_max = timing.per_call.empty() ? 0.0 : timing.per_call.back();
  f.repetitions = static_cast<std::int64_t>(timing.per_call.size());
  f.calls = timing.calls;
  f.work = work;
  const double memory = work.bytes / bandwidth, compute = work.compute_seconds();
  f.floor_seconds = std::max(memory, compute) / static_cast<double>(threads);
  f.of_roofline = seconds > 0.0 ? f.floor_seconds / seconds : 0.0;
  f.bound = memory >= compute ? "bandwidth" : "compute";
  return f;
}

// A figure whose floor is unknown: NaN floor and fraction, bound "unknown".
inline figure without_floor(figure f) {
  f.floor_seconds = std::numeric_limits<double>::quiet_NaN();
  f.of_roofline = std::numeric_limits<double>::quiet_NaN();
  f.bound = "unknown (the pooling states no flops_per_entry)";
  return f;
}

// "12% of 131072 tokens" lines, at most every tenth.
// With the time so far and, from the rate so far, the time left: "read: filled 30% (12 s, about
// 28 s left)".
inline std::function<void(std::int64_t)> share_reporter(const run_config& c, const std::string& what, std::int64_t total) {
  if (!c.progress || total <= 0) return {};
  auto last = std::make_shared<std::int64_t>(-1);
  const auto start = std::chrono::steady_clock::now();
  return [&c, what, total, last, start](std::int64_t done) {
    const std::int64_t tenth = done * 10 / total;
    if (tenth == *last) return;
    *last = tenth;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string line = what + ": " + std::to_string(done * 100 / total) + "%";
    if (done > 0 && done < total && elapsed >= 1.0)
      line += " (" + phasekv::detail::fixed(elapsed, 0) + " s, about " +
              phasekv::detail::fixed(elapsed * static_cast<double>(total - done) / static_cast<double>(done), 0) +
              " s left)";
    c.progress(line);
  };
}

}  // namespace run_detail

// Measures one layer of `kind` — its streams built from `poolings`, its window, page size and reader
// — as the header comment describes, through the model front door (a one-layer model_cache: appends
// in steps, reads by model_cache::read). `configuration` names it in the results. Throws config_error
// naming the field for a kind the model cannot build, or a read asked of a kind without a reader.
inline results run(const layer_kind& kind, const pooling_registry& poolings, const run_config& config,
                   const std::string& configuration = "") {
  config.validate();
  const auto one_layer = [&](std::int64_t pages) {
    model_spec spec;
    spec.name = kind.name;
    spec.kinds = {kind};
    spec.layers = model_spec::layers_of({0});
    model_options options;
    options.pages = pages;
    return std::make_unique<model_cache>(std::move(spec), options, poolings);
  };
  const std::unique_ptr<model_cache> probe = one_layer(1);  // every stream and the reader, before anything is measured
  if ((config.context > 0 || config.batch > 0) && kind.reader.query_heads == 0)
    phasekv::detail::fail(kind.name + ".reader.query_heads", 0, "leaves the layer without a reader: nothing to read "
                                                                "(run_config.context and .batch 0 time the writes alone)");
  const reader_config reader = kind.reader.query_heads > 0 ? probe->reader(0) : kind.reader;
  auto say = [&](const std::string& line) {
    if (config.progress) config.progress(line);
  };
  results r;
  r.configuration = configuration;
  {
    using phasekv::detail::json_number;
    using phasekv::detail::json_string;
    const geometry& geom = kind.geom;
    r.set("stride", std::to_string(geom.stride));
    r.set("window", std::to_string(geom.window));
    r.set("origin", std::to_string(geom.origin));
    std::string streams = "[";
    for (std::size_t k = 0; k < kind.streams.size(); ++k) {
      const stream_spec& ss = kind.streams[k];
      const stream_config& sc = ss.config;
      const char* role = sc.role == stream_role::indexer ? "indexer"
                         : sc.role == stream_role::key   ? "key"
                         : sc.role == stream_role::value ? "value"
                                                         : "kv";
      streams += std::string(k ? ", " : "") + "{\"name\": " + json_string(sc.name) + ", \"role\": " + json_string(role) +
                 ", \"pooling\": " + json_string(ss.pooling) + ", \"kv_heads\": " + std::to_string(sc.kv_heads) +
                 ", \"channels\": " + std::to_string(sc.channels) + ", \"rope_channels\": " +
                 std::to_string(ss.rope == rope_placement::none ? 0 : sc.rope.channels) + ", \"storage\": " +
                 json_string(to_string(ss.storage)) + "}";
    }
    r.set("streams", streams + "]");
    r.set("page_size", std::to_string(kind.page_size));
    r.set("window_tokens", std::to_string(kind.window.tokens));
    r.set("window_storage", json_string(to_string(kind.window.precision)));
    const char* precision = reader.precision == indexer_precision::bf16 ? "bf16"
                            : reader.precision == indexer_precision::fp4 ? "fp4" : "f32";
    r.set("reader", "{\"query_heads\": " + std::to_string(reader.query_heads) + ", \"top_k\": " +
                        std::to_string(reader.top_k) + ", \"indexer_heads\": " + std::to_string(reader.indexer_heads) +
                        ", \"indexer_precision\": " + json_string(reader.top_k > 0 ? precision : "none") +
                        ", \"sink\": " + (reader.sink ? "true" : "false") + "}");
    r.set("run", "{\"prefill_tokens\": " + std::to_string(config.prefill_tokens) + ", \"decode_tokens\": " +
                     std::to_string(config.decode_tokens) + ", \"context\": " + std::to_string(config.context) +
                     ", \"batch\": " + std::to_string(config.batch) + ", \"batch_context\": " +
                     std::to_string(config.batch_context) + ", \"bf16_inputs\": " +
                     (config.bf16_inputs ? "true" : "false") + ", \"threads\": " + std::to_string(config.threads) +
                     ", \"min_time_seconds\": " + json_number(config.min_time) + ", \"repetitions\": " +
                     std::to_string(config.repetitions) + "}");
  }
  r.environment = environment_of("", "");
  say("measuring this machine's limits");
  r.limits = {read_bandwidth(), fma_peak(), bf16_dot_peak(), int8_dot_peak()};
  const geometry& g = kind.geom;

  // Writes, stream by stream: the compressor alone into a flat array (write_fixture).
  for (std::size_t k = 0; k < kind.streams.size(); ++k) {
    // The model's own stream (not owned: the probe outlives the figures).
    const erased_stream compressor(std::shared_ptr<const stream_kernel>(std::shared_ptr<void>(), &probe->stream(0, k)));
    const std::string name = compressor.config().name;
    using fixture = write_fixture<erased_stream>;
    const auto figure_of = [&](const char* what, const char* figure_kind, std::int64_t tokens,
                               const repeated_timing& s, const fixture& f, double bandwidth) {
      bool known = true;
      const roofline work = run_detail::write_work(compressor, f, tokens, known);
      figure one = run_detail::make_figure(std::string(what) + " '" + name + "'", figure_kind, name, tokens, s, work, 1,
                                           bandwidth);
      r.figures.push_back(known ? one : run_detail::without_floor(one));
    };
    if (config.prefill_tokens > 0) {
      say("prefill write '" + name + "': " + std::to_string(config.prefill_tokens) + " tokens");
      const double bandwidth = read_bandwidth();  // measured again just before, as bench_write does: the best so far
      // A fixture used once and dropped, then the one timed: what Google Benchmark does (its first
      // run estimates the iterations), and the second allocation of a large input reads a few
      // percent faster here than the first, so the two measure the same.
      fixture(compressor, config.prefill_tokens, config.bf16_inputs).prefill(config.prefill_tokens);
      fixture f(compressor, config.prefill_tokens, config.bf16_inputs);
      const repeated_timing s =
          time_repetitions([&] { f.prefill(config.prefill_tokens); }, config.min_time, config.repetitions);
      figure_of("prefill write", "prefill_write", config.prefill_tokens, s, f, bandwidth);
    }
    if (config.decode_tokens > 0) {
      say("decode write '" + name + "': " + std::to_string(config.decode_tokens) + " one-token appends");
      const double bandwidth = read_bandwidth();
      fixture(compressor, config.decode_tokens).decode(config.decode_tokens);  // as for the prefill
      fixture f(compressor, config.decode_tokens);
      const repeated_timing s =
          time_repetitions([&] { f.decode(config.decode_tokens); }, config.min_time, config.repetitions);
      figure_of("decode write", "decode_write", config.decode_tokens, s, f, bandwidth);
    }
  }

  const bool wall = config.threads > 1;
  executor& ex = config.reads_on ? *config.reads_on : default_executor();
  const auto strides = [](const model_cache& m) {
    std::vector<std::int64_t> out;
    for (std::size_t k = 0; k < m.shape(0).streams.size(); ++k) out.push_back(m.layout(0, k).entry_stride_bytes);
    return out;
  };
  const std::int64_t value_channels = kind.reader.query_heads > 0
                                          ? phasekv::detail::check_reader_config(probe->shape(0), reader).value_channels
                                          : 0;
  if (config.context > 0) {
    const std::unique_ptr<model_cache> m = one_layer(pages_for(g, kind.page_size, config.context, 1));
    const sequence_id seq = m->create();
    say("read: filling " + std::to_string(config.context) + " tokens");
    fill_random_tokens(*m, seq, config.context, static_cast<std::uint64_t>(config.context * 1000 + kind.page_size),
                       run_detail::share_reporter(config, "read: filled", config.context));
    const read_inputs inputs(m->shape(0), reader);
    std::vector<float> out(static_cast<std::size_t>(reader.query_heads * value_channels));
    layer_read one;
    one.sequence = seq;
    one.request = inputs.request(config.context - 1);
    one.out = out.data();
    const std::int64_t candidates = kind.window_only() ? 0 : g.visible_entries(config.context - 1);
    const read_cost cost = read_cost::of(m->shape(0), reader, strides(*m));
    say("read: timing");
    const repeated_timing s = time_repetitions([&] { m->read(0, span<const layer_read>(&one, 1), ex); }, config.min_time,
                                               config.repetitions, wall);
    r.figures.push_back(run_detail::make_figure("read at " + std::to_string(config.context), "read", "", config.context, s,
                                                cost.floor(candidates), config.threads, read_bandwidth()));
    r.cache_bytes_per_token = static_cast<double>(m->memory(seq).total.entry_bytes) / static_cast<double>(config.context);
  }

  if (config.batch > 0) {
    const std::int64_t count = config.batch, tokens = config.batch_context, forked = count / 2, prefix = tokens / 2;
    const std::unique_ptr<model_cache> m =
        one_layer(pages_for(g, kind.page_size, tokens, count) + pages_for(g, kind.page_size, prefix, 1));
    say("batched read: filling " + std::to_string(count) + " sequences of " + std::to_string(tokens) + " tokens");
    const std::vector<sequence_id> seqs =
        fill_batch(*m, count, tokens, forked, prefix, run_detail::share_reporter(config, "batched read: filled", count));
    const layer_shape& shape = m->shape(0);
    std::vector<read_inputs> inputs;
    for (std::int64_t s = 0; s < count; ++s) inputs.emplace_back(shape, reader, static_cast<std::uint64_t>(1000 * s));
    const std::int64_t output = reader.query_heads * value_channels;
    std::vector<layer_read> reads(static_cast<std::size_t>(count));
    std::vector<float> out(static_cast<std::size_t>(count * output));
    std::vector<float> lse(static_cast<std::size_t>(count * reader.query_heads));
    std::vector<std::int32_t> physical(static_cast<std::size_t>(count * std::max<std::int64_t>(1, reader.top_k)));
    for (std::int64_t s = 0; s < count; ++s) {
      layer_read& it = reads[static_cast<std::size_t>(s)];
      it.sequence = seqs[static_cast<std::size_t>(s)];
      it.request = inputs[static_cast<std::size_t>(s)].request(tokens - 1);
      it.out = out.data() + s * output;
      it.lse = lse.data() + s * reader.query_heads;
      if (reader.top_k > 0) it.selected_physical = physical.data() + s * reader.top_k;
    }
    say("batched read: timing");
    const repeated_timing s =
        time_repetitions([&] { m->read(0, span<const layer_read>(reads), ex); }, config.min_time, config.repetitions, wall);
    roofline floor = read_cost::of(shape, reader, strides(*m)).floor(kind.window_only() ? 0 : g.visible_entries(tokens - 1));
    floor.bytes *= static_cast<double>(count);
    floor.flops *= static_cast<double>(count);
    floor.bf16_flops *= static_cast<double>(count);
    floor.int8_ops *= static_cast<double>(count);
    r.figures.push_back(run_detail::make_figure("batched read " + std::to_string(count) + " x " + std::to_string(tokens),
                                                "batched_read", "", count * tokens, s, floor, config.threads, read_bandwidth()));
  }
  return r;
}

}  // namespace phasekv::bench
