// Checks the compressor's scalar twin (tests/oracle/scalar_compressor.hpp) on cases small
// enough to work out by hand, so the oracle the kernel is held to is itself held to the maths of
// docs/DESIGN.md §2–§3.

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/random_inputs.hpp"
#include "oracle/scalar_compressor.hpp"

namespace test_compress_oracle {

namespace {

using namespace phasekv;
using phasekv_test::oracle_compress;
using phasekv_test::oracle_entry;

using mean_plain = compressor_policy<mean_pool>;
using fixed_plain = compressor_policy<fixed_weight_pool>;
using vector_plain = compressor_policy<vector_gated_pool>;
using scalar_plain = compressor_policy<scalar_gated_pool>;

stream_config make_config(std::int64_t channels, std::int64_t heads = 1,
                          input_layout inputs = input_layout::per_branch) {
  stream_config c;
  c.name = "oracle";
  c.channels = channels;
  c.kv_heads = heads;
  c.inputs = inputs;
  return c;
}

constexpr double tight = 1e-12;

}  // namespace

TEST_CASE("oracle: S=W=1 mean pool returns each token", "[compress][oracle]") {
  const auto geom = geometry{1, 1};
  const auto config = make_config(3);
  const std::vector<float> payload = {1, 2, 3, -4, 5.5f, 6, 0.25f, 8, 9};
  const auto entries = oracle_compress<mean_plain>(geom, config, {}, payload, {}, 3);
  REQUIRE(entries.size() == 3);
  for (std::int64_t j = 0; j < 3; ++j) {
    CHECK(entries[j].index == j);
    CHECK(entries[j].anchor == j);
    for (int c = 0; c < 3; ++c) CHECK(entries[j].values[c] == payload[j * 3 + c]);
    CHECK(entries[j].slot_weights == std::vector<double>{1.0});
  }
}

TEST_CASE("oracle: W=2, S=1 mean pools two tokens, entry 0 only one", "[compress][oracle]") {
  const auto geom = geometry{1, 2};
  // per_branch: two views; slot 0 (previous token) reads view 1, slot 1 (own token) reads view 0.
  const auto config = make_config(1);
  // token t: view 0 = 10t + 1, view 1 = 10t + 2
  const std::vector<float> payload = {1, 2, 11, 12, 21, 22};
  const auto entries = oracle_compress<mean_plain>(geom, config, {}, payload, {}, 3);
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].values[0] == 1.0);                   // token 0 alone
  CHECK(entries[0].slot_weights == std::vector<double>{0.0, 1.0});
  CHECK(entries[1].values[0] == (2.0 + 11.0) / 2.0);    // token 0 via view 1, token 1 via view 0
  CHECK(entries[2].values[0] == (12.0 + 21.0) / 2.0);
  CHECK(entries[2].slot_weights == std::vector<double>{0.5, 0.5});
  CHECK(entries[2].term_scale == std::vector<double>{(12.0 + 21.0) / 2.0});

  SECTION("per_slot: slot i reads view i") {
    const auto per_slot = make_config(1, 1, input_layout::per_slot);
    const auto e = oracle_compress<mean_plain>(geom, per_slot, {}, payload, {}, 3);
    CHECK(e[0].values[0] == 2.0);                       // token 0 in slot 1 → view 1
    CHECK(e[1].values[0] == (1.0 + 12.0) / 2.0);        // token 0 slot 0 view 0; token 1 slot 1 view 1
    CHECK(e[2].values[0] == (11.0 + 22.0) / 2.0);
  }
}

TEST_CASE("oracle: entry 0 of W=8, S=4 pools only tokens 0-3", "[compress][oracle]") {
  const auto geom = geometry{4, 8};
  const auto config = make_config(2, 1);
  // Two views per token (branches); view 0 of token t = (t, −t), view 1 = (100 + t, 0).
  std::vector<float> payload;
  for (int t = 0; t < 12; ++t) payload.insert(payload.end(), {float(t), float(-t), float(100 + t), 0.0f});
  const auto entries = oracle_compress<mean_plain>(geom, config, {}, payload, {}, 12);
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].values == std::vector<double>{1.5, -1.5});
  CHECK(entries[0].slot_weights == std::vector<double>{0, 0, 0, 0, 0.25, 0.25, 0.25, 0.25});
  // Entry 1: tokens 0–3 in branch 1 (view 1), tokens 4–7 in branch 0 (view 0).
  CHECK(entries[1].values[0] == Approx((100 + 101 + 102 + 103 + 4 + 5 + 6 + 7) / 8.0).epsilon(tight));
  CHECK(entries[1].values[1] == Approx(-(4 + 5 + 6 + 7) / 8.0).epsilon(tight));
  CHECK(entries[1].anchor == 4);
  CHECK(entries[2].anchor == 8);
  // 11 tokens complete only two entries (entry 2 needs token 11).
  CHECK(oracle_compress<mean_plain>(geom, config, {}, payload, {}, 11).size() == 2);
}

TEST_CASE("oracle: S=3, W=7 per branch: branch 2 holds one slot", "[compress][oracle]") {
  // b(i) = floor((6 − i)/3): slot 0 → 2, slots 1–3 → 1, slots 4–6 → 0. View v of token t = 10t + v.
  const auto geom = geometry{3, 7};
  const auto config = make_config(1);
  std::vector<float> payload;
  for (int t = 0; t < 9; ++t)
    for (int v = 0; v < 3; ++v) payload.push_back(float(10 * t + v));
  stream_params params;
  const double expected_by_slot[7] = {/* entry 2, tokens 2..8 */ 22, 31, 41, 51, 60, 70, 80};
  for (int slot = 0; slot < 7; ++slot) {
    params.slot_profile.assign(7, 0.0f);
    params.slot_profile[slot] = 1.0f;
    const auto e = oracle_compress<fixed_plain>(geom, config, params, payload, {}, 9);
    REQUIRE(e.size() == 3);
    CHECK(e[2].values[0] == expected_by_slot[slot]);
  }
}

TEST_CASE("oracle: a one-hot fixed profile selects one token", "[compress][oracle]") {
  const auto geom = geometry{2, 4};
  const auto config = make_config(1, 1, input_layout::per_slot);
  // per_slot: 4 views; view v of token t = 10t + v.
  std::vector<float> payload;
  for (int t = 0; t < 6; ++t)
    for (int v = 0; v < 4; ++v) payload.push_back(float(10 * t + v));
  stream_params params;
  params.slot_profile = {0, 0, 1, 0};
  const auto e = oracle_compress<fixed_plain>(geom, config, params, payload, {}, 6);
  REQUIRE(e.size() == 3);
  // slot 2 of entry j holds token (j+1)·2 − 4 + 2 = 2j.
  for (int j = 0; j < 3; ++j) {
    CHECK(e[j].values[0] == 10.0 * (2 * j) + 2);
    CHECK(e[j].slot_weights == std::vector<double>{0, 0, 1, 0});
  }

  SECTION("a profile whose real slots sum to 0 gives a zero entry and zero weights") {
    params.slot_profile = {1, 0, 0, 0};  // slot 0 is padding in entry 0
    const auto z = oracle_compress<fixed_plain>(geom, config, params, payload, {}, 6);
    CHECK(z[0].values[0] == 0.0);
    CHECK(z[0].slot_weights == std::vector<double>{0, 0, 0, 0});
    CHECK(z[1].values[0] == 0.0);  // slot 0 of entry 1 holds token 0, view 0
    CHECK(z[1].slot_weights == std::vector<double>{1, 0, 0, 0});
  }

  SECTION("profiles are renormalised over the real slots") {
    params.slot_profile = {3, 0, 1, 1};
    const auto r = oracle_compress<fixed_plain>(geom, config, params, payload, {}, 6);
    CHECK(r[0].values[0] == Approx((2.0 + 13.0) / 2.0).epsilon(tight));  // tokens 0 (slot 2), 1 (slot 3)
    CHECK(r[1].values[0] == Approx((3 * 0.0 + 22.0 + 33.0) / 5.0).epsilon(tight));
    CHECK(r[1].slot_weights[0] == Approx(0.6).epsilon(tight));
  }
}

TEST_CASE("oracle: vector and scalar gates are softmaxes over the real slots", "[compress][oracle]") {
  const auto geom = geometry{1, 2};
  const auto config = make_config(2, 1, input_layout::per_slot);
  // payload[t][view][c]: token t, both views = (t+1, −(t+1)) so the view does not matter.
  const std::vector<float> payload = {1, -1, 1, -1, 2, -2, 2, -2};
  SECTION("vector gates: one softmax per channel, bias per slot") {
    // logits[t][view][c]; entry 1: slot 0 = token 0 view 0, slot 1 = token 1 view 1.
    const std::vector<float> logits = {0, 5, 9, 9, 9, 9, float(std::log(3.0)), 5};
    stream_params params;
    params.slot_bias = {0, 0, 0, 1};  // [head][slot][channel]
    const auto e = oracle_compress<vector_plain>(geom, config, params, payload, logits, 2);
    REQUIRE(e.size() == 2);
    CHECK(e[0].values == std::vector<double>{1.0, -1.0});  // single real slot: weight 1
    // channel 0: s = (0, ln 3) → α = (1/4, 3/4); channel 1: s = (5, 5 + 1) → α = (1, e)/(1 + e).
    CHECK(e[1].values[0] == Approx(0.25 * 1 + 0.75 * 2).epsilon(1e-7));
    const double a0 = 1.0 / (1.0 + std::exp(1.0));
    CHECK(e[1].values[1] == Approx(a0 * -1 + (1 - a0) * -2).epsilon(1e-9));
    CHECK(e[1].slot_weights[0] == Approx((0.25 + a0) / 2).epsilon(1e-7));
  }
  SECTION("scalar gates: one softmax shared by all channels") {
    const std::vector<float> logits = {0, 7, 7, float(std::log(3.0))};  // [t][view]
    const auto e = oracle_compress<scalar_plain>(geom, config, {}, payload, logits, 2);
    CHECK(e[1].values[0] == Approx(0.25 * 1 + 0.75 * 2).epsilon(1e-7));
    CHECK(e[1].values[1] == Approx(-(0.25 * 1 + 0.75 * 2)).epsilon(1e-7));
    CHECK(e[1].slot_weights[0] == Approx(0.25).epsilon(1e-7));
    CHECK(e[1].slot_weights[1] == Approx(0.75).epsilon(1e-7));
  }
  SECTION("huge logits stay finite (max-subtracted softmax)") {
    for (float big : {80.0f, 1e4f, -1e4f, 3e38f}) {
      const std::vector<float> logits(8, big);
      const auto e = oracle_compress<vector_plain>(geom, config, {}, payload, logits, 2);
      CHECK(e[1].values[0] == Approx(1.5).epsilon(1e-12));
      CHECK(e[1].slot_weights == std::vector<double>{0.5, 0.5});
    }
  }
}

TEST_CASE("oracle: RoPE rotates the last R channels by position times theta", "[compress][oracle]") {
  using after = compressor_policy<mean_pool, rope_after_pool>;
  using before = compressor_policy<mean_pool, rope_before_pool>;
  auto config = make_config(3);
  config.rope.channels = 2;  // θ_0 = 1: the angle is the position in radians
  const std::vector<float> payload = {7, 1, 0, 7, 0, 1, 7, 1, 1, 7, 2, 0};
  SECTION("after pool, at the block start (S=W=1: entry j at j)") {
    const auto e = oracle_compress<after>(geometry{1, 1}, config, {}, payload, {}, 4);
    for (int j = 0; j < 4; ++j) {
      const double a = payload[3 * j + 1], b = payload[3 * j + 2];
      CHECK(e[j].values[0] == 7.0);  // channel 0 is not rotated
      CHECK(e[j].values[1] == Approx(a * std::cos(j) - b * std::sin(j)).margin(1e-12));
      CHECK(e[j].values[2] == Approx(a * std::sin(j) + b * std::cos(j)).margin(1e-12));
    }
  }
  SECTION("before pool, at each token's own position") {
    const auto e = oracle_compress<before>(geometry{1, 2}, config, {}, std::vector<float>{
        7, 1, 0, 7, 1, 0,   // token 0: views 0, 1
        7, 0, 1, 7, 0, 1},  // token 1
        {}, 2);
    // entry 1: token 0 (angle 0) = (1, 0); token 1 (angle 1) rotates (0, 1) to (−sin 1, cos 1).
    CHECK(e[1].values[1] == Approx((1.0 - std::sin(1.0)) / 2).margin(1e-12));
    CHECK(e[1].values[2] == Approx((0.0 + std::cos(1.0)) / 2).margin(1e-12));
  }
  SECTION("interleaved and half-split pairings, θ_1 = base^(−2/R)") {
    auto four = make_config(4);
    four.rope.channels = 4;
    four.rope.base = 100.0;  // θ = (1, 0.1)
    const std::vector<float> x = {0, 0, 0, 0, 1, 2, 3, 4};  // token 1
    const double p = 1.0;
    four.rope.layout = rope_layout::interleaved;  // pairs (0,1), (2,3)
    auto e = oracle_compress<after>(geometry{1, 1}, four, {}, x, {}, 2);
    CHECK(e[1].values[0] == Approx(1 * std::cos(p) - 2 * std::sin(p)).margin(1e-12));
    CHECK(e[1].values[1] == Approx(1 * std::sin(p) + 2 * std::cos(p)).margin(1e-12));
    CHECK(e[1].values[2] == Approx(3 * std::cos(0.1) - 4 * std::sin(0.1)).margin(1e-12));
    CHECK(e[1].values[3] == Approx(3 * std::sin(0.1) + 4 * std::cos(0.1)).margin(1e-12));
    four.rope.layout = rope_layout::half_split;  // pairs (0,2), (1,3)
    e = oracle_compress<after>(geometry{1, 1}, four, {}, x, {}, 2);
    CHECK(e[1].values[0] == Approx(1 * std::cos(p) - 3 * std::sin(p)).margin(1e-12));
    CHECK(e[1].values[2] == Approx(1 * std::sin(p) + 3 * std::cos(p)).margin(1e-12));
    CHECK(e[1].values[1] == Approx(2 * std::cos(0.1) - 4 * std::sin(0.1)).margin(1e-12));
    CHECK(e[1].values[3] == Approx(2 * std::sin(0.1) + 4 * std::cos(0.1)).margin(1e-12));
  }
}

TEST_CASE("oracle: YaRN frequencies by hand", "[compress][oracle]") {
  rope_config rope;
  rope.channels = 8;
  rope.base = 10000.0;
  const auto plain = phasekv_test::oracle_detail::rope_frequencies(rope);
  REQUIRE(plain.size() == 4);
  for (int k = 0; k < 4; ++k) CHECK(plain[k] == Approx(std::pow(10000.0, -2.0 * k / 8)).epsilon(1e-15));
  // d(r) = 8·ln(L/(2πr))/(2 ln 10000); L = 1 puts both ends below 0: low = 0, high = 0 → 0.001,
  // so pair 0 keeps its frequency and every other pair is divided by the factor.
  rope.yarn.enabled = true;
  rope.yarn.factor = 4.0;
  rope.yarn.original_context = 1;
  auto y = phasekv_test::oracle_detail::rope_frequencies(rope);
  CHECK(y[0] == plain[0]);
  for (int k = 1; k < 4; ++k) CHECK(y[k] == Approx(plain[k] / 4).epsilon(1e-15));
  // R = 16, L = 65536: d(32) = 8·ln(65536/(64π))/ln 10000 = 5.03 → low = 5;
  // d(1) = 8·ln(65536/(2π))/ln 10000 = 8.04 → high = 9; ramp_k = (k − 5)/4.
  rope.channels = 16;
  rope.yarn.original_context = 65536;
  rope.yarn.beta_fast = 32;
  rope.yarn.beta_slow = 1;
  const auto plain16 = [] (int k) { return std::pow(10000.0, -2.0 * k / 16); };
  y = phasekv_test::oracle_detail::rope_frequencies(rope);
  REQUIRE(y.size() == 8);
  for (int k = 0; k <= 5; ++k) CHECK(y[k] == Approx(plain16(k)).epsilon(1e-15));
  CHECK(y[6] == Approx(plain16(6) * (0.25 / 4 + 0.75)).epsilon(1e-14));
  CHECK(y[7] == Approx(plain16(7) * (0.5 / 4 + 0.5)).epsilon(1e-14));
  // And the library's own rope_rotation agrees with the oracle on the DeepSeek-V4 numbers.
  rope.channels = 64;
  rope.base = 160000.0;
  rope.yarn = {true, 16.0, 65536, 32.0, 1.0};
  const auto ours = phasekv_test::oracle_detail::rope_frequencies(rope);
  const rope_rotation lib(rope, 512);
  REQUIRE(lib.inverse_frequencies().size() == ours.size());
  int interpolated = 0;
  for (std::size_t k = 0; k < ours.size(); ++k) {
    CHECK(lib.inverse_frequencies()[k] == Approx(ours[k]).epsilon(1e-14));
    const double unscaled = std::pow(160000.0, -2.0 * double(k) / 64);
    if (ours[k] < unscaled * 0.99) ++interpolated;
  }
  CHECK(interpolated > 0);
  CHECK(interpolated < 32);
}

TEST_CASE("oracle: RMSNorm then RoPE after pooling", "[compress][oracle]") {
  using normed = compressor_policy<mean_pool, no_rope, rms_norm>;
  using both = compressor_policy<mean_pool, rope_after_pool, rms_norm>;
  auto config = make_config(2);
  config.norm_eps = 1e-6;
  const std::vector<float> payload = {3, 4};
  stream_params params;
  params.norm_weight = {2, -1};
  auto e = oracle_compress<normed>(geometry{1, 1}, config, params, payload, {}, 1);
  const double inv = 1.0 / std::sqrt(12.5 + 1e-6);
  CHECK(e[0].values[0] == Approx(3 * inv * 2).epsilon(1e-14));
  CHECK(e[0].values[1] == Approx(4 * inv * -1).epsilon(1e-14));
  CHECK(e[0].term_scale[0] == Approx(3 * inv * 2).epsilon(1e-14));  // max_c |x_c|·|w_c|/rms
  // Norm first, then rotate: at position 1 with θ = 1 the normalised (6, −4)·inv turns by 1 rad.
  config.rope.channels = 2;
  const std::vector<float> two = {0, 0, 3, 4};
  e = oracle_compress<both>(geometry{1, 1}, config, params, two, {}, 2);
  const double a = 6 * inv, b = -4 * inv;
  CHECK(e[1].values[0] == Approx(a * std::cos(1.0) - b * std::sin(1.0)).epsilon(1e-13));
  CHECK(e[1].values[1] == Approx(a * std::sin(1.0) + b * std::cos(1.0)).epsilon(1e-13));
}

TEST_CASE("oracle: origin staggering and anchors", "[compress][oracle]") {
  const auto config = make_config(1);
  // Token t's payload is t in every one of `views` views.
  const auto ramp = [](int views) {
    std::vector<float> out;
    for (int t = 0; t < 12; ++t)
      for (int v = 0; v < views; ++v) out.push_back(float(t));
    return out;
  };
  const std::vector<float> payload = ramp(1);
  SECTION("S=W=4, origin 1: entry 0 is token 0 alone, entry 1 tokens 1-4") {
    const auto e = oracle_compress<mean_plain>(geometry{4, 4, 1}, config, {}, payload, {}, 9);
    REQUIRE(e.size() == 3);  // tokens 0 | 1–4 | 5–8
    CHECK(e[0].values[0] == 0.0);
    CHECK(e[0].slot_weights == std::vector<double>{0, 0, 0, 1});
    CHECK(e[0].anchor == -3);  // virtual block start
    CHECK(e[1].values[0] == 2.5);
    CHECK(e[1].anchor == 1);
    CHECK(e[2].values[0] == 6.5);
    CHECK(oracle_compress<mean_plain>(geometry{4, 4, 1}, config, {}, payload, {}, 8).size() == 2);
  }
  SECTION("anchors: block start, block end, floor of the window's midpoint") {
    // S=3, W=7, origin 0: entry j's window is [3j − 4, 3j + 3).
    for (std::int64_t j = 0; j < 4; ++j) {
      const auto s = oracle_compress<mean_plain>(geometry{3, 7, 0, anchor_mode::block_start}, config, {},
                                                 ramp(3), {}, 12);
      const auto b = oracle_compress<mean_plain>(geometry{3, 7, 0, anchor_mode::block_end}, config, {},
                                                 ramp(3), {}, 12);
      const auto c = oracle_compress<mean_plain>(geometry{3, 7, 0, anchor_mode::window_centre}, config, {},
                                                 ramp(3), {}, 12);
      CHECK(s[j].anchor == 3 * j);
      CHECK(b[j].anchor == 3 * j + 2);
      // first = 3j − 4, last = 3j + 2: midpoint 3j − 1 exactly.
      CHECK(c[j].anchor == 3 * j - 1);
    }
    // S=4, W=6: first = 4j − 2, last = 4j + 3, floor((8j + 1)/2) = 4j; for j = 0 that's 0.
    // S=4, W=7, origin 2 (lead 2): first = 4j − 5, last = 4j + 1 → 4j − 2; j = 0 gives −2.
    const auto c46 = oracle_compress<mean_plain>(geometry{4, 6, 0, anchor_mode::window_centre}, config, {},
                                                 ramp(2), {}, 8);
    CHECK(c46[0].anchor == 0);
    CHECK(c46[1].anchor == 4);
    const auto c47 = oracle_compress<mean_plain>(geometry{4, 7, 2, anchor_mode::window_centre}, config, {},
                                                 ramp(2), {}, 6);
    CHECK(c47[0].anchor == -2);
    CHECK(c47[1].anchor == 2);
    // S=4, W=8, origin 1 (lead 3): first = 4j − 7, last = 4j: floor((8j − 7)/2) = 4j − 4 (−3.5 → −4).
    const auto c48 = oracle_compress<mean_plain>(geometry{4, 8, 1, anchor_mode::window_centre}, config, {},
                                                 ramp(2), {}, 1);
    REQUIRE(c48.size() == 1);
    CHECK(c48[0].anchor == -4);
  }
}

TEST_CASE("oracle: random inputs are reproducible and large logits are as documented", "[compress][oracle]") {
  std::mt19937 a(7), b(7);
  CHECK(phasekv_test::random_payload(a, 16) == phasekv_test::random_payload(b, 16));
  phasekv_test::logit_options big;
  big.magnitude = 1e4;
  const auto logits = phasekv_test::random_logits(a, 1000, big);
  bool saw_positive = false, saw_negative = false;
  for (float s : logits) {
    CHECK(std::abs(std::abs(s) - 1e4) <= 8.0);
    CHECK(std::floor(s * 64.0) == s * 64.0);  // a multiple of 1/64, so logit + bias is exact in fp32
    (s > 0 ? saw_positive : saw_negative) = true;
  }
  CHECK(saw_positive);
  CHECK(saw_negative);
  // The oracle stays finite and normalised on them.
  const auto geom = geometry{4, 8};
  const auto config = make_config(5, 2);
  const std::int64_t tokens = 20;
  const auto payload = phasekv_test::random_payload(a, tokens * 2 * 2 * 5);
  const auto lg = phasekv_test::random_logits(a, tokens * 2 * 2 * 5, big);
  stream_params params;
  params.slot_bias = phasekv_test::random_bias(a, 2 * 8 * 5, true);
  const auto e = oracle_compress<vector_plain>(geom, config, params, payload, lg, tokens);
  REQUIRE(e.size() == 5);
  for (const auto& entry : e) {
    for (double v : entry.values) CHECK(std::isfinite(v));
    for (int h = 0; h < 2; ++h) {
      double sum = 0.0;
      for (int i = 0; i < 8; ++i) sum += entry.slot_weights[h * 8 + i];
      CHECK(sum == Approx(1.0).epsilon(1e-12));
    }
  }
}

}  // namespace test_compress_oracle
