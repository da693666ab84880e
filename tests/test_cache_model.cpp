// The multi-layer cache (cache/model_cache.hpp): every sequence operation acts on every layer,
// and a failure in any layer leaves every layer exactly as it was. The layers differ in
// geometry, streams, history and pool size, so one layer can refuse what another accepts.
// Allocation failures inside model operations are tested in tests/fault/.

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "oracle/cache_dump.hpp"
#include "support/configs.hpp"
#include "support/message_of.hpp"
#include "support/tokens.hpp"
#include "phasekv/cache/model_cache.hpp"
#include "phasekv/compress/stream_compressor.hpp"

namespace {

using namespace phasekv;
using Catch::Matchers::Contains;
using i64 = std::int64_t;

using gated = stream_compressor<compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>>;
using mean = stream_compressor<compressor_policy<mean_pool>>;
using first_cache = paged_cache<gated, mean>;  // S = 2, W = 4, K/V + indexer, history 6
using second_cache = paged_cache<mean>;        // S = W = 4, history 0, a small pool
using model = model_cache<first_cache, second_cache>;

stream_config config(const std::string& name, i64 channels) {
  stream_config c;
  c.name = name;
  c.channels = channels;
  c.rope.channels = 2;
  return c;
}

model make_model(i64 second_pages = 64) {
  const cache_config a = phasekv_test::cache_of("first", 2, 64, 6, raw_window_config{3, 1, 4, 0});
  const cache_config b = phasekv_test::cache_of("second", 1, second_pages);
  return model(layer_spec<first_cache>{first_cache::layer(gated(geometry{2, 4}, config("kv", 4)),
                                                          mean(geometry{2, 4}, config("ix", 2))),
                                       a},
               layer_spec<second_cache>{second_cache::layer(mean(geometry{4, 4}, config("hkv", 3))), b});
}

// One forward pass over n tokens: both layers append (values fixed by the seed).
void append(model& m, sequence_id s, i64 n, unsigned seed) {
  std::mt19937 rng(seed);
  const auto first = phasekv_test::random_tokens(m.layer<0>(), n, rng);
  const auto second = phasekv_test::random_tokens(m.layer<1>(), n, rng);
  m.append<0>(s, first.chunks(), first.window_keys);
  m.append<1>(s, second.chunks());
}

struct model_dump {
  phasekv_test::cache_dump first, second;
  std::vector<std::vector<i64>> layer_ids;
  friend bool operator==(const model_dump& a, const model_dump& b) {
    return a.first == b.first && a.second == b.second && a.layer_ids == b.layer_ids;
  }
};
model_dump dump(const model& m) {
  model_dump d{phasekv_test::dump(m.layer<0>()), phasekv_test::dump(m.layer<1>()), {}};
  for (sequence_id s : m.live_sequences()) d.layer_ids.push_back({m.layer_id(s, 0), m.layer_id(s, 1)});
  return d;
}

using phasekv_test::message_of;

TEST_CASE("model_cache: sequence operations act on every layer", "[cache][model]") {
  model m = make_model();
  const sequence_id a = m.create();
  append(m, a, 10, 1);
  REQUIRE(m.layer<0>().tokens(m.layer_id(a, 0)) == 10);
  REQUIRE(m.layer<1>().tokens(m.layer_id(a, 1)) == 10);
  REQUIRE(m.layer<0>().entries(m.layer_id(a, 0), 0) == 5);
  REQUIRE(m.layer<1>().entries(m.layer_id(a, 1), 0) == 2);

  // fork shares every page of every layer.
  const sequence_id b = m.fork(a);
  for (auto p : m.layer<0>().page_table(m.layer_id(b, 0), 0)) REQUIRE(m.layer<0>().pool(0).refcount(p) == 2);
  for (auto p : m.layer<1>().page_table(m.layer_id(b, 1), 0)) REQUIRE(m.layer<1>().pool(0).refcount(p) == 2);
  append(m, b, 3, 2);
  REQUIRE(m.layer<1>().tokens(m.layer_id(b, 1)) == 13);
  REQUIRE(m.layer<1>().tokens(m.layer_id(a, 1)) == 10);

  // remove_suffix rolls back both layers; copy makes a fork in both.
  m.remove_suffix(b, 12);
  REQUIRE(m.layer<0>().tokens(m.layer_id(b, 0)) == 12);
  REQUIRE(m.layer<1>().tokens(m.layer_id(b, 1)) == 12);
  const sequence_id c = m.create();
  append(m, c, 5, 3);
  m.copy(a, c);
  REQUIRE(m.layer<0>().tokens(m.layer_id(c, 0)) == 10);
  REQUIRE(m.layer<1>().tokens(m.layer_id(c, 1)) == 10);
  REQUIRE(m.layer<0>().page_table(m.layer_id(c, 0), 0) == m.layer<0>().page_table(m.layer_id(a, 0), 0));

  // Memory: per layer, and a total that sums them.
  const auto memory = m.memory(a);
  REQUIRE(memory.layers[0].entries == 10);  // 5 per stream
  REQUIRE(memory.layers[1].entries == 2);
  REQUIRE(memory.total.entries == 12);
  REQUIRE(memory.total.entry_bytes == memory.layers[0].entry_bytes + memory.layers[1].entry_bytes);
  const auto pools = m.pool_usage();
  REQUIRE(pools.pools.size() == 3);  // every stream its own pool
  REQUIRE(pools.total.pages_used == pools.layers[0].pages_held + pools.layers[1].pages_held);
  REQUIRE(pools.layers[1].pages_held == m.layer<1>().pool(0).used_pages());
  REQUIRE(pools.layers[0].pages_held == m.layer<0>().pool(0).used_pages() + m.layer<0>().pool(1).used_pages());

  // keep drops the others from every layer; clear drops everything.
  m.keep(b);
  REQUIRE(m.sequences() == 1);
  REQUIRE(m.layer<0>().sequences() == 1);
  REQUIRE(m.layer<1>().sequences() == 1);
  REQUIRE(m.layer<1>().tokens(m.layer_id(b, 1)) == 12);
  m.free(b);
  REQUIRE(m.layer<0>().pool(0).used_pages() == 0);
  REQUIRE(m.layer<1>().pool(0).used_pages() == 0);
  const sequence_id d = m.create();
  append(m, d, 4, 4);
  m.clear();
  REQUIRE(m.sequences() == 0);
  REQUIRE(m.layer<0>().sequences() == 0);
  REQUIRE(m.layer<1>().pool(0).used_pages() == 0);
}

TEST_CASE("model_cache: a layer that cannot follow leaves every layer unchanged", "[cache][model]") {
  model m = make_model(/*second_pages=*/4);
  const sequence_id a = m.create();
  append(m, a, 14, 1);  // the second layer (history 0) can roll back only within its last block
  const sequence_id b = m.fork(a);
  const model_dump before = dump(m);

  // The first layer could roll back to 9 (history 6); the second cannot.
  REQUIRE(m.layer<0>().can_remove_suffix(m.layer_id(a, 0), 9));
  REQUIRE_FALSE(m.layer<1>().can_remove_suffix(m.layer_id(a, 1), 9));
  REQUIRE_THAT(message_of<input_error>([&] { m.remove_suffix(a, 9); }),
               Contains("model.remove_suffix(p0) = 9") && Contains("layer 1 (second"));
  REQUIRE(dump(m) == before);

  // The second layer's pool (4 pages of one entry, 3 in use by a and b) cannot take the two
  // entries 8 more tokens complete. Appends go to one layer at a time, so only that layer's
  // append fails, and it changes nothing.
  REQUIRE_THAT(message_of<capacity_error>([&] {
                 const auto& hkv = m.layer<1>().compressors().stream<0>();
                 std::vector<float> x(static_cast<std::size_t>(8 * hkv.payload_floats_per_token()), 0.5f);
                 m.append<1>(b, {token_chunk{8, x, {}}});
               }),
               Contains("second.pool[0].capacity = 4"));
  REQUIRE(dump(m) == before);

  // Unknown ids: another model's, or a layer's own id.
  model other = make_model();
  const sequence_id foreign = other.create();
  REQUIRE_THROWS_AS(m.fork(foreign), input_error);
  REQUIRE_THAT(message_of<input_error>([&] { m.free(m.layer_id(a, 0)); }),
               Contains("is not a live sequence of this model cache"));
  REQUIRE_THROWS_AS(m.copy(a, a), input_error);
  REQUIRE(dump(m) == before);
}

// ---- many layers per kind, pools shared between layers --------------------------------------

// Three layers of the first kind and two of the second; every layer's K/V-like stream of
// 1 head × 4 channels (the first kind's stream 0, the second kind's hkv widened to 4) may draw
// from one shared pool, the first kind's indexer streams from pools of their own.
using wide_cache = paged_cache<mean>;  // S = W = 4, 4 channels: the same page layout as "kv"

struct many_layers {
  std::shared_ptr<page_pool> kv;  // null: every stream its own pool
  model_cache<first_cache, wide_cache> m;
};

// Page size 2 and 64 pages of their own, or the shared pool for the K/V stream (stream 0).
cache_config layer_config(const std::string& name, i64 history, std::size_t streams, const std::shared_ptr<page_pool>& kv) {
  cache_config c = phasekv_test::cache_of(name, 2, 64, history);
  if (kv) {
    c.shared_pools.assign(streams, nullptr);
    c.shared_pools[0] = kv;
  }
  return c;
}
cache_config first_config(const std::string& name, const std::shared_ptr<page_pool>& kv) {
  cache_config c = layer_config(name, 6, 2, kv);
  c.window.tokens = 3;
  c.window.key_channels = 4;
  return c;
}
cache_config wide_config(const std::string& name, const std::shared_ptr<page_pool>& kv) {
  return layer_config(name, 8, 1, kv);
}

std::shared_ptr<page_pool> kv_pool(i64 pages) { return std::make_shared<page_pool>(phasekv_test::pool_of("kv", 2, 1, 4, pages)); }

std::unique_ptr<many_layers> make_many(i64 shared_pages) {
  std::shared_ptr<page_pool> kv = shared_pages > 0 ? kv_pool(shared_pages) : nullptr;
  std::vector<layer_spec<first_cache>> firsts;
  for (int i = 0; i < 3; ++i)
    firsts.push_back({first_cache::layer(gated(geometry{2, 4}, config("kv", 4)), mean(geometry{2, 4}, config("ix", 2))),
                      first_config("first" + std::to_string(i), kv)});
  std::vector<layer_spec<wide_cache>> wides;
  for (int i = 0; i < 2; ++i)
    wides.push_back({wide_cache::layer(mean(geometry{4, 4}, config("hkv", 4))), wide_config("wide" + std::to_string(i), kv)});
  return std::unique_ptr<many_layers>(new many_layers{kv, model_cache<first_cache, wide_cache>(std::move(firsts), std::move(wides))});
}

// One forward pass over n tokens: every layer appends, each with its own values.
void append_all(model_cache<first_cache, wide_cache>& m, sequence_id s, i64 n, unsigned seed) {
  std::mt19937 rng(seed);
  for (std::size_t i = 0; i < m.layers_of<0>(); ++i) {
    const auto in = phasekv_test::random_tokens(m.layer<0>(i), n, rng);
    m.append<0>(s, i, in.chunks(), in.window_keys);
  }
  for (std::size_t i = 0; i < m.layers_of<1>(); ++i) m.append<1>(s, i, phasekv_test::random_tokens(m.layer<1>(i), n, rng).chunks());
}

// Every entry of every stream of every layer of every live sequence, in model order: what the
// model holds, independent of which pool or page holds it.
template <class Model>
std::vector<std::vector<float>> contents(const Model& m) {
  std::vector<std::vector<float>> out;
  const auto add = [&](const auto& cache, sequence_id id, std::size_t streams) {
    out.push_back({static_cast<float>(cache.tokens(id))});
    for (std::size_t k = 0; k < streams; ++k) {
      std::vector<float> row(static_cast<std::size_t>(cache.pool(k).layout().values_per_entry()));
      for (i64 j = 0; j < cache.entries(id, k); ++j) {
        cache.read_entry(id, k, j, row.data());
        out.push_back(row);
      }
    }
  };
  for (sequence_id s : m.live_sequences()) {
    for (std::size_t i = 0; i < m.template layers_of<0>(); ++i) add(m.template layer<0>(i), m.template layer_id<0>(s, i), 2);
    for (std::size_t i = 0; i < m.template layers_of<1>(); ++i) add(m.template layer<1>(i), m.template layer_id<1>(s, i), 1);
  }
  return out;
}

TEST_CASE("model_cache: many layers per kind; a shared pool holds what separate pools hold", "[cache][model]") {
  auto shared = make_many(/*shared_pages=*/256);
  auto separate = make_many(0);
  auto& m = shared->m;
  REQUIRE(m.layer_count() == 5);
  REQUIRE(m.layers_of<0>() == 3);
  REQUIRE(m.layer_index<1>(1) == 4);
  REQUIRE(m.layer<0>(2).shared_pool(0) == shared->kv);
  REQUIRE_FALSE(m.layer<0>(2).owns_pool(0));
  REQUIRE(m.layer<0>(2).owns_pool(1));

  // The same operations on both models.
  for (auto* model : {&shared->m, &separate->m}) {
    const sequence_id a = model->create();
    append_all(*model, a, 11, 1);
    const sequence_id b = model->fork(a);
    append_all(*model, b, 3, 2);
    const sequence_id c = model->create();
    append_all(*model, c, 6, 3);
    model->remove_suffix(b, 12);
    append_all(*model, a, 5, 4);
    model->copy(a, c);
    append_all(*model, c, 1, 5);
  }
  REQUIRE(contents(shared->m) == contents(separate->m));

  // Accounting: the shared pool is reported once, with the five layers drawing from it, and holds
  // exactly the layers' K/V pages; the layers' pages sum to the pools' total.
  const auto u = m.pool_usage();
  REQUIRE(u.pools.size() == 4);  // kv + the three first-kind layers' indexer pools
  REQUIRE(u.pools[0].name == "kv");
  REQUIRE(u.pools[0].layers == std::vector<std::size_t>{0, 1, 2, 3, 4});
  i64 kv_pages = 0, held = 0;
  for (std::size_t i = 0; i < 3; ++i) kv_pages += m.layer<0>(i).pages_held(0);
  for (std::size_t i = 0; i < 2; ++i) kv_pages += m.layer<1>(i).pages_held(0);
  REQUIRE(kv_pages == shared->kv->used_pages());
  REQUIRE(u.pools[0].pages_used == kv_pages);
  for (const auto& layer : u.layers) held += layer.pages_held;
  REQUIRE(held == u.total.pages_used);
  REQUIRE(u.total.pages_used == separate->m.pool_usage().total.pages_used);

  // Layer ids by kind and by model index agree; a layer index past the kind is refused.
  const sequence_id first = m.live_sequences().front();
  REQUIRE(m.layer_id<1>(first, 1) == m.layer_id(first, 4));
  REQUIRE_THAT(message_of<input_error>([&] { m.layer<1>(2); }),
               Contains("model.layer<1>(layer) = 2") && Contains("number of layers of that kind, 2"));

  // Everything freed: the shared pool is empty again.
  m.clear();
  REQUIRE(shared->kv->used_pages() == 0);
}

TEST_CASE("model_cache: a full shared pool refuses an append in any layer and changes nothing", "[cache][model]") {
  auto world = make_many(/*shared_pages=*/24);
  auto& m = world->m;
  const sequence_id a = m.create();
  append_all(m, a, 8, 1);  // 3 × 2 pages (first kind: 4 entries) + 2 × 1 page (wide: 2 entries) = 8
  const sequence_id b = m.fork(a);
  REQUIRE(world->kv->used_pages() == 8);
  append_all(m, b, 8, 2);  // 8 more pages for b (its copy of a's full pages is shared): 16
  REQUIRE(world->kv->used_pages() == 16);
  append_all(m, a, 8, 3);  // and 8 more for a: the pool is full at 24
  REQUIRE(world->kv->free_pages() == 0);

  const auto before = contents(m);
  std::vector<phasekv_test::cache_dump> dumps;
  for (std::size_t i = 0; i < 3; ++i) dumps.push_back(phasekv_test::dump(m.layer<0>(i)));
  for (std::size_t i = 0; i < 2; ++i) dumps.push_back(phasekv_test::dump(m.layer<1>(i)));
  const auto still = [&] {
    REQUIRE(contents(m) == before);
    for (std::size_t i = 0; i < 3; ++i) REQUIRE(phasekv_test::dump(m.layer<0>(i)) == dumps[i]);
    for (std::size_t i = 0; i < 2; ++i) REQUIRE(phasekv_test::dump(m.layer<1>(i)) == dumps[3 + i]);
  };
  // A wide layer's next entry needs a page of the shared pool: refused, naming that pool.
  const auto& hkv = m.layer<1>(1).compressors().stream<0>();
  std::vector<float> x(static_cast<std::size_t>(4 * hkv.payload_floats_per_token()), 0.5f);
  REQUIRE_THAT(message_of<capacity_error>([&] { m.append<1>(b, 1, {token_chunk{4, x, {}}}); }),
               Contains("kv.capacity = 24"));
  still();
  // Forks, copies and rollbacks need no page, however full the pool.
  const sequence_id c = m.fork(b);
  m.remove_suffix(c, 10);
  m.free(c);
  still();
  // Freeing b returns its own pages to the shared pool; a can grow again.
  m.free(b);
  REQUIRE(world->kv->used_pages() == 16);
  append_all(m, a, 8, 4);
  REQUIRE(world->kv->used_pages() == 24);
}

TEST_CASE("model_cache: a shared pool must have the stream's page layout", "[cache][model]") {
  const auto wrong_channels = std::make_shared<page_pool>(phasekv_test::pool_of("narrow", 2, 1, 2, 8));
  REQUIRE_THAT(message_of<config_error>([&] {
                 first_cache(first_cache::layer(gated(geometry{2, 4}, config("kv", 4)), mean(geometry{2, 4}, config("ix", 2))),
                             first_config("first", wrong_channels));
               }),
               Contains("first.shared_pools[0] = narrow") && Contains("channels = 2, the stream needs 4"));
  auto bf16 = kv_pool(8);
  {
    page_pool_config p = bf16->config();
    p.storage = storage_type::bf16;
    bf16 = std::make_shared<page_pool>(p);
  }
  REQUIRE_THAT(message_of<config_error>([&] { wide_cache(wide_cache::layer(mean(geometry{4, 4}, config("hkv", 4))), wide_config("w", bf16)); }),
               Contains("w.shared_pools[0] = kv") && Contains("stores bf16, the stream stores f32"));
  cache_config too_many = wide_config("w", kv_pool(8));
  too_many.shared_pools.push_back(nullptr);
  REQUIRE_THAT(message_of<config_error>([&] { wide_cache(wide_cache::layer(mean(geometry{4, 4}, config("hkv", 4))), too_many); }),
               Contains("w.shared_pools.size() = 2"));
}

}  // namespace
