// The hot paths, each run once inside a callgrind counting region: scripts/count-instructions
// runs this program under `valgrind --tool=callgrind --instr-atstart=no` and compares the
// instructions of every region with bench/counts/baseline.tsv. An instruction count is
// deterministic for one binary and one input (no clock, no other process, no thread), so the guard
// sees a change of a few tenths of a percent that timings on a shared machine cannot.
//
// Valgrind 3.19 does not run AVX-512 and emulates FMA instructions slowly: the script builds this
// for x86-64-v3 without FMA, so the counts are those of the AVX2 kernels — the same code paths and
// loops as the native build, not its instruction mix. The caches are filled with host entries
// (append_entries) rather than pooled: the reads' work does not depend on where entries came from.
//
// Every region runs once untimed first (scratch buffers grow, pages are touched), then once
// counted. Outside valgrind the client requests do nothing and the program only runs the paths.
//
// model_decode_step_8x4k and direct_decode_step_8x4k are the same decode step — one token appended
// to each of 8 sequences of 4K tokens and each read, in a CSA and an HCA layer at DeepSeek-V4's
// precision — through the model front door (begin / append / read / commit) and through one
// paged_cache and sparse_reader per layer (append_batch / read_batch): the script holds the first
// to at most 2% more instructions than the second.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(name) (void)(name)
#endif

#include <phasekv/phasekv.hpp>

#include "../decode_workload.hpp"

namespace {

using namespace phasekv;
using namespace bench;

// Runs f once, then once inside the region `name` (one callgrind dump per region).
template <class F>
void region(const char* name, F&& f) {
  f();
  CALLGRIND_START_INSTRUMENTATION;
  CALLGRIND_ZERO_STATS;
  f();
  CALLGRIND_DUMP_STATS_AT(name);
  CALLGRIND_STOP_INSTRUMENTATION;
  std::printf("%s\n", name);
}

// One chunk of `tokens` random tokens for every stream of `cache`, and their window keys.
template <class Cache>
struct prefill_inputs {
  std::vector<std::vector<float>> data;
  typename Cache::chunks chunks{};
  std::vector<float> window;

  prefill_inputs(const Cache& cache, std::int64_t tokens) {
    const auto add = [&](std::size_t k, const auto& stream) {
      data.push_back(random_vector(tokens * stream.payload_floats_per_token(), 100 + 2 * k));
      data.push_back(random_vector(tokens * stream.logit_floats_per_token(), 101 + 2 * k));
    };
    add(0, cache.compressors().template stream<0>());
    if constexpr (Cache::stream_count == 2) add(1, cache.compressors().template stream<1>());
    for (std::size_t k = 0; k < Cache::stream_count; ++k)
      chunks[k] = token_chunk{tokens, span<const float>(data[2 * k]), span<const float>(data[2 * k + 1])};
    window = random_vector(tokens * cache.config().window.kv_heads * cache.config().window.key_channels, 99);
  }
};

// A prefill of `tokens` tokens into a fresh sequence of `cache` (the previous one freed first, so
// both runs of the region take the same pages).
template <class Cache>
void prefill_region(const char* name, Cache& cache, std::int64_t tokens) {
  const prefill_inputs<Cache> in(cache, tokens);
  sequence_id seq = cache.create();
  region(name, [&] {
    cache.free(seq);
    seq = cache.create();
    cache.append(seq, in.chunks, span<const float>(in.window));
  });
}

using hca_cache = paged_cache<csa_stream>;

// Fills `seq` with `tokens` tokens of random entries the host "computed" (append_entries), in
// blocks of kBlock tokens with one window block repeated: under valgrind a pooled fill of 128K
// tokens takes minutes, and the reads' work does not depend on where their entries came from.
void fill_with_entries(csa_cache& cache, sequence_id seq, std::int64_t tokens, std::uint64_t seed) {
  const std::vector<float> window = random_vector(kBlock * kChannels, seed);
  fast_random rng(seed + 1);
  std::vector<float> kv, ix;
  for (std::int64_t done = 0; done < tokens; done += kBlock) {
    const std::int64_t n = std::min(kBlock, tokens - done), entries = cache.entries_after(seq, n);
    kv.resize(static_cast<std::size_t>(entries * kChannels));
    ix.resize(static_cast<std::size_t>(entries * kIndexerChannels));
    rng.fill(kv);
    rng.fill(ix);
    cache.append_entries(seq, n, {span<const float>(kv), span<const float>(ix)},
                         span<const float>(window.data(), static_cast<std::size_t>(n * kChannels)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  constexpr std::int64_t kPrefill = 4096;
  namespace presets = phasekv::presets;
  const std::string only = argc > 1 ? argv[1] : "";
  const auto wanted = [&](const char* group) { return only.empty() || only == group; };

  if (wanted("prefill")) {  // prefill of each preset at DeepSeek-V4's precision (FP8 entries, FP4 indexer, FP8 window)
    csa_cache csa(csa_layer(),
                  presets::deepseek_cache(presets::deepseek_v4_csa_layer, 2 * kPrefill / 4 / 64 + 4, 0, true));
    prefill_region("prefill_v4_csa_4k", csa, kPrefill);
    hca_cache hca(hca_cache::layer(csa_stream{presets::deepseek_v4_hca_layer.geom,
                                              presets::deepseek_kv_stream(presets::deepseek_v4_hca_layer)}),
                  presets::deepseek_cache(presets::deepseek_v4_hca_layer, 8, 0, true));
    prefill_region("prefill_v4_hca_4k", hca, kPrefill);
    csa_cache v41(csa_cache::layer(csa_stream{presets::deepseek_v4_1_csa_layer.geom,
                                              presets::deepseek_kv_stream(presets::deepseek_v4_1_csa_layer)},
                                   csa_stream{presets::deepseek_v4_1_csa_layer.geom,
                                              *presets::deepseek_indexer_stream(presets::deepseek_v4_1_csa_layer)}),
                  presets::deepseek_cache(presets::deepseek_v4_1_csa_layer, 2 * kPrefill / 2 / 64 + 4, 0, true));
    prefill_region("prefill_v4_1_csa_4k", v41, kPrefill);
  }

  if (wanted("decode")) {  // the 128K decode step (bench_read's BM_sparse_decode and BM_sparse_decode_v4_precision)
    sparse_workload fp32("count_fp32", 131072, 64);
    fill_with_entries(fp32.cache, fp32.seq, fp32.tokens, 1);
    region("decode_128k_fp32", [&] { fp32.step(); });
  }
  if (wanted("v4")) {
    sparse_workload v4("count_v4", 131072, 64, false, storage_type::fp8_e4m3_block, true);
    fill_with_entries(v4.cache, v4.seq, v4.tokens, 2);
    region("decode_128k_v4_precision", [&] { v4.step(); });
  }

  if (wanted("select")) {  // the indexer's top-k alone (bench_read's BM_top_k): a cut at a sampled score, and none
    std::vector<std::uint64_t> keys, scratch;
    for (const std::int64_t n : {32768, 2048}) {
      const std::vector<float> scores = random_vector(n, static_cast<std::uint64_t>(40 + n));
      region(n == 32768 ? "top_512_of_32k" : "top_512_of_2k",
             [&] { select_top_keys(span<const float>(scores), 0, 512, keys, scratch); });
    }
  }

  if (wanted("batch")) {  // a batched read of 8 sequences of 32K, and one token appended to each (append_batch)
    constexpr std::int64_t kCount = 8, kContext = 32768;
    cache_config config = decode_cache_config("count_batch", kContext, 64);
    config.pages = kCount * (kContext / 4 / 64 + 4);
    csa_cache cache(csa_layer(), config);
    sparse_reader reader(cache, decode_reader_config("count_batch"));
    std::vector<sequence_id> seqs;
    for (std::int64_t s = 0; s < kCount; ++s) {
      seqs.push_back(cache.create());
      fill_with_entries(cache, seqs.back(), kContext, static_cast<std::uint64_t>(100 + s));
    }
    const std::vector<float> queries = random_vector(kQueryHeads * kChannels, 21);
    const std::vector<float> indexer_queries = random_vector(kIndexerHeads * kIndexerChannels, 22);
    std::vector<float> indexer_weights = random_vector(kIndexerHeads, 23);
    for (float& w : indexer_weights) w = 0.5f * (w + 1.0f) / static_cast<float>(kIndexerHeads);
    const std::vector<float> sinks = random_vector(kQueryHeads, 24);
    std::vector<sequence_view> views(kCount);
    std::vector<read_item> items(kCount);
    std::vector<float> out(static_cast<std::size_t>(kCount * kQueryHeads * kChannels));
    for (std::int64_t s = 0; s < kCount; ++s) {
      read_item& it = items[static_cast<std::size_t>(s)];
      it.view = &views[static_cast<std::size_t>(s)];
      it.request.position = kContext - 1;
      it.request.queries = span<const float>(queries);
      it.request.indexer_queries = span<const float>(indexer_queries);
      it.request.indexer_weights = span<const float>(indexer_weights);
      it.request.sinks = span<const float>(sinks);
      it.out = out.data() + s * kQueryHeads * kChannels;
    }
    region("batched_read_8x32k", [&] {
      for (std::size_t s = 0; s < seqs.size(); ++s) views[s] = cache.view_of(seqs[s]);
      reader.read_batch(items);
    });

    const csa_stream& kv = cache.compressors().stream<0>();
    const csa_stream& ix = cache.compressors().stream<1>();
    const std::vector<float> kv_in = random_vector(kv.payload_floats_per_token(), 31);
    const std::vector<float> kv_gates = random_vector(kv.logit_floats_per_token(), 32);
    const std::vector<float> ix_in = random_vector(ix.payload_floats_per_token(), 33);
    const std::vector<float> ix_gates = random_vector(ix.logit_floats_per_token(), 34);
    const std::vector<float> window = random_vector(kChannels, 35);
    // The append's work does not depend on the context; the compressor continues only its own
    // sequences (W = 2S), so these are 8 fresh ones of 64 pooled tokens.
    std::vector<csa_cache::append_item> appends;
    for (std::int64_t s = 0; s < kCount; ++s) {
      const sequence_id seq = cache.create();
      append_random_tokens(cache, seq, 64, static_cast<std::uint64_t>(200 + s));
      csa_cache::append_item it;
      it.seq = seq;
      it.in = {token_chunk{1, span<const float>(kv_in), span<const float>(kv_gates)},
               token_chunk{1, span<const float>(ix_in), span<const float>(ix_gates)}};
      it.window_keys = span<const float>(window);
      appends.push_back(it);
    }
    // Four tokens per sequence: every phase of S = 4, one entry each.
    region("decode_append_8x4", [&] {
      for (int t = 0; t < 4; ++t) cache.append_batch(appends);
    });
  }
  if (wanted("model")) {  // a decode step through the model front door, and the same through per-layer caches
    constexpr std::int64_t kCount = 8, kContext = 4096, kSpare = 16;
    model_options options;
    options.pages = kCount * ((kContext + kSpare) / 4 / 64 + 2);
    model_cache model(presets::deepseek_v4_model({4, 128}, true), options);  // layer 0: CSA, layer 1: HCA
    const presets::deepseek_layer_preset csa_p = presets::deepseek_preset(presets::deepseek_v4_csa_layer, options.pages, 0, true);
    const presets::deepseek_layer_preset hca_p = presets::deepseek_preset(presets::deepseek_v4_hca_layer, options.pages, 0, true);
    csa_cache csa(csa_cache::layer(csa_stream(csa_p.geom, csa_p.kv), csa_stream(csa_p.geom, *csa_p.indexer)), csa_p.cache);
    hca_cache hca(hca_cache::layer(csa_stream(hca_p.geom, hca_p.kv)), hca_p.cache);
    sparse_reader csa_reader(csa, csa_p.reader), hca_reader(hca, hca_p.reader);

    // Per layer, per stream one token's payload and gate logits (the same for every step and
    // sequence), and a window row; a 4K-token prefill block of each.
    struct layer_inputs {
      std::vector<std::vector<float>> one, block;
      std::vector<float> window_one, window_block;
    };
    std::vector<layer_inputs> in(2);
    for (std::size_t l = 0; l < 2; ++l)
      for (std::size_t k = 0; k < model.shape(l).streams.size(); ++k) {
        const stream_kernel& s = model.stream(l, k);
        for (std::int64_t floats : {s.payload_floats_per_token(), s.logit_floats_per_token()}) {
          in[l].one.push_back(random_vector(floats, 300 + 10 * l + k));
          in[l].block.push_back(random_vector(kContext * floats, 400 + 10 * l + k));
        }
      }
    for (std::size_t l = 0; l < 2; ++l) {
      in[l].window_one = random_vector(kChannels, 500 + l);
      in[l].window_block = random_vector(kContext * kChannels, 600 + l);
    }
    const auto chunks = [&](std::size_t l, bool block) {
      const auto& v = block ? in[l].block : in[l].one;
      std::vector<token_chunk> c;
      for (std::size_t k = 0; k + 1 < v.size(); k += 2) c.push_back({block ? kContext : 1, span<const float>(v[k]), span<const float>(v[k + 1])});
      return c;
    };
    std::vector<sequence_id> model_seqs, csa_seqs, hca_seqs;
    for (std::int64_t s = 0; s < kCount; ++s) {
      model_seqs.push_back(model.create());
      csa_seqs.push_back(csa.create());
      hca_seqs.push_back(hca.create());
      const std::vector<token_chunk> c0 = chunks(0, true), c1 = chunks(1, true);
      csa.append(csa_seqs.back(), {c0[0], c0[1]}, span<const float>(in[0].window_block));
      hca.append(hca_seqs.back(), {c1[0]}, span<const float>(in[1].window_block));
    }
    {
      model_step prefill = model.begin(span<const sequence_id>(model_seqs.data(), model_seqs.size()), kContext);
      for (std::size_t l = 0; l < 2; ++l) {
        const std::vector<token_chunk> c = chunks(l, true);
        const std::vector<layer_append> rows(kCount, layer_append{c, span<const float>(in[l].window_block), {}});
        prefill.append(l, rows);
      }
      prefill.commit();
    }
    // The reads' inputs: the same for every sequence.
    const std::vector<float> queries = random_vector(kQueryHeads * kChannels, 41);
    const std::vector<float> indexer_queries = random_vector(kIndexerHeads * kIndexerChannels, 42);
    std::vector<float> indexer_weights = random_vector(kIndexerHeads, 43);
    for (float& w : indexer_weights) w = 0.5f * (w + 1.0f) * presets::deepseek_indexer_weight_scale();
    const std::vector<float> sinks = random_vector(kQueryHeads, 44);
    std::vector<float> out(static_cast<std::size_t>(kCount * kQueryHeads * kChannels));
    const auto request = [&](std::size_t l, std::int64_t t) {
      return l == 0 ? read_request{t, queries, indexer_queries, indexer_weights, sinks} : read_request{t, queries, {}, {}, sinks};
    };

    region("model_decode_step_8x4k", [&] {
      const std::int64_t t = model.tokens(model_seqs[0]);
      model_step step = model.begin(span<const sequence_id>(model_seqs.data(), model_seqs.size()), 1);
      for (std::size_t l = 0; l < 2; ++l) {
        const std::vector<token_chunk> c = chunks(l, false);
        const std::vector<layer_append> rows(kCount, layer_append{c, span<const float>(in[l].window_one), {}});
        step.append(l, rows);
        std::vector<layer_read> reads(kCount);
        for (std::size_t r = 0; r < reads.size(); ++r) {
          reads[r].row = r;
          reads[r].request = request(l, t);
          reads[r].out = out.data() + static_cast<std::int64_t>(r) * kQueryHeads * kChannels;
        }
        step.read(l, reads);
      }
      step.commit();
    });
    region("direct_decode_step_8x4k", [&] {
      const std::int64_t t = csa.tokens(csa_seqs[0]);
      const std::vector<token_chunk> c0 = chunks(0, false), c1 = chunks(1, false);
      std::vector<csa_cache::append_item> csa_items(kCount);
      std::vector<hca_cache::append_item> hca_items(kCount);
      for (std::size_t s = 0; s < static_cast<std::size_t>(kCount); ++s) {
        csa_items[s] = {csa_seqs[s], {c0[0], c0[1]}, span<const float>(in[0].window_one), {}};
        hca_items[s] = {hca_seqs[s], {c1[0]}, span<const float>(in[1].window_one), {}};
      }
      const auto read_all = [&](auto& cache, const std::vector<sequence_id>& seqs, sparse_reader& reader, std::size_t l) {
        std::vector<sequence_view> views(seqs.size());
        std::vector<read_item> items(seqs.size());
        for (std::size_t s = 0; s < seqs.size(); ++s) {
          views[s] = cache.view_of(seqs[s]);
          items[s].view = &views[s];
          items[s].request = request(l, t);
          items[s].out = out.data() + static_cast<std::int64_t>(s) * kQueryHeads * kChannels;
        }
        reader.read_batch(items);
      };
      csa.append_batch(csa_items);
      read_all(csa, csa_seqs, csa_reader, 0);
      hca.append_batch(hca_items);
      read_all(hca, hca_seqs, hca_reader, 1);
    });
  }
  return 0;
}
