// Engine-shaped reading: sequence views, host-owned pages, batched decode, the
// log-sum-exp output and physical indices, held bitwise to the cache read and to the double
// oracle in oracle/scalar_attention.hpp.
//
//   - random worlds (odd head dims, GQA groups 1–7, page sizes 1–64, f32/bf16/f16, tied K/V with
//     de-rotation or separate K and V, forks of a shared prefix, per-sequence top_k): reading a
//     view equals reading the cache, a batch equals single reads on any executor, and each
//     batched output, lse and selection agrees with the oracle;
//   - host-built views over a host arena (pages that never touched paged_cache): a copy of a
//     cache's sequence in another page size and page order reads bit-identically, and a world
//     written straight into the arena reads like the oracle;
//   - (out, lse) merged with a second branch through softmax_state equals attention over the
//     union; an empty read is lse = −∞ and zeros;
//   - physical indices name the bytes of the logical entries;
//   - bad views and items throw input_error naming the field and write nothing;
//   - the CSR export is the batch of the same stream views;
//   - [threads]: batched reads of different sequences while another thread appends to a third
//     (scripts/test runs this file under ThreadSanitizer).

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/prelude.hpp"
#include "support/read_result.hpp"
#include "support/read_world.hpp"
#include "support/request_inputs.hpp"
#include "support/tokens.hpp"
#include "support/common.hpp"
#include "support/message_of.hpp"
#include "support/random_inputs.hpp"
#include "oracle/scalar_attention.hpp"
#include "support/thread_executor.hpp"
#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/core/executor.hpp"
#include "phasekv/read/softmax_state.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace test_read_views {

namespace {

using namespace phasekv_test::prelude;
using phasekv_test::attention_shape;

using phasekv_test::read_support::tied_cache;
using phasekv_test::read_support::untied_cache;

std::vector<float> uniform(std::mt19937& rng, i64 count, float lo = -1.0f, float hi = 1.0f) {
  return phasekv_test::random_uniform(rng, sz(count), lo, hi);
}
using phasekv_test::append_tokens;

bool bit_equal(const float* a, const float* b, i64 n) { return std::memcmp(a, b, sz(n) * sizeof(float)) == 0; }
using phasekv_test::same_trace;

using phasekv_test::thread_executor;

using phasekv_test::read_support::reader_for;

// ---- random worlds ---------------------------------------------------------------------------

struct world_spec : phasekv_test::read_support::world_shape {
  storage_type storage = storage_type::f32;

  std::string describe() const {
    std::ostringstream o;
    o << describe_shape() << " storage=" << storage;
    return o.str();
  }
};

world_spec random_spec(std::mt19937& rng) {
  world_spec s;
  s.draw_geometry(rng, 5, 2, 3);
  s.group = pick(rng, 1, 7);
  s.key_channels = pick_of<i64>(rng, {5, 7, 9, 13, 17, 33});
  s.value_channels = pick_of<i64>(rng, {3, 11, 19});
  s.indexer_channels = pick_of<i64>(rng, {3, 5, 12, 16});
  s.indexer_heads = pick(rng, 1, 5);
  s.page_size = pick_of<i64>(rng, {1, 2, 5, 7, 16, 64});
  s.window_tokens = pick_of<i64>(rng, {0, 1, 3, 9});
  s.top_k = pick_of<i64>(rng, {0, 1, 4, 17});
  s.sink = pick(rng, 0, 1) == 1;
  s.tied = pick(rng, 0, 1) == 1;
  s.rope_channels = 2 * pick(rng, 1, s.key_channels / 2);
  s.storage = pick_of(rng, {storage_type::f32, storage_type::bf16, storage_type::f16});
  return s;
}

cache_config cache_config_for(const world_spec& s) {
  cache_config cc = phasekv_test::cache_of(
      "views", s.page_size, 4096, 16,
      raw_window_config{s.window_tokens, s.kv_heads, s.key_channels, s.tied ? 0 : s.value_channels});
  cc.storage = s.storage;
  return cc;
}

untied_cache make_untied(const world_spec& s) { return phasekv_test::read_support::make_untied(s, cache_config_for(s)); }
tied_cache make_tied(const world_spec& s) { return phasekv_test::read_support::make_tied(s, cache_config_for(s)); }

// One read's inputs for a world (owned, so items can point at them).
using phasekv_test::request_inputs;
request_inputs random_request(const world_spec& s, std::mt19937& rng, i64 position, i64 top_k) {
  request_inputs r = phasekv_test::random_request(reader_for(s, "views"), s.key_channels, s.indexer_channels, rng, position, 2.0f);
  r.request.top_k = top_k;
  return r;
}

// Plain fp32 rows of an entry of stream k, whatever its storage.
template <class Cache>
std::vector<float> entry_of(const Cache& cache, sequence_id seq, std::size_t k, i64 j) {
  const page_layout& l = cache.pool(k).layout();
  std::vector<float> out(sz(l.entry_stride));
  cache.read_entry(seq, k, j, out.data());
  return out;
}

// ---- the oracle ------------------------------------------------------------------------------

struct rows {
  std::vector<std::vector<float>> keys, values;  // [kv_heads × channels] each
};

// ln(Σ exp(ℓ) + exp(sink)) per query head in double, over the given key rows.
std::vector<double> oracle_lse(const attention_shape& shape, const std::vector<float>& q, double scale, const rows& r,
                               const std::vector<float>& sinks) {
  const i64 group = shape.query_heads / shape.kv_heads;
  std::vector<double> lse;
  for (i64 h = 0; h < shape.query_heads; ++h) {
    const i64 g = h / group;
    std::vector<double> l;
    for (const auto& k : r.keys)
      l.push_back(scale * phasekv_test::dot_product(q.data() + h * shape.key_channels, k.data() + g * shape.key_channels,
                                                    shape.key_channels));
    if (!sinks.empty()) l.push_back(sinks[sz(h)]);
    double m = -std::numeric_limits<double>::infinity();
    for (double x : l) m = std::max(m, x);
    if (m == -std::numeric_limits<double>::infinity()) {
      lse.push_back(m);
      continue;
    }
    double d = 0.0;
    for (double x : l) d += std::exp(x - m);
    lse.push_back(m + std::log(d));
  }
  return lse;
}

// "" when |got − want| ≤ tol · max(|want|, scale) everywhere.
std::string mismatch(const float* got, const std::vector<double>& want, double scale, double tol = 2e-5) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got[i];
    const bool both_minus_inf = std::isinf(want[i]) && want[i] < 0 && g == -std::numeric_limits<double>::infinity();
    if (both_minus_inf) continue;
    if (!(std::abs(g - want[i]) <= tol * std::max(std::abs(want[i]), scale))) {
      std::ostringstream o;
      o.precision(9);
      o << "element " << i << ": got " << g << ", want " << want[i];
      return o.str();
    }
  }
  return "";
}

double max_abs(const rows& r) {
  double m = 1e-30;
  for (const auto& v : r.values)
    for (float x : v) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

// The reader's selection is a top-k of the double-precision indexer scores (fp32 may swap
// near-ties at the boundary), and every candidate is there when it does not select.
std::string check_selection(const std::vector<std::vector<float>>& indexer_keys, const request_inputs& in, i64 k,
                            const std::vector<i64>& selected, i64 channels) {
  const std::vector<double> scores =
      phasekv_test::indexer_scores(in.indexer_queries, in.indexer_weights, indexer_keys, channels);
  const i64 n = static_cast<i64>(scores.size());
  if (static_cast<i64>(selected.size()) != std::min(k, n)) return "selected " + std::to_string(selected.size());
  if (selected.empty()) return "";
  std::vector<double> sorted = scores;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  const double kth = sorted[sz(std::min(k, n) - 1)];
  std::vector<i64> seen = selected;
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) return "an entry selected twice";
  for (i64 j : selected) {
    if (j < 0 || j >= n) return "entry " + std::to_string(j) + " is not a candidate";
    if (scores[sz(j)] < kth - 1e-4 * std::max(1.0, std::abs(kth))) return "entry " + std::to_string(j) + " is not in the top k";
  }
  return "";
}

// The oracle's output and lse of one read of a cache's sequence over the entries the reader selected.
template <class Cache>
struct oracle_read {
  std::vector<double> output, lse;
  double value_scale = 0.0;
  std::string selection_error;
};
template <class Cache>
oracle_read<Cache> expect(const Cache& cache, sequence_id seq, const world_spec& s, const reader_config& rc,
                          const request_inputs& in, const std::vector<i64>& selected) {
  oracle_read<Cache> e;
  const i64 t = in.request.position;
  const geometry g{s.stride, s.window};
  const i64 candidates = g.visible_entries(t);
  if (rc.top_k > 0) {
    std::vector<std::vector<float>> ix;
    for (i64 j = 0; j < candidates; ++j) ix.push_back(entry_of(cache, seq, rc.indexer_stream, j));
    const i64 k = in.request.top_k < 0 ? rc.top_k : in.request.top_k;
    e.selection_error = check_selection(ix, in, k, selected, s.indexer_channels);
  } else if (static_cast<i64>(selected.size()) != candidates) {
    e.selection_error = "without selection every candidate is read";
  }
  rows r;
  for (i64 j : selected) {
    r.keys.push_back(entry_of(cache, seq, rc.key_stream, j));
    r.values.push_back(entry_of(cache, seq, rc.value_stream, j));
  }
  if (s.window_tokens > 0)
    for (i64 u = std::max<i64>(0, t - s.window_tokens + 1); u <= t; ++u) {
      const i64 kf = s.kv_heads * s.key_channels, vf = s.kv_heads * s.values();
      r.keys.emplace_back(cache.window_key(seq, u), cache.window_key(seq, u) + kf);
      r.values.emplace_back(cache.window_value(seq, u), cache.window_value(seq, u) + vf);
    }
  const attention_shape shape{s.query_heads(), s.kv_heads, s.key_channels, s.values()};
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.key_channels));
  e.output = phasekv_test::sparse_read(shape, in.queries, scale, r.keys, r.values, {}, {}, in.sinks).output;
  if (s.tied) {
    rope_config rope;
    rope.channels = s.rope_channels;
    rope.base = 1000.0;
    phasekv_test::derotate_heads(e.output, s.query_heads(), s.key_channels, rope, t);
  }
  e.lse = oracle_lse(shape, in.queries, scale, r, in.sinks);
  e.value_scale = max_abs(r);
  return e;
}

// ---- a host copy of a cache's sequence ---------------------------------------------------------

// The sequence's entries copied byte for byte into an arena of the host's own: another page size,
// pages in a shuffled order with unused pages between them, and a window ring of another size.
struct host_copy {
  std::vector<std::vector<std::byte>> arenas;  // per stream
  std::vector<std::vector<page_id>> tables;
  std::vector<float> window_keys, window_values;
  sequence_view view;
};

template <class Cache>
std::unique_ptr<host_copy> copy_to_host(const Cache& cache, sequence_id seq, std::mt19937& rng) {
  auto h = std::make_unique<host_copy>();
  const sequence_view src = cache.view_of(seq);
  h->view.tokens = src.tokens;
  h->view.stream_count = src.stream_count;
  h->arenas.resize(src.stream_count);
  h->tables.resize(src.stream_count);
  for (std::size_t k = 0; k < src.stream_count; ++k) {
    const stream_view& from = src.streams[k];
    const page_pool_config pc =
        phasekv_test::pool_of("pool", pick(rng, 1, 64), from.layout.kv_heads, from.layout.channels, 0, from.layout.storage);
    page_layout l = page_layout::for_config(pc);
    l.page_stride_bytes += 2 * l.element_bytes * pick(rng, 0, 3);  // the host's own page stride
    l.page_stride = l.page_stride_bytes / l.element_bytes;
    const i64 pages = (from.entries + pc.page_size - 1) / pc.page_size;
    const i64 capacity = 2 * pages + 3;
    h->arenas[k].assign(sz(capacity * l.page_stride_bytes + 64), std::byte{0xFF});
    std::vector<page_id> ids(sz(capacity));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(sz(pages));
    h->tables[k] = ids;
    // The base aligned to the element size only (4 bytes for fp32): hosts need no more.
    std::byte* base = h->arenas[k].data() + 4;
    for (i64 e = 0; e < from.entries; ++e) {
      const std::byte* in = from.base + from.pages[sz(e / from.layout.page_size)] * from.layout.page_stride_bytes +
                            (e % from.layout.page_size) * from.layout.entry_stride_bytes;
      std::byte* out = base + ids[sz(e / pc.page_size)] * l.page_stride_bytes + (e % pc.page_size) * l.entry_stride_bytes;
      std::memcpy(out, in, sz(l.entry_stride_bytes));
    }
    stream_view& to = h->view.streams[k];
    to.base = base;
    to.layout = l;
    to.capacity = capacity;
    to.pages = h->tables[k];
    to.entries = from.entries;
  }
  const window_view& w = src.window;
  if (w.rows > 0) {
    window_view& to = h->view.window;
    to = w;
    to.rows = w.tokens - w.first + pick(rng, 0, 5);
    if (to.rows == 0) to.rows = 1;
    const i64 kf = w.kv_heads * w.key_channels, vf = w.kv_heads * w.value_channels;
    h->window_keys.assign(sz(to.rows * kf), 0.0f);
    h->window_values.assign(sz(to.rows * vf), 0.0f);
    for (i64 t = w.first; t < w.tokens; ++t) {
      std::memcpy(h->window_keys.data() + (t % to.rows) * kf, w.keys + (t % w.rows) * kf, sz(kf) * sizeof(float));
      std::memcpy(h->window_values.data() + (t % to.rows) * vf, w.values + (t % w.rows) * vf, sz(vf) * sizeof(float));
    }
    to.keys = h->window_keys.data();
    to.values = h->window_values.data();
  }
  return h;
}

// ---- one random world, read every way ---------------------------------------------------------

template <class Cache>
void check_world(Cache& cache, const world_spec& s, std::mt19937& rng) {
  const reader_config rc = reader_for(s, "views");
  sparse_reader reader(cache, rc), batched(cache.shape(), rc), threaded(cache.shape(), rc);
  thread_executor pool(3, true);
  threaded.set_executor(pool);

  // A shared prefix, forks of it that go on on their own, and one independent sequence.
  std::vector<sequence_id> seqs;
  const sequence_id base = cache.create();
  append_tokens(cache, base, pick(rng, 1, 200), rng);
  for (int f = 0; f < 3; ++f) {
    const sequence_id fork = cache.fork(base);
    append_tokens(cache, fork, pick(rng, 1, 60), rng);
    seqs.push_back(fork);
  }
  append_tokens(cache, base, pick(rng, 0, 30) + 1, rng);
  seqs.push_back(base);
  const sequence_id other = cache.create();
  append_tokens(cache, other, pick(rng, 1, 150), rng);
  seqs.push_back(other);

  const i64 B = static_cast<i64>(seqs.size()), H = s.query_heads(), out_floats = H * s.values();
  const i64 k_out = std::max<i64>(rc.top_k, 1);
  std::vector<request_inputs> inputs;
  for (sequence_id seq : seqs) {
    const i64 tokens = cache.tokens(seq);
    // The earliest position whose window the ring still holds.
    const i64 kept = cache.window_first(seq);
    const i64 earliest = s.window_tokens > 0 && kept > 0 ? kept + s.window_tokens - 1 : 0;
    const i64 position = pick(rng, std::max(earliest, tokens - 17), tokens - 1);
    const i64 top_k = rc.top_k > 0 ? pick(rng, -1, rc.top_k) : pick(rng, -1, 0);
    inputs.push_back(random_request(s, rng, position, top_k));
  }
  for (auto& in : inputs) in.point();

  // Single reads: through the cache, and through its view.
  std::vector<std::vector<float>> single(sz(B), std::vector<float>(sz(out_floats)));
  std::vector<read_trace> single_traces(sz(B));
  for (i64 b = 0; b < B; ++b) {
    INFO("sequence " << b);
    reader.read(cache, seqs[sz(b)], inputs[sz(b)].request, single[sz(b)].data(), &single_traces[sz(b)]);
    std::vector<float> via_view(sz(out_floats));
    read_trace trace;
    const sequence_view v = cache.view_of(seqs[sz(b)]);
    reader.read(v, inputs[sz(b)].request, via_view.data(), &trace);
    CHECK(bit_equal(via_view.data(), single[sz(b)].data(), out_floats));
    CHECK(same_trace(trace, single_traces[sz(b)]));
  }

  // The batch, serially and on three threads.
  std::vector<sequence_view> views;
  for (sequence_id seq : seqs) views.push_back(cache.view_of(seq));
  struct outputs {
    std::vector<float> out, lse;
    std::vector<std::int32_t> logical, physical;
    std::vector<read_trace> traces;
  };
  auto run_batch = [&](sparse_reader& r) {
    outputs o;
    o.out.assign(sz(B * out_floats), 7.0f);
    o.lse.assign(sz(B * H), 7.0f);
    o.logical.assign(sz(B * k_out), 99);
    o.physical.assign(sz(B * k_out), 99);
    o.traces.resize(sz(B));
    std::vector<read_item> items(sz(B));
    for (i64 b = 0; b < B; ++b) {
      read_item& it = items[sz(b)];
      it.view = &views[sz(b)];
      it.request = inputs[sz(b)].request;
      it.out = o.out.data() + b * out_floats;
      it.lse = o.lse.data() + b * H;
      if (rc.top_k > 0) {
        it.selected_logical = o.logical.data() + b * k_out;
        it.selected_physical = o.physical.data() + b * k_out;
      }
      it.trace = &o.traces[sz(b)];
    }
    r.read_batch(items);
    return o;
  };
  const outputs serial = run_batch(batched), parallel = run_batch(threaded);
  CHECK(serial.out == parallel.out);
  CHECK(bit_equal(serial.lse.data(), parallel.lse.data(), B * H));
  CHECK(serial.logical == parallel.logical);
  CHECK(serial.physical == parallel.physical);

  for (i64 b = 0; b < B; ++b) {
    const sequence_id seq = seqs[sz(b)];
    const request_inputs& in = inputs[sz(b)];
    INFO("sequence " << b << ", position " << in.request.position << " of " << cache.tokens(seq) << ", top_k "
                     << in.request.top_k);
    CHECK(bit_equal(serial.out.data() + b * out_floats, single[sz(b)].data(), out_floats));
    CHECK(same_trace(serial.traces[sz(b)], single_traces[sz(b)]));
    CHECK(same_trace(parallel.traces[sz(b)], single_traces[sz(b)]));

    // A batch of one gives the same output and lse.
    std::vector<float> one(sz(out_floats)), one_lse(sz(H));
    read_item it;
    it.view = &views[sz(b)];
    it.request = in.request;
    it.out = one.data();
    it.lse = one_lse.data();
    batched.read_batch(span<const read_item>(&it, 1));
    CHECK(bit_equal(one.data(), single[sz(b)].data(), out_floats));
    CHECK(bit_equal(one_lse.data(), serial.lse.data() + b * H, H));

    // Selected entries: logical ids are the trace's, −1 padded; physical indices name their bytes.
    const std::vector<i64>& selected = single_traces[sz(b)].selected;
    if (rc.top_k > 0) {
      const stream_view& keys = views[sz(b)].streams[rc.key_stream];
      const page_layout& l = keys.layout;
      for (i64 r = 0; r < k_out; ++r) {
        const std::int32_t logical = serial.logical[sz(b * k_out + r)], physical = serial.physical[sz(b * k_out + r)];
        const i64 k = in.request.top_k < 0 ? rc.top_k : in.request.top_k;
        if (r >= k) {
          CHECK(logical == 99);  // past this item's top_k: untouched
          continue;
        }
        if (r >= static_cast<i64>(selected.size())) {
          CHECK(logical == -1);
          CHECK(physical == -1);
          continue;
        }
        REQUIRE(logical == selected[sz(r)]);
        REQUIRE(physical >= 0);
        const std::byte* at = keys.base + (physical / l.page_size) * l.page_stride_bytes +
                              (physical % l.page_size) * l.entry_stride_bytes;
        std::vector<float> row(sz(l.entry_stride));
        load_row(at, row.data(), l.entry_stride, l.storage);
        CHECK(row == entry_of(cache, seq, rc.key_stream, logical));
      }
    }

    // The oracle, over the entries the reader selected.
    const oracle_read<Cache> e = expect(cache, seq, s, rc, in, selected);
    CHECK(e.selection_error == "");
    CHECK(mismatch(serial.out.data() + b * out_floats, e.output, e.value_scale) == "");
    CHECK(mismatch(serial.lse.data() + b * H, e.lse, 1.0) == "");
  }

  // A host copy of one sequence — another page size, shuffled pages, another ring — reads bit-identically.
  for (i64 b = 0; b < B; b += 2) {
    const auto host = copy_to_host(cache, seqs[sz(b)], rng);
    std::vector<float> out(sz(out_floats));
    read_trace trace;
    sparse_reader(cache.shape(), rc).read(host->view, inputs[sz(b)].request, out.data(), &trace);
    INFO("host copy of sequence " << b);
    CHECK(bit_equal(out.data(), single[sz(b)].data(), out_floats));
    CHECK(same_trace(trace, single_traces[sz(b)]));
  }
}

}  // namespace

TEST_CASE("views: reading a view, the cache and a batch give the same bits, and the oracle's values",
          "[read][views][oracle]") {
  std::mt19937 rng(1201);
  for (int world = 0; world < 24; ++world) {
    const world_spec s = random_spec(rng);
    INFO("world " << world << ": " << s.describe());
    if (s.tied) {
      tied_cache cache = make_tied(s);
      check_world(cache, s, rng);
    } else {
      untied_cache cache = make_untied(s);
      check_world(cache, s, rng);
    }
  }
}

// ---- a host arena that never touched paged_cache ------------------------------------------------

namespace {

// A layer written straight into a host arena: keys and values interleaved per page
// ([pages][K slots | V slots] with a gap, vLLM-style), bf16 indexer keys in an arena of their
// own, a window ring, and page tables the host picked.
struct host_world {
  static constexpr i64 kv_heads = 2, key_channels = 11, value_channels = 7, indexer_channels = 6;
  static constexpr i64 query_heads = 10, indexer_heads = 3, page_size = 5, capacity = 40, window = 4, rows = 6;
  geometry geom{3, 5};
  i64 tokens = 0;
  page_layout k_layout, v_layout, ix_layout;
  std::vector<float> kv_arena;               // fp32 K and V pages
  std::vector<std::uint16_t> ix_arena;       // bf16 indexer pages
  std::vector<page_id> kv_pages, ix_pages;
  std::vector<float> window_keys, window_values;  // [rows][kv_heads][channels]
  std::vector<std::vector<float>> keys, values, indexer;  // every entry as stored, in fp32

  layer_shape shape() const {
    layer_shape s;
    s.geom = geom;
    s.streams = {{"host.keys", stream_role::key, kv_heads, key_channels, storage_type::f32, false, {}},
                 {"host.values", stream_role::value, kv_heads, value_channels, storage_type::f32, false, {}},
                 {"host.indexer", stream_role::indexer, 1, indexer_channels, storage_type::bf16, false, {}}};
    s.window = raw_window_config{window, kv_heads, key_channels, value_channels};
    return s;
  }

  static page_layout layout(i64 heads, i64 channels, storage_type storage, i64 page_stride_bytes) {
    page_layout l = page_layout::for_config(phasekv_test::pool_of("pool", page_size, heads, channels, 0, storage));
    l.page_stride_bytes = page_stride_bytes;
    l.page_stride = page_stride_bytes / l.element_bytes;
    return l;
  }

  host_world(std::mt19937& rng, i64 t) : tokens(t) {
    const i64 k_floats = page_size * kv_heads * key_channels, v_floats = page_size * kv_heads * value_channels;
    const i64 kv_page_floats = k_floats + v_floats + 3;  // 3 floats of the host's own per page
    k_layout = layout(kv_heads, key_channels, storage_type::f32, kv_page_floats * 4);
    v_layout = layout(kv_heads, value_channels, storage_type::f32, kv_page_floats * 4);
    ix_layout = layout(1, indexer_channels, storage_type::bf16, page_size * indexer_channels * 2 + 8);
    kv_arena.assign(sz(capacity * kv_page_floats), std::numeric_limits<float>::quiet_NaN());  // unused: NaN
    ix_arena.assign(sz(capacity * ix_layout.page_stride), 0x7FC0);
    const i64 n = geom.completed_entries(tokens), pages = (n + page_size - 1) / page_size;
    std::vector<page_id> ids(sz(capacity));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    kv_pages.assign(ids.begin(), ids.begin() + pages);
    std::shuffle(ids.begin(), ids.end(), rng);
    ix_pages.assign(ids.begin(), ids.begin() + pages);
    for (i64 e = 0; e < n; ++e) {
      keys.push_back(uniform(rng, kv_heads * key_channels));
      values.push_back(uniform(rng, kv_heads * value_channels));
      std::vector<float> ix = uniform(rng, indexer_channels);
      for (float& x : ix) x = bf16_to_float(float_to_bf16(x));  // what the arena holds
      indexer.push_back(ix);
      const i64 page = e / page_size, slot = e % page_size;
      float* kp = kv_arena.data() + kv_pages[sz(page)] * kv_page_floats;
      std::copy(keys.back().begin(), keys.back().end(), kp + slot * kv_heads * key_channels);
      std::copy(values.back().begin(), values.back().end(), kp + k_floats + slot * kv_heads * value_channels);
      store_row(ix.data(), ix_arena.data() + ix_pages[sz(page)] * ix_layout.page_stride + slot * indexer_channels,
                indexer_channels, storage_type::bf16);
    }
    window_keys = uniform(rng, rows * kv_heads * key_channels);
    window_values = uniform(rng, rows * kv_heads * value_channels);
  }

  sequence_view view() const {
    sequence_view v;
    v.tokens = tokens;
    v.stream_count = 3;
    const auto* kv = reinterpret_cast<const std::byte*>(kv_arena.data());
    v.streams[0] = stream_view{kv, k_layout, capacity, kv_pages, geom.completed_entries(tokens)};
    v.streams[1] = stream_view{kv + page_size * kv_heads * key_channels * 4, v_layout, capacity, kv_pages,
                               geom.completed_entries(tokens)};
    v.streams[2] = stream_view{reinterpret_cast<const std::byte*>(ix_arena.data()), ix_layout, capacity, ix_pages,
                               geom.completed_entries(tokens)};
    v.window = window_view{window_keys.data(), window_values.data(), rows, std::max<i64>(0, tokens - rows), tokens,
                           kv_heads, key_channels, value_channels};
    return v;
  }

  // Token u's window rows.
  std::vector<float> window_key(i64 u) const {
    const i64 f = kv_heads * key_channels;
    return std::vector<float>(window_keys.begin() + (u % rows) * f, window_keys.begin() + (u % rows + 1) * f);
  }
  std::vector<float> window_value(i64 u) const {
    const i64 f = kv_heads * value_channels;
    return std::vector<float>(window_values.begin() + (u % rows) * f, window_values.begin() + (u % rows + 1) * f);
  }
};

reader_config host_reader(i64 top_k, bool sink) {
  reader_config rc;
  rc.name = "host";
  rc.query_heads = host_world::query_heads;
  rc.key_stream = 0;
  rc.value_stream = 1;
  rc.indexer_stream = 2;
  rc.top_k = top_k;
  rc.indexer_heads = host_world::indexer_heads;
  rc.sink = sink;
  rc.precision = indexer_precision::bf16;
  return rc;
}

// The shapes random_request draws a host world's queries for.
world_spec host_spec(i64 top_k, bool sink) {
  using W = host_world;
  world_spec s;
  s.kv_heads = W::kv_heads;
  s.group = W::query_heads / W::kv_heads;
  s.key_channels = W::key_channels;
  s.indexer_heads = W::indexer_heads;
  s.indexer_channels = W::indexer_channels;
  s.top_k = top_k;
  s.sink = sink;
  return s;
}

}  // namespace

TEST_CASE("views: a host arena that never touched paged_cache reads like the oracle", "[read][views][oracle]") {
  std::mt19937 rng(1202);
  using W = host_world;
  for (i64 tokens : {1, 2, 40, 97, 100}) {
    const W world(rng, tokens);
    for (bool sink : {false, true}) {
      const reader_config rc = host_reader(6, sink);
      sparse_reader reader(world.shape(), rc);
      const sequence_view view = world.view();
      // Every position whose window the ring still holds.
      for (i64 t = std::max<i64>(0, tokens - W::rows + W::window - 1); t < tokens; ++t) {
        INFO("tokens " << tokens << ", position " << t << (sink ? ", sink" : ""));
        const world_spec s = host_spec(rc.top_k, sink);  // for random_request's shapes
        request_inputs in = random_request(s, rng, t, -1);
        // Indexer queries exact in bf16, so the oracle's scores are the kernel's (up to summation order).
        for (float& x : in.indexer_queries) x = bf16_to_float(float_to_bf16(x));
        in.point();
        std::vector<float> out(sz(reader.output_floats())), lse(sz(W::query_heads));
        std::vector<std::int32_t> logical(sz(rc.top_k)), physical(sz(rc.top_k));
        read_item it;
        it.view = &view;
        it.request = in.request;
        it.out = out.data();
        it.lse = lse.data();
        it.selected_logical = logical.data();
        it.selected_physical = physical.data();
        reader.read_batch(span<const read_item>(&it, 1));

        const i64 candidates = world.geom.visible_entries(t);
        std::vector<i64> selected;
        for (std::int32_t j : logical)
          if (j >= 0) selected.push_back(j);
        std::vector<std::vector<float>> ix(world.indexer.begin(), world.indexer.begin() + candidates);
        CHECK(check_selection(ix, in, rc.top_k, selected, W::indexer_channels) == "");
        rows r;
        for (std::size_t i = 0; i < selected.size(); ++i) {
          const i64 j = selected[i];
          r.keys.push_back(world.keys[sz(j)]);
          r.values.push_back(world.values[sz(j)]);
          // The physical index names the entry's slot in the host's own page table.
          CHECK(physical[i] == world.kv_pages[sz(j / W::page_size)] * W::page_size + j % W::page_size);
        }
        for (std::size_t i = selected.size(); i < physical.size(); ++i) CHECK(physical[i] == -1);
        for (i64 u = std::max<i64>(0, t - W::window + 1); u <= t; ++u) {
          r.keys.push_back(world.window_key(u));
          r.values.push_back(world.window_value(u));
        }
        const attention_shape shape{W::query_heads, W::kv_heads, W::key_channels, W::value_channels};
        const double scale = 1.0 / std::sqrt(static_cast<double>(W::key_channels));
        const auto want = phasekv_test::sparse_read(shape, in.queries, scale, r.keys, r.values, {}, {}, in.sinks);
        CHECK(mismatch(out.data(), want.output, max_abs(r)) == "");
        CHECK(mismatch(lse.data(), oracle_lse(shape, in.queries, scale, r, in.sinks), 1.0) == "");
      }
    }
  }
}

TEST_CASE("views: (out, lse) merged with a second branch equals attention over the union", "[read][views][oracle]") {
  std::mt19937 rng(1203);
  using W = host_world;
  const W a(rng, 80), b(rng, 53);
  const attention_shape shape{W::query_heads, W::kv_heads, W::key_channels, W::value_channels};
  const double scale = 1.0 / std::sqrt(static_cast<double>(W::key_channels));
  // Branch a: top-6 with the sink (it belongs in one branch only); branch b: every candidate, no sink.
  sparse_reader with_sink(a.shape(), host_reader(6, true)), plain(b.shape(), host_reader(0, false));
  const world_spec s = host_spec(6, true);
  for (int trial = 0; trial < 4; ++trial) {
    INFO("trial " << trial);
    request_inputs in = random_request(s, rng, 79, -1);
    in.point();
    read_request rb = in.request;
    rb.position = 50;
    rb.indexer_queries = {};
    rb.indexer_weights = {};
    rb.sinks = {};
    const sequence_view va = a.view(), vb = b.view();
    std::vector<float> out_a(sz(W::query_heads * W::value_channels)), out_b(out_a.size()), lse_a(sz(W::query_heads)),
        lse_b(lse_a.size());
    std::vector<std::int32_t> selected(6);
    read_item ia, ib;
    ia.view = &va;
    ia.request = in.request;
    ia.out = out_a.data();
    ia.lse = lse_a.data();
    ia.selected_logical = selected.data();
    ib.view = &vb;
    ib.request = rb;
    ib.out = out_b.data();
    ib.lse = lse_b.data();
    with_sink.read_batch(span<const read_item>(&ia, 1));
    plain.read_batch(span<const read_item>(&ib, 1));

    softmax_state merged, other;
    merged.assign_normalised(W::query_heads, W::value_channels, out_a.data(), lse_a.data());
    other.assign_normalised(W::query_heads, W::value_channels, out_b.data(), lse_b.data());
    merged.merge(other);
    std::vector<float> out(out_a.size());
    merged.finish(out.data());

    rows r;  // a's selected entries and window, then b's every candidate and window
    for (std::int32_t j : selected) {
      r.keys.push_back(a.keys[sz(j)]);
      r.values.push_back(a.values[sz(j)]);
    }
    for (i64 u = 79 - W::window + 1; u <= 79; ++u) {
      r.keys.push_back(a.window_key(u));
      r.values.push_back(a.window_value(u));
    }
    for (i64 j = 0; j < b.geom.visible_entries(50); ++j) {
      r.keys.push_back(b.keys[sz(j)]);
      r.values.push_back(b.values[sz(j)]);
    }
    for (i64 u = 50 - W::window + 1; u <= 50; ++u) {
      r.keys.push_back(b.window_key(u));
      r.values.push_back(b.window_value(u));
    }
    const auto want = phasekv_test::sparse_read(shape, in.queries, scale, r.keys, r.values, {}, {}, in.sinks);
    CHECK(mismatch(out.data(), want.output, max_abs(r)) == "");
    // The merged state's own log-sum-exp is the union's.
    std::vector<float> lse(sz(W::query_heads));
    for (i64 h = 0; h < W::query_heads; ++h) lse[sz(h)] = merged.log_denominator(h, nullptr);
    CHECK(mismatch(lse.data(), oracle_lse(shape, in.queries, scale, r, in.sinks), 1.0) == "");
  }
}

TEST_CASE("views: a read that sees nothing gives lse = -inf and zeros; with a sink, lse = the sink", "[read][views]") {
  std::mt19937 rng(1204);
  layer_shape shape;
  shape.geom = geometry{4, 4};
  shape.streams = {{"kv", stream_role::key_value, 1, 4, storage_type::f32, false, {}}};
  sequence_view v;  // one token, no entry complete, no window: nothing to attend to
  v.tokens = 1;
  v.stream_count = 1;
  v.streams[0].layout = page_layout::for_config(phasekv_test::pool_of("pool", 2, 1, 4, 0));
  for (bool sink : {false, true}) {
    reader_config rc;
    rc.query_heads = 3;
    rc.sink = sink;
    sparse_reader reader(shape, rc);
    const auto q = uniform(rng, 12);
    const std::vector<float> sinks = sink ? std::vector<float>{0.5f, -std::numeric_limits<float>::infinity(), -2.0f}
                                          : std::vector<float>{};
    read_request rq;
    rq.queries = q;
    rq.sinks = sinks;
    std::vector<float> out(12, 42.0f), lse(3, 42.0f);
    read_item it;
    it.view = &v;
    it.request = rq;
    it.out = out.data();
    it.lse = lse.data();
    reader.read_batch(span<const read_item>(&it, 1));
    for (float x : out) CHECK(x == 0.0f);
    for (i64 h = 0; h < 3; ++h) CHECK(lse[sz(h)] == (sink ? sinks[sz(h)] : -std::numeric_limits<float>::infinity()));
    // The identity of the merge: merging it into another state changes nothing.
    softmax_state state(3, 4), empty;
    empty.assign_normalised(3, 4, out.data(), lse.data());
    if (!sink) {
      state.merge(empty);
      for (i64 h = 0; h < 3; ++h) CHECK(state.empty(h));
    }
  }
}

TEST_CASE("views: bad views and items throw input_error naming the field, and write nothing", "[read][views][errors]") {
  std::mt19937 rng(1205);
  using W = host_world;
  const W world(rng, 40);
  const reader_config rc = host_reader(4, true);
  sparse_reader reader(world.shape(), rc);
  const world_spec s = host_spec(4, true);
  request_inputs in = random_request(s, rng, 39, -1);
  in.point();
  const sequence_view good = world.view();
  std::vector<float> out(sz(reader.output_floats()), 42.0f), lse(sz(W::query_heads), 42.0f);
  std::vector<std::int32_t> logical(4, 42);

  auto expect = [&](const sequence_view& v, const read_request& rq, const std::string& field_and_value, int index = 1) {
    INFO("expecting " << field_and_value);
    std::vector<read_item> items(3);
    for (read_item& it : items) {
      it.view = &good;
      it.request = in.request;
      it.out = out.data();
      it.lse = lse.data();
      it.selected_logical = logical.data();
    }
    items[sz(index)].view = &v;
    items[sz(index)].request = rq;
    REQUIRE_THAT(message_of<input_error>([&] { reader.read_batch(items); }),
                 Contains("host: items[" + std::to_string(index) + "]." + field_and_value));
  };
  sequence_view v = good;
  v.streams[0].pages = span<const page_id>(world.kv_pages.data(), 1);
  expect(v, in.request, "view.streams[0].pages.size() = 1");
  std::vector<page_id> bad_pages = world.ix_pages;
  bad_pages[2] = W::capacity;
  v = good;
  v.streams[2].pages = bad_pages;
  expect(v, in.request, "view.streams[2].pages[2] = " + std::to_string(W::capacity));
  bad_pages[2] = -1;
  expect(v, in.request, "view.streams[2].pages[2] = -1");
  v = good;
  v.streams[1].entries = 3;
  expect(v, in.request, "view.streams[1].entries = 3");
  v = good;
  v.streams[1].base = nullptr;
  expect(v, in.request, "view.streams[1].base = null");
  v = good;
  v.streams[0].layout.channels = 12;
  expect(v, in.request, "view.streams[0].layout.channels = 12");
  v = good;
  v.streams[2].layout.storage = storage_type::f32;
  expect(v, in.request, "view.streams[2].layout.storage = f32");
  v = good;
  v.streams[0].layout.page_stride_bytes = 8;
  expect(v, in.request, "view.streams[0].layout.page_stride_bytes = 8");
  v = good;
  v.streams[0].capacity = 0;
  expect(v, in.request, "view.streams[0].pages[0]");
  v = good;
  v.stream_count = 2;
  expect(v, in.request, "view.stream_count = 2");
  v = good;
  v.tokens = 0;
  expect(v, in.request, "view.tokens = 0");
  v = good;
  v.window.keys = nullptr;
  expect(v, in.request, "view.window.keys = null");
  v = good;
  v.window.value_channels = 3;
  expect(v, in.request, "view.window.value_channels = 3");
  v = good;
  v.window.first = 37;
  expect(v, in.request, "request.position = 39: needs window tokens from 36");
  v = good;
  v.window.tokens = 39;
  expect(v, in.request, "view.window.tokens = 39");
  read_request rq = in.request;
  rq.position = 40;
  expect(good, rq, "request.position = 40", 0);
  rq = in.request;
  rq.top_k = 5;
  expect(good, rq, "request.top_k = 5", 2);
  rq.top_k = -2;
  expect(good, rq, "request.top_k = -2", 2);
  rq = in.request;
  rq.sinks = span<const float>(in.sinks.data(), 3);
  expect(good, rq, "request.sinks.size() = 3");
  std::vector<float> nan_queries = in.queries;
  nan_queries[5] = std::numeric_limits<float>::quiet_NaN();
  rq = in.request;
  rq.queries = nan_queries;
  expect(good, rq, "request.queries[5] = nan");
  {
    read_item it;
    it.view = nullptr;
    it.request = in.request;
    it.out = out.data();
    REQUIRE_THAT(message_of<input_error>([&] { reader.read_batch(span<const read_item>(&it, 1)); }),
                 Contains("host: items[0].view = null"));
    it.view = &good;
    it.out = nullptr;
    REQUIRE_THAT(message_of<input_error>([&] { reader.read_batch(span<const read_item>(&it, 1)); }),
                 Contains("host: items[0].out = null"));
  }
  {
    // Selected entries from a reader that does not select.
    sparse_reader all(world.shape(), host_reader(0, true));
    read_item it;
    it.view = &good;
    it.request = in.request;
    it.request.indexer_queries = {};
    it.request.indexer_weights = {};
    it.out = out.data();
    it.selected_physical = logical.data();
    REQUIRE_THAT(message_of<input_error>([&] { all.read_batch(span<const read_item>(&it, 1)); }),
                 Contains("items[0].selected_physical = non-null") && Contains("top_k > 0"));
  }
  // A single read names no item.
  v = good;
  v.streams[0].entries = 1;
  REQUIRE_THAT(message_of<input_error>([&] { reader.read(v, in.request, out.data()); }),
               Contains("host: view.streams[0].entries = 1"));
  for (float x : out) CHECK(x == 42.0f);
  for (float x : lse) CHECK(x == 42.0f);
  for (std::int32_t j : logical) CHECK(j == 42);

  // A layer shape a reader cannot be built on is a config_error naming the field.
  layer_shape shape = world.shape();
  shape.streams[1].channels = 0;
  REQUIRE_THAT(message_of<config_error>([&] { sparse_reader(shape, rc); }), Contains("shape.streams[1].channels = 0"));
  shape = world.shape();
  shape.streams.clear();  // window-only: a reader that names streams does not fit it
  REQUIRE_THAT(message_of<config_error>([&] { sparse_reader(shape, rc); }), Contains("key_stream = 0: must be no_stream"));
  shape.streams.resize(sequence_view::max_streams + 1, world.shape().streams[0]);
  REQUIRE_THAT(message_of<config_error>([&] { sparse_reader(shape, rc); }), Contains("shape.streams.size() = 9"));
  shape = world.shape();
  shape.streams[0].applies_rope = false;
  shape.streams[0].role = stream_role::key_value;
  reader_config tied = rc;
  tied.value_stream = 0;
  tied.derotate_output = true;
  shape.window.value_channels = 0;
  REQUIRE_THAT(message_of<config_error>([&] { sparse_reader(shape, tied); }), Contains("rotates nothing"));
}

TEST_CASE("views: the CSR export is the batch of the sequences' stream views", "[read][views][cache]") {
  std::mt19937 rng(1206);
  world_spec s = random_spec(rng);
  s.tied = false;
  s.page_size = 3;
  untied_cache cache = make_untied(s);
  std::vector<sequence_id> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(cache.create());
    append_tokens(cache, ids.back(), pick(rng, 0, 40), rng);
  }
  for (std::size_t k = 0; k < untied_cache::stream_count; ++k) {
    const paged_view csr = cache.view(ids, k);
    REQUIRE(csr.rows.size() == ids.size());
    for (std::size_t b = 0; b < ids.size(); ++b) {
      const stream_view& row = csr.rows[b];
      const stream_view single = cache.view_of(ids[b]).streams[k];
      CHECK(row.base == single.base);
      CHECK(row.base == csr.base);
      CHECK(row.pages.data() == single.pages.data());
      CHECK(row.pages.size() == single.pages.size());
      CHECK(row.entries == csr.entries[b]);
      CHECK(row.capacity == cache.pool(k).capacity());
      CHECK(std::equal(row.pages.begin(), row.pages.end(), csr.indices.begin() + csr.indptr[b]));
    }
  }
  const layer_shape shape = cache.shape();
  REQUIRE(shape.streams.size() == 3);
  CHECK(shape.streams[2].name == "indexer");
  CHECK(shape.streams[0].channels == s.key_channels);
  CHECK(shape.streams[1].storage == s.storage);
  CHECK_FALSE(shape.streams[0].applies_rope);
  CHECK(shape.window.tokens == s.window_tokens);
}

TEST_CASE("views: batched reads of different sequences while another thread appends to a third",
          "[read][views][threads]") {
  std::mt19937 rng(1207);
  world_spec s;
  s.stride = 2;
  s.window = 4;
  s.kv_heads = 2;
  s.group = 3;
  s.key_channels = 9;
  s.value_channels = 5;
  s.indexer_channels = 6;
  s.indexer_heads = 2;
  s.page_size = 4;
  s.window_tokens = 5;
  s.top_k = 7;
  s.sink = true;
  untied_cache cache = make_untied(s);
  const reader_config rc = reader_for(s, "threads");
  const sequence_id prefix = cache.create();
  append_tokens(cache, prefix, 301, rng);
  std::vector<sequence_id> readers_seqs;
  for (int i = 0; i < 4; ++i) {
    readers_seqs.push_back(cache.fork(prefix));
    append_tokens(cache, readers_seqs.back(), 10 + i, rng);
  }
  const sequence_id writer_seq = cache.fork(prefix);  // shares the prefix's pages with the readers' sequences
  std::vector<request_inputs> inputs;
  for (sequence_id seq : readers_seqs) inputs.push_back(random_request(s, rng, cache.tokens(seq) - 1, -1));
  for (auto& in : inputs) in.point();

  // Expected outputs, read before anything runs concurrently.
  const i64 out_floats = s.query_heads() * s.value_channels;
  std::vector<std::vector<float>> expected;
  {
    sparse_reader reader(cache, rc);
    for (std::size_t i = 0; i < readers_seqs.size(); ++i) {
      expected.emplace_back(sz(out_floats));
      reader.read(cache, readers_seqs[i], inputs[i].request, expected.back().data());
    }
  }
  std::atomic<bool> mismatch_seen{false};
  std::thread writer([&] {
    std::mt19937 wrng(9);
    for (int step = 0; step < 60; ++step) append_tokens(cache, writer_seq, 1 + step % 5, wrng);
  });
  auto read_pairs = [&](std::size_t first) {
    sparse_reader reader(cache.shape(), rc);
    thread_executor pool(2, true);
    reader.set_executor(pool);
    std::vector<float> out(sz(2 * out_floats)), lse(sz(2 * s.query_heads()));
    for (int round = 0; round < 15; ++round) {
      const sequence_view views[2] = {cache.view_of(readers_seqs[first]), cache.view_of(readers_seqs[first + 1])};
      read_item items[2];
      for (int b = 0; b < 2; ++b) {
        items[b].view = &views[b];
        items[b].request = inputs[first + sz(b)].request;
        items[b].out = out.data() + b * out_floats;
        items[b].lse = lse.data() + b * s.query_heads();
      }
      reader.read_batch(span<const read_item>(items, 2));
      for (int b = 0; b < 2; ++b)
        if (!bit_equal(out.data() + b * out_floats, expected[first + sz(b)].data(), out_floats)) mismatch_seen = true;
    }
  };
  std::thread r0(read_pairs, 0), r1(read_pairs, 2);
  r0.join();
  r1.join();
  writer.join();
  CHECK_FALSE(mismatch_seen);
  CHECK(cache.tokens(writer_seq) > 301);
}

}  // namespace test_read_views
