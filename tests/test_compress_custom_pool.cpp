// Pooling policies of the host's (compress/policies.hpp, "Your own pooling"), through the two
// worked examples in examples/pools/:
//
//   - max pooling and NSA's MLP compressor against double-precision oracles written from their
//     maths, over the raw tokens (padding slots at the sequence start included), in a paged cache;
//   - bf16 inputs give exactly the entries of their fp32 widening;
//   - per-slot weights reach entry_view::slot_weights (write profiles read them);
//   - snapshots carry the policy's identity: a cache with other weights or another policy
//     refuses them, one with the same restores the same bytes;
//   - configuration errors name the field.
// The streaming invariant for them is in test_compress_streaming.cpp.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support/prelude.hpp"
#include "support/common.hpp"
#include "../examples/pools/max_pool.hpp"
#include "../examples/pools/nsa_mlp_pool.hpp"
#include "support/random_inputs.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"

namespace test_compress_custom_pool {

namespace {

using namespace phasekv_test::prelude;
using phasekv_examples::max_pool;
using phasekv_examples::nsa_mlp_pool;
using max_stream = stream_compressor<compressor_policy<max_pool>>;
using mlp_stream = stream_compressor<compressor_policy<nsa_mlp_pool>>;

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L && __has_include(<concepts>)
static_assert(pooling_policy<max_pool> && pooling_policy<nsa_mlp_pool>, "the examples satisfy the concept");
static_assert(!pooling_policy<mean_pool>, "a built-in tag is not a policy of the host's");
#endif

stream_config config(i64 heads, i64 channels) {
  stream_config c;
  c.name = "kv";
  c.kv_heads = heads;
  c.channels = channels;
  c.inputs = input_layout::per_slot;  // one row per (token, slot): the oracle reads token t's row for slot i
  return c;
}

// Token t's payload row for KV head h and slot i (per-slot layout: [t][h][slot][C]).
const float* row_of(const std::vector<float>& x, i64 t, i64 h, i64 slot, i64 heads, i64 window, i64 c) {
  return x.data() + ((t * heads + h) * window + slot) * c;
}

nsa_mlp_pool random_mlp(i64 window, i64 channels, i64 hidden, std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto draw = [&](i64 n, float scale) { return phasekv_test::random_uniform(rng, sz(n), -scale, scale); };
  return nsa_mlp_pool(window, channels, hidden, draw(window * channels, 0.5f), draw(hidden * window * channels, 0.3f),
                      draw(hidden, 0.1f), draw(channels * hidden, 0.3f), draw(channels, 0.1f));
}

// NSA's MLP in double from its weights (the pool's parameters(): position, w1, b1, w2, b2).
std::vector<double> mlp_oracle(const nsa_mlp_pool& p, const std::vector<const float*>& slots, i64 window, i64 c, i64 hidden) {
  const span<const float> w = p.parameters();
  const float* pe = w.data();
  const float* w1 = pe + window * c;
  const float* b1 = w1 + hidden * window * c;
  const float* w2 = b1 + hidden;
  const float* b2 = w2 + c * hidden;
  std::vector<double> z(sz(window * c), 0.0), h(sz(hidden)), out(sz(c));
  for (i64 i = 0; i < window; ++i)
    if (slots[sz(i)])
      for (i64 k = 0; k < c; ++k) z[sz(i * c + k)] = double(slots[sz(i)][k]) + pe[i * c + k];
  for (i64 d = 0; d < hidden; ++d) {
    double s = b1[d];
    for (i64 i = 0; i < window * c; ++i) s += double(w1[d * window * c + i]) * z[sz(i)];
    h[sz(d)] = std::max(s, 0.0);
  }
  for (i64 k = 0; k < c; ++k) {
    double s = b2[k];
    for (i64 d = 0; d < hidden; ++d) s += double(w2[k * hidden + d]) * h[sz(d)];
    out[sz(k)] = s;
  }
  return out;
}

TEST_CASE("custom pooling: max and NSA's MLP equal their double oracles in a paged cache", "[compress][custom_pool][oracle]") {
  const i64 H = 2, C = 6, D = 5, T = 29;
  for (const geometry g : {geometry{4, 4}, geometry{2, 6}, geometry{3, 5, 1}}) {
    INFO("S = " << g.stride << ", W = " << g.window << ", origin = " << g.origin);
    std::mt19937 rng(static_cast<std::uint32_t>(g.stride * 10 + g.window));
    const nsa_mlp_pool mlp = random_mlp(g.window, C, D, 77);
    cache_config cc;
    cc.name = "custom";
    cc.page_size = 3;
    cc.pages = 32;
    using cache_t = paged_cache<max_stream, mlp_stream>;
    cache_t cache(cache_t::layer(max_stream(g, config(H, C)), mlp_stream(g, config(H, C), {}, mlp)), cc);
    const sequence_id seq = cache.create();
    const i64 per_token = H * g.window * C;
    const auto x = phasekv_test::random_uniform(rng, sz(T * per_token), -1.0f, 1.0f);
    i64 done = 0;
    for (const i64 n : {7, 1, 13, 8}) {
      const span<const float> part(x.data() + done * per_token, sz(n * per_token));
      cache.append(seq, {token_chunk{n, part, {}}, token_chunk{n, part, {}}});
      done += n;
    }
    const i64 entries = cache.entries(seq, 0);
    REQUIRE(entries == g.completed_entries(T));
    double worst = 0.0;
    for (i64 j = 0; j < entries; ++j)
      for (i64 h = 0; h < H; ++h) {
        std::vector<const float*> slots(sz(g.window), nullptr);  // null: a slot before token 0
        for (i64 i = 0; i < g.window; ++i) {
          const i64 t = g.slot_token(j, i);
          if (t >= 0) slots[sz(i)] = row_of(x, t, h, i, H, g.window, C);
        }
        std::vector<float> got(sz(H * C)), got_mlp(sz(H * C));
        cache.read_entry(seq, 0, j, got.data());
        cache.read_entry(seq, 1, j, got_mlp.data());
        for (i64 c = 0; c < C; ++c) {
          float want = -INFINITY;
          for (const float* s : slots)
            if (s) want = std::max(want, s[c]);
          CHECK(got[sz(h * C + c)] == want);  // max is exact
        }
        const std::vector<double> want_mlp = mlp_oracle(mlp, slots, g.window, C, D);
        for (i64 c = 0; c < C; ++c)
          worst = std::max(worst, std::abs(double(got_mlp[sz(h * C + c)]) - want_mlp[sz(c)]) / std::max(1.0, std::abs(want_mlp[sz(c)])));
      }
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("custom pooling: bf16 inputs give the entries of their fp32 widening; slot weights reach the entries",
          "[compress][custom_pool]") {
  const geometry g{2, 4};
  const i64 H = 1, C = 8, T = 23;
  const max_stream s(g, config(H, C));
  std::mt19937 rng(5);
  const auto x = phasekv_test::random_uniform(rng, sz(T * H * g.window * C), -2.0f, 2.0f);
  std::vector<std::uint16_t> bits(x.size());
  std::vector<float> widened(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) widened[i] = bf16_to_float(bits[i] = float_to_bf16(x[i]));
  append_options options;
  options.slot_weights = true;
  entry_buffer from_bits, from_floats;
  for (const bool use_bits : {true, false}) {
    stream_state st = s.make_state();
    for (i64 t = 0; t < T; t += 5) {
      const i64 n = std::min<i64>(5, T - t);
      token_chunk chunk;
      chunk.tokens = n;
      if (use_bits) chunk.payload_bf16 = span<const std::uint16_t>(bits.data() + t * g.window * C, sz(n * g.window * C));
      else chunk.payload = span<const float>(widened.data() + t * g.window * C, sz(n * g.window * C));
      s.append(st, chunk, use_bits ? from_bits : from_floats, options);
    }
  }
  CHECK(from_bits.all_values() == from_floats.all_values());
  // Max pooling's slot weights: the share of channels each real slot holds the maximum of.
  std::vector<float> weights;
  stream_state st = s.make_state();
  token_chunk chunk{T, widened, {}};
  i64 checked = 0;
  s.append(st, chunk, [&](const entry_view& e) {
    REQUIRE(e.slot_weights != nullptr);
    float total = 0.0f;
    for (i64 i = 0; i < g.window; ++i) total += e.slot_weights[i];
    CHECK(total == Approx(1.0f));
    for (i64 i = 0; i < g.first_real_slot(e.index); ++i) CHECK(e.slot_weights[i] == 0.0f);
    ++checked;
  }, options);
  CHECK(checked == g.completed_entries(T));
}

TEST_CASE("custom pooling: snapshots carry the policy's identity and weights", "[compress][custom_pool][snapshot]") {
  const geometry g{4, 4};
  const i64 C = 6;
  using cache_t = paged_cache<mlp_stream>;
  cache_config cc;
  cc.name = "mlp";
  cc.page_size = 2;
  cc.pages = 16;
  auto make = [&](std::uint32_t seed) { return cache_t(cache_t::layer(mlp_stream(g, config(1, C), {}, random_mlp(4, C, 3, seed))), cc); };
  cache_t a = make(1), same = make(1), other = make(2);
  const sequence_id s = a.create();
  std::mt19937 rng(9);
  const auto x = phasekv_test::random_uniform(rng, sz(10 * 4 * C), -1.0f, 1.0f);
  a.append(s, {token_chunk{10, x, {}}});
  const std::vector<std::byte> bytes = snapshot(a, s);
  const sequence_id back = restore(same, span<const std::byte>(bytes));
  CHECK(snapshot(same, back) == bytes);
  CHECK_THROWS_WITH(restore(other, span<const std::byte>(bytes)), Contains("pooling a policy of the host's (identity 0x"));
  using max_cache = paged_cache<max_stream>;
  max_cache m(max_cache::layer(max_stream(g, config(1, C))), cc);
  CHECK_THROWS_WITH(restore(m, span<const std::byte>(bytes)), Contains("does not match the cache's"));
  CHECK(other.sequences() == 0);
}

TEST_CASE("custom pooling: configurations that do not fit are errors naming the field", "[compress][custom_pool][errors]") {
  stream_params p;
  p.slot_bias = std::vector<float>(4 * 6, 0.0f);
  CHECK_THROWS_WITH(max_stream(geometry{4, 4}, config(1, 6), p),
                    "kv.slot_bias.size() = 24: must be 0: the pooling policy 'max' keeps its own parameters");
  // A policy built for another window refuses to pool (its own check, thrown from the append).
  const mlp_stream wrong(geometry{2, 4}, config(1, 6), {}, random_mlp(8, 6, 3, 1));
  stream_state st = wrong.make_state();
  const std::vector<float> x(4 * 4 * 6, 0.5f);
  CHECK_THROWS_WITH(wrong.append(st, token_chunk{4, x, {}}, [](const entry_view&) {}), Contains("built for W = 8"));
  CHECK(st.tokens() == 0);
}

}  // namespace

}  // namespace test_compress_custom_pool
