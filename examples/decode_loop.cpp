// Embedding phasekv in a decode loop: one DeepSeek-V4-style CSA layer (tied 512-channel K/V
// stream plus a 128-channel indexer stream, S=4, W=8) over a paged cache, a prefill followed by
// token-by-token decoding, each step appending the new token and reading with top-k sparse
// attention over the compressed entries plus the raw window.
//
//   decode_loop [--prompt N] [--steps N] [--indexer f32|bf16]
//
// The cache stores every stream in bf16. --indexer bf16 also scores the indexer in bf16 (queries
// rounded to bf16 against the bf16 keys, AVX512-BF16 dot products where the build has them), as
// DeepSeek runs its indexer in low precision; f32 (the default) widens the keys to fp32.
//
// The host's own model would supply the projections; random ones stand in for them here. What
// the host writes per token per stream is the stream_config.hpp layout: payload[heads][views][C]
// and gate logits of the same shape, and per token the raw window key (already RoPE'd).

#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <phasekv/phasekv.hpp>

#include "cli.hpp"

int main(int argc, char** argv) try {
  using namespace phasekv;
  std::int64_t prompt = 2048, steps = 16;
  indexer_precision precision = indexer_precision::f32;
  cli::parser args("decode_loop", "One DeepSeek-V4-style CSA layer over a paged cache: a prefill, then decode steps\n"
                                  "that each append a token and read with top-k sparse attention.");
  // At most 128K prompt tokens: the prefill builds every token's inputs at once (about 12 KB each).
  args.integer("--prompt", "N", "tokens prefilled before decoding", prompt, 1, 1 << 17);
  args.integer("--steps", "N", "decode steps after the prefill", steps, 0, 1 << 16);
  args.choice("--indexer", "precision of the indexer's scores; the cache stores bf16 either way", precision,
              {{"f32", indexer_precision::f32}, {"bf16", indexer_precision::bf16}});
  args.parse(argc, argv);

  // The layer: two streams over one geometry, appended in step.
  using csa = stream_compressor<presets::deepseek_v4_csa_policy>;
  const geometry geom = presets::deepseek_v4_csa_geometry();
  layer_compressor<csa, csa> layer(csa(geom, presets::deepseek_v4_csa_kv()),
                                   csa(geom, presets::deepseek_v4_csa_indexer()));

  cache_config cc;
  cc.page_size = 64;
  cc.pages = (prompt + steps) / geom.stride / cc.page_size + 2;
  cc.storage = storage_type::bf16;
  cc.window.tokens = 128;
  cc.window.key_channels = 512;  // tied K/V: the window keys are also its values
  paged_cache<csa, csa> cache(layer, cc);

  reader_config rc;
  rc.query_heads = 64;
  rc.key_stream = rc.value_stream = 0;  // tied K/V
  rc.indexer_stream = 1;
  rc.top_k = 512;
  rc.indexer_heads = 64;
  rc.sink = true;
  rc.derotate_output = true;
  rc.precision = precision;
  sparse_reader reader(cache, rc);

  // Stand-ins for the host's projections of one token.
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  auto random_vector = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  const csa& kv = layer.stream<0>();
  const csa& ix = layer.stream<1>();
  auto append_tokens = [&](sequence_id seq, std::int64_t n) {
    const auto kv_payload = random_vector(n * kv.payload_floats_per_token());
    const auto kv_logits = random_vector(n * kv.logit_floats_per_token());
    const auto ix_payload = random_vector(n * ix.payload_floats_per_token());
    const auto ix_logits = random_vector(n * ix.logit_floats_per_token());
    const auto window_keys = random_vector(n * 512);
    cache.append(seq, {token_chunk{n, kv_payload, kv_logits}, token_chunk{n, ix_payload, ix_logits}}, window_keys);
  };

  const sequence_id seq = cache.create();
  append_tokens(seq, prompt);  // prefill
  std::printf("prefill: %lld tokens -> %lld entries in %lld pages per stream\n", static_cast<long long>(prompt),
              static_cast<long long>(cache.entries(seq, 0)), static_cast<long long>(cache.page_table(seq, 0).size()));

  const auto sinks = random_vector(64);
  std::vector<float> out(static_cast<std::size_t>(reader.output_floats()));
  read_trace trace;
  for (std::int64_t step = 0; step < steps; ++step) {
    append_tokens(seq, 1);  // the new token's K/V first: a query reads its own token
    const auto queries = random_vector(64 * 512), index_queries = random_vector(64 * 128);
    const auto index_weights = random_vector(64);
    const std::int64_t t = cache.tokens(seq) - 1;
    reader.read(cache, seq, read_request{t, queries, index_queries, index_weights, sinks}, out.data(), &trace);
    if (step % 4 == 0)
      std::printf("step %2lld  t=%lld  candidates=%lld selected=%zu  mass: entries %.3f window %.3f sink %.3f\n",
                  static_cast<long long>(step), static_cast<long long>(t), static_cast<long long>(trace.candidates),
                  trace.selected.size(), 1.0 - trace.window_mass - trace.sink_mass, trace.window_mass,
                  trace.sink_mass);
  }
  const sequence_memory m = cache.memory(seq);
  std::printf("memory: %.1f KiB of entries for %lld tokens (%.2fx smaller than an uncompressed cache)\n",
              m.entry_bytes / 1024.0, static_cast<long long>(m.tokens), m.compression_ratio());
  return 0;
} catch (const phasekv::error& e) {
  std::fprintf(stderr, "decode_loop: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {  // e.g. std::bad_alloc: a message, not an abort
  std::fprintf(stderr, "decode_loop: %s\n", e.what());
  return 1;
}
