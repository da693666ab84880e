// write_profile (diag/write_profile.hpp): the per-phase weight, per-slot profile and gate
// concentration, against a brute-force recomputation from the emitted entries (written from
// docs/DESIGN.md §2 and §6, not from the header), closed forms for mean and one-hot pooling, and
// hand-built entries for the concentration measures.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "support/random_inputs.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/diag/write_profile.hpp"

namespace test_diag_write_profile {

namespace {

using namespace phasekv;
using namespace phasekv::diag;
using namespace phasekv_test;


struct recorded_entry {
  std::int64_t index = 0;
  std::vector<float> weights;  // [head][slot]
};

// --- docs/DESIGN.md §2, spelled out independently of geometry.hpp -------------------------------
// lead = (S − origin) mod S virtual tokens precede token 0; slot i of entry j holds token
// (j+1)·S − W − lead + i, padding when negative; φ(t) = (t − origin) mod S.
std::int64_t lead_of(const geometry& g) { return (g.stride - g.origin) % g.stride; }
std::int64_t token_at(const geometry& g, std::int64_t j, std::int64_t slot) {
  return (j + 1) * g.stride - g.window - lead_of(g) + slot;
}
std::int64_t phase(const geometry& g, std::int64_t t) { return ((t - g.origin) % g.stride + g.stride) % g.stride; }
bool has_padding(const geometry& g, std::int64_t j) { return token_at(g, j, 0) < 0; }

// Runs `tokens` random tokens through a compressor with policy P, feeding a write_profile and
// recording every entry's slot weights.
template <class Policy>
std::vector<recorded_entry> compress(const geometry& g, std::int64_t heads, stream_params params, std::int64_t tokens,
                                     std::uint32_t seed, write_profile& profile) {
  std::mt19937 rng(seed);
  stream_config config;
  config.name = "profile";
  config.channels = 3;
  config.kv_heads = heads;
  config.inputs = input_layout::per_slot;
  if constexpr (is_gated_v<typename Policy::pooling>)
    if (params.slot_bias.empty())
      params.slot_bias = random_bias(
          rng, static_cast<std::size_t>(heads * g.window * gate_channels<typename Policy::pooling>(config.channels)));
  const stream_compressor<Policy> compressor(g, config, params);
  logit_options wide;
  wide.spread = 4.0f;  // peaked enough that the windows differ visibly
  const stream_inputs in = random_stream_inputs(rng, tokens, compressor.payload_floats_per_token(),
                                                compressor.logit_floats_per_token(), wide);
  token_chunk chunk;
  chunk.tokens = tokens;
  chunk.payload = in.payload;
  chunk.logits = in.logits;
  append_options options;
  options.slot_weights = true;
  std::vector<recorded_entry> out;
  stream_state state = compressor.make_state();
  compressor.append(state, chunk, [&](const entry_view& e) {
    out.push_back({e.index, std::vector<float>(e.slot_weights, e.slot_weights + e.kv_heads * e.window)});
    profile(e);
  }, options);
  return out;
}

// by_phase recomputed token by token: a token counts once every entry whose window holds it has
// been recorded; its weight is the sum over those entries of its slot's weight.
std::vector<phase_weight> brute_force_by_phase(const geometry& g, std::int64_t head,
                                               const std::vector<recorded_entry>& entries) {
  const std::int64_t S = g.stride, W = g.window, seen = static_cast<std::int64_t>(entries.size());
  std::vector<phase_weight> out(static_cast<std::size_t>(S));
  std::vector<std::vector<double>> weights(static_cast<std::size_t>(S));
  std::vector<double> cover(static_cast<std::size_t>(S), 0.0);
  const std::int64_t last_token = token_at(g, seen + 2, W - 1);
  for (std::int64_t t = 0; t <= last_token; ++t) {
    double weight = 0.0;
    std::int64_t covering = 0;
    bool complete = true;
    for (std::int64_t j = 0; j <= t + W + S; ++j) {  // later entries start after t
      const std::int64_t slot = t - token_at(g, j, 0);
      if (slot < 0 || slot >= W) continue;
      ++covering;
      if (j >= seen) {
        complete = false;
        continue;
      }
      weight += entries[static_cast<std::size_t>(j)].weights[static_cast<std::size_t>(head * W + slot)];
    }
    if (!complete) continue;
    const auto p = static_cast<std::size_t>(phase(g, t));
    weights[p].push_back(weight);
    cover[p] += static_cast<double>(covering);
  }
  for (std::size_t p = 0; p < out.size(); ++p) {
    out[p].phase = static_cast<std::int64_t>(p);
    out[p].tokens = static_cast<std::int64_t>(weights[p].size());
    if (weights[p].empty()) continue;
    const double n = static_cast<double>(weights[p].size());
    double mean = 0.0, var = 0.0;
    for (double w : weights[p]) mean += w / n;
    for (double w : weights[p]) var += (w - mean) * (w - mean) / n;
    out[p].mean_weight = mean;
    out[p].stddev_weight = std::sqrt(var);
    out[p].coverage = cover[p] / n;
  }
  return out;
}

double entropy(const std::vector<double>& p) {
  double h = 0.0;
  for (double x : p)
    if (x > 0) h -= x * std::log(x);
  return h;
}

struct concentration {
  double static_measure = 0.0, window_measure = 0.0;
  std::int64_t windows = 0;
  std::vector<double> mean_profile;
};

// docs/DESIGN.md §6 over the unpadded entries: static exp(H(E[α])), per window E[exp(H(α))].
concentration brute_force_concentration(const geometry& g, std::int64_t head, const std::vector<recorded_entry>& entries) {
  const std::int64_t W = g.window;
  concentration c;
  c.mean_profile.assign(static_cast<std::size_t>(W), 0.0);
  for (const auto& e : entries) {
    if (has_padding(g, e.index)) continue;
    std::vector<double> alpha(static_cast<std::size_t>(W));
    double sum = 0.0;
    for (std::int64_t i = 0; i < W; ++i) sum += e.weights[static_cast<std::size_t>(head * W + i)];
    for (std::int64_t i = 0; i < W; ++i) alpha[static_cast<std::size_t>(i)] = e.weights[static_cast<std::size_t>(head * W + i)] / sum;
    for (std::int64_t i = 0; i < W; ++i) c.mean_profile[static_cast<std::size_t>(i)] += alpha[static_cast<std::size_t>(i)];
    c.window_measure += std::exp(entropy(alpha));
    ++c.windows;
  }
  for (double& p : c.mean_profile) p /= static_cast<double>(c.windows);
  c.window_measure /= static_cast<double>(c.windows);
  c.static_measure = std::exp(entropy(c.mean_profile));
  return c;
}

void check_against_brute_force(const geometry& g, std::int64_t heads, const std::vector<recorded_entry>& entries,
                               const write_profile& profile) {
  const std::int64_t W = g.window;
  for (std::int64_t h = 0; h < heads; ++h) {
    INFO("head " << h);
    const auto got = profile.by_phase(h);
    const auto want = brute_force_by_phase(g, h, entries);
    REQUIRE(got.size() == want.size());
    for (std::size_t p = 0; p < got.size(); ++p) {
      INFO("phase " << p);
      CHECK(got[p].phase == want[p].phase);
      CHECK(got[p].tokens == want[p].tokens);
      CHECK(got[p].tokens > 0);
      CHECK(got[p].mean_weight == Approx(want[p].mean_weight).epsilon(1e-12));
      CHECK(got[p].stddev_weight == Approx(want[p].stddev_weight).epsilon(1e-6).margin(1e-7));
      CHECK(got[p].coverage == Approx(want[p].coverage).epsilon(1e-14));
    }
    // slot_profile: mean over all entries, padding counted as 0.
    const auto slots = profile.slot_profile(h);
    for (std::int64_t i = 0; i < W; ++i) {
      double sum = 0.0;
      for (const auto& e : entries)
        if (token_at(g, e.index, i) >= 0) sum += e.weights[static_cast<std::size_t>(h * W + i)];
      CHECK(slots[static_cast<std::size_t>(i)] == Approx(sum / static_cast<double>(entries.size())).epsilon(1e-12));
    }
    const auto c = brute_force_concentration(g, h, entries);
    CHECK(profile.concentration_windows(h) == c.windows);
    CHECK(profile.static_concentration(h) == Approx(c.static_measure).epsilon(1e-12));
    CHECK(profile.window_concentration(h) == Approx(c.window_measure).epsilon(1e-12));
    const auto unpadded = profile.unpadded_slot_profile(h);
    for (std::int64_t i = 0; i < W; ++i)
      CHECK(unpadded[static_cast<std::size_t>(i)] == Approx(c.mean_profile[static_cast<std::size_t>(i)]).epsilon(1e-12));
    CHECK(profile.static_concentration(h) >= 1.0 - 1e-12);
    CHECK(profile.static_concentration(h) <= static_cast<double>(W) + 1e-12);
    CHECK(profile.window_concentration(h) >= 1.0 - 1e-12);
    CHECK(profile.window_concentration(h) <= static_cast<double>(W) + 1e-12);
  }
}

// An entry_view over hand-written weights [head][slot].
entry_view hand_entry(std::int64_t index, std::int64_t heads, std::int64_t window, const std::vector<float>& weights) {
  entry_view e;
  e.index = index;
  e.kv_heads = heads;
  e.window = window;
  e.channels = 0;
  e.slot_weights = weights.data();
  return e;
}

}  // namespace

TEST_CASE("write_profile: by_phase, slot_profile and concentration match a brute force", "[diag][write_profile]") {
  struct shape {
    std::int64_t stride, window, origin;
  };
  // Including W = S, S ∤ W (coverage varies with phase), staggered origins and S = W = 1.
  for (const shape s : {shape{1, 1, 0}, shape{4, 4, 0}, shape{4, 8, 0}, shape{4, 8, 1}, shape{3, 7, 2}, shape{2, 5, 0},
                        shape{4, 6, 3}}) {
    const geometry g = geometry{s.stride, s.window, s.origin};
    std::ostringstream what;
    what << "S=" << s.stride << " W=" << s.window << " origin=" << s.origin;
    INFO(what.str());
    const std::int64_t heads = 2, tokens = 6 * s.window + s.stride / 2 + 1;  // ends inside a block
    {
      INFO("vector gates");
      write_profile profile(g, heads);
      const auto entries = compress<compressor_policy<vector_gated_pool>>(g, heads, {}, tokens, 11, profile);
      check_against_brute_force(g, heads, entries, profile);
    }
    {
      INFO("scalar gates");
      write_profile profile(g, heads);
      const auto entries = compress<compressor_policy<scalar_gated_pool>>(g, heads, {}, tokens, 12, profile);
      check_against_brute_force(g, heads, entries, profile);
    }
  }
}

TEST_CASE("write_profile: mean pooling gives closed-form phase weights", "[diag][write_profile]") {
  SECTION("W = S: one entry per token, weight 1/S, coverage 1, for every phase") {
    for (std::int64_t S : {1, 2, 4, 5}) {
      const geometry g = geometry{S, S};
      write_profile profile(g, 1);
      const auto entries = compress<compressor_policy<mean_pool>>(g, 1, {}, 7 * S, 1, profile);
      for (const auto& p : profile.by_phase(0)) {
        INFO("S = " << S << ", phase " << p.phase);
        CHECK(p.tokens == 7);
        CHECK(p.mean_weight == Approx(1.0 / S).epsilon(1e-7));
        CHECK(p.stddev_weight == Approx(0.0).margin(1e-7));
        CHECK(p.coverage == 1.0);
      }
      check_against_brute_force(g, 1, entries, profile);
    }
  }
  SECTION("W = 2S: two entries × 1/(2S) = 1/S per token, except the first block (3/(2S))") {
    // Entry 0 has S padding slots, so it gives its S real tokens 1/S each; entry 1 adds 1/(2S).
    // Per phase with n tokens: mean = 1/S + 1/(2S·n); one outlier of 1/(2S) above the rest gives
    // a population stddev of (1/(2S))·√(n − 1)/n.
    for (std::int64_t S : {1, 2, 4}) {
      const geometry g = geometry{S, 2 * S};
      write_profile profile(g, 1);
      const std::int64_t blocks = 9;
      compress<compressor_policy<mean_pool>>(g, 1, {}, blocks * S, 2, profile);
      for (const auto& p : profile.by_phase(0)) {
        INFO("S = " << S << ", phase " << p.phase);
        const double n = static_cast<double>(blocks - 1);  // the last block's tokens lack entry `blocks`
        CHECK(p.tokens == blocks - 1);
        CHECK(p.mean_weight == Approx(1.0 / S + 1.0 / (2.0 * S * n)).epsilon(1e-7));
        CHECK(p.stddev_weight == Approx(std::sqrt(n - 1) / (2.0 * S * n)).epsilon(1e-5));
        CHECK(p.coverage == 2.0);
      }
    }
  }
}

TEST_CASE("write_profile: a one-hot profile on slot i feeds only phase (i − W) mod S", "[diag][write_profile]") {
  // Slot i of entry j holds t = (j+1)S − W − lead + i, so φ(t) = (i − W − (lead + origin)) mod S,
  // and lead + origin ∈ {0, S}: φ = (i − W) mod S whatever the origin. A token t ≥ 0 of that
  // phase sits at slot i of exactly one entry, j = (t + W + lead − i)/S − 1, and j ≥ 0 because
  // t + W + lead − i is a positive (t ≥ 0, i < W) multiple of S. So every token of phase
  // (i − W) mod S receives total weight exactly 1 and every other token 0.
  struct shape {
    std::int64_t stride, window, origin;
  };
  for (const shape s : {shape{4, 4, 0}, shape{4, 8, 0}, shape{4, 8, 3}, shape{3, 7, 1}, shape{2, 5, 0}})
    for (std::int64_t slot = 0; slot < s.window; ++slot) {
      const geometry g = geometry{s.stride, s.window, s.origin};
      INFO("S=" << s.stride << " W=" << s.window << " origin=" << s.origin << " slot=" << slot);
      stream_params params;
      params.slot_profile.assign(static_cast<std::size_t>(s.window), 0.0f);
      params.slot_profile[static_cast<std::size_t>(slot)] = 1.0f;
      write_profile profile(g, 1);
      const auto entries = compress<compressor_policy<fixed_weight_pool>>(g, 1, params, 5 * s.window + 2, 3, profile);
      const std::int64_t fed = ((slot - s.window) % s.stride + s.stride) % s.stride;
      for (const auto& p : profile.by_phase(0)) {
        INFO("phase " << p.phase);
        CHECK(p.mean_weight == (p.phase == fed ? 1.0 : 0.0));
        CHECK(p.stddev_weight == 0.0);
      }
      CHECK(profile.static_concentration(0) == 1.0);
      CHECK(profile.window_concentration(0) == 1.0);
      check_against_brute_force(g, 1, entries, profile);
    }
}

TEST_CASE("write_profile: gate concentration of mean pooling is W, padded entries excluded", "[diag][write_profile]") {
  struct shape {
    std::int64_t stride, window, origin;
  };
  for (const shape s : {shape{4, 8, 0}, shape{4, 8, 1}, shape{4, 4, 0}, shape{3, 7, 2}, shape{128, 128, 0}}) {
    const geometry g = geometry{s.stride, s.window, s.origin};
    INFO("S=" << s.stride << " W=" << s.window << " origin=" << s.origin);
    write_profile profile(g, 3);
    const auto entries = compress<compressor_policy<mean_pool>>(g, 3, {}, 4 * s.window, 4, profile);
    std::int64_t padded = 0;
    for (const auto& e : entries) padded += has_padding(g, e.index) ? 1 : 0;
    if (s.window > s.stride || s.origin != 0) CHECK(padded > 0);  // the exclusion is exercised
    for (std::int64_t h = 0; h < 3; ++h) {
      CHECK(profile.concentration_windows(h) == static_cast<std::int64_t>(entries.size()) - padded);
      // Padded entries spread 1 over fewer than W slots; counting them would read below W.
      CHECK(profile.static_concentration(h) == Approx(static_cast<double>(s.window)).epsilon(1e-12));
      CHECK(profile.window_concentration(h) == Approx(static_cast<double>(s.window)).epsilon(1e-12));
    }
  }
}

TEST_CASE("write_profile: static and per-window concentration tell moving peaks from fixed ones",
          "[diag][write_profile]") {
  const geometry g = geometry{4, 4};  // W = S: no entry has padding
  const std::vector<float> slot0 = {1, 0, 0, 0}, slot2 = {0, 0, 1, 0};

  SECTION("alternating one-hots on slots 0 and 2: static 2 (E[α] = (½, 0, ½, 0)), per window 1") {
    write_profile profile(g, 1);
    for (std::int64_t j = 0; j < 10; ++j) profile(hand_entry(j, 1, 4, j % 2 == 0 ? slot0 : slot2));
    CHECK(profile.static_concentration(0) == Approx(2.0).epsilon(1e-14));
    CHECK(profile.window_concentration(0) == 1.0);
    CHECK(profile.concentration_windows(0) == 10);
    CHECK(profile.unpadded_slot_profile(0) == std::vector<double>{0.5, 0.0, 0.5, 0.0});
    // Phase view of the same data: phase 0 tokens are fed in even entries, phase 2 in odd ones.
    const auto phases = profile.by_phase(0);
    CHECK(phases[0].mean_weight == 0.5);
    CHECK(phases[0].stddev_weight == 0.5);
    CHECK(phases[1].mean_weight == 0.0);
    CHECK(phases[2].mean_weight == 0.5);
  }
  SECTION("the same one-hot every window: both 1") {
    write_profile profile(g, 1);
    for (std::int64_t j = 0; j < 6; ++j) profile(hand_entry(j, 1, 4, slot2));
    CHECK(profile.static_concentration(0) == 1.0);
    CHECK(profile.window_concentration(0) == 1.0);
  }
  SECTION("heads are independent; weights are normalised per window") {
    // Head 0 alternates one-hots; head 1 puts (2, 2, 0, 0) — unnormalised, like (½, ½, 0, 0).
    write_profile profile(g, 2);
    for (std::int64_t j = 0; j < 4; ++j) {
      std::vector<float> w = j % 2 == 0 ? slot0 : slot2;
      w.insert(w.end(), {2, 2, 0, 0});
      profile(hand_entry(j, 2, 4, w));
    }
    CHECK(profile.static_concentration(0) == Approx(2.0).epsilon(1e-14));
    CHECK(profile.window_concentration(0) == 1.0);
    CHECK(profile.static_concentration(1) == Approx(2.0).epsilon(1e-14));
    CHECK(profile.window_concentration(1) == Approx(2.0).epsilon(1e-14));
  }
  SECTION("three equal weights: e^(ln 3) = 3; a window summing to 0 is skipped for that head") {
    write_profile profile(g, 1);
    profile(hand_entry(0, 1, 4, {0, 1, 1, 1}));
    profile(hand_entry(1, 1, 4, {0, 0, 0, 0}));
    CHECK(profile.concentration_windows(0) == 1);
    CHECK(profile.static_concentration(0) == Approx(3.0).epsilon(1e-14));
    CHECK(profile.window_concentration(0) == Approx(3.0).epsilon(1e-14));
  }
}

TEST_CASE("write_profile: concentration before any unpadded entry is 0", "[diag][write_profile]") {
  const geometry g = geometry{4, 8};
  write_profile profile(g, 1);
  CHECK(profile.static_concentration(0) == 0.0);
  CHECK(profile.window_concentration(0) == 0.0);
  // Entry 0 of W = 8, S = 4 pools tokens 0–3 only (slots 0–3 are padding).
  profile(hand_entry(0, 1, 8, {0, 0, 0, 0, 0.25f, 0.25f, 0.25f, 0.25f}));
  CHECK(profile.concentration_windows(0) == 0);
  CHECK(profile.static_concentration(0) == 0.0);
  CHECK(profile.unpadded_slot_profile(0) == std::vector<double>(8, 0.0));
  profile(hand_entry(1, 1, 8, std::vector<float>(8, 0.125f)));
  CHECK(profile.concentration_windows(0) == 1);
  CHECK(profile.static_concentration(0) == Approx(8.0).epsilon(1e-14));
  CHECK(profile.window_concentration(0) == Approx(8.0).epsilon(1e-14));
}

TEST_CASE("write_profile: rejects bad entries and leaves itself unchanged", "[diag][write_profile][errors]") {
  const geometry g = geometry{2, 4};
  write_profile profile(g, 2);
  const std::vector<float> good = {0.25f, 0.25f, 0.25f, 0.25f, 0, 0, 1, 0};
  profile(hand_entry(1, 2, 4, good));
  profile(hand_entry(2, 2, 4, good));
  const auto phases_before = profile.by_phase(1);
  const auto slots_before = profile.slot_profile(1);
  const double static_before = profile.static_concentration(1), window_before = profile.window_concentration(1);

  std::vector<float> bad = good;
  bad[6] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(profile(hand_entry(3, 2, 4, bad)), Catch::Contains("slot_weights[head 1][slot 2]"));
  bad[6] = -0.5f;
  CHECK_THROWS_WITH(profile(hand_entry(3, 2, 4, bad)), Catch::Contains("= -0.5"));
  CHECK_THROWS_WITH(profile(hand_entry(-1, 2, 4, good)), Catch::Contains("entry.index = -1"));
  CHECK_THROWS_WITH(profile(hand_entry(3, 1, 4, good)), Catch::Contains("entry.kv_heads = 1") && Catch::Contains("kv_heads = 2"));
  CHECK_THROWS_WITH(profile(hand_entry(3, 2, 2, good)), Catch::Contains("entry.window = 2") && Catch::Contains("window = 4"));
  entry_view no_weights = hand_entry(3, 2, 4, good);
  no_weights.slot_weights = nullptr;
  CHECK_THROWS_AS(profile(no_weights), input_error);

  const auto phases_after = profile.by_phase(1);
  for (std::size_t p = 0; p < phases_after.size(); ++p) {
    CHECK(phases_after[p].tokens == phases_before[p].tokens);
    CHECK(phases_after[p].mean_weight == phases_before[p].mean_weight);
  }
  CHECK(profile.slot_profile(1) == slots_before);
  CHECK(profile.static_concentration(1) == static_before);
  CHECK(profile.window_concentration(1) == window_before);

  // Padding slots are not read: a NaN there is ignored (entry 0 of W = 4, S = 2: slots 0–1).
  std::vector<float> padded = {std::numeric_limits<float>::quiet_NaN(), -1, 0.5f, 0.5f, 0, 0, 0, 1};
  CHECK_NOTHROW(profile(hand_entry(0, 2, 4, padded)));

  CHECK_THROWS_WITH(profile.static_concentration(2), Catch::Contains("head = 2"));
  CHECK_THROWS_AS(profile.window_concentration(-1), input_error);
  CHECK_THROWS_AS(profile.concentration_windows(5), input_error);
  CHECK_THROWS_AS(profile.unpadded_slot_profile(2), input_error);
}

}  // namespace test_diag_write_profile
