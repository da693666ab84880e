// Inputs that once crashed the library or were silently wrong,
// each pinned by a test that failed before its fix, and the defined behaviour of the inputs the
// probe found unchecked. Allocation failures inside calls are tested in tests/fault/.
//
//   1. de-rotation on a stream whose policy applies no RoPE (heap corruption / wrong output)
//   2. token counts whose size products overflow (reads past the chunk)
//   3. stream shapes whose products overflow (null dereference)
//   4. raw-window shapes whose products overflow
//   5. history = INT64_MAX (negative ring sizes)
//   6. sizes within the type but beyond memory (std::bad_alloc escaping)
//   +  non-finite queries, indexer weights and sinks; another cache's sequence ids; a state made
//      by another compressor

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oracle/cache_dump.hpp"
#include "support/prelude.hpp"
#include "support/reliability_layers.hpp"
#include "support/configs.hpp"
#include "support/message_of.hpp"
#include "phasekv/cache/page_pool.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace test_reliability {

namespace {

using namespace phasekv_test::prelude;
using namespace phasekv_test::reliability_layers;

using rope_cache = paged_cache<rope_stream, mean_stream>;
using mean_reader = sparse_reader;
using rope_reader = sparse_reader;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

stream_config config(const std::string& name, i64 channels, i64 kv_heads = 1) {
  stream_config c;
  c.name = name;
  c.channels = channels;
  c.kv_heads = kv_heads;
  return c;
}

cache_config tied_window(i64 channels, i64 tokens = 4) {
  cache_config cc;
  cc.page_size = 2;
  cc.pages = 16;
  cc.window.tokens = tokens;
  cc.window.key_channels = channels;
  return cc;
}

std::vector<float> ramp(i64 n, float step = 0.01f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (i64 i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = std::sin(static_cast<float>(i) * step + 0.3f);
  return v;
}

// A mean-pooled tied-K/V cache with one sequence of `tokens` tokens.
struct mean_world {
  static constexpr i64 channels = 8;
  mean_cache cache;
  sequence_id seq;
  explicit mean_world(stream_config c = config("kv", channels), i64 tokens = 9)
      : cache(layer_compressor<mean_stream>(mean_stream(geometry{2, 4}, std::move(c))), tied_window(channels)),
        seq(cache.create()) {
    const auto payload = ramp(tokens * cache.compressors().stream<0>().payload_floats_per_token());
    const auto window = ramp(tokens * channels, 0.02f);
    cache.append(seq, {token_chunk{tokens, payload, {}}}, window);
  }
};

// ---- 1. de-rotation needs a stream that applies RoPE ------------------------------------------

TEST_CASE("reliability: derotate_output on a stream whose policy applies no RoPE is a config_error",
          "[reliability][read]") {
  // An out-of-range rope config (120 > 8 channels) on a no-RoPE stream: the compressor ignores
  // it, and the reader must not use it (it used to write 56 floats before the output buffer).
  stream_config bad = config("kv", mean_world::channels);
  bad.rope.channels = 120;
  mean_world w(bad);
  reader_config rc;
  rc.query_heads = 2;
  rc.derotate_output = true;
  REQUIRE_THAT(message_of<config_error>([&] { mean_reader(w.cache, rc); }),
               Contains("reader.derotate_output = true") && Contains("stream 'kv' rotates nothing"));

  // A valid rope config on a no-RoPE stream: no entry was rotated, so de-rotating the output
  // by −t would be silently wrong. Rejected the same way.
  stream_config valid = config("kv", mean_world::channels);
  valid.rope.channels = 4;
  mean_world v(valid);
  REQUIRE_THAT(message_of<config_error>([&] { mean_reader(v.cache, rc); }), Contains("rotates nothing"));

  // Without de-rotation the same cache reads normally: the ignored rope config is harmless.
  rc.derotate_output = false;
  mean_reader reader(w.cache, rc);
  std::vector<float> out(2 * mean_world::channels);
  const auto q = ramp(2 * mean_world::channels, 0.1f);
  REQUIRE_NOTHROW(reader.read(w.cache, w.seq, read_request{8, q, {}, {}, {}}, out.data()));
  for (float x : out) REQUIRE(std::isfinite(x));
}

TEST_CASE("reliability: a RoPE policy validates its rope config; other policies ignore it", "[reliability][compress]") {
  stream_config c = config("k", 8);
  c.rope.channels = 120;
  REQUIRE_NOTHROW(mean_stream(geometry{2, 4}, c));
  REQUIRE_THAT(message_of<config_error>([&] { rope_stream(geometry{2, 4}, c); }),
               Contains("k.rope.channels = 120") && Contains("at most the vector's channels (8)"));
  c.rope.channels = 3;
  REQUIRE_NOTHROW(mean_stream(geometry{2, 4}, c));
  REQUIRE_THAT(message_of<config_error>([&] { rope_stream(geometry{2, 4}, c); }), Contains("k.rope.channels = 3"));
}

// ---- 2. token counts whose products overflow ---------------------------------------------------

TEST_CASE("reliability: huge token counts with small spans are input_errors, not overflowed sizes",
          "[reliability][compress][cache]") {
  const mean_stream keys(geometry{2, 4}, config("keys", 2, 2));  // 2 heads × 2 branches × 2 channels
  stream_state state = keys.make_state();
  const stream_state before = state;
  const std::vector<float> eight(8, 1.0f);
  auto sink = [](const entry_view&) { FAIL("no entry may be emitted"); };

  // (2^61 + 1) × 8 wraps to 8 (mod 2^64): an 8-float span used to pass as 2^61 + 1 tokens.
  REQUIRE_THAT(message_of<input_error>([&] { keys.append(state, token_chunk{(i64{1} << 61) + 1, eight, {}}, sink); }),
               Contains("keys: chunk.tokens = 2305843009213693953") && Contains("2^48"));
  // Within the token bound, but tokens × 8 floats is no span that exists.
  REQUIRE_THAT(message_of<input_error>([&] { keys.append(state, token_chunk{i64{1} << 47, eight, {}}, sink); }),
               Contains("keys: chunk.payload.size() = 8") && Contains("chunk.tokens × 8"));
  REQUIRE(state == before);

  // The cache's raw-window check had the same overflow.
  mean_world w(config("kv", mean_world::channels));
  const phasekv_test::cache_dump dump = phasekv_test::dump(w.cache);
  const std::vector<float> window(8, 1.0f);
  const i64 tokens = (i64{1} << 61) + 1;  // × 8 window floats wraps to 8
  REQUIRE_THAT(message_of<input_error>(
                   [&] { w.cache.append(w.seq, {token_chunk{tokens, window, {}}}, window); }),
               Contains("window_keys.size() = 8"));
  REQUIRE(phasekv_test::first_difference(phasekv_test::dump(w.cache), dump) == "");
}

// ---- 3. and 4. shapes whose products overflow --------------------------------------------------

TEST_CASE("reliability: stream and window shapes beyond the documented bounds are config_errors",
          "[reliability][compress][cache]") {
  REQUIRE_THAT(message_of<config_error>([&] { mean_stream(geometry{2, 4}, config("k", i64{1} << 62, 4)); }),
               Contains("k.channels = 4611686018427387904") && Contains("[1, 2^20]"));
  REQUIRE_THAT(message_of<config_error>([&] { mean_stream(geometry{2, 4}, config("k", 8, i64{1} << 32)); }),
               Contains("k.kv_heads = 4294967296"));
  // Each factor within its bound, the product (2^20 channels × 2^16 heads × 2^20 slots) not.
  stream_config wide = config("k", i64{1} << 20, i64{1} << 16);
  wide.inputs = input_layout::per_slot;
  REQUIRE_THAT(message_of<config_error>([&] { mean_stream(geometry{1, i64{1} << 20}, wide); }),
               Contains("k.channels = 1048576") && Contains("kv_heads × views × channels"));

  cache_config cc = tied_window(8);
  cc.window.kv_heads = i64{1} << 32;
  cc.window.key_channels = i64{1} << 32;
  REQUIRE_THAT(message_of<config_error>([&] { cc.validate(); }), Contains("cache.window.kv_heads = 4294967296"));
  cc.window.kv_heads = i64{1} << 16;
  cc.window.key_channels = i64{1} << 20;
  cc.window.tokens = i64{1} << 32;
  REQUIRE_THAT(message_of<config_error>([&] { cc.validate(); }),
               Contains("cache.window.tokens = 4294967296") && Contains("raw window ring"));
}

// ---- 5. and 6. history and sizes beyond memory -------------------------------------------------

TEST_CASE("reliability: history beyond its bound is rejected before anything is allocated", "[reliability][cache]") {
  const mean_stream keys(geometry{2, 4}, config("keys", 8));
  REQUIRE_THAT(message_of<input_error>([&] { (void)keys.make_state(std::numeric_limits<i64>::max()); }),
               Contains("keys: history = 9223372036854775807") && Contains("[0, 2^40]"));
  REQUIRE_THAT(message_of<input_error>([&] { (void)keys.make_state(-1); }), Contains("keys: history = -1"));

  cache_config cc = tied_window(8);
  cc.history = std::numeric_limits<i64>::max();
  REQUIRE_THAT(message_of<config_error>([&] { mean_cache(layer_compressor<mean_stream>(keys), cc); }),
               Contains("cache.history = 9223372036854775807"));
  // Within the bound, but the rings of a 512-float-per-token stream would pass 2^48 bytes.
  cc.history = i64{1} << 40;
  const mean_stream wide(geometry{2, 4}, config("wide", 512));
  cc.window.key_channels = 8;
  REQUIRE_THAT(message_of<config_error>([&] { mean_cache(layer_compressor<mean_stream>(wide), cc); }),
               Contains("cache.history = 1099511627776") && Contains("input ring of stream 'wide'"));
}

// AddressSanitizer's operator new reports an allocation beyond memory and aborts instead of
// throwing std::bad_alloc, whatever its options say; the plain builds run this test.
#if defined(__SANITIZE_ADDRESS__)
#define PHASEKV_TEST_REAL_BAD_ALLOC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PHASEKV_TEST_REAL_BAD_ALLOC 0
#endif
#endif
#ifndef PHASEKV_TEST_REAL_BAD_ALLOC
#define PHASEKV_TEST_REAL_BAD_ALLOC 1
#endif

TEST_CASE("reliability: sizes within the bounds but beyond memory are capacity_errors naming the field",
          "[reliability][cache]") {
  if (!PHASEKV_TEST_REAL_BAD_ALLOC) {
    WARN("skipped under AddressSanitizer, whose operator new aborts instead of throwing std::bad_alloc");
    return;
  }
  // 2^40 tokens of history × 8 floats: 32 TiB of rings, accepted by the bounds, refused by the
  // allocator.
  const mean_stream keys(geometry{2, 4}, config("keys", 8));
  REQUIRE_THAT(message_of<capacity_error>([&] { (void)keys.make_state(i64{1} << 40); }),
               Contains("keys: history = 1099511627776") && Contains("could not be allocated"));

  cache_config cc = tied_window(8);
  cc.history = i64{1} << 40;
  cc.window.tokens = 0;
  mean_cache cache(layer_compressor<mean_stream>(keys), cc);
  REQUIRE_THAT(message_of<capacity_error>([&] { (void)cache.create(); }), Contains("history = 1099511627776"));
  REQUIRE(cache.sequences() == 0);

  cache_config windowed = tied_window(512, i64{1} << 32);  // an 8 TiB window ring per sequence
  mean_cache big_window(layer_compressor<mean_stream>(mean_stream(geometry{2, 4}, config("kv", 512))), windowed);
  REQUIRE_THAT(message_of<capacity_error>([&] { (void)big_window.create(); }),
               Contains("cache.window.tokens = 4294967296") && Contains("could not be allocated"));
  REQUIRE(big_window.sequences() == 0);

  // A 256 GiB pool: 2^22 pages of 64 KiB.
  const page_pool_config pool = phasekv_test::pool_of("pool", 64, 1, 256, i64{1} << 22);
  REQUIRE_THAT(message_of<capacity_error>([&] { page_pool p(pool); }),
               Contains("pool.capacity = 4194304") && Contains("274877906944 bytes"));
}

// ---- non-finite read inputs --------------------------------------------------------------------

// Tied K/V with RoPE and a mean-pooled indexer: every input of a read can be bad.
struct rope_world {
  static constexpr i64 channels = 8, query_heads = 2, indexer_heads = 2, indexer_channels = 4;
  rope_cache cache;
  sequence_id seq;
  rope_world() : cache(make(), tied_window(channels)), seq(cache.create()) {
    const i64 tokens = 11;
    const auto& kv = cache.compressors().stream<0>();
    const auto payload = ramp(tokens * kv.payload_floats_per_token());
    const auto logits = ramp(tokens * kv.logit_floats_per_token(), 0.03f);
    const auto index = ramp(tokens * cache.compressors().stream<1>().payload_floats_per_token(), 0.05f);
    cache.append(seq, {token_chunk{tokens, payload, logits}, token_chunk{tokens, index, {}}},
                 ramp(tokens * channels, 0.07f));
  }
  static layer_compressor<rope_stream, mean_stream> make() {
    stream_config kv = config("kv", channels);
    kv.rope.channels = 4;
    return layer_compressor<rope_stream, mean_stream>(rope_stream(geometry{2, 4}, kv),
                                                      mean_stream(geometry{2, 4}, config("ix", indexer_channels)));
  }
  reader_config reader() const {
    reader_config rc;
    rc.query_heads = query_heads;
    rc.indexer_stream = 1;
    rc.top_k = 2;
    rc.indexer_heads = indexer_heads;
    rc.sink = true;
    rc.derotate_output = true;
    return rc;
  }
};

TEST_CASE("reliability: non-finite queries, indexer weights and sinks are input_errors; a −inf sink is no sink",
          "[reliability][read]") {
  rope_world w;
  rope_reader reader(w.cache, w.reader());
  std::vector<float> q = ramp(rope_world::query_heads * rope_world::channels, 0.1f);
  std::vector<float> iq = ramp(rope_world::indexer_heads * rope_world::indexer_channels, 0.2f);
  std::vector<float> iw{1.0f, 0.5f}, sinks{0.3f, -0.2f};
  std::vector<float> out(q.size());
  auto read = [&] { reader.read(w.cache, w.seq, read_request{10, q, iq, iw, sinks}, out.data()); };
  REQUIRE_NOTHROW(read());

  auto expect = [&](std::vector<float>& v, std::size_t i, float bad, const std::string& field) {
    const float kept = v[i];
    v[i] = bad;
    REQUIRE_THAT(message_of<input_error>(read), Contains("reader: request." + field + "[" + std::to_string(i) + "]"));
    v[i] = kept;
  };
  expect(iw, 1, kNaN, "indexer_weights");  // used to make top-k return the lowest ids
  expect(iw, 0, kInf, "indexer_weights");
  expect(q, 13, kNaN, "queries");
  expect(q, 0, -kInf, "queries");
  expect(iq, 5, kInf, "indexer_queries");
  expect(sinks, 0, kInf, "sinks");  // used to give an all-NaN output
  expect(sinks, 1, kNaN, "sinks");

  // −inf: the sink takes no mass, exactly as if it were off.
  sinks = {-kInf, -kInf};
  read_trace trace;
  reader.read(w.cache, w.seq, read_request{10, q, iq, iw, sinks}, out.data(), &trace);
  reader_config no_sink = w.reader();
  no_sink.sink = false;
  rope_reader plain(w.cache, no_sink);
  std::vector<float> want(out.size());
  plain.read(w.cache, w.seq, read_request{10, q, iq, iw, {}}, want.data());
  REQUIRE(out == want);
  REQUIRE(trace.sink_mass == Approx(0.0f).margin(1e-6));
}

// ---- ids and states that belong elsewhere -------------------------------------------------------

TEST_CASE("reliability: a sequence id of another cache is rejected as unknown", "[reliability][cache]") {
  mean_world a, b;
  REQUIRE(a.cache.contains(a.seq));
  REQUIRE_FALSE(a.cache.contains(b.seq));
  REQUIRE_FALSE(b.cache.contains(a.seq));
  REQUIRE_THAT(message_of<input_error>([&] { (void)a.cache.tokens(b.seq); }),
               Contains("cache.tokens(sequence) = " + std::to_string(b.seq)) &&
                   Contains("is not a live sequence of this cache"));
  const phasekv_test::cache_dump before = phasekv_test::dump(a.cache);
  REQUIRE_THROWS_AS(a.cache.free(b.seq), input_error);
  REQUIRE_THROWS_AS(a.cache.fork(b.seq), input_error);
  REQUIRE(phasekv_test::first_difference(phasekv_test::dump(a.cache), before) == "");
  reader_config rc;
  rc.query_heads = 1;
  mean_reader reader(a.cache, rc);
  std::vector<float> out(mean_world::channels);
  const auto q = ramp(mean_world::channels);
  REQUIRE_THAT(message_of<input_error>([&] { reader.read(a.cache, b.seq, read_request{0, q, {}, {}, {}}, out.data()); }),
               Contains("is not a live sequence of this cache"));
}

TEST_CASE("reliability: a state continues only on a compressor of its geometry and shape", "[reliability][compress]") {
  // Per-slot inputs: 4 views of 4 channels per token for any W = 4 geometry.
  stream_config c = config("s2", 4);
  c.inputs = input_layout::per_slot;
  const mean_stream s2(geometry{2, 4}, c);
  c.name = "s4";
  const mean_stream s4(geometry{4, 4}, c);  // same shape and ring, other stride
  c.name = "wide";
  c.channels = 8;
  const mean_stream wide(geometry{2, 4}, c);
  stream_state state = s2.make_state();
  auto ignore = [](const entry_view&) {};
  s2.append(state, token_chunk{4, ramp(4 * 16), {}}, ignore);
  const stream_state before = state;
  REQUIRE_THAT(message_of<input_error>([&] { s4.append(state, token_chunk{4, ramp(4 * 16), {}}, ignore); }),
               Contains("s4: state = S=2 W=4 origin=0") && Contains("was not made for this compressor (S=4"));
  REQUIRE_THAT(message_of<input_error>([&] { wide.append(state, token_chunk{2, ramp(2 * 32), {}}, ignore); }),
               Contains("wide: state"));
  stream_state unmade;
  REQUIRE_THAT(message_of<input_error>([&] { s2.append(unmade, token_chunk{}, ignore); }), Contains("s2: state = S=0"));
  REQUIRE(state == before);

  // Same geometry and shape, other parameters: the state holds only the host's inputs, so the
  // other compressor may continue it (an intervention that swaps gate biases mid-sequence).
  using fixed_stream = stream_compressor<compressor_policy<fixed_weight_pool>>;
  stream_params one_hot;
  one_hot.slot_profile = {0.0f, 0.0f, 0.0f, 1.0f};
  c.name = "fixed";
  c.channels = 4;
  const fixed_stream last_slot(geometry{2, 4}, c, one_hot);
  const std::vector<float> chunk = ramp(2 * 16, 0.5f);
  std::vector<float> entry;
  last_slot.append(state, token_chunk{2, chunk, {}}, [&](const entry_view& e) { entry.assign(e.values, e.values + 4); });
  // Entry 2 pools tokens 2–5; slot 3 is token 5, the chunk's second token, read through view 3.
  REQUIRE(entry == std::vector<float>(chunk.begin() + 16 + 12, chunk.begin() + 32));
}

}  // namespace

}  // namespace test_reliability
