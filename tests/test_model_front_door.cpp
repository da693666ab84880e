// The model front door (models/model_cache.hpp, models/model_snapshot.hpp) against today's per-layer path: a DeepSeek-V4-shaped
// model (window-only, CSA and HCA kinds; fp32 and V4 precision) driven through steps equals one
// paged_cache per layer (a hand-kept raw window and a window-only reader for the window-only layers)
// driven with the same chunks, byte for byte — entries, window rows, outputs, LSE and selected
// entries — under random chunkings, batches, forks, rollbacks, executors and aborted steps.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/models/model_cache.hpp"
#include "phasekv/models/model_snapshot.hpp"
#include "phasekv/read/sparse_reader.hpp"
#include "../examples/pools/max_pool.hpp"
#include "oracle/scalar_attention.hpp"
#include "support/configs.hpp"
#include "support/message_of.hpp"
#include "support/random_inputs.hpp"
#include "support/thread_executor.hpp"

namespace test_model_front_door {

namespace {

using namespace phasekv;
using phasekv_test::random_uniform;
using dsv4_stream = stream_compressor<presets::deepseek_v4_csa_policy>;
using csa_cache = paged_cache<dsv4_stream, dsv4_stream>;
using hca_cache = paged_cache<dsv4_stream>;

// A small DeepSeek-V4-shaped spec: two window-only layers, then CSA, HCA, CSA — with a 16-token
// window, 4-entry pages and a top-8 selection, so that pages fill, forks copy on write and the
// indexer drops entries within a few hundred tokens.
model_spec small_dsv4(bool precision, std::uint32_t seed) {
  model_spec spec = presets::deepseek_v4_shaped(5, precision);
  for (layer_kind& k : spec.kinds) {
    k.window.tokens = 16;
    k.page_size = 4;
    if (k.reader.top_k > 0) k.reader.top_k = 8;
  }
  std::mt19937 rng(seed);
  for (model_layer& l : spec.layers) {
    const layer_kind& k = spec.kinds[l.kind];
    for (const stream_spec& s : k.streams) {
      stream_params p;
      p.slot_bias = phasekv_test::random_bias(rng, static_cast<std::size_t>(s.config.kv_heads * k.geom.window * s.config.channels));
      p.norm_weight = phasekv_test::random_norm_weight(rng, static_cast<std::size_t>(s.config.channels));
      l.params.push_back(std::move(p));
    }
  }
  return spec;
}

// One layer of the per-layer path: its paged_cache (or, window-only, a raw window per sequence)
// and its reader.
struct reference_layer {
  std::unique_ptr<csa_cache> csa;
  std::unique_ptr<hca_cache> hca;
  std::vector<raw_window> windows;          // window-only: per reference sequence
  std::vector<std::int64_t> window_tokens;  // window-only: tokens per reference sequence
  std::unique_ptr<sparse_reader> reader;
  std::vector<sequence_id> ids;             // the cache's id of each reference sequence
};

struct reference_model {
  std::vector<reference_layer> layers;
  std::int64_t history = 0;
  raw_window_config window_only;
};

reference_model make_reference(const model_spec& spec, std::int64_t pages, std::int64_t history) {
  reference_model m;
  m.history = history;
  for (std::size_t l = 0; l < spec.layers.size(); ++l) {
    const layer_kind& k = spec.kinds[spec.layers[l].kind];
    reference_layer r;
    reader_config rc = k.reader;
    if (k.window_only()) {
      rc.key_stream = rc.value_stream = rc.indexer_stream = no_stream;
      layer_shape shape;
      shape.geom = k.geom;
      shape.window = k.window;
      shape.window_rope = k.window_rope;
      r.reader = std::make_unique<sparse_reader>(shape, rc);
      m.window_only = k.window;
      m.layers.push_back(std::move(r));
      continue;
    }
    cache_config cc;
    cc.name = "ref" + std::to_string(l);
    cc.page_size = k.page_size;
    cc.pages = pages;
    cc.history = history;
    cc.window = k.window;
    for (const stream_spec& s : k.streams) cc.stream_storage.push_back(s.storage);
    const auto stream = [&](std::size_t s) { return dsv4_stream(k.geom, k.streams[s].config, spec.layers[l].params[s]); };
    rc.key_stream = rc.value_stream = 0;
    rc.indexer_stream = k.streams.size() > 1 ? 1 : no_stream;
    if (k.streams.size() == 2) {
      r.csa = std::make_unique<csa_cache>(csa_cache::layer(stream(0), stream(1)), cc);
      r.reader = std::make_unique<sparse_reader>(*r.csa, rc);
    } else {
      r.hca = std::make_unique<hca_cache>(hca_cache::layer(stream(0)), cc);
      r.reader = std::make_unique<sparse_reader>(*r.hca, rc);
    }
    m.layers.push_back(std::move(r));
  }
  return m;
}

// The inputs of one layer's append for one row: per stream payload and logits, window rows.
struct layer_inputs {
  std::vector<std::vector<float>> payload, logits;
  std::vector<float> window;
  std::vector<token_chunk> chunks;

  void point(std::int64_t tokens) {
    chunks.clear();
    for (std::size_t s = 0; s < payload.size(); ++s) chunks.push_back({tokens, payload[s], logits[s]});
  }
  layer_append append() const { return {chunks, window, {}}; }
};

layer_inputs draw_inputs(const model_cache& model, std::size_t layer, std::int64_t tokens, std::mt19937& rng) {
  layer_inputs in;
  for (std::size_t s = 0; s < model.shape(layer).streams.size(); ++s) {
    const stream_kernel& k = model.stream(layer, s);
    in.payload.push_back(random_uniform(rng, static_cast<std::size_t>(tokens * k.payload_floats_per_token()), -1.0f, 1.0f));
    in.logits.push_back(random_uniform(rng, static_cast<std::size_t>(tokens * k.logit_floats_per_token()), -2.0f, 2.0f));
  }
  const raw_window_config& w = model.shape(layer).window;
  in.window = random_uniform(rng, static_cast<std::size_t>(tokens * w.kv_heads * w.key_channels), -1.0f, 1.0f);
  in.point(tokens);
  return in;
}

struct query {
  std::vector<float> q, iq, iw, sinks;
  read_request at(std::int64_t position) const { return {position, q, iq, iw, sinks}; }
};

query draw_query(const reader_config& rc, const layer_shape& shape, std::mt19937& rng) {
  query x;
  const std::int64_t channels = shape.streams.empty() ? shape.window.key_channels : shape.streams[0].channels;
  x.q = random_uniform(rng, static_cast<std::size_t>(rc.query_heads * channels), -1.0f, 1.0f);
  if (rc.top_k > 0 && rc.indexer_stream != no_stream) {
    x.iq = random_uniform(rng, static_cast<std::size_t>(rc.indexer_heads * shape.streams[rc.indexer_stream].channels), -1.0f, 1.0f);
    x.iw = random_uniform(rng, static_cast<std::size_t>(rc.indexer_heads), 0.0f, 1.0f);
  }
  if (rc.sink) x.sinks = random_uniform(rng, static_cast<std::size_t>(rc.query_heads), -1.0f, 1.0f);
  return x;
}

struct read_out {
  std::vector<float> out, lse;
  std::vector<std::int32_t> selected;
};

read_out sized(const reader_config& rc, std::int64_t value_channels) {
  read_out r;
  r.out.assign(static_cast<std::size_t>(rc.query_heads * value_channels), -7.0f);
  r.lse.assign(static_cast<std::size_t>(rc.query_heads), -7.0f);
  if (rc.top_k > 0) r.selected.assign(static_cast<std::size_t>(rc.top_k), -7);
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The whole scenario: a model and its reference, the same operations on both.
struct twin {
  model_spec spec;
  model_cache model;
  reference_model ref;
  std::vector<sequence_id> seqs;  // model ids; index i is reference sequence i
  std::mt19937 rng;

  // The reference keeps `reference_history` tokens of history (the model's by default).
  twin(bool precision, std::int64_t history, std::uint32_t seed, std::int64_t reference_history = -1)
      : spec(small_dsv4(precision, seed)),
        model(spec, options(history)),
        ref(make_reference(spec, 256, reference_history >= 0 ? reference_history : history)),
        rng(seed) {}

  static model_options options(std::int64_t history) {
    model_options o;
    o.pages = 256;
    o.history = history;
    return o;
  }

  std::size_t create() {
    seqs.push_back(model.create());
    for (reference_layer& r : ref.layers) {
      if (r.csa) r.ids.push_back(r.csa->create());
      else if (r.hca) r.ids.push_back(r.hca->create());
      else {
        r.windows.emplace_back(ref.window_only, ref.history);
        r.window_tokens.push_back(0);
      }
    }
    return seqs.size() - 1;
  }

  std::size_t fork(std::size_t i) {
    seqs.push_back(model.fork(seqs[i]));
    for (reference_layer& r : ref.layers) {
      if (r.csa) r.ids.push_back(r.csa->fork(r.ids[i]));
      else if (r.hca) r.ids.push_back(r.hca->fork(r.ids[i]));
      else {
        r.windows.push_back(r.windows[i]);
        r.window_tokens.push_back(r.window_tokens[i]);
      }
    }
    return seqs.size() - 1;
  }

  void remove_suffix(std::size_t i, std::int64_t p0) {
    model.remove_suffix(seqs[i], p0);
    for (reference_layer& r : ref.layers) {
      if (r.csa) r.csa->remove_suffix(r.ids[i], p0);
      else if (r.hca) r.hca->remove_suffix(r.ids[i], p0);
      else {
        r.windows[i].roll_back(p0);
        r.window_tokens[i] = p0;
      }
    }
  }

  // The reference's view of layer l, sequence i.
  sequence_view ref_view(std::size_t l, std::size_t i) const {
    const reference_layer& r = ref.layers[l];
    if (r.csa) return r.csa->view_of(r.ids[i]);
    if (r.hca) return r.hca->view_of(r.ids[i]);
    sequence_view v;
    v.tokens = r.window_tokens[i];
    v.window = r.windows[i].view(v.tokens);
    return v;
  }

  // One step over `rows` (reference indices) of `tokens` each: every layer appended, then every
  // new position of every row read through the step and through the reference; outputs compared.
  void step(const std::vector<std::size_t>& rows, std::int64_t tokens, executor& ex) {
    std::vector<sequence_id> ids;
    std::vector<std::int64_t> before;
    for (std::size_t i : rows) {
      ids.push_back(seqs[i]);
      before.push_back(model.tokens(seqs[i]));
    }
    model_step s = model.begin(span<const sequence_id>(ids.data(), ids.size()), tokens);
    for (std::size_t l = 0; l < model.layers(); ++l) {
      std::vector<layer_inputs> in;
      std::vector<layer_append> appends;
      for (std::size_t r = 0; r < rows.size(); ++r) in.push_back(draw_inputs(model, l, tokens, rng));
      for (const layer_inputs& x : in) appends.push_back(x.append());
      s.append(l, appends, ex);
      reference_layer& rl = ref.layers[l];
      for (std::size_t r = 0; r < rows.size(); ++r) {
        const std::size_t i = rows[r];
        if (rl.csa) rl.csa->append(rl.ids[i], {in[r].chunks[0], in[r].chunks[1]}, in[r].window);
        else if (rl.hca) rl.hca->append(rl.ids[i], {in[r].chunks[0]}, in[r].window);
        else {
          rl.windows[i].write(in[r].window, {}, rl.window_tokens[i], tokens);
          rl.window_tokens[i] += tokens;
        }
      }
      check_reads(s, l, rows, before, tokens, ex);
    }
    s.commit();
  }

  void check_reads(model_step& s, std::size_t l, const std::vector<std::size_t>& rows, const std::vector<std::int64_t>& before,
                   std::int64_t tokens, executor& ex) {
    const reader_config& rc = model.reader(l);
    const layer_shape& shape = model.shape(l);
    const std::int64_t value_channels = shape.streams.empty() ? shape.window.key_channels : shape.streams[0].channels;
    std::vector<query> queries;
    std::vector<read_out> got, want;
    std::vector<layer_read> reads;
    std::vector<sequence_view> views;
    for (std::size_t r = 0; r < rows.size(); ++r) views.push_back(ref_view(l, rows[r]));
    std::vector<std::int64_t> positions;
    std::vector<std::size_t> read_rows;
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (std::int64_t t = before[r]; t < before[r] + tokens; ++t) {
        queries.push_back(draw_query(rc, shape, rng));
        positions.push_back(t);
        read_rows.push_back(r);
      }
    for (std::size_t q = 0; q < queries.size(); ++q) {
      got.push_back(sized(rc, value_channels));
      want.push_back(sized(rc, value_channels));
    }
    for (std::size_t q = 0; q < queries.size(); ++q) {
      layer_read x;
      x.row = read_rows[q];
      x.request = queries[q].at(positions[q]);
      x.out = got[q].out.data();
      x.lse = got[q].lse.data();
      x.selected_logical = rc.top_k > 0 ? got[q].selected.data() : nullptr;
      reads.push_back(x);
    }
    s.read(l, reads, ex);
    sparse_reader& reader = *ref.layers[l].reader;
    for (std::size_t q = 0; q < queries.size(); ++q) {
      read_item item;
      item.view = &views[read_rows[q]];
      item.request = queries[q].at(positions[q]);
      item.out = want[q].out.data();
      item.lse = want[q].lse.data();
      item.selected_logical = rc.top_k > 0 ? want[q].selected.data() : nullptr;
      reader.read_batch(span<const read_item>(&item, 1));
      INFO("layer " << l << " row " << read_rows[q] << " position " << positions[q]);
      REQUIRE(same_bits(got[q].out, want[q].out));
      REQUIRE(same_bits(got[q].lse, want[q].lse));
      REQUIRE(got[q].selected == want[q].selected);
    }
  }

  // Every entry and window row of every layer of sequence i equals the reference's.
  void require_same_memory(std::size_t i) const {
    const sequence_id id = seqs[i];
    const std::int64_t tokens = model.tokens(id);
    for (std::size_t l = 0; l < model.layers(); ++l) {
      const reference_layer& r = ref.layers[l];
      const layer_shape& shape = model.shape(l);
      for (std::size_t s = 0; s < shape.streams.size(); ++s) {
        const std::int64_t entries = shape.geom.completed_entries(tokens);
        std::vector<float> a(static_cast<std::size_t>(shape.streams[s].kv_heads * shape.streams[s].channels)), b(a.size());
        for (std::int64_t j = 0; j < entries; ++j) {
          model.read_entry(l, s, id, j, span<float>(a.data(), a.size()));
          if (r.csa) r.csa->read_entry(r.ids[i], s, j, b.data());
          else r.hca->read_entry(r.ids[i], s, j, b.data());
          INFO("layer " << l << " stream " << s << " entry " << j);
          REQUIRE(same_bits(a, b));
        }
      }
      // The last window.tokens rows (the model may keep less history than the reference).
      const std::int64_t first = std::max(tokens - shape.window.tokens,
                                          r.csa ? r.csa->window_first(r.ids[i])
                                          : r.hca ? r.hca->window_first(r.ids[i])
                                                  : std::min(r.windows[i].first(), tokens));
      std::vector<float> a(static_cast<std::size_t>(shape.window.kv_heads * shape.window.key_channels)), b(a.size());
      for (std::int64_t t = first; t < tokens; ++t) {
        model.copy_window_key(l, id, t, span<float>(a.data(), a.size()));
        if (r.csa) r.csa->copy_window_key(r.ids[i], t, span<float>(b.data(), b.size()));
        else if (r.hca) r.hca->copy_window_key(r.ids[i], t, span<float>(b.data(), b.size()));
        else r.windows[i].copy_key(t % r.windows[i].rows(), b.data());
        INFO("layer " << l << " window token " << t);
        REQUIRE(same_bits(a, b));
      }
    }
  }
};

}  // namespace

TEST_CASE("model front door: a DeepSeek-V4-shaped model equals one paged_cache per layer, byte for byte",
          "[model][front_door]") {
  const bool precision = GENERATE(false, true);
  INFO("precision " << precision);
  const std::int64_t history = 12;
  twin w(precision, history, precision ? 71u : 17u);
  phasekv_test::thread_executor threads(3, true);
  executor& serial = default_executor();

  const std::size_t a = w.create(), b = w.create();
  std::uniform_int_distribution<std::int64_t> chunk(1, history + 1);
  // A prefill of both in chunks, batched (one step, two rows) and alone.
  for (int round = 0; round < 30; ++round) w.step({a, b}, chunk(w.rng), round % 2 ? threads : serial);
  for (int round = 0; round < 6; ++round) w.step({a}, chunk(w.rng), serial);
  const std::size_t c = w.fork(a);  // shares every page and state block of a
  for (int round = 0; round < 8; ++round) {
    w.step({c, b}, chunk(w.rng), threads);
    w.step({a}, 1, serial);
  }
  w.remove_suffix(c, w.model.tokens(w.seqs[c]) - 5);
  w.remove_suffix(a, w.model.tokens(w.seqs[a]) - 3);
  for (int round = 0; round < 6; ++round) w.step({a, c, b}, chunk(w.rng), round % 2 ? threads : serial);
  REQUIRE(w.model.tokens(w.seqs[a]) > 256);  // past two HCA entries
  for (std::size_t i : {a, b, c}) w.require_same_memory(i);
}

TEST_CASE("model front door: an aborted or failed step leaves every layer as it was", "[model][front_door]") {
  twin w(true, 4, 5);
  const std::size_t a = w.create(), b = w.create();
  executor& serial = default_executor();
  for (int round = 0; round < 12; ++round) w.step({a, b}, 5, serial);
  const std::size_t c = w.fork(a);
  const model_pool_usage before = w.model.pool_usage();

  // Appended halfway, then dropped: abort() (a shared page was copied on write at begin()). Nine
  // tokens overwrite ring rows of compressor inputs (W + history = 12) the next entry still pools.
  {
    model_step s = w.model.begin({w.seqs[a], w.seqs[c]}, 9);
    for (std::size_t l = 0; l < 3; ++l) {
      const layer_inputs x = draw_inputs(w.model, l, 9, w.rng), y = draw_inputs(w.model, l, 9, w.rng);
      s.append(l, {x.append(), y.append()});
    }
    REQUIRE_THROWS_WITH(s.commit(), Catch::Contains("layer = 3") && Catch::Contains("was not appended"));
    // A bad row names itself and leaves the step as it was.
    layer_inputs bad = draw_inputs(w.model, 3, 9, w.rng);
    bad.chunks[0].tokens = 2;
    const layer_inputs good = draw_inputs(w.model, 3, 9, w.rng);
    REQUIRE_THROWS_WITH(s.append(3, {good.append(), bad.append()}), Catch::Contains("rows[1].chunks[0].tokens"));
    REQUIRE_THROWS_WITH(w.model.fork(w.seqs[a]), Catch::Contains("in an open step"));
  }  // destroyed uncommitted: aborted
  const model_pool_usage after = w.model.pool_usage();
  for (std::size_t k = 0; k < before.kinds.size(); ++k) REQUIRE(after.kinds[k].pages_used == before.kinds[k].pages_used);
  // Continuing gives what the reference gives: as it is (a), and after rolling back as far as the
  // history allows (c), which reads window rows the aborted step overwrote.
  w.remove_suffix(c, w.model.tokens(w.seqs[c]) - 4);
  for (int round = 0; round < 4; ++round) w.step({a, c, b}, 4, serial);
  for (std::size_t i : {a, b, c}) w.require_same_memory(i);
}

TEST_CASE("model front door: a full kind refuses begin() and changes nothing", "[model][front_door]") {
  model_spec spec = small_dsv4(false, 3);
  model_options o;
  o.pages = 4;  // 16 CSA entries: 64 tokens
  model_cache m(spec, o);
  const sequence_id s = m.create();
  std::int64_t fits = 0;  // the most tokens whose CSA entries fill 4 pages
  while (spec.kinds[1].geom.completed_entries(fits + 1) <= 16) ++fits;
  REQUIRE_THROWS_AS(m.begin({s}, fits + 1), capacity_error);
  REQUIRE(m.pool_usage().total.pages_used == 0);
  model_step ok = m.begin({s}, fits);
  REQUIRE(m.pool_usage().kinds[1].pages_used == 4);
  ok.abort();
  REQUIRE(m.pool_usage().total.pages_used == 0);
  REQUIRE(m.tokens(s) == 0);
}

TEST_CASE("model front door: specs the cache cannot build are config_errors naming the field", "[model][front_door]") {
  model_spec spec = small_dsv4(false, 3);
  spec.kinds[1].streams[0].pooling = "nope";
  REQUIRE_THROWS_WITH(model_cache(spec), Catch::Contains("kinds[1].streams[0].pooling") && Catch::Contains("registered"));
  spec = small_dsv4(false, 3);
  spec.kinds[1].reader.key_stream = 1;  // the indexer stream holds no keys to attend to
  REQUIRE_THROWS_WITH(model_cache(spec), Catch::Contains("kinds[1].reader.key_stream = 1") && Catch::Contains("role key or key_value"));
  spec = small_dsv4(false, 3);
  spec.kinds[0].reader.top_k = 4;  // window-only: nothing to select
  REQUIRE_THROWS_AS(model_cache(spec), config_error);
  spec = small_dsv4(false, 3);
  spec.layers[2].kind = 9;
  REQUIRE_THROWS_WITH(model_cache(spec), Catch::Contains("layers[2].kind"));
}

TEST_CASE("model front door: sequence operations touch each kind once and keep their promises", "[model][front_door]") {
  twin w(false, 4, 9);
  const std::size_t a = w.create();
  for (int round = 0; round < 14; ++round) w.step({a}, 5, default_executor());
  model_cache& m = w.model;
  const sequence_id s = w.seqs[a];
  const model_pool_usage one = m.pool_usage();
  REQUIRE(one.kinds[0].pages_used == 0);  // window-only: no pages
  REQUIRE(one.kinds[1].pages_used == static_cast<std::int64_t>(m.page_table(s, 1).size()));  // both CSA layers, one table

  // A fork shares every page (no page allocated) and its tables are the parent's.
  const sequence_id f = m.fork(s);
  REQUIRE(m.pool_usage().total.pages_used == one.total.pages_used);
  for (std::size_t k = 0; k < m.kinds(); ++k) REQUIRE(m.page_table(f, k) == m.page_table(s, k));
  REQUIRE(m.memory(f).total.shared_pages == m.memory(f).total.pages);
  REQUIRE(m.memory(s).total.entry_bytes == m.memory(f).total.entry_bytes);

  // A rollback beyond the history is refused with nothing changed; within it, pages are dropped.
  const std::int64_t tokens = m.tokens(s);
  REQUIRE_FALSE(m.can_remove_suffix(s, tokens - 30));
  REQUIRE_THROWS_WITH(m.remove_suffix(s, tokens - 30), Catch::Contains("remove_suffix(p0)") && Catch::Contains("history"));
  REQUIRE(m.tokens(s) == tokens);
  REQUIRE(m.can_remove_suffix(s, tokens - 4));

  // copy makes the destination a fork of the source; keep drops every other sequence; free drops one.
  const sequence_id g = m.create();
  m.copy(s, g);
  REQUIRE(m.tokens(g) == tokens);
  REQUIRE(m.page_table(g, 1) == m.page_table(s, 1));
  REQUIRE_THROWS_WITH(m.copy(s, s), Catch::Contains("copy(destination)"));
  m.keep(g);
  REQUIRE(m.sequences() == 1);
  REQUIRE(m.pool_usage().total.pages_used == one.total.pages_used);  // g holds what s held
  REQUIRE_THROWS_WITH(m.tokens(s), Catch::Contains("tokens(sequence)") && Catch::Contains("freed"));
  m.free(g);
  REQUIRE(m.pool_usage().total.pages_used == 0);
  REQUIRE_THROWS_WITH(m.free(g), Catch::Contains("is not a live sequence of this model cache"));

  // Another model's id is unknown here, not a sequence of this model.
  model_cache other(small_dsv4(false, 9));
  const sequence_id foreign = other.create();
  REQUIRE_THROWS_WITH(m.fork(foreign), Catch::Contains("an id of another cache or model"));
}

TEST_CASE("model front door: entry_bytes and read_entry refuse a bad stream or entry, naming it", "[model][front_door]") {
  twin w(false, 4, 9);
  const std::size_t a = w.create();
  for (int round = 0; round < 6; ++round) w.step({a}, 5, default_executor());
  model_cache& m = w.model;
  const sequence_id s = w.seqs[a];
  const std::size_t csa = 2;  // layers 0 and 1 are window-only
  const std::size_t streams = m.shape(csa).streams.size();
  const std::int64_t n = m.kind_of(csa).geom.completed_entries(m.tokens(s));
  REQUIRE(n > 0);
  const page_layout& layout = m.layout(csa, 0);
  std::vector<float> before(static_cast<std::size_t>(layout.values_per_entry()));
  m.read_entry(csa, 0, s, n - 1, span<float>(before.data(), before.size()));
  const span<const std::byte> bytes = m.entry_bytes(csa, 0, s, n - 1);
  REQUIRE(bytes.size() == static_cast<std::size_t>(layout.entry_stride_bytes));
  const std::vector<std::byte> stored(bytes.begin(), bytes.end());
  const model_pool_usage usage = m.pool_usage();

  std::vector<float> out(before.size(), -1.0f);
  const span<float> row(out.data(), out.size());
  const std::string entries = "entries = " + std::to_string(n);
  for (const std::int64_t j : {n, std::int64_t{-1}}) {
    REQUIRE_THROWS_WITH(m.entry_bytes(csa, 0, s, j),
                        Catch::Contains("entry_bytes(entry) = " + std::to_string(j)) && Catch::Contains(entries));
    REQUIRE_THROWS_WITH(m.read_entry(csa, 0, s, j, row),
                        Catch::Contains("read_entry(entry) = " + std::to_string(j)) && Catch::Contains(entries));
  }
  REQUIRE_THROWS_WITH(m.entry_bytes(csa, streams, s, 0),
                      Catch::Contains("entry_bytes(stream) = " + std::to_string(streams)) && Catch::Contains("stream count"));
  REQUIRE_THROWS_WITH(m.read_entry(csa, streams, s, 0, row),
                      Catch::Contains("read_entry(stream) = " + std::to_string(streams)) && Catch::Contains("stream count"));
  REQUIRE_THROWS_AS(m.entry_bytes(0, 0, s, 0), input_error);  // a window-only layer stores no entries
  for (const float x : out) REQUIRE(x == -1.0f);              // nothing written to the caller's row

  // Nothing changed: the same bytes, the same values, the same pools.
  const span<const std::byte> again = m.entry_bytes(csa, 0, s, n - 1);
  REQUIRE(std::memcmp(again.data(), stored.data(), stored.size()) == 0);
  m.read_entry(csa, 0, s, n - 1, row);
  REQUIRE(out == before);
  REQUIRE(m.pool_usage().total.pages_used == usage.total.pages_used);
}

TEST_CASE("model front door: a prefill chunk reads every position without history", "[model][front_door][prefill]") {
  // The model keeps no history; the reference keeps enough for its ring to hold every chunk's
  // window. Chunks up to 40 tokens (the window is 16): every position of every chunk is read.
  const bool precision = GENERATE(false, true);
  twin w(precision, 0, precision ? 23u : 29u, 40);
  const std::size_t a = w.create(), b = w.create();
  std::uniform_int_distribution<std::int64_t> chunk(1, 40);
  for (int round = 0; round < 8; ++round) w.step({a, b}, chunk(w.rng), default_executor());
  w.step({a}, 40, default_executor());
  w.step({b}, 17, default_executor());
  for (std::size_t i : {a, b}) w.require_same_memory(i);
  // Without history the model rolls back nothing beyond the minimum.
  REQUIRE_FALSE(w.model.can_remove_suffix(w.seqs[a], w.model.tokens(w.seqs[a]) - 20));
}

// ---- model snapshots (models/model_snapshot.hpp) --------------------------------------------------

namespace {

// One step of `tokens` tokens on one sequence, every layer appended from `seed` and its last
// position read; the outputs and LSE of every layer, concatenated.
std::vector<float> drive(model_cache& m, sequence_id s, std::int64_t tokens, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::int64_t before = m.tokens(s);
  model_step step = m.begin({s}, tokens);
  std::vector<float> all;
  for (std::size_t l = 0; l < m.layers(); ++l) {
    const layer_inputs in = draw_inputs(m, l, tokens, rng);
    step.append(l, {in.append()});
    const reader_config& rc = m.reader(l);
    const query q = draw_query(rc, m.shape(l), rng);
    read_out out = sized(rc, m.shape(l).window.key_channels);
    layer_read r;
    r.request = q.at(before + tokens - 1);
    r.out = out.out.data();
    r.lse = out.lse.data();
    step.read(l, {&r, 1});
    all.insert(all.end(), out.out.begin(), out.out.end());
    all.insert(all.end(), out.lse.begin(), out.lse.end());
  }
  step.commit();
  return all;
}

model_cache model_of(model_spec spec, std::int64_t pages, std::int64_t history) {
  model_options o;
  o.pages = pages;
  o.history = history;
  return model_cache(std::move(spec), o);
}

}  // namespace

TEST_CASE("model snapshot: restored into another model, every later step is bit-identical", "[model][snapshot]") {
  const bool precision = GENERATE(false, true);
  model_spec spec = small_dsv4(precision, 41);
  model_cache a = model_of(spec, 200, 6);
  const sequence_id s = a.create();
  for (std::uint32_t i = 0; i < 12; ++i) drive(a, s, 1 + 5 * (i % 3), 100 + i);
  const sequence_id beam = a.fork(s);
  drive(a, beam, 3, 7);
  a.remove_suffix(beam, a.tokens(beam) - 5);  // rolled back, its states not yet (lazily)

  // Another page size, page count and history in the destination: the same spec otherwise.
  model_spec other = spec;
  for (layer_kind& k : other.kinds) k.page_size = 8;
  model_cache b = model_of(other, 64, 2);
  for (const sequence_id src : {s, beam}) {
    const std::vector<std::byte> bytes = snapshot(a, src);
    REQUIRE(bytes.size() == snapshot_size(a, src));
    const sequence_id moved = restore(b, bytes);
    REQUIRE(b.tokens(moved) == a.tokens(src));
    for (std::uint32_t i = 0; i < 4; ++i) {
      INFO("step " << i << " of " << (src == s ? "the sequence" : "the rolled-back beam"));
      REQUIRE(same_bits(drive(a, src, 1 + i, 900 + i), drive(b, moved, 1 + i, 900 + i)));
    }
  }
}

TEST_CASE("model snapshot: a wider destination storage restores the same values", "[model][snapshot]") {
  model_spec narrow = small_dsv4(true, 43);  // FP8 K/V, FP4 indexer keys
  model_cache a = model_of(narrow, 64, 0);
  const sequence_id s = a.create();
  for (std::uint32_t i = 0; i < 6; ++i) drive(a, s, 9, 200 + i);
  model_spec wide = narrow;
  for (layer_kind& k : wide.kinds)
    for (stream_spec& st : k.streams)
      if (st.storage == storage_type::fp8_e4m3_block) st.storage = storage_type::f32;  // FP4 restores only as FP4
  model_cache b = model_of(wide, 64, 0);
  const sequence_id moved = restore(b, snapshot(a, s));
  for (std::size_t l = 0; l < a.layers(); ++l)
    for (std::size_t k = 0; k < a.shape(l).streams.size(); ++k) {
      const std::int64_t n = a.shape(l).geom.completed_entries(a.tokens(s));
      std::vector<float> x(static_cast<std::size_t>(a.shape(l).streams[k].kv_heads * a.shape(l).streams[k].channels)), y(x.size());
      for (std::int64_t j = 0; j < n; ++j) {
        a.read_entry(l, k, s, j, span<float>(x.data(), x.size()));
        b.read_entry(l, k, moved, j, span<float>(y.data(), y.size()));
        REQUIRE(same_bits(x, y));
      }
    }
}

TEST_CASE("model snapshot: bytes the destination cannot take change nothing", "[model][snapshot][errors]") {
  model_spec spec = small_dsv4(false, 47);
  model_cache a = model_of(spec, 64, 0);
  const sequence_id s = a.create();
  for (std::uint32_t i = 0; i < 6; ++i) drive(a, s, 8, 300 + i);
  const std::vector<std::byte> bytes = snapshot(a, s);

  model_cache b = model_of(spec, 64, 0);
  const sequence_id other = b.create();
  drive(b, other, 5, 1);
  const auto unchanged = [&] {
    REQUIRE(b.sequences() == 1);
    REQUIRE(b.pool_usage().total.pages_used == static_cast<std::int64_t>(b.page_table(other, 1).size() + b.page_table(other, 2).size()));
  };
  // Every single-bit error, in a sample of positions across header and sections.
  for (std::size_t at = 0; at < bytes.size(); at += 1 + bytes.size() / 97) {
    std::vector<std::byte> bad = bytes;
    bad[at] ^= std::byte{0x10};
    REQUIRE_THROWS_AS(restore(b, bad), input_error);
    unchanged();
  }
  // Truncated, and a layer snapshot given as a model's.
  REQUIRE_THROWS_WITH(restore(b, span<const std::byte>(bytes.data(), bytes.size() - 1)), Catch::Contains("truncated"));
  csa_cache::layer layer(dsv4_stream(spec.kinds[1].geom, spec.kinds[1].streams[0].config, spec.layers[2].params[0]),
                         dsv4_stream(spec.kinds[1].geom, spec.kinds[1].streams[1].config, spec.layers[2].params[1]));
  cache_config cc;
  cc.window = spec.kinds[1].window;
  csa_cache single(layer, cc);
  const sequence_id one = single.create();
  REQUIRE_THROWS_WITH(restore(b, snapshot(single, one)), Catch::Contains("a layer's snapshot"));
  unchanged();

  // Another spec: a CSA layer's learned gate bias differs.
  model_spec changed = spec;
  changed.layers[4].params[0].slot_bias[3] += 1.0f;
  model_cache c = model_of(changed, 64, 0);
  REQUIRE_THROWS_WITH(restore(c, bytes), Catch::Contains("layer 4") && Catch::Contains("slot_bias"));
  REQUIRE(c.sequences() == 0);
  // Another layer count.
  model_spec shorter = spec;
  shorter.layers.pop_back();
  model_cache d = model_of(shorter, 64, 0);
  REQUIRE_THROWS_WITH(restore(d, bytes), Catch::Contains("layer count"));
  // A kind without the pages: capacity_error, nothing held.
  model_cache e = model_of(spec, 2, 0);
  REQUIRE_THROWS_AS(restore(e, bytes), capacity_error);
  REQUIRE(e.pool_usage().total.pages_used == 0);
  REQUIRE(e.sequences() == 0);
}

TEST_CASE("window-only layer: the reader attends to the raw window alone, as dense attention over it",
          "[read][window_only]") {
  // Window of 16 tokens, 2 KV heads of 8 channels, 4 query heads (GQA), a sink; positions below 16
  // see every token so far: the dense causal attention of the scalar oracle.
  raw_window_config wc{16, 2, 8, 0};
  layer_shape shape;
  shape.window = wc;
  reader_config rc = reader_config{};
  rc.key_stream = rc.value_stream = rc.indexer_stream = no_stream;
  rc.query_heads = 4;
  rc.sink = true;
  sparse_reader reader(shape, rc);
  REQUIRE(reader.window_only());
  std::mt19937 rng(3);
  raw_window ring(wc, 0);
  const std::vector<float> keys = random_uniform(rng, 12 * 16, -1.0f, 1.0f);
  ring.write(keys, {}, 0, 12);
  for (std::int64_t t = 0; t < 12; ++t) {
    sequence_view v;
    v.tokens = 12;
    v.window = ring.view(12);
    const std::vector<float> q = random_uniform(rng, 4 * 8, -1.0f, 1.0f), sinks = random_uniform(rng, 4, -1.0f, 1.0f);
    std::vector<float> out(4 * 8);
    reader.read(v, read_request{t, q, {}, {}, sinks}, out.data());
    const phasekv_test::attention_shape as{4, 2, 8, 8};
    const std::vector<double> want = phasekv_test::causal_attention(as, q.data(), keys, keys, t, 1.0 / std::sqrt(8.0), sinks.data());
    for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == Approx(want[i]).margin(1e-6).epsilon(1e-5));
  }
  // Nothing to select and no stream to name.
  reader_config selecting = rc;
  selecting.top_k = 4;
  REQUIRE_THROWS_WITH(sparse_reader(shape, selecting), Catch::Contains("top_k = 4") && Catch::Contains("window-only"));
}

TEST_CASE("model front door: a kind no layer uses holds nothing and costs nothing", "[model][front_door]") {
  model_spec spec = small_dsv4(false, 5);
  spec.kinds.push_back(spec.kinds[1]);  // a second CSA kind, unused
  spec.kinds.back().name = "unused";
  model_cache m(spec);
  const sequence_id s = m.create();
  drive(m, s, 9, 1);
  REQUIRE(m.can_remove_suffix(s, 9));
  const sequence_id f = m.fork(s);
  m.remove_suffix(f, 8);
  REQUIRE(m.pool_usage().kinds[3].pages_used == 0);
  REQUIRE(restore(m, snapshot(m, s)) != s);
}

namespace {

// A tied K/V stream of 8 channels, RoPE after pooling and RMSNorm: DeepSeek-V4's form, small.
stream_build gated_kv_build() {
  stream_build b;
  b.geom = geometry{2, 4};
  b.config = phasekv_test::stream_of("kv", stream_role::key_value, 8);
  b.config.rope.channels = 4;
  b.rope = rope_placement::after_pool;
  b.norm = entry_norm::rms;
  return b;
}

}  // namespace

TEST_CASE("pooling registry: built-ins, a host's pooling by name, and what it refuses", "[model][registry]") {
  pooling_registry r = pooling_registry::builtins();
  REQUIRE(r.ids() == std::vector<std::string>{"fixed_weights", "mean", "scalar_gates", "vector_gates"});
  stream_build b = gated_kv_build();
  const std::unique_ptr<stream_kernel> gated = r.make("vector_gates", b, "spec.pooling");
  REQUIRE(std::string(gated->pooling_name()) == "vector_gates");
  REQUIRE(gated->rope() == rope_placement::after_pool);
  REQUIRE(gated->norm() == entry_norm::rms);
  REQUIRE(gated->gate_channels() == 8);
  REQUIRE(gated->pooling_identity() == 2);  // the snapshot code of vector gates
  REQUIRE_THROWS_WITH(r.make("max", b, "spec.pooling"), Catch::Contains("spec.pooling = 'max'") && Catch::Contains("mean"));

  // A host's pooling: its instance per layer from the factory, its identity its name, version and weights.
  r.add<phasekv_examples::max_pool>("max", [](std::size_t) { return phasekv_examples::max_pool{}; });
  b.norm = entry_norm::none;
  b.layer = 3;
  const std::unique_ptr<stream_kernel> host = r.make("max", b, "spec.pooling");
  REQUIRE(std::string(host->pooling_name()) == "max");
  REQUIRE((host->pooling_identity() & 0x80000000u) != 0);
  REQUIRE_THROWS_WITH(r.add<phasekv_examples::max_pool>("max"), Catch::Contains("'max'") && Catch::Contains("already registered"));
  b.rope = rope_placement::before_pool;  // the built-ins' only
  REQUIRE_THROWS_WITH(r.make("max", b, "spec.pooling"), Catch::Contains("kv.rope = before_pool"));
  // The erased stream pools as the typed compressor does, bit for bit.
  b.rope = rope_placement::none;
  const std::unique_ptr<stream_kernel> mean = r.make("mean", b, "spec.pooling");
  stream_compressor<compressor_policy<mean_pool>> typed(b.geom, b.config);
  std::mt19937 rng(2);
  const std::vector<float> x = random_uniform(rng, static_cast<std::size_t>(9 * typed.payload_floats_per_token()), -1.0f, 1.0f);
  stream_state s1 = mean->make_state(0), s2 = typed.make_state(0);
  std::vector<float> e1, e2;
  auto into1 = [&](const entry_view& e) { e1.insert(e1.end(), e.values, e.values + e.kv_heads * e.channels); };
  mean->check(s1, token_chunk{9, x, {}}, {});
  mean->emit(s1, token_chunk{9, x, {}}, {}, entry_sink::of(into1));
  mean->commit(s1, token_chunk{9, x, {}});
  typed.append(s2, token_chunk{9, x, {}}, [&](const entry_view& e) { e2.insert(e2.end(), e.values, e.values + e.kv_heads * e.channels); });
  REQUIRE(!e1.empty());
  REQUIRE(same_bits(e1, e2));
  REQUIRE(s1 == s2);
}

TEST_CASE("pooling registry: one compiled policy under an id takes only its own placement and norm", "[model][registry]") {
  pooling_registry r;
  r.add_compiled<compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>>("v4");
  stream_build b = gated_kv_build();
  const std::unique_ptr<stream_kernel> v4 = r.make("v4", b, "spec.pooling");
  REQUIRE(std::string(v4->pooling_name()) == "vector_gates");
  REQUIRE(v4->pooling_identity() == pooling_registry::builtins().make("vector_gates", b, "spec.pooling")->pooling_identity());
  b.norm = entry_norm::none;
  REQUIRE_THROWS_WITH(r.make("v4", b, "spec.pooling"), Catch::Contains("kv.norm = none") && Catch::Contains("'v4'"));
  b.norm = entry_norm::rms;
  b.rope = rope_placement::none;
  REQUIRE_THROWS_WITH(r.make("v4", b, "spec.pooling"), Catch::Contains("kv.rope = none") && Catch::Contains("after_pool"));
  REQUIRE_THROWS_WITH(r.add_compiled<compressor_policy<mean_pool>>("v4"), Catch::Contains("already registered"));
}

namespace {
// Max pooling that does not state its arithmetic.
struct unstated_max_pool : phasekv_examples::max_pool {
  static constexpr const char* name = "unstated_max";
  double flops_per_entry(std::int64_t, std::int64_t, int = 0) const = delete;
};
}  // namespace

TEST_CASE("pooling registry: a host's pooling made per stream, and the arithmetic each states", "[model][registry]") {
  pooling_registry r = pooling_registry::builtins();
  std::vector<std::string> seen;
  r.add<phasekv_examples::max_pool>("max", [&](const stream_build& b) {
    seen.push_back(b.config.name + "/" + std::to_string(b.config.channels) + "/" + std::to_string(b.layer));
    return phasekv_examples::max_pool{};
  });
  r.add<unstated_max_pool>("unstated");
  stream_build b = gated_kv_build();  // S = 2, W = 4, 8 channels
  b.rope = rope_placement::none;
  b.norm = entry_norm::none;
  b.layer = 5;
  const std::unique_ptr<stream_kernel> kv = r.make("max", b, "spec.pooling");
  b.config = phasekv_test::stream_of("ix", stream_role::indexer, 4);
  const std::unique_ptr<stream_kernel> ix = r.make("max", b, "spec.pooling");
  REQUIRE(seen == std::vector<std::string>{"kv/8/5", "ix/4/5"});
  // max_pool states one comparison per slot and channel; a built-in is priced by its bytes (0); a
  // host's pooling that states nothing has no known arithmetic (NaN).
  CHECK(kv->pooling_flops_per_entry() == 4.0 * 8);
  CHECK(ix->pooling_flops_per_entry() == 4.0 * 4);
  CHECK(r.make("mean", b, "spec.pooling")->pooling_flops_per_entry() == 0.0);
  CHECK(std::isnan(r.make("unstated", b, "spec.pooling")->pooling_flops_per_entry()));
}

}  // namespace test_model_front_door
