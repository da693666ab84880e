// A decode step as the README's "Use it" writes it: the DeepSeek-V4 CSA layer appended to and read
// with its indexer, sink and de-rotation (the reader preset) — what a consumer compiles. scripts/test builds it
// with -Wall -Wextra -Werror under GCC and Clang: a warning from phasekv's headers fails CI.
#include <phasekv/phasekv.hpp>

#include <cstdint>
#include <vector>

int main() {
  using namespace phasekv;
  using csa = stream_compressor<presets::deepseek_v4_csa_policy>;
  layer_compressor<csa, csa> layer(csa(presets::deepseek_v4_csa_geometry(), presets::deepseek_v4_csa_kv()),
                                   csa(presets::deepseek_v4_csa_geometry(), presets::deepseek_v4_csa_indexer()));
  cache_config cc;
  cc.window.tokens = 128;
  cc.window.key_channels = 512;
  paged_cache<csa, csa> cache(layer, cc);
  const sequence_id seq = cache.create();
  const std::int64_t tokens = 16;
  std::vector<float> kv(tokens * 2 * 512, 0.01f), ix(tokens * 2 * 128, 0.02f), window(tokens * 512, 0.03f);
  token_chunk kv_chunk{tokens, kv, kv}, indexer_chunk{tokens, ix, ix};
  cache.append(seq, {kv_chunk, indexer_chunk}, window);

  sparse_reader reader(cache, presets::deepseek_v4_csa_reader());  // 64 heads, top 512, sink, de-rotation
  std::vector<float> queries(64 * 512, 0.1f), indexer_queries(64 * 128, 0.1f), weights(64, 1.0f / 64), sinks(64),
      out(64 * 512);
  reader.read(cache, seq, read_request{tokens - 1, queries, indexer_queries, weights, sinks}, out.data());
  return out[0] == out[0] ? 0 : 1;  // finite
}
