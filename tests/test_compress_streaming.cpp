// The streaming invariant (docs/DESIGN.md §3): appending one sequence token by token, in random
// chunks, or as one prefill gives bit-identical entries; states after the same total input
// compare equal; and entries_after() predicts how many entries an append emits.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/configs.hpp"
#include "support/random_inputs.hpp"
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/kernels/pooling.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "../examples/pools/max_pool.hpp"
#include "../examples/pools/nsa_mlp_pool.hpp"

namespace test_compress_streaming {

namespace {

using namespace phasekv;
using namespace phasekv_test;

stream_config make_config(std::int64_t channels, std::int64_t heads, input_layout inputs, std::int64_t rope_channels) {
  return rotated_stream_of("streaming", channels, heads, inputs, rope_channels);
}

// Chunk sizes summing to `tokens`: 0 = one prefill, 1 = token by token, 2 = random sizes in
// [0, 2W] (zero-token chunks included), 3 = sizes straddling block boundaries (S−1, S+1, …).
std::vector<std::int64_t> chunking(int kind, std::int64_t tokens, std::int64_t stride, std::int64_t window,
                                   std::mt19937& rng) {
  std::vector<std::int64_t> sizes;
  std::int64_t left = tokens;
  std::uniform_int_distribution<std::int64_t> any(0, 2 * window);
  std::int64_t k = 0;
  while (left > 0) {
    std::int64_t n = 0;
    switch (kind) {
      case 0: n = left; break;
      case 1: n = 1; break;
      case 2: n = any(rng); break;
      default: n = (k++ % 2 == 0) ? stride + 1 : std::max<std::int64_t>(stride - 1, 0); break;
    }
    n = std::min(n, left);
    sizes.push_back(n);
    left -= n;
  }
  return sizes;
}

struct recorded {
  std::vector<std::int64_t> index, anchor;
  std::vector<float> values, weights;
};

bool bit_identical(const recorded& a, const recorded& b) {
  return a.index == b.index && a.anchor == b.anchor && a.values.size() == b.values.size() &&
         a.weights.size() == b.weights.size() &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0 &&
         std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * sizeof(float)) == 0;
}

// "" when every chunking gives the token-by-token entries and states, forks continue alike and
// == tells a changed input apart; else what failed. `pool`: the pooling policy's instance (a
// policy of the host's, with its weights).
template <class Policy>
std::string streaming_failures(const geometry& g, const stream_config& config, std::uint32_t seed,
                               double logit_magnitude = 0, typename Policy::pooling pool = {}) {
  std::string failures;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) failures += (failures.empty() ? "" : "; ") + what;
  };
  std::mt19937 rng(seed);
  stream_params params;
  using pooling = typename Policy::pooling;
  if constexpr (is_gated_v<pooling> && !is_custom_pool_v<pooling>)
    params.slot_bias = random_bias(rng, static_cast<std::size_t>(config.kv_heads * g.window *
                                                                 (std::is_same_v<pooling, vector_gated_pool> ? config.channels : 1)),
                                   logit_magnitude > 0);
  if constexpr (has_norm_v<Policy>) params.norm_weight = random_norm_weight(rng, static_cast<std::size_t>(config.channels));
  if constexpr (std::is_same_v<pooling, fixed_weight_pool>) params.slot_profile = random_profile(rng, g.window);
  const stream_compressor<Policy> compressor(g, config, params, std::move(pool));
  const std::int64_t ppt = compressor.payload_floats_per_token(), lpt = compressor.logit_floats_per_token();
  const std::int64_t tokens = 5 * g.window + 3;
  logit_options lo;
  lo.magnitude = logit_magnitude;
  const stream_inputs in = random_stream_inputs(rng, tokens, ppt, lpt, lo);

  std::ostringstream what;
  what << "S=" << g.stride << " W=" << g.window << " origin=" << g.origin << " C=" << config.channels
       << " H=" << config.kv_heads << " seed=" << seed << " logits=" << logit_magnitude;
  INFO(what.str());

  append_options options;
  options.slot_weights = true;

  std::vector<stream_state> reference_states;  // token by token: the state after t tokens
  recorded reference;
  for (int kind : {1, 0, 2, 2, 2, 3}) {
    const auto sizes = chunking(kind, tokens, g.stride, g.window, rng);
    stream_state state = compressor.make_state();
    if (kind == 1) reference_states.push_back(state);
    recorded rec;
    std::int64_t offset = 0, mismatched_states = 0, mismatched_counts = 0;
    for (std::int64_t n : sizes) {
      token_chunk chunk;
      chunk.tokens = n;
      chunk.payload = span<const float>(in.payload.data() + offset * ppt, static_cast<std::size_t>(n * ppt));
      if (lpt > 0) chunk.logits = span<const float>(in.logits.data() + offset * lpt, static_cast<std::size_t>(n * lpt));
      const std::int64_t predicted = compressor.entries_after(state, n);
      std::int64_t calls = 0;
      const std::int64_t emitted = compressor.append(state, chunk, [&](const entry_view& e) {
        ++calls;
        rec.index.push_back(e.index);
        rec.anchor.push_back(e.anchor);
        rec.values.insert(rec.values.end(), e.values, e.values + e.kv_heads * e.channels);
        rec.weights.insert(rec.weights.end(), e.slot_weights, e.slot_weights + e.kv_heads * e.window);
      }, options);
      if (emitted != predicted || calls != predicted) ++mismatched_counts;
      offset += n;
      if (kind == 1) reference_states.push_back(state);
      else if (!(state == reference_states[static_cast<std::size_t>(offset)])) ++mismatched_states;
    }
    const std::string kind_name = "chunking kind " + std::to_string(kind) + ": ";
    expect(mismatched_counts == 0, kind_name + "mismatched_counts == 0");
    expect(mismatched_states == 0, kind_name + "mismatched_states == 0");
    expect(state.tokens() == tokens, kind_name + "state.tokens() == tokens");
    expect(state.entries() == static_cast<std::int64_t>(rec.index.size()), kind_name + "state.entries() == static_cast<std::int64_t>(rec.index.size())");
    if (kind == 1) {
      reference = rec;
      REQUIRE(reference.index.size() >= 4);
      for (std::size_t k = 0; k < reference.index.size(); ++k) expect(reference.index[k] == static_cast<std::int64_t>(k), "entry indices in order");
    } else {
      expect(bit_identical(rec, reference), kind_name + "bit_identical(rec, reference)");
    }
  }

  // A copied state is a fork: continuing both gives the same entries.
  stream_state a = reference_states[static_cast<std::size_t>(2 * g.window + 1)];
  stream_state b = a;
  entry_buffer ea, eb;
  token_chunk rest;
  const std::int64_t from = 2 * g.window + 1;
  rest.tokens = tokens - from;
  rest.payload = span<const float>(in.payload.data() + from * ppt, static_cast<std::size_t>(rest.tokens * ppt));
  if (lpt > 0) rest.logits = span<const float>(in.logits.data() + from * lpt, static_cast<std::size_t>(rest.tokens * lpt));
  compressor.append(a, rest, ea);
  compressor.append(b, rest, eb);
  expect(a == b, "forked states continue equal");
  expect(ea.all_values() == eb.all_values(), "forked states continue with the same entries");

  // == is not vacuous: the same token count with one changed payload value compares unequal.
  std::vector<float> changed(in.payload.begin(), in.payload.begin() + from * ppt);
  changed[static_cast<std::size_t>((from - 1) * ppt)] += 1.0f;
  token_chunk prefix;
  prefix.tokens = from;
  prefix.payload = changed;
  if (lpt > 0) prefix.logits = span<const float>(in.logits.data(), static_cast<std::size_t>(from * lpt));
  stream_state c = compressor.make_state();
  compressor.append(c, prefix, [](const entry_view&) {});
  expect(c.tokens() == from, "c.tokens() == from");
  expect(!(c == reference_states[static_cast<std::size_t>(from)]), "a changed input compares unequal");
  return failures;
}

const geometry streaming_geometries[] = {
    geometry{1, 1, 0, anchor_mode::block_start}, geometry{4, 8, 0, anchor_mode::block_start},
    geometry{3, 7, 1, anchor_mode::window_centre}, geometry{4, 6, 3, anchor_mode::block_end},
    geometry{5, 5, 0, anchor_mode::block_start},   geometry{1, 4, 0, anchor_mode::block_end},
};

}  // namespace

TEMPLATE_TEST_CASE("streaming: any chunking gives bit-identical entries and equal states", "[compress][streaming]",
                   (compressor_policy<mean_pool, no_rope, no_norm>),
                   (compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>),
                   (compressor_policy<vector_gated_pool, rope_before_pool, no_norm>),
                   (compressor_policy<scalar_gated_pool, rope_after_pool, rms_norm>),
                   (compressor_policy<fixed_weight_pool, rope_before_pool, rms_norm>)) {
  std::uint32_t seed = 100;
  for (const geometry& g : streaming_geometries) {
    CHECK(streaming_failures<TestType>(g, make_config(5, 1, input_layout::per_branch, 4), seed++) == "");
    CHECK(streaming_failures<TestType>(g, make_config(37, 3, input_layout::per_slot, 6), seed++) == "");
    if constexpr (is_gated_v<typename TestType::pooling>)
      CHECK(streaming_failures<TestType>(g, make_config(16, 2, input_layout::per_branch, 8), seed++, 1e4) == "");
  }
  CHECK(streaming_failures<TestType>(geometry{4, 8, 0, anchor_mode::block_start},
                                     make_config(512, 1, input_layout::per_branch, 64), seed++) == "");
}

TEST_CASE("streaming: an empty chunk changes nothing and emits nothing", "[compress][streaming]") {
  using policy = compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>;
  const stream_compressor<policy> compressor(geometry{4, 8, 0, anchor_mode::block_start},
                                             make_config(8, 2, input_layout::per_branch, 4));
  std::mt19937 rng(3);
  const stream_inputs in =
      random_stream_inputs(rng, 6, compressor.payload_floats_per_token(), compressor.logit_floats_per_token());
  stream_state state = compressor.make_state();
  token_chunk six;
  six.tokens = 6;
  six.payload = in.payload;
  six.logits = in.logits;
  CHECK(compressor.entries_after(state, 6) == 1);
  CHECK(compressor.append(state, six, entry_buffer{}) == 1);
  const stream_state before = state;
  entry_buffer sink;
  CHECK(compressor.entries_after(state, 0) == 0);
  CHECK(compressor.append(state, token_chunk{}, sink) == 0);
  CHECK(sink.size() == 0);
  CHECK(state == before);
  CHECK(compressor.entries_after(state, 1) == 0);
  CHECK(compressor.entries_after(state, 2) == 1);
  CHECK(compressor.entries_after(state, 10) == 3);
}

// A chunk of 16 MiB or more takes the prefetching path of the gated kernels
// (kernels::prefetch_min_bytes); its entries must equal those of small appends bit for bit.
TEST_CASE("streaming: a prefill large enough to prefetch equals token-by-token appends", "[compress][streaming]") {
  using preset = stream_compressor<presets::deepseek_v4_csa_policy>;
  stream_params params;
  std::mt19937 rng(11);
  params.slot_bias = phasekv_test::random_bias(rng, 8 * 512);
  params.norm_weight = phasekv_test::random_norm_weight(rng, 512);
  const preset compressor(presets::deepseek_v4_csa_layer.geom,
                          presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer), params);
  const std::int64_t tokens = 2304;  // 8 KiB of payload and logits a token: 18 MiB in one chunk
  const std::int64_t ppt = compressor.payload_floats_per_token(), lpt = compressor.logit_floats_per_token();
  REQUIRE(tokens * (ppt + lpt) * static_cast<std::int64_t>(sizeof(float)) >= kernels::prefetch_min_bytes);
  const stream_inputs in = random_stream_inputs(rng, tokens, ppt, lpt);
  auto run = [&](std::int64_t chunk) {
    std::vector<float> entries;
    stream_state s = compressor.make_state();
    for (std::int64_t t = 0; t < tokens; t += chunk) {
      const std::int64_t n = std::min(chunk, tokens - t);
      const token_chunk c{n, span<const float>(in.payload.data() + t * ppt, static_cast<std::size_t>(n * ppt)),
                          span<const float>(in.logits.data() + t * lpt, static_cast<std::size_t>(n * lpt))};
      compressor.append(s, c, [&](const entry_view& e) {
        entries.insert(entries.end(), e.values, e.values + compressor.floats_per_entry());
      });
    }
    return entries;
  };
  const std::vector<float> prefill = run(tokens), decoded = run(1);
  REQUIRE(prefill.size() == static_cast<std::size_t>((tokens / 4) * compressor.floats_per_entry()));
  CHECK(std::memcmp(prefill.data(), decoded.data(), prefill.size() * sizeof(float)) == 0);
}

namespace {

// A pooling of the host's with a planted streaming bug: each entry adds a quarter of the previous
// one (reset at entry 0), carried in the policy object instead of the sequence's state — so a
// sequence continued from a fork (or two sequences interleaved) sees another's.
struct carried_max_pool {
  static constexpr const char* name = "carried_max";
  static constexpr std::uint32_t version = 1;
  static constexpr std::int64_t gate_channels(std::int64_t) { return 0; }
  void pool(const window_rows& w, float* out) const {
    phasekv_examples::max_pool{}.pool(w, out);
    carry.resize(static_cast<std::size_t>(w.channels), 0.0f);
    if (w.entry == 0) std::fill(carry.begin(), carry.end(), 0.0f);
    for (std::int64_t c = 0; c < w.channels; ++c)
      out[c] = carry[static_cast<std::size_t>(c)] = out[c] + 0.25f * carry[static_cast<std::size_t>(c)];
  }
  mutable std::vector<float> carry;
};

// NSA's MLP with random weights for a geometry and channel count.
phasekv_examples::nsa_mlp_pool random_mlp(std::int64_t window, std::int64_t channels, std::int64_t hidden, std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto draw = [&](std::int64_t n, float scale) { return random_uniform(rng, static_cast<std::size_t>(n), -scale, scale); };
  return phasekv_examples::nsa_mlp_pool(window, channels, hidden, draw(window * channels, 0.5f),
                                        draw(hidden * window * channels, 0.3f), draw(hidden, 0.1f),
                                        draw(channels * hidden, 0.3f), draw(channels, 0.1f));
}

}  // namespace

TEST_CASE("streaming: pooling policies of the host's keep the invariant (max, NSA's MLP)", "[compress][streaming][custom_pool]") {
  std::uint32_t seed = 500;
  for (const geometry& g : streaming_geometries) {
    using max_policy = compressor_policy<phasekv_examples::max_pool, no_rope, no_norm>;
    using max_rope = compressor_policy<phasekv_examples::max_pool, rope_after_pool, rms_norm>;
    using mlp_policy = compressor_policy<phasekv_examples::nsa_mlp_pool, no_rope, rms_norm>;
    CHECK(streaming_failures<max_policy>(g, make_config(5, 1, input_layout::per_branch, 4), seed++) == "");
    CHECK(streaming_failures<max_rope>(g, make_config(37, 3, input_layout::per_slot, 6), seed++) == "");
    CHECK(streaming_failures<mlp_policy>(g, make_config(6, 2, input_layout::per_branch, 4), seed, 0,
                                         random_mlp(g.window, 6, 5, seed)) == "");
    ++seed;
  }
}

TEST_CASE("streaming: a planted bug in a host policy's streaming state is caught", "[compress][streaming][custom_pool]") {
  using bug = compressor_policy<carried_max_pool, no_rope, no_norm>;
  const std::string failures = streaming_failures<bug>(geometry{4, 8, 0, anchor_mode::block_start},
                                                       make_config(5, 1, input_layout::per_branch, 4), 900);
  INFO(failures);
  CHECK_THAT(failures, Catch::Matchers::Contains("forked states continue with the same entries"));
}

}  // namespace test_compress_streaming
