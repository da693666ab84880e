// Pooling policies of the host's (compress/policies.hpp, "Your own pooling") in a whole layer: a
// K/V stream pooled by NSA's compressor (examples/pools/nsa_mlp_pool.hpp: an intra-block
// position embedding and a two-layer MLP, weights from the host) next to an indexer stream
// pooled by max pooling (examples/pools/max_pool.hpp), in a paged cache read by the sparse
// reader with top-k selection, then saved as a snapshot and restored into a second cache.
//
//   custom_pooling [--tokens N] [--block N] [--hidden N] [--top-k N]
//
// The MLP's weights are random here; a host loads its checkpoint's.

#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <vector>

#include <phasekv/phasekv.hpp>

#include "cli.hpp"
#include "pools/max_pool.hpp"
#include "pools/nsa_mlp_pool.hpp"

int main(int argc, char** argv) try {
  using namespace phasekv;
  std::int64_t tokens = 2048, block = 16, hidden = 64, top_k = 16;
  cli::parser args("custom_pooling", "NSA's MLP compressor and max pooling as pooling policies of the host's:\n"
                                     "write, select, read, snapshot.");
  args.integer("--tokens", "N", "tokens appended", tokens, 1, 1 << 16);
  args.integer("--block", "N", "block length S = W of the compressed entries", block, 1, 64);
  args.integer("--hidden", "N", "hidden width of the MLP", hidden, 1, 1024);
  args.integer("--top-k", "N", "entries the indexer selects", top_k, 1, 1 << 12);
  args.parse(argc, argv);

  constexpr std::int64_t channels = 64, indexer_channels = 32, heads = 4;
  using kv_stream = stream_compressor<compressor_policy<phasekv_examples::nsa_mlp_pool>>;
  using ix_stream = stream_compressor<compressor_policy<phasekv_examples::max_pool>>;
  using cache_t = paged_cache<kv_stream, ix_stream>;
  const geometry g{block, block};  // NSA: non-overlapping blocks

  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto random = [&](std::int64_t n, float scale) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = scale * normal(rng);
    return v;
  };
  phasekv_examples::nsa_mlp_pool mlp(block, channels, hidden, random(block * channels, 0.1f),
                                     random(hidden * block * channels, 0.02f), random(hidden, 0.01f),
                                     random(channels * hidden, 0.1f), random(channels, 0.01f));
  stream_config kv;
  kv.name = "kv";
  kv.role = stream_role::key_value;
  kv.channels = channels;
  stream_config ix;
  ix.name = "indexer";
  ix.role = stream_role::indexer;
  ix.channels = indexer_channels;
  cache_config cc;
  cc.name = "custom";
  cc.page_size = 16;
  cc.pages = tokens / block / 16 + 2;
  cc.window = raw_window_config{block, 1, channels, 0};
  const cache_t::layer layer(kv_stream(g, kv, {}, mlp), ix_stream(g, ix));
  cache_t cache(layer, cc);
  const sequence_id seq = cache.create();
  const auto payload = random(tokens * channels, 1.0f), indexer = random(tokens * indexer_channels, 1.0f),
             window = random(tokens * channels, 1.0f);
  cache.append(seq, {token_chunk{tokens, payload, {}}, token_chunk{tokens, indexer, {}}}, window);

  reader_config rc;
  rc.name = "reader";
  rc.query_heads = heads;
  rc.indexer_stream = 1;
  rc.indexer_heads = 2;
  rc.top_k = top_k;
  sparse_reader reader(cache, rc);
  const auto q = random(heads * channels, 1.0f), iq = random(2 * indexer_channels, 1.0f);
  const std::vector<float> iw = {0.5f, 0.5f};
  read_request r;
  r.position = tokens - 1;
  r.queries = q;
  r.indexer_queries = iq;
  r.indexer_weights = iw;
  std::vector<float> out(static_cast<std::size_t>(reader.output_floats()));
  read_trace trace;
  reader.read(cache, seq, r, out.data(), &trace);
  std::printf("custom_pooling: %lld tokens, %lld entries per stream (S = W = %lld)\n", static_cast<long long>(tokens),
              static_cast<long long>(cache.entries(seq, 0)), static_cast<long long>(block));
  std::printf("  read at %lld: %zu of %lld entries selected, entry mass %.3f, window mass %.3f\n",
              static_cast<long long>(r.position), trace.selected.size(), static_cast<long long>(trace.candidates),
              [&] {
                double m = 0;
                for (float x : trace.entry_mass) m += x;
                return m;
              }(),
              static_cast<double>(trace.window_mass));

  // The snapshot records the policies' identities (name, version, the MLP's weights).
  const std::vector<std::byte> bytes = snapshot(cache, seq);
  cache_t other(layer, cc);
  const sequence_id back = restore(other, span<const std::byte>(bytes));
  std::vector<float> again(out.size());
  reader.read(other, back, r, again.data());
  std::printf("  snapshot: %zu bytes, restored read %s\n", bytes.size(), again == out ? "identical" : "DIFFERENT");
  return again == out ? 0 : 1;
} catch (const phasekv::error& e) {
  std::fprintf(stderr, "custom_pooling: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_pooling: %s\n", e.what());
  return 1;
}
