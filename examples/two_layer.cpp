// Two layers of a DeepSeek-V4 model behind the model front door (models/model_cache.hpp): a CSA
// layer (S = 4, W = 8, tied 512-channel K/V plus a 128-channel lightning-indexer stream, top-512
// selection) and an HCA layer (S = W = 128, tied K/V, every complete entry read), described as
// data from their compress ratios. A prefill, a fork (a second beam sharing every page of both
// layers), then decode steps in which each layer appends its new token and reads — layer by
// layer, as a forward pass runs — and a rollback of the beam.
//
//   two_layer [--prompt N] [--steps N] [--storage f32|bf16]
//
// The host's model would supply the projections, queries and sinks; random ones stand in here.
// Per token and layer the host writes each stream's payload[heads][views][C] and gate logits of
// the same shape (compress/stream_config.hpp) and the raw window key, already RoPE'd.

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
  std::int64_t prompt = 4096, steps = 8;
  storage_type storage = storage_type::bf16;
  cli::parser args("two_layer", "A CSA and an HCA layer of DeepSeek-V4 behind one front door: prefill, fork a beam,\n"
                                "decode layer by layer, roll the beam back.");
  // At most 128K prompt tokens: the prefill builds every token's inputs at once (about 12 KB each).
  args.integer("--prompt", "N", "tokens prefilled", prompt, 1, 1 << 17);
  args.integer("--steps", "N", "decode steps of each beam", steps, 0, 1 << 16);
  args.choice("--storage", "element type of every stored entry", storage,
              {{"f32", storage_type::f32}, {"bf16", storage_type::bf16}});
  args.parse(argc, argv);

  model_spec spec = presets::deepseek_v4_model({4, 128});  // layer 0: CSA, layer 1: HCA
  for (layer_kind& kind : spec.kinds)
    for (stream_spec& stream : kind.streams) stream.storage = storage;
  // Page ids for both beams (arenas commit memory only as pages are written), and enough history
  // to roll a beam back over the decoded steps.
  model_options options;
  const std::int64_t tokens = prompt + steps;
  options.kind_pages = {2 * (tokens / 4 / 64 + 2), 2 * (tokens / 128 / 64 + 2)};
  options.history = steps;
  model_cache model(spec, options);

  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  auto random_vector = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  // One layer's new tokens for one sequence: each stream's payload and gate logits, the window keys.
  struct layer_tokens {
    std::vector<std::vector<float>> inputs;
    std::vector<token_chunk> chunks;
    std::vector<float> window;
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

  const sequence_id seq = model.create();
  {
    model_step prefill = model.begin({seq}, prompt);
    for (std::size_t l = 0; l < model.layers(); ++l) {
      const layer_tokens t = tokens_of(l, prompt);
      prefill.append(l, {layer_append{t.chunks, t.window, {}}});
    }
    prefill.commit();
  }
  const sequence_id beam = model.fork(seq);  // shares every page of both layers
  std::printf("prefill: %lld tokens; CSA %lld pages, HCA %lld pages; beam forked\n", static_cast<long long>(prompt),
              static_cast<long long>(model.page_table(seq, 0).size()), static_cast<long long>(model.page_table(seq, 1).size()));

  const auto sinks = random_vector(64);
  std::vector<float> out(64 * 512);
  read_trace traces[2];
  for (std::int64_t step = 0; step < steps; ++step) {
    const std::int64_t t = model.tokens(seq);
    model_step decode = model.begin({seq, beam}, 1);  // both beams in one step
    for (std::size_t l = 0; l < model.layers(); ++l) {
      const layer_tokens a = tokens_of(l, 1), b = tokens_of(l, 1);
      decode.append(l, {layer_append{a.chunks, a.window, {}}, layer_append{b.chunks, b.window, {}}});
      const bool csa = model.reader(l).top_k > 0;
      const std::vector<float> q = random_vector(64 * 512), iq = csa ? random_vector(64 * 128) : std::vector<float>{},
                               iw = csa ? random_vector(64) : std::vector<float>{};
      layer_read read;
      read.row = 1;  // the beam
      read.request = read_request{t, q, iq, iw, sinks};
      read.out = out.data();
      read.trace = &traces[l];
      decode.read(l, {&read, 1});
    }
    decode.commit();
    if (step % 4 == 0)
      std::printf("step %lld: CSA read %zu of %lld entries, HCA read %zu entries + %lld window tokens\n",
                  static_cast<long long>(step), traces[0].selected.size(), static_cast<long long>(traces[0].candidates),
                  traces[1].selected.size(), static_cast<long long>(traces[1].window_token_mass.size()));
  }
  model.remove_suffix(beam, prompt);  // the beam is dropped back to the prompt in both layers

  const model_memory memory = model.memory(seq);
  const model_pool_usage pools = model.pool_usage();
  const char* names[] = {"CSA", "HCA"};
  for (std::size_t l = 0; l < 2; ++l)
    std::printf("%s layer: %lld entries, %.1f KiB of entries, %lld pages (%lld shared with the beam)\n", names[l],
                static_cast<long long>(memory.layers[l].entries), memory.layers[l].entry_bytes / 1024.0,
                static_cast<long long>(memory.layers[l].pages), static_cast<long long>(memory.layers[l].shared_pages));
  for (const auto& kind : pools.kinds)
    std::printf("kind %s: %lld of %lld page ids in use, %.1f MiB of pages, %.1f MiB touched of %.1f MiB reserved\n",
                kind.name.c_str(), static_cast<long long>(kind.pages_used), static_cast<long long>(kind.capacity),
                kind.bytes_used / 1048576.0, kind.bytes_touched / 1048576.0, kind.bytes_reserved / 1048576.0);
  std::printf("model: %.1f KiB of entries for %lld tokens in both layers (%.2fx smaller than uncompressed)\n",
              memory.total.entry_bytes / 1024.0, static_cast<long long>(memory.total.tokens),
              memory.total.compression_ratio());
  return 0;
} catch (const phasekv::error& e) {
  std::fprintf(stderr, "two_layer: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {  // e.g. std::bad_alloc: a message, not an abort
  std::fprintf(stderr, "two_layer: %s\n", e.what());
  return 1;
}
