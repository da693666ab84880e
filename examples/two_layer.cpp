// Two layers of a DeepSeek-V4 model behind one sequence table (model_cache): a CSA layer (S = 4,
// W = 8, tied 512-channel K/V plus a 128-channel lightning-indexer stream, top-512 selection) and
// an HCA layer (S = W = 128, tied K/V, every complete entry read). A prefill, a fork (a second
// beam sharing every page of both layers), then decode steps in which each layer appends its new
// token and reads — layer by layer, as a forward pass runs — and a rollback of the beam. Both
// layers' K/V entries (one head of 512 channels) come from one shared page pool by default, the
// CSA layer's indexer keys from a pool of its own.
//
//   two_layer [--prompt N] [--steps N] [--storage f32|bf16] [--pools shared|separate]
//
// The host's model would supply the projections, queries and sinks; random ones stand in here.
// Per token and layer the host writes each stream's payload[heads][views][C] and gate logits of
// the same shape (compress/stream_config.hpp) and the raw window key, already RoPE'd.

#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <phasekv/phasekv.hpp>

#include "cli.hpp"

int main(int argc, char** argv) try {
  using namespace phasekv;
  std::int64_t prompt = 4096, steps = 8;
  storage_type storage = storage_type::bf16;
  bool shared_pools = true;
  cli::parser args("two_layer", "A CSA and an HCA layer of DeepSeek-V4 behind one sequence table: prefill, fork a\n"
                                "beam, decode layer by layer, roll the beam back.");
  // At most 128K prompt tokens: the prefill builds every token's inputs at once (about 12 KB each).
  args.integer("--prompt", "N", "tokens prefilled", prompt, 1, 1 << 17);
  args.integer("--steps", "N", "decode steps of each beam", steps, 0, 1 << 16);
  args.choice("--storage", "element type of every stored entry", storage,
              {{"f32", storage_type::f32}, {"bf16", storage_type::bf16}});
  args.choice("--pools", "the layers' K/V entries in one page pool or one each", shared_pools,
              {{"shared", true}, {"separate", false}});
  args.parse(argc, argv);

  using csa = stream_compressor<presets::deepseek_v4_csa_policy>;
  using hca = stream_compressor<presets::deepseek_v4_hca_policy>;
  using csa_cache = paged_cache<csa, csa>;
  using hca_cache = paged_cache<hca>;
  const geometry csa_geom = presets::deepseek_v4_csa_geometry(), hca_geom = presets::deepseek_v4_hca_geometry();

  // Room for both beams (the pools commit memory only as pages are written), and enough history
  // to roll a beam back over the decoded steps.
  const std::int64_t tokens = prompt + steps;
  cache_config csa_config = presets::deepseek_v4_cache(2 * (tokens / csa_geom.stride / 64 + 2), steps);
  cache_config hca_config = presets::deepseek_v4_cache(2 * (tokens / hca_geom.stride / 64 + 2), steps);
  csa_config.name = "csa";
  hca_config.name = "hca";
  csa_config.storage = hca_config.storage = storage;
  if (shared_pools) {
    // One budget for every layer's K/V pages, as the sum of what the layers would reserve apart.
    page_pool_config kv;
    kv.name = "kv";
    kv.page_size = csa_config.page_size;
    kv.kv_heads = 1;
    kv.channels = 512;
    kv.storage = storage;
    kv.capacity = csa_config.pages + hca_config.pages;
    auto kv_pool = std::make_shared<page_pool>(kv);
    csa_config.shared_pools = {kv_pool, nullptr};
    hca_config.shared_pools = {kv_pool};
  }
  model_cache<csa_cache, hca_cache> model(
      layer_spec<csa_cache>{
          csa_cache::layer(csa(csa_geom, presets::deepseek_v4_csa_kv()), csa(csa_geom, presets::deepseek_v4_csa_indexer())),
          csa_config},
      layer_spec<hca_cache>{hca_cache::layer(hca(hca_geom, presets::deepseek_v4_hca_kv())), hca_config});

  sparse_reader csa_reader(model.layer<0>(), presets::deepseek_v4_csa_reader());
  sparse_reader hca_reader(model.layer<1>(), presets::deepseek_v4_hca_reader());

  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  auto random_vector = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  // One forward pass over n new tokens of a sequence: each layer appends its inputs.
  auto append_tokens = [&](sequence_id seq, std::int64_t n) {
    const csa& kv = model.layer<0>().compressors().stream<0>();
    const csa& ix = model.layer<0>().compressors().stream<1>();
    const hca& hkv = model.layer<1>().compressors().stream<0>();
    model.append<0>(seq,
                    {token_chunk{n, random_vector(n * kv.payload_floats_per_token()),
                                 random_vector(n * kv.logit_floats_per_token())},
                     token_chunk{n, random_vector(n * ix.payload_floats_per_token()),
                                 random_vector(n * ix.logit_floats_per_token())}},
                    random_vector(n * 512));
    model.append<1>(seq,
                    {token_chunk{n, random_vector(n * hkv.payload_floats_per_token()),
                                 random_vector(n * hkv.logit_floats_per_token())}},
                    random_vector(n * 512));
  };

  const sequence_id seq = model.create();
  append_tokens(seq, prompt);
  const sequence_id beam = model.fork(seq);  // shares every page of both layers
  std::printf("prefill: %lld tokens; CSA %lld entries, HCA %lld entries; beam forked\n",
              static_cast<long long>(prompt), static_cast<long long>(model.layer<0>().entries(model.layer_id(seq, 0), 0)),
              static_cast<long long>(model.layer<1>().entries(model.layer_id(seq, 1), 0)));

  const auto sinks = random_vector(64);
  std::vector<float> out(64 * 512);
  read_trace csa_trace, hca_trace;
  for (std::int64_t step = 0; step < steps; ++step) {
    for (sequence_id s : {seq, beam}) {
      append_tokens(s, 1);
      const std::int64_t t = model.layer<0>().tokens(model.layer_id(s, 0)) - 1;
      csa_reader.read(model.layer<0>(), model.layer_id(s, 0),
                      read_request{t, random_vector(64 * 512), random_vector(64 * 128), random_vector(64), sinks},
                      out.data(), &csa_trace);
      hca_reader.read(model.layer<1>(), model.layer_id(s, 1), read_request{t, random_vector(64 * 512), {}, {}, sinks}, out.data(),
                      &hca_trace);
    }
    if (step % 4 == 0)
      std::printf("step %lld: CSA read %zu of %lld entries, HCA read %zu entries + %lld window tokens\n",
                  static_cast<long long>(step), csa_trace.selected.size(), static_cast<long long>(csa_trace.candidates),
                  hca_trace.selected.size(), static_cast<long long>(hca_trace.window_token_mass.size()));
  }
  model.remove_suffix(beam, prompt);  // the beam is dropped back to the prompt in both layers

  const auto memory = model.memory(seq);
  const auto pools = model.pool_usage();
  const char* names[] = {"CSA", "HCA"};
  for (std::size_t l = 0; l < 2; ++l)
    std::printf("%s layer: %lld entries, %.1f KiB of entries, %lld pages (%lld shared with the beam); its sequences "
                "hold %.1f MiB of pages\n",
                names[l], static_cast<long long>(memory.layers[l].entries), memory.layers[l].entry_bytes / 1024.0,
                static_cast<long long>(memory.layers[l].pages), static_cast<long long>(memory.layers[l].shared_pages),
                pools.layers[l].bytes_held / 1048576.0);
  for (const auto& pool : pools.pools) {
    std::string layers;
    for (std::size_t l : pool.layers) layers += std::string(layers.empty() ? "" : "+") + names[l];
    std::printf("pool %s (%s): %.1f MiB in use, %.1f MiB touched of %.1f MiB reserved\n", pool.name.c_str(),
                layers.c_str(), pool.bytes_used / 1048576.0, pool.bytes_touched / 1048576.0,
                pool.bytes_reserved / 1048576.0);
  }
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
