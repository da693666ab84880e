// The cache and reader presets of DeepSeek's layers (models/deepseek_v4.hpp): their
// documented numbers, and each layer built from its compressor, cache and reader presets —
// default fp32 and DeepSeek-V4 precision (FP8 K/V entries, FP4 indexer keys) — appends and reads.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/prelude.hpp"
#include "support/common.hpp"
#include "support/random_inputs.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace test_cache_presets {

namespace {

using namespace phasekv_test::prelude;
using kv_stream = stream_compressor<presets::deepseek_v4_csa_policy>;
using csa_cache = paged_cache<kv_stream, kv_stream>;
using hca_cache = paged_cache<kv_stream>;

void check_window(const cache_config& c, i64 pages, i64 history) {
  CHECK(c.page_size == 64);
  CHECK(c.pages == pages);
  CHECK(c.history == history);
  CHECK(c.storage == storage_type::f32);
  CHECK(c.window.tokens == 128);
  CHECK(c.window.kv_heads == 1);
  CHECK(c.window.key_channels == 512);
  CHECK(c.window.value_channels == 0);
}

// Appends `tokens` random tokens to every stream of a fresh sequence and reads the last one.
template <class Cache>
std::vector<float> append_and_read(Cache& cache, const reader_config& rc, i64 tokens, std::uint32_t seed,
                                   read_trace& trace, sequence_id* created = nullptr) {
  std::mt19937 rng(seed);
  const sequence_id seq = cache.create();
  if (created != nullptr) *created = seq;
  typename Cache::chunks in;
  std::vector<std::vector<float>> buffers;
  buffers.reserve(2 * Cache::stream_count);
  const auto& layer = cache.compressors();
  for (std::size_t k = 0; k < Cache::stream_count; ++k) {
    const i64 channels = layer.config(k).channels, views = layer.geom().branches();
    buffers.push_back(phasekv_test::random_uniform(rng, sz(tokens * views * channels), -1.0f, 1.0f));
    buffers.push_back(phasekv_test::random_uniform(rng, sz(tokens * views * channels), -2.0f, 2.0f));
    in[k] = token_chunk{tokens, buffers[2 * k], buffers[2 * k + 1]};
  }
  const auto window = phasekv_test::random_uniform(rng, sz(tokens * 512), -1.0f, 1.0f);
  cache.append(seq, in, window);

  const auto queries = phasekv_test::random_uniform(rng, sz(rc.query_heads * 512), -1.0f, 1.0f);
  const auto iq = phasekv_test::random_uniform(rng, sz(rc.indexer_heads * 128), -1.0f, 1.0f);
  const auto iw = phasekv_test::random_uniform(rng, sz(rc.indexer_heads), 0.0f, 1.0f);
  const auto sinks = phasekv_test::random_uniform(rng, sz(rc.query_heads), -1.0f, 1.0f);
  sparse_reader reader(cache, rc);
  std::vector<float> out(sz(reader.output_floats()));
  reader.read(cache, seq, read_request{tokens - 1, queries, iq, iw, sinks}, out.data(), &trace);
  return out;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

}  // namespace

TEST_CASE("presets: DeepSeek cache presets hold their documented numbers", "[cache][presets]") {
  check_window(presets::deepseek_cache(presets::deepseek_v4_csa_layer, 10, 5), 10, 5);
  for (const cache_config& c : {presets::deepseek_cache(presets::deepseek_v4_csa_layer, 7),
                                presets::deepseek_cache(presets::deepseek_v4_hca_layer, 7),
                                presets::deepseek_cache(presets::deepseek_v4_1_csa_layer, 7)}) {
    INFO(c.name);
    check_window(c, 7, 0);
    CHECK(c.stream_storage.empty());  // fp32 is the default
  }
  const storage_type fp8 = storage_type::fp8_e4m3_block;
  const storage_type indexer = presets::deepseek_v4_indexer_storage();
  CHECK(indexer == storage_type::fp4_e2m1_hadamard);  // DeepSeek-V4's indexer keys
  for (const cache_config& c : {presets::deepseek_cache(presets::deepseek_v4_csa_layer, 9, 3, true),
                                presets::deepseek_cache(presets::deepseek_v4_1_csa_layer, 9, 3, true)}) {
    INFO(c.name);
    check_window(c, 9, 3);
    CHECK(c.stream_storage == std::vector<storage_type>{fp8, indexer});
  }
  const cache_config hca = presets::deepseek_cache(presets::deepseek_v4_hca_layer, 9, 3, true);
  check_window(hca, 9, 3);
  CHECK(hca.stream_storage == std::vector<storage_type>{fp8});
  CHECK(presets::deepseek_cache(presets::deepseek_v4_csa_layer, 1, 0, true).name !=
        presets::deepseek_cache(presets::deepseek_v4_csa_layer, 1).name);

  const reader_config csa = presets::deepseek_reader(presets::deepseek_v4_csa_layer),
                      v41 = presets::deepseek_reader(presets::deepseek_v4_1_csa_layer),
                      h = presets::deepseek_reader(presets::deepseek_v4_hca_layer);
  CHECK((v41.query_heads == csa.query_heads && v41.key_stream == 0 && v41.value_stream == 0 &&
         v41.indexer_stream == 1 && v41.top_k == 512 && v41.indexer_heads == 64 && v41.sink &&
         v41.derotate_output));
  CHECK(v41.name != csa.name);
  CHECK((h.query_heads == 64 && h.indexer_stream == no_stream && h.top_k == 0 && h.indexer_heads == 0 && h.sink &&
         h.derotate_output));
  CHECK(csa.precision == indexer_precision::f32);  // fp32 stays the default

  // The precision readers: the same heads and selection, the indexer in FP4.
  for (const auto& [plain, precise] : {std::pair{csa, presets::deepseek_reader(presets::deepseek_v4_csa_layer, true)},
                                       std::pair{v41, presets::deepseek_reader(presets::deepseek_v4_1_csa_layer, true)},
                                       std::pair{h, presets::deepseek_reader(presets::deepseek_v4_hca_layer, true)}}) {
    INFO(precise.name);
    CHECK(precise.name != plain.name);
    CHECK(precise.precision == (plain.indexer_stream == no_stream ? indexer_precision::f32 : indexer_precision::fp4));
    CHECK((precise.query_heads == plain.query_heads && precise.key_stream == plain.key_stream &&
           precise.value_stream == plain.value_stream && precise.indexer_stream == plain.indexer_stream &&
           precise.top_k == plain.top_k && precise.indexer_heads == plain.indexer_heads &&
           precise.sink == plain.sink && precise.derotate_output == plain.derotate_output &&
           precise.scale == plain.scale));
  }
}

TEST_CASE("presets: DeepSeek layers built from their presets append and read, fp32 and FP8",
          "[cache][read][presets]") {
  SECTION("HCA: S = W = 128, one FP8 stream, every complete entry read") {
    const geometry g = presets::deepseek_v4_hca_layer.geom;
    const hca_cache::layer layer{kv_stream(g, presets::deepseek_kv_stream(presets::deepseek_v4_hca_layer))};
    hca_cache fp32(layer, presets::deepseek_cache(presets::deepseek_v4_hca_layer, 8)),
        fp8(layer, presets::deepseek_cache(presets::deepseek_v4_hca_layer, 8, 0, true));
    CHECK(fp32.pool(0).layout().entry_stride_bytes == 2048);
    CHECK(fp8.pool(0).layout().entry_stride_bytes == 584);
    read_trace a, b;
    const reader_config rc = presets::deepseek_reader(presets::deepseek_v4_hca_layer);
    const auto x = append_and_read(fp32, rc, 300, 7, a), y = append_and_read(fp8, rc, 300, 7, b);
    CHECK(a.candidates == 2);  // tokens 0–255 complete two entries
    CHECK(a.selected == std::vector<std::int64_t>{0, 1});
    CHECK(b.selected == a.selected);
    CHECK(a.window_first == 300 - 128);
    const double d = max_abs_difference(x, y);
    CHECK(d > 0.0);    // FP8 entries are not the fp32 ones…
    CHECK(d < 0.02);   // …but close (e4m3: 3 mantissa bits, UE8M0 block scales; 0.0035 here)
  }
  for (const bool v41 : {false, true}) {
    DYNAMIC_SECTION((v41 ? "V4.1 CSA: S = 2, W = 4" : "V4 CSA: S = 4, W = 8")
                    << ", FP8 K/V, indexer in " << presets::deepseek_v4_indexer_storage()) {
      const geometry g = v41 ? presets::deepseek_v4_1_csa_layer.geom : presets::deepseek_v4_csa_layer.geom;
      const csa_cache::layer layer{
          kv_stream(g, v41 ? presets::deepseek_kv_stream(presets::deepseek_v4_1_csa_layer)
                           : presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer)),
          kv_stream(g, v41 ? *presets::deepseek_indexer_stream(presets::deepseek_v4_1_csa_layer)
                           : *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer))};
      const cache_config cc = v41 ? presets::deepseek_cache(presets::deepseek_v4_1_csa_layer, 40, 0, true)
                                  : presets::deepseek_cache(presets::deepseek_v4_csa_layer, 40, 0, true);
      csa_cache cache(layer, cc), fp32(layer, v41 ? presets::deepseek_cache(presets::deepseek_v4_1_csa_layer, 40)
                                                  : presets::deepseek_cache(presets::deepseek_v4_csa_layer, 40));
      CHECK(cache.pool(0).layout().entry_stride_bytes == 584);
      CHECK(cache.pool(1).layout().entry_stride_bytes == 68);  // 64 B of e2m1 codes + 4 UE8M0 scales
      CHECK(cache.pool(1).config().storage == presets::deepseek_v4_indexer_storage());
      reader_config rc = v41 ? presets::deepseek_reader(presets::deepseek_v4_1_csa_layer, true)
                             : presets::deepseek_reader(presets::deepseek_v4_csa_layer, true);
      reader_config plain = v41 ? presets::deepseek_reader(presets::deepseek_v4_1_csa_layer)
                                : presets::deepseek_reader(presets::deepseek_v4_csa_layer);
      rc.top_k = plain.top_k = 64;  // a selection out of the 600 / 300 candidates
      // FP4 keys are read only by the FP4 indexer: the fp32 reader refuses the precision cache.
      CHECK_THROWS_AS(sparse_reader(cache, plain), config_error);
      read_trace trace, reference;
      sequence_id seq = 0, seq32 = 0;
      const auto out = append_and_read(cache, rc, 1200, 11, trace, &seq);
      append_and_read(fp32, plain, 1200, 11, reference, &seq32);  // the same numbers in fp32
      CHECK(trace.candidates == 1200 / g.stride);
      CHECK(trace.selected.size() == 64);
      CHECK(std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v); }));
      // Per compressed token: 584 + 68 bytes against 2048 + 512 in fp32 (146 + 17 per token at S = 4).
      const sequence_memory m = cache.memory(seq), m32 = fp32.memory(seq32);
      CHECK(m.entry_bytes == (1200 / g.stride) * (584 + 68));
      CHECK(m32.entry_bytes == (1200 / g.stride) * (2048 + 512));
      // FP4 scores rank like the fp32 ones up to FP4's rounding: most of the top 64 are shared
      // (random keys put many scores within the rounding of the cut; unrelated sets share ~6).
      std::vector<std::int64_t> a = trace.selected, b = reference.selected;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      std::vector<std::int64_t> shared;
      std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(shared));
      INFO("shared " << shared.size());
      CHECK(shared.size() >= 32);
      CHECK(shared.size() < 64);  // and FP4 is not fp32
    }
  }
}

namespace {

// Every field a preset sets, compared: the bundle and the named presets are the same configs.
bool same_stream(const stream_config& a, const stream_config& b) {
  return a.name == b.name && a.role == b.role && a.channels == b.channels && a.kv_heads == b.kv_heads &&
         a.inputs == b.inputs && a.rope.channels == b.rope.channels && a.rope.base == b.rope.base &&
         a.rope.layout == b.rope.layout && a.rope.yarn.enabled == b.rope.yarn.enabled &&
         a.rope.yarn.factor == b.rope.yarn.factor && a.rope.yarn.original_context == b.rope.yarn.original_context &&
         a.rope.yarn.beta_fast == b.rope.yarn.beta_fast && a.rope.yarn.beta_slow == b.rope.yarn.beta_slow &&
         a.norm_eps == b.norm_eps;
}
bool same_cache(const cache_config& a, const cache_config& b) {
  return a.name == b.name && a.page_size == b.page_size && a.pages == b.pages && a.history == b.history &&
         a.storage == b.storage && a.stream_storage == b.stream_storage && a.window.tokens == b.window.tokens &&
         a.window.kv_heads == b.window.kv_heads && a.window.key_channels == b.window.key_channels &&
         a.window.value_channels == b.window.value_channels && a.window.precision == b.window.precision &&
         a.window.rope_channels == b.window.rope_channels;
}
bool same_reader(const reader_config& a, const reader_config& b) {
  return a.name == b.name && a.query_heads == b.query_heads && a.key_stream == b.key_stream &&
         a.value_stream == b.value_stream && a.indexer_stream == b.indexer_stream && a.top_k == b.top_k &&
         a.indexer_heads == b.indexer_heads && a.sink == b.sink && a.derotate_output == b.derotate_output &&
         a.precision == b.precision && a.scale == b.scale;
}

}  // namespace

TEST_CASE("presets: one description per DeepSeek layer gives its compressor, cache and reader, named as before",
          "[cache][read][presets][models]") {
  struct named {
    presets::deepseek_layer layer;
    int compress_ratio;
    const char *kv, *indexer, *cache, *precision_cache, *reader, *precision_reader;
  };
  // The names are part of every snapshot's identity: pinned here as literals.
  const std::vector<named> layers = {
      {presets::deepseek_v4_csa_layer, 4, "csa.kv", "csa.indexer", "dsv4.csa", "dsv4.csa.precision", "csa.reader",
       "csa.precision.reader"},
      {presets::deepseek_v4_hca_layer, 128, "hca.kv", nullptr, "dsv4.hca", "dsv4.hca.precision", "hca.reader",
       "hca.precision.reader"},
      {presets::deepseek_v4_1_csa_layer, 2, "v4.1.csa.kv", "v4.1.csa.indexer", "dsv4.1.csa", "dsv4.1.csa.precision",
       "v4.1.csa.reader", "v4.1.csa.precision.reader"},
  };
  CHECK(presets::deepseek_v4_csa_layer.geom == geometry{4, 8});
  CHECK(presets::deepseek_v4_hca_layer.geom == geometry{128, 128});
  CHECK(presets::deepseek_v4_1_csa_layer.geom == geometry{2, 4});
  for (const named& n : layers) {
    INFO(n.kv);
    const presets::deepseek_layer& layer = n.layer;
    CHECK(presets::deepseek_layer_of(n.compress_ratio).geom == layer.geom);
    CHECK(presets::deepseek_layer_of(n.compress_ratio).cache_name() == layer.cache_name());
    CHECK(presets::deepseek_kv_stream(layer).name == n.kv);
    const std::optional<stream_config> indexer = presets::deepseek_indexer_stream(layer);
    CHECK(indexer.has_value() == (n.indexer != nullptr));
    if (n.indexer) CHECK(indexer->name == n.indexer);
    CHECK(presets::deepseek_cache(layer, 6, 2).name == n.cache);
    CHECK(presets::deepseek_cache(layer, 6, 2, true).name == n.precision_cache);
    CHECK(presets::deepseek_reader(layer).name == n.reader);
    CHECK(presets::deepseek_reader(layer, true).name == n.precision_reader);
    for (const bool precision : {false, true}) {
      INFO("precision " << precision);
      const presets::deepseek_layer_preset p = presets::deepseek_preset(layer, 6, 2, precision);
      CHECK(p.geom == layer.geom);
      CHECK(same_stream(p.kv, presets::deepseek_kv_stream(layer)));
      REQUIRE(p.indexer.has_value() == indexer.has_value());
      if (p.indexer) CHECK(same_stream(*p.indexer, *indexer));
      CHECK(same_cache(p.cache, presets::deepseek_cache(layer, 6, 2, precision)));
      CHECK(same_reader(p.reader, presets::deepseek_reader(layer, precision)));
      // Consistent by construction: the window holds the K/V stream's rows, one storage per
      // stream at DeepSeek-V4's precision, the reader's indexer exactly when there is one.
      CHECK(p.cache.window.key_channels == p.kv.channels);
      CHECK(p.cache.window.kv_heads == p.kv.kv_heads);
      CHECK(p.cache.stream_storage.size() == (precision ? (p.indexer ? 2u : 1u) : 0u));
      CHECK((p.reader.indexer_stream == 1) == p.indexer.has_value());
      CHECK((p.reader.top_k > 0) == p.indexer.has_value());
    }
  }
  // A ratio of no compressed layer is an error naming the field and the value; 0 (window-only) too.
  using Catch::Matchers::StartsWith;
  for (const int ratio : {0, 1, 3, 8, 64, 256, -4}) {
    INFO(ratio);
    CHECK_THROWS_AS(presets::deepseek_layer_of(ratio), config_error);
    CHECK_THROWS_WITH(presets::deepseek_layer_of(ratio),
                      StartsWith("compress_ratio = " + std::to_string(ratio) + ": "));
  }
  CHECK_THROWS_WITH(presets::deepseek_layer_of(7, "layers[3].compress_ratio"),
                    StartsWith("layers[3].compress_ratio = 7: is not a compressed DeepSeek-V4"));
  CHECK_THROWS_AS(presets::deepseek_v4_model({0, 4, 5}), config_error);
  CHECK_THROWS_WITH(presets::deepseek_v4_model({0, 4, 5}), StartsWith("dsv4: compress_ratios[2] = 5: "));
  // A whole layer from one call: a V4.1 CSA layer at DeepSeek-V4's precision appends and reads.
  const presets::deepseek_layer_preset p = presets::deepseek_preset(presets::deepseek_v4_1_csa_layer, 8, 0, true);
  const csa_cache::layer layer{kv_stream(p.geom, p.kv), kv_stream(p.geom, *p.indexer)};
  csa_cache cache(layer, p.cache);
  read_trace trace;
  const std::vector<float> out = append_and_read(cache, p.reader, 40, 4141, trace);
  CHECK(trace.selected.size() == sz(p.geom.completed_entries(40)));
  CHECK(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
}

}  // namespace test_cache_presets
