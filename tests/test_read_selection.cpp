// The read in stages (read/selection.hpp, read/detail/read_checks.hpp) and what hosts bring to it:
//
//   - entry_selector on its own: every candidate's score and the top k (logical and physical ids)
//     against the oracle's indexer and sort (exact inputs), and equal to the reader's own
//     selection — in fp32 over fp32/bf16/f16 pages, bf16 and DeepSeek-V4's FP4 precision;
//   - host indices (read_request::indices): the reader's own selection handed back gives the same
//     bits (output and lse), on a batch and an executor too, also through a reader without an
//     indexer stream; any subset in any order, −1 padded, cut by request.top_k, reads exactly
//     those entries (the oracle's joint softmax over them and the window);
//   - FlashMLA's LSE convention: keys only, natural log, +inf for a query that sees nothing; two
//     branches merged in it equal the oracle over the union, the sink counted once;
//   - bad indices and bad selection calls: input_error naming the field, outputs unchanged.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/prelude.hpp"
#include "support/deepseek_layer.hpp"
#include "support/message_of.hpp"
#include "oracle/scalar_attention.hpp"
#include "support/thread_executor.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/read/selection.hpp"
#include "phasekv/read/sparse_reader.hpp"
#include "support/read_world.hpp"

namespace test_read_selection {

namespace {

using namespace phasekv_test::prelude;
using namespace phasekv_test::read_support;
using W = selection_world;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Queries, and exact indexer inputs (small dyadic rationals: fp32 scores equal the double ones).
using query_inputs = phasekv_test::request_inputs;

query_inputs random_query(std::mt19937& rng, bool sink) {
  query_inputs in;
  in.queries = uniform(rng, sz(W::query_heads * W::key_channels), -2.0f, 2.0f);
  in.indexer_queries = multiples(rng, sz(W::indexer_heads * W::indexer_channels), 0.5, -4, 4);
  in.indexer_weights = multiples(rng, sz(W::indexer_heads), 0.25, -2, 8);
  if (sink) in.sinks = uniform(rng, sz(W::query_heads), -1.0f, 2.0f);
  return in;
}

// The physical id of entry j in a stream: page · page_size + slot.
template <class Cache>
std::int32_t physical_of(const Cache& cache, sequence_id seq, std::size_t stream, i64 j) {
  const i64 page_size = cache.pool(stream).layout().page_size;
  return static_cast<std::int32_t>(cache.page_table(seq, stream)[sz(j / page_size)] * page_size + j % page_size);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("entry_selector: scores and top k equal the oracle's and the reader's selection", "[read][selection][oracle]") {
  const W world;
  struct variant {
    storage_type indexer_storage;
    indexer_precision precision;
    int palette;
  };
  const variant variants[] = {{storage_type::f32, indexer_precision::f32, 3},
                              {storage_type::f32, indexer_precision::f32, 1},  // every score ties
                              {storage_type::bf16, indexer_precision::f32, 2},
                              {storage_type::f16, indexer_precision::f32, 2},
                              {storage_type::bf16, indexer_precision::bf16, 2}};
  std::uint32_t seed = 71;
  for (const variant& v : variants) {
    INFO("indexer storage " << v.indexer_storage << ", precision " << static_cast<int>(v.precision) << ", palette "
                            << v.palette);
    std::mt19937 rng(seed++);
    selection_cache cache =
        world.make(storage_type::f32, seed, 0, 128, {storage_type::f32, storage_type::f32, v.indexer_storage});
    const sequence_id seq = cache.create();
    const i64 T = 37, top_k = 5;
    const auto in = world.make_inputs(rng, T, v.palette);
    reader_config rc = W::reader("csa", top_k, true);
    rc.precision = v.precision;
    sparse_reader reader(cache, rc);
    entry_selector selector(cache, selection_of(rc));
    CHECK(selector.config().physical_stream == 0);
    std::vector<float> out(sz(reader.output_floats()));
    i64 selecting = 0;
    for (i64 t = 0; t < T; ++t) {
      world.append(cache, seq, in, t, 1);
      INFO("position " << t);
      const query_inputs qi = random_query(rng, true);
      const i64 n = selector.candidates(t);
      REQUIRE(n == (t + 1) / 2);
      // Scores of every candidate: exact, so equal to the oracle's double scores.
      std::vector<float> scores(sz(n) + 3, -7.0f);
      CHECK(selector.score(cache, seq, qi.selection(t), scores) == n);
      std::vector<std::vector<float>> keys;
      for (i64 j = 0; j < n; ++j) keys.push_back(entry_of(cache, seq, 2, j, W::indexer_channels));
      const std::vector<double> want =
          phasekv_test::indexer_scores(qi.indexer_queries, qi.indexer_weights, keys, W::indexer_channels);
      for (i64 j = 0; j < n; ++j) CHECK(static_cast<double>(scores[sz(j)]) == want[sz(j)]);
      CHECK(scores[sz(n)] == -7.0f);  // past the candidates: untouched
      // The top k: the oracle's sort, physical ids of the key stream, −1 / NaN padded.
      std::vector<std::int32_t> logical(sz(top_k)), physical(sz(top_k));
      std::vector<float> top_scores(sz(top_k));
      const i64 got = selector.select(cache, seq, qi.selection(t), logical, physical, top_scores);
      const std::vector<i64> order = phasekv_test::top_k_by_sort(want, top_k);
      REQUIRE(got == static_cast<i64>(order.size()));
      for (i64 r = 0; r < top_k; ++r) {
        if (r < got) {
          CHECK(logical[sz(r)] == order[sz(r)]);
          CHECK(physical[sz(r)] == physical_of(cache, seq, 0, order[sz(r)]));
          CHECK(static_cast<double>(top_scores[sz(r)]) == want[sz(order[sz(r)])]);
        } else {
          CHECK(logical[sz(r)] == -1);
          CHECK(physical[sz(r)] == -1);
          CHECK(std::isnan(top_scores[sz(r)]));
        }
      }
      // The reader runs the same stages: the same entries, scores and physical ids.
      std::vector<std::int32_t> read_logical(sz(top_k)), read_physical(sz(top_k));
      read_trace trace;
      read_item item;
      const sequence_view view = cache.view_of(seq);
      item.view = &view;
      item.request = qi.at(t);
      item.out = out.data();
      item.selected_logical = read_logical.data();
      item.selected_physical = read_physical.data();
      item.trace = &trace;
      reader.read_batch(span<const read_item>(&item, 1));
      CHECK(read_logical == logical);
      CHECK(read_physical == physical);
      REQUIRE(trace.scores.size() == sz(got));
      for (i64 r = 0; r < got; ++r) CHECK(trace.scores[sz(r)] == top_scores[sz(r)]);
      // A smaller request.top_k: the prefix of the ranking.
      std::vector<std::int32_t> two(2);
      CHECK(selector.select(view, qi.selection(t, 2), two) == std::min<i64>(2, n));
      for (i64 r = 0; r < 2; ++r) CHECK(two[sz(r)] == logical[sz(r)]);
      selecting += n > top_k;
    }
    CHECK(selecting > 10);
  }
}

TEST_CASE("entry_selector: DeepSeek-V4's FP4 indexer selects what the precision reader selects", "[read][selection][fp4]") {
  using phasekv_test::csa_cache;
  const csa_cache::layer layer = phasekv_test::make_csa_layer();
  csa_cache cache(layer, presets::deepseek_cache(presets::deepseek_v4_csa_layer, 64, 0, true));
  const sequence_id seq = cache.create();
  std::mt19937 rng(404);
  {
    csa_cache twin(layer, presets::deepseek_cache(presets::deepseek_v4_csa_layer, 64, 0, true));
    const sequence_id other = twin.create();
    phasekv_test::append_random(cache, twin, seq, other, 1001, rng);
  }
  reader_config rc = presets::deepseek_reader(presets::deepseek_v4_csa_layer, true);
  rc.top_k = 64;
  sparse_reader reader(cache, rc);
  entry_selector selector(cache, selection_of(rc));
  const i64 t = cache.tokens(seq) - 1;
  for (int trial = 0; trial < 3; ++trial) {
    const phasekv_test::request_inputs in = phasekv_test::random_csa_query(rng, t, 0.1f);
    const read_request& r = in.request;
    std::vector<float> out(sz(reader.output_floats())), lse(64), host_out(out.size()), host_lse(64);
    std::vector<std::int32_t> read_logical(64), read_physical(64), logical(64), physical(64);
    std::vector<float> scores(64);
    const sequence_view view = cache.view_of(seq);
    read_item item{&view, r, out.data(), lse.data(), read_logical.data(), read_physical.data(), nullptr};
    reader.read_batch(span<const read_item>(&item, 1));
    CHECK(selector.select(view, in.selection(t), logical, physical, scores) == 64);
    CHECK(logical == read_logical);
    CHECK(physical == read_physical);
    // Every candidate's score, and the top k's scores among them.
    std::vector<float> all(sz(selector.candidates(t)));
    selector.score(view, in.selection(t), all);
    for (i64 k = 0; k < 64; ++k) CHECK(std::memcmp(&all[sz(logical[sz(k)])], &scores[sz(k)], sizeof(float)) == 0);
    // The FP8 read with the indices handed back: the same bits.
    read_request back = r;
    back.indexer_queries = {};
    back.indexer_weights = {};
    back.indices = logical;
    read_item again{&view, back, host_out.data(), host_lse.data(), nullptr, nullptr, nullptr};
    reader.read_batch(span<const read_item>(&again, 1));
    CHECK(same_bits(out, host_out));
    CHECK(same_bits(lse, host_lse));
  }
}

// One read's output and lse per convention, with the selected ids.
struct read_result {
  std::vector<float> out, lse;
  std::vector<std::int32_t> logical, physical;
};

read_result read_one(sparse_reader& reader, const sequence_view& view, const read_request& r) {
  read_result res;
  res.out.assign(sz(reader.output_floats()), 0.0f);
  res.lse.assign(sz(reader.config().query_heads), 0.0f);
  const i64 k = std::max<i64>(reader.config().top_k, 1);
  res.logical.assign(sz(k), 0);
  res.physical.assign(sz(k), 0);
  read_item item{&view, r, res.out.data(), res.lse.data(), reader.config().top_k > 0 ? res.logical.data() : nullptr,
                 reader.config().top_k > 0 ? res.physical.data() : nullptr, nullptr};
  reader.read_batch(span<const read_item>(&item, 1));
  return res;
}

TEST_CASE("sparse_reader: host indices equal to its own selection read the same bits", "[read][selection][host]") {
  const W world;
  std::mt19937 rng(5150);
  selection_cache cache = world.make(storage_type::f32, 5151);
  const sequence_id seq = cache.create();
  const i64 T = 45, top_k = 6;
  const auto in = world.make_inputs(rng, T, 3);
  const reader_config rc = W::reader("csa", top_k, true);
  sparse_reader reader(cache, rc);
  reader_config host_rc = rc;  // a reader without an indexer: every selection is the host's
  host_rc.name = "host";
  host_rc.indexer_stream = no_stream;
  host_rc.indexer_heads = 0;
  sparse_reader host_reader(cache, host_rc);
  for (i64 t = 0; t < T; ++t) {
    INFO("position " << t);
    world.append(cache, seq, in, t, 1);  // decode: the query's token, then its read
    const sequence_view view = cache.view_of(seq);
    const query_inputs qi = random_query(rng, true);
    const read_result own = read_one(reader, view, qi.at(t));
    read_request back = qi.at(t);
    back.indexer_queries = {};
    back.indexer_weights = {};
    back.indices = own.logical;  // −1 padded where fewer than top_k are visible
    for (sparse_reader* r : {&reader, &host_reader}) {
      const read_result got = read_one(*r, view, back);
      CHECK(same_bits(got.out, own.out));
      CHECK(same_bits(got.lse, own.lse));
      CHECK(got.logical == own.logical);
      CHECK(got.physical == own.physical);
    }
  }
  // A batch at the last position on a threaded executor, every other item with host indices:
  // each equals its single read.
  const sequence_view view = cache.view_of(seq);
  const i64 t = T - 1, B = 9;
  std::vector<query_inputs> queries;
  std::vector<read_result> own;
  std::vector<read_request> requests;
  for (i64 i = 0; i < B; ++i) {
    queries.push_back(random_query(rng, true));
    own.push_back(read_one(reader, view, queries.back().at(t)));
  }
  for (i64 i = 0; i < B; ++i) {
    requests.push_back(queries[sz(i)].at(t));
    if (i % 2) {
      requests.back().indexer_queries = {};
      requests.back().indexer_weights = {};
      requests.back().indices = own[sz(i)].logical;
    }
  }
  phasekv_test::thread_executor threads(3);
  reader.set_executor(threads);
  std::vector<read_item> items(sz(B));
  std::vector<std::vector<float>> outs(sz(B), std::vector<float>(sz(reader.output_floats())));
  for (i64 i = 0; i < B; ++i)
    items[sz(i)] = read_item{&view, requests[sz(i)], outs[sz(i)].data(), nullptr, nullptr, nullptr, nullptr};
  reader.read_batch(items);
  for (i64 i = 0; i < B; ++i) CHECK(same_bits(outs[sz(i)], own[sz(i)].out));
}

TEST_CASE("sparse_reader: physical host indices (selected_physical fed back) read what their logical ids read",
          "[read][selection][host]") {
  const W world;
  std::mt19937 rng(5160);
  selection_cache cache = world.make(storage_type::f32, 5161);
  // Two sequences appended in turn, so each one's pages interleave with the other's: its page
  // table is not the identity, and physical ids differ from logical ones.
  const sequence_id other = cache.create(), seq = cache.create();
  const i64 T = 45, top_k = 6;
  const auto in = world.make_inputs(rng, T, 3), in_other = world.make_inputs(rng, T, 3);
  for (i64 t = 0; t < T; ++t) {
    world.append(cache, other, in_other, t, 1);
    world.append(cache, seq, in, t, 1);
  }
  sparse_reader reader(cache, W::reader("csa", top_k, true));
  const sequence_view view = cache.view_of(seq);
  const i64 t = T - 1;
  const query_inputs qi = random_query(rng, true);
  const read_result own = read_one(reader, view, qi.at(t));
  REQUIRE(own.physical != own.logical);
  read_request back = qi.at(t);
  back.indexer_queries = {};
  back.indexer_weights = {};
  back.indices = own.physical;
  back.indices_kind = index_kind::physical;
  const read_result got = read_one(reader, view, back);
  CHECK(same_bits(got.out, own.out));
  CHECK(same_bits(got.lse, own.lse));
  CHECK(got.logical == own.logical);
  CHECK(got.physical == own.physical);
  // The same numbers taken as logical ids name other entries (or none the query sees).
  back.indices_kind = index_kind::logical;
  bool differs = true;
  try {
    differs = !same_bits(read_one(reader, view, back).out, own.out);
  } catch (const input_error&) {
  }
  CHECK(differs);
  // A page the sequence does not hold, and an id past what the query sees, are refused by name.
  const std::int32_t stranger = static_cast<std::int32_t>(cache.page_table(other, 0)[0] * view.streams[0].layout.page_size);
  back.indices_kind = index_kind::physical;
  back.indices = span<const std::int32_t>(&stranger, 1);
  std::vector<float> out(sz(reader.output_floats()), 7.0f);
  CHECK_THAT(message_of<input_error>([&] { reader.read(view, back, out.data()); }),
             Contains("request.indices[0] = " + std::to_string(stranger) + ": is a physical id of page") &&
                 Contains("which is not in the sequence's page table"));
  const std::int32_t last_page = cache.page_table(seq, 0).back();
  const std::int32_t beyond = static_cast<std::int32_t>(last_page * view.streams[0].layout.page_size +
                                                         view.streams[0].layout.page_size - 1);
  back.indices = span<const std::int32_t>(&beyond, 1);
  if (view.streams[0].entries % view.streams[0].layout.page_size != 0)
    CHECK_THAT(message_of<input_error>([&] { reader.read(view, back, out.data()); }), Contains("which a query at request.position cannot see"));
  back.indices_kind = static_cast<index_kind>(7);
  CHECK_THAT(message_of<input_error>([&] { reader.read(view, back, out.data()); }),
             Contains("request.indices_kind = 7: is not an index_kind"));
  for (float x : out) CHECK(x == 7.0f);
}

TEST_CASE("sparse_reader: host indices in any order, padded and cut, read exactly those entries",
          "[read][selection][host][oracle]") {
  const W world;
  std::mt19937 rng(6061);
  selection_cache cache = world.make(storage_type::bf16, 6062);
  const sequence_id seq = cache.create();
  const i64 T = 41, top_k = 8;
  const auto in = world.make_inputs(rng, T, 4);
  reader_config rc = W::reader("host", top_k, true);
  rc.indexer_stream = no_stream;
  rc.indexer_heads = 0;
  sparse_reader reader(cache, rc);
  for (i64 t = 0; t < T; ++t) {
    INFO("position " << t);
    world.append(cache, seq, in, t, 1);
    const sequence_view view = cache.view_of(seq);
    const i64 n = (t + 1) / 2;
    // A random subset of the candidates, shuffled, with −1 slots among them.
    std::vector<std::int32_t> ids(sz(n));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(sz(std::min<i64>(n, std::uniform_int_distribution<i64>(0, top_k)(rng))));
    for (std::size_t pad = 0; ids.size() < sz(top_k) && pad < 3; ++pad)
      ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(rng() % (ids.size() + 1)), -1);
    const i64 length = std::uniform_int_distribution<i64>(0, static_cast<i64>(ids.size()))(rng);
    query_inputs qi = random_query(rng, true);
    read_request r = qi.at(t);
    r.indexer_queries = {};
    r.indexer_weights = {};
    r.indices = ids;
    r.top_k = length;  // the per-sequence length: slots past it are not read
    const read_result got = read_one(reader, view, r);
    std::vector<std::vector<float>> ek, ev, wk, wv;
    std::vector<std::int32_t> want_ids;
    for (i64 s = 0; s < length; ++s)
      if (ids[sz(s)] >= 0) {
        want_ids.push_back(ids[sz(s)]);
        ek.push_back(entry_of(cache, seq, 0, ids[sz(s)], W::kv_heads * W::key_channels));
        ev.push_back(entry_of(cache, seq, 1, ids[sz(s)], W::kv_heads * W::value_channels));
      }
    for (i64 s = std::max<i64>(0, t - W::window + 1); s <= t; ++s) {
      wk.push_back(row(cache.window_key(seq, s), W::kv_heads * W::key_channels));
      wv.push_back(row(cache.window_value(seq, s), W::kv_heads * W::value_channels));
    }
    const phasekv_test::attention_shape shape{W::query_heads, W::kv_heads, W::key_channels, W::value_channels};
    const auto want =
        phasekv_test::sparse_read(shape, qi.queries, 1.0 / std::sqrt(double(W::key_channels)), ek, ev, wk, wv, qi.sinks);
    CHECK(mismatch(got.out.data(), want.output, std::max(max_abs(ev), max_abs(wv))) == "");
    // The selected-entry outputs: the entries read, compacted in the host's order, −1 padded to
    // the request's top_k (read_one zero-fills past it).
    for (std::size_t r2 = 0; r2 < sz(top_k); ++r2)
      CHECK(got.logical[r2] == (r2 < want_ids.size() ? want_ids[r2] : r2 < sz(length) ? -1 : 0));
  }
}

// ln Σ exp(ℓ) over a read's keys (entries then window), per query head, in double.
std::vector<double> keys_lse(const phasekv_test::attention_shape& shape, const std::vector<float>& q, double scale,
                             const std::vector<std::vector<float>>& keys) {
  const i64 group = shape.query_heads / shape.kv_heads;
  std::vector<double> lse;
  for (i64 h = 0; h < shape.query_heads; ++h) {
    std::vector<double> logits;
    for (const auto& k : keys)
      logits.push_back(scale * phasekv_test::dot_product(q.data() + h * shape.key_channels,
                                                         k.data() + (h / group) * shape.key_channels, shape.key_channels));
    if (logits.empty()) {
      lse.push_back(-std::numeric_limits<double>::infinity());
      continue;
    }
    const double m = *std::max_element(logits.begin(), logits.end());
    double s = 0.0;
    for (double l : logits) s += std::exp(l - m);
    lse.push_back(m + std::log(s));
  }
  return lse;
}

TEST_CASE("sparse_reader: FlashMLA's LSE convention, and two branches merged in it", "[read][lse][oracle]") {
  const W world;
  std::mt19937 rng(7071);
  selection_cache cache = world.make(storage_type::f32, 7072);
  const sequence_id a = cache.create(), b = cache.create();
  const i64 T = 30, top_k = 4;
  const auto in_a = world.make_inputs(rng, T, 3), in_b = world.make_inputs(rng, T, 3);
  reader_config rc = W::reader("csa", top_k, true);
  sparse_reader with_sink(cache, rc);
  rc.lse = lse_convention::flashmla;
  sparse_reader flashmla(cache, rc);
  rc.sink = false;
  sparse_reader flashmla_no_sink(cache, rc);
  const phasekv_test::attention_shape shape{W::query_heads, W::kv_heads, W::key_channels, W::value_channels};
  const double scale = 1.0 / std::sqrt(static_cast<double>(W::key_channels));
  for (i64 t = 0; t < T; ++t) {
    INFO("position " << t);
    world.append(cache, a, in_a, t, 1);
    world.append(cache, b, in_b, t, 1);
    const sequence_view va = cache.view_of(a), vb = cache.view_of(b);
    const query_inputs qi = random_query(rng, true);
    const read_result s = read_one(with_sink, va, qi.at(t));
    const read_result f = read_one(flashmla, va, qi.at(t));
    CHECK(same_bits(s.out, f.out));  // the output does not depend on the convention
    std::vector<std::vector<float>> keys_a, values_a;
    for (std::int32_t j : f.logical)
      if (j >= 0) {
        keys_a.push_back(entry_of(cache, a, 0, j, W::kv_heads * W::key_channels));
        values_a.push_back(entry_of(cache, a, 1, j, W::kv_heads * W::value_channels));
      }
    std::vector<std::vector<float>> wk_a, wv_a;
    for (i64 u = std::max<i64>(0, t - W::window + 1); u <= t; ++u) {
      wk_a.push_back(row(cache.window_key(a, u), W::kv_heads * W::key_channels));
      wv_a.push_back(row(cache.window_value(a, u), W::kv_heads * W::value_channels));
    }
    std::vector<std::vector<float>> all_keys = keys_a;
    all_keys.insert(all_keys.end(), wk_a.begin(), wk_a.end());
    const std::vector<double> want = keys_lse(shape, qi.queries, scale, all_keys);
    for (i64 h = 0; h < W::query_heads; ++h) {
      CHECK(f.lse[sz(h)] == Approx(want[sz(h)]).epsilon(1e-5));
      // The documented conversion: with_sink = ln(exp(flashmla) + exp(sink)).
      const double converted = std::log(std::exp(double(f.lse[sz(h)])) + std::exp(double(qi.sinks[sz(h)])));
      CHECK(s.lse[sz(h)] == Approx(converted).epsilon(1e-5));
    }
    // Branch B: sequence b's selected entries and window, no sink (it belongs to branch A). The
    // host's merge in FlashMLA's convention: Z = exp(lse) (0 for +inf), the sink once:
    //   out = (out_A · (Z_A + e^s) + out_B · Z_B) / (Z_A + Z_B + e^s).
    const query_inputs qb = [&] {
      query_inputs x = random_query(rng, false);
      x.queries = qi.queries;  // the same query over both branches
      return x;
    }();
    const read_result fb = read_one(flashmla_no_sink, vb, qb.at(t));
    std::vector<std::vector<float>> keys_b, values_b;
    for (std::int32_t j : fb.logical)
      if (j >= 0) {
        keys_b.push_back(entry_of(cache, b, 0, j, W::kv_heads * W::key_channels));
        values_b.push_back(entry_of(cache, b, 1, j, W::kv_heads * W::value_channels));
      }
    for (i64 u = std::max<i64>(0, t - W::window + 1); u <= t; ++u) {
      keys_b.push_back(row(cache.window_key(b, u), W::kv_heads * W::key_channels));
      values_b.push_back(row(cache.window_value(b, u), W::kv_heads * W::value_channels));
    }
    std::vector<std::vector<float>> ek = keys_a, ev = values_a;
    ek.insert(ek.end(), keys_b.begin(), keys_b.end());
    ev.insert(ev.end(), values_b.begin(), values_b.end());
    const auto union_read = phasekv_test::sparse_read(shape, qi.queries, scale, ek, ev, wk_a, wv_a, qi.sinks);
    std::vector<float> merged(f.out.size());
    for (i64 h = 0; h < W::query_heads; ++h) {
      auto z = [](float lse) { return lse == kInf ? 0.0 : std::exp(double(lse)); };
      const double za = z(f.lse[sz(h)]), zb = z(fb.lse[sz(h)]), es = std::exp(double(qi.sinks[sz(h)]));
      for (i64 c = 0; c < W::value_channels; ++c) {
        const std::size_t i = sz(h * W::value_channels + c);
        merged[i] = static_cast<float>((f.out[i] * (za + es) + fb.out[i] * zb) / (za + zb + es));
      }
    }
    CHECK(mismatch(merged.data(), union_read.output, std::max(max_abs(ev), max_abs(wv_a)), 1e-4) == "");
  }
}

TEST_CASE("sparse_reader: a query that sees no key has FlashMLA lse +inf, phasekv's −inf", "[read][lse]") {
  using cache_t = paged_cache<mean_stream>;
  cache_config cc;
  cc.name = "hca";
  cc.page_size = 2;
  cc.pages = 8;
  cache_t cache(layer_compressor<mean_stream>(mean_stream(geometry{4, 4}, make_stream("kv", stream_role::key_value, 1, 4))), cc);
  const sequence_id seq = cache.create();
  const auto x = std::vector<float>(4 * 3, 0.5f);
  cache.append(seq, {token_chunk{3, x, {}}});  // 3 tokens: no complete entry, no window
  reader_config rc;
  rc.name = "hca.reader";
  rc.query_heads = 2;
  rc.sink = true;
  for (const lse_convention c : {lse_convention::with_sink, lse_convention::flashmla}) {
    rc.lse = c;
    sparse_reader reader(cache, rc);
    const std::vector<float> q(8, 1.0f), sinks = {0.5f, -kInf};
    read_request r{2, q, {}, {}, sinks};
    const read_result got = read_one(reader, cache.view_of(seq), r);
    for (float o : got.out) CHECK(o == 0.0f);
    if (c == lse_convention::flashmla) {
      CHECK(got.lse[0] == kInf);  // the sink does not count: no key, +inf
      CHECK(got.lse[1] == kInf);
    } else {
      CHECK(got.lse[0] == 0.5f);   // the sink alone
      CHECK(got.lse[1] == -kInf);  // nothing at all
    }
  }
}

TEST_CASE("host indices and selection calls that do not fit are input_errors changing nothing", "[read][selection][errors]") {
  const W world;
  std::mt19937 rng(8081);
  selection_cache cache = world.make(storage_type::f32, 8082);
  const sequence_id seq = cache.create();
  const i64 T = 20;
  world.append(cache, seq, world.make_inputs(rng, T, 3), 0, T);
  const reader_config rc = W::reader("csa", 4, true);
  sparse_reader reader(cache, rc);
  const sequence_view view = cache.view_of(seq);
  const i64 t = T - 1;  // 10 candidates
  const query_inputs qi = random_query(rng, true);
  std::vector<float> out(sz(reader.output_floats()), 42.0f);
  auto expect = [&](sparse_reader& r, read_request req, const std::string& message) {
    INFO(message);
    CHECK_THROWS_WITH(r.read(view, req, out.data()), Contains(message));
    for (float o : out) REQUIRE(o == 42.0f);
  };
  read_request host = qi.at(t);
  host.indexer_queries = {};
  host.indexer_weights = {};
  std::vector<std::int32_t> ids;
  auto with = [&](std::vector<std::int32_t> v) {
    ids = std::move(v);
    host.indices = ids;
    return host;
  };
  expect(reader, with({3, 10}), "csa: request.indices[1] = 10: must be −1 (padding) or an entry id in [0, 10)");
  expect(reader, with({3, -2}), "csa: request.indices[1] = -2: must be −1 (padding)");
  expect(reader, with({3, -1, 3}), "csa: request.indices = entry 3 twice: must name each entry at most once");
  expect(reader, with({0, 1, 2, 3, 4}), "csa: request.indices.size() = 5: must be at most the reader's top_k = 4");
  read_request both = with({3, 2});
  both.indexer_queries = qi.indexer_queries;
  both.indexer_weights = qi.indexer_weights;
  expect(reader, both, "csa: request.indexer_queries.size() = 24: must be 0");
  // A repeat past the request's length is not read, so not an error.
  read_request cut = with({3, 2, 3});
  cut.top_k = 2;
  CHECK_NOTHROW(reader.read(view, cut, out.data()));
  std::fill(out.begin(), out.end(), 42.0f);
  // Readers that cannot take or need them.
  reader_config no_selection = W::reader("dense", 0, true);
  sparse_reader dense(cache, no_selection);
  read_request to_dense = host;
  expect(dense, to_dense, "dense: request.indices = non-empty: needs a reader that selects (top_k > 0)");
  reader_config host_only = W::reader("host", 4, true);
  host_only.indexer_stream = no_stream;
  host_only.indexer_heads = 0;
  sparse_reader host_reader(cache, host_only);
  read_request none = host;
  none.indices = {};
  expect(host_reader, none, "host: request.indices = empty: must name the entries to read");
  none.top_k = 0;  // reading the window alone needs no indices
  CHECK_NOTHROW(host_reader.read(view, none, out.data()));
  host_only.indexer_heads = 3;
  CHECK_THROWS_WITH(sparse_reader(cache, host_only),
                    "host.indexer_heads = 3: must be 0 without an indexer stream (the host supplies the indices)");
  // The selector's own calls.
  entry_selector selector(cache, selection_of(rc));
  std::vector<float> scores(9, 5.0f);
  CHECK_THROWS_WITH(selector.score(view, qi.selection(t), scores),
                    "csa: scores.size() = 9: must be at least candidates(request.position) = 10");
  for (float s : scores) CHECK(s == 5.0f);
  std::vector<std::int32_t> logical(3, 9);
  CHECK_THROWS_WITH(selector.select(view, qi.selection(t), logical),
                    "csa: logical.size() = 3: must be empty or hold at least top_k = 4 values");
  CHECK_THROWS_WITH(selector.select(view, qi.selection(t, 5), {}), Contains("csa: request.top_k = 5: must lie in [0, top_k = 4]"));
  CHECK_THROWS_WITH(selector.select(view, qi.selection(T), {}), Contains("csa: request.position = 20: must lie in [0, tokens = 20)"));
  for (std::int32_t j : logical) CHECK(j == 9);
  selection_config no_indexer = selection_of(host_only);
  CHECK_THROWS_WITH(entry_selector(cache, no_indexer), Contains("must name the indexer's stream"));
  query_inputs bad = qi;
  bad.indexer_queries[5] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(selector.select(view, bad.selection(t), {}), Contains("csa: request.indexer_queries[5] = ") && Contains("must be finite"));
}

}  // namespace

}  // namespace test_read_selection
