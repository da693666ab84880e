// Reading with the FP4 indexer (indexer_precision::fp4; kernels/indexer_fp4.hpp over
// fp4_e2m1_hadamard keys, format/fp4.hpp).
//
// The claim tested is equality, not closeness:
//   - the kernel: its SIMD path (AVX-512 VNNI, when this build has it) and its portable path give
//     the same bits for every key; both equal the score of oracle/fp4_format.hpp — the head dot
//     products of the oracle's dequantized values evaluated in double (exact here), rounded to
//     fp32, ReLU, then the documented fp32 order of the weighted head sum — on random worlds: every
//     FP4 channel count, 1 to 130 heads, keys and queries over scale exponents from 2^−126 up,
//     keys the shifted codes cannot hold (block exponents 4 … 19 apart, a scale byte 0), NaN
//     blocks, queries that send a read to the portable path;
//   - one head of weight 1: the score is ReLU(fp32(exact q̂·k̂)), the sign of the query flipped too;
//   - the reader: over caches whose indexer stream is fp4_e2m1_hadamard (next to f32, bf16 and FP8
//     K/V streams, page sizes 1 to 64, several scoring chunks), the selection and its scores equal
//     the oracle's top-k of the oracle's scores of every candidate, on serial and threaded
//     executors, single and batched, through the cache and its view, and after a snapshot's
//     round trip;
//   - DeepSeek-V4's CSA layer with FP8 entries and the FP4 indexer;
//   - configurations and views that do not fit are errors naming the field.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/prelude.hpp"
#include "support/read_result.hpp"
#include "support/read_world.hpp"
#include "support/common.hpp"
#include "oracle/fp4_format.hpp"
#include "support/block_formats.hpp"
#include "support/deepseek_layer.hpp"
#include "support/request_inputs.hpp"
#include "support/message_of.hpp"
#include "support/random_inputs.hpp"
#include "support/thread_executor.hpp"
#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/core/executor.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/kernels/indexer_fp4.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace test_read_fp4 {

namespace {

using namespace phasekv_test::prelude;
namespace oracle = phasekv_test::fp4;
using kernel = kernels::indexer_fp4;

constexpr storage_type fp4 = storage_type::fp4_e2m1_hadamard;

using phasekv_test::append_tokens;

// Query values whose transform is exact in double, so the oracle's dense transform and the
// library's fast one agree bit for bit.
using phasekv_test::exact_sum_values;

// The oracle's dequantized queries: [heads][channels].
std::vector<std::vector<double>> oracle_queries(const std::vector<float>& queries, i64 heads, i64 channels) {
  std::vector<std::vector<double>> out;
  for (i64 h = 0; h < heads; ++h) {
    const auto bytes = oracle::encode_head(queries.data() + h * channels, channels);
    out.push_back(oracle::decode_head(bytes.data(), channels));
  }
  return out;
}

// The oracle's score of one key's bytes.
float oracle_score(const std::vector<std::vector<double>>& q, const std::vector<float>& weights, const std::byte* key,
                   i64 channels) {
  const auto k = oracle::decode_head(reinterpret_cast<const std::uint8_t*>(key), channels);
  std::vector<double> dots;
  for (const auto& head : q) dots.push_back(oracle::dot(head, k));
  return oracle::score(dots, weights);
}

// The span of a key's scale exponents (255 for a NaN block).
int exponent_span(const std::byte* key, i64 channels) {
  const fp4_head_layout l = fp4_head_layout::of(channels);
  int lo = 255, hi = 0;
  for (i64 b = 0; b < l.blocks; ++b) {
    const int byte = static_cast<std::uint8_t>(key[l.scale_offset + b]);
    if (byte == 0xFF) return 255;
    lo = std::min(lo, byte);
    hi = std::max(hi, byte);
  }
  return hi - lo;
}

// Random key bytes: random codes; scale bytes from a base in [1, 253] with offsets 0 … 3 (keys
// the SIMD path scores), or 4 … 19 apart, or a byte 0, or a NaN block, or wildly apart.
std::vector<std::byte> random_key(std::mt19937& rng, i64 channels, int kind) {
  const fp4_head_layout l = fp4_head_layout::of(channels);
  std::vector<std::byte> key(sz(l.bytes));
  for (i64 i = 0; i < l.scale_offset; ++i) key[sz(i)] = std::byte{static_cast<std::uint8_t>(pick(rng, 0, 255))};
  const int base = static_cast<int>(pick(rng, 1, 250));
  for (i64 b = 0; b < l.blocks; ++b) {
    int byte = base + static_cast<int>(pick(rng, 0, 3));
    if (kind == 1 && b == l.blocks - 1) byte = base + static_cast<int>(pick(rng, 4, 19));
    if (kind == 2 && b == 0) byte = 0;
    if (kind == 3 && b == 1) byte = 0xFF;
    if (kind == 4 && b == 0) byte = base > 126 ? base - 120 : base + 120;
    key[sz(l.scale_offset + b)] = std::byte{static_cast<std::uint8_t>(std::min(byte, kind == 3 ? 255 : 253))};
  }
  return key;
}

}  // namespace

// ---- the kernel ------------------------------------------------------------------------------

TEST_CASE("fp4 indexer: SIMD and portable paths give the same bits, equal to the oracle's double evaluation",
          "[read][fp4]") {
  INFO("this build " << (kernels::has_int8_dot ? "has" : "lacks") << " the AVX-512 VNNI path");
  std::mt19937 rng(1601);
  std::size_t shifted_reads = 0, fast_keys = 0;
  for (int world = 0; world < 60; ++world) {
    const i64 channels = pick_of<i64>(rng, {32, 64, 128, 128, 256, 512, 1024});
    const i64 heads = pick_of<i64>(rng, {1, 3, 16, 17, 64, 64, 65, 130});
    const i64 count = world % 7 == 3 ? pick(rng, 129, 300) : pick(rng, 1, 40);  // one run of unpacked keys, or several
    // Queries at one magnitude per head, 2^−160 … 2^120 (the shifted path needs E in [−124, 105]).
    std::vector<float> queries;
    const int magnitude = world % 5 == 0 ? static_cast<int>(pick(rng, -170, 120)) : static_cast<int>(pick(rng, -30, 10));
    for (i64 h = 0; h < heads; ++h) {
      const auto q = exact_sum_values(rng, channels, magnitude - 20 + static_cast<int>(pick(rng, -2, 2)));
      queries.insert(queries.end(), q.begin(), q.end());
    }
    const auto weights = phasekv_test::random_uniform(rng, sz(heads), -1.0f, 1.0f);
    kernels::indexer_fp4_queries p;
    kernel::prepare(queries.data(), weights.data(), heads, channels, p);
    shifted_reads += p.shifted;
    INFO("world " << world << ": channels " << channels << ", heads " << heads << ", keys " << count
                  << ", query magnitude 2^" << magnitude << ", shifted " << p.shifted);

    const fp4_head_layout l = fp4_head_layout::of(channels);
    const i64 stride = l.bytes + pick(rng, 0, 1) * 5;  // keys packed, or with bytes between them
    std::vector<std::byte> keys(sz(count * stride), std::byte{0x5A});
    for (i64 j = 0; j < count; ++j) {
      const int kind = pick(rng, 0, 9) < 6 ? 0 : static_cast<int>(pick(rng, 1, 4));
      const auto key = random_key(rng, channels, kind);
      std::memcpy(keys.data() + j * stride, key.data(), key.size());
      fast_keys += kind == 0;
    }
    std::vector<float> got(sz(count)), portable(sz(count));
    kernel::score(p, keys.data(), stride, count, got.data());
    kernel::score_portable(p, keys.data(), stride, count, portable.data());
    CHECK(bit_equal(got, portable));

    const auto q = oracle_queries(queries, heads, channels);
    // The queries' own spans: the oracle's double sums are exact when query and key spans add to
    // at most 38 binades; beyond, only the two paths' agreement is promised.
    int query_span = 0;
    for (i64 h = 0; h < heads; ++h) {
      const auto bytes = oracle::encode_head(queries.data() + h * channels, channels);
      query_span = std::max(query_span, exponent_span(reinterpret_cast<const std::byte*>(bytes.data()), channels));
    }
    for (i64 j = 0; j < count; ++j) {
      const std::byte* key = keys.data() + j * stride;
      if (query_span + exponent_span(key, channels) > 38 && exponent_span(key, channels) != 255) continue;
      INFO("key " << j << ", span " << exponent_span(key, channels));
      const float want = oracle_score(q, weights, key, channels);
      CHECK(bits_of(got[sz(j)]) == bits_of(want));
    }
  }
  CHECK(fast_keys > 0);
  if (kernels::has_int8_dot) CHECK(shifted_reads > 0);
}

// The SIMD path folds the head scales into the weights and applies each key's scale once, after
// the sums (kernels/indexer_fp4.hpp): exact only while every partial sum stays a normal fp32,
// which the kernel checks per read (the weights' binades) and per key (its exponent). Weights and
// keys at the edges of those ranges — tiny, huge, subnormal, zero, non-finite, a wide spread —
// must still give the portable path's bits, by the fold or by falling back.
TEST_CASE("fp4 indexer: weights over the whole fp32 range keep the SIMD path on the portable path's bits", "[read][fp4]") {
  std::mt19937 rng(1603);
  const i64 channels = 128;
  const fp4_head_layout l = fp4_head_layout::of(channels);
  std::size_t shifted_reads = 0;
  for (int world = 0; world < 80; ++world) {
    const i64 heads = pick_of<i64>(rng, {1, 5, 64, 70});
    const int kind = world % 8;
    std::vector<float> weights(sz(heads));
    for (float& w : weights) {
      const float sign = pick(rng, 0, 1) == 0 ? 1.0f : -1.0f;
      const float unit = sign * static_cast<float>(pick(rng, 1, 1 << 23)) * 0x1p-23f;
      switch (kind) {
        case 0: w = std::ldexp(unit, static_cast<int>(pick(rng, -20, 0))); break;      // realistic
        case 1: w = std::ldexp(unit, static_cast<int>(pick(rng, -125, -100))); break;  // tiny
        case 2: w = std::ldexp(unit, static_cast<int>(pick(rng, 90, 127))); break;     // huge
        case 3: w = std::ldexp(unit, static_cast<int>(pick(rng, -149, -127))); break;  // subnormal
        case 4: w = std::ldexp(unit, static_cast<int>(pick(rng, -126, 127))); break;   // everywhere
        case 5: w = pick(rng, 0, 2) == 0 ? 0.0f : std::ldexp(unit, static_cast<int>(pick(rng, -10, 10))); break;
        case 6: w = pick(rng, 0, 9) == 0 ? std::numeric_limits<float>::infinity() : unit; break;
        default: w = pick(rng, 0, 1) == 0 ? std::ldexp(unit, -110) : std::ldexp(unit, 110); break;  // spread
      }
    }
    // Queries at a magnitude that keeps the shifted path on, keys whose scale bytes sweep 1 … 253.
    std::vector<float> queries;
    const int magnitude = static_cast<int>(pick(rng, -100, 90));
    for (i64 h = 0; h < heads; ++h) {
      const auto q = exact_sum_values(rng, channels, magnitude - 20);
      queries.insert(queries.end(), q.begin(), q.end());
    }
    kernels::indexer_fp4_queries p;
    kernel::prepare(queries.data(), weights.data(), heads, channels, p);
    shifted_reads += p.shifted;
    const i64 count = 67;
    std::vector<std::byte> keys;
    for (i64 j = 0; j < count; ++j) {
      auto key = random_key(rng, channels, 0);
      const int base = 1 + static_cast<int>((j * 251 / count + world) % 250);
      for (i64 b = 0; b < l.blocks; ++b)
        key[sz(l.scale_offset + b)] = std::byte{static_cast<std::uint8_t>(std::min(253, base + static_cast<int>(pick(rng, 0, 3))))};
      keys.insert(keys.end(), key.begin(), key.end());
    }
    std::vector<float> got(sz(count)), portable(sz(count));
    kernel::score(p, keys.data(), l.bytes, count, got.data());
    kernel::score_portable(p, keys.data(), l.bytes, count, portable.data());
    INFO("world " << world << ", weights of kind " << kind << ", heads " << heads << ", query magnitude 2^" << magnitude
                  << ", shifted " << p.shifted);
    CHECK(bit_equal(got, portable));
  }
  if (kernels::has_int8_dot) CHECK(shifted_reads > 40);
}

TEST_CASE("fp4 indexer: one head of weight 1 scores ReLU(fp32(q̂·k̂)) over the whole exponent range", "[read][fp4]") {
  std::mt19937 rng(1602);
  const i64 channels = 128;
  const fp4_head_layout l = fp4_head_layout::of(channels);
  const std::vector<float> one = {1.0f};
  std::size_t checked = 0, positive = 0;
  for (int e = -150; e <= 110; e += 4) {
    const auto x = exact_sum_values(rng, channels, e - 20);
    std::vector<float> negated(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) negated[i] = -x[i];
    // Keys whose blocks sit at every scale byte from 1 to 253, several per key.
    std::vector<std::byte> keys;
    const i64 count = 64;
    for (i64 j = 0; j < count; ++j) {
      auto key = random_key(rng, channels, 0);
      const int base = 1 + static_cast<int>((j * 4 + (e + 150)) % 250);
      for (i64 b = 0; b < l.blocks; ++b) key[sz(l.scale_offset + b)] = std::byte{static_cast<std::uint8_t>(std::min(253, base + static_cast<int>(b % 3)))};
      keys.insert(keys.end(), key.begin(), key.end());
    }
    for (const std::vector<float>* query : {&x, static_cast<const std::vector<float>*>(&negated)}) {
      kernels::indexer_fp4_queries p;
      kernel::prepare(query->data(), one.data(), 1, channels, p);
      std::vector<float> got(sz(count)), portable(sz(count));
      kernel::score(p, keys.data(), l.bytes, count, got.data());
      kernel::score_portable(p, keys.data(), l.bytes, count, portable.data());
      CHECK(bit_equal(got, portable));
      const auto q = oracle_queries(*query, 1, channels);
      for (i64 j = 0; j < count; ++j) {
        const auto k = oracle::decode_head(reinterpret_cast<const std::uint8_t*>(keys.data() + j * l.bytes), channels);
        const auto d = static_cast<float>(oracle::dot(q[0], k));
        INFO("query 2^" << e << ", key " << j);
        CHECK(bits_of(got[sz(j)]) == bits_of(d > 0.0f ? d : 0.0f));
        ++checked;
        positive += d > 0.0f;
      }
    }
  }
  CHECK(positive > checked / 4);
}

// ---- the reader -------------------------------------------------------------------------------

namespace {

using phasekv_test::thread_executor;

using mean_stream = stream_compressor<compressor_policy<mean_pool>>;
using rope_stream = stream_compressor<compressor_policy<mean_pool, rope_after_pool>>;
using world_cache = paged_cache<mean_stream, mean_stream, rope_stream>;  // keys, values, indexer (RoPE'd)

struct world_spec {
  geometry geom;  // S and W
  i64 kv_heads = 1, group = 1, channels = 16, indexer_channels = 128, indexer_heads = 1;
  i64 page_size = 1, window_tokens = 0, top_k = 1, tokens = 1;
  storage_type kv_storage = storage_type::f32;
  std::string describe() const {
    std::ostringstream o;
    o << "S=" << geom.stride << " W=" << geom.window << " kv_heads=" << kv_heads << " group=" << group << " ic=" << indexer_channels
      << " ih=" << indexer_heads << " page=" << page_size << " win=" << window_tokens << " top_k=" << top_k
      << " tokens=" << tokens << " kv=" << kv_storage;
    return o.str();
  }
};

using phasekv_test::read_support::make_stream;

world_cache make_world(const world_spec& s) {
  const geometry& g = s.geom;
  stream_config ix = make_stream("indexer", stream_role::indexer, 1, s.indexer_channels);
  ix.rope.channels = s.indexer_channels / 2;
  ix.rope.base = 10000.0;
  cache_config cc;
  cc.name = "fp4";
  cc.page_size = s.page_size;
  cc.pages = 4096;
  cc.stream_storage = {s.kv_storage, s.kv_storage, fp4};
  cc.history = 8;
  cc.window = raw_window_config{s.window_tokens, s.kv_heads, s.channels, s.channels};
  return world_cache(layer_compressor<mean_stream, mean_stream, rope_stream>(
                         mean_stream(g, make_stream("keys", stream_role::key, s.kv_heads, s.channels)),
                         mean_stream(g, make_stream("values", stream_role::value, s.kv_heads, s.channels)),
                         rope_stream(g, ix)),
                     cc);
}

reader_config reader_for(const world_spec& s) {
  reader_config rc;
  rc.name = "fp4.reader";
  rc.query_heads = s.kv_heads * s.group;
  rc.key_stream = 0;
  rc.value_stream = 1;
  rc.indexer_stream = 2;
  rc.top_k = s.top_k;
  rc.indexer_heads = s.indexer_heads;
  rc.precision = indexer_precision::fp4;
  return rc;
}

using phasekv_test::request_inputs;

// Indexer queries whose transform is exact (each head at its own scale), weights in [−0.2, 1),
// no sinks.
request_inputs random_request(const reader_config& rc, i64 key_channels, i64 indexer_channels, std::mt19937& rng,
                              i64 position) {
  request_inputs r;
  r.queries = phasekv_test::random_uniform(rng, sz(rc.query_heads * key_channels), -0.5f, 0.5f);
  for (i64 h = 0; h < rc.indexer_heads; ++h) {
    const auto q = exact_sum_values(rng, indexer_channels, -20 + static_cast<int>(pick(rng, -3, 3)));
    r.indexer_queries.insert(r.indexer_queries.end(), q.begin(), q.end());
  }
  r.indexer_weights = phasekv_test::random_uniform(rng, sz(rc.indexer_heads), -0.2f, 1.0f);
  r.request.position = position;
  r.point();
  return r;
}

// The oracle's top-k of the candidates' oracle scores, (index, score) in rank order.
std::vector<std::pair<i64, float>> oracle_selection(const sequence_view& v, std::size_t stream, const reader_config& rc,
                                                    const request_inputs& in, i64 candidates, i64 top_k) {
  const stream_view& sv = v.streams[stream];
  const i64 channels = sv.layout.channels;
  const auto q = oracle_queries(in.indexer_queries, rc.indexer_heads, channels);
  std::vector<std::pair<i64, float>> all;
  for (i64 j = 0; j < candidates; ++j) {
    all.push_back({j, oracle_score(q, in.indexer_weights, phasekv_test::entry_at(sv, sv.layout.page_size, j), channels)});
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  all.resize(sz(std::min<i64>(top_k, candidates)));
  return all;
}

using phasekv_test::read_one;
using phasekv_test::read_result;

bool same(const read_result& a, const read_result& b) {
  return bit_equal(a.out, b.out) && bit_equal(a.lse, b.lse) && a.logical == b.logical &&
         a.trace.selected == b.trace.selected && a.trace.scores == b.trace.scores;
}

}  // namespace

TEST_CASE("fp4 read: the selection and its scores are the oracle's top-k, on every executor", "[read][fp4]") {
  std::mt19937 rng(1603);
  for (int world = 0; world < 14; ++world) {
    world_spec s;
    s.geom.stride = pick(rng, 1, 4);
    s.geom.window = pick(rng, s.geom.stride, 2 * s.geom.stride);
    s.kv_heads = pick(rng, 1, 2);
    s.group = pick_of<i64>(rng, {1, 4});
    s.indexer_channels = pick_of<i64>(rng, {32, 64, 128, 128, 256});
    s.indexer_heads = pick_of<i64>(rng, {1, 5, 64, 70});
    s.page_size = pick_of<i64>(rng, {1, 3, 16, 64});
    s.window_tokens = pick_of<i64>(rng, {0, 4});
    s.top_k = pick_of<i64>(rng, {1, 7, 300});
    s.kv_storage = pick_of(rng, {storage_type::f32, storage_type::bf16, storage_type::fp8_e4m3_block});
    // Now and then more than one scoring chunk (4096 entries), and more than 8192 candidates (the
    // selection's sampled cut).
    s.tokens = world % 5 == 4 ? pick(rng, world < 5 ? 4200 : 8200, world < 5 ? 4500 : 8800) * s.geom.stride : pick(rng, 1, 400);
    INFO("world " << world << ": " << s.describe());
    world_cache cache = make_world(s);
    const reader_config rc = reader_for(s);
    sparse_reader reader(cache, rc), threaded(cache, rc);
    thread_executor pool(3);
    threaded.set_executor(pool);
    const sequence_id seq = cache.create();
    for (i64 done = 0; done < s.tokens;) {
      const i64 n = std::min(s.tokens - done, pick(rng, 1, 2000));
      append_tokens(cache, seq, n, rng);
      done += n;
    }
    const sequence_view view = cache.view_of(seq);
    const i64 tokens = cache.tokens(seq);
    for (const i64 position : {tokens - 1, std::max<i64>(0, tokens - 3)}) {
      INFO("position " << position);
      const request_inputs in = random_request(rc, s.channels, s.indexer_channels, rng, position);
      const read_result got = read_one(reader, view, in.request);
      const i64 candidates = s.geom.visible_entries(position);
      const auto want = oracle_selection(view, 2, rc, in, candidates, s.top_k);
      REQUIRE(got.trace.selected.size() == want.size());
      std::size_t wrong = 0;
      for (std::size_t r = 0; r < want.size(); ++r) {
        wrong += got.trace.selected[r] != want[r].first || bits_of(got.trace.scores[r]) != bits_of(want[r].second);
        CHECK(got.logical[r] == want[r].first);
      }
      CHECK(wrong == 0);
      for (float x : got.out) CHECK(std::isfinite(x));
      // Threaded, batched with another read, through the cache: the same bits.
      CHECK(same(read_one(threaded, view, in.request), got));
      CHECK(bit_equal(phasekv_test::read_through_cache(reader, cache, seq, in.request), got.out));
    }
  }
}

TEST_CASE("fp4 read: a restored snapshot reads bit-identically", "[read][fp4][snapshot]") {
  std::mt19937 rng(1604);
  world_spec s;
  s.geom = geometry{4, 8};
  s.indexer_heads = 64;
  s.page_size = 16;
  s.window_tokens = 4;
  s.top_k = 20;
  s.kv_storage = storage_type::fp8_e4m3_block;
  world_cache source = make_world(s), destination = make_world(s);
  const sequence_id seq = source.create();
  append_tokens(source, seq, 777, rng);
  const sequence_id moved = restore(destination, snapshot(source, seq));
  const reader_config rc = reader_for(s);
  sparse_reader a(source, rc), b(destination, rc);
  const request_inputs in = random_request(rc, s.channels, s.indexer_channels, rng, 776);
  const sequence_view va = source.view_of(seq), vb = destination.view_of(moved);
  CHECK(same(read_one(a, va, in.request), read_one(b, vb, in.request)));
}

// ---- DeepSeek-V4 ---------------------------------------------------------------------------------

namespace {

using phasekv_test::csa_cache;
using phasekv_test::make_csa_layer;
using phasekv_test::csa_draw;

// 512 pages, a 128-token window, 8 tokens of history.
cache_config dsv4_cache(i64 page_size, storage_type kv, storage_type indexer) {
  return phasekv_test::csa_config("dsv4", page_size, {kv, indexer}, 512, 128, 8);
}

}  // namespace

TEST_CASE("fp4 read: DeepSeek-V4 CSA with FP8 entries and the FP4 indexer selects the oracle's top-k",
          "[read][fp4][csa]") {
  const csa_cache::layer layer = make_csa_layer();
  std::mt19937 rng(1605);
  for (const i64 page_size : {64, 5}) {
    INFO("page_size " << page_size);
    csa_cache cache(layer, dsv4_cache(page_size, storage_type::fp8_e4m3_block, fp4));
    REQUIRE(cache.pool(1).layout().entry_stride_bytes == 68);
    const sequence_id seq = cache.create();
    for (i64 n : {700, 301, 1}) append_tokens(cache, seq, n, rng, csa_draw);  // 250 entries
    const sequence_view view = cache.view_of(seq);
    for (const i64 top_k : {64, 240}) {
      const reader_config rc = phasekv_test::dsv4_reader(top_k, true);
      sparse_reader reader(cache, rc);
      const i64 t = cache.tokens(seq) - 1;
      request_inputs in = random_request(rc, 512, 128, rng, t);
      std::vector<float> sinks = phasekv_test::random_uniform(rng, 64, -1.0f, 2.0f);
      for (float& q : in.queries) q *= 20.0f;
      in.request.sinks = sinks;
      const read_result got = read_one(reader, view, in.request);
      const auto want =
          oracle_selection(view, 1, rc, in, presets::deepseek_v4_csa_layer.geom.visible_entries(t), top_k);
      REQUIRE(got.trace.selected.size() == want.size());
      std::size_t wrong = 0;
      for (std::size_t r = 0; r < want.size(); ++r)
        wrong += got.trace.selected[r] != want[r].first || bits_of(got.trace.scores[r]) != bits_of(want[r].second);
      INFO("top_k " << top_k);
      CHECK(wrong == 0);
      for (float x : got.out) CHECK(std::isfinite(x));
    }
  }
}

TEST_CASE("fp4 read: configurations and views that do not fit are errors naming the field", "[read][fp4][errors]") {
  const csa_cache::layer layer = make_csa_layer();
  csa_cache cache(layer, dsv4_cache(8, storage_type::f32, fp4));
  csa_cache plain(layer, dsv4_cache(8, storage_type::f32, storage_type::f32));
  // fp4 precision needs FP4 keys; FP4 keys need fp4 precision.
  CHECK_THAT(message_of<config_error>([&] { sparse_reader(plain, phasekv_test::dsv4_reader(4, true)); }),
             Contains("dsv4.precision = fp4: needs the indexer stream stored in fp4_e2m1_hadamard"));
  reader_config f32 = phasekv_test::dsv4_reader(4, true), bf16 = phasekv_test::dsv4_reader(4, true);
  f32.precision = indexer_precision::f32;
  bf16.precision = indexer_precision::bf16;
  CHECK_THAT(message_of<config_error>([&] { sparse_reader(cache, f32); }),
             Contains("dsv4.precision = f32: must be fp4 for an indexer stream stored in fp4_e2m1_hadamard"));
  CHECK_THAT(message_of<config_error>([&] { sparse_reader(cache, bf16); }),
             Contains("dsv4.precision = bf16: needs the indexer stream stored in bf16 (cache_config.stream_storage), "
                      "not fp4_e2m1_hadamard"));
  // FP4 streams are not attended to; their channel counts are powers of two in [32, 1024].
  layer_shape shape = cache.shape();
  reader_config rc = phasekv_test::dsv4_reader(4, true);
  rc.key_stream = rc.value_stream = 1;
  rc.derotate_output = false;
  CHECK_THAT(message_of<config_error>([&] { sparse_reader(shape, rc); }),
             Contains("dsv4.key_stream = 1: must name a stream of role key or key_value"));
  shape.streams[1].role = stream_role::key_value;  // and named a K/V stream, its storage still refuses it
  CHECK_THAT(message_of<config_error>([&] { sparse_reader(shape, rc); }),
             Contains("dsv4.key_stream = 'csa.indexer': is stored as fp4_e2m1_hadamard"));
  shape.streams[1].channels = 100;
  CHECK_THAT(message_of<config_error>([&] { sparse_reader(shape, phasekv_test::dsv4_reader(4, true)); }),
             Contains("dsv4: shape.streams[1].channels = 100: must be a power of two in [32, 1024]"));

  // Views.
  const sequence_id seq = cache.create();
  std::mt19937 rng(1606);
  append_tokens(cache, seq, 40, rng, csa_draw);
  sparse_reader reader(cache, phasekv_test::dsv4_reader(4, true));
  request_inputs in = random_request(phasekv_test::dsv4_reader(4, true), 512, 128, rng, 39);
  std::vector<float> sinks(64, 0.0f);
  in.request.sinks = sinks;
  std::vector<float> out(sz(reader.output_floats()));
  const sequence_view good = cache.view_of(seq);
  auto expect = [&](auto edit, const std::string& message) {
    phasekv_test::check_view_refused(reader, good, in.request, edit, message);
  };
  expect([](sequence_view& v) { v.streams[1].layout.head_stride = v.streams[1].layout.head_stride_bytes = 64; },
         "dsv4: view.streams[1].layout.head_stride = 64: must be the fp4 head's bytes = 68");
  expect([](sequence_view& v) { v.streams[1].layout.entry_stride = v.streams[1].layout.entry_stride_bytes = 72; },
         "dsv4: view.streams[1].layout.entry_stride = 72: must be kv_heads × head bytes = 68");
  expect([](sequence_view& v) { v.streams[1].layout.storage = storage_type::bf16; },
         "dsv4: view.streams[1].layout.storage = bf16: must be the stream's fp4_e2m1_hadamard");
  CHECK_NOTHROW(reader.read(good, in.request, out.data()));
}

}  // namespace test_read_fp4
