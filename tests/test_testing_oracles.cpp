// The conformance kit's double-precision oracles (include/phasekv/testing/oracle.hpp) held to the
// tests' independent twins (tests/oracle/scalar_compressor.hpp, scalar_attention.hpp) on seeded
// random inputs, so that neither can drift from docs/DESIGN.md §2/§3/§5 unnoticed:
//
//   entries   oracle_entries with builtin_pooling_oracle (the kit's own path for a built-in
//             pooling) against oracle_compress, for every pooling × RoPE placement × norm, over
//             random geometries, layouts, heads, RoPE/YaRN settings and parameters
//   reads     oracle_read (out and lse) against sparse_read and causal_attention
//   indexer   oracle_indexer_scores against indexer_scores, fp32 queries and bf16-rounded ones
//             (rounded for the twin by tests/oracle/fp8_format.hpp's bf16_nearest)
//
// Both sides are plain loops in double over the same fp32 inputs, so they may differ only by the
// order of their roundings: a difference is held to 1e-12 of the size of the terms summed (each
// check states its yardstick). These seeds agree to within 4e-16 of it (the indexer bit for bit),
// so that leaves 10^3 over what summation order can do to the ≤ 160 terms of any value here, and
// stays far below what any wrong term, sign, weight or angle changes.

#include <catch2/catch.hpp>

#include <phasekv/testing/oracle.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "oracle/fp8_format.hpp"
#include "oracle/scalar_attention.hpp"
#include "oracle/scalar_compressor.hpp"
#include "support/common.hpp"
#include "support/random_inputs.hpp"

namespace test_testing_oracles {

namespace {

using namespace phasekv;
namespace kit = phasekv::testing;
using phasekv_test::pick;
using phasekv_test::sz;

// Both oracles compute in double; see the header comment.
constexpr double rel = 1e-12;

// ---- entries -----------------------------------------------------------------------------------

template <class T>
const char* name_of();
template <> const char* name_of<mean_pool>() { return "mean_pool"; }
template <> const char* name_of<fixed_weight_pool>() { return "fixed_weight_pool"; }
template <> const char* name_of<vector_gated_pool>() { return "gated_pool<vector>"; }
template <> const char* name_of<scalar_gated_pool>() { return "gated_pool<scalar>"; }
template <> const char* name_of<no_rope>() { return "no_rope"; }
template <> const char* name_of<rope_before_pool>() { return "rope_before_pool"; }
template <> const char* name_of<rope_after_pool>() { return "rope_after_pool"; }
template <> const char* name_of<no_norm>() { return "no_norm"; }
template <> const char* name_of<rms_norm>() { return "rms_norm"; }

struct entry_case {
  geometry geom;
  stream_config config;
  stream_params params;
  std::int64_t tokens = 0;
  std::vector<float> payload, logits;
  std::string text;
};

// A random case for a policy: S ∈ [1, 5], W ∈ [S, 3S], any origin and anchor, either layout,
// 1–2 KV heads, 1–9 channels with 2…C RoPE channels (either pair layout; YaRN off or on with
// contexts from 1 to 2^20, which reaches both of §3's high < low cases), and the parameters the
// policy reads — sometimes left empty to take their defaults.
template <class Policy>
entry_case random_entry_case(std::mt19937& rng) {
  using pooling = typename Policy::pooling;
  constexpr bool rope = !std::is_same_v<typename Policy::rope, no_rope>;
  constexpr bool norm = std::is_same_v<typename Policy::norm, rms_norm>;
  entry_case c;
  c.geom.stride = pick(rng, 1, 5);
  c.geom.window = pick(rng, c.geom.stride, 3 * c.geom.stride);
  c.geom.origin = pick(rng, 0, c.geom.stride - 1);
  c.geom.anchor = static_cast<anchor_mode>(pick(rng, 0, 2));
  c.config.name = "oracles";
  c.config.kv_heads = pick(rng, 1, 2);
  c.config.channels = pick(rng, rope ? 2 : 1, 9);
  c.config.inputs = pick(rng, 0, 1) ? input_layout::per_slot : input_layout::per_branch;
  c.config.norm_eps = phasekv_test::pick_of(rng, {1e-6, 1e-2, 0.5});
  if (rope) {
    c.config.rope.channels = 2 * pick(rng, 1, c.config.channels / 2);
    c.config.rope.layout = pick(rng, 0, 1) ? rope_layout::half_split : rope_layout::interleaved;
    c.config.rope.base = phasekv_test::pick_of(rng, {10.0, 500.0, 10000.0});
    if (pick(rng, 0, 1)) {
      c.config.rope.yarn.enabled = true;
      c.config.rope.yarn.factor = phasekv_test::pick_of(rng, {1.5, 4.0, 40.0});
      c.config.rope.yarn.original_context =
          phasekv_test::pick_of<std::int64_t>(rng, {1, 8, 64, 4096, std::int64_t{1} << 20});
      c.config.rope.yarn.beta_slow = phasekv_test::pick_of(rng, {0.5, 1.0});
      c.config.rope.yarn.beta_fast = phasekv_test::pick_of(rng, {2.0, 32.0});
    }
  }
  c.tokens = pick(rng, 0, c.geom.window + 5 * c.geom.stride);

  const std::int64_t H = c.config.kv_heads, C = c.config.channels, W = c.geom.window;
  const std::int64_t views = views_per_token(c.config.inputs, c.geom);
  const std::int64_t G = gate_channels<pooling>(C);
  phasekv_test::logit_options lo;
  if (pick(rng, 0, 3) == 0) lo.magnitude = 80.0;  // large logits: only max subtraction keeps them finite
  const auto in = phasekv_test::random_stream_inputs(rng, c.tokens, H * views * C, H * views * G, lo);
  c.payload = in.payload;
  c.logits = in.logits;
  if constexpr (is_gated_v<pooling>)
    if (pick(rng, 0, 3) != 0) c.params.slot_bias = phasekv_test::random_bias(rng, sz(H * W * G), lo.magnitude > 0.0);
  if constexpr (norm)
    if (pick(rng, 0, 3) != 0) c.params.norm_weight = phasekv_test::random_norm_weight(rng, sz(C));
  if constexpr (std::is_same_v<pooling, fixed_weight_pool>) {
    c.params.slot_profile = phasekv_test::random_profile(rng, sz(W));
    // Now and then one-hot: on slot 0 an entry whose slot 0 is padding has a real sum of 0.
    if (pick(rng, 0, 3) == 0) {
      std::fill(c.params.slot_profile.begin(), c.params.slot_profile.end(), 0.0f);
      c.params.slot_profile[sz(pick(rng, 0, 1) ? 0 : pick(rng, 0, W - 1))] = 1.0f;
    }
  }

  std::ostringstream s;
  s << name_of<pooling>() << ", " << name_of<typename Policy::rope>() << ", " << name_of<typename Policy::norm>()
    << "; S=" << c.geom.stride << " W=" << W << " origin=" << c.geom.origin << " anchor=" << to_string(c.geom.anchor)
    << " " << (c.config.inputs == input_layout::per_slot ? "per_slot" : "per_branch") << " H=" << H << " C=" << C
    << " tokens=" << c.tokens << " eps=" << c.config.norm_eps;
  if (rope) {
    const auto& r = c.config.rope;
    s << " R=" << r.channels << " " << to_string(r.layout) << " base=" << r.base;
    if (r.yarn.enabled)
      s << " yarn(factor " << r.yarn.factor << ", context " << r.yarn.original_context << ", beta " << r.yarn.beta_fast
        << "/" << r.yarn.beta_slow << ")";
  }
  s << (lo.magnitude > 0.0 ? " large logits" : "") << (c.params.slot_bias.empty() ? "" : " bias")
    << (c.params.norm_weight.empty() ? "" : " norm weights");
  c.text = s.str();
  return c;
}

// "" when the kit's entries equal the twin's: count, index and anchor exactly; each value within
// rel · (|want| + scale_h), scale_h the largest of the head's |values| and both oracles' term
// scales (Σ α·|x| after RMSNorm's factor; the terms the value is summed from); slot weights
// (in [0, 1]) within rel absolutely.
std::string entries_mismatch(const std::vector<kit::oracle_entry>& got, const std::vector<phasekv_test::oracle_entry>& want,
                             std::int64_t H, std::int64_t C, std::int64_t W) {
  std::ostringstream msg;
  msg.precision(17);
  if (got.size() != want.size()) {
    msg << "the kit gives " << got.size() << " entries, the twin " << want.size();
    return msg.str();
  }
  for (std::size_t e = 0; e < want.size(); ++e) {
    if (got[e].index != want[e].index || got[e].anchor != want[e].anchor) {
      msg << "entry #" << e << ": the kit's index/anchor " << got[e].index << "/" << got[e].anchor << ", the twin's "
          << want[e].index << "/" << want[e].anchor;
      return msg.str();
    }
    if (got[e].values.size() != sz(H * C) || got[e].slot_weights.size() != sz(H * W)) {
      msg << "entry " << want[e].index << ": the kit gives " << got[e].values.size() << " values and "
          << got[e].slot_weights.size() << " slot weights";
      return msg.str();
    }
    for (std::int64_t h = 0; h < H; ++h) {
      double scale = std::max(got[e].scale[sz(h)], want[e].term_scale[sz(h)]);
      for (std::int64_t c = 0; c < C; ++c) scale = std::max(scale, std::abs(want[e].values[sz(h * C + c)]));
      for (std::int64_t c = 0; c < C; ++c) {
        const double g = got[e].values[sz(h * C + c)], w = want[e].values[sz(h * C + c)];
        const double bound = rel * (std::abs(w) + scale);
        if (!(std::abs(g - w) <= bound)) {
          msg << "entry " << want[e].index << " head " << h << " channel " << c << ": the kit " << g << ", the twin "
              << w << " (|difference| " << std::abs(g - w) << " > " << bound << ")";
          return msg.str();
        }
      }
    }
    for (std::int64_t k = 0; k < H * W; ++k) {
      const double g = got[e].slot_weights[sz(k)], w = want[e].slot_weights[sz(k)];
      if (!(std::abs(g - w) <= rel)) {
        msg << "entry " << want[e].index << " head " << k / W << " slot " << k % W << ": the kit's weight " << g
            << ", the twin's " << w;
        return msg.str();
      }
    }
  }
  return "";
}

template <class Pooling, class Rope, class Norm>
void entries_agree(std::mt19937& rng, int cases, std::int64_t& entries_seen) {
  using policy = compressor_policy<Pooling, Rope, Norm>;
  for (int i = 0; i < cases; ++i) {
    const entry_case c = random_entry_case<policy>(rng);
    // The kit's path for a built-in pooling: conformance.hpp's oracle_of() builds
    // builtin_pooling_oracle<pooling>(the stream's params) and hands it to oracle_entries.
    const auto got = kit::oracle_entries<policy>(c.geom, c.config, c.params,
                                                 kit::builtin_pooling_oracle<Pooling>(c.params), c.payload.data(),
                                                 c.logits.data(), c.tokens);
    const auto want = phasekv_test::oracle_compress<policy>(c.geom, c.config, c.params, c.payload, c.logits, c.tokens);
    entries_seen += static_cast<std::int64_t>(want.size());
    INFO("case " << i << ": " << c.text);
    REQUIRE(entries_mismatch(got, want, c.config.kv_heads, c.config.channels, c.geom.window) == "");
  }
}

template <class Pooling>
void entries_agree_for_pooling(std::mt19937& rng, int cases, std::int64_t& entries_seen) {
  entries_agree<Pooling, no_rope, no_norm>(rng, cases, entries_seen);
  entries_agree<Pooling, no_rope, rms_norm>(rng, cases, entries_seen);
  entries_agree<Pooling, rope_before_pool, no_norm>(rng, cases, entries_seen);
  entries_agree<Pooling, rope_before_pool, rms_norm>(rng, cases, entries_seen);
  entries_agree<Pooling, rope_after_pool, no_norm>(rng, cases, entries_seen);
  entries_agree<Pooling, rope_after_pool, rms_norm>(rng, cases, entries_seen);
}

// ---- reads ---------------------------------------------------------------------------------------

// The twin's lse, from its probabilities: for the pair (or sink) of largest probability p with
// logit ℓ, lse = ℓ − ln p (p ≥ 1/(n + 1), so ln p carries no more than a few ulps); −∞ when
// nothing has mass.
double twin_lse(const phasekv_test::sparse_read_result& r, const std::vector<double>& logits, std::int64_t h,
                const std::vector<float>& sinks) {
  double best_p = 0.0, best_logit = 0.0;
  const std::size_t n = r.entry_probability[sz(h)].size();
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double p = i < n ? r.entry_probability[sz(h)][i] : r.window_probability[sz(h)][i - n];
    if (p > best_p) best_p = p, best_logit = logits[i];
  }
  if (!sinks.empty() && r.sink_probability[sz(h)] > best_p)
    best_p = r.sink_probability[sz(h)], best_logit = static_cast<double>(sinks[sz(h)]);
  if (best_p == 0.0) return -std::numeric_limits<double>::infinity();
  return best_logit - std::log(best_p);
}

}  // namespace

TEST_CASE("oracles: the kit's entries equal the tests' compressor twin for every built-in policy",
          "[testing][oracle]") {
  std::mt19937 rng(20);
  constexpr int cases = 100;  // per policy: 24 policies
  std::int64_t entries_seen = 0;
  entries_agree_for_pooling<mean_pool>(rng, cases, entries_seen);
  entries_agree_for_pooling<fixed_weight_pool>(rng, cases, entries_seen);
  entries_agree_for_pooling<vector_gated_pool>(rng, cases, entries_seen);
  entries_agree_for_pooling<scalar_gated_pool>(rng, cases, entries_seen);
  INFO("entries compared: " << entries_seen);
  CHECK(entries_seen > 24 * cases * 3);  // the cases are not mostly empty
}

TEST_CASE("oracles: the kit's oracle_read equals the tests' sparse_read and causal_attention", "[testing][oracle]") {
  std::mt19937 rng(21);
  for (int i = 0; i < 1000; ++i) {
    phasekv_test::attention_shape shape;
    shape.kv_heads = pick(rng, 1, 3);
    shape.query_heads = shape.kv_heads * pick(rng, 1, 3);
    shape.key_channels = pick(rng, 1, 9);
    shape.value_channels = pick(rng, 1, 9);
    const std::int64_t Hq = shape.query_heads, Hk = shape.kv_heads, ck = shape.key_channels, cv = shape.value_channels;
    const std::int64_t n = pick(rng, 0, 7), entries = pick(rng, 0, n);
    const bool with_sinks = pick(rng, 0, 1) == 1;
    const double scale = pick(rng, 0, 1) ? 1.0 / std::sqrt(static_cast<double>(ck)) : pick(rng, 1, 40) / 8.0;
    // Queries up to ±4 make logits of up to ~|scale|·16·ck: exp of them overflows without max subtraction.
    const std::vector<float> query = phasekv_test::random_uniform(rng, sz(Hq * ck), -4.0f, 4.0f);
    const std::vector<float> keys = phasekv_test::random_payload(rng, sz(n * Hk * ck));
    const std::vector<float> values = phasekv_test::random_payload(rng, sz(n * Hk * cv), 2.0f);
    const std::vector<float> sinks = with_sinks ? phasekv_test::random_uniform(rng, sz(Hq), -3.0f, 3.0f) : std::vector<float>{};
    INFO("case " << i << ": Hq=" << Hq << " Hkv=" << Hk << " ck=" << ck << " cv=" << cv << " keys=" << n << " ("
                 << entries << " as entries) sinks=" << with_sinks << " scale=" << scale);

    std::vector<const float*> key_rows, value_rows;
    std::vector<std::vector<float>> entry_keys, entry_values, window_keys, window_values;
    for (std::int64_t k = 0; k < n; ++k) {
      key_rows.push_back(keys.data() + k * Hk * ck);
      value_rows.push_back(values.data() + k * Hk * cv);
      std::vector<float> kr(keys.begin() + k * Hk * ck, keys.begin() + (k + 1) * Hk * ck);
      std::vector<float> vr(values.begin() + k * Hk * cv, values.begin() + (k + 1) * Hk * cv);
      (k < entries ? entry_keys : window_keys).push_back(std::move(kr));
      (k < entries ? entry_values : window_values).push_back(std::move(vr));
    }
    const kit::oracle_read_result got = kit::oracle_read(Hq, Hk, ck, cv, scale, query.data(),
                                                         with_sinks ? sinks.data() : nullptr, key_rows, value_rows);
    const phasekv_test::sparse_read_result want =
        phasekv_test::sparse_read(shape, query, scale, entry_keys, entry_values, window_keys, window_values, sinks);
    REQUIRE(got.out.size() == sz(Hq * cv));
    REQUIRE(got.lse.size() == sz(Hq));
    REQUIRE(want.output.size() == sz(Hq * cv));
    // The dense twin, written without joint_softmax: the keys as tokens 0 … n − 1, the query at n − 1.
    const std::vector<double> dense =
        n > 0 ? phasekv_test::causal_attention(shape, query.data(), keys, values, n - 1, scale,
                                               with_sinks ? sinks.data() : nullptr)
              : std::vector<double>(sz(Hq * cv), 0.0);

    double value_max = 0.0;  // out = Σ p·v with Σ p ≤ 1: its terms are at most max |v|
    for (float v : values) value_max = std::max(value_max, std::abs(static_cast<double>(v)));
    const std::int64_t group = Hq / Hk;
    for (std::int64_t h = 0; h < Hq; ++h) {
      std::vector<double> logits;
      double logit_max = 0.0;
      for (std::int64_t k = 0; k < n; ++k) {
        logits.push_back(scale * phasekv_test::dot_product(query.data() + h * ck, keys.data() + (k * Hk + h / group) * ck, ck));
        logit_max = std::max(logit_max, std::abs(logits.back()));
      }
      for (std::int64_t c = 0; c < cv; ++c) {
        const double g = got.out[sz(h * cv + c)];
        const double bound = rel * (std::abs(want.output[sz(h * cv + c)]) + value_max);
        INFO("head " << h << " channel " << c << ": the kit " << g << ", sparse_read " << want.output[sz(h * cv + c)]
                     << ", causal_attention " << dense[sz(h * cv + c)]);
        REQUIRE(std::abs(g - want.output[sz(h * cv + c)]) <= bound);
        REQUIRE(std::abs(g - dense[sz(h * cv + c)]) <= bound);
      }
      // lse = m + ln d: its terms are the logits (and the sink) themselves.
      const double w = twin_lse(want, logits, h, sinks);
      const double g = got.lse[sz(h)];
      INFO("head " << h << ": the kit's lse " << g << ", the twin's " << w);
      if (std::isinf(w)) {
        REQUIRE(g == w);
      } else {
        const double sink = with_sinks ? std::abs(static_cast<double>(sinks[sz(h)])) : 0.0;
        REQUIRE(std::abs(g - w) <= rel * std::max({1.0, std::abs(w), logit_max, sink}));
      }
    }
  }
}

TEST_CASE("oracles: the kit's indexer scores equal the tests' indexer_scores, fp32 and bf16 queries",
          "[testing][oracle]") {
  std::mt19937 rng(22);
  for (int i = 0; i < 1000; ++i) {
    const std::int64_t heads = pick(rng, 1, 8), channels = pick(rng, 1, 20), n = pick(rng, 0, 10);
    const bool bf16 = pick(rng, 0, 1) == 1;
    std::vector<float> queries = phasekv_test::random_uniform(rng, sz(heads * channels), -2.0f, 2.0f);
    // bf16 rounding at its edges: low halves just under, at (a tie: to even) and over half.
    if (bf16)
      for (float& q : queries)
        if (pick(rng, 0, 2) == 0) {
          const std::uint32_t low = phasekv_test::pick_of<std::uint32_t>(rng, {0x7FFFu, 0x8000u, 0x8001u, 0u});
          q = phasekv_test::float_of((phasekv_test::bits_of(q) & 0xFFFF0000u) | low);
        }
    const std::vector<float> weights = phasekv_test::random_uniform(rng, sz(heads), -1.0f, 1.0f);
    std::vector<std::vector<float>> keys;
    std::vector<const float*> key_rows;
    for (std::int64_t k = 0; k < n; ++k) keys.push_back(phasekv_test::random_payload(rng, sz(channels)));
    for (const auto& k : keys) key_rows.push_back(k.data());
    INFO("case " << i << ": heads=" << heads << " channels=" << channels << " keys=" << n << " bf16=" << bf16);

    // The twin takes the queries as given: round them for it with the tests' own bf16 rounding.
    std::vector<float> twin_queries = queries;
    if (bf16)
      for (float& q : twin_queries) q = static_cast<float>(phasekv_test::fp8::bf16_value(phasekv_test::fp8::bf16_nearest(q)));
    const std::vector<double> got =
        kit::oracle_indexer_scores(queries.data(), weights.data(), heads, channels, key_rows, bf16);
    const std::vector<double> want = phasekv_test::indexer_scores(twin_queries, weights, keys, channels);
    REQUIRE(got.size() == want.size());
    for (std::int64_t k = 0; k < n; ++k) {
      // The terms: Σ_h |w_h| · Σ_c |q_hc · k_c|.
      double terms = 0.0;
      for (std::int64_t h = 0; h < heads; ++h) {
        double dot = 0.0;
        for (std::int64_t c = 0; c < channels; ++c)
          dot += std::abs(static_cast<double>(twin_queries[sz(h * channels + c)]) * keys[sz(k)][sz(c)]);
        terms += std::abs(static_cast<double>(weights[sz(h)])) * dot;
      }
      INFO("key " << k << ": the kit " << got[sz(k)] << ", the twin " << want[sz(k)]);
      REQUIRE(std::abs(got[sz(k)] - want[sz(k)]) <= rel * terms);
    }
  }
}

}  // namespace test_testing_oracles
