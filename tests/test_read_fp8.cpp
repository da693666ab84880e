// Reading FP8 entries (fp8_e4m3_block; format/fp8.hpp, kernels/attention.hpp).
//
// The reader dequantizes FP8 entries inside its attention kernel. Dequantized values are exact
// in fp32 and the kernel sums in the fp32 kernel's order, so the claim tested here is equality,
// not closeness: a read over a cache whose entries are FP8 gives the same bits — output, lse,
// selection (logical and physical), trace — as a read over a host arena holding the dequantized
// entries in fp32 at the same pages and slots. Worlds are random: tied K/V with RoPE channels
// kept in bf16 and de-rotation, or separate keys and values without RoPE; FP8 keys, values or
// indexer keys next to f32/bf16 streams; channel counts with partial blocks, odd code counts and
// tails shorter than a SIMD batch; up to 70 query heads per KV head and 2 KV heads; page sizes
// 1 to 64; up to several attention pieces; serial and threaded executors. Then DeepSeek-V4's own
// configuration (512 channels, 64 RoPE channels, 584-byte entries, 64 query heads, top-k, a
// 128-token window), and the errors a view or a shape can get wrong.

#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/prelude.hpp"
#include "support/read_result.hpp"
#include "support/read_world.hpp"
#include "support/request_inputs.hpp"
#include "support/common.hpp"
#include "support/configs.hpp"
#include "oracle/fp8_format.hpp"
#include "support/deepseek_layer.hpp"
#include "support/message_of.hpp"
#include "support/random_inputs.hpp"
#include "support/thread_executor.hpp"
#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/core/executor.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace test_read_fp8 {

namespace {

using namespace phasekv_test::prelude;

constexpr storage_type fp8 = storage_type::fp8_e4m3_block;

using phasekv_test::same_trace;
using phasekv_test::append_tokens;
// Payloads of a random magnitude per token (1e-3 … 1e3), so entries' blocks get many scales.
const phasekv_test::token_draw scaled{-1.0f, 1.0f, -1.0f, 1.0f, 3.0f};

using phasekv_test::thread_executor;

// ---- the dequantized twin of a sequence ---------------------------------------------------------

// The sequence's view with every FP8 stream replaced by an fp32 arena of the same page size,
// capacity and page ids, each entry at its own page and slot holding its dequantized values, and
// an FP8 window ring by an fp32 ring of its rows' values. The other streams are the cache's own.
struct twin {
  std::vector<std::vector<float>> arenas;
  std::vector<float> window_keys, window_values;
  sequence_view view;
};

// kv_heads FP8 heads of `format` at `row` (head stride = the format's bytes), decoded by the oracle.
void decode_heads(const std::byte* row, i64 kv_heads, i64 head_bytes, const phasekv_test::fp8::head_format& format,
                  float* out) {
  for (i64 h = 0; h < kv_heads; ++h) {
    const auto values = phasekv_test::fp8::decode_head(reinterpret_cast<const std::uint8_t*>(row + h * head_bytes), format);
    for (i64 c = 0; c < format.channels; ++c) out[h * format.channels + c] = static_cast<float>(values[sz(c)]);
  }
}

std::unique_ptr<twin> dequantized_twin(const sequence_view& source) {
  auto t = std::make_unique<twin>();
  t->view = source;
  t->arenas.resize(source.stream_count);
  for (std::size_t k = 0; k < source.stream_count; ++k) {
    const stream_view& from = source.streams[k];
    if (from.layout.storage != fp8) continue;
    const page_pool_config pc =
        phasekv_test::pool_of("pool", from.layout.page_size, from.layout.kv_heads, from.layout.channels, 0);
    const page_layout l = page_layout::for_config(pc);
    std::vector<float>& arena = t->arenas[k];
    arena.assign(sz(from.capacity * l.page_stride), std::numeric_limits<float>::quiet_NaN());
    // Dequantized by the oracle (oracle/fp8_format.hpp), not by the library: every value is exact
    // in fp32, so the cast loses nothing.
    const phasekv_test::fp8::head_format format{from.layout.channels, from.layout.rope_channels};
    for (i64 e = 0; e < from.entries; ++e) {
      const i64 page = from.pages[sz(e / pc.page_size)], slot = e % pc.page_size;
      const std::byte* entry = from.base + page * from.layout.page_stride_bytes + slot * from.layout.entry_stride_bytes;
      float* out = arena.data() + page * l.page_stride + slot * l.entry_stride;
      for (i64 h = 0; h < pc.kv_heads; ++h) {
        const auto values = phasekv_test::fp8::decode_head(
            reinterpret_cast<const std::uint8_t*>(entry + h * from.layout.head_stride_bytes), format);
        for (i64 c = 0; c < pc.channels; ++c) out[h * pc.channels + c] = static_cast<float>(values[sz(c)]);
      }
    }
    t->view.streams[k].base = reinterpret_cast<const std::byte*>(arena.data());
    t->view.streams[k].layout = l;
  }
  const window_view& w = source.window;
  if (w.storage == fp8) {  // every ring row, written or not (an unwritten row is zeros either way)
    const bool tied = w.value_bytes == w.key_bytes;
    const phasekv_test::fp8::head_format keys{w.key_channels, w.rope_channels}, values{w.value_channels, 0};
    const i64 key_head = keys.bytes(), value_head = values.bytes();  // the oracle's layout arithmetic
    t->window_keys.resize(sz(w.rows * w.kv_heads * w.key_channels));
    t->window_values.resize(tied ? 0 : sz(w.rows * w.kv_heads * w.value_channels));
    for (i64 r = 0; r < w.rows; ++r) {
      decode_heads(w.key_bytes + r * w.kv_heads * key_head, w.kv_heads, key_head, keys,
                   t->window_keys.data() + r * w.kv_heads * w.key_channels);
      if (!tied)
        decode_heads(w.value_bytes + r * w.kv_heads * value_head, w.kv_heads, value_head, values,
                     t->window_values.data() + r * w.kv_heads * w.value_channels);
    }
    window_view& to = t->view.window;
    to.storage = storage_type::f32;
    to.rope_channels = 0;
    to.key_bytes = to.value_bytes = nullptr;
    to.keys = t->window_keys.data();
    to.values = tied ? t->window_keys.data() : t->window_values.data();
  }
  return t;
}

layer_shape dequantized_shape(layer_shape shape) {
  for (stream_shape& s : shape.streams)
    if (s.storage == fp8) s.storage = storage_type::f32;
  shape.window.precision = storage_type::f32;
  shape.window.rope_channels = 0;
  return shape;
}

// ---- random worlds --------------------------------------------------------------------------------

using phasekv_test::read_support::tied_cache;
using phasekv_test::read_support::untied_cache;

struct world_spec : phasekv_test::read_support::world_shape {
  i64 tokens = 1;
  std::vector<storage_type> storage;  // per stream
  bool fp8_window = false;            // the raw window in FP8 (raw_window_config::precision)
  i64 window_rope_channels = 0;       // its key heads' bf16 channels

  std::string describe() const {
    std::ostringstream o;
    o << describe_shape() << " fp8_window=" << fp8_window << " window_rope=" << window_rope_channels
      << " tokens=" << tokens << " storage=";
    for (storage_type s : storage) o << s << ' ';
    return o.str();
  }
};

world_spec random_spec(std::mt19937& rng) {
  world_spec s;
  s.draw_geometry(rng, 4, 0, 2);
  s.group = pick_of<i64>(rng, {1, 3, 16, 17, 64, 70});
  s.tied = pick(rng, 0, 1) == 1;
  s.key_channels = pick_of<i64>(rng, {5, 16, 64, 100, 129, 200, 512});
  s.value_channels = pick_of<i64>(rng, {3, 64, 75, 130});
  s.rope_channels = s.tied ? 2 * pick(rng, 1, s.key_channels / 2) : 0;  // a RoPE policy rotates ≥ 2
  s.indexer_channels = pick_of<i64>(rng, {4, 33, 64});
  s.indexer_heads = pick(rng, 1, 4);
  s.page_size = pick_of<i64>(rng, {1, 3, 16, 64});
  s.window_tokens = pick_of<i64>(rng, {0, 1, 9});
  s.top_k = pick_of<i64>(rng, {0, 5, 300});
  s.sink = pick(rng, 0, 1) == 1;
  // Enough entries for several attention pieces (256 keys each) now and then.
  s.tokens = pick(rng, 1, 3) == 1 ? pick(rng, 600, 900) : pick(rng, 1, 200);
  const std::size_t streams = s.tied ? 2 : 3;
  for (std::size_t k = 0; k < streams; ++k) s.storage.push_back(pick_of(rng, {fp8, fp8, storage_type::f32, storage_type::bf16}));
  s.storage[pick(rng, 0, s.tied ? 0 : 1)] = fp8;  // keys or values in FP8, always
  s.fp8_window = s.window_tokens > 0 && pick(rng, 0, 1) == 1;
  s.window_rope_channels = s.fp8_window ? pick_of<i64>(rng, {0, s.rope_channels, s.key_channels}) : 0;
  return s;
}

using phasekv_test::read_support::reader_for;

cache_config cache_config_for(const world_spec& s) {
  // 16 tokens of history, so that reads a few positions back still find their window.
  cache_config cc = phasekv_test::cache_of("fp8", s.page_size, 1024, 16,
                                           raw_window_config{s.window_tokens, s.kv_heads, s.key_channels,
                                                             s.tied ? 0 : s.value_channels});
  cc.stream_storage = s.storage;
  if (s.fp8_window) {
    cc.window.precision = fp8;
    cc.window.rope_channels = s.window_rope_channels;
  }
  return cc;
}

using phasekv_test::request_inputs;

// Queries scaled so that logits spread over a few units whatever the entries' magnitudes.
request_inputs random_request(const reader_config& rc, i64 key_channels, i64 indexer_channels, std::mt19937& rng,
                              i64 position) {
  return phasekv_test::random_request(rc, key_channels, indexer_channels, rng, position, 0.02f);
}

using phasekv_test::read_one;
using phasekv_test::read_result;

// "" when the FP8 read and the read of the dequantized twin agree in every bit.
std::string compare(const read_result& a, const read_result& b) {
  if (!bit_equal(a.out, b.out)) return "outputs differ";
  if (!bit_equal(a.lse, b.lse)) return "lse differ";
  if (a.logical != b.logical) return "selected entries differ";
  if (a.physical != b.physical) return "physical indices differ";
  if (!same_trace(a.trace, b.trace)) return "traces differ";
  for (float x : a.out)
    if (!std::isfinite(x)) return "a non-finite output";
  return "";
}

template <class Cache>
void check_world(Cache& cache, const world_spec& s, std::mt19937& rng) {
  const reader_config rc = reader_for(s, "fp8.reader");
  sparse_reader reader(cache, rc), twin_reader(dequantized_shape(cache.shape()), rc);
  sparse_reader threaded(cache, rc);
  thread_executor pool(3);
  threaded.set_executor(pool);

  const sequence_id seq = cache.create();
  for (i64 done = 0; done < s.tokens;) {
    const i64 n = std::min(s.tokens - done, pick(rng, 1, 300));
    append_tokens(cache, seq, n, rng, scaled);
    done += n;
  }
  const sequence_id fork = cache.fork(seq);
  append_tokens(cache, fork, pick(rng, 1, 9), rng, scaled);

  for (sequence_id id : {seq, fork}) {
    const sequence_view view = cache.view_of(id);
    const auto dq = dequantized_twin(view);
    const i64 tokens = cache.tokens(id);
    for (i64 position : {tokens - 1, std::max<i64>(0, tokens - 1 - std::min<i64>(s.window_tokens, 3))}) {
      INFO("position " << position << " of " << tokens);
      const request_inputs in = random_request(rc, s.key_channels, s.indexer_channels, rng, position);
      const read_result got = read_one(reader, view, in.request);
      const read_result want = read_one(twin_reader, dq->view, in.request);
      CHECK(compare(got, want) == "");
      CHECK(compare(read_one(threaded, view, in.request), want) == "");
    }
  }
}

}  // namespace

TEST_CASE("fp8 read: bit-identical to the fp32 read of the dequantized entries, random worlds", "[read][fp8]") {
  std::mt19937 rng(1401);
  for (int world = 0; world < 40; ++world) {
    const world_spec s = random_spec(rng);
    INFO("world " << world << ": " << s.describe());
    if (s.tied) {
      tied_cache cache = phasekv_test::read_support::make_tied(s, cache_config_for(s));
      REQUIRE(cache.pool(0).layout().rope_channels == s.rope_channels);
      check_world(cache, s, rng);
    } else {
      untied_cache cache = phasekv_test::read_support::make_untied(s, cache_config_for(s));
      check_world(cache, s, rng);
    }
  }
}

TEST_CASE("fp8 attention kernel: the logit pass's kept rows are the dequantized keys, its logits unchanged",
          "[read][fp8]") {
  // Tied FP8 K/V: the reader asks the logit pass to keep the keys it widens and runs the output
  // pass over those rows. They must be the keys as fp8_dequantize_head gives them, in every tile
  // shape (keys around the 6-key tile, heads over one and several 64-head blocks, channels with
  // and without bf16 RoPE channels and partial blocks), and keeping them must not move a logit.
  using kernel = kernels::attention<>;
  std::mt19937 rng(1405);
  for (int trial = 0; trial < 60; ++trial) {
    const i64 heads = pick_of<i64>(rng, {1, 16, 64, 70, 130}), keys = pick(rng, 1, 20);
    const i64 channels = pick_of<i64>(rng, {16, 64, 100, 512}), rope = pick_of<i64>(rng, {0, 0, 16, 64});
    const fp8_head_layout layout = fp8_head_layout::of(channels, std::min(rope, channels));
    INFO("trial " << trial << ": heads " << heads << ", keys " << keys << ", channels " << channels << ", rope "
                  << layout.rope_channels);
    std::vector<std::byte> arena(sz(keys * layout.bytes));
    std::vector<float> values(sz(channels));
    std::vector<const std::byte*> heads_of(sz(keys));
    for (i64 k = 0; k < keys; ++k) {
      for (float& v : values) v = std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng), pick(rng, -8, 8));
      fp8_quantize_head(values.data(), layout, arena.data() + k * layout.bytes);
      heads_of[sz(k)] = arena.data() + (keys - 1 - k) * layout.bytes;  // not in address order
    }
    std::vector<float> q = phasekv_test::random_uniform(rng, sz(heads * channels), -1.0f, 1.0f);
    kernel::prepared p;
    kernel::prepare(q.data(), heads, channels, 0.125f, p);
    kernel::aligned_floats plain(sz(keys * p.padded)), kept(plain.size());
    std::vector<float> widened(sz(keys * channels), NAN);
    kernel::logits(p, kernels::fp8_heads{heads_of.data(), layout}, keys, plain.data());
    kernel::logits(p, kernels::fp8_heads{heads_of.data(), layout}, keys, kept.data(), widened.data());
    CHECK(std::memcmp(plain.data(), kept.data(), plain.size() * sizeof(float)) == 0);
    std::vector<float> want(sz(keys * channels));
    for (i64 k = 0; k < keys; ++k) fp8_dequantize_head(heads_of[sz(k)], layout, want.data() + k * channels);
    CHECK(std::memcmp(widened.data(), want.data(), want.size() * sizeof(float)) == 0);
  }
}

// ---- DeepSeek-V4 ---------------------------------------------------------------------------------

namespace {

using phasekv_test::csa_cache;
using phasekv_test::make_csa_layer;

}  // namespace

TEST_CASE("fp8 read: DeepSeek-V4 CSA with 584-byte entries reads like its dequantized twin", "[read][fp8][csa]") {
  const csa_cache::layer layer = make_csa_layer();
  std::mt19937 rng(1402);
  for (const auto& [page_size, indexer_storage] :
       {std::pair<i64, storage_type>{64, storage_type::bf16}, {5, fp8}, {1, storage_type::f32}}) {
    INFO("page_size " << page_size << ", indexer " << indexer_storage);
    csa_cache cache(layer, phasekv_test::csa_config("dsv4", page_size, {fp8, indexer_storage}, 2048, 128, 8));
    REQUIRE(cache.pool(0).layout().entry_stride_bytes == 584);
    const sequence_id seq = cache.create();
    for (i64 n : {700, 301, 1}) append_tokens(cache, seq, n, rng, phasekv_test::csa_draw);  // 250 entries
    const sequence_view view = cache.view_of(seq);
    const auto dq = dequantized_twin(view);
    for (i64 top_k : {0, 64, 240}) {  // every candidate; a selection; a selection over two pieces
      reader_config rc = phasekv_test::dsv4_reader(top_k, false);
      rc.indexer_stream = top_k > 0 ? 1 : no_stream;
      rc.indexer_heads = top_k > 0 ? 64 : 0;
      sparse_reader reader(cache, rc), twin_reader(dequantized_shape(cache.shape()), rc);
      for (i64 t : {cache.tokens(seq) - 1, cache.tokens(seq) - 7}) {
        INFO("top_k " << top_k << ", position " << t);
        request_inputs in = random_request(rc, 512, 128, rng, t);
        for (float& q : in.queries) q *= 20.0f;  // entries are RMS-normalised: logits of a few units
        const read_result got = read_one(reader, view, in.request);
        CHECK(compare(got, read_one(twin_reader, dq->view, in.request)) == "");
        // Through the cache, the same bits as through its view.
        CHECK(bit_equal(phasekv_test::read_through_cache(reader, cache, seq, in.request), got.out));
      }
    }
  }
}

TEST_CASE("fp8 read: a view or shape that does not match the FP8 layout is an error naming the field",
          "[read][fp8][errors]") {
  const csa_cache::layer layer = make_csa_layer();
  csa_cache cache(layer, phasekv_test::csa_config("dsv4", 8, {fp8, storage_type::bf16}, 8, 4));
  const sequence_id seq = cache.create();
  std::mt19937 rng(1403);
  const i64 n = 40;
  append_tokens(cache, seq, n, rng);
  const reader_config rc = phasekv_test::dsv4_reader(4, false);
  sparse_reader reader(cache, rc);
  const request_inputs in = random_request(rc, 512, 128, rng, n - 1);
  const sequence_view good = cache.view_of(seq);

  auto expect = [&](auto edit, const std::string& message) {
    phasekv_test::check_view_refused(reader, good, in.request, edit, message);
  };
  expect([](sequence_view& v) { v.streams[0].layout.rope_channels = 0; },
         "dsv4: view.streams[0].layout.rope_channels = 0: must be the stream's RoPE channels, 64");
  expect([](sequence_view& v) { v.streams[0].layout.head_stride = v.streams[0].layout.head_stride_bytes = 576; },
         "dsv4: view.streams[0].layout.head_stride = 576: must be the fp8 head's bytes = 584");
  expect([](sequence_view& v) { v.streams[0].layout.entry_stride = v.streams[0].layout.entry_stride_bytes = 512; },
         "dsv4: view.streams[0].layout.entry_stride = 512: must be kv_heads × head bytes = 584");
  expect([](sequence_view& v) { v.streams[0].layout.element_bytes = 4; },
         "dsv4: view.streams[0].layout.element_bytes = 4: must be 1");
  expect([](sequence_view& v) { v.streams[1].layout.rope_channels = 64; },  // a bf16 stream keeps no RoPE channels apart
         "dsv4: view.streams[1].layout.rope_channels = 64: must be 0");
  expect([](sequence_view& v) { v.streams[0].layout.storage = storage_type::f32; },
         "dsv4: view.streams[0].layout.storage = f32: must be the stream's fp8_e4m3_block");

  // A shape whose FP8 stream keeps more RoPE channels than it has.
  layer_shape shape = cache.shape();
  shape.streams[0].rope.channels = 600;
  CHECK_THAT(message_of<config_error>([&] { sparse_reader(shape, rc); }),
             Contains("dsv4: shape.streams[0].rope.channels = 600: must lie in [0, channels = 512]"));
}

}  // namespace test_read_fp8
