// phasekv::bench (tools/bench.hpp): each figure's repetitions, median and spread; the layer as
// configuration fields; and the write floor of a pooling of the host's, which counts the FLOPs
// the pooling states (flops_per_entry) and is unknown — not a bandwidth floor — when it states none.
// Tiny sizes and min_time 0: nothing here is a measurement worth reading, only its bookkeeping.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <phasekv/models/deepseek_v4.hpp>
#include <phasekv/models/model_cache.hpp>
#include <phasekv/tools/bench.hpp>

namespace test_testing_bench {

namespace {

// Mean pooling written as a host's pooling, without and with a statement of its arithmetic.
struct silent_pool {
  static constexpr const char* name = "silent_mean";
  static constexpr std::uint32_t version = 1;
  static constexpr std::int64_t gate_channels(std::int64_t) { return 0; }
  void pool(const phasekv::window_rows& w, float* out) const {
    const std::int64_t n = w.count();
    for (std::int64_t c = 0; c < w.channels; ++c) {
      float sum = 0.0f;
      for (std::int64_t k = 0; k < n; ++k) sum += w.payload[k][c];
      out[c] = sum / static_cast<float>(n);
      if (w.slot_weights && c == 0)
        for (std::int64_t k = 0; k < n; ++k) w.slot_weights[k] = 1.0f / static_cast<float>(n);
    }
  }
};
struct stated_pool : silent_pool {
  static constexpr const char* name = "stated_mean";
  double flops_per_entry(std::int64_t window, std::int64_t channels) const {
    return 1000.0 * static_cast<double>(window * channels);  // inflated, so the floor is compute-bound
  }
};

// Tiny writes (a 256-token prefill, 16 one-token appends), no reads, min_time 0.
phasekv::bench::run_config writes_only(std::int64_t repetitions) {
  phasekv::bench::run_config rc;
  rc.prefill_tokens = 256;
  rc.decode_tokens = 16;
  rc.context = 0;
  rc.batch = 0;
  rc.min_time = 0.0;
  rc.repetitions = repetitions;
  return rc;
}

// One stream of `Pool`, registered as a host registers its pooling, measured through the front door.
template <class Pool>
phasekv::bench::results tiny_run() {
  using namespace phasekv;
  pooling_registry poolings;
  poolings.add<Pool>(Pool::name);
  layer_kind kind;
  kind.name = "tiny";
  kind.geom = geometry{4, 8};
  stream_spec kv;
  kv.config.name = "kv";
  kv.config.channels = 16;
  kv.pooling = Pool::name;
  kind.streams = {kv};
  kind.page_size = 16;
  kind.reader.query_heads = 2;
  return bench::run(kind, poolings, writes_only(3));
}

}  // namespace

TEST_CASE("bench::run times each figure in repetitions and records the layer as fields", "[testing][bench]") {
  const phasekv::bench::results r = tiny_run<stated_pool>();
  REQUIRE(r.figures.size() == 2u);  // prefill and decode writes of the one stream
  for (const auto& f : r.figures) {
    INFO(f.name);
    CHECK(f.repetitions == 3);
    CHECK(f.calls >= 3);
    CHECK(f.seconds_min <= f.seconds);
    CHECK(f.seconds <= f.seconds_max);
    CHECK(f.seconds_per_token() == Approx(f.seconds / static_cast<double>(f.tokens)));
  }
  const std::string json = r.json();
  CHECK(json.find("\"format\": \"phasekv.bench/2\"") != std::string::npos);
  CHECK(json.find("\"stride\": 4") != std::string::npos);
  CHECK(json.find("\"window\": 8") != std::string::npos);
  CHECK(json.find("\"channels\": 16") != std::string::npos);
  CHECK(json.find("\"repetitions\": 3") != std::string::npos);
  CHECK(json.find("\"phasekv_version\": \"" PHASEKV_VERSION_STRING "\"") != std::string::npos);
  CHECK(json.find("\"date_utc\": \"20") != std::string::npos);
}

TEST_CASE("a host pooling's write floor counts the FLOPs it states, and is unknown without them", "[testing][bench]") {
  const phasekv::bench::results stated = tiny_run<stated_pool>();
  const auto& prefill = stated.figures[0];
  // 256 tokens at S = 4, W = 8: 64 complete entries (the first one padded) of one KV head.
  REQUIRE(phasekv::geometry{4, 8}.completed_entries(256) == 64);
  CHECK(prefill.work.flops == Approx(64.0 * 1000.0 * 8 * 16));
  CHECK(prefill.bound == "compute");
  CHECK(prefill.floor_seconds > 0.0);

  const phasekv::bench::results silent = tiny_run<silent_pool>();
  for (const auto& f : silent.figures) {
    INFO(f.name);
    CHECK(std::isnan(f.floor_seconds));
    CHECK(std::isnan(f.of_roofline));
    CHECK(f.bound.rfind("unknown", 0) == 0);
  }
  CHECK(silent.json().find("\"floor_seconds\": null") != std::string::npos);
  CHECK(silent.table().find("n/a") != std::string::npos);
}

// The read floor from the maths, for DeepSeek-V4's three layer kinds at its precision: every stored
// byte counted as stored (FP4 indexer keys 68, FP8 entries and window rows 584), the indexer's
// multiply-adds as int8 operations, attention's as FLOPs; a window-only layer reads its window alone.
TEST_CASE("read_cost counts the stored bytes and the multiply-adds of each kind of read", "[testing][bench]") {
  using namespace phasekv;
  layer_shape shape;
  shape.geom = geometry{4, 8, 0, anchor_mode::block_start};
  stream_shape kv;
  kv.channels = 512;
  kv.storage = storage_type::fp8_e4m3_block;
  kv.applies_rope = true;
  kv.rope.channels = 64;
  stream_shape ix;
  ix.role = stream_role::indexer;
  ix.channels = 128;
  ix.storage = storage_type::fp4_e2m1_hadamard;
  shape.streams = {kv, ix};
  shape.window.tokens = 128;
  shape.window.key_channels = 512;
  shape.window.precision = storage_type::fp8_e4m3_block;
  shape.window.rope_channels = 64;
  reader_config rc;
  rc.query_heads = 64;
  rc.key_stream = rc.value_stream = 0;
  rc.indexer_stream = 1;
  rc.top_k = 512;
  rc.indexer_heads = 64;
  rc.precision = indexer_precision::fp4;
  const double n = 8192.0;  // candidates
  const double query_bytes = 4.0 * (64 * 1024 + 64 * 129);

  SECTION("CSA: the indexer keys of every candidate, the top-k entries, the window") {
    const bench::roofline r = bench::read_cost::of(shape, rc, {584, 68}).floor(8192);
    CHECK(r.bytes == 68.0 * n + 584.0 * 512 + 584.0 * 128 + query_bytes);
    CHECK(r.int8_ops == 2.0 * 64 * 128 * n);
    CHECK(r.flops == 2.0 * 64 * 1024 * (512 + 128));
  }
  SECTION("HCA: every entry, no indexer") {
    shape.streams = {kv};
    rc.indexer_stream = no_stream;
    rc.top_k = 0;
    rc.indexer_heads = 0;
    const bench::roofline r = bench::read_cost::of(shape, rc, {584}).floor(256);
    CHECK(r.bytes == 584.0 * 256 + 584.0 * 128 + 4.0 * 64 * 1024);
    CHECK(r.int8_ops == 0.0);
    CHECK(r.flops == 2.0 * 64 * 1024 * (256 + 128));
  }
  SECTION("window-only: the window's rows and channels") {
    shape.streams.clear();
    rc.key_stream = rc.value_stream = rc.indexer_stream = no_stream;
    rc.top_k = 0;
    rc.indexer_heads = 0;
    const bench::roofline r = bench::read_cost::of(shape, rc, {}).floor(0);
    CHECK(r.bytes == 584.0 * 128 + 4.0 * 64 * 1024);
    CHECK(r.flops == 2.0 * 64 * 1024 * 128);
  }
  SECTION("an fp32 window row is 2048 bytes") {
    shape.window.precision = storage_type::f32;
    shape.window.rope_channels = 0;
    const bench::roofline r = bench::read_cost::of(shape, rc, {584, 68}).floor(8192);
    CHECK(r.bytes == 68.0 * n + 584.0 * 512 + 2048.0 * 128 + query_bytes);
  }
}

// The model's fill is the paged_cache's, block for block: a one-layer model and a paged_cache of the
// same DeepSeek-V4 CSA layer at V4 precision hold the same stored bytes and window rows.
TEST_CASE("fill_random_tokens fills a one-layer model as it fills the layer's paged_cache", "[testing][bench]") {
  using namespace phasekv;
  using stream = stream_compressor<presets::deepseek_v4_csa_policy>;
  const presets::deepseek_layer_preset p = presets::deepseek_preset(presets::deepseek_v4_csa_layer, 16, 0, true);
  paged_cache<stream, stream> cache(layer_compressor<stream, stream>(stream(p.geom, p.kv), stream(p.geom, *p.indexer)),
                                    p.cache);
  model_spec spec;
  spec.kinds = {presets::deepseek_kind(presets::deepseek_v4_csa_layer, true)};
  spec.layers = model_spec::layers_of({0});
  model_options options;
  options.pages = 16;
  model_cache model(spec, options);
  const sequence_id a = cache.create(), b = model.create();
  const std::int64_t tokens = 2500;  // three blocks, the last one partial
  bench::fill_random_tokens(cache, a, tokens, 9);
  bench::fill_random_tokens(model, b, tokens, 9);
  REQUIRE(model.tokens(b) == tokens);
  const std::int64_t entries = p.geom.completed_entries(tokens);
  for (std::size_t k = 0; k < 2; ++k)
    for (std::int64_t j = 0; j < entries; ++j) {
      const span<const std::byte> x = cache.entry_bytes(a, k, j), y = model.entry_bytes(0, k, b, j);
      REQUIRE(x.size() == y.size());
      INFO("stream " << k << " entry " << j);
      CHECK(std::equal(x.begin(), x.end(), y.begin()));
    }
  REQUIRE(cache.window_first(a) == model.window_first(0, b));
  std::vector<float> x(512), y(512);
  for (std::int64_t t = cache.window_first(a); t < tokens; ++t) {
    cache.copy_window_key(a, t, span<float>(x));
    model.copy_window_key(0, b, t, span<float>(y));
    INFO("window row " << t);
    CHECK(x == y);
  }
}

// Every figure through the front door, for DeepSeek-V4's three kinds at its precision: the writes of
// each stream, a read and a batched read whose floors are read_cost's; a kind without a reader
// cannot be asked to read.
TEST_CASE("bench::run measures writes and reads of any layer kind, window-only included", "[testing][bench]") {
  using namespace phasekv;
  const pooling_registry poolings = pooling_registry::builtins();
  bench::run_config rc = writes_only(1);
  rc.context = 700;
  rc.batch = 2;
  rc.batch_context = 300;
  const layer_kind csa = presets::deepseek_kind(presets::deepseek_v4_csa_layer, true);
  const layer_kind hca = presets::deepseek_kind(presets::deepseek_v4_hca_layer, true);
  const layer_kind swa = presets::deepseek_window_kind(true);
  for (const layer_kind* kind : {&csa, &hca, &swa}) {
    INFO(kind->name);
    const bench::results r = bench::run(*kind, poolings, rc, kind->name);
    std::vector<std::string> kinds;
    for (const bench::figure& f : r.figures) kinds.push_back(f.kind);
    std::vector<std::string> expected;
    for (std::size_t k = 0; k < kind->streams.size(); ++k) {
      expected.push_back("prefill_write");
      expected.push_back("decode_write");
    }
    expected.push_back("read");
    expected.push_back("batched_read");
    CHECK(kinds == expected);
    const bench::figure& read = r.figures[r.figures.size() - 2];
    // The read floor is read_cost's for the layer the model built.
    model_spec spec;
    spec.kinds = {*kind};
    spec.layers = model_spec::layers_of({0});
    const model_cache m(spec, model_options{}, poolings);
    std::vector<std::int64_t> strides;
    for (std::size_t k = 0; k < kind->streams.size(); ++k) strides.push_back(m.layout(0, k).entry_stride_bytes);
    const std::int64_t candidates = kind->window_only() ? 0 : kind->geom.visible_entries(699);
    const bench::roofline floor = bench::read_cost::of(m.shape(0), m.reader(0), strides).floor(candidates);
    CHECK(read.work.bytes == floor.bytes);
    CHECK(read.work.flops == floor.flops);
    CHECK(read.work.int8_ops == floor.int8_ops);
    CHECK(r.figures.back().work.bytes == 2.0 * bench::read_cost::of(m.shape(0), m.reader(0), strides)
                                                   .floor(kind->window_only() ? 0 : kind->geom.visible_entries(299))
                                                   .bytes);
    CHECK(r.cache_bytes_per_token >= 0.0);
  }
  const std::string json = bench::run(csa, poolings, rc).json();
  CHECK(json.find("\"role\": \"indexer\"") != std::string::npos);
  CHECK(json.find("\"pooling\": \"vector_gates\"") != std::string::npos);
  CHECK(json.find("\"storage\": \"fp4_e2m1_hadamard\"") != std::string::npos);

  layer_kind silent = csa;
  silent.reader = reader_config{};
  silent.reader.query_heads = 0;  // the host reads view() with its own kernels
  try {
    bench::run(silent, poolings, rc);
    FAIL("a read of a kind without a reader was accepted");
  } catch (const config_error& e) {
    CHECK(std::string(e.what()).find("reader.query_heads") != std::string::npos);
  }
  rc.context = rc.batch = 0;
  CHECK(bench::run(silent, poolings, rc).figures.size() == 4u);  // its writes alone
}

}  // namespace test_testing_bench
