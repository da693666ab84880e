// Decode steps as the README's "Use it" writes them — a DeepSeek-V4-shaped model (window-only, CSA
// and HCA layers) through the front door, and one CSA layer appended to and read with its indexer,
// sink and de-rotation (the reader preset) — what a consumer compiles. scripts/test builds it
// with -Wall -Wextra -Werror under GCC and Clang: a warning from phasekv's headers fails CI.
#include <phasekv/phasekv.hpp>

#include <cstdint>
#include <vector>

namespace {

// The model's decode step: one token for one sequence, every layer appended and read.
float model_step_output() {
  using namespace phasekv;
  model_cache model(presets::deepseek_v4_model({0, 4, 128}), model_options{});
  const sequence_id seq = model.create();
  model_step step = model.begin({seq}, 1);
  std::vector<float> out(64 * 512);
  for (std::size_t l = 0; l < model.layers(); ++l) {
    std::vector<std::vector<float>> inputs;
    std::vector<token_chunk> chunks;
    for (std::size_t k = 0; k < model.shape(l).streams.size(); ++k) {
      inputs.emplace_back(static_cast<std::size_t>(model.stream(l, k).payload_floats_per_token()), 0.01f);
      inputs.emplace_back(static_cast<std::size_t>(model.stream(l, k).logit_floats_per_token()), 0.02f);
    }
    for (std::size_t k = 0; k < inputs.size(); k += 2) chunks.push_back({1, inputs[k], inputs[k + 1]});
    const std::vector<float> window(512, 0.03f), queries(64 * 512, 0.1f), sinks(64, 0.0f);
    step.append(l, {layer_append{chunks, window, {}}});
    const bool selects = model.reader(l).top_k > 0;
    const std::vector<float> iq(selects ? 64 * 128 : 0, 0.1f), iw(selects ? 64 : 0, 1.0f / 64);
    layer_read r;
    r.request = read_request{0, queries, iq, iw, sinks};
    r.out = out.data();
    step.read(l, {&r, 1});
  }
  step.commit();
  return out[0];
}

}  // namespace

int main() {
  using namespace phasekv;
  if (!(model_step_output() == model_step_output())) return 1;  // finite
  using csa = stream_compressor<presets::deepseek_v4_csa_policy>;
  layer_compressor<csa, csa> layer(
      csa(presets::deepseek_v4_csa_layer.geom, presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer)),
      csa(presets::deepseek_v4_csa_layer.geom, *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer)));
  cache_config cc;
  cc.window.tokens = 128;
  cc.window.key_channels = 512;
  paged_cache<csa, csa> cache(layer, cc);
  const sequence_id seq = cache.create();
  const std::int64_t tokens = 16;
  std::vector<float> kv(tokens * 2 * 512, 0.01f), ix(tokens * 2 * 128, 0.02f), window(tokens * 512, 0.03f);
  token_chunk kv_chunk{tokens, kv, kv}, indexer_chunk{tokens, ix, ix};
  cache.append(seq, {kv_chunk, indexer_chunk}, window);

  // 64 heads, top 512, sink, de-rotation
  sparse_reader reader(cache, presets::deepseek_reader(presets::deepseek_v4_csa_layer));
  std::vector<float> queries(64 * 512, 0.1f), indexer_queries(64 * 128, 0.1f), weights(64, 1.0f / 64), sinks(64),
      out(64 * 512);
  reader.read(cache, seq, read_request{tokens - 1, queries, indexer_queries, weights, sinks}, out.data());
  return out[0] == out[0] ? 0 : 1;  // finite
}
