// Embedding phasekv in a decode loop, through the model front door (models/model_cache.hpp): a
// DeepSeek-V4-shaped model — two window-only layers, then CSA layers (tied 512-channel K/V plus a
// 128-channel indexer, S=4, W=8, top-512 selection) alternating with HCA layers (S=W=128) — a
// batch of sequences prefilled, then decode steps in which every layer appends each sequence's new
// token and reads it, as a forward pass runs, all or nothing per step.
//
//   decode_loop [--prompt N] [--steps N] [--layers N] [--batch N] [--indexer f32|bf16]
//
// The concepts: a model_spec (the layer kinds as data), a model_cache, a model_step per forward
// pass, and per layer a layer_append (chunks and window rows) and a layer_read (a read_request and
// where its output goes) per sequence. Entries are stored in bf16. --indexer bf16 also scores the
// indexer in bf16 (queries rounded to bf16 against the bf16 keys, AVX512-BF16 dot products where
// the build has them), as DeepSeek runs its indexer in low precision; f32 widens the keys.
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
  std::int64_t prompt = 2048, steps = 16, layers = 8, batch = 2;
  indexer_precision precision = indexer_precision::f32;
  cli::parser args("decode_loop", "A DeepSeek-V4-shaped model behind one front door: a batch prefilled, then decode\n"
                                  "steps in which every layer appends and reads each sequence's new token.");
  // At most 128K prompt tokens: the prefill builds every token's inputs at once (about 12 KB each).
  args.integer("--prompt", "N", "tokens prefilled before decoding", prompt, 1, 1 << 17);
  args.integer("--steps", "N", "decode steps after the prefill", steps, 0, 1 << 16);
  args.integer("--layers", "N", "layers of the model (2 window-only, then CSA and HCA)", layers, 1, 61);
  args.integer("--batch", "N", "sequences decoded together", batch, 1, 64);
  args.choice("--indexer", "precision of the indexer's scores; the cache stores bf16 either way", precision,
              {{"f32", indexer_precision::f32}, {"bf16", indexer_precision::bf16}});
  args.parse(argc, argv);

  // The model as data: DeepSeek-V4's layer kinds, every stream stored in bf16.
  model_spec spec = presets::deepseek_v4_shaped(static_cast<std::size_t>(layers));
  for (layer_kind& kind : spec.kinds) {
    for (stream_spec& stream : kind.streams) stream.storage = storage_type::bf16;
    if (kind.reader.top_k > 0) kind.reader.precision = precision;
  }
  model_options options;
  options.pages = batch * ((prompt + steps) / 4 / 64 + 2);  // page ids per kind: the CSA kind is the densest
  model_cache model(spec, options);

  // Stand-ins for the host's projections.
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  auto random_vector = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  // One sequence's new tokens in one layer: its streams' payloads and gate logits, its window keys.
  struct layer_tokens {
    std::vector<std::vector<float>> inputs;
    std::vector<token_chunk> chunks;
    std::vector<float> window;
    layer_append append() const { return {chunks, window, {}}; }
  };
  auto tokens_of = [&](std::size_t layer, std::int64_t n) {
    layer_tokens t;
    for (std::size_t k = 0; k < model.shape(layer).streams.size(); ++k) {
      t.inputs.push_back(random_vector(n * model.stream(layer, k).payload_floats_per_token()));
      t.inputs.push_back(random_vector(n * model.stream(layer, k).logit_floats_per_token()));
    }
    for (std::size_t k = 0; k < t.inputs.size(); k += 2) t.chunks.push_back({n, t.inputs[k], t.inputs[k + 1]});
    t.window = random_vector(n * 512);
    return t;
  };

  std::vector<sequence_id> batch_ids;
  for (std::int64_t b = 0; b < batch; ++b) batch_ids.push_back(model.create());
  const span<const sequence_id> rows(batch_ids.data(), batch_ids.size());

  // The prefill: one step, every layer appended with the whole prompt of every sequence.
  {
    model_step prefill = model.begin(rows, prompt);
    for (std::size_t l = 0; l < model.layers(); ++l) {
      std::vector<layer_tokens> t;
      std::vector<layer_append> in;
      for (std::int64_t b = 0; b < batch; ++b) t.push_back(tokens_of(l, prompt));
      for (const layer_tokens& x : t) in.push_back(x.append());
      prefill.append(l, in);
    }
    prefill.commit();
  }
  std::printf("prefill: %lld sequences of %lld tokens in %lld layers; CSA kind %lld pages, HCA kind %lld pages\n",
              static_cast<long long>(batch), static_cast<long long>(prompt), static_cast<long long>(layers),
              static_cast<long long>(model.pool_usage().kinds.size() > 1 ? model.pool_usage().kinds[1].pages_used : 0),
              static_cast<long long>(model.pool_usage().kinds.size() > 2 ? model.pool_usage().kinds[2].pages_used : 0));

  const auto sinks = random_vector(64);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(batch), std::vector<float>(64 * 512));
  std::vector<read_trace> traces(static_cast<std::size_t>(batch));
  for (std::int64_t s = 0; s < steps; ++s) {
    const std::int64_t t = model.tokens(batch_ids[0]);  // the new token's position
    model_step step = model.begin(rows, 1);
    std::size_t traced = model.layers();  // the last CSA layer's reads are traced
    for (std::size_t l = 0; l < model.layers(); ++l) {
      // The new token's K/V first: a query reads its own token.
      std::vector<layer_tokens> tokens;
      std::vector<layer_append> in;
      for (std::int64_t b = 0; b < batch; ++b) tokens.push_back(tokens_of(l, 1));
      for (const layer_tokens& x : tokens) in.push_back(x.append());
      step.append(l, in);
      const bool csa = model.reader(l).top_k > 0;
      if (csa) traced = l;
      std::vector<std::vector<float>> q, iq, iw;
      std::vector<layer_read> reads(static_cast<std::size_t>(batch));
      for (std::int64_t b = 0; b < batch; ++b) {
        q.push_back(random_vector(64 * 512));
        iq.push_back(csa ? random_vector(64 * 128) : std::vector<float>{});
        iw.push_back(csa ? random_vector(64) : std::vector<float>{});
      }
      for (std::int64_t b = 0; b < batch; ++b) {
        layer_read& r = reads[static_cast<std::size_t>(b)];
        r.row = static_cast<std::size_t>(b);
        r.request = read_request{t, q[static_cast<std::size_t>(b)], iq[static_cast<std::size_t>(b)],
                                 iw[static_cast<std::size_t>(b)], sinks};
        r.out = out[static_cast<std::size_t>(b)].data();
        r.trace = csa ? &traces[static_cast<std::size_t>(b)] : nullptr;
      }
      step.read(l, reads);
    }
    step.commit();
    if (s % 4 == 0 && traced < model.layers()) {
      const read_trace& trace = traces[0];
      std::printf("step %2lld  t=%lld  layer %zu (CSA): candidates=%lld selected=%zu  mass: entries %.3f window %.3f "
                  "sink %.3f\n",
                  static_cast<long long>(s), static_cast<long long>(t), traced, static_cast<long long>(trace.candidates),
                  trace.selected.size(), 1.0 - trace.window_mass - trace.sink_mass, trace.window_mass, trace.sink_mass);
    }
  }
  const model_memory m = model.memory(batch_ids[0]);
  std::printf("memory: %.1f KiB of entries for %lld tokens in %lld layers (%.2fx smaller than an uncompressed cache)\n",
              m.total.entry_bytes / 1024.0, static_cast<long long>(m.total.tokens), static_cast<long long>(layers),
              m.total.compression_ratio());
  return 0;
} catch (const phasekv::error& e) {
  std::fprintf(stderr, "decode_loop: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {  // e.g. std::bad_alloc: a message, not an abort
  std::fprintf(stderr, "decode_loop: %s\n", e.what());
  return 1;
}
