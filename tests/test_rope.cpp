// Tests of phasekv::rope_config / rope_rotation (docs/DESIGN.md §3).
//
// Oracle: a double-precision twin written from the maths — θ_k = base^(−2k/R), optionally YaRN
// as in DeepSeek's reference code (find_correction_dim, a linear ramp clamped to [0, 1] between
// floor(dim(beta_fast)) and ceil(dim(beta_slow))), pair k rotated by p·θ_k, pairs (2k, 2k+1)
// (interleaved) or (k, k + R/2) (half-split) among the last R channels — plus facts that can be
// derived by hand (θ_0 = 1, DeepSeek-V4's ramp runs from pair 15 to pair 25, …).

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/message_of.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/rope.hpp"

namespace test_rope {

namespace {

using i64 = std::int64_t;

constexpr double pi = 3.141592653589793238462643383279502884;

// --- the twin -----------------------------------------------------------------------------------

// Channels (within the whole vector) of pair k.
struct pair_channels {
  i64 first, second;
};
pair_channels channels_of_pair(phasekv::rope_layout layout, i64 vector_channels, i64 rotated, i64 k) {
  const i64 offset = vector_channels - rotated;  // the last R channels rotate
  if (layout == phasekv::rope_layout::interleaved) return {offset + 2 * k, offset + 2 * k + 1};
  return {offset + k, offset + k + rotated / 2};
}

// DeepSeek's find_correction_dim: the pair index whose wavelength fits `rotations` times into
// the original context.
double correction_dim(double rotations, double rotated, double base, double original_context) {
  return rotated * std::log(original_context / (2.0 * pi * rotations)) / (2.0 * std::log(base));
}

struct yarn_range {
  double low, high;
};
yarn_range twin_yarn_range(const phasekv::rope_config& config) {
  const double r = static_cast<double>(config.channels);
  const double context = static_cast<double>(config.yarn.original_context);
  double low = std::floor(correction_dim(config.yarn.beta_fast, r, config.base, context));
  double high = std::ceil(correction_dim(config.yarn.beta_slow, r, config.base, context));
  if (low < 0) low = 0;
  if (high > r - 1) high = r - 1;
  if (low == high) high += 0.001;
  return {low, high};
}

std::vector<double> twin_inverse_frequencies(const phasekv::rope_config& config) {
  const i64 pairs = config.channels / 2;
  std::vector<double> theta(static_cast<std::size_t>(pairs));
  for (i64 k = 0; k < pairs; ++k)
    theta[k] = 1.0 / std::pow(config.base, static_cast<double>(2 * k) / static_cast<double>(config.channels));
  if (config.yarn.enabled) {
    const auto [low, high] = twin_yarn_range(config);
    for (i64 k = 0; k < pairs; ++k) {
      double ramp = (static_cast<double>(k) - low) / (high - low);
      if (ramp < 0) ramp = 0;
      if (ramp > 1) ramp = 1;
      theta[k] = theta[k] / config.yarn.factor * ramp + theta[k] * (1.0 - ramp);
    }
  }
  return theta;
}

// Rotates the last R channels of x by position·θ_k, entirely in double.
std::vector<double> twin_rotate(const std::vector<float>& x, const phasekv::rope_config& config, double position) {
  const i64 channels = static_cast<i64>(x.size());
  std::vector<double> out(x.begin(), x.end());
  const auto theta = twin_inverse_frequencies(config);
  for (i64 k = 0; k < config.channels / 2; ++k) {
    const auto [i, j] = channels_of_pair(config.layout, channels, config.channels, k);
    const double angle = position * theta[k];
    const double a = x[i], b = x[j];
    out[i] = a * std::cos(angle) - b * std::sin(angle);
    out[j] = a * std::sin(angle) + b * std::cos(angle);
  }
  return out;
}

// --- helpers ------------------------------------------------------------------------------------

// The library's rotation of a copy of x.
std::vector<float> library_rotate(std::vector<float> x, const phasekv::rope_config& config, double position,
                                  float sign = 1.0f) {
  const phasekv::rope_rotation rotation(config, static_cast<i64>(x.size()));
  std::vector<float> cos_table(static_cast<std::size_t>(rotation.pairs()));
  std::vector<float> sin_table(static_cast<std::size_t>(rotation.pairs()));
  rotation.angles(position, cos_table.data(), sin_table.data());
  rotation.apply(x.data(), cos_table.data(), sin_table.data(), sign);
  return x;
}

std::vector<float> random_vector(i64 channels, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<float> x(static_cast<std::size_t>(channels));
  for (auto& v : x) v = uniform(rng);
  return x;
}

phasekv::rope_config plain(i64 rotated, double base, phasekv::rope_layout layout) {
  phasekv::rope_config config;
  config.channels = rotated;
  config.base = base;
  config.layout = layout;
  return config;
}

// `config` with YaRN on: `factor` over an original context, betas 32/1.
phasekv::rope_config with_yarn(phasekv::rope_config config, double factor, i64 original_context) {
  config.yarn.enabled = true;
  config.yarn.factor = factor;
  config.yarn.original_context = original_context;
  config.yarn.beta_fast = 32.0;
  config.yarn.beta_slow = 1.0;
  return config;
}

// DeepSeek-V4's compressed layers: base 160000, YaRN factor 16 over an original 65536, betas 32/1.
phasekv::rope_config deepseek_v4(phasekv::rope_layout layout = phasekv::rope_layout::interleaved) {
  return with_yarn(plain(64, 160000.0, layout), 16.0, 65536);
}

phasekv::rope_config generic_yarn(i64 rotated, phasekv::rope_layout layout) {
  return with_yarn(plain(rotated, 500000.0, layout), 8.0, 8192);
}

struct rotation_case {
  i64 vector_channels;
  phasekv::rope_config config;
};

std::vector<rotation_case> rotation_cases() {
  std::vector<rotation_case> cases;
  for (auto layout : {phasekv::rope_layout::interleaved, phasekv::rope_layout::half_split}) {
    cases.push_back({2, plain(2, 10000.0, layout)});
    cases.push_back({8, plain(8, 10000.0, layout)});
    cases.push_back({7, plain(4, 10000.0, layout)});  // odd prefix of untouched channels
    cases.push_back({24, plain(8, 10000.0, layout)});
    cases.push_back({128, plain(128, 500000.0, layout)});
    cases.push_back({96, generic_yarn(32, layout)});
    cases.push_back({512, deepseek_v4(layout)});  // last 64 of 512 channels
  }
  return cases;
}

const std::vector<double> test_positions = {0, 1, 2, 7, 1000, 65535, 65536, 131071, 1000003, -1, -5, -131071};

std::string describe(const rotation_case& c) {
  return std::string(phasekv::to_string(c.config.layout)) + " C=" + std::to_string(c.vector_channels) +
         " R=" + std::to_string(c.config.channels) + " base=" + std::to_string(c.config.base) +
         (c.config.yarn.enabled ? " yarn" : "");
}

double pair_norm(double a, double b) { return std::sqrt(a * a + b * b); }

}  // namespace

// --- frequencies ----------------------------------------------------------------------------------

TEST_CASE("rope: without YaRN the inverse frequencies are base^(-2k/R)", "[rope]") {
  // Hand-derivable: θ_0 = 1 always; base 10000, R = 8 gives 1, 0.1, 0.01, 0.001.
  const phasekv::rope_rotation small(plain(8, 10000.0, phasekv::rope_layout::interleaved), 8);
  REQUIRE(small.pairs() == 4);
  REQUIRE(small.rotated_channels() == 8);
  const auto& theta = small.inverse_frequencies();
  REQUIRE(theta.size() == 4);
  CHECK(theta[0] == 1.0);
  CHECK(theta[1] == Approx(0.1).epsilon(1e-15));
  CHECK(theta[2] == Approx(0.01).epsilon(1e-15));
  CHECK(theta[3] == Approx(0.001).epsilon(1e-15));

  for (i64 rotated : {2, 4, 8, 64, 128})
    for (double base : {1.5, 10000.0, 160000.0, 500000.0, 1e6}) {
      const auto config = plain(rotated, base, phasekv::rope_layout::half_split);
      INFO("R=" << rotated << " base=" << base);
      const phasekv::rope_rotation rotation(config, rotated + 3);
      const auto twin = twin_inverse_frequencies(config);
      REQUIRE(rotation.inverse_frequencies().size() == twin.size());
      CHECK(rotation.inverse_frequencies()[0] == 1.0);
      for (std::size_t k = 0; k < twin.size(); ++k) {
        INFO("k=" << k);
        CHECK(rotation.inverse_frequencies()[k] == Approx(twin[k]).epsilon(1e-14));
        if (k > 0) CHECK(rotation.inverse_frequencies()[k] < rotation.inverse_frequencies()[k - 1]);
      }
    }
}

TEST_CASE("rope: YaRN frequencies follow DeepSeek's ramp (DeepSeek-V4 compressed layers)", "[rope][yarn]") {
  const auto config = deepseek_v4();
  // By hand: dim(32) = 64·ln(65536/(64π))/(2·ln 160000) ≈ 15.45 → low = 15;
  //          dim(1)  = 64·ln(65536/(2π))/(2·ln 160000) ≈ 24.71 → high = 25.
  const auto range = twin_yarn_range(config);
  REQUIRE(range.low == 15.0);
  REQUIRE(range.high == 25.0);

  const phasekv::rope_rotation rotation(config, 512);
  const auto& theta = rotation.inverse_frequencies();
  const auto unscaled = twin_inverse_frequencies(plain(64, 160000.0, phasekv::rope_layout::interleaved));
  const auto twin = twin_inverse_frequencies(config);
  REQUIRE(theta.size() == 32);
  for (std::size_t k = 0; k < 32; ++k) {
    INFO("k=" << k);
    CHECK(theta[k] == Approx(twin[k]).epsilon(1e-14));
    if (k <= 15) {
      // Fast pairs keep their frequency (ramp 0: exactly θ·1 + θ/16·0).
      CHECK(theta[k] == Approx(unscaled[k]).epsilon(1e-14));
    } else if (k >= 25) {
      // Slow pairs are interpolated by the full factor.
      CHECK(theta[k] == Approx(unscaled[k] / 16.0).epsilon(1e-14));
    } else {
      // In between, the scale moves linearly from 1 to 1/16: ramp (k − 15)/10.
      const double ramp = (static_cast<double>(k) - 15.0) / 10.0;
      CHECK(theta[k] == Approx(unscaled[k] * (1.0 - ramp + ramp / 16.0)).epsilon(1e-14));
    }
  }
  CHECK(theta[20] == Approx(unscaled[20] * 17.0 / 32.0).epsilon(1e-14));

  // Other YaRN settings against the twin.
  for (auto yarn_config : {generic_yarn(32, phasekv::rope_layout::interleaved),
                           generic_yarn(128, phasekv::rope_layout::half_split)}) {
    for (double factor : {1.0, 4.0, 40.0}) {
      yarn_config.yarn.factor = factor;
      INFO("R=" << yarn_config.channels << " factor=" << factor);
      const phasekv::rope_rotation generic(yarn_config, yarn_config.channels);
      const auto expected = twin_inverse_frequencies(yarn_config);
      for (std::size_t k = 0; k < expected.size(); ++k) {
        INFO("k=" << k);
        CHECK(generic.inverse_frequencies()[k] == Approx(expected[k]).epsilon(1e-14));
      }
    }
  }
}

TEST_CASE("rope: YaRN with factor 1 changes nothing", "[rope][yarn]") {
  auto config = deepseek_v4();
  config.yarn.factor = 1.0;
  const phasekv::rope_rotation rotation(config, 64);
  const auto unscaled = twin_inverse_frequencies(plain(64, 160000.0, phasekv::rope_layout::interleaved));
  for (std::size_t k = 0; k < unscaled.size(); ++k) CHECK(rotation.inverse_frequencies()[k] == Approx(unscaled[k]).epsilon(1e-14));
}

TEST_CASE("rope: YaRN ramp with low == high is widened by 0.001", "[rope][yarn]") {
  // original_context 6 < 2π: both correction dims are in (−1, 0], so low = high = 0 and the
  // ramp becomes k / 0.001: pair 0 keeps its frequency, every other pair is divided by factor.
  auto config = plain(8, 10000.0, phasekv::rope_layout::interleaved);
  config.yarn.enabled = true;
  config.yarn.factor = 4.0;
  config.yarn.original_context = 6;
  const auto range = twin_yarn_range(config);
  REQUIRE(range.low == 0.0);
  REQUIRE(range.high == 0.001);
  const phasekv::rope_rotation rotation(config, 8);
  const auto unscaled = twin_inverse_frequencies(plain(8, 10000.0, phasekv::rope_layout::interleaved));
  CHECK(rotation.inverse_frequencies()[0] == unscaled[0]);
  for (std::size_t k = 1; k < 4; ++k) CHECK(rotation.inverse_frequencies()[k] == Approx(unscaled[k] / 4.0).epsilon(1e-14));
}

// --- rotation ---------------------------------------------------------------------------------------

TEST_CASE("rope: rotation matches the double-precision twin in both layouts", "[rope]") {
  // The library forms and reduces angles in double, then evaluates sin/cos and the rotation in
  // float, so its error is a few float roundings of the pair (the reduced angle alone is off by
  // up to π·2^−24 ≈ 1.9e−7 rad; in total ≲ 4e−7·|pair|) at EVERY position: the bound below does
  // not grow with the position. Angles formed or reduced in float would be off by ~1e−2 rad at
  // p = 131071. Error is measured against the pair's norm, since one component of a rotated pair
  // can cancel to nearly zero.
  constexpr double tolerance = 2e-6;
  std::mt19937 rng(20260101);
  for (const auto& c : rotation_cases()) {
    INFO(describe(c));
    for (double position : test_positions) {
      INFO("position=" << position);
      for (int trial = 0; trial < 3; ++trial) {
        const auto x = random_vector(c.vector_channels, rng);
        const auto got = library_rotate(x, c.config, position);
        const auto expected = twin_rotate(x, c.config, position);
        for (i64 k = 0; k < c.config.channels / 2; ++k) {
          const auto [i, j] = channels_of_pair(c.config.layout, c.vector_channels, c.config.channels, k);
          INFO("pair " << k << " = channels (" << i << ", " << j << ")");
          const double norm = pair_norm(x[i], x[j]);
          CHECK(std::abs(got[i] - expected[i]) <= tolerance * norm);
          CHECK(std::abs(got[j] - expected[j]) <= tolerance * norm);
        }
      }
    }
  }
}

TEST_CASE("rope: pairs sit where each layout puts them", "[rope]") {
  // A unit vector on the first channel of pair k turns into (cos pθ_k, sin pθ_k) on that pair and
  // leaves every other channel at zero. θ_0 = 1, so pair 0 turns by exactly p radians.
  const i64 channels = 10, rotated = 8;  // two untouched channels, then four pairs
  const double position = 3.0;
  for (auto layout : {phasekv::rope_layout::interleaved, phasekv::rope_layout::half_split}) {
    INFO(phasekv::to_string(layout));
    const auto config = plain(rotated, 10000.0, layout);
    const auto theta = twin_inverse_frequencies(config);
    for (i64 k = 0; k < rotated / 2; ++k) {
      INFO("pair " << k);
      // interleaved: (2 + 2k, 3 + 2k); half-split: (2 + k, 6 + k)
      const i64 first = layout == phasekv::rope_layout::interleaved ? 2 + 2 * k : 2 + k;
      const i64 second = layout == phasekv::rope_layout::interleaved ? 3 + 2 * k : 6 + k;
      std::vector<float> x(channels, 0.0f);
      x[first] = 1.0f;
      const auto got = library_rotate(x, config, position);
      for (i64 ch = 0; ch < channels; ++ch) {
        INFO("channel " << ch);
        if (ch == first) CHECK(got[ch] == Approx(std::cos(position * theta[k])).margin(1e-6));
        else if (ch == second) CHECK(got[ch] == Approx(std::sin(position * theta[k])).margin(1e-6));
        else CHECK(got[ch] == 0.0f);
      }
    }
  }
  // Pair 0 at p = 3: (cos 3, sin 3).
  std::vector<float> e(4, 0.0f);
  e[2] = 1.0f;
  const auto got = library_rotate(e, plain(2, 10000.0, phasekv::rope_layout::interleaved), 3.0);
  CHECK(got[2] == Approx(-0.9899924966).margin(1e-6));
  CHECK(got[3] == Approx(0.1411200081).margin(1e-6));
}

TEST_CASE("rope: rotation preserves the norm of every pair", "[rope]") {
  std::mt19937 rng(7);
  for (const auto& c : rotation_cases()) {
    INFO(describe(c));
    for (double position : test_positions) {
      INFO("position=" << position);
      const auto x = random_vector(c.vector_channels, rng);
      const auto got = library_rotate(x, c.config, position);
      for (i64 k = 0; k < c.config.channels / 2; ++k) {
        const auto [i, j] = channels_of_pair(c.config.layout, c.vector_channels, c.config.channels, k);
        INFO("pair " << k);
        const double before = pair_norm(x[i], x[j]);
        CHECK(pair_norm(got[i], got[j]) == Approx(before).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("rope: rotating back with sign -1 restores the input", "[rope]") {
  std::mt19937 rng(11);
  for (const auto& c : rotation_cases()) {
    INFO(describe(c));
    const phasekv::rope_rotation rotation(c.config, c.vector_channels);
    std::vector<float> cos_table(static_cast<std::size_t>(rotation.pairs()));
    std::vector<float> sin_table(static_cast<std::size_t>(rotation.pairs()));
    for (double position : test_positions) {
      INFO("position=" << position);
      const auto x = random_vector(c.vector_channels, rng);
      auto y = x;
      rotation.angles(position, cos_table.data(), sin_table.data());
      rotation.apply(y.data(), cos_table.data(), sin_table.data(), 1.0f);
      // Rotating back by p is rotating by −p (sin is odd), bit for bit.
      CHECK(library_rotate(y, c.config, position, -1.0f) == library_rotate(y, c.config, -position));
      rotation.apply(y.data(), cos_table.data(), sin_table.data(), -1.0f);
      for (i64 k = 0; k < c.config.channels / 2; ++k) {
        const auto [i, j] = channels_of_pair(c.config.layout, c.vector_channels, c.config.channels, k);
        INFO("pair " << k);
        const double norm = pair_norm(x[i], x[j]);
        CHECK(std::abs(y[i] - x[i]) <= 2e-6 * norm);
        CHECK(std::abs(y[j] - x[j]) <= 2e-6 * norm);
      }
    }
  }
}

TEST_CASE("rope: position 0 is the identity", "[rope]") {
  std::mt19937 rng(13);
  for (const auto& c : rotation_cases()) {
    INFO(describe(c));
    const auto x = random_vector(c.vector_channels, rng);
    CHECK(library_rotate(x, c.config, 0.0) == x);
    CHECK(library_rotate(x, c.config, 0.0, -1.0f) == x);
  }
}

TEST_CASE("rope: channels before the last R are untouched bit for bit", "[rope]") {
  std::mt19937 rng(17);
  for (const auto& c : rotation_cases()) {
    INFO(describe(c));
    const i64 untouched = c.vector_channels - c.config.channels;
    for (double position : test_positions) {
      INFO("position=" << position);
      auto x = random_vector(c.vector_channels, rng);
      // Include values where sloppy arithmetic would show: NaN, ±inf, −0, subnormals.
      if (untouched >= 5) {
        x[0] = std::numeric_limits<float>::quiet_NaN();
        x[1] = std::numeric_limits<float>::infinity();
        x[2] = -0.0f;
        x[3] = std::numeric_limits<float>::denorm_min();
        x[4] = -std::numeric_limits<float>::infinity();
      }
      const auto got = library_rotate(x, c.config, position);
      CHECK(std::memcmp(got.data(), x.data(), static_cast<std::size_t>(untouched) * sizeof(float)) == 0);
    }
  }
  // R = 0: nothing rotates at all.
  const auto none = plain(0, 10000.0, phasekv::rope_layout::interleaved);
  const phasekv::rope_rotation rotation(none, 16);
  CHECK(rotation.pairs() == 0);
  auto x = random_vector(16, rng);
  const auto got = library_rotate(x, none, 12345.0);
  CHECK(std::memcmp(got.data(), x.data(), x.size() * sizeof(float)) == 0);
}

// --- validation -------------------------------------------------------------------------------------

TEST_CASE("rope: validate names the field and the value", "[rope][errors]") {
  using Catch::Contains;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();

  CHECK_NOTHROW(deepseek_v4().validate("csa.rope", 512));
  CHECK_NOTHROW(plain(0, 10000.0, phasekv::rope_layout::interleaved).validate("keys.rope", 16));
  CHECK_NOTHROW(plain(16, 10000.0, phasekv::rope_layout::half_split).validate("keys.rope", 16));

  auto config = plain(3, 10000.0, phasekv::rope_layout::interleaved);
  REQUIRE_THROWS_AS(config.validate("keys.rope", 16), phasekv::config_error);
  REQUIRE_THROWS_WITH(config.validate("keys.rope", 16), Contains("keys.rope.channels") && Contains("3"));
  config.channels = -2;
  REQUIRE_THROWS_WITH(config.validate("keys.rope", 16), Contains("keys.rope.channels") && Contains("-2"));
  config.channels = 18;  // more than the vector has
  REQUIRE_THROWS_AS(config.validate("keys.rope", 16), phasekv::config_error);
  REQUIRE_THROWS_WITH(config.validate("keys.rope", 16), Contains("keys.rope.channels = 18") && Contains("16"));

  for (double base : {1.0, 0.5, 0.0, -10.0, nan, inf}) {
    INFO("base=" << base);
    auto bad = plain(8, base, phasekv::rope_layout::interleaved);
    REQUIRE_THROWS_AS(bad.validate("keys.rope", 8), phasekv::config_error);
    REQUIRE_THROWS_WITH(bad.validate("keys.rope", 8), Contains("keys.rope.base"));
  }
  REQUIRE_THROWS_WITH(plain(8, 0.5, phasekv::rope_layout::interleaved).validate("k", 8), Contains("base = 0.5"));
  REQUIRE_THROWS_WITH(plain(8, nan, phasekv::rope_layout::interleaved).validate("k", 8), Contains("base = nan"));

  // YaRN fields: DeepSeek-V4's configuration with one of them changed.
  const auto yarn_error = [](auto change) {
    phasekv::rope_config c = deepseek_v4();
    change(c.yarn);
    return phasekv_test::message_of<phasekv::config_error>([&] { c.validate("csa.rope", 512); });
  };
  REQUIRE_THAT(yarn_error([](auto& y) { y.factor = 0.5; }), Contains("csa.rope.yarn.factor = 0.5"));
  REQUIRE_THAT(yarn_error([&](auto& y) { y.factor = nan; }), Contains("yarn.factor = nan"));
  REQUIRE_THAT(yarn_error([&](auto& y) { y.factor = inf; }), Contains("yarn.factor = inf"));
  REQUIRE_THAT(yarn_error([](auto& y) { y.original_context = 0; }), Contains("csa.rope.yarn.original_context = 0"));
  REQUIRE_THAT(yarn_error([](auto& y) { y.original_context = -65536; }), Contains("yarn.original_context = -65536"));
  REQUIRE_THAT(yarn_error([](auto& y) { y.beta_fast = 1.0; }),  // equal to beta_slow
               Contains("csa.rope.yarn.beta_fast = 1"));
  REQUIRE_THAT(yarn_error([](auto& y) { y.beta_fast = 0.25; }),  // below beta_slow
               Contains("yarn.beta_fast = 0.25"));
  REQUIRE_THAT(yarn_error([&](auto& y) { y.beta_fast = inf; }), Contains("yarn.beta_fast = inf"));
  REQUIRE_THAT(yarn_error([&](auto& y) { y.beta_fast = nan; }), Contains("yarn.beta_fast = nan"));
  REQUIRE_THAT(yarn_error([&](auto& y) { y.beta_slow = nan; }), Contains("yarn.beta_slow = nan"));
  REQUIRE_THAT(yarn_error([](auto& y) { y.beta_slow = 0.0; }), Contains("yarn.beta_slow = 0"));

  // Messages are phasekv errors, catchable as such.
  try {
    plain(5, 10000.0, phasekv::rope_layout::interleaved).validate("values.rope", 8);
    FAIL("odd channels did not throw");
  } catch (const phasekv::error& e) {
    CHECK_THAT(e.what(), Contains("values.rope.channels = 5"));
  }
}

}  // namespace test_rope
