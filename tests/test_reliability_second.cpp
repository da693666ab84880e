// Inputs of the second adversarial probe — host-fed diagnostics, host-built views,
// checkpoint import, enums out of range — each pinned by a test that failed before its fix.
//
//   1. slot_weight_log: an entry index whose table size wraps in size_t
//   2. write_profile: an entry index whose slot tokens overflow
//   3. a host view whose token count overflows the visibility formulas
//   4. null spans given to deepseek::import_compressor and reorder_projected
//   7. a view read by a reader built for another geometry
//   8. enums out of range (indexer_precision, stream_role, rope_layout)
//   9. finite values that overflow inside (RMSNorm's x², 16-bit storage under check_finite)

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "oracle/cache_dump.hpp"
#include "support/prelude.hpp"
#include "support/reliability_layers.hpp"
#include "support/message_of.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/deepseek_checkpoint.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/diag/read_attribution.hpp"
#include "phasekv/diag/write_profile.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace test_reliability_second {

namespace {

using namespace phasekv_test::prelude;
using namespace phasekv_test::reliability_layers;

// A reader of one query head over the cache's one stream, every other field its default.
reader_config one_query_head() {
  reader_config rc;
  rc.query_heads = 1;
  return rc;
}

stream_config config(const std::string& name, i64 channels) {
  stream_config c;
  c.name = name;
  c.channels = channels;
  return c;
}

entry_view entry(i64 index, i64 window, const std::vector<float>& weights) {
  entry_view e;
  e.index = index;
  e.kv_heads = 1;
  e.channels = 1;
  e.window = window;
  e.values = weights.data();
  e.slot_weights = weights.data();
  return e;
}

// ---- 1. slot_weight_log ------------------------------------------------------------------------

TEST_CASE("reliability 2: slot_weight_log refuses an entry index whose table would wrap, keeping its entries",
          "[reliability][diag]") {
  diag::slot_weight_log log(4);
  const std::vector<float> w0{0.1f, 0.2f, 0.3f, 0.4f}, w1{1.0f, 2.0f, 3.0f, 4.0f};
  log(entry(0, 4, w0));
  log(entry(1, 4, w1));

  // (2^62 + 1) · 4 wraps to 4 in size_t: the weight table used to shrink to one entry while the
  // log still claimed entry 1, whose weights(1) then read past the buffer.
  REQUIRE_THAT(message_of<input_error>([&] { log(entry(i64{1} << 62, 4, w1)); }),
               Contains("slot_weight_log: entry.index = 4611686018427387904"));
  // Within the token limit but a table beyond one allocation's limit (2^51 bytes): refused, not
  // a bad_alloc.
  REQUIRE_THAT(message_of<input_error>([&] { log(entry(i64{1} << 47, 4, w1)); }),
               Contains("slot_weight_log: entry.index = 140737488355328") && Contains("limits::max_bytes"));

  REQUIRE(log.recorded() == 2);
  REQUIRE_FALSE(log.has(2));
  const span<const float> back = log.weights(1);
  REQUIRE(back.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) REQUIRE(back[i] == w1[i]);
  log(entry(1, 4, w0));  // re-recording still writes inside the table
  REQUIRE(log.weights(1)[3] == w0[3]);
}

// ---- 2. write_profile --------------------------------------------------------------------------

TEST_CASE("reliability 2: write_profile refuses an entry index whose slot tokens overflow", "[reliability][diag]") {
  const geometry g{2, 4};
  diag::write_profile profile(g, 1);
  const std::vector<float> w{0.25f, 0.25f, 0.25f, 0.25f};
  for (i64 j = 0; j < 4; ++j) profile(entry(j, 4, w));
  const auto before = profile.by_phase(0);

  // slot_token(2^62, slot) = (2^62 + 1)·2 − 4 + slot wraps negative: it used to write before the
  // heap buffer.
  REQUIRE_THAT(message_of<input_error>([&] { profile(entry(i64{1} << 62, 4, w)); }),
               Contains("write_profile: entry.index = 4611686018427387904") && Contains("2^48"));
  REQUIRE_THAT(message_of<input_error>([&] { profile(entry(i64{1} << 47, 4, w)); }),
               Contains("write_profile: entry.index") && Contains("limits::max_bytes"));
  REQUIRE_THAT(message_of<config_error>([&] { diag::write_profile(g, i64{1} << 40); }),
               Contains("write_profile.kv_heads = 1099511627776"));

  const auto after = profile.by_phase(0);
  REQUIRE(after.size() == before.size());
  for (std::size_t p = 0; p < after.size(); ++p) {
    REQUIRE(after[p].tokens == before[p].tokens);
    REQUIRE(after[p].mean_weight == before[p].mean_weight);
  }
}

// ---- 3. a host view's token count --------------------------------------------------------------

TEST_CASE("reliability 2: a view's token count beyond the token limit is an input_error", "[reliability][read]") {
  constexpr i64 channels = 8, tokens = 9;
  cache_config cc;
  cc.page_size = 2;
  cc.pages = 16;
  cc.window.tokens = 4;
  cc.window.key_channels = channels;
  mean_cache cache(layer_compressor<mean_stream>(mean_stream(geometry{2, 4, 1}, config("kv", channels))), cc);
  const sequence_id seq = cache.create();
  const std::vector<float> payload(static_cast<std::size_t>(tokens * channels * 2), 0.5f);
  const std::vector<float> window(static_cast<std::size_t>(tokens * channels), 0.25f);
  cache.append(seq, {token_chunk{tokens, payload, {}}}, window);

  sparse_reader reader(cache, one_query_head());
  const std::vector<float> q(channels, 0.1f);
  std::vector<float> out(channels, 7.0f);
  const std::vector<float> untouched = out;

  sequence_view v = cache.view_of(seq);
  v.tokens = std::numeric_limits<i64>::max();
  v.window.tokens = std::numeric_limits<i64>::max();
  v.window.first = v.window.tokens - 1;
  // visible_entries(INT64_MAX − 1) with origin 1 adds lead + 1 = 2: signed overflow before.
  REQUIRE_THAT(message_of<input_error>([&] {
                 reader.read(v, read_request{std::numeric_limits<i64>::max() - 1, q, {}, {}, {}}, out.data());
               }),
               Contains("view.tokens = 9223372036854775807") && Contains("2^48"));
  REQUIRE(out == untouched);

  // The cache's own view still reads.
  REQUIRE_NOTHROW(reader.read(cache, seq, read_request{tokens - 1, q, {}, {}, {}}, out.data()));
}

// ---- 7. a view read by a reader of another geometry ---------------------------------------------

TEST_CASE("reliability 2: a reader refuses a view pooled with another geometry", "[reliability][read]") {
  constexpr i64 channels = 8, tokens = 24;
  cache_config cc;
  cc.page_size = 4;
  cc.pages = 16;
  // The same stream config and page layout, strides 2 and 4: only the geometry tells them apart.
  mean_cache two(layer_compressor<mean_stream>(mean_stream(geometry{2, 2}, config("kv", channels))), cc);
  mean_cache four(layer_compressor<mean_stream>(mean_stream(geometry{4, 4}, config("kv", channels))), cc);
  const std::vector<float> payload(static_cast<std::size_t>(tokens * channels), 0.5f);
  const sequence_id a = two.create(), b = four.create();
  two.append(a, {token_chunk{tokens, payload, {}}});
  four.append(b, {token_chunk{tokens, payload, {}}});

  sparse_reader reader(four, one_query_head());
  const std::vector<float> q(channels, 0.1f);
  std::vector<float> out(channels, 7.0f);
  const std::vector<float> untouched = out;
  const read_request request{tokens - 1, q, {}, {}, {}};

  const sequence_view other = two.view_of(a);
  REQUIRE(other.geom == geometry{2, 2});
  REQUIRE_THAT(message_of<input_error>([&] { reader.read(other, request, out.data()); }),
               Contains("view.geom = stride 2, window 2, origin 0") && Contains("must be the reader's, stride 4"));
  REQUIRE_THAT(message_of<input_error>([&] { reader.read(two, a, request, out.data()); }), Contains("view.geom"));
  REQUIRE(out == untouched);

  // Its own cache's view reads; a host view that leaves the geometry unstated is taken on trust.
  REQUIRE_NOTHROW(reader.read(four, b, request, out.data()));
  const std::vector<float> own = out;
  sequence_view host = four.view_of(b);
  host.geom = sequence_view{}.geom;
  REQUIRE(host.geom.stride == 0);
  std::fill(out.begin(), out.end(), 7.0f);
  reader.read(host, request, out.data());
  REQUIRE(out == own);
}

// ---- 6. a view read after its sequence was freed or written ----------------------------------

TEST_CASE("reliability 2: a view read after its sequence was freed, shortened or written is stale",
          "[reliability][read]") {
  constexpr i64 channels = 8, tokens = 24;
  cache_config cc;
  cc.page_size = 4;
  cc.pages = 16;
  mean_cache cache(layer_compressor<mean_stream>(mean_stream(geometry{4, 4}, config("kv", channels))), cc);
  const std::vector<float> payload(static_cast<std::size_t>(tokens * channels), 0.5f);
  sparse_reader reader(cache, one_query_head());
  const std::vector<float> q(channels, 0.1f);
  std::vector<float> out(channels, 7.0f);
  const read_request request{tokens - 1, q, {}, {}, {}};
  const auto stale = [&](const sequence_view& v) {
    const std::vector<float> before = out;
    const std::string message = message_of<input_error>([&] { reader.read(v, request, out.data()); });
    CHECK(out == before);  // refused before anything is written
    return message;
  };

  const sequence_id a = cache.create(), b = cache.create();
  cache.append(a, {token_chunk{tokens, payload, {}}});
  cache.append(b, {token_chunk{tokens, payload, {}}});
  const sequence_view of_a = cache.view_of(a), of_b = cache.view_of(b);
  REQUIRE(of_a.stamp.current != nullptr);
  REQUIRE_NOTHROW(reader.read(of_a, request, out.data()));

  // Freed: its pages went back to the pool (a read would have been a use after free).
  cache.free(a);
  REQUIRE_THAT(stale(of_a), Contains("view = stale") && Contains("was freed or written since view_of()"));
  // Writes of another sequence leave a view current.
  const sequence_id c = cache.create();
  cache.append(c, {token_chunk{tokens, payload, {}}});
  REQUIRE_NOTHROW(reader.read(of_b, request, out.data()));
  // Appended to (its page table may have moved), shortened, overwritten by copy: stale each time.
  cache.append(b, {token_chunk{4, span<const float>(payload.data(), 4 * channels), {}}});
  REQUIRE_THAT(stale(of_b), Contains("view = stale"));
  const sequence_view after_append = cache.view_of(b);
  REQUIRE_NOTHROW(reader.read(after_append, request, out.data()));
  cache.remove_suffix(b, tokens);
  REQUIRE_THAT(stale(after_append), Contains("view = stale"));
  const sequence_view after_rollback = cache.view_of(b), of_c = cache.view_of(c);
  cache.copy(c, b);
  REQUIRE_THAT(stale(after_rollback), Contains("view = stale"));
  REQUIRE_NOTHROW(reader.read(of_c, request, out.data()));  // the source of a copy is not written
  // A refused append (a malformed chunk, or more than the pool can hold) writes nothing the view
  // shows and leaves it current; only an append that moved the page table makes it stale.
  const sequence_view current = cache.view_of(c);
  REQUIRE_THROWS_AS(cache.append(c, {token_chunk{2, span<const float>(payload.data(), 3), {}}}), input_error);
  REQUIRE_NOTHROW(reader.read(current, request, out.data()));
  const std::vector<float> lots(static_cast<std::size_t>(4 * 16 * 4 * channels), 0.5f);
  REQUIRE_THROWS_AS(cache.append(c, {token_chunk{4 * 16 * 4, lots, {}}}), capacity_error);
  REQUIRE_NOTHROW(reader.read(current, request, out.data()));
  // A host view without a stamp is read on trust.
  sequence_view host = cache.view_of(c);
  host.stamp = view_stamp{};
  REQUIRE_NOTHROW(reader.read(host, request, out.data()));
}

// ---- 4. null spans in the checkpoint import ----------------------------------------------------

TEST_CASE("reliability 2: deepseek import and reorder reject null spans that claim elements",
          "[reliability][compress][deepseek]") {
  using policy = presets::deepseek_v4_csa_policy;
  const geometry g = presets::deepseek_v4_csa_layer.geom;
  const stream_config kv = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
  const std::vector<float> ape(4 * 1024, 0.0f), norm(512, 1.0f), w(1024 * 8, 0.0f);
  deepseek::compressor_tensors t;
  t.ape = span<const float>(ape.data(), ape.size());
  t.norm_weight = span<const float>(norm.data(), norm.size());
  t.wkv = span<const float>(w.data(), w.size());
  t.wgate = span<const float>(w.data(), w.size());
  t.dim = 8;
  REQUIRE_NOTHROW(deepseek::import_compressor<policy>(g, kv, t));

  for (const char* which : {"ape", "norm_weight", "wkv", "wgate"}) {
    deepseek::compressor_tensors u = t;
    const std::string f = which;
    span<const float>& s = f == "ape" ? u.ape : f == "norm_weight" ? u.norm_weight : f == "wkv" ? u.wkv : u.wgate;
    s = span<const float>(nullptr, s.size());
    REQUIRE_THAT(message_of<input_error>([&] { deepseek::import_compressor<policy>(g, kv, u); }),
                 Contains(kv.name + "." + f + " = null"));
  }
  REQUIRE_THAT(message_of<input_error>([&] { deepseek::slot_bias_from_ape(g, 512, span<const float>(nullptr, 4096)); }),
               Contains("ape = null"));

  const i64 row = 2 * 512;
  std::vector<float> in(static_cast<std::size_t>(row), 1.0f), out(static_cast<std::size_t>(row), 0.0f);
  REQUIRE_THAT(message_of<input_error>([&] {
                 deepseek::reorder_projected(g, 512, 1, span<const float>(nullptr, in.size()), span<float>(out));
               }),
               Contains("in = null"));
  REQUIRE_THAT(message_of<input_error>([&] {
                 deepseek::reorder_projected(g, 512, 1, span<const float>(in), span<float>(nullptr, out.size()));
               }),
               Contains("out = null"));
  REQUIRE_THAT(message_of<input_error>([&] { deepseek::reorder_projected(g, 512, span<float>(nullptr, in.size())); }),
               Contains("rows = null"));
  // Empty null spans are empty, not errors.
  REQUIRE_NOTHROW(deepseek::reorder_projected(g, 512, 0, span<const float>(), span<float>()));
  REQUIRE_NOTHROW(deepseek::reorder_projected(g, 512, span<float>()));
}

// ---- 8. enums out of range ---------------------------------------------------------------------

TEST_CASE("reliability 2: every enum a caller passes is range-checked", "[reliability][read][compress]") {
  constexpr i64 channels = 8;
  cache_config cc;
  cc.page_size = 2;
  cc.pages = 16;
  mean_cache cache(layer_compressor<mean_stream>(mean_stream(geometry{2, 4}, config("kv", channels))), cc);

  reader_config rc = one_query_head();
  REQUIRE_NOTHROW(sparse_reader(cache, rc));
  // Python's IndexerPrecision(9): the reader used to score in fp32 silently.
  rc.precision = static_cast<indexer_precision>(9);
  CHECK_THAT(message_of<config_error>([&] { sparse_reader(cache, rc); }),
               Contains("reader.precision = 9") && Contains("is not an indexer_precision"));

  stream_config role = config("kv", channels);
  role.role = static_cast<stream_role>(7);
  CHECK_THAT(message_of<config_error>([&] { mean_stream(geometry{2, 4}, role); }),
               Contains("kv.role = 7") && Contains("is not a stream_role"));

  stream_config layout = config("k", channels);
  layout.rope.channels = 4;
  REQUIRE_NOTHROW(rope_stream(geometry{2, 4}, layout));
  layout.rope.layout = static_cast<rope_layout>(5);
  CHECK_THAT(message_of<config_error>([&] { rope_stream(geometry{2, 4}, layout); }),
               Contains("k.rope.layout = 5") && Contains("is not a rope_layout"));
}

// ---- 9. finite values that overflow inside --------------------------------------------------

// The entries of `payload` (8 channels, one head) through mean pooling and RMSNorm.
std::vector<float> normed_entries(const std::vector<float>& payload, i64 tokens) {
  using norm_stream = stream_compressor<compressor_policy<mean_pool, no_rope, rms_norm>>;
  const norm_stream s(geometry{2, 4}, config("kv", 8));
  stream_state state = s.make_state();
  std::vector<float> out;
  append_options o;
  o.check_finite = true;
  s.append(state, token_chunk{tokens, payload, {}}, [&](const entry_view& e) {
    out.insert(out.end(), e.values, e.values + 8);
  }, o);
  return out;
}

TEST_CASE("reliability 2: RMSNorm of finite entries whose squares overflow fp32 is scaled, not zero",
          "[reliability][compress]") {
  constexpr i64 tokens = 8;
  std::vector<float> small(static_cast<std::size_t>(tokens * 8 * 2)), huge(small.size());
  for (std::size_t i = 0; i < small.size(); ++i) {
    small[i] = std::sin(static_cast<float>(i) * 0.37f + 0.3f);
    huge[i] = small[i] * 1e20f;  // x² ≈ 1e40 > FLT_MAX: the sum used to be inf, rsqrt 0
  }
  const std::vector<float> a = normed_entries(small, tokens), b = normed_entries(huge, tokens);
  REQUIRE(a.size() == b.size());
  REQUIRE_FALSE(a.empty());
  // RMSNorm is scale-invariant (eps aside): the huge payload's entries are the small one's.
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isfinite(b[i]));
    REQUIRE(b[i] == Approx(a[i]).epsilon(1e-4).margin(1e-5));
  }
  for (std::size_t e = 0; e < b.size(); e += 8) {
    double ms = 0.0;
    for (std::size_t c = 0; c < 8; ++c) ms += static_cast<double>(b[e + c]) * b[e + c];
    REQUIRE(ms / 8.0 == Approx(1.0).epsilon(1e-4));
  }
}

TEST_CASE("reliability 2: under check_finite, finite values beyond a 16-bit storage's range are input_errors",
          "[reliability][cache]") {
  constexpr i64 channels = 8, tokens = 8;
  for (const storage_type st : {storage_type::f16, storage_type::bf16}) {
    CAPTURE(to_string(st));
    cache_config cc;
    cc.page_size = 2;
    cc.pages = 16;
    cc.storage = st;
    mean_cache cache(layer_compressor<mean_stream>(mean_stream(geometry{2, 4}, config("kv", channels))), cc);
    const sequence_id seq = cache.create();
    const std::vector<float> fine(static_cast<std::size_t>(tokens * channels * 2), 0.5f);
    cache.append(seq, {token_chunk{tokens, fine, {}}});
    const phasekv_test::cache_dump before = phasekv_test::dump(cache);

    // 1e5 is finite but above f16's 65504; 3.4e38 above bf16's largest finite value once rounded.
    const float big = st == storage_type::f16 ? 1e5f : 3.4e38f;
    const std::vector<float> wide(fine.size(), big);
    append_options o;
    o.check_finite = true;
    REQUIRE_THAT(message_of<input_error>([&] { cache.append(seq, {token_chunk{tokens, wide, {}}}, {}, {}, o); }),
                 Contains("is not representable in " + std::string(to_string(st)) + " storage"));
    REQUIRE(phasekv_test::dump(cache) == before);

    // Unchecked, the value rounds to inf in storage (documented: IEEE rounding, no scan).
    REQUIRE_NOTHROW(cache.append(seq, {token_chunk{tokens, wide, {}}}));
  }
}

}  // namespace

}  // namespace test_reliability_second
