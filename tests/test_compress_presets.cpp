// Published configurations (models/deepseek_v4.hpp, models/nsa.hpp) hold the published numbers,
// and compress as the oracle says: DeepSeek-V4's CSA tied K/V stream and its indexer stream, alone
// and in layers of several streams appended in step.

#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/random_inputs.hpp"
#include "oracle/scalar_compressor.hpp"
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/models/nsa.hpp"

namespace test_compress_presets {

namespace {

using namespace phasekv;
using namespace phasekv_test;

template <class Policy>
stream_params random_params(std::mt19937& rng, const geometry& g, const stream_config& c, bool exact_bias = false) {
  stream_params p;
  if constexpr (is_gated_v<typename Policy::pooling>)
    p.slot_bias = random_bias(rng, static_cast<std::size_t>(c.kv_heads * g.window * oracle_gate_channels<Policy>(c)),
                              exact_bias);
  if constexpr (has_norm_v<Policy>) p.norm_weight = random_norm_weight(rng, static_cast<std::size_t>(c.channels));
  return p;
}

token_chunk chunk_of(const stream_inputs& in, std::int64_t first, std::int64_t count, std::int64_t ppt,
                     std::int64_t lpt) {
  token_chunk chunk;
  chunk.tokens = count;
  chunk.payload = span<const float>(in.payload.data() + first * ppt, static_cast<std::size_t>(count * ppt));
  if (lpt > 0) chunk.logits = span<const float>(in.logits.data() + first * lpt, static_cast<std::size_t>(count * lpt));
  return chunk;
}

// Random chunk boundaries over [0, tokens), always starting with a chunk shorter than a block.
std::vector<std::int64_t> random_cuts(std::mt19937& rng, std::int64_t tokens, std::int64_t max_chunk) {
  std::vector<std::int64_t> cuts = {0, 3};
  std::uniform_int_distribution<std::int64_t> size(0, max_chunk);
  while (cuts.back() < tokens) cuts.push_back(std::min(tokens, cuts.back() + size(rng)));
  return cuts;
}

// One stream of a preset through its compressor (in random chunks) and the oracle.
template <class Policy>
void check_stream(const geometry& g, const stream_config& config, std::uint32_t seed, std::int64_t tokens,
                  const logit_options& logits = {}) {
  std::mt19937 rng(seed);
  const stream_params params = random_params<Policy>(rng, g, config, logits.magnitude > 0);
  const stream_compressor<Policy> compressor(g, config, params);
  const std::int64_t ppt = compressor.payload_floats_per_token(), lpt = compressor.logit_floats_per_token();
  const stream_inputs in = random_stream_inputs(rng, tokens, ppt, lpt, logits);
  INFO(config.name << " seed=" << seed << " tokens=" << tokens << " logit_magnitude=" << logits.magnitude);

  stream_state state = compressor.make_state();
  entry_buffer got;
  append_options options;
  options.slot_weights = true;
  options.check_finite = true;
  const auto cuts = random_cuts(rng, tokens, 40);
  for (std::size_t k = 1; k < cuts.size(); ++k)
    compressor.append(state, chunk_of(in, cuts[k - 1], cuts[k] - cuts[k - 1], ppt, lpt), got, options);

  const auto expected = oracle_compress<Policy>(g, config, params, in.payload, in.logits, tokens);
  REQUIRE(expected.size() == static_cast<std::size_t>(tokens / g.stride));
  CHECK(oracle_mismatch_all(expected, got, config.kv_heads, config.channels, g.window, true) == "");
}

}  // namespace

TEST_CASE("presets: DeepSeek-V4 CSA holds the published numbers", "[compress][presets]") {
  using p = presets::deepseek_v4_csa_policy;
  STATIC_REQUIRE(std::is_same_v<p::pooling, vector_gated_pool>);
  STATIC_REQUIRE(std::is_same_v<p::rope, rope_after_pool>);
  STATIC_REQUIRE(std::is_same_v<p::norm, rms_norm>);

  const geometry g = presets::deepseek_v4_csa_layer.geom;
  CHECK(g.stride == 4);
  CHECK(g.window == 8);
  CHECK(g.origin == 0);
  CHECK(g.anchor == anchor_mode::block_start);

  for (const stream_config& c : {presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer),
                                 *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer)}) {
    INFO(c.name);
    CHECK(c.kv_heads == 1);
    CHECK(c.inputs == input_layout::per_branch);  // one projection per branch: two branches
    CHECK(c.norm_eps == 1e-6);
    CHECK(c.rope.channels == 64);
    CHECK(c.rope.base == 160000.0);
    CHECK(c.rope.layout == rope_layout::interleaved);
    CHECK(c.rope.yarn.enabled);
    CHECK(c.rope.yarn.factor == 16.0);
    CHECK(c.rope.yarn.original_context == 65536);
    CHECK(c.rope.yarn.beta_fast == 32.0);
    CHECK(c.rope.yarn.beta_slow == 1.0);
  }
  const stream_config kv = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
  CHECK(kv.channels == 512);
  CHECK(kv.role == stream_role::key_value);
  const stream_config indexer = *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer);
  CHECK(indexer.channels == 128);
  CHECK(indexer.role == stream_role::indexer);
  CHECK(kv.name != indexer.name);

  const stream_compressor<p> compressor(g, kv);
  CHECK(compressor.views() == 2);
  CHECK(compressor.gate_channels() == 512);
  CHECK(compressor.payload_floats_per_token() == 2 * 512);
  CHECK(compressor.logit_floats_per_token() == 2 * 512);

  // The other published geometries.
  const geometry nsa = presets::nsa_compressed_geometry();
  CHECK((nsa.stride == 16 && nsa.window == 32));
}

TEST_CASE("presets: DeepSeek-V4 HCA and V4.1 CSA have their documented shapes", "[compress][presets]") {
  STATIC_REQUIRE(std::is_same_v<presets::deepseek_v4_hca_policy, presets::deepseek_v4_csa_policy>);
  STATIC_REQUIRE(std::is_same_v<presets::deepseek_v4_1_csa_policy, presets::deepseek_v4_csa_policy>);
  const stream_config csa = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
  auto same_maths = [&](const stream_config& c) {
    INFO(c.name);
    CHECK(c.kv_heads == 1);
    CHECK(c.inputs == input_layout::per_branch);
    CHECK(c.norm_eps == csa.norm_eps);
    CHECK(c.rope.channels == 64);  // the last 64 channels
    CHECK(c.rope.base == csa.rope.base);
    CHECK(c.rope.layout == rope_layout::interleaved);
    CHECK(c.rope.yarn.enabled);
    CHECK(c.rope.yarn.factor == csa.rope.yarn.factor);
    CHECK(c.rope.yarn.original_context == csa.rope.yarn.original_context);
  };

  // HCA: S = W = 128, one branch, tied 512-channel K/V, no indexer stream.
  const geometry hca = presets::deepseek_v4_hca_layer.geom;
  CHECK((hca.stride == 128 && hca.window == 128 && hca.origin == 0 && hca.anchor == anchor_mode::block_start));
  const stream_config hkv = presets::deepseek_kv_stream(presets::deepseek_v4_hca_layer);
  same_maths(hkv);
  CHECK(hkv.name == "hca.kv");
  CHECK(hkv.role == stream_role::key_value);
  CHECK(hkv.channels == 512);
  const stream_compressor<presets::deepseek_v4_hca_policy> h(hca, hkv);
  CHECK(h.views() == 1);
  CHECK(h.payload_floats_per_token() == 512);
  CHECK(h.logit_floats_per_token() == 512);

  // V4.1 CSA: S = 2, W = 4 (two branches), otherwise V4's CSA streams.
  const geometry v41 = presets::deepseek_v4_1_csa_layer.geom;
  CHECK((v41.stride == 2 && v41.window == 4 && v41.origin == 0 && v41.anchor == anchor_mode::block_start));
  const stream_config kv = presets::deepseek_kv_stream(presets::deepseek_v4_1_csa_layer),
                      ix = *presets::deepseek_indexer_stream(presets::deepseek_v4_1_csa_layer);
  same_maths(kv);
  same_maths(ix);
  CHECK((kv.name == "v4.1.csa.kv" && kv.role == stream_role::key_value && kv.channels == 512));
  CHECK((ix.name == "v4.1.csa.indexer" && ix.role == stream_role::indexer && ix.channels == 128));
  const stream_compressor<presets::deepseek_v4_1_csa_policy> v(v41, kv);
  CHECK(v.views() == 2);
  CHECK(v.payload_floats_per_token() == 2 * 512);

  // And they compress as the oracle says: two HCA entries and a partial block; V4.1 entries
  // every two tokens.
  check_stream<presets::deepseek_v4_hca_policy>(hca, hkv, 21, 263);
  check_stream<presets::deepseek_v4_1_csa_policy>(v41, kv, 22, 41);
  check_stream<presets::deepseek_v4_1_csa_policy>(v41, ix, 23, 41);
}

TEST_CASE("presets: DeepSeek-V4 CSA streams match the oracle", "[compress][presets]") {
  using p = presets::deepseek_v4_csa_policy;
  const geometry g = presets::deepseek_v4_csa_layer.geom;
  // 203 tokens: 50 entries (entry 0 pools only tokens 0–3, its previous-block half padding),
  // anchors up to 196, and three tokens of an unfinished block.
  check_stream<p>(g, presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer), 1, 203);
  check_stream<p>(g, *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer), 2, 203);
  logit_options large;
  large.magnitude = 1e4;
  check_stream<p>(g, presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer), 3, 61, large);
  large.magnitude = 80;
  large.signs = logit_signs::positive;
  check_stream<p>(g, *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer), 4, 61, large);

  SECTION("entry 0 pools only tokens 0-3, through branch 0") {
    std::mt19937 rng(5);
    const stream_config kv = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
    const stream_params params = random_params<p>(rng, g, kv);
    const stream_compressor<p> compressor(g, kv, params);
    const stream_inputs in = random_stream_inputs(rng, 4, 1024, 1024);
    entry_buffer got;
    append_options options;
    options.slot_weights = true;
    stream_state state = compressor.make_state();
    compressor.append(state, chunk_of(in, 0, 4, 1024, 1024), got, options);
    REQUIRE(got.size() == 1);
    for (int i = 0; i < 4; ++i) CHECK(got.slot_weights(0)[i] == 0.0f);
    const auto expected = oracle_compress<p>(g, kv, params, in.payload, in.logits, 4);
    CHECK(oracle_mismatch_all(expected, got, 1, 512, 8, true) == "");
    // Changing branch 1's inputs (the previous-block projection) of tokens 0–3 changes nothing.
    stream_inputs other = in;
    for (int t = 0; t < 4; ++t)
      for (int c = 512; c < 1024; ++c) {
        other.payload[t * 1024 + c] += 1.0f;
        other.logits[t * 1024 + c] -= 5.0f;
      }
    entry_buffer same;
    stream_state fresh = compressor.make_state();
    compressor.append(fresh, chunk_of(other, 0, 4, 1024, 1024), same);
    CHECK(same.all_values() == got.all_values());
  }
}

namespace {

// Appends the same random token stream to every stream of a layer, in random chunks, and
// checks each stream's entries against the oracle.
template <std::size_t K, class Layer, class Params, class Inputs, class Buffers>
void check_layer_stream(const Layer& layer, const Params& params, const Inputs& inputs, const Buffers& got,
                        std::int64_t tokens) {
  const auto& s = layer.template stream<K>();
  using policy = typename std::decay_t<decltype(s)>::policy;
  INFO("stream " << K << " (" << s.config().name << ")");
  const auto expected = oracle_compress<policy>(s.geom(), s.config(), params[K], inputs[K].payload, inputs[K].logits,
                                                tokens);
  REQUIRE(expected.size() >= 10);
  CHECK(oracle_mismatch_all(expected, got[K], s.config().kv_heads, s.config().channels, s.geom().window, true) == "");
}

template <class Layer, std::size_t... K>
void run_layer(const Layer& layer, const std::array<stream_params, sizeof...(K)>& params, std::uint32_t seed,
               std::int64_t tokens, std::index_sequence<K...>) {
  std::mt19937 rng(seed);
  std::array<stream_inputs, sizeof...(K)> inputs;
  ((inputs[K] = random_stream_inputs(rng, tokens, layer.template stream<K>().payload_floats_per_token(),
                                     layer.template stream<K>().logit_floats_per_token())),
   ...);
  auto states = layer.make_state();
  std::array<entry_buffer, sizeof...(K)> got;
  append_options options;
  options.slot_weights = true;
  const auto cuts = random_cuts(rng, tokens, 19);
  std::int64_t emitted = 0;
  for (std::size_t c = 1; c < cuts.size(); ++c) {
    typename Layer::chunks chunks;
    ((chunks[K] = chunk_of(inputs[K], cuts[c - 1], cuts[c] - cuts[c - 1],
                           layer.template stream<K>().payload_floats_per_token(),
                           layer.template stream<K>().logit_floats_per_token())),
     ...);
    emitted += layer.append(states, chunks, [&](std::size_t k, const entry_view& e) { got[k](e); }, options);
  }
  CHECK(emitted == layer.geom().completed_entries(tokens));
  for (std::size_t k = 0; k < sizeof...(K); ++k) {
    CHECK(states[k].tokens() == tokens);
    CHECK(got[k].size() == got[0].size());
  }
  (check_layer_stream<K>(layer, params, inputs, got, tokens), ...);
}

}  // namespace

TEST_CASE("presets: a layer appends to all its streams in step", "[compress][presets]") {
  const geometry g = presets::deepseek_v4_csa_layer.geom;

  SECTION("DeepSeek-V4 CSA: tied K/V plus indexer") {
    using p = presets::deepseek_v4_csa_policy;
    std::mt19937 rng(31);
    const auto kv = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
    const auto indexer = *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer);
    const std::array<stream_params, 2> params = {random_params<p>(rng, g, kv), random_params<p>(rng, g, indexer)};
    const layer_compressor<stream_compressor<p>, stream_compressor<p>> layer(stream_compressor<p>(g, kv, params[0]),
                                                                             stream_compressor<p>(g, indexer, params[1]));
    run_layer(layer, params, 32, 67, std::make_index_sequence<2>{});
  }

  SECTION("separate keys and values with different gates, plus an indexer") {
    using key_policy = compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>;
    using value_policy = compressor_policy<scalar_gated_pool, no_rope, no_norm>;
    using index_policy = presets::deepseek_v4_csa_policy;
    stream_config keys = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
    keys.name = "keys";
    keys.role = stream_role::key;
    keys.channels = 96;
    keys.kv_heads = 3;
    keys.inputs = input_layout::per_slot;
    keys.rope.channels = 32;
    stream_config values = keys;
    values.name = "values";
    values.role = stream_role::value;
    values.channels = 80;
    values.inputs = input_layout::per_branch;
    const stream_config indexer = *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer);
    std::mt19937 rng(41);
    const std::array<stream_params, 3> params = {random_params<key_policy>(rng, g, keys),
                                                 random_params<value_policy>(rng, g, values),
                                                 random_params<index_policy>(rng, g, indexer)};
    const layer_compressor<stream_compressor<key_policy>, stream_compressor<value_policy>,
                           stream_compressor<index_policy>>
        layer(stream_compressor<key_policy>(g, keys, params[0]), stream_compressor<value_policy>(g, values, params[1]),
              stream_compressor<index_policy>(g, indexer, params[2]));
    CHECK(layer.stream<1>().gate_channels() == 1);
    run_layer(layer, params, 42, 57, std::make_index_sequence<3>{});
  }
}

}  // namespace test_compress_presets
