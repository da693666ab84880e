// Host-supplied RoPE tables (rope_config::table, core/rope.hpp).
//
// 1. A table of phasekv's own angles (make_rope_table) changes nothing: entries and reads are
//    bit-identical to the computed path.
// 2. A DeepSeek-style fp32 table (tests/oracle/deepseek_compressor.hpp: freqs, t·freqs and
//    cos/sin all in fp32, as torch forms freqs_cis) reaches the rotated outputs bit for bit: the
//    entries of a stream with the table equal the same stream's un-rotated entries rotated by an
//    independent scalar twin (torch's complex64 multiply) with that table, and the reader's
//    de-rotated output equals its rotated output turned back by the twin. Without the table the
//    entries differ, as the issue measured.
// 3. Positions outside the table are input_errors naming the position, before anything changes;
//    a malformed table is a config_error naming the field.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "support/prelude.hpp"
#include "support/common.hpp"
#include "oracle/deepseek_compressor.hpp"
#include "support/message_of.hpp"
#include "support/random_inputs.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/core/rope.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace test_rope_table {

namespace {

using namespace phasekv_test::prelude;
using csa_policy = presets::deepseek_v4_csa_policy;
using plain_policy = compressor_policy<vector_gated_pool, no_rope, rms_norm>;   // the same, unrotated
using before_policy = compressor_policy<vector_gated_pool, rope_before_pool, rms_norm>;

// DeepSeek's fp32 freqs_cis for a stream's rope config, as a phasekv table.
std::shared_ptr<const rope_table> deepseek_table(const rope_config& rope, i64 positions) {
  phasekv_test::deepseek_compressor_twin twin;
  twin.rope_dim = rope.channels;
  twin.rope_base = rope.base;
  twin.yarn.enabled = rope.yarn.enabled;
  twin.yarn.original_seq_len = rope.yarn.original_context;
  twin.yarn.factor = rope.yarn.factor;
  twin.yarn.beta_fast = rope.yarn.beta_fast;
  twin.yarn.beta_slow = rope.yarn.beta_slow;
  const auto f = phasekv_test::deepseek_fp32_freqs_cis(twin, positions);
  auto t = std::make_shared<rope_table>();
  t->positions = f.positions;
  t->pairs = f.pairs;
  t->cos = f.cos;
  t->sin = f.sin;
  return t;
}

struct inputs {
  i64 tokens = 0;
  std::vector<float> payload, logits;
  stream_params params;
};

inputs random_inputs(std::mt19937& rng, const geometry& g, const stream_config& c, i64 tokens) {
  inputs in;
  in.tokens = tokens;
  const i64 floats = tokens * g.branches() * c.channels;
  in.payload = phasekv_test::random_payload(rng, sz(floats));
  in.logits = phasekv_test::random_logits(rng, sz(floats));
  in.params.slot_bias = phasekv_test::random_bias(rng, sz(g.window * c.channels));
  in.params.norm_weight = phasekv_test::random_norm_weight(rng, sz(c.channels));
  return in;
}

template <class Policy>
entry_buffer compress(const geometry& g, const stream_config& c, const inputs& in, i64 chunk = 37) {
  const stream_compressor<Policy> s(g, c, in.params);
  stream_state state = s.make_state();
  entry_buffer out;
  const i64 ppt = s.payload_floats_per_token();
  for (i64 t = 0; t < in.tokens; t += chunk) {
    const i64 n = std::min(chunk, in.tokens - t);
    s.append(state, token_chunk{n, span<const float>(in.payload.data() + t * ppt, sz(n * ppt)),
                                span<const float>(in.logits.data() + t * ppt, sz(n * ppt))},
             out);
  }
  return out;
}

}  // namespace

TEST_CASE("rope table: phasekv's own table is bit-identical to computing the angles", "[rope][table]") {
  std::mt19937 rng(71);
  const geometry g = presets::deepseek_v4_csa_layer.geom;
  stream_config kv = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
  const inputs in = random_inputs(rng, g, kv, 521);
  stream_config tabled = kv;
  tabled.rope.table = std::make_shared<rope_table>(make_rope_table(kv.rope, 521));
  CHECK(bit_equal(compress<csa_policy>(g, tabled, in).all_values(), compress<csa_policy>(g, kv, in).all_values()));
  // RoPE before pooling reads the table at every slot's token.
  CHECK(bit_equal(compress<before_policy>(g, tabled, in).all_values(),
                  compress<before_policy>(g, kv, in).all_values()));

  // A table of cos/sin computed in double and rounded to fp32 is not phasekv's own: its angle is
  // reduced in double but its sin/cos run in float (xsimd), within a few 1e-7 of the rounded ones.
  const rope_table own = make_rope_table(kv.rope, 521);
  const rope_rotation computed(kv.rope, kv.rope.channels);
  double worst = 0.0;
  for (i64 p = 0; p < own.positions; ++p)
    for (i64 k = 0; k < own.pairs; ++k) {
      const double angle = static_cast<double>(p) * computed.inverse_frequencies()[sz(k)];
      const std::size_t i = sz(p * own.pairs + k);
      worst = std::max(worst, std::abs(double(static_cast<float>(std::cos(angle))) - own.cos[i]));
      worst = std::max(worst, std::abs(double(static_cast<float>(std::sin(angle))) - own.sin[i]));
    }
  CHECK(worst < 4e-7);
}

TEST_CASE("rope table: DeepSeek's fp32 freqs_cis reach the entries bit for bit", "[rope][table][deepseek]") {
  std::mt19937 rng(72);
  const geometry g = presets::deepseek_v4_csa_layer.geom;
  const stream_config kv = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
  const i64 tokens = 1031;  // anchors up to 1024
  const inputs in = random_inputs(rng, g, kv, tokens);
  stream_config tabled = kv;
  tabled.rope.table = deepseek_table(kv.rope, tokens);
  const rope_table& table = *tabled.rope.table;

  // The measurement: DeepSeek's fp32 angles against phasekv's double-reduced ones.
  const rope_table own = make_rope_table(kv.rope, 256);
  double table_gap = 0.0;
  for (std::size_t i = 0; i < own.cos.size(); ++i)
    table_gap = std::max({table_gap, std::abs(double(own.cos[i]) - table.cos[i]),
                          std::abs(double(own.sin[i]) - table.sin[i])});
  INFO("max |cos, sin difference| over positions < 256: " << table_gap);
  // 1.2e-5 here: t·θ_k rounded to fp32 near t = 255 is off by up to half an ulp of ~175 rad.
  CHECK(table_gap > 1e-6);
  CHECK(table_gap < 1e-4);

  const entry_buffer got = compress<csa_policy>(g, tabled, in);
  const entry_buffer plain = compress<plain_policy>(g, kv, in);   // pooled and normalised, not rotated
  const entry_buffer computed = compress<csa_policy>(g, kv, in);
  REQUIRE(got.size() == static_cast<std::size_t>(tokens / 4));
  REQUIRE(plain.size() == got.size());
  const i64 C = kv.channels, R = kv.rope.channels, pairs = R / 2;
  std::vector<float> twin = plain.all_values();
  for (std::size_t j = 0; j < plain.size(); ++j) {
    const i64 anchor = plain.anchor(j);
    REQUIRE(anchor == 4 * static_cast<i64>(j));
    float* e = twin.data() + j * sz(C);
    for (i64 k = 0; k < pairs; ++k)  // interleaved pairs of the last 64 channels
      phasekv_test::rotate_fp32(e[C - R + 2 * k], e[C - R + 2 * k + 1], table.cos[sz(anchor * pairs + k)],
                                table.sin[sz(anchor * pairs + k)]);
  }
  CHECK(bit_equal(got.all_values(), twin));
  // The first C − R channels are the un-rotated ones in every path; the RoPE channels differ
  // from phasekv's own angles.
  double gap = 0.0;
  for (std::size_t i = 0; i < twin.size(); ++i)
    gap = std::max(gap, std::abs(double(got.all_values()[i]) - computed.all_values()[i]));
  INFO("max |entry difference| DeepSeek table vs computed: " << gap);
  CHECK(gap > 0.0);
  CHECK(gap < 1e-3);  // 1.5e-4 here, on entries of magnitude up to ~8

  SECTION("RoPE before pooling reads the table at each slot's token") {
    // Not DeepSeek's policy, but the same table: every token's angles come from its row.
    const entry_buffer before = compress<before_policy>(g, tabled, in, 1);
    CHECK_FALSE(bit_equal(before.all_values(), compress<before_policy>(g, kv, in, 1).all_values()));
    CHECK(bit_equal(before.all_values(), compress<before_policy>(g, tabled, in, 500).all_values()));
  }
}

TEST_CASE("rope table: the reader de-rotates with the table, bit for bit", "[rope][table][read]") {
  using stream = stream_compressor<csa_policy>;
  using cache_t = paged_cache<stream, stream>;
  const geometry g = presets::deepseek_v4_csa_layer.geom;
  stream_config kv = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer),
                ix = *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer);
  kv.rope.table = deepseek_table(kv.rope, 700);
  ix.rope.table = kv.rope.table;  // one table, shared
  std::mt19937 rng(73);
  const i64 tokens = 650;
  cache_t cache(cache_t::layer(stream(g, kv), stream(g, ix)),
                presets::deepseek_cache(presets::deepseek_v4_csa_layer, 16));
  const sequence_id seq = cache.create();
  const auto p0 = phasekv_test::random_payload(rng, sz(tokens * 2 * 512));
  const auto l0 = phasekv_test::random_logits(rng, sz(tokens * 2 * 512));
  const auto p1 = phasekv_test::random_payload(rng, sz(tokens * 2 * 128));
  const auto l1 = phasekv_test::random_logits(rng, sz(tokens * 2 * 128));
  const auto window = phasekv_test::random_payload(rng, sz(tokens * 512));
  // Two appends, a read after each (the window ring keeps only the last 128 tokens).
  auto append = [&](i64 first, i64 n) {
    auto at = [&](const std::vector<float>& v, i64 per_token) {
      return span<const float>(v.data() + first * per_token, sz(n * per_token));
    };
    cache.append(seq, {token_chunk{n, at(p0, 1024), at(l0, 1024)}, token_chunk{n, at(p1, 256), at(l1, 256)}},
                 at(window, 512));
  };
  CHECK(cache.shape().streams[0].rope.table == kv.rope.table);  // the reader's shape carries it

  reader_config rc = presets::deepseek_reader(presets::deepseek_v4_csa_layer);
  rc.top_k = 32;
  reader_config rotated = rc;
  rotated.derotate_output = false;
  sparse_reader reader(cache, rc), plain(cache, rotated);
  const auto q = phasekv_test::random_payload(rng, sz(64 * 512));
  const auto iq = phasekv_test::random_payload(rng, sz(64 * 128));
  const auto iw = phasekv_test::random_uniform(rng, 64, 0.0f, 1.0f);
  const auto sinks = phasekv_test::random_payload(rng, 64);
  const rope_table& table = *kv.rope.table;
  for (const i64 t : {i64{517}, tokens - 1}) {
    INFO("position " << t);
    append(cache.tokens(seq), t + 1 - cache.tokens(seq));
    std::vector<float> out(sz(64 * 512)), twin(out.size());
    reader.read(cache, seq, read_request{t, q, iq, iw, sinks}, out.data());
    plain.read(cache, seq, read_request{t, q, iq, iw, sinks}, twin.data());
    for (i64 h = 0; h < 64; ++h)
      for (i64 k = 0; k < 32; ++k)
        phasekv_test::rotate_fp32(twin[sz(h * 512 + 448 + 2 * k)], twin[sz(h * 512 + 448 + 2 * k + 1)],
                                  table.cos[sz(t * 32 + k)], table.sin[sz(t * 32 + k)], -1.0f);
    CHECK(bit_equal(out, twin));
  }
}

TEST_CASE("rope table: positions beyond the table and malformed tables are errors naming them",
          "[rope][table][errors]") {
  const geometry g = presets::deepseek_v4_csa_layer.geom;
  stream_config kv = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
  auto table = std::make_shared<rope_table>(make_rope_table(kv.rope, 9));  // positions 0–8: anchors 0, 4, 8
  kv.rope.table = table;
  std::mt19937 rng(74);
  const inputs in = random_inputs(rng, g, kv, 20);
  const stream_compressor<csa_policy> s(g, kv, in.params);
  stream_state state = s.make_state();
  entry_buffer out;
  auto chunk = [&](i64 first, i64 n) {
    return token_chunk{n, span<const float>(in.payload.data() + first * 1024, sz(n * 1024)),
                       span<const float>(in.logits.data() + first * 1024, sz(n * 1024))};
  };
  s.append(state, chunk(0, 12), out);  // entries 0–2, anchors 0, 4, 8
  CHECK(out.size() == 3);
  CHECK(s.entries_after(state, 3) == 0);
  s.append(state, chunk(12, 3), out);  // no entry completes: nothing to rotate
  CHECK_THAT(message_of<input_error>([&] { s.append(state, chunk(15, 5), out); }),
             Catch::StartsWith("csa.kv: RoPE position (anchor) of entry 3 = 12: "
                               "must lie in rope.table's positions [0, 9)"));
  CHECK(state.tokens() == 15);  // nothing changed
  CHECK(out.size() == 3);

  SECTION("RoPE before pooling: the latest token is named") {
    const stream_compressor<before_policy> b(g, kv, in.params);
    stream_state st = b.make_state();
    CHECK_THAT(message_of<input_error>([&] { b.append(st, chunk(0, 12), out); }),
               Catch::StartsWith("csa.kv: RoPE position of token = 11: must lie in rope.table's positions [0, 9)"));
    CHECK(st.tokens() == 0);
  }
  SECTION("the reader names the request's position") {
    using stream = stream_compressor<csa_policy>;
    using cache_t = paged_cache<stream>;
    stream_config big = kv;
    big.rope.table = std::make_shared<rope_table>(make_rope_table(kv.rope, 12));  // anchors fit; position 12 does not
    cache_t cache(cache_t::layer(stream(g, big, in.params)),
                  presets::deepseek_cache(presets::deepseek_v4_hca_layer, 4));
    const sequence_id seq = cache.create();
    const auto window = phasekv_test::random_payload(rng, sz(13 * 512));
    cache.append(seq, {chunk(0, 13)}, window);
    sparse_reader reader(cache, presets::deepseek_reader(presets::deepseek_v4_hca_layer));
    const auto q = phasekv_test::random_payload(rng, sz(64 * 512));
    const std::vector<float> sinks(64, 0.0f);
    std::vector<float> o(sz(64 * 512));
    CHECK_NOTHROW(reader.read(cache, seq, read_request{11, q, {}, {}, sinks}, o.data()));
    CHECK_THAT(message_of<input_error>([&] { reader.read(cache, seq, read_request{12, q, {}, {}, sinks}, o.data()); }),
               Catch::StartsWith("hca.reader: request.position = 12: "
                                 "must lie in the key stream's rope.table positions [0, 12)"));
  }
  SECTION("a malformed table is a config_error naming the field") {
    auto bad = [&](auto change) {
      auto t = std::make_shared<rope_table>(*table);
      change(*t);
      stream_config c = kv;
      c.rope.table = t;
      return message_of<config_error>([&] { stream_compressor<csa_policy>(g, c); });
    };
    CHECK_THAT(bad([](rope_table& t) { t.pairs = 16; }),
               Catch::StartsWith("csa.kv.rope.table.pairs = 16: must be rope.channels / 2 = 32"));
    CHECK_THAT(bad([](rope_table& t) { t.cos.pop_back(); }), Catch::StartsWith("csa.kv.rope.table.cos.size() = 287"));
    CHECK_THAT(bad([](rope_table& t) { t.sin.clear(); }), Catch::StartsWith("csa.kv.rope.table.sin.size() = 0"));
    CHECK_THAT(bad([](rope_table& t) { t.positions = 0; }), Catch::StartsWith("csa.kv.rope.table.positions = 0"));
    CHECK_THAT(bad([](rope_table& t) { t.sin[3 * 32 + 1] = INFINITY; }),
               Catch::StartsWith("csa.kv.rope.table.sin[3][1] = inf: must be finite"));
  }
}

}  // namespace test_rope_table
