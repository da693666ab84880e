// Every compressor policy against its scalar twin (tests/oracle/scalar_compressor.hpp), over a
// grid of geometries (W = S, W = 2S, S ∤ W, S = 1, staggered origins, every anchor), input
// layouts, head counts, channel counts on and off the SIMD width, padded first entries, and
// random inputs including logits large enough to overflow a softmax without max subtraction.
//
// Tolerance (see oracle_tolerance): per head, |kernel − oracle| ≤ 1e-5·(|oracle| + scale), with
// scale = max(largest |oracle| of the head, largest Σ α|x| of the head after RMSNorm scaling);
// slot weights within 1e-5 absolute. The kernel runs in fp32 and the oracle in double; fp32
// rounding of a W-term weighted sum, a softmax, an RMSNorm and a rotation is a few ulp of the
// terms' size (observed worst: between 1e-7 and 3e-7 of the bound's scale, i.e. 30× margin),
// while a wrong weight, slot, view, position, pairing or eps shows up at 1e-4 or more. The floor
// follows the terms, not the result, because a channel whose terms cancel to ~0 carries the
// absolute error of the terms.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/random_inputs.hpp"
#include "oracle/scalar_compressor.hpp"
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/stream_compressor.hpp"

namespace test_compress_policies {

namespace {

using namespace phasekv;
using namespace phasekv_test;

struct stream_shape {
  std::int64_t channels;
  std::int64_t heads;
  input_layout inputs;
  std::int64_t rope_channels;
  rope_layout layout;
  bool yarn;
};

struct run_options {
  logit_options logits;        // ordinary or large
  bool slot_weights = true;    // ask for (and compare) per-slot weights
  bool learned = true;         // non-empty bias / norm weight (else the documented defaults)
  std::uint32_t seed = 1;
};

const std::vector<geometry>& test_geometries() {
  static const std::vector<geometry> g = {
      geometry{1, 1, 0, anchor_mode::block_start},    // S = W = 1
      geometry{4, 4, 0, anchor_mode::block_end},      // W = S
      geometry{4, 8, 0, anchor_mode::block_start},    // W = 2S (DeepSeek-V4)
      geometry{3, 7, 0, anchor_mode::window_centre},  // S does not divide W
      geometry{4, 6, 1, anchor_mode::block_start},    // S ∤ W, staggered origin
      geometry{1, 3, 0, anchor_mode::window_centre},  // S = 1, W > S
      geometry{2, 5, 1, anchor_mode::block_end},      // odd window, origin 1
      geometry{4, 8, 3, anchor_mode::window_centre},  // W = 2S, origin 3 (centre < 0 at j = 0)
      geometry{5, 5, 2, anchor_mode::block_start},    // W = S, origin 2 (anchor < 0 at j = 0)
  };
  return g;
}

const std::vector<stream_shape>& test_shapes() {
  static const std::vector<stream_shape> s = {
      {5, 1, input_layout::per_branch, 4, rope_layout::interleaved, false},
      {37, 3, input_layout::per_slot, 6, rope_layout::half_split, false},
      {64, 1, input_layout::per_slot, 32, rope_layout::interleaved, true},
      {16, 3, input_layout::per_branch, 16, rope_layout::half_split, true},
      {1, 2, input_layout::per_slot, 0, rope_layout::interleaved, false},  // RoPE policies skip it
  };
  return s;
}

stream_config make_config(const stream_shape& shape) {
  stream_config c;
  c.name = "test";
  c.channels = shape.channels;
  c.kv_heads = shape.heads;
  c.inputs = shape.inputs;
  c.rope.channels = shape.rope_channels;
  c.rope.base = 10000.0;
  c.rope.layout = shape.layout;
  if (shape.yarn) {
    c.rope.yarn.enabled = true;
    c.rope.yarn.factor = 8.0;
    c.rope.yarn.original_context = 64;  // small, so the ramp falls inside the few pairs
  }
  c.norm_eps = 1e-6;
  return c;
}

std::string describe(const geometry& g, const stream_config& c, const run_options& o, std::int64_t tokens) {
  std::ostringstream s;
  s << "S=" << g.stride << " W=" << g.window << " origin=" << g.origin << " anchor=" << to_string(g.anchor)
    << " C=" << c.channels << " H=" << c.kv_heads
    << (c.inputs == input_layout::per_branch ? " per_branch" : " per_slot") << " R=" << c.rope.channels << ' '
    << to_string(c.rope.layout) << " yarn=" << c.rope.yarn.enabled << " logit_magnitude=" << o.logits.magnitude
    << " signs=" << static_cast<int>(o.logits.signs) << " weights=" << o.slot_weights << " learned=" << o.learned
    << " seed=" << o.seed << " tokens=" << tokens;
  return s.str();
}

template <class Policy>
stream_params random_params(std::mt19937& rng, const geometry& g, const stream_config& c, const run_options& o) {
  using pooling = typename Policy::pooling;
  stream_params p;
  if constexpr (is_gated_v<pooling>) {
    if (o.learned) {
      const std::int64_t gates = oracle_gate_channels<Policy>(c);
      p.slot_bias = random_bias(rng, static_cast<std::size_t>(c.kv_heads * g.window * gates), o.logits.magnitude > 0);
    }
  }
  if constexpr (has_norm_v<Policy>)
    if (o.learned) p.norm_weight = random_norm_weight(rng, static_cast<std::size_t>(c.channels));
  if constexpr (std::is_same_v<pooling, fixed_weight_pool>) p.slot_profile = random_profile(rng, g.window);
  return p;
}

token_chunk chunk_of(const stream_inputs& in, std::int64_t first, std::int64_t count, std::int64_t payload_per_token,
                     std::int64_t logits_per_token) {
  token_chunk chunk;
  chunk.tokens = count;
  chunk.payload = span<const float>(in.payload.data() + first * payload_per_token,
                                    static_cast<std::size_t>(count * payload_per_token));
  if (logits_per_token > 0)
    chunk.logits = span<const float>(in.logits.data() + first * logits_per_token,
                                     static_cast<std::size_t>(count * logits_per_token));
  return chunk;
}

// Runs one configuration through the compressor (in three chunks) and the oracle, and compares.
template <class Policy>
void check_against_oracle(const geometry& g, const stream_config& config, const run_options& o,
                          const stream_params* fixed_params = nullptr) {
  std::mt19937 rng(o.seed);
  const stream_params params = fixed_params ? *fixed_params : random_params<Policy>(rng, g, config, o);
  const stream_compressor<Policy> compressor(g, config, params);

  // The compressor's idea of the input layout is the oracle's.
  REQUIRE(compressor.views() == oracle_views(g, config));
  REQUIRE(compressor.gate_channels() == oracle_gate_channels<Policy>(config));
  REQUIRE(compressor.payload_floats_per_token() == oracle_payload_floats<Policy>(g, config));
  REQUIRE(compressor.logit_floats_per_token() == oracle_logit_floats<Policy>(g, config));

  // Enough tokens for the padded first entries, several full ones, and an unfinished block.
  const std::int64_t tokens = 3 * g.window + 2 * g.stride + static_cast<std::int64_t>(o.seed % 3);
  const std::int64_t ppt = compressor.payload_floats_per_token(), lpt = compressor.logit_floats_per_token();
  const stream_inputs in = random_stream_inputs(rng, tokens, ppt, lpt, o.logits);

  INFO(describe(g, config, o, tokens));
  stream_state state = compressor.make_state();
  entry_buffer got;
  std::size_t without_weights = 0, wrong_shape = 0;
  auto sink = [&](const entry_view& e) {
    if (e.slot_weights == nullptr) ++without_weights;
    if (e.kv_heads != config.kv_heads || e.channels != config.channels || e.window != g.window) ++wrong_shape;
    got(e);
  };
  append_options options;
  options.slot_weights = o.slot_weights;
  options.check_finite = true;
  const std::int64_t cut1 = 1, cut2 = tokens / 2;
  std::int64_t emitted = 0;
  emitted += compressor.append(state, chunk_of(in, 0, cut1, ppt, lpt), sink, options);
  emitted += compressor.append(state, chunk_of(in, cut1, cut2 - cut1, ppt, lpt), sink, options);
  emitted += compressor.append(state, chunk_of(in, cut2, tokens - cut2, ppt, lpt), sink, options);

  const auto expected = oracle_compress<Policy>(g, config, params, in.payload, in.logits, tokens);
  REQUIRE(expected.size() >= 3);
  CHECK(emitted == static_cast<std::int64_t>(expected.size()));
  CHECK(state.tokens() == tokens);
  CHECK(state.entries() == static_cast<std::int64_t>(expected.size()));
  CHECK(without_weights == (o.slot_weights ? 0 : got.size()));
  CHECK(wrong_shape == 0);
  std::size_t not_finite = 0;
  for (float v : got.all_values()) not_finite += std::isfinite(v) ? 0 : 1;
  CHECK(not_finite == 0);
  const std::string mismatch =
      oracle_mismatch_all(expected, got, config.kv_heads, config.channels, g.window, o.slot_weights);
  CHECK(mismatch == "");
}

// The standard sweep for one policy: every geometry with two shapes (ordinary logits, with and
// without slot weights, learned and default parameters), plus large-logit runs for gates.
template <class Policy>
void sweep(std::uint32_t salt) {
  const auto& geometries = test_geometries();
  const auto& shapes = test_shapes();
  std::vector<stream_shape> usable;
  for (const auto& s : shapes)
    if (!has_rope_v<Policy> || s.rope_channels >= 2) usable.push_back(s);
  for (std::size_t gi = 0; gi < geometries.size(); ++gi) {
    const geometry& g = geometries[gi];
    for (std::size_t k = 0; k < 2; ++k) {
      run_options o;
      o.seed = salt * 1000 + static_cast<std::uint32_t>(gi * 10 + k);
      o.slot_weights = k == 0;
      o.learned = (gi + k) % 3 != 2;
      check_against_oracle<Policy>(g, make_config(usable[(gi + k + salt) % usable.size()]), o);
    }
    if constexpr (is_gated_v<typename Policy::pooling>) {
      const logit_options large[] = {{80.0, 3.0f, logit_signs::positive},
                                     {1e4, 3.0f, logit_signs::mixed},
                                     {1e4, 3.0f, logit_signs::negative}};
      for (std::size_t k = 0; k < 3; ++k) {
        run_options o;
        o.seed = salt * 1000 + 500 + static_cast<std::uint32_t>(gi * 10 + k);
        o.logits = large[k];
        o.slot_weights = k != 1;
        check_against_oracle<Policy>(g, make_config(usable[(gi + k + 2 + salt) % usable.size()]), o);
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("compressor matches the oracle: mean pool", "[compress][policies]",
                   (compressor_policy<mean_pool, no_rope, no_norm>),
                   (compressor_policy<mean_pool, rope_after_pool, rms_norm>),
                   (compressor_policy<mean_pool, rope_before_pool, no_norm>),
                   (compressor_policy<mean_pool, rope_before_pool, rms_norm>)) {
  sweep<TestType>(1);
}

TEMPLATE_TEST_CASE("compressor matches the oracle: vector gates", "[compress][policies]",
                   (compressor_policy<vector_gated_pool, no_rope, no_norm>),
                   (compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>),
                   (compressor_policy<vector_gated_pool, rope_after_pool, no_norm>),
                   (compressor_policy<vector_gated_pool, rope_before_pool, no_norm>),
                   (compressor_policy<vector_gated_pool, rope_before_pool, rms_norm>)) {
  sweep<TestType>(2);
}

TEMPLATE_TEST_CASE("compressor matches the oracle: scalar gates", "[compress][policies]",
                   (compressor_policy<scalar_gated_pool, no_rope, no_norm>),
                   (compressor_policy<scalar_gated_pool, no_rope, rms_norm>),
                   (compressor_policy<scalar_gated_pool, rope_after_pool, no_norm>),
                   (compressor_policy<scalar_gated_pool, rope_before_pool, rms_norm>)) {
  sweep<TestType>(3);
}

TEMPLATE_TEST_CASE("compressor matches the oracle: fixed weights", "[compress][policies]",
                   (compressor_policy<fixed_weight_pool, no_rope, no_norm>),
                   (compressor_policy<fixed_weight_pool, rope_after_pool, rms_norm>),
                   (compressor_policy<fixed_weight_pool, rope_before_pool, no_norm>)) {
  sweep<TestType>(4);
}

TEMPLATE_TEST_CASE("compressor matches the oracle: 512 channels", "[compress][policies]",
                   (compressor_policy<mean_pool, rope_after_pool, rms_norm>),
                   (compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>),
                   (compressor_policy<vector_gated_pool, rope_before_pool, no_norm>),
                   (compressor_policy<scalar_gated_pool, rope_before_pool, no_norm>),
                   (compressor_policy<fixed_weight_pool, no_rope, rms_norm>)) {
  const stream_shape wide[] = {{512, 1, input_layout::per_slot, 64, rope_layout::interleaved, true},
                               {512, 2, input_layout::per_branch, 64, rope_layout::half_split, false}};
  const geometry geoms[] = {geometry{4, 8, 0, anchor_mode::block_start},
                            geometry{3, 7, 2, anchor_mode::window_centre}};
  for (int k = 0; k < 2; ++k) {
    run_options o;
    o.seed = 9000 + static_cast<std::uint32_t>(k);
    o.slot_weights = k == 0;
    check_against_oracle<TestType>(geoms[k], make_config(wide[k]), o);
    if constexpr (is_gated_v<typename TestType::pooling>) {
      o.logits = {1e4, 3.0f, logit_signs::mixed};
      o.seed += 10;
      check_against_oracle<TestType>(geoms[1 - k], make_config(wide[k]), o);
    }
  }
}

TEST_CASE("fixed weights whose real slots sum to 0 give a zero entry and zero weights", "[compress][policies]") {
  // One-hot on slot 0: padding in entry 0 (and entry 1 of W = 3S), so those entries are all
  // zero; RMSNorm of zero stays zero and RoPE of zero stays zero.
  const geometry g = geometry{2, 6, 0, anchor_mode::block_start};
  const stream_config config = make_config({7, 2, input_layout::per_branch, 4, rope_layout::interleaved, false});
  stream_params params;
  params.slot_profile = {1, 0, 0, 0, 0, 0};
  run_options o;
  check_against_oracle<compressor_policy<fixed_weight_pool, no_rope, no_norm>>(g, config, o, &params);
  check_against_oracle<compressor_policy<fixed_weight_pool, rope_after_pool, rms_norm>>(g, config, o, &params);
  params.slot_profile = {0, 0, 0, 0, 2, 0};  // picks slot 4 everywhere: view branch_of_slot(4) = 0
  check_against_oracle<compressor_policy<fixed_weight_pool, rope_before_pool, rms_norm>>(g, config, o, &params);
}

TEST_CASE("slot weights are null unless requested, and padding slots weigh 0", "[compress][policies]") {
  using policy = compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>;
  const geometry g = geometry{4, 8, 0, anchor_mode::block_start};
  stream_config config = make_config({5, 3, input_layout::per_branch, 4, rope_layout::interleaved, false});
  const stream_compressor<policy> compressor(g, config);
  std::mt19937 rng(5);
  const stream_inputs in = random_stream_inputs(rng, 4, compressor.payload_floats_per_token(),
                                                compressor.logit_floats_per_token());
  token_chunk chunk;
  chunk.tokens = 4;
  chunk.payload = in.payload;
  chunk.logits = in.logits;
  for (bool want : {false, true}) {
    stream_state state = compressor.make_state();
    int calls = 0;
    append_options options;
    options.slot_weights = want;
    compressor.append(state, chunk, [&](const entry_view& e) {
      ++calls;
      if (!want) {
        CHECK(e.slot_weights == nullptr);
        return;
      }
      REQUIRE(e.slot_weights != nullptr);
      for (int h = 0; h < 3; ++h) {
        double sum = 0;
        for (int i = 0; i < 8; ++i) {
          if (i < 4) CHECK(e.slot_weights[h * 8 + i] == 0.0f);  // entry 0: slots 0–3 are padding
          sum += e.slot_weights[h * 8 + i];
        }
        CHECK(sum == Approx(1.0).epsilon(1e-5));
      }
    }, options);
    CHECK(calls == 1);
  }
}

TEMPLATE_TEST_CASE("compressor matches the oracle: long windows", "[compress][policies]",
                   (compressor_policy<mean_pool, rope_after_pool, no_norm>),
                   (compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>),
                   (compressor_policy<scalar_gated_pool, rope_before_pool, no_norm>),
                   (compressor_policy<fixed_weight_pool, no_rope, rms_norm>)) {
  // DeepSeek-V4 HCA (S = W = 128), NSA's compressed branch (S = 16, W = 32), and W = 8S: more
  // slots than any SIMD register has lanes.
  const geometry geoms[] = {geometry{128, 128, 0, anchor_mode::block_start},
                            geometry{16, 32, 5, anchor_mode::window_centre},
                            geometry{8, 64, 0, anchor_mode::block_end}};
  const stream_shape shapes[] = {{37, 1, input_layout::per_branch, 6, rope_layout::interleaved, false},
                                 {20, 2, input_layout::per_slot, 8, rope_layout::half_split, true},
                                 {33, 1, input_layout::per_branch, 10, rope_layout::interleaved, true}};
  for (int k = 0; k < 3; ++k) {
    run_options o;
    o.seed = 7000 + static_cast<std::uint32_t>(k);
    o.slot_weights = k != 1;
    if (is_gated_v<typename TestType::pooling> && k == 2) o.logits = {80.0, 3.0f, logit_signs::mixed};
    check_against_oracle<TestType>(geoms[k], make_config(shapes[k]), o);
  }
}

}  // namespace test_compress_policies
