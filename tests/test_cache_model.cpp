// The multi-layer cache (cache/model_cache.hpp): every sequence operation acts on every layer,
// and a failure in any layer leaves every layer exactly as it was. The layers differ in
// geometry, streams, history and pool size, so one layer can refuse what another accepts.
// Allocation failures inside model operations are tested in tests/fault/.

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "oracle/cache_dump.hpp"
#include "oracle/message_of.hpp"
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
  cache_config a;
  a.name = "first";
  a.page_size = 2;
  a.pages = 64;
  a.history = 6;
  a.window.tokens = 3;
  a.window.key_channels = 4;
  cache_config b;
  b.name = "second";
  b.page_size = 1;
  b.pages = second_pages;
  return model(layer_spec<first_cache>{first_cache::layer(gated(geometry{2, 4}, config("kv", 4)),
                                                          mean(geometry{2, 4}, config("ix", 2))),
                                       a},
               layer_spec<second_cache>{second_cache::layer(mean(geometry{4, 4}, config("hkv", 3))), b});
}

// One forward pass over n tokens: both layers append (values fixed by the seed).
void append(model& m, sequence_id s, i64 n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto values = [&](i64 count) {
    std::vector<float> v(static_cast<std::size_t>(count));
    for (float& x : v) x = u(rng);
    return v;
  };
  const auto& kv = m.layer<0>().compressors().stream<0>();
  const auto& ix = m.layer<0>().compressors().stream<1>();
  const auto& hkv = m.layer<1>().compressors().stream<0>();
  m.append<0>(s,
              {token_chunk{n, values(n * kv.payload_floats_per_token()), values(n * kv.logit_floats_per_token())},
               token_chunk{n, values(n * ix.payload_floats_per_token()), {}}},
              values(n * 4));
  m.append<1>(s, {token_chunk{n, values(n * hkv.payload_floats_per_token()), {}}});
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
  REQUIRE(pools.total.pages_used == pools.layers[0].pages_used + pools.layers[1].pages_used);
  REQUIRE(pools.layers[1].pages_used == m.layer<1>().pool(0).used_pages());

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

}  // namespace
