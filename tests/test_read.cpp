// The sparse-attention reader (include/phasekv/read/*): softmax_state, select_top_k and
// sparse_reader, held to the double-precision twin in oracle/scalar_attention.hpp.
//
//   - the dense control (docs/DESIGN.md §5): S = W = 1, mean pooling, no RoPE, no selection, no
//     window reproduces plain causal attention over the raw tokens, with GQA/MQA, separate and
//     tied K/V, with and without a sink — the library's master oracle;
//   - softmax_state: any split merged in any order equals no split; empty parts; sinks; huge logits;
//   - select_top_k against sorting everything, with many ties;
//   - the lightning indexer and top-k through the reader, with exact arithmetic (inputs are small
//     dyadic rationals, so fp32 scores equal the double ones and ties are exact), the trace's
//     selection, scores and masses, and the output over exactly those entries + the window;
//   - tied K/V with de-rotation of the output's RoPE channels;
//   - DeepSeek-V4 CSA end to end: decoding token by token equals reading after a prefill;
//   - bad requests (input_error, cache untouched) and bad reader configurations (config_error).
//
// Tolerance: an output element `got` is close to the oracle's `want` when
//   |got − want| ≤ 1e-5 · max(|want|, value_scale),
// value_scale = the largest |element| of the values attended over. Outputs are (sub-)convex
// combinations of the values, so value_scale bounds them; the max() keeps the test relative for
// large outputs and absolute (in units of the value scale) for outputs that cancel to near 0.

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "phasekv/detail/simd/intrinsics.hpp"  // before Eigen, which includes the intrinsics too
#include <Eigen/Core>

#include "support/prelude.hpp"
#include "support/read_result.hpp"
#include "support/message_of.hpp"
#include "support/random_inputs.hpp"
#include "oracle/scalar_attention.hpp"
#include "support/thread_executor.hpp"
#include "support/read_world.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/core/executor.hpp"
#include "phasekv/core/openmp_executor.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/read/softmax_state.hpp"
#include "phasekv/read/sparse_reader.hpp"
#include "phasekv/read/detail/top_k.hpp"

namespace test_read {

namespace {

using namespace phasekv_test::prelude;
using phasekv_test::attention_shape;

using namespace phasekv_test::read_support;  // support/read_world.hpp: helpers and the selection world

using rope_stream = stream_compressor<compressor_policy<mean_pool, rope_after_pool>>;
using csa_stream = stream_compressor<presets::deepseek_v4_csa_policy>;

// Everything a read must leave as it was.
template <class Cache>
struct cache_snapshot {
  i64 tokens = 0;
  i64 window_first = 0;
  std::vector<i64> entries, used_pages;
  std::vector<std::vector<page_id>> tables;
  std::vector<std::vector<float>> first_entries;

  cache_snapshot(const Cache& cache, sequence_id seq) {
    tokens = cache.tokens(seq);
    window_first = cache.window_first(seq);
    for (std::size_t k = 0; k < Cache::stream_count; ++k) {
      entries.push_back(cache.entries(seq, k));
      used_pages.push_back(cache.pool(k).used_pages());
      tables.push_back(cache.page_table(seq, k));
      const i64 floats = cache.compressors().config(k).kv_heads * cache.compressors().config(k).channels;
      if (entries.back() > 0) first_entries.push_back(entry_of(cache, seq, k, 0, floats));
    }
  }
  bool operator==(const cache_snapshot& o) const {
    return tokens == o.tokens && window_first == o.window_first && entries == o.entries && used_pages == o.used_pages &&
           tables == o.tables && first_entries == o.first_entries;
  }
};

// ---- 1. the dense control ---------------------------------------------------------------------

struct dense_case {
  attention_shape shape;
  i64 tokens = 0;
  i64 page_size = 4;
  float query_scale = 1.0f;  // larger: peakier attention
  float logit_scale = 0.0f;  // reader_config.scale; 0 = 1/sqrt(key channels)
};

// Reads every position 0 … T−1 after one prefill and compares with plain causal attention over
// the raw tokens. `keys`/`values` are the tokens the cache was filled with ([T][kv_heads][C]).
template <class Cache>
void check_dense_reads(Cache& cache, sequence_id seq, const dense_case& c, bool tied, bool sink,
                       const std::vector<float>& keys, const std::vector<float>& values, std::mt19937& rng) {
  const attention_shape& s = c.shape;
  reader_config rc;
  rc.name = "dense";
  rc.query_heads = s.query_heads;
  rc.key_stream = 0;
  rc.value_stream = tied ? 0 : 1;
  rc.sink = sink;
  rc.scale = c.logit_scale;
  sparse_reader reader(cache, rc);
  REQUIRE(reader.output_floats() == s.query_heads * s.value_channels);
  const double scale =
      c.logit_scale > 0.0f ? static_cast<double>(c.logit_scale) : 1.0 / std::sqrt(static_cast<double>(s.key_channels));
  const double value_scale = max_abs(values.data(), values.size());
  std::vector<float> out(sz(s.query_heads * s.value_channels));
  read_trace trace;
  for (i64 t = 0; t < c.tokens; ++t) {
    const auto q = uniform(rng, sz(s.query_heads * s.key_channels), -c.query_scale, c.query_scale);
    const auto sinks = sink ? uniform(rng, sz(s.query_heads), -2.0f, 3.0f) : std::vector<float>{};
    read_request rq{t, q, {}, {}, sinks};
    reader.read(cache, seq, rq, out.data(), &trace);
    const auto want =
        phasekv_test::causal_attention(s, q.data(), keys, values, t, scale, sink ? sinks.data() : nullptr);
    INFO("position " << t);
    CHECK(mismatch(out.data(), want, value_scale) == "");
    // Without selection the trace lists every candidate in index order, and no window.
    CHECK(trace.candidates == t + 1);
    std::vector<i64> all(sz(t + 1));
    std::iota(all.begin(), all.end(), i64{0});
    CHECK(trace.selected == all);
    CHECK(trace.scores.empty());
    CHECK(trace.window_token_mass.empty());
    CHECK(trace.window_mass == 0.0f);
    const double total = std::accumulate(trace.entry_mass.begin(), trace.entry_mass.end(), 0.0) + trace.sink_mass;
    CHECK(total == Approx(1.0).margin(1e-5));
    if (!sink) CHECK(trace.sink_mass == 0.0f);
  }
}

TEST_CASE("sparse_reader dense control: S = W = 1 reproduces causal attention over the raw tokens", "[read][oracle]") {
  const std::vector<dense_case> cases = {
      {{1, 1, 8, 8}, 12, 4, 1.0f},          // one head
      {{8, 2, 16, 12}, 33, 5, 3.0f},        // GQA 4:1, peaky, key and value channels differ
      {{4, 1, 32, 8}, 40, 7, 1.0f},         // MQA
      {{6, 3, 5, 7}, 17, 1, 2.0f},          // GQA 2:1, odd channels, one entry per page
      {{3, 3, 64, 64}, 21, 64, 0.5f},       // MHA, one page
      {{4, 2, 12, 6}, 25, 3, 1.0f, 0.37f},  // explicit logit scale
  };
  std::mt19937 rng(20260301);
  for (const dense_case& c : cases) {
    for (int tied = 0; tied < 2; ++tied) {
      for (int sink = 0; sink < 2; ++sink) {
        attention_shape s = c.shape;
        if (tied) s.value_channels = s.key_channels;
        dense_case cs = c;
        cs.shape = s;
        INFO("heads " << s.query_heads << "/" << s.kv_heads << " channels " << s.key_channels << "/" << s.value_channels
                      << " T " << c.tokens << (tied ? " tied" : " separate") << (sink ? " sink" : ""));
        cache_config cc;
        cc.name = "dense";
        cc.page_size = c.page_size;
        cc.pages = 64;
        const geometry g = geometry{1, 1};
        const auto keys = uniform(rng, sz(c.tokens * s.kv_heads * s.key_channels), -1.0f, 1.0f);
        if (tied) {
          paged_cache<mean_stream> cache(layer_compressor<mean_stream>(mean_stream(
                                             g, make_stream("kv", stream_role::key_value, s.kv_heads, s.key_channels))),
                                         cc);
          const sequence_id seq = cache.create();
          cache.append(seq, {token_chunk{c.tokens, keys, {}}});
          check_dense_reads(cache, seq, cs, true, sink != 0, keys, keys, rng);
        } else {
          const auto values = uniform(rng, sz(c.tokens * s.kv_heads * s.value_channels), -1.0f, 1.0f);
          using cache_t = paged_cache<mean_stream, mean_stream>;
          cache_t cache(layer_compressor<mean_stream, mean_stream>(
                            mean_stream(g, make_stream("k", stream_role::key, s.kv_heads, s.key_channels)),
                            mean_stream(g, make_stream("v", stream_role::value, s.kv_heads, s.value_channels))),
                        cc);
          const sequence_id seq = cache.create();
          cache.append(seq, {token_chunk{c.tokens, keys, {}}, token_chunk{c.tokens, values, {}}});
          check_dense_reads(cache, seq, cs, false, sink != 0, keys, values, rng);
        }
      }
    }
  }
}

// ---- 2. softmax_state --------------------------------------------------------------------------

using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
const float kNegInf = -std::numeric_limits<float>::infinity();

softmax_state state_of(const matrix& logits, const matrix& values, const std::vector<i64>& keys) {
  matrix l(logits.rows(), static_cast<Eigen::Index>(keys.size()));
  matrix v(static_cast<Eigen::Index>(keys.size()), values.cols());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    l.col(static_cast<Eigen::Index>(i)) = logits.col(keys[i]);
    v.row(static_cast<Eigen::Index>(i)) = values.row(keys[i]);
  }
  softmax_state s(logits.rows(), values.cols());
  s.assign_block(l.data(), l.cols(), v.data());
  return s;
}

std::vector<float> finished(const softmax_state& s, const float* sinks) {
  std::vector<float> out(sz(s.heads() * s.channels()), -7.0f);
  s.finish(out.data(), sinks);
  return out;
}

// The oracle's output for all heads over all keys.
std::vector<double> joint_oracle(const matrix& logits, const matrix& values, const float* sinks,
                                 std::vector<double>* sink_probability = nullptr) {
  std::vector<double> out;
  std::vector<std::vector<double>> rows(sz(values.rows()));
  std::vector<const double*> pointers;
  for (Eigen::Index i = 0; i < values.rows(); ++i) {
    for (Eigen::Index c = 0; c < values.cols(); ++c) rows[sz(i)].push_back(values(i, c));
    pointers.push_back(rows[sz(i)].data());
  }
  for (Eigen::Index h = 0; h < logits.rows(); ++h) {
    std::vector<double> l;
    for (Eigen::Index i = 0; i < logits.cols(); ++i) l.push_back(logits(h, i));
    const double sink = sinks ? sinks[h] : 0.0;
    const auto r = phasekv_test::joint_softmax(l, pointers, values.cols(), sinks ? &sink : nullptr);
    out.insert(out.end(), r.output.begin(), r.output.end());
    if (sink_probability) sink_probability->push_back(r.sink_probability);
  }
  return out;
}

bool same_state(const softmax_state& a, const softmax_state& b) {
  if (a.heads() != b.heads() || a.channels() != b.channels()) return false;
  for (i64 h = 0; h < a.heads(); ++h) {
    if (a.empty(h) != b.empty(h)) return false;
    if (a.empty(h)) continue;
    if (a.max_logit(h) != b.max_logit(h) || a.denominator(h) != b.denominator(h)) return false;
    const span<const float> x = a.accumulator(h), y = b.accumulator(h);
    if (!std::equal(x.begin(), x.end(), y.begin())) return false;
  }
  return true;
}

// a merged with b.
softmax_state merged(softmax_state a, const softmax_state& b) {
  a.merge(b);
  return a;
}

// Whether the selection holds the entries first + want[r], in want's order (sizes checked apart).
bool same_indices(const std::vector<scored_entry>& out, const std::vector<i64>& want, i64 first = 0) {
  for (std::size_t r = 0; r < want.size(); ++r)
    if (out[r].index != first + want[r]) return false;
  return true;
}

// Random partition of keys 0 … n−1 into `parts` parts (some possibly empty), merged as a random
// binary tree (random pairs, either direction), so every order and association is exercised.
softmax_state merge_random_split(const matrix& logits, const matrix& values, int parts, std::mt19937& rng) {
  std::vector<std::vector<i64>> split(sz(parts));
  std::uniform_int_distribution<int> pick(0, parts - 1);
  for (i64 i = 0; i < logits.cols(); ++i) split[sz(pick(rng))].push_back(i);
  std::vector<softmax_state> states;
  for (const auto& keys : split) states.push_back(state_of(logits, values, keys));
  while (states.size() > 1) {
    std::uniform_int_distribution<std::size_t> which(0, states.size() - 1);
    const std::size_t a = which(rng);
    std::size_t b = which(rng);
    if (a == b) b = (a + 1) % states.size();
    states[a].merge(states[b]);
    states.erase(states.begin() + static_cast<std::ptrdiff_t>(b));
  }
  return states.front();
}

matrix random_matrix(std::mt19937& rng, i64 rows, i64 cols, float lo, float hi) {
  const auto v = uniform(rng, sz(rows * cols), lo, hi);
  matrix m(rows, cols);
  std::copy(v.begin(), v.end(), m.data());
  return m;
}

TEST_CASE("softmax_state: any split, merged in any order, equals no split", "[read][softmax]") {
  std::mt19937 rng(11);
  const i64 heads = 4, channels = 5;
  for (int trial = 0; trial < 300; ++trial) {
    const i64 n = std::uniform_int_distribution<i64>(0, 40)(rng);
    matrix logits = random_matrix(rng, heads, n, -6.0f, 6.0f);
    // Masked keys (−∞) per head, and a head with every key masked now and then.
    std::bernoulli_distribution mask(0.15);
    for (i64 h = 0; h < heads; ++h)
      for (i64 i = 0; i < n; ++i)
        if (mask(rng)) logits(h, i) = kNegInf;
    if (trial % 7 == 0) logits.row(trial % heads).setConstant(kNegInf);
    const matrix values = random_matrix(rng, n, channels, -1.0f, 1.0f);
    const std::vector<float> sinks = uniform(rng, sz(heads), -3.0f, 3.0f);
    const int parts = std::uniform_int_distribution<int>(1, 5)(rng);
    INFO("trial " << trial << ": " << n << " keys in " << parts << " parts");

    std::vector<i64> all(sz(n));
    std::iota(all.begin(), all.end(), i64{0});
    const softmax_state whole = state_of(logits, values, all);
    const softmax_state merged = merge_random_split(logits, values, parts, rng);
    for (i64 h = 0; h < heads; ++h) {
      REQUIRE(merged.empty(h) == whole.empty(h));
      if (whole.empty(h)) continue;
      CHECK(merged.max_logit(h) == whole.max_logit(h));  // a max is exact, whatever the order
      CHECK(merged.denominator(h) == Approx(whole.denominator(h)).epsilon(1e-6));
    }
    for (const float* s : {static_cast<const float*>(nullptr), sinks.data()}) {
      const auto want = joint_oracle(logits, values, s);
      CHECK(mismatch(finished(merged, s).data(), want, 1.0) == "");
      CHECK(mismatch(finished(whole, s).data(), want, 1.0) == "");
    }
  }
}

TEST_CASE("softmax_state: the empty state is the identity of merge", "[read][softmax]") {
  std::mt19937 rng(12);
  const matrix logits = random_matrix(rng, 3, 9, -4.0f, 4.0f);
  const matrix values = random_matrix(rng, 9, 6, -1.0f, 1.0f);
  const softmax_state x = state_of(logits, values, {0, 2, 3, 5, 8});
  const softmax_state empty(3, 6);
  for (i64 h = 0; h < 3; ++h) {
    CHECK(empty.empty(h));
    CHECK(empty.denominator(h) == 0.0f);
    CHECK(empty.max_logit(h) == kNegInf);
  }
  CHECK(same_state(merged(x, empty), x));
  CHECK(same_state(merged(empty, x), x));
  CHECK(same_state(merged(empty, empty), empty));
  // An empty block (no keys) is empty too.
  CHECK(same_state(state_of(logits, values, {}), empty));
  // Empty states finish to zeros, with or without a sink.
  const std::vector<float> sinks = {0.5f, -1.0f, 20.0f};
  for (const float* s : {static_cast<const float*>(nullptr), sinks.data()})
    for (float v : finished(empty, s)) CHECK(v == 0.0f);
}

TEST_CASE("softmax_state: keys whose logits are all -inf leave the state empty", "[read][softmax]") {
  std::mt19937 rng(13);
  matrix logits(2, 4);
  logits.setConstant(kNegInf);
  const matrix values = random_matrix(rng, 4, 3, -1.0f, 1.0f);
  const softmax_state s = state_of(logits, values, {0, 1, 2, 3});
  for (i64 h = 0; h < 2; ++h) {
    CHECK(s.empty(h));
    CHECK(s.denominator(h) == 0.0f);
    for (const float x : s.accumulator(h)) CHECK(x == 0.0f);
  }
  const std::vector<float> sinks = {1.0f, -1.0f};
  for (const float* sk : {static_cast<const float*>(nullptr), sinks.data()})
    for (float v : finished(s, sk)) CHECK(v == 0.0f);
  // Merging it with a real state changes nothing, in either direction.
  matrix real = random_matrix(rng, 2, 4, -2.0f, 2.0f);
  const softmax_state x = state_of(real, values, {1, 3});
  CHECK(same_state(merged(x, s), x));
  CHECK(same_state(merged(s, x), x));
}

TEST_CASE("softmax_state: the sink takes mass in the denominator only", "[read][softmax]") {
  std::mt19937 rng(14);
  const i64 heads = 5, n = 12, channels = 4;
  for (int trial = 0; trial < 50; ++trial) {
    const matrix logits = random_matrix(rng, heads, n, -5.0f, 5.0f);
    const matrix values = random_matrix(rng, n, channels, -1.0f, 1.0f);
    // Sinks from far below to far above the logits.
    std::vector<float> sinks = uniform(rng, sz(heads), -8.0f, 8.0f);
    sinks[0] = -1e4f;
    sinks[1] = 1e4f;
    std::vector<i64> all(sz(n));
    std::iota(all.begin(), all.end(), i64{0});
    const softmax_state s = merge_random_split(logits, values, 3, rng);
    std::vector<double> sink_probability;
    const auto want = joint_oracle(logits, values, sinks.data(), &sink_probability);
    INFO("trial " << trial);
    CHECK(mismatch(finished(s, sinks.data()).data(), want, 1.0) == "");
    for (i64 h = 0; h < heads; ++h) {
      // Σ_i exp(ℓ_i − m) · normaliser = the probability the keys hold = 1 − p_sink.
      const double keys_mass =
          static_cast<double>(s.denominator(h)) * static_cast<double>(s.normaliser(h, sinks.data()));
      CHECK(keys_mass == Approx(1.0 - sink_probability[sz(h)]).margin(1e-6));
      CHECK(static_cast<double>(s.denominator(h)) * s.normaliser(h, nullptr) == Approx(1.0).epsilon(1e-6));
    }
    // A sink far above every logit leaves (almost) nothing; far below, it changes nothing.
    const auto out = finished(s, sinks.data());
    for (i64 c = 0; c < channels; ++c) CHECK(std::abs(out[sz(channels + c)]) < 1e-30);
    const auto plain = finished(s, nullptr);
    for (i64 c = 0; c < channels; ++c) CHECK(out[sz(c)] == Approx(plain[sz(c)]).epsilon(1e-6).margin(1e-7));
  }
}

TEST_CASE("softmax_state: logits spread over +-1e4 stay finite and exact", "[read][softmax]") {
  std::mt19937 rng(15);
  const i64 heads = 3, n = 30, channels = 4;
  for (int trial = 0; trial < 40; ++trial) {
    // ±1e4 + k/64: exact in fp32, so the kernel and the oracle see the same softmax arguments.
    phasekv_test::logit_options big;
    big.magnitude = 1e4;
    big.signs = trial % 3 == 0   ? phasekv_test::logit_signs::positive
                : trial % 3 == 1 ? phasekv_test::logit_signs::negative
                                 : phasekv_test::logit_signs::mixed;
    const auto l = phasekv_test::random_logits(rng, sz(heads * n), big);
    matrix logits(heads, n);
    std::copy(l.begin(), l.end(), logits.data());
    const matrix values = random_matrix(rng, n, channels, -1.0f, 1.0f);
    const std::vector<float> sinks = phasekv_test::random_logits(rng, sz(heads), big);
    const softmax_state s = merge_random_split(logits, values, 1 + trial % 5, rng);
    INFO("trial " << trial);
    for (i64 h = 0; h < heads; ++h) {
      CHECK(std::isfinite(s.denominator(h)));
      CHECK(std::isfinite(s.normaliser(h, sinks.data())));
    }
    for (const float* sk : {static_cast<const float*>(nullptr), sinks.data()})
      CHECK(mismatch(finished(s, sk).data(), joint_oracle(logits, values, sk), 1.0) == "");
  }
}

// ---- 3. select_top_k ---------------------------------------------------------------------------

TEST_CASE("select_top_k equals sorting everything (score descending, index ascending)", "[read][top_k]") {
  std::mt19937 rng(21);
  std::vector<scored_entry> out = {{99, 9.0f}, {98, 8.0f}};  // stale contents must not leak
  for (int trial = 0; trial < 600; ++trial) {
    const i64 n = std::uniform_int_distribution<i64>(0, 70)(rng);
    std::vector<float> scores;
    switch (trial % 3) {
      case 0:
        scores = multiples(rng, sz(n), 1.0, 0, 2);
        break;  // {0, 1, 2}: ties everywhere
      case 1:
        scores = multiples(rng, sz(n), 0.5, -3, 3);
        break;  // ties and negative scores
      default:
        scores = uniform(rng, sz(n), -1.0f, 1.0f);
        break;
    }
    const i64 ks[] = {0, 1, std::uniform_int_distribution<i64>(0, n + 2)(rng), n, n + 5};
    for (i64 k : ks) {
      INFO("trial " << trial << ", n " << n << ", k " << k);
      select_top_k(scores, k, out);
      const auto want = phasekv_test::top_k_by_sort(scores, k);
      REQUIRE(out.size() == want.size());
      for (std::size_t r = 0; r < want.size(); ++r) {
        CHECK(out[r].index == want[r]);
        CHECK(out[r].score == scores[sz(want[r])]);
      }
      // Deterministic: the same answer again, from a fresh vector.
      std::vector<scored_entry> again;
      select_top_k(scores, k, again);
      REQUIRE(again.size() == out.size());
      for (std::size_t r = 0; r < out.size(); ++r) CHECK(again[r].index == out[r].index);
    }
  }
}

TEST_CASE("select_top_k: all scores equal keeps the lowest indices; large n", "[read][top_k]") {
  std::vector<scored_entry> out;
  const std::vector<float> flat(1000, 0.25f);
  select_top_k(flat, 7, out);
  REQUIRE(out.size() == 7);
  for (std::size_t r = 0; r < 7; ++r) CHECK(out[r].index == static_cast<i64>(r));

  std::mt19937 rng(22);
  const auto many = multiples(rng, 20000, 1.0, 0, 9);
  select_top_k(many, 512, out);
  const auto want = phasekv_test::top_k_by_sort(many, 512);
  REQUIRE(out.size() == want.size());
  CHECK(same_indices(out, want));

  // NaN scores (which callers should not produce) rank last.
  const std::vector<float> with_nan = {1.0f, std::nanf(""), 2.0f};
  select_top_k(with_nan, 3, out);
  REQUIRE(out.size() == 3);
  CHECK(out[0].index == 2);
  CHECK(out[1].index == 0);
  CHECK(out[2].index == 1);
}

TEST_CASE("select_top_k between 64 and 2048 scores and at indices near 2^32: the radix sort's order",
          "[read][top_k]") {
  // The sorted selection runs a byte-wise radix sort from 64 keys up, with or without the
  // histogram narrowing before it (from 1024 keys): every byte of the scores and of the indices
  // must take part in the order, including the high bytes of indices near 2^32 (first_index),
  // and bytes every key shares must be skipped without disturbing it.
  std::mt19937 rng(24);
  std::vector<scored_entry> out;
  const i64 firsts[] = {0, 255, i64{1} << 24, (i64{1} << 32) - 5000};
  for (int trial = 0; trial < 60; ++trial) {
    const i64 n = std::uniform_int_distribution<i64>(64, 2047)(rng);
    std::vector<float> scores;
    switch (trial % 4) {
      case 0:
        scores = multiples(rng, sz(n), 1.0, -3, 3);  // ties: the index bytes decide
        break;
      case 1:
        scores = uniform(rng, sz(n), 0.5f, 0.50001f);  // one exponent, a few mantissa bits
        break;
      case 2:
        scores = uniform(rng, sz(n), -1e30f, 1e30f);
        scores[0] = INFINITY;
        scores[1] = -0.0f;
        scores[2] = 0.0f;
        break;
      default:
        scores.assign(sz(n), 7.0f);
        break;
    }
    const i64 first = firsts[trial % 4];
    for (i64 k : {i64{1}, i64{63}, i64{512}, n / 2, n}) {
      INFO("trial " << trial << ", n " << n << ", k " << k << ", first index " << first);
      select_top_k(scores, k, out, first);
      const auto want = phasekv_test::top_k_by_sort(scores, k);
      REQUIRE(out.size() == want.size());
      CHECK(same_indices(out, want, first));
    }
  }
}

TEST_CASE("narrow_to_top_keys keeps every one of the top k and only keys it was given", "[read][top_k]") {
  std::mt19937 rng(25);
  for (int trial = 0; trial < 40; ++trial) {
    const i64 n = std::uniform_int_distribution<i64>(0, 9000)(rng);
    const auto scores = trial % 2 == 0 ? uniform(rng, sz(n), -5.0f, 5.0f) : multiples(rng, sz(n), 0.5, -4, 4);
    for (i64 k : {i64{0}, i64{1}, i64{512}, n - 1, n + 3}) {
      std::vector<std::uint64_t> keys;
      rank_keys(scores, 0, keys);
      const std::vector<std::uint64_t> given = keys;
      narrow_to_top_keys(keys, k);
      const auto want = phasekv_test::top_k_by_sort(scores, k);
      INFO("trial " << trial << ", n " << n << ", k " << k << ", kept " << keys.size());
      CHECK(keys.size() >= want.size());
      CHECK(keys.size() <= given.size());
      std::vector<std::uint64_t> sorted_keys = keys, sorted_given = given;
      std::sort(sorted_keys.begin(), sorted_keys.end());
      std::sort(sorted_given.begin(), sorted_given.end());
      CHECK(std::includes(sorted_given.begin(), sorted_given.end(), sorted_keys.begin(), sorted_keys.end()));
      bool all_top = true;
      for (i64 j : want)
        all_top = all_top && std::binary_search(sorted_keys.begin(), sorted_keys.end(), rank_key(scores[sz(j)], j));
      CHECK(all_top);
    }
  }
}

TEST_CASE("select_top_k on thousands of scores: the histogram narrowing drops no winner", "[read][top_k]") {
  // n >= 1024 takes the histogram path of keep_top_keys. Distributions that stress its bins: a
  // narrow cluster with a few far outliers (most bins empty, the cut inside the cluster), ties
  // straddling the cut, negatives with ±inf and ±0, and all equal. (NaN ranks last, checked
  // above; the sorting oracle cannot place it.)
  std::mt19937 rng(23);
  std::vector<scored_entry> out;
  for (int trial = 0; trial < 40; ++trial) {
    const i64 n = std::uniform_int_distribution<i64>(2048, 9000)(rng);
    std::vector<float> scores;
    switch (trial % 4) {
      case 0:
        scores = uniform(rng, sz(n), 1.0f, 1.0001f);
        for (int o = 0; o < 5; ++o) scores[sz(std::uniform_int_distribution<i64>(0, n - 1)(rng))] = 1e30f;
        break;
      case 1:
        scores = multiples(rng, sz(n), 0.25, -2, 2);
        break;
      case 2:
        scores = uniform(rng, sz(n), -1e3f, 1e3f);
        scores[0] = INFINITY;
        scores[1] = -INFINITY;
        scores[2] = -0.0f;
        scores[3] = 0.0f;
        break;
      default:
        scores.assign(sz(n), -3.5f);
        break;
    }
    for (i64 k : {i64{1}, i64{511}, i64{512}, n / 2, n - 1}) {
      INFO("trial " << trial << ", n " << n << ", k " << k);
      select_top_k(scores, k, out);
      const auto want = phasekv_test::top_k_by_sort(scores, k);
      REQUIRE(out.size() == want.size());
      CHECK(same_indices(out, want));
    }
  }
}

TEST_CASE("select_top_k from 8192 scores up: the sampled cut drops no winner, and a cut too high falls back",
          "[read][top_k]") {
  // From 8192 scores and k under about n/9 the selection first keeps only the scores at or above a
  // cut taken from a sample of 512 of them. Inputs that could fool a sample: scores periodic in
  // the index (with the sampling's stretch, and with 4), sorted either way, few distinct values
  // straddling the cut, all equal, a cluster with far outliers, NaN in bulk (ranks last), ±inf and
  // ±0, and indices near 2^32.
  std::mt19937 rng(26);
  std::vector<scored_entry> out;
  for (int trial = 0; trial < 33; ++trial) {
    const i64 n = trial < 11 ? 8192 : std::uniform_int_distribution<i64>(8193, 70000)(rng);
    const i64 stretch = n / 512;
    std::vector<float> scores;
    switch (trial % 11) {
      case 0: scores = uniform(rng, sz(n), -1.0f, 1.0f); break;
      case 1:
        for (i64 j = 0; j < n; ++j) scores.push_back(static_cast<float>(j % stretch));
        break;
      case 2:
        for (i64 j = 0; j < n; ++j) scores.push_back(j % 4 == 1 ? 1.0f + static_cast<float>(j) * 1e-6f : -1.0f);
        break;
      case 3:
        for (i64 j = 0; j < n; ++j) scores.push_back(static_cast<float>(j));
        break;
      case 4:
        for (i64 j = 0; j < n; ++j) scores.push_back(static_cast<float>(-j));
        break;
      case 5: scores = multiples(rng, sz(n), 1.0, 0, 40); break;
      case 6: scores.assign(sz(n), 2.5f); break;
      case 7:
        scores = uniform(rng, sz(n), 1.0f, 1.0001f);
        for (int o = 0; o < 700; ++o) scores[sz(std::uniform_int_distribution<i64>(0, n - 1)(rng))] = 1e30f;
        break;
      case 8:
        scores = uniform(rng, sz(n), -3.0f, 3.0f);
        for (i64 j = 0; j < n; j += 2) scores[sz(j)] = std::nanf("");
        break;
      case 9:
        scores = multiples(rng, sz(n), 1.0, -2, 2);
        for (i64 j = 0; j < n; ++j)
          if (scores[sz(j)] == 0.0f && j % 2 == 0) scores[sz(j)] = -0.0f;
        for (int o = 0; o < 20; ++o) scores[sz(std::uniform_int_distribution<i64>(0, n - 1)(rng))] = INFINITY;
        scores[0] = -INFINITY;
        break;
      default: {
        // Gamma-distributed, as ReLU'd indexer scores are in the benchmarks.
        std::gamma_distribution<float> gamma(2.0f, 1.0f);
        for (i64 j = 0; j < n; ++j) scores.push_back(gamma(rng));
        break;
      }
    }
    const i64 first = trial % 3 == 2 ? (i64{1} << 32) - n - 1 : 0;
    for (i64 k : {i64{1}, i64{512}, n / 16, n / 9, n / 8}) {
      INFO("trial " << trial << ", n " << n << ", k " << k << ", first index " << first);
      select_top_k(scores, k, out, first);
      // NaN ranks last: the sorting oracle sees it as −∞ below every other score, then by index.
      std::vector<double> ordered(scores.begin(), scores.end());
      for (double& v : ordered) v = std::isnan(v) ? -std::numeric_limits<double>::max() : v == -INFINITY ? -1e300 : v;
      const auto want = phasekv_test::top_k_by_sort(ordered, k);
      REQUIRE(out.size() == want.size());
      CHECK(same_indices(out, want, first));
    }
  }

  // The cut itself: on gamma scores it keeps the top k and a few more, and only given scores' keys.
  std::gamma_distribution<float> gamma(2.0f, 1.0f);
  std::vector<float> scores(32768);
  for (float& v : scores) v = gamma(rng);
  std::vector<std::uint64_t> keys;
  REQUIRE(detail::keys_above_sampled_cut(scores, 0, 512, keys));
  CHECK(keys.size() >= 512);
  CHECK(keys.size() < 4096);
  std::vector<std::uint64_t> all;
  rank_keys(scores, 0, all);
  std::sort(all.begin(), all.end(), std::greater<std::uint64_t>());
  std::vector<std::uint64_t> kept = keys;
  std::sort(kept.begin(), kept.end(), std::greater<std::uint64_t>());
  CHECK(std::equal(kept.begin(), kept.end(), all.begin()));  // exactly the best keys.size() of all
  bool index_order = true;
  for (std::size_t i = 1; i < keys.size(); ++i) index_order = index_order && rank_key_index(keys[i - 1]) < rank_key_index(keys[i]);
  CHECK(index_order);

  // A cut too high: the sampled scores are the only high ones, so fewer than k reach the cut.
  // The cut reports it, and the selection still finds the top k by keying every score.
  std::vector<float> decoy(32768, 0.0f);
  for (std::size_t i = 0; i < detail::cut_samples; ++i) decoy[detail::cut_sample_position(i, decoy.size())] = 1.0f;
  for (std::size_t j = 0; j < decoy.size(); j += 7) decoy[j] += 0.5f;
  CHECK_FALSE(detail::keys_above_sampled_cut(decoy, 0, 600, keys));
  select_top_k(decoy, 600, out);
  const auto want = phasekv_test::top_k_by_sort(decoy, 600);
  REQUIRE(out.size() == want.size());
  CHECK(same_indices(out, want));
}

// ---- 4. indexer + selection through the reader ---------------------------------------------------

// The oracle's read of query position t of `seq`, from the entries and window rows the cache
// holds: its own indexer scores, its own top-k, one joint softmax.
struct selection_expectation {
  std::vector<double> scores;  // every candidate's I_j
  std::vector<i64> selected;   // oracle top-k (every candidate without selection)
  phasekv_test::sparse_read_result read;
  double value_scale = 0.0;
};

selection_expectation expect_selection(const selection_cache& cache, sequence_id seq, i64 t, i64 top_k,
                                       const std::vector<float>& q, const std::vector<float>& iq,
                                       const std::vector<float>& iw, const std::vector<float>& sinks) {
  using W = selection_world;
  selection_expectation e;
  const i64 candidates = (t + 1) / 2;
  std::vector<std::vector<float>> ix;
  for (i64 j = 0; j < candidates; ++j) ix.push_back(entry_of(cache, seq, 2, j, W::indexer_channels));
  e.scores = phasekv_test::indexer_scores(iq, iw, ix, W::indexer_channels);
  if (top_k > 0) {
    e.selected = phasekv_test::top_k_by_sort(e.scores, top_k);
  } else {
    e.selected.resize(sz(candidates));
    std::iota(e.selected.begin(), e.selected.end(), i64{0});
  }
  std::vector<std::vector<float>> ek, ev, wk, wv;
  for (i64 j : e.selected) {
    ek.push_back(entry_of(cache, seq, 0, j, W::kv_heads * W::key_channels));
    ev.push_back(entry_of(cache, seq, 1, j, W::kv_heads * W::value_channels));
  }
  for (i64 s = std::max<i64>(0, t - W::window + 1); s <= t; ++s) {
    wk.push_back(row(cache.window_key(seq, s), W::kv_heads * W::key_channels));
    wv.push_back(row(cache.window_value(seq, s), W::kv_heads * W::value_channels));
  }
  const attention_shape shape{W::query_heads, W::kv_heads, W::key_channels, W::value_channels};
  e.read =
      phasekv_test::sparse_read(shape, q, 1.0 / std::sqrt(static_cast<double>(W::key_channels)), ek, ev, wk, wv, sinks);
  e.value_scale = std::max(max_abs(ev), max_abs(wv));
  return e;
}

TEST_CASE("sparse_reader: lightning indexer, top-k and the joint softmax against the oracle",
          "[read][oracle][indexer]") {
  using W = selection_world;
  const W world;
  struct variant {
    storage_type storage;
    i64 top_k;
    int palette;
    bool sink;
  };
  const variant variants[] = {
      {storage_type::f32, 5, 2, true},  {storage_type::f32, 5, 1, true},   // every score ties
      {storage_type::f32, 3, 4, false}, {storage_type::bf16, 5, 2, true},  // bf16 pages: converted scoring
      {storage_type::f16, 4, 3, true},  {storage_type::f32, 64, 2, true},  // k ≥ candidates: all, by score
      {storage_type::f32, 0, 2, true},                                     // no selection despite an indexer
  };
  std::uint32_t seed = 31;
  for (const variant& v : variants) {
    INFO("storage " << v.storage << ", top_k " << v.top_k << ", palette " << v.palette << (v.sink ? ", sink" : ""));
    std::mt19937 rng(seed++);
    selection_cache cache = world.make(v.storage, seed);
    const sequence_id seq = cache.create();
    const i64 T = 41;
    const auto in = world.make_inputs(rng, T, v.palette);
    const reader_config rc = W::reader("csa", v.top_k, v.sink);
    sparse_reader reader(cache, rc);
    std::vector<float> out(sz(reader.output_floats())), plain(out.size());
    read_trace trace;
    i64 selecting_reads = 0, tied_reads = 0;
    for (i64 t = 0; t < T; ++t) {
      world.append(cache, seq, in, t, 1);  // decode: the query's token first, then its read
      const auto q = uniform(rng, sz(W::query_heads * W::key_channels), -2.0f, 2.0f);
      const auto iq =
          v.top_k > 0 ? multiples(rng, sz(W::indexer_heads * W::indexer_channels), 0.5, -4, 4) : std::vector<float>{};
      const auto iw = v.top_k > 0 ? multiples(rng, sz(W::indexer_heads), 0.25, -2, 8) : std::vector<float>{};
      const auto sinks = v.sink ? uniform(rng, sz(W::query_heads), -1.0f, 2.0f) : std::vector<float>{};
      read_request rq{t, q, iq, iw, sinks};
      reader.read(cache, seq, rq, out.data(), &trace);
      reader.read(cache, seq, rq, plain.data());
      INFO("position " << t);
      CHECK(std::memcmp(out.data(), plain.data(), out.size() * sizeof(float)) == 0);  // the trace changes nothing

      const auto iw_for_oracle = v.top_k > 0 ? iw : std::vector<float>(sz(W::indexer_heads), 0.0f);
      const auto iq_for_oracle =
          v.top_k > 0 ? iq : std::vector<float>(sz(W::indexer_heads * W::indexer_channels), 0.0f);
      const selection_expectation e = expect_selection(cache, seq, t, v.top_k, q, iq_for_oracle, iw_for_oracle, sinks);
      CHECK(trace.candidates == (t + 1) / 2);
      REQUIRE(trace.selected == e.selected);  // exact: the scores are exact in fp32
      if (v.top_k > 0) {
        REQUIRE(trace.scores.size() == e.selected.size());
        for (std::size_t r = 0; r < e.selected.size(); ++r)
          CHECK(static_cast<double>(trace.scores[r]) == e.scores[sz(e.selected[r])]);
        if (trace.candidates > v.top_k) ++selecting_reads;
        std::vector<double> sorted = e.scores;
        std::sort(sorted.begin(), sorted.end());
        if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) ++tied_reads;
      } else {
        CHECK(trace.scores.empty());
      }
      CHECK(mismatch(out.data(), e.read.output, e.value_scale) == "");
      // The trace's masses: means over query heads of the oracle's probabilities, summing to 1.
      CHECK(trace.window_first == std::max<i64>(0, t - W::window + 1));
      CHECK(mass_mismatch(trace.entry_mass, e.read.entry_mass, 1e-5, "entry_mass") == "");
      CHECK(mass_mismatch(trace.window_token_mass, e.read.window_token_mass, 1e-5, "window_token_mass") == "");
      CHECK(trace.window_mass == Approx(e.read.window_mass).margin(1e-5));
      CHECK(trace.sink_mass == Approx(e.read.sink_mass).margin(1e-5));
      const double total =
          std::accumulate(trace.entry_mass.begin(), trace.entry_mass.end(), 0.0) + trace.window_mass + trace.sink_mass;
      CHECK(total == Approx(1.0).margin(1e-5));
      CHECK(std::accumulate(trace.window_token_mass.begin(), trace.window_token_mass.end(), 0.0) ==
            Approx(trace.window_mass).margin(1e-6));
    }
    // The variants must actually exercise what they claim.
    if (v.top_k > 0 && v.top_k < 20) CHECK(selecting_reads > 10);
    if (v.top_k > 0) CHECK(tied_reads > 10);
  }
}

// HCA-like geometry (S = W = 4) without a raw window: a query before the first complete entry
// sees no key at all. The output is then 0; with a sink, the sink holds all the mass.
TEST_CASE("sparse_reader: a query that sees no key reads zeros", "[read]") {
  using cache_t = paged_cache<mean_stream>;
  const geometry g = geometry{4, 4};
  cache_config cc;
  cc.page_size = 2;
  cc.pages = 8;
  cache_t cache(layer_compressor<mean_stream>(mean_stream(g, make_stream("kv", stream_role::key_value, 1, 4))), cc);
  const sequence_id seq = cache.create();
  std::mt19937 rng(71);
  const auto payload = uniform(rng, 6 * 4, -1.0f, 1.0f);
  cache.append(seq, {token_chunk{6, payload, {}}});
  for (int sink = 0; sink < 2; ++sink) {
    reader_config rc;
    rc.query_heads = 2;
    rc.sink = sink != 0;
    sparse_reader reader(cache, rc);
    const auto q = uniform(rng, 8, -1.0f, 1.0f);
    const std::vector<float> sinks = sink ? std::vector<float>{0.5f, -0.5f} : std::vector<float>{};
    for (i64 t = 0; t < 6; ++t) {
      read_request rq{t, q, {}, {}, sinks};
      std::vector<float> out(8, 42.0f);
      read_trace trace;
      reader.read(cache, seq, rq, out.data(), &trace);
      INFO("position " << t << (sink ? ", sink" : ""));
      CHECK(trace.candidates == (t + 1) / 4);
      if (t < 3) {
        for (float v : out) CHECK(v == 0.0f);
        CHECK(trace.selected.empty());
        CHECK(trace.window_mass == 0.0f);
        CHECK(trace.sink_mass == (sink ? 1.0f : 0.0f));
      } else {
        // Entry 0 alone: the mean of tokens 0–3, times its probability against the sink.
        std::vector<double> want(8, 0.0);
        for (i64 h = 0; h < 2; ++h) {
          double k[4] = {0, 0, 0, 0};
          for (i64 s = 0; s < 4; ++s)
            for (i64 c = 0; c < 4; ++c) k[c] += payload[sz(s * 4 + c)] / 4.0;
          double logit = 0.0;
          for (i64 c = 0; c < 4; ++c) logit += q[sz(h * 4 + c)] * k[c] / 2.0;
          const double p = sink ? 1.0 / (1.0 + std::exp(sinks[sz(h)] - logit)) : 1.0;
          for (i64 c = 0; c < 4; ++c) want[sz(h * 4 + c)] = p * k[c];
        }
        CHECK(mismatch(out.data(), want, 1.0) == "");
      }
    }
  }
}

// ---- 5. tied K/V with de-rotation ------------------------------------------------------------------

TEST_CASE("sparse_reader: tied K/V de-rotates the output's RoPE channels at the query position",
          "[read][oracle][rope]") {
  struct rope_case {
    rope_config rope;
    i64 stride, window, kv_heads, query_heads;
  };
  rope_config interleaved;
  interleaved.channels = 8;
  interleaved.base = 10000.0;
  interleaved.layout = rope_layout::interleaved;
  rope_config half_yarn;
  half_yarn.channels = 6;
  half_yarn.base = 500.0;
  half_yarn.layout = rope_layout::half_split;
  half_yarn.yarn.enabled = true;
  half_yarn.yarn.factor = 4.0;
  half_yarn.yarn.original_context = 64;
  const rope_case cases[] = {{interleaved, 2, 4, 2, 4}, {half_yarn, 3, 6, 1, 3}};
  const i64 channels = 16, window = 4, T = 37;
  std::mt19937 rng(41);
  for (const rope_case& c : cases) {
    INFO("rope " << to_string(c.rope.layout) << ", S " << c.stride << ", W " << c.window);
    stream_config kv = make_stream("kv", stream_role::key_value, c.kv_heads, channels);
    kv.rope = c.rope;
    cache_config cc;
    cc.page_size = 4;
    cc.pages = 2048;
    cc.window = raw_window_config{window, c.kv_heads, channels, 0};  // tied window
    using cache_t = paged_cache<rope_stream>;
    const geometry g = geometry{c.stride, c.window};
    cache_t cache(layer_compressor<rope_stream>(rope_stream(g, kv)), cc);
    reader_config rc;
    rc.query_heads = c.query_heads;
    rc.sink = true;
    rc.derotate_output = true;
    sparse_reader reader(cache, rc);
    const attention_shape shape{c.query_heads, c.kv_heads, channels, channels};
    const i64 views = g.branches();

    auto check_read = [&](sequence_id seq, i64 t) {
      const auto q = uniform(rng, sz(c.query_heads * channels), -2.0f, 2.0f);
      const auto sinks = uniform(rng, sz(c.query_heads), -1.0f, 1.0f);
      read_request rq{t, q, {}, {}, sinks};
      std::vector<float> out(sz(reader.output_floats()));
      reader.read(cache, seq, rq, out.data());
      std::vector<std::vector<float>> ek, wk;
      for (i64 j = 0; j < g.visible_entries(t); ++j) ek.push_back(entry_of(cache, seq, 0, j, c.kv_heads * channels));
      for (i64 s = std::max<i64>(0, t - window + 1); s <= t; ++s)
        wk.push_back(row(cache.window_key(seq, s), c.kv_heads * channels));
      auto want =
          phasekv_test::sparse_read(shape, q, 1.0 / std::sqrt(static_cast<double>(channels)), ek, ek, wk, wk, sinks)
              .output;
      phasekv_test::derotate_heads(want, c.query_heads, channels, c.rope, t);
      INFO("position " << t);
      CHECK(mismatch(out.data(), want, std::max(max_abs(ek), max_abs(wk))) == "");
    };

    const sequence_id seq = cache.create();
    for (i64 t = 0; t < T; ++t) {
      const auto payload = uniform(rng, sz(c.kv_heads * views * channels), -1.0f, 1.0f);
      const auto wkeys = uniform(rng, sz(c.kv_heads * channels), -1.0f, 1.0f);
      cache.append(seq, {token_chunk{1, payload, {}}}, wkeys);
      check_read(seq, t);
    }
    // Far from the origin, where the angles are large.
    const sequence_id far = cache.create();
    const i64 far_tokens = 3001;
    const auto payload = uniform(rng, sz(far_tokens * c.kv_heads * views * channels), -1.0f, 1.0f);
    const auto wkeys = uniform(rng, sz(far_tokens * c.kv_heads * channels), -1.0f, 1.0f);
    cache.append(far, {token_chunk{far_tokens, payload, {}}}, wkeys);
    check_read(far, far_tokens - 1);
  }
}

// ---- 6. DeepSeek-V4 CSA end to end ---------------------------------------------------------------

using csa_cache = paged_cache<csa_stream, csa_stream>;

struct csa_setup {
  i64 kv_channels = 64, kv_rope = 16, indexer_channels = 32, indexer_rope = 16;
  i64 query_heads = 8, indexer_heads = 4, top_k = 8, window = 16, page_size = 8;
  i64 tokens = 96, history = 0;
};

struct csa_world {
  csa_setup s;
  geometry geom = presets::deepseek_v4_csa_layer.geom;
  stream_config kv_cfg = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer),
                ix_cfg = *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer);
  stream_params kv_params, ix_params;
  std::vector<float> kv_payload, kv_logits, ix_payload, ix_logits, window_keys;
  std::vector<std::vector<float>> queries, indexer_queries, indexer_weights, sinks;  // per position

  csa_world(const csa_setup& setup, std::uint32_t seed) : s(setup) {
    kv_cfg.channels = s.kv_channels;
    kv_cfg.rope.channels = s.kv_rope;
    ix_cfg.channels = s.indexer_channels;
    ix_cfg.rope.channels = s.indexer_rope;
    std::mt19937 rng(seed);
    kv_params.slot_bias = phasekv_test::random_bias(rng, sz(geom.window * s.kv_channels));
    kv_params.norm_weight = phasekv_test::random_norm_weight(rng, sz(s.kv_channels));
    ix_params.slot_bias = phasekv_test::random_bias(rng, sz(geom.window * s.indexer_channels));
    ix_params.norm_weight = phasekv_test::random_norm_weight(rng, sz(s.indexer_channels));
    const i64 views = geom.branches(), T = s.tokens;
    kv_payload = uniform(rng, sz(T * views * s.kv_channels), -1.0f, 1.0f);
    kv_logits = uniform(rng, sz(T * views * s.kv_channels), -2.0f, 2.0f);
    ix_payload = uniform(rng, sz(T * views * s.indexer_channels), -1.0f, 1.0f);
    ix_logits = uniform(rng, sz(T * views * s.indexer_channels), -2.0f, 2.0f);
    window_keys = uniform(rng, sz(T * s.kv_channels), -1.0f, 1.0f);
    for (i64 t = 0; t < T; ++t) {
      queries.push_back(uniform(rng, sz(s.query_heads * s.kv_channels), -1.0f, 1.0f));
      indexer_queries.push_back(uniform(rng, sz(s.indexer_heads * s.indexer_channels), -1.0f, 1.0f));
      indexer_weights.push_back(uniform(rng, sz(s.indexer_heads), -0.5f, 1.0f));
      sinks.push_back(uniform(rng, sz(s.query_heads), -1.0f, 2.0f));
    }
  }

  csa_cache make_cache() const {
    cache_config cc;
    cc.name = "csa";
    cc.page_size = s.page_size;
    cc.pages = 64;
    cc.history = s.history;
    cc.window = raw_window_config{s.window, 1, s.kv_channels, 0};  // tied window, one KV head
    return csa_cache(layer_compressor<csa_stream, csa_stream>(csa_stream(geom, kv_cfg, kv_params),
                                                              csa_stream(geom, ix_cfg, ix_params)),
                     cc);
  }

  reader_config reader() const {
    reader_config rc;
    rc.name = "csa.reader";
    rc.query_heads = s.query_heads;
    rc.key_stream = 0;
    rc.value_stream = 0;  // tied K/V
    rc.indexer_stream = 1;
    rc.top_k = s.top_k;
    rc.indexer_heads = s.indexer_heads;
    rc.sink = true;
    rc.derotate_output = true;
    return rc;
  }

  void append(csa_cache& cache, sequence_id seq, i64 first, i64 count) const {
    const i64 views = geom.branches();
    auto part = [&](const std::vector<float>& v, i64 per_token) {
      return span<const float>(v.data() + first * per_token, sz(count * per_token));
    };
    cache.append(
        seq,
        {token_chunk{count, part(kv_payload, views * s.kv_channels), part(kv_logits, views * s.kv_channels)},
         token_chunk{count, part(ix_payload, views * s.indexer_channels), part(ix_logits, views * s.indexer_channels)}},
        part(window_keys, s.kv_channels));
  }

  read_request request(i64 t) const {
    return read_request{t, queries[sz(t)], indexer_queries[sz(t)], indexer_weights[sz(t)], sinks[sz(t)]};
  }

  // The oracle's check of one read. The scores are fp32 GEMMs of arbitrary floats, so ranks may
  // legitimately differ from the double ranking where two scores are within rounding: the
  // selection must be a top-k of the oracle scores up to that tolerance, and the output must
  // equal the oracle's read over exactly the selected entries plus the window.
  std::string check_against_oracle(const csa_cache& cache, sequence_id seq, i64 t, const float* out,
                                   const read_trace& trace) const {
    const i64 candidates = geom.visible_entries(t);
    std::vector<std::vector<float>> ix;
    double score_scale = 0.0;
    const auto& iq = indexer_queries[sz(t)];
    const auto& iw = indexer_weights[sz(t)];
    for (i64 j = 0; j < candidates; ++j) {
      ix.push_back(entry_of(cache, seq, 1, j, s.indexer_channels));
      double a = 0.0;
      for (i64 h = 0; h < s.indexer_heads; ++h)
        for (i64 c = 0; c < s.indexer_channels; ++c)
          a += std::abs(iw[sz(h)] * iq[sz(h * s.indexer_channels + c)] * ix.back()[sz(c)]);
      score_scale = std::max(score_scale, a);
    }
    const auto scores = phasekv_test::indexer_scores(iq, iw, ix, s.indexer_channels);
    const double tol = 1e-5 * std::max(score_scale, 1.0);
    std::ostringstream why;
    const i64 keep = std::min(s.top_k, candidates);
    if (static_cast<i64>(trace.selected.size()) != keep) return "selected " + std::to_string(trace.selected.size());
    std::vector<bool> chosen(sz(candidates), false);
    double lowest_chosen = std::numeric_limits<double>::infinity();
    for (std::size_t r = 0; r < trace.selected.size(); ++r) {
      const i64 j = trace.selected[r];
      if (j < 0 || j >= candidates || chosen[sz(j)]) return "bad or repeated entry " + std::to_string(j);
      chosen[sz(j)] = true;
      if (!(std::abs(trace.scores[r] - scores[sz(j)]) <= tol)) {
        why << "score of entry " << j << ": " << trace.scores[r] << " vs oracle " << scores[sz(j)];
        return why.str();
      }
      if (r > 0 && trace.scores[r] > trace.scores[r - 1]) return "scores not in rank order";
      lowest_chosen = std::min(lowest_chosen, scores[sz(j)]);
    }
    for (i64 j = 0; j < candidates; ++j)
      if (!chosen[sz(j)] && scores[sz(j)] > lowest_chosen + tol) {
        why << "entry " << j << " (score " << scores[sz(j)] << ") beats a selected one (" << lowest_chosen << ")";
        return why.str();
      }
    std::vector<std::vector<float>> ek, wk;
    for (i64 j : trace.selected) ek.push_back(entry_of(cache, seq, 0, j, s.kv_channels));
    for (i64 p = std::max<i64>(0, t - s.window + 1); p <= t; ++p)
      wk.push_back(row(cache.window_key(seq, p), s.kv_channels));
    const attention_shape shape{s.query_heads, 1, s.kv_channels, s.kv_channels};
    auto want = phasekv_test::sparse_read(shape, queries[sz(t)], 1.0 / std::sqrt(static_cast<double>(s.kv_channels)),
                                          ek, ek, wk, wk, sinks[sz(t)])
                    .output;
    phasekv_test::derotate_heads(want, s.query_heads, s.kv_channels, kv_cfg.rope, t);
    return mismatch(out, want, std::max(max_abs(ek), max_abs(wk)));
  }
};

// Decodes token by token (append one token, read at t), checking each read against the oracle.
std::vector<std::vector<float>> decode_all(const csa_world& w, csa_cache& cache, sparse_reader& reader,
                                           bool check_oracle) {
  const sequence_id seq = cache.create();
  std::vector<std::vector<float>> outs;
  read_trace trace;
  i64 selecting = 0;
  for (i64 t = 0; t < w.s.tokens; ++t) {
    w.append(cache, seq, t, 1);
    std::vector<float> out(sz(reader.output_floats()));
    reader.read(cache, seq, w.request(t), out.data(), &trace);
    if (check_oracle) {
      INFO("decode, position " << t);
      CHECK(w.check_against_oracle(cache, seq, t, out.data(), trace) == "");
    }
    if (trace.candidates > w.s.top_k) ++selecting;
    outs.push_back(std::move(out));
  }
  CHECK(selecting > 0);  // the case exercises selection
  cache.free(seq);
  return outs;
}

// One prefill of all the world's tokens into a fresh sequence, read at every position.
std::vector<std::vector<float>> reads_after_one_prefill(const csa_world& w, csa_cache& cache, sparse_reader& reader) {
  const sequence_id seq = cache.create();
  w.append(cache, seq, 0, w.s.tokens);
  std::vector<std::vector<float>> outs;
  for (i64 t = 0; t < w.s.tokens; ++t) {
    INFO("one prefill of " << w.s.tokens << " tokens (history " << w.s.history << "), read at " << t);
    std::vector<float> out(sz(reader.output_floats()));
    reader.read(cache, seq, w.request(t), out.data());
    outs.push_back(std::move(out));
  }
  return outs;
}

TEST_CASE("sparse_reader, DeepSeek-V4 CSA (reduced channels): decoding equals reading after a prefill", "[read][csa]") {
  const csa_setup setup;  // 64 channels (16 RoPE), indexer 4 × 32, 8 query heads, top-k 8, window 16
  const csa_world w(setup, 51);
  csa_cache cache = w.make_cache();
  sparse_reader reader(cache, w.reader());
  const auto decoded = decode_all(w, cache, reader, true);

  // One prefill of t + 1 tokens, read at its last position t — for every t.
  i64 identical = 0;
  for (i64 t = 0; t < setup.tokens; ++t) {
    const sequence_id seq = cache.create();
    w.append(cache, seq, 0, t + 1);
    std::vector<float> out(sz(reader.output_floats()));
    reader.read(cache, seq, w.request(t), out.data());
    INFO("prefill of " << t + 1 << " tokens, read at " << t);
    // Same entries (streaming invariant), same selection, same kernels on the same shapes.
    CHECK(bit_equal(out, decoded[sz(t)]));
    identical += bit_equal(out, decoded[sz(t)]) ? 1 : 0;
    cache.free(seq);
  }
  CHECK(identical == setup.tokens);
}

// Chunked prefill reads positions before the last token: with history ≥ T the raw window rows
// of every position are still in the cache's ring, so every position must be readable.
TEST_CASE("sparse_reader: after one prefill with history >= T every position reads as when decoding", "[read][csa]") {
  csa_setup setup;
  setup.tokens = 48;
  setup.history = setup.tokens;
  const csa_world w(setup, 52);
  csa_cache cache = w.make_cache();
  sparse_reader reader(cache, w.reader());
  const auto decoded = decode_all(w, cache, reader, false);
  std::vector<std::vector<float>> prefilled;
  REQUIRE_NOTHROW(prefilled = reads_after_one_prefill(w, cache, reader));
  for (i64 t = 0; t < setup.tokens; ++t) {
    INFO("one prefill of " << setup.tokens << " tokens (history " << setup.history << "), read at " << t);
    CHECK(bit_equal(prefilled[sz(t)], decoded[sz(t)]));
  }
}

TEST_CASE("sparse_reader, DeepSeek-V4 CSA with the true preset configs at a short context", "[read][csa]") {
  csa_setup setup;
  setup.kv_channels = 512;
  setup.kv_rope = 64;
  setup.indexer_channels = 128;
  setup.indexer_rope = 64;
  setup.query_heads = 64;
  setup.indexer_heads = 64;
  setup.top_k = 8;     // the model's 512 would select everything at this context
  setup.window = 128;  // the model's raw window: it covers every token here
  setup.page_size = 64;
  setup.tokens = 44;
  const csa_world w(setup, 53);
  REQUIRE(w.kv_cfg.channels == presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer).channels);
  REQUIRE(w.kv_cfg.rope.channels == presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer).rope.channels);
  REQUIRE(w.ix_cfg.channels == presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer)->channels);
  csa_cache cache = w.make_cache();
  sparse_reader reader(cache, w.reader());
  const auto decoded = decode_all(w, cache, reader, true);
  // One prefill, read at every position (the window still holds all of them: T < N_win).
  const auto prefilled = reads_after_one_prefill(w, cache, reader);
  for (i64 t = 0; t < setup.tokens; ++t) {
    INFO("one prefill, read at " << t);
    CHECK(bit_equal(prefilled[sz(t)], decoded[sz(t)]));
  }
}

// ---- 7. bad input ------------------------------------------------------------------------------

TEST_CASE("sparse_reader: bad requests throw input_error naming the field, and change nothing", "[read][errors]") {
  using W = selection_world;
  const W world;
  selection_cache cache = world.make(storage_type::f32, 61);
  std::mt19937 rng(61);
  const i64 T = 12;
  const auto in = world.make_inputs(rng, T, 3);
  const sequence_id seq = cache.create();
  world.append(cache, seq, in, 0, T);
  const sequence_id empty = cache.create();
  const sequence_id gone = cache.create();
  cache.free(gone);

  const reader_config rc = W::reader("rd", 3, true);
  sparse_reader reader(cache, rc);

  const auto q = uniform(rng, sz(W::query_heads * W::key_channels), -1.0f, 1.0f);
  const auto iq = uniform(rng, sz(W::indexer_heads * W::indexer_channels), -1.0f, 1.0f);
  const auto iw = uniform(rng, sz(W::indexer_heads), 0.0f, 1.0f);
  const auto sinks = uniform(rng, sz(W::query_heads), 0.0f, 1.0f);
  auto good = [&] {
    return read_request{T - 1, q, iq, iw, sinks};
  };
  std::vector<float> out(sz(reader.output_floats()), 42.0f);
  read_trace trace;
  trace.candidates = -5;
  {
    std::vector<float> ok(out.size());
    REQUIRE_NOTHROW(reader.read(cache, seq, good(), ok.data()));
  }
  const cache_snapshot<selection_cache> before(cache, seq);

  // Each message reads "<field> = <value>: <requirement>".
  auto expect = [&](sequence_id s, const read_request& rq, float* o, const std::string& field_and_value) {
    INFO("expecting " << field_and_value);
    REQUIRE_THAT(message_of<input_error>([&] { reader.read(cache, s, rq, o, &trace); }), Contains(field_and_value));
  };
  read_request r = good();
  r.queries = span<const float>(q.data(), q.size() - 1);
  expect(seq, r, out.data(), "request.queries.size() = " + std::to_string(q.size() - 1));
  r = good();
  r.queries = span<const float>(nullptr, q.size());
  expect(seq, r, out.data(), "request.queries.data() = null");
  r = good();
  r.indexer_queries = span<const float>(iq.data(), iq.size() + 1);
  expect(seq, r, out.data(), "request.indexer_queries.size() = " + std::to_string(iq.size() + 1));
  r = good();
  r.indexer_queries = {};
  expect(seq, r, out.data(), "request.indexer_queries.size() = 0");
  r = good();
  r.indexer_weights = span<const float>(iw.data(), iw.size() - 1);
  expect(seq, r, out.data(), "request.indexer_weights.size() = " + std::to_string(iw.size() - 1));
  r = good();
  r.sinks = {};
  expect(seq, r, out.data(), "request.sinks.size() = 0");
  r = good();
  r.sinks = span<const float>(sinks.data(), sinks.size() - 2);
  expect(seq, r, out.data(), "request.sinks.size() = " + std::to_string(sinks.size() - 2));
  expect(seq, good(), nullptr, "out = null");
  expect(empty, good(), out.data(), "sequence = " + std::to_string(empty) + ": is empty");
  r = good();
  r.position = T;
  expect(seq, r, out.data(), "request.position = " + std::to_string(T));
  r.position = -1;
  expect(seq, r, out.data(), "request.position = -1");
  r.position = T - 1 - W::window;  // its window reaches back before what the cache keeps
  expect(seq, r, out.data(), "request.position = " + std::to_string(T - 1 - W::window) + ": needs window tokens");
  expect(gone, good(), out.data(), "(sequence) = " + std::to_string(gone) + ": is not a live sequence");
  expect(12345, good(), out.data(), "(sequence) = 12345: is not a live sequence");

  // A reader without a sink must be given no sinks; one without selection no indexer inputs.
  reader_config plain = rc;
  plain.sink = false;
  plain.top_k = 0;
  sparse_reader plain_reader(cache, plain);
  REQUIRE_THAT(message_of<input_error>([&] { plain_reader.read(cache, seq, good(), out.data()); }),
               Contains("request.indexer_queries.size()"));
  r = good();
  r.indexer_queries = {};
  r.indexer_weights = {};
  REQUIRE_THAT(message_of<input_error>([&] { plain_reader.read(cache, seq, r, out.data()); }),
               Contains("request.sinks.size()"));

  CHECK(cache_snapshot<selection_cache>(cache, seq) == before);
  CHECK(cache.tokens(empty) == 0);
  for (float v : out) CHECK(v == 42.0f);  // nothing written to the output
  CHECK(trace.candidates == -5);          // nor to the trace
}

TEST_CASE("sparse_reader: bad configurations throw config_error naming the field", "[read][errors]") {
  using W = selection_world;
  const W world;
  selection_cache cache = world.make(storage_type::f32, 62);
  const reader_config base = W::reader("rd", 3, false);
  REQUIRE_NOTHROW(sparse_reader(cache, base));

  auto expect = [&](const reader_config& rc, const std::string& field_and_value, const std::string& why) {
    INFO("expecting " << field_and_value);
    REQUIRE_THAT(message_of<config_error>([&] { (void)sparse_reader(cache, rc); }),
                 Contains(field_and_value) && Contains(why));
  };
  reader_config rc = base;
  rc.query_heads = 5;  // not a multiple of 2 KV heads
  expect(rc, "rd.query_heads = 5", "multiple");
  rc.query_heads = 0;
  expect(rc, "rd.query_heads = 0", "at least 1");
  rc = base;
  rc.key_stream = 3;
  expect(rc, "rd.key_stream = 3", "stream");
  rc = base;
  rc.value_stream = 7;
  expect(rc, "rd.value_stream = 7", "stream");
  rc = base;
  rc.indexer_stream = 9;
  expect(rc, "rd.indexer_stream = 9", "top_k");
  rc = base;
  rc.indexer_stream = no_stream;  // top_k > 0 without an indexer: the host selects, so no indexer heads
  expect(rc, "rd.indexer_heads = 3", "must be 0 without an indexer stream");
  rc.indexer_heads = 0;
  CHECK_NOTHROW(sparse_reader(cache, rc));
  rc = base;
  rc.indexer_stream = 0;  // the key stream has 2 KV heads; an indexer has one
  expect(rc, "indexer stream kv_heads = 2", "must be 1");
  rc = base;
  rc.top_k = -1;
  expect(rc, "rd.top_k = -1", "non-negative");
  rc = base;
  rc.indexer_heads = 0;
  expect(rc, "rd.indexer_heads = 0", "top_k");
  rc = base;
  rc.precision = indexer_precision::bf16;  // the indexer stream is stored in fp32
  expect(rc, "rd.precision = bf16", "stored in bf16");
  {
    const selection_cache bf16_indexer =
        world.make(storage_type::f32, 62, 0, 128, {storage_type::f32, storage_type::f32, storage_type::bf16});
    CHECK(bf16_indexer.pool(2).layout().storage == storage_type::bf16);
    CHECK(bf16_indexer.pool(0).layout().storage == storage_type::f32);
    CHECK_NOTHROW(sparse_reader(bf16_indexer, rc));
    REQUIRE_THAT(message_of<config_error>([&] { (void)world.make(storage_type::f32, 62, 0, 128, {storage_type::bf16}); }),
                 Contains("cache.stream_storage.size() = 1") && Contains("number of streams, 3"));
  }
  rc = base;
  rc.scale = -1.0f;
  expect(rc, "rd.scale = -1", "non-negative");
  rc.scale = std::numeric_limits<float>::quiet_NaN();
  expect(rc, "rd.scale = nan", "finite");
  rc = base;
  rc.derotate_output = true;  // untied streams
  expect(rc, "rd.derotate_output = true", "tied");
  rc = base;
  rc.value_stream = 0;  // the key stream read as values: its role says it holds none
  expect(rc, "rd.value_stream = 0", "role value or key_value (stream");

  // A window whose shape does not match the streams.
  auto with_window = [&](raw_window_config wcfg) {
    cache_config cc = cache.config();
    cc.window = wcfg;
    return selection_cache(layer_compressor<mean_stream, gated_stream, mean_stream>(cache.compressors()), cc);
  };
  {
    selection_cache c = with_window(raw_window_config{5, W::kv_heads, W::key_channels + 1, W::value_channels});
    REQUIRE_THAT(message_of<config_error>([&] { (void)sparse_reader(c, base); }),
                 Contains("window.key_channels = 9"));
  }
  {
    selection_cache c = with_window(raw_window_config{5, W::kv_heads, W::key_channels, W::value_channels + 2});
    REQUIRE_THAT(message_of<config_error>([&] { (void)sparse_reader(c, base); }),
                 Contains("window value channels = 8"));
  }
  {
    selection_cache c = with_window(raw_window_config{5, 1, W::key_channels, W::value_channels});
    REQUIRE_THAT(message_of<config_error>([&] { (void)sparse_reader(c, base); }),
                 Contains("window.kv_heads = 1"));
  }
  {
    selection_cache c = with_window(raw_window_config{0, 1, 0, 0});  // no window: nothing to match
    REQUIRE_NOTHROW(sparse_reader(c, base));
  }

  // Keys and values with different KV heads; tied K/V de-rotation without RoPE channels.
  using two = paged_cache<mean_stream, mean_stream>;
  const geometry g = geometry{2, 4};
  two mixed(layer_compressor<mean_stream, mean_stream>(mean_stream(g, make_stream("k", stream_role::key, 2, 4)),
                                                       mean_stream(g, make_stream("v", stream_role::value, 1, 4))),
            cache_config{});
  reader_config m;
  m.query_heads = 2;
  m.value_stream = 1;
  REQUIRE_THAT(message_of<config_error>([&] { (void)sparse_reader(mixed, m); }),
               Contains("value_stream kv_heads = 1"));
  m.value_stream = 0;
  m.derotate_output = true;
  REQUIRE_THAT(message_of<config_error>([&] { (void)sparse_reader(mixed, m); }),
               Contains("value_stream = 0") && Contains("role value or key_value"));  // a key stream holds no values
  layer_shape tied = mixed.shape();
  tied.streams[0].role = stream_role::key_value;
  REQUIRE_THAT(message_of<config_error>([&] { (void)sparse_reader(tied, m); }),
               Contains("derotate_output = true") && Contains("stream 'k' rotates nothing"));
}

}  // namespace

// ---- 8. long contexts and executors ---------------------------------------------------------------

namespace {

using phasekv_test::thread_executor;

using phasekv_test::same_trace;

}  // namespace

TEST_CASE("executor: for_each runs every task once and rethrows the first exception", "[read][executor]") {
  for (executor* e : std::initializer_list<executor*>{&default_executor(), new thread_executor(3, true)}) {
    std::vector<int> hits(1000, 0);
    auto count = [&](std::int64_t i) { ++hits[sz(i)]; };
    e->for_each(1000, count);
    CHECK(std::count(hits.begin(), hits.end(), 1) == 1000);
    auto fail = [&](std::int64_t i) {
      if (i % 7 == 3) throw input_error("task " + std::to_string(i));
    };
    REQUIRE_THROWS_AS(e->for_each(100, fail), input_error);
    if (e != &default_executor()) delete e;
  }
  openmp_executor omp;  // serial unless compiled with -fopenmp: still runs every task
  std::vector<int> hits(50, 0);
  auto count = [&](std::int64_t i) { ++hits[sz(i)]; };
  omp.for_each(50, count);
  CHECK(std::count(hits.begin(), hits.end(), 1) == 50);
}

// Thousands of candidates: scoring runs in several chunks whose top-k lists are merged, a large
// selection is attended in several pieces, and a read without selection walks over hundreds of
// pages in place (converted for bf16/f16), in pieces of whole pages. All must
// equal the oracle, and every executor must give bit-identical outputs and traces.
TEST_CASE("sparse_reader: long contexts, chunked selection and in-place pages, on any executor",
          "[read][oracle][executor]") {
  using W = selection_world;
  const W world;
  struct variant {
    storage_type storage;
    i64 top_k;
    indexer_precision precision = indexer_precision::f32;
  };
  // 600: three attention pieces. bf16 precision: fp32 KV next to bf16 indexer keys, scored by
  // the bf16 kernel where the build has it; this world's indexer queries and keys are exact in
  // bf16, so the oracle's fp32 scores still hold.
  const variant variants[] = {{storage_type::f32, 5},  {storage_type::bf16, 7}, {storage_type::f32, 0},
                              {storage_type::f16, 0},  {storage_type::f32, 600},
                              {storage_type::f32, 9, indexer_precision::bf16}};
  std::uint32_t seed = 71;
  for (const variant& v : variants) {
    INFO("storage " << v.storage << ", top_k " << v.top_k << ", bf16 indexer " << (v.precision == indexer_precision::bf16));
    std::mt19937 rng(seed++);
    std::vector<storage_type> streams;
    if (v.precision == indexer_precision::bf16) streams = {v.storage, v.storage, storage_type::bf16};
    selection_cache cache = world.make(v.storage, seed, 0, 1600, streams);
    const sequence_id seq = cache.create();
    const i64 T = 9001;  // 4500 candidates: two scoring chunks of 4095 entries (pages of 3)
    const auto in = world.make_inputs(rng, T + 2, 3);
    world.append(cache, seq, in, 0, T);  // one prefill; then two decoded tokens
    reader_config rc = W::reader("long", v.top_k, true);
    rc.precision = v.precision;
    sparse_reader serial(cache, rc), threaded(cache, rc);
    thread_executor pool(3, true);
    threaded.set_executor(pool);
    std::vector<float> out(sz(serial.output_floats())), out_threaded(out.size());
    read_trace trace, trace_threaded;
    for (i64 t : {T - 1, T + 1}) {
      INFO("position " << t);
      if (t > T - 1) world.append(cache, seq, in, T, 2);
      const auto q = uniform(rng, sz(W::query_heads * W::key_channels), -2.0f, 2.0f);
      const auto iq = multiples(rng, sz(W::indexer_heads * W::indexer_channels), 0.5, -4, 4);
      const auto iw = multiples(rng, sz(W::indexer_heads), 0.25, -2, 8);
      const auto sinks = uniform(rng, sz(W::query_heads), -1.0f, 2.0f);
      read_request rq{t, q, {}, {}, sinks};
      if (v.top_k > 0) {
        rq.indexer_queries = iq;
        rq.indexer_weights = iw;
      }
      serial.read(cache, seq, rq, out.data(), &trace);
      threaded.read(cache, seq, rq, out_threaded.data(), &trace_threaded);
      CHECK(std::memcmp(out.data(), out_threaded.data(), out.size() * sizeof(float)) == 0);
      CHECK(same_trace(trace, trace_threaded));

      const selection_expectation e =
          expect_selection(cache, seq, t, v.top_k, q, v.top_k > 0 ? iq : std::vector<float>(iq.size(), 0.0f),
                           v.top_k > 0 ? iw : std::vector<float>(iw.size(), 0.0f), sinks);
      REQUIRE(trace.candidates == (t + 1) / 2);
      REQUIRE(trace.selected == e.selected);
      CHECK(mismatch(out.data(), e.read.output, e.value_scale) == "");
      CHECK(mass_mismatch(trace.entry_mass, e.read.entry_mass, 1e-5, "entry_mass") == "");
      CHECK(trace.sink_mass == Approx(e.read.sink_mass).margin(1e-5));
    }
    CHECK(pool.runs > 0);  // the threaded reader really went through its executor
  }
}

TEST_CASE("reader: the streams follow the roles, and an index named instead must agree", "[read][roles]") {
  using namespace phasekv;
  const auto stream = [](const char* name, stream_role role) {
    stream_shape s;
    s.name = name;
    s.role = role;
    s.channels = 8;
    return s;
  };
  layer_shape shape;
  shape.geom = geometry{4, 4, 0, anchor_mode::block_start};
  shape.streams = {stream("k", stream_role::key), stream("v", stream_role::value), stream("ix", stream_role::indexer)};
  reader_config rc;
  rc.name = "r";
  rc.top_k = 2;
  rc.indexer_heads = 1;
  const reader_config got = sparse_reader(shape, rc).config();
  CHECK((got.key_stream == 0 && got.value_stream == 1 && got.indexer_stream == 2));
  rc.top_k = 0;
  rc.indexer_heads = 0;
  CHECK(sparse_reader(shape, rc).config().indexer_stream == no_stream);  // no selection, no indexer

  rc.top_k = 2;
  rc.indexer_heads = 1;
  reader_config bad = rc;
  bad.value_stream = 0;
  CHECK_THROWS_MATCHES(sparse_reader(shape, bad), config_error,
                       Catch::Message("r.value_stream = 0: must name a stream of role value or key_value (stream 'k' has "
                                      "another), or be from_roles"));
  bad = rc;
  bad.indexer_stream = 1;
  CHECK_THROWS_WITH(sparse_reader(shape, bad), Catch::Contains("r.indexer_stream = 1") && Catch::Contains("'v'"));
  bad = rc;
  bad.indexer_stream = 0;  // the keys score the entries themselves
  CHECK(sparse_reader(shape, bad).config().indexer_stream == 0);
  bad.indexer_stream = no_stream;  // the host selects
  bad.indexer_heads = 0;
  CHECK(sparse_reader(shape, bad).config().indexer_stream == no_stream);
  bad = rc;
  bad.key_stream = 7;  // past the streams: the shape check names it
  CHECK_THROWS_WITH(sparse_reader(shape, bad), Catch::Contains("r.key_stream = 7") && Catch::Contains("it has 3"));

  // Tied K/V: the value stream is the key stream; a layer without a key stream has nothing to read.
  shape.streams = {stream("kv", stream_role::key_value), stream("ix", stream_role::indexer)};
  const reader_config tied = sparse_reader(shape, rc).config();
  CHECK((tied.key_stream == 0 && tied.value_stream == 0 && tied.indexer_stream == 1));
  shape.streams = {stream("v", stream_role::value)};
  rc.top_k = 0;
  rc.indexer_heads = 0;
  CHECK_THROWS_WITH(sparse_reader(shape, rc), Catch::Contains("r.key_stream = from_roles: finds no stream of role key"));

  // The selection stage of a reader's config resolves the same way.
  shape.streams = {stream("kv", stream_role::key_value), stream("ix", stream_role::indexer)};
  rc.top_k = 2;
  rc.indexer_heads = 1;
  const entry_selector selector(shape, selection_of(rc));
  CHECK((selector.config().indexer_stream == 1 && selector.config().physical_stream == 0));
}

}  // namespace test_read
