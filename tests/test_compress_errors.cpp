// What the compressor refuses, and how: bad configurations throw config_error and bad calls
// throw input_error, each naming the field and its value (STYLE.md); nothing is half-applied —
// after a throw the state equals a copy taken before the call and no entry reached the sink,
// also when the sink itself throws.

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/prelude.hpp"
#include "support/random_inputs.hpp"
#include "support/message_of.hpp"
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"

namespace test_compress_errors {

namespace {

using namespace phasekv_test::prelude;
using namespace phasekv_test;
using Catch::Matchers::Equals;

using mean_plain = compressor_policy<mean_pool>;
using mean_rope = compressor_policy<mean_pool, rope_after_pool>;
using vector_full = compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>;
using scalar_before = compressor_policy<scalar_gated_pool, rope_before_pool>;
using fixed_plain = compressor_policy<fixed_weight_pool>;

const float nan_value = std::numeric_limits<float>::quiet_NaN();
const float inf_value = std::numeric_limits<float>::infinity();

stream_config make_config(std::int64_t channels = 8, std::int64_t heads = 2) {
  stream_config c;
  c.name = "keys";
  c.channels = channels;
  c.kv_heads = heads;
  c.rope.channels = 4;
  return c;
}

template <class Policy>
std::string config_message(const geometry& g, const stream_config& c, const stream_params& p = {}) {
  return message_of<config_error>([&] { stream_compressor<Policy> compressor(g, c, p); });
}

}  // namespace

TEST_CASE("compressor config errors name the field and the value", "[compress][errors]") {
  const stream_config ok = make_config();
  const geometry g = geometry{4, 8};

  CHECK_THAT(config_message<mean_plain>(geometry{0, 8}, ok), Contains("geometry.stride = 0"));
  CHECK_THAT(config_message<mean_plain>(geometry{4, 3}, ok), Contains("geometry.window = 3"));
  CHECK_THAT(config_message<mean_plain>(geometry{4, 8, 4}, ok), Contains("geometry.origin = 4"));
  CHECK_THAT(config_message<mean_plain>(geometry{4, 8, -1}, ok), Contains("geometry.origin = -1"));

  stream_config c = ok;
  c.channels = 0;
  CHECK_THAT(config_message<mean_plain>(g, c), Contains("keys.channels = 0"));
  c = ok;
  c.kv_heads = 0;
  CHECK_THAT(config_message<mean_plain>(g, c), Contains("keys.kv_heads = 0"));

  SECTION("RoPE") {
    c = ok;
    c.rope.channels = 3;
    CHECK_THAT(config_message<mean_rope>(g, c), Contains("keys.rope.channels = 3"));
    CHECK_THAT(config_message<scalar_before>(g, c), Contains("keys.rope.channels = 3"));
    c.rope.channels = 10;  // > 8 channels
    CHECK_THAT(config_message<mean_rope>(g, c), Contains("keys.rope.channels = 10"));
    c.rope.channels = 0;
    CHECK_THAT(config_message<mean_rope>(g, c), Contains("keys.rope.channels = 0"));
    CHECK_THAT(config_message<mean_plain>(g, c), Equals("<no exception>"));  // no RoPE: not read
    c.rope.channels = -2;
    CHECK_THAT(config_message<vector_full>(g, c), Contains("keys.rope.channels = -2"));
    c = ok;
    c.rope.base = 1.0;
    CHECK_THAT(config_message<mean_rope>(g, c), Contains("keys.rope.base = 1"));
    c.rope.base = std::numeric_limits<double>::quiet_NaN();
    CHECK_THAT(config_message<mean_rope>(g, c), Contains("keys.rope.base = nan"));
  }

  SECTION("YaRN") {
    c = ok;
    c.rope.yarn.enabled = true;
    c.rope.yarn.original_context = 4096;
    c.rope.yarn.factor = 0.5;
    CHECK_THAT(config_message<mean_rope>(g, c), Contains("keys.rope.yarn.factor = 0.5"));
    c.rope.yarn.factor = 4;
    c.rope.yarn.original_context = 0;
    CHECK_THAT(config_message<mean_rope>(g, c), Contains("keys.rope.yarn.original_context = 0"));
    c.rope.yarn.original_context = 4096;
    c.rope.yarn.beta_fast = 1.0;  // not above beta_slow = 1
    CHECK_THAT(config_message<mean_rope>(g, c), Contains("keys.rope.yarn.beta_fast = 1"));
    c.rope.yarn.beta_fast = 32;
    c.rope.yarn.beta_slow = -1;
    CHECK_THAT(config_message<mean_rope>(g, c), Contains("keys.rope.yarn.beta_slow = -1"));
    c.rope.yarn.beta_slow = 1;
    CHECK_THAT(config_message<mean_rope>(g, c), Equals("<no exception>"));
  }

  SECTION("gate bias") {
    stream_params p;
    p.slot_bias.assign(2 * 8 * 8 - 1, 0.0f);  // [kv_heads 2][window 8][channels 8], one short
    CHECK_THAT(config_message<vector_full>(g, ok, p), Contains("keys.slot_bias.size() = 127"));
    p.slot_bias.assign(2 * 8, 0.0f);  // the scalar-gate size is wrong for vector gates
    CHECK_THAT(config_message<vector_full>(g, ok, p), Contains("keys.slot_bias.size() = 16"));
    CHECK_THAT(config_message<scalar_before>(g, ok, p), Equals("<no exception>"));
    p.slot_bias[5] = nan_value;
    CHECK_THAT(config_message<scalar_before>(g, ok, p), Contains("keys.slot_bias[5] = nan"));
    p.slot_bias[5] = -inf_value;
    CHECK_THAT(config_message<scalar_before>(g, ok, p), Contains("keys.slot_bias[5] = -inf"));
    p.slot_bias[5] = 0.0f;
    CHECK_THAT(config_message<mean_plain>(g, ok, p), Contains("keys.slot_bias.size() = 16"));
    CHECK_THAT(config_message<fixed_plain>(g, ok, p), Contains("keys.slot_bias.size() = 16"));
  }

  SECTION("norm weight") {
    stream_params p;
    p.norm_weight.assign(7, 1.0f);
    CHECK_THAT(config_message<vector_full>(g, ok, p), Contains("keys.norm_weight.size() = 7"));
    p.norm_weight.assign(8, 1.0f);
    p.norm_weight[2] = inf_value;
    CHECK_THAT(config_message<vector_full>(g, ok, p), Contains("keys.norm_weight[2] = inf"));
    p.norm_weight[2] = 1.0f;
    CHECK_THAT(config_message<mean_plain>(g, ok, p), Contains("keys.norm_weight.size() = 8"));
    c = ok;
    c.norm_eps = 0.0;
    CHECK_THAT(config_message<vector_full>(g, c), Contains("keys.norm_eps = 0"));
  }

  SECTION("slot profile") {
    stream_params p;
    CHECK_THAT(config_message<fixed_plain>(g, ok, p), Contains("keys.slot_profile.size() = 0"));
    p.slot_profile = {1, 1, 1};
    CHECK_THAT(config_message<fixed_plain>(g, ok, p), Contains("keys.slot_profile.size() = 3"));
    p.slot_profile = {1, 1, 1, -0.5f, 1, 1, 1, 1};
    CHECK_THAT(config_message<fixed_plain>(g, ok, p), Contains("keys.slot_profile[3] = -0.5"));
    p.slot_profile = {1, 1, 1, 1, nan_value, 1, 1, 1};
    CHECK_THAT(config_message<fixed_plain>(g, ok, p), Contains("keys.slot_profile[4] = nan"));
    p.slot_profile.assign(8, 0.0f);
    CHECK_THAT(config_message<fixed_plain>(g, ok, p), Contains("keys.slot_profile") && Contains("= 0"));
    p.slot_profile.assign(8, 1.0f);
    CHECK_THAT(config_message<fixed_plain>(g, ok, p), Equals("<no exception>"));
    CHECK_THAT(config_message<mean_plain>(g, ok, p), Contains("keys.slot_profile.size() = 8"));
    CHECK_THAT(config_message<vector_full>(g, ok, p), Contains("keys.slot_profile.size() = 8"));
  }
}

namespace {

// A compressor with some history, the inputs of a valid next chunk, and a recording sink.
template <class Policy>
struct input_fixture {
  stream_compressor<Policy> compressor;
  stream_state state;
  stream_inputs in;
  std::int64_t tokens;

  input_fixture(const stream_params& params = {}, std::int64_t tokens_ = 6)
      : compressor(geometry{4, 8}, make_config(), params), state(compressor.make_state()), tokens(tokens_) {
    std::mt19937 rng(11);
    const std::int64_t ppt = compressor.payload_floats_per_token(), lpt = compressor.logit_floats_per_token();
    const stream_inputs history = random_stream_inputs(rng, 7, ppt, lpt);
    token_chunk first;
    first.tokens = 7;
    first.payload = history.payload;
    first.logits = history.logits;
    compressor.append(state, first, [](const entry_view&) {});  // 7 tokens: entry 0 out, block 1 pending
    in = random_stream_inputs(rng, tokens, ppt, lpt);
  }
  token_chunk chunk() const {
    token_chunk c;
    c.tokens = tokens;
    c.payload = in.payload;
    c.logits = in.logits;
    return c;
  }
  // Runs append (and check) on a chunk that must be refused; returns the input_error message
  // and checks that the state and the sink were untouched.
  std::string refused(const token_chunk& c, const append_options& options = {}) {
    const stream_state before = state;
    std::int64_t entries = 0;
    const std::string message = message_of<input_error>([&] {
      compressor.append(state, c, [&](const entry_view&) { ++entries; }, options);
    });
    CHECK(entries == 0);
    CHECK(state == before);
    CHECK(state.tokens() == before.tokens());
    CHECK(message_of<input_error>([&] { compressor.check(state, c, options); }) == message);
    return message;
  }
};

}  // namespace

TEST_CASE("compressor input errors name what was wrong and change nothing", "[compress][errors]") {
  SECTION("gated pooling") {
    input_fixture<vector_full> f;
    const std::int64_t ppt = f.compressor.payload_floats_per_token();  // 2 heads × 2 views × 8 = 32
    REQUIRE(ppt == 32);
    token_chunk c = f.chunk();
    c.payload = span<const float>(f.in.payload.data(), f.in.payload.size() - 1);
    CHECK_THAT(f.refused(c), Contains("keys") && Contains("payload.size() = 191") && Contains("192"));
    c = f.chunk();
    c.payload = span<const float>(nullptr, 192);
    CHECK_THAT(f.refused(c), Contains("payload.data()") && Contains("null"));
    c = f.chunk();
    c.logits = span<const float>(nullptr, 192);
    CHECK_THAT(f.refused(c), Contains("logits.data()") && Contains("null"));
    c = f.chunk();
    c.logits = span<const float>();
    CHECK_THAT(f.refused(c), Contains("logits.size() = 0"));
    c = f.chunk();
    c.tokens = -1;
    CHECK_THAT(f.refused(c), Contains("tokens = -1"));
    c = f.chunk();
    c.tokens = 7;  // more tokens than the spans hold
    CHECK_THAT(f.refused(c), Contains("payload.size() = 192") && Contains("224"));

    append_options strict;
    strict.check_finite = true;
    f.in.payload[ppt * 2 + 5] = nan_value;
    CHECK_THAT(f.refused(f.chunk(), strict), Contains("payload") && Contains("token 2") && Contains("nan"));
    f.in.payload[ppt * 2 + 5] = 0.5f;
    f.in.logits[ppt * 4 + 1] = -inf_value;  // logits per token = 32 as well
    CHECK_THAT(f.refused(f.chunk(), strict), Contains("logits") && Contains("token 4") && Contains("-inf"));
    f.in.payload[3] = inf_value;
    CHECK_THAT(f.refused(f.chunk(), strict), Contains("payload") && Contains("token 0") && Contains("inf"));

    // Without check_finite the same chunk is accepted (garbage in, garbage out).
    const stream_state before = f.state;
    std::int64_t entries = 0;
    CHECK_NOTHROW(f.compressor.append(f.state, f.chunk(), [&](const entry_view&) { ++entries; }));
    CHECK(entries == 2);
    CHECK(f.state.tokens() == before.tokens() + 6);
  }

  SECTION("mean pooling reads no logits") {
    input_fixture<mean_plain> f;
    REQUIRE(f.compressor.logit_floats_per_token() == 0);
    token_chunk c = f.chunk();
    const std::vector<float> stray(4, 0.0f);
    c.logits = stray;
    CHECK_THAT(f.refused(c), Contains("logits.size() = 4"));
    append_options strict;
    strict.check_finite = true;
    f.in.payload.back() = nan_value;
    CHECK_THAT(f.refused(f.chunk(), strict), Contains("payload") && Contains("token 5") && Contains("nan"));
  }

  SECTION("a state made by another compressor") {
    input_fixture<vector_full> f;
    const stream_compressor<vector_full> other(geometry{4, 8}, make_config(8, 1));
    stream_state foreign = other.make_state();
    const stream_state before = foreign;
    const std::string message =
        message_of<input_error>([&] { f.compressor.append(foreign, f.chunk(), [](const entry_view&) {}); });
    CHECK_THAT(message, Contains("state"));
    CHECK(foreign == before);
  }
}

TEST_CASE("a sink that throws leaves the state as it was", "[compress][errors]") {
  input_fixture<vector_full> f({}, 12);  // 7 + 12 tokens: entries 1, 2, 3 complete
  const stream_state before = f.state;
  REQUIRE(f.compressor.entries_after(f.state, 12) == 3);
  int calls = 0;
  const std::string message = message_of<std::runtime_error>([&] {
    f.compressor.append(f.state, f.chunk(), [&](const entry_view&) {
      if (++calls == 2) throw std::runtime_error("sink full");
    });
  });
  CHECK(message == "sink full");
  CHECK(calls == 2);
  CHECK(f.state == before);
  // And the same chunk then goes through, emitting all three entries.
  entry_buffer out;
  CHECK(f.compressor.append(f.state, f.chunk(), out) == 3);
  CHECK(out.index(0) == 1);
}

TEST_CASE("layer: a refused chunk or a throwing sink leaves every stream as it was", "[compress][errors]") {
  using key_policy = compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>;
  using value_policy = compressor_policy<scalar_gated_pool, no_rope, no_norm>;
  const geometry g = geometry{4, 8};
  stream_config kc = make_config(8, 1), vc = make_config(6, 1);
  kc.name = "keys";
  vc.name = "values";
  const layer_compressor<stream_compressor<key_policy>, stream_compressor<value_policy>> layer(
      stream_compressor<key_policy>(g, kc), stream_compressor<value_policy>(g, vc));
  auto states = layer.make_state();
  std::mt19937 rng(21);
  const std::int64_t n = 9;
  const auto k_in = random_stream_inputs(rng, n, layer.stream<0>().payload_floats_per_token(),
                                         layer.stream<0>().logit_floats_per_token());
  auto v_in = random_stream_inputs(rng, n, layer.stream<1>().payload_floats_per_token(),
                                   layer.stream<1>().logit_floats_per_token());
  auto chunks_of = [&](std::int64_t kt, std::int64_t vt) {
    decltype(layer)::chunks c;
    c[0].tokens = kt;
    c[0].payload = k_in.payload;
    c[0].logits = k_in.logits;
    c[1].tokens = vt;
    c[1].payload = v_in.payload;
    c[1].logits = v_in.logits;
    return c;
  };
  const auto before = states;
  int calls = 0;
  auto count = [&](std::size_t, const entry_view&) { ++calls; };
  CHECK_THAT(message_of<input_error>([&] { layer.append(states, chunks_of(9, 8), count); }),
             Contains("chunks[1].tokens = 8"));
  append_options strict;
  strict.check_finite = true;
  v_in.logits[3] = nan_value;  // only the second stream's chunk is bad
  CHECK_THAT(message_of<input_error>([&] { layer.append(states, chunks_of(9, 9), count, strict); }),
             Contains("values") && Contains("logits") && Contains("nan"));
  v_in.logits[3] = 0.0f;
  CHECK(calls == 0);
  CHECK(states == before);
  // The second stream's sink call throws after the first stream emitted: nothing advances.
  CHECK(message_of<std::runtime_error>([&] {
          layer.append(states, chunks_of(9, 9), [&](std::size_t stream, const entry_view&) {
            ++calls;
            if (stream == 1) throw std::runtime_error("value store full");
          });
        }) == "value store full");
  CHECK(calls == 3);  // two key entries, then the first value entry threw
  CHECK(states == before);
  CHECK(layer.append(states, chunks_of(9, 9), count) == 2);
  CHECK(states[0].tokens() == 9);
  CHECK(states[1].tokens() == 9);
}

TEST_CASE("layer: streams must share one geometry", "[compress][errors]") {
  using policy = compressor_policy<mean_pool>;
  const stream_config c = make_config(4, 1);
  using layer_t = layer_compressor<stream_compressor<policy>, stream_compressor<policy>>;
  CHECK_THAT(message_of<config_error>([&] {
               layer_t layer(stream_compressor<policy>(geometry{4, 8}, c),
                             stream_compressor<policy>(geometry{4, 8, 1}, c));
             }),
             Contains("streams[1]") && Contains("origin=1"));
}

}  // namespace test_compress_errors
