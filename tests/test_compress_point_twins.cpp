// The built-in poolings through the extension point (examples/pools/builtin_twins.hpp): each twin,
// run as a pooling policy of the host's, gives its built-in's entries and slot weights bit for bit
// — in a prefill, one token per append, from bf16 inputs, with RMSNorm and RoPE after pooling, on
// windows up to 8 slots (the unrolled gate kernel) and beyond (the two-pass one), with padding
// slots at the sequence start and channel counts that leave a scalar tail. The built-ins have
// their double-precision oracles (test_compress_oracle.cpp); this holds the point to them.

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "support/prelude.hpp"
#include "support/common.hpp"
#include "../examples/pools/builtin_twins.hpp"
#include "support/random_inputs.hpp"
#include "phasekv/format/storage.hpp"  // float_to_bf16
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/stream_compressor.hpp"

namespace test_compress_point_twins {

namespace {

using namespace phasekv_test::prelude;
using namespace phasekv_examples;

struct case_shape {
  geometry g;
  i64 heads, channels;
  input_layout inputs;
};

stream_config config_of(const case_shape& k, bool rope) {
  stream_config c;
  c.name = "kv";
  c.kv_heads = k.heads;
  c.channels = k.channels;
  c.inputs = k.inputs;
  if (rope) c.rope.channels = 8;
  c.norm_eps = 1e-6;
  return c;
}

// Entries and slot weights of a whole run: one prefill, or one token per append; fp32 or bf16
// inputs (the bf16 bits of the same values).
template <class Stream>
entry_buffer run(const Stream& s, const std::vector<float>& x, const std::vector<float>& logits, i64 tokens,
                 bool one_at_a_time, bool bf16) {
  const i64 px = s.payload_floats_per_token(), pl = s.logit_floats_per_token();
  std::vector<std::uint16_t> x16(x.size()), l16(logits.size());
  for (std::size_t i = 0; i < x.size(); ++i) x16[i] = float_to_bf16(x[i]);
  for (std::size_t i = 0; i < logits.size(); ++i) l16[i] = float_to_bf16(logits[i]);
  append_options o;
  o.slot_weights = true;
  entry_buffer out;
  stream_state st = s.make_state();
  const i64 step = one_at_a_time ? 1 : tokens;
  for (i64 t = 0; t < tokens; t += step) {
    token_chunk c;
    c.tokens = step;
    if (bf16) {
      c.payload_bf16 = span<const std::uint16_t>(x16.data() + t * px, sz(step * px));
      if (pl) c.logits_bf16 = span<const std::uint16_t>(l16.data() + t * pl, sz(step * pl));
    } else {
      c.payload = span<const float>(x.data() + t * px, sz(step * px));
      if (pl) c.logits = span<const float>(logits.data() + t * pl, sz(step * pl));
    }
    s.append(st, c, out, o);
  }
  return out;
}

// The built-in `Builtin` and the twin `twin` (its weights from `params`) agree bit for bit.
template <class Pooling, class Twin, class Rope, class Norm>
void check_twin(const case_shape& k, stream_params params, const Twin& twin, std::mt19937& rng) {
  constexpr bool rope = !std::is_same_v<Rope, no_rope>;
  const stream_config c = config_of(k, rope);
  stream_params twin_params;
  twin_params.norm_weight = params.norm_weight;
  const stream_compressor<compressor_policy<Pooling, Rope, Norm>> fused(k.g, c, params);
  const stream_compressor<compressor_policy<Twin, Rope, Norm>> point(k.g, c, twin_params, twin);
  REQUIRE(point.payload_floats_per_token() == fused.payload_floats_per_token());
  REQUIRE(point.logit_floats_per_token() == fused.logit_floats_per_token());
  const i64 T = 3 * k.g.window + 5;
  const auto x = phasekv_test::random_uniform(rng, sz(T * fused.payload_floats_per_token()), -2.0f, 2.0f);
  const auto logits = phasekv_test::random_uniform(rng, sz(T * fused.logit_floats_per_token()), -4.0f, 4.0f);
  for (const bool one_at_a_time : {false, true})
    for (const bool bf16 : {false, true}) {
      INFO("S = " << k.g.stride << ", W = " << k.g.window << ", origin = " << k.g.origin << ", H = " << k.heads
                  << ", C = " << k.channels << ", rope " << rope << ", one token per append " << one_at_a_time
                  << ", bf16 " << bf16);
      const entry_buffer a = run(fused, x, logits, T, one_at_a_time, bf16);
      const entry_buffer b = run(point, x, logits, T, one_at_a_time, bf16);
      REQUIRE(a.size() == sz(k.g.completed_entries(T)));
      CHECK(b.size() == a.size());
      CHECK(b.all_values() == a.all_values());
      CHECK(b.all_slot_weights() == a.all_slot_weights());
    }
}

const std::vector<case_shape>& shapes() {
  static const std::vector<case_shape> s = {
      {geometry{4, 8}, 1, 64, input_layout::per_branch},     // DeepSeek-V4 CSA's shape, smaller
      {geometry{4, 4}, 2, 37, input_layout::per_branch},     // a scalar channel tail
      {geometry{3, 5, 2}, 2, 24, input_layout::per_slot},    // W not a multiple of S, an origin
      {geometry{2, 11}, 1, 40, input_layout::per_slot},      // > 8 slots: the two-pass gate kernel
  };
  return s;
}

template <class Rope, class Norm>
void check_every_twin() {
  std::mt19937 rng(2026);
  for (const case_shape& k : shapes()) {
    stream_params base;
    if constexpr (std::is_same_v<Norm, rms_norm>)
      base.norm_weight = phasekv_test::random_norm_weight(rng, sz(k.channels));
    check_twin<mean_pool, mean_twin, Rope, Norm>(k, base, mean_twin{}, rng);

    stream_params fixed = base;
    fixed.slot_profile = phasekv_test::random_profile(rng, sz(k.g.window));
    fixed.slot_profile[0] = 0.0f;  // a zero weight on a slot that is padding for early entries
    check_twin<fixed_weight_pool, fixed_twin, Rope, Norm>(k, fixed, fixed_twin(fixed.slot_profile), rng);

    for (const bool learned : {false, true}) {
      stream_params gated = base;
      if (learned) gated.slot_bias = phasekv_test::random_bias(rng, sz(k.heads * k.g.window));
      check_twin<scalar_gated_pool, scalar_gated_twin, Rope, Norm>(
          k, gated, scalar_gated_twin(k.heads, k.g.window, k.channels, gated.slot_bias), rng);
      gated.slot_bias.clear();
      if (learned) gated.slot_bias = phasekv_test::random_bias(rng, sz(k.heads * k.g.window * k.channels));
      check_twin<vector_gated_pool, vector_gated_twin, Rope, Norm>(
          k, gated, vector_gated_twin(k.heads, k.g.window, k.channels, gated.slot_bias), rng);
    }
  }
}

}  // namespace

TEST_CASE("point twins: each built-in pooling through the extension point gives its entries bit for bit",
          "[compress][custom_pool][twins]") {
  check_every_twin<no_rope, no_norm>();
}

TEST_CASE("point twins: with RMSNorm and RoPE after pooling, as DeepSeek-V4 composes them",
          "[compress][custom_pool][twins]") {
  check_every_twin<rope_after_pool, rms_norm>();
}

TEST_CASE("point twins: a twin used with another stream's shape is an error naming the field",
          "[compress][custom_pool][twins][errors]") {
  CHECK_THROWS_AS(vector_gated_twin(1, 8, 16, std::vector<float>(7)), config_error);
  CHECK_THROWS_WITH(vector_gated_twin(1, 8, 16, std::vector<float>(7)), Catch::Contains("gated_twin.bias.size() = 7"));
  const case_shape k{geometry{4, 8}, 1, 16, input_layout::per_branch};
  const stream_compressor<compressor_policy<vector_gated_twin>> s(k.g, config_of(k, false), {},
                                                                    vector_gated_twin(1, 4, 16));
  std::vector<float> x(sz(8 * s.payload_floats_per_token()), 1.0f), l(sz(8 * s.logit_floats_per_token()), 0.0f);
  stream_state st = s.make_state();
  const stream_state before = st;
  entry_buffer out;
  CHECK_THROWS_WITH(s.append(st, token_chunk{8, x, l}, out), Catch::Contains("gated_twin.window = 4"));
  CHECK(st == before);
}

namespace {

// Records how each pool() call received its rows, and checks they are the right tokens' rows.
template <bool ReadsBf16>
struct row_probe {
  static constexpr const char* name = "row_probe";
  static constexpr std::uint32_t version = 1;
  static constexpr bool reads_bf16_rows = ReadsBf16;
  static constexpr i64 gate_channels(i64 channels) { return channels; }

  struct call {
    i64 entry;
    bool payload_bf16, logits_bf16, exactly_one, rows_match;
  };
  std::shared_ptr<std::vector<call>> calls = std::make_shared<std::vector<call>>();
  const std::vector<float>* x = nullptr;  // the inputs, [token][C] (one head, one view)

  void pool(const window_rows& w, float* out) const {
    bool match = true;
    for (i64 k = 0; k < w.count(); ++k)
      for (i64 c = 0; c < w.channels; ++c) {
        const float got = w.payload_bf16 ? simd::bf16_to_float(w.payload_bf16[k][c]) : w.payload[k][c];
        match = match && got == (*x)[sz(w.position(k) * w.channels + c)];
      }
    calls->push_back({w.entry, w.payload_bf16 != nullptr, w.logits_bf16 != nullptr,
                      (w.payload == nullptr) != (w.payload_bf16 == nullptr) &&
                          (w.logits == nullptr) != (w.logits_bf16 == nullptr),
                      match});
    std::fill(out, out + w.channels, 0.0f);
  }
};

}  // namespace

TEST_CASE("point twins: a policy that reads bf16 rows gets them in place exactly when the entry's rows all lie in "
          "the chunk", "[compress][custom_pool][twins][bf16]") {
  const geometry g{4, 4};  // W = S: one branch, one view, token t's row is x[t]
  const i64 C = 16, T = 29, first_chunk = 11;  // entry 2 (tokens 8…11) straddles the two chunks
  stream_config c;
  c.name = "kv";
  c.kv_heads = 1;
  c.channels = C;
  c.inputs = input_layout::per_branch;
  std::mt19937 rng(7);
  std::vector<float> x = phasekv_test::random_uniform(rng, sz(T * C), -2.0f, 2.0f);
  for (float& v : x) v = simd::bf16_to_float(float_to_bf16(v));  // exactly representable in bf16
  std::vector<std::uint16_t> x16(x.size()), l16(x.size(), float_to_bf16(0.5f));
  for (std::size_t i = 0; i < x.size(); ++i) x16[i] = float_to_bf16(x[i]);

  const auto check = [&](auto probe, bool reads_bf16) {
    probe.x = &x;
    const stream_compressor<compressor_policy<decltype(probe)>> s(g, c, {}, probe);
    REQUIRE(s.payload_floats_per_token() == C);
    stream_state st = s.make_state();
    entry_buffer out;
    for (const auto& [begin, end] : {std::pair<i64, i64>{0, first_chunk}, std::pair<i64, i64>{first_chunk, T}}) {
      token_chunk chunk;
      chunk.tokens = end - begin;
      chunk.payload_bf16 = span<const std::uint16_t>(x16.data() + begin * C, sz((end - begin) * C));
      chunk.logits_bf16 = span<const std::uint16_t>(l16.data() + begin * C, sz((end - begin) * C));
      s.append(st, chunk, out);
    }
    REQUIRE(probe.calls->size() == sz(g.completed_entries(T)));
    for (const auto& k : *probe.calls) {
      INFO("entry " << k.entry << ", reads_bf16_rows " << reads_bf16);
      // Entry j's real rows are its tokens from max(0, first slot's token) to j·S + S − 1.
      const i64 first_token = std::max<i64>(0, g.slot_token(k.entry, g.first_real_slot(k.entry)));
      const i64 last_token = g.slot_token(k.entry, g.window - 1);
      const bool in_chunk = last_token < first_chunk || first_token >= first_chunk;
      CHECK(k.exactly_one);
      CHECK(k.rows_match);
      CHECK(k.payload_bf16 == (reads_bf16 && in_chunk));
      CHECK(k.logits_bf16 == (reads_bf16 && in_chunk));
    }
    const auto in_place = std::count_if(probe.calls->begin(), probe.calls->end(), [](const auto& k) { return k.payload_bf16; });
    if (reads_bf16) CHECK(in_place > 0);
    if (reads_bf16) CHECK(in_place < static_cast<std::ptrdiff_t>(probe.calls->size()));  // one straddles
  };
  check(row_probe<true>{}, true);
  check(row_probe<false>{}, false);
}

}  // namespace test_compress_point_twins
