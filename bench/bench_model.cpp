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
// Times are the benchmark thread's CPU time, accumulated around the operation alone (manual
// time): the machine is shared. Compare fork/4 with fork/61 in one run: the acceptance is their
// ratio within noise. Counters: pages (page ids the sequence holds, over its kinds), layers.

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <phasekv/models/deepseek_v4.hpp>
#include <phasekv/models/model_cache.hpp>
#include <phasekv/models/model_snapshot.hpp>
#include <phasekv/testing/bench.hpp>

#include "machine_limits.hpp"

namespace {

using namespace phasekv;

constexpr std::int64_t kContext = 32768;
constexpr std::int64_t kChunk = 4096;

// A model of `layers` layers holding one prefilled sequence.
struct prefilled_model {
  model_cache model;
  sequence_id seq = 0;

  explicit prefilled_model(std::int64_t layers) : model(presets::deepseek_v4_shaped(static_cast<std::size_t>(layers), true), options()) {
    seq = model.create();
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    // One block of inputs per (layer kind's stream shape), reused for every chunk and layer.
    std::map<std::int64_t, std::vector<float>> blocks;
    const auto block = [&](std::int64_t floats) -> const std::vector<float>& {
      auto& b = blocks[floats];
      if (b.empty()) {
        b.resize(static_cast<std::size_t>(floats));
        for (float& x : b) x = u(rng);
      }
      return b;
    };
    for (std::int64_t done = 0; done < kContext; done += kChunk) {
      model_step step = model.begin({seq}, kChunk);
      for (std::size_t l = 0; l < model.layers(); ++l) {
        std::vector<token_chunk> chunks;
        for (std::size_t k = 0; k < model.shape(l).streams.size(); ++k) {
          const stream_kernel& s = model.stream(l, k);
          chunks.push_back({kChunk, block(kChunk * s.payload_floats_per_token()), block(kChunk * s.logit_floats_per_token())});
        }
        step.append(l, {layer_append{chunks, block(kChunk * 512), {}}});
      }
      step.commit();
    }
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

prefilled_model& model_for(std::int64_t layers) {
  static std::map<std::int64_t, std::unique_ptr<prefilled_model>> models;
  auto& m = models[layers];
  if (!m) m = std::make_unique<prefilled_model>(layers);
  return *m;
}

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

}  // namespace

BENCHMARK(BM_fork)->ArgName("layers")->Arg(4)->Arg(61)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_free)->ArgName("layers")->Arg(4)->Arg(61)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_remove_suffix)->ArgName("layers")->Arg(4)->Arg(61)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_snapshot)->ArgName("layers")->Arg(8)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_restore)->ArgName("layers")->Arg(8)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
