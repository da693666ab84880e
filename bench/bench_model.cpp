// The model front door (include/phasekv/models/model_cache.hpp): what a sequence operation costs
// as the model grows, and model snapshots against memcpy. The model is DeepSeek-V4-shaped at its
// precision (presets::deepseek_v4_shaped: two window-only layers, then CSA and HCA alternating;
// FP8 K/V entries and windows, FP4 indexer keys) with one sequence of 32K tokens, prefilled in
// chunks of 4096 (setup, untimed).
//
//   fork/layers          fork() of the sequence: its page tables and state blocks shared, each
//                        kind's pages retained once — independent of the layer count
//   free/layers          free() of a fork (made untimed): each kind's pages released once
//   remove_suffix/layers remove_suffix() of a fork by 4 tokens (a speculative rollback; the fork
//                        made and freed untimed): pages dropped per kind, the states rolled back
//                        when next written
//   snapshot/layers      snapshot_into() of the sequence into a reused buffer; of_memcpy = memcpy
//                        of the same bytes / snapshot, paired per iteration
//   restore/layers       restore() of those bytes into another model (freed untimed); of_memcpy
//
//   decode_step/layers   an engine's decode step of the whole model: 32 sequences of 32K tokens
//                        (16 of them forks of one 16K prefix, as bench_read's batch) each get one
//                        token (begin), then every layer appends it for all 32 (step.append) and
//                        reads each sequence at it (step.read), and the step commits. of_roofline:
//                        the sum of every layer's floor (per sequence its read's — tools/bench.hpp
//                        read_cost, stored bytes — plus the new token's inputs read and its window
//                        row and entry shares written) over the step's time; append_ms / read_ms:
//                        the step's appends and reads apart (median of 9 steps).
//   decode_step_threads/layers/threads  the same step with appends and reads on one
//                        openmp_executor, wall time; speedup over one thread, paired in-run (9 rounds,
//                        median); of_two_core_roofline: each core's share of the floor over the time.
//   prefill_read/kind    the queries of a prefill chunk read together: one sequence of 32K − 64
//                        tokens, a step appending its last 64 to every layer, then one step.read of
//                        a layer with the chunk's 64 queries (each at its own position, over the
//                        cache and the chunk's own rows), timed alone; the step is aborted untimed.
//                        of_compute_roofline: the reads' multiply-adds at the peaks of their
//                        precisions (read_cost's compute side, per query) over the time.
//
// Times are the benchmark thread's CPU time, accumulated around the operation alone (manual
// time): the machine is shared. Compare fork/4 with fork/61 in one run: the acceptance is their
// ratio within noise. Counters: pages (page ids the sequence holds, over its kinds), layers.

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <map>
#include <optional>
#include <memory>
#include <random>
#include <vector>

#include <phasekv/models/deepseek_v4.hpp>
#include <phasekv/models/model_cache.hpp>
#include <phasekv/models/model_snapshot.hpp>
#include <phasekv/core/openmp_executor.hpp>
#include <phasekv/tools/bench.hpp>

#include "machine_limits.hpp"

namespace {

using namespace phasekv;

constexpr std::int64_t kContext = 32768;
constexpr std::int64_t kChunk = 4096;

// Grows every sequence of `rows` by `tokens` through committed steps of up to kChunk tokens, each
// layer fed one block of random inputs per size (their values do not change the timings).
class prefiller {
 public:
  explicit prefiller(std::uint32_t seed) : rng_(seed) {}

  void grow(model_cache& model, const std::vector<sequence_id>& rows, std::int64_t tokens) {
    for (std::int64_t done = 0; done < tokens; done += kChunk) {
      const std::int64_t n = std::min(kChunk, tokens - done);
      model_step step = model.begin(rows, n);
      for (std::size_t l = 0; l < model.layers(); ++l) {
        std::vector<token_chunk> chunks;
        for (std::size_t k = 0; k < model.shape(l).streams.size(); ++k) {
          const stream_kernel& st = model.stream(l, k);
          chunks.push_back({n, first(st.payload_floats_per_token(), n), first(st.logit_floats_per_token(), n)});
        }
        const std::int64_t window = model.shape(l).window.kv_heads * model.shape(l).window.key_channels;
        step.append(l, std::vector<layer_append>(rows.size(), layer_append{chunks, first(window, n), {}}));
      }
      step.commit();
    }
  }

 private:
  // The first n tokens' floats of a kChunk-token block of `per_token` floats a token.
  span<const float> first(std::int64_t per_token, std::int64_t n) {
    auto& b = blocks_[per_token];
    if (b.empty()) {
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      b.resize(static_cast<std::size_t>(kChunk * per_token));
      for (float& x : b) x = u(rng_);
    }
    return span<const float>(b.data(), static_cast<std::size_t>(n * per_token));
  }

  std::mt19937 rng_;
  std::map<std::int64_t, std::vector<float>> blocks_;
};

// A model of `layers` layers holding one prefilled sequence.
struct prefilled_model {
  model_cache model;
  sequence_id seq = 0;

  explicit prefilled_model(std::int64_t layers) : model(presets::deepseek_v4_shaped(static_cast<std::size_t>(layers), true), options()) {
    seq = model.create();
    prefiller(7).grow(model, {seq}, kContext);
  }
  static model_options options() {
    model_options o;
    o.pages = 2 * (kContext / 4 / 64 + 4);  // the sequence and a fork's copied pages, per kind
    o.history = 8;                          // remove_suffix rolls a fork back 4 tokens
    return o;
  }
  std::int64_t pages() const {
    std::int64_t n = 0;
    for (std::size_t k = 0; k < model.kinds(); ++k) n += static_cast<std::int64_t>(model.page_table(seq, k).size());
    return n;
  }
};

// One model of each kind and layer count for the whole run (setup is untimed and slow).
template <class Model>
Model& model_of(std::int64_t layers) {
  static std::map<std::int64_t, std::unique_ptr<Model>> models;
  auto& m = models[layers];
  if (!m) m = std::make_unique<Model>(layers);
  return *m;
}

prefilled_model& model_for(std::int64_t layers) { return model_of<prefilled_model>(layers); }

void counters(benchmark::State& state, const prefilled_model& p) {
  state.counters["layers"] = static_cast<double>(p.model.layers());
  state.counters["pages"] = static_cast<double>(p.pages());
}

// Runs `timed` once per iteration, `untimed_before`/`untimed_after` around it, and reports the
// accumulated CPU time of `timed` alone.
template <class Before, class Timed, class After>
void manual(benchmark::State& state, Before&& untimed_before, Timed&& timed, After&& untimed_after) {
  for (auto _ : state) {
    untimed_before();
    const double t0 = bench::thread_seconds();
    timed();
    state.SetIterationTime(bench::thread_seconds() - t0);
    untimed_after();
  }
}

void BM_fork(benchmark::State& state) {
  prefilled_model& p = model_for(state.range(0));
  sequence_id child = 0;
  manual(state, [] {}, [&] { child = p.model.fork(p.seq); }, [&] { p.model.free(child); });
  counters(state, p);
}

void BM_free(benchmark::State& state) {
  prefilled_model& p = model_for(state.range(0));
  sequence_id child = 0;
  manual(state, [&] { child = p.model.fork(p.seq); }, [&] { p.model.free(child); }, [] {});
  counters(state, p);
}

void BM_remove_suffix(benchmark::State& state) {
  prefilled_model& p = model_for(state.range(0));
  sequence_id child = 0;
  manual(state, [&] { child = p.model.fork(p.seq); }, [&] { p.model.remove_suffix(child, kContext - 4); },
         [&] { p.model.free(child); });
  counters(state, p);
}

void BM_snapshot(benchmark::State& state) {
  prefilled_model& p = model_for(state.range(0));
  std::vector<std::byte> buffer(snapshot_size(p.model, p.seq)), scratch(buffer.size());
  snapshot_into(p.model, p.seq, buffer);
  double seconds = 0.0, baseline = 0.0;
  for (auto _ : state) {
    const double t0 = bench::thread_seconds();
    snapshot_into(p.model, p.seq, buffer);
    benchmark::DoNotOptimize(buffer.data());
    benchmark::ClobberMemory();
    const double t = bench::thread_seconds() - t0;
    seconds += t;
    state.SetIterationTime(t);
    baseline += bench::memcpy_seconds(buffer, scratch);
  }
  state.counters["MiB"] = static_cast<double>(buffer.size()) / (1 << 20);
  state.counters["of_memcpy"] = seconds > 0.0 ? baseline / seconds : 0.0;
  counters(state, p);
}

void BM_restore(benchmark::State& state) {
  prefilled_model& p = model_for(state.range(0));
  const std::vector<std::byte> bytes = snapshot(p.model, p.seq);
  std::vector<std::byte> scratch(bytes.size());
  model_cache destination(presets::deepseek_v4_shaped(static_cast<std::size_t>(state.range(0)), true), prefilled_model::options());
  destination.free(restore(destination, bytes));  // the arenas' pages faulted in once
  double seconds = 0.0, baseline = 0.0;
  for (auto _ : state) {
    const double t0 = bench::thread_seconds();
    const sequence_id id = restore(destination, bytes);
    const double t = bench::thread_seconds() - t0;
    seconds += t;
    state.SetIterationTime(t);
    destination.free(id);
    baseline += bench::memcpy_seconds(bytes, scratch);
  }
  state.counters["MiB"] = static_cast<double>(bytes.size()) / (1 << 20);
  state.counters["of_memcpy"] = seconds > 0.0 ? baseline / seconds : 0.0;
  counters(state, p);
}

// ---- the model decode step -----------------------------------------------------------------------

constexpr std::int64_t kBatch = 32, kPrefix = 16384;
constexpr std::int64_t kSpareTokens = 2048;  // tokens the steps may add to each sequence

// A DeepSeek-V4-shaped model at V4 precision holding the batch, and one decode step's inputs per
// layer: every sequence gets the same new token's inputs (their values do not change the timing)
// and its own queries (read_inputs, seeded per sequence and layer).
struct decode_model {
  model_cache model;
  std::vector<sequence_id> seqs;
  struct layer_io {
    std::vector<std::vector<float>> stream_inputs;  // per stream: payload, then logits
    std::vector<token_chunk> chunks;
    std::vector<float> window;
    std::vector<layer_append> appends;  // one per sequence
    std::vector<bench::read_inputs> inputs;
    std::vector<layer_read> reads;
    std::vector<float> out, lse;
    bench::read_cost cost;
    double append_bytes = 0.0;  // per sequence: the token's inputs read, its stored share written
  };
  std::vector<layer_io> io;
  std::string error;

  static model_options options(const model_spec& spec) {
    model_options o;
    for (const layer_kind& k : spec.kinds) {
      const std::int64_t ratio = k.streams.empty() ? 0 : k.geom.stride;
      const std::int64_t per_sequence = ratio == 0 ? 0 : (kContext + kSpareTokens) / ratio / k.page_size + 2;
      o.kind_pages.push_back(std::max<std::int64_t>(1, kBatch * per_sequence + kPrefix / std::max<std::int64_t>(ratio, 1) / k.page_size + 2));
    }
    return o;
  }

  explicit decode_model(std::int64_t layers) : model(spec(layers), options(spec(layers))) {
    const double t0 = bench::thread_seconds();
    prefiller fill(11);
    const auto grow = [&](const std::vector<sequence_id>& rows, std::int64_t tokens) { fill.grow(model, rows, tokens); };
    const sequence_id prefix = model.create();
    grow({prefix}, kPrefix);
    std::vector<sequence_id> forks, fresh;
    for (std::int64_t s = 0; s < kBatch / 2; ++s) forks.push_back(model.fork(prefix));
    model.free(prefix);
    for (std::int64_t s = 0; s < kBatch / 2; ++s) fresh.push_back(model.create());
    grow(forks, kContext - kPrefix);
    grow(fresh, kContext);
    seqs = forks;
    seqs.insert(seqs.end(), fresh.begin(), fresh.end());

    io.resize(model.layers());
    for (std::size_t l = 0; l < model.layers(); ++l) {
      layer_io& x = io[l];
      const layer_shape& shape = model.shape(l);
      const reader_config& rc = model.reader(l);
      std::vector<std::int64_t> strides;
      for (std::size_t k = 0; k < shape.streams.size(); ++k) {
        const stream_kernel& st = model.stream(l, k);
        x.stream_inputs.push_back(bench::random_vector(st.payload_floats_per_token() + st.logit_floats_per_token(), 40 + l * 8 + k));
        strides.push_back(model.layout(l, k).entry_stride_bytes);
        x.append_bytes += 4.0 * static_cast<double>(st.payload_floats_per_token() + st.logit_floats_per_token()) +
                          static_cast<double>(strides.back()) / static_cast<double>(model.kind_of(l).geom.stride);
      }
      for (std::size_t k = 0; k < shape.streams.size(); ++k) {
        const stream_kernel& st = model.stream(l, k);
        const span<const float> in(x.stream_inputs[k]);
        const auto payload = static_cast<std::size_t>(st.payload_floats_per_token());
        x.chunks.push_back({1, in.subspan(0, payload), in.subspan(payload, in.size() - payload)});
      }
      x.window = bench::random_vector(shape.window.kv_heads * shape.window.key_channels, 39 + l * 8);
      x.append_bytes += 4.0 * static_cast<double>(x.window.size());
      if (shape.window.tokens > 0) x.append_bytes += static_cast<double>(raw_window::ring_bytes(shape.window, 0) / shape.window.tokens);
      x.appends.assign(seqs.size(), layer_append{x.chunks, x.window, {}});
      x.cost = bench::read_cost::of(shape, rc, strides);
      const std::int64_t values = x.cost.value_channels;
      x.out.resize(seqs.size() * static_cast<std::size_t>(rc.query_heads * values));
      x.lse.resize(seqs.size() * static_cast<std::size_t>(rc.query_heads));
      for (std::size_t s = 0; s < seqs.size(); ++s) x.inputs.emplace_back(shape, rc, 1000 * s + 17 * l);
      for (std::size_t s = 0; s < seqs.size(); ++s) {
        layer_read r;
        r.row = s;
        r.request = x.inputs[s].request(0);
        r.out = x.out.data() + s * static_cast<std::size_t>(rc.query_heads * values);
        r.lse = x.lse.data() + s * static_cast<std::size_t>(rc.query_heads);
        x.reads.push_back(r);
      }
    }
    std::fprintf(stderr, "bench_model: decode step setup: %zu layers, %lld sequences of %lld tokens, %.1f s\n", model.layers(),
                 static_cast<long long>(seqs.size()), static_cast<long long>(kContext), bench::thread_seconds() - t0);
  }
  static model_spec spec(std::int64_t layers) { return presets::deepseek_v4_shaped(static_cast<std::size_t>(layers), true); }

  // One step: `append_seconds` / `read_seconds` accumulate the parts when given, `layer_reads`
  // (one per layer) each layer's reads.
  void step(executor& ex, double* append_seconds = nullptr, double* read_seconds = nullptr, double* layer_reads = nullptr) {
    for (layer_io& x : io)
      for (std::size_t s = 0; s < seqs.size(); ++s) x.reads[s].request.position = model.tokens(seqs[s]);  // the new token
    model_step st = model.begin(seqs, 1);
    for (std::size_t l = 0; l < io.size(); ++l) {
      layer_io& x = io[l];
      double t0 = append_seconds ? bench::thread_seconds() : 0.0;
      st.append(l, x.appends, ex);
      if (append_seconds) *append_seconds += bench::thread_seconds() - t0;
      t0 = read_seconds ? bench::thread_seconds() : 0.0;
      st.read(l, x.reads, ex);
      if (read_seconds) *read_seconds += bench::thread_seconds() - t0;
      if (layer_reads) layer_reads[l] = bench::thread_seconds() - t0;
    }
    st.commit();
  }

  // The floor of a layer's reads of every sequence.
  bench::roofline read_floor(std::size_t l) const {
    bench::roofline r;
    const geometry& g = model.kind_of(l).geom;
    for (const sequence_id s : seqs) {
      const bench::roofline one = io[l].cost.floor(model.shape(l).streams.empty() ? 0 : g.visible_entries(model.tokens(s)));
      r.bytes += one.bytes;
      r.flops += one.flops;
      r.bf16_flops += one.bf16_flops;
      r.int8_ops += one.int8_ops;
    }
    return r;
  }

  // The step's floor: every layer's reads, and per sequence the new token's appended bytes.
  bench::roofline floor() const {
    bench::roofline r;
    for (std::size_t l = 0; l < io.size(); ++l) {
      const bench::roofline reads = read_floor(l);
      r.bytes += reads.bytes + static_cast<double>(seqs.size()) * io[l].append_bytes;
      r.flops += reads.flops;
      r.bf16_flops += reads.bf16_flops;
      r.int8_ops += reads.int8_ops;
    }
    return r;
  }

  bool outputs_finite() const {
    for (const layer_io& x : io)
      for (float v : x.out)
        if (!std::isfinite(v)) return false;
    return true;
  }
};

decode_model& decode_model_for(std::int64_t layers) { return model_of<decode_model>(layers); }

void BM_decode_step(benchmark::State& state) {
  decode_model& m = decode_model_for(state.range(0));
  executor& serial = default_executor();
  try {
    std::vector<double> appends, reads;
    std::vector<std::vector<double>> per_layer(m.io.size());
    std::vector<double> layer_reads(m.io.size());
    for (int round = 0; round < 9; ++round) {
      double a = 0.0, r = 0.0;
      m.step(serial, &a, &r, layer_reads.data());
      appends.push_back(a);
      reads.push_back(r);
      for (std::size_t l = 0; l < m.io.size(); ++l) per_layer[l].push_back(layer_reads[l]);
    }
    // Each kind's reads against their floor (its layers' medians summed).
    std::map<std::string, std::pair<double, double>> kinds;  // name → (seconds, floor seconds)
    for (std::size_t l = 0; l < m.io.size(); ++l) {
      auto& k = kinds[m.model.kind_of(l).name];
      k.first += bench::median(per_layer[l]);
      k.second += m.read_floor(l).floor_seconds();
    }
    for (const auto& [name, k] : kinds) state.counters[name + "_read_of_roofline"] = k.second / k.first;
    for (auto _ : state) {
      m.step(serial);
      benchmark::ClobberMemory();
    }
    state.counters["append_ms"] = 1e3 * bench::median(appends);
    state.counters["read_ms"] = 1e3 * bench::median(reads);
  } catch (const capacity_error&) {
    return state.SkipWithError("the decode steps used up their spare pages: raise kSpareTokens");
  }
  if (!m.outputs_finite()) return state.SkipWithError("the decode step's output is not finite");
  state.counters["layers"] = static_cast<double>(m.model.layers());
  state.counters["sequences"] = static_cast<double>(m.seqs.size());
  bench::report_floor(m.floor(), state);
}

void BM_decode_step_threads(benchmark::State& state) {
  decode_model& m = decode_model_for(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  openmp_executor pool(threads);
  if (pool.concurrency() < threads) return state.SkipWithError("built without OpenMP: the executor is serial");
  executor& serial = default_executor();
  try {
    const double speedup = bench::paired_speedup(bench::wall_seconds, [&] { m.step(serial); }, [&] { m.step(pool); });
    for (auto _ : state) {
      m.step(pool);
      benchmark::ClobberMemory();
    }
    state.counters["speedup"] = speedup;
  } catch (const capacity_error&) {
    return state.SkipWithError("the decode steps used up their spare pages: raise kSpareTokens");
  }
  state.counters["of_two_core_roofline"] =
      benchmark::Counter(m.floor().floor_seconds() / threads, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- a prefill chunk's reads --------------------------------------------------------------------

constexpr std::int64_t kPrefillChunk = 64;

struct prefill_model {
  model_cache model;
  sequence_id seq = 0;
  std::vector<std::vector<float>> inputs;  // per layer and stream: payload then logits, for the chunk
  std::vector<std::vector<float>> windows;
  std::vector<std::vector<token_chunk>> chunks;

  prefill_model() : model(presets::deepseek_v4_shaped(4, true), options()) {
    seq = model.create();
    for (std::size_t l = 0; l < model.layers(); ++l) {
      std::vector<token_chunk> c;
      for (std::size_t k = 0; k < model.shape(l).streams.size(); ++k) {
        const stream_kernel& st = model.stream(l, k);
        inputs.push_back(bench::random_vector(kChunk * (st.payload_floats_per_token() + st.logit_floats_per_token()), 60 + l * 8 + k));
      }
      windows.push_back(bench::random_vector(kChunk * model.shape(l).window.key_channels, 59 + l * 8));
    }
    std::size_t at = 0;
    for (std::size_t l = 0; l < model.layers(); ++l) {
      std::vector<token_chunk> c;
      for (std::size_t k = 0; k < model.shape(l).streams.size(); ++k, ++at) {
        const stream_kernel& st = model.stream(l, k);
        const auto payload = static_cast<std::size_t>(kChunk * st.payload_floats_per_token());
        const span<const float> in(inputs[at]);
        c.push_back({kChunk, in.subspan(0, payload), in.subspan(payload, in.size() - payload)});
      }
      chunks.push_back(std::move(c));
    }
    for (std::int64_t done = 0; done < kContext - kPrefillChunk; done += kChunk) append_all(std::min(kChunk, kContext - kPrefillChunk - done), true);
  }
  static model_options options() {
    model_options o;
    o.pages = kContext / 4 / 64 + 4;
    return o;
  }
  // A step appending `tokens` (≤ kChunk) to every layer, committed or returned open.
  std::optional<model_step> append_all(std::int64_t tokens, bool commit) {
    model_step step = model.begin({seq}, tokens);
    for (std::size_t l = 0; l < model.layers(); ++l) {
      std::vector<token_chunk> c = chunks[l];
      for (std::size_t k = 0; k < c.size(); ++k) {
        const stream_kernel& st = model.stream(l, k);
        c[k] = {tokens, c[k].payload.subspan(0, static_cast<std::size_t>(tokens * st.payload_floats_per_token())),
                c[k].logits.subspan(0, static_cast<std::size_t>(tokens * st.logit_floats_per_token()))};
      }
      const std::int64_t window = model.shape(l).window.key_channels;
      step.append(l, {layer_append{c, span<const float>(windows[l]).subspan(0, static_cast<std::size_t>(tokens * window)), {}}});
    }
    if (commit) {
      step.commit();
      return std::nullopt;
    }
    return std::optional<model_step>(std::move(step));
  }
};

prefill_model& prefilled_for_reads() {
  static prefill_model p;
  return p;
}

// The chunk's reads of layer state.range(0) (0 window-only, 2 CSA, 3 HCA).
void BM_prefill_read(benchmark::State& state) {
  prefill_model& p = prefilled_for_reads();
  const auto l = static_cast<std::size_t>(state.range(0));
  const reader_config& rc = p.model.reader(l);
  const layer_shape& shape = p.model.shape(l);
  std::vector<std::int64_t> strides;
  for (std::size_t k = 0; k < shape.streams.size(); ++k) strides.push_back(p.model.layout(l, k).entry_stride_bytes);
  const bench::read_cost cost = bench::read_cost::of(shape, rc, strides);
  const std::int64_t first = p.model.tokens(p.seq);
  std::vector<bench::read_inputs> in;
  std::vector<layer_read> reads(static_cast<std::size_t>(kPrefillChunk));
  std::vector<float> out(static_cast<std::size_t>(kPrefillChunk * rc.query_heads * cost.value_channels));
  bench::roofline floor;
  for (std::int64_t q = 0; q < kPrefillChunk; ++q) in.emplace_back(shape, rc, static_cast<std::uint64_t>(q));
  for (std::int64_t q = 0; q < kPrefillChunk; ++q) {
    layer_read& r = reads[static_cast<std::size_t>(q)];
    r.row = 0;
    r.request = in[static_cast<std::size_t>(q)].request(first + q);
    r.out = out.data() + q * rc.query_heads * cost.value_channels;
    const bench::roofline one = cost.floor(shape.streams.empty() ? 0 : p.model.kind_of(l).geom.visible_entries(first + q));
    floor.flops += one.flops;
    floor.bf16_flops += one.bf16_flops;
    floor.int8_ops += one.int8_ops;
  }
  double seconds = 0.0;
  for (auto _ : state) {
    std::optional<model_step> step = p.append_all(kPrefillChunk, false);
    const double t0 = bench::thread_seconds();
    step->read(l, reads);
    const double t = bench::thread_seconds() - t0;
    seconds += t;
    state.SetIterationTime(t);
    step->abort();
  }
  for (float v : out)
    if (!std::isfinite(v)) return state.SkipWithError("a prefill read's output is not finite");
  state.SetLabel(p.model.kind_of(l).name);
  state.counters["queries"] = static_cast<double>(kPrefillChunk);
  state.counters["compute_floor_ms"] = 1e3 * floor.compute_seconds();
  state.counters["of_compute_roofline"] = seconds > 0.0 ? floor.compute_seconds() * static_cast<double>(state.iterations()) / seconds : 0.0;
}

}  // namespace

BENCHMARK(BM_prefill_read)->ArgName("layer")->Arg(2)->Arg(3)->Arg(0)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decode_step)->ArgName("layers")->Arg(8)->Arg(43)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decode_step_threads)->ArgNames({"layers", "threads"})->Args({8, 2})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fork)->ArgName("layers")->Arg(4)->Arg(61)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_free)->ArgName("layers")->Arg(4)->Arg(61)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_remove_suffix)->ArgName("layers")->Arg(4)->Arg(61)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_snapshot)->ArgName("layers")->Arg(8)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_restore)->ArgName("layers")->Arg(8)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
