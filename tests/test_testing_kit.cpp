// The conformance kit (phasekv/testing/conformance.hpp) on every shipped policy and preset, on
// bugs planted in a pooling and a host's cache layer (tests/kit/planted_bugs.hpp), and its parts:
// the shrinker, the oracles (held to tests/oracle's independent twins) and the options.
//
// The kit runs at effort::quick here; PHASEKV_CONFORMANCE=thorough runs these checks long
// (options::from_environment).

#include <catch2/catch.hpp>

#include <phasekv/phasekv.hpp>
#include <phasekv/testing/catch2.hpp>
#include <phasekv/testing/conformance.hpp>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../examples/pools/max_pool.hpp"
#include "../examples/pools/nsa_mlp_pool.hpp"
#include "kit/planted_bugs.hpp"
#include "oracle/scalar_compressor.hpp"
#include "support/configs.hpp"
#include "support/kit_layers.hpp"
#include "support/random_inputs.hpp"

namespace test_testing_kit {

namespace {

using namespace phasekv;
namespace kit = phasekv::testing;

kit::options kit_options() { return kit::options::from_environment(); }

constexpr auto uniform = &phasekv_test::random_uniform;

// A K/V stream whose last `rope` channels are rotated (base 10^4, when the policy applies RoPE).
stream_config stream(const char* name, std::int64_t channels, std::int64_t heads = 1,
                     input_layout inputs = input_layout::per_branch, std::int64_t rope = 0) {
  return phasekv_test::rotated_stream_of(name, channels, heads, inputs, rope);
}

using mean = stream_compressor<compressor_policy<mean_pool>>;

// One mean-pooled K/V stream (S = 2, W = 4, 8 channels), pages of two entries, a three-token
// window, a reader of two query heads; the cache named `name`, the reader `name`.reader.
kit::layer_under_test<mean> small_mean_layer(const std::string& name) {
  cache_config cc;
  cc.name = name;
  cc.page_size = 2;
  cc.window = raw_window_config{3, 1, 8, 0};
  reader_config rc;
  rc.name = name + ".reader";
  rc.query_heads = 2;
  return kit::layer_under_test<mean>(layer_compressor<mean>(mean(geometry{2, 4}, stream("kv", 8))), cc, rc);
}

// A report that failed names `p` as its first failing property, with a counterexample no larger
// than the case it started from.
void require_caught(const kit::report& r, kit::property p) {
  INFO(r.to_string());
  REQUIRE_FALSE(r.passed());
  REQUIRE(r.failure->property == p);
  REQUIRE(r.result(p).outcome == kit::outcome::failed);
  REQUIRE(kit::size_of(r.failure->counterexample).no_larger_than(kit::size_of(r.failure->original)));
  REQUIRE_FALSE(r.failure->message.empty());
  REQUIRE(r.to_string().find(kit::to_string(p)) != std::string::npos);
}

}  // namespace

TEST_CASE("kit: every built-in pooling, RoPE placement and norm conforms", "[testing][kit]") {
  std::mt19937 rng(7);
  const kit::options o = kit_options();

  SECTION("mean, two heads, per-branch inputs") {
    {
      const kit::report r = kit::check_stream<compressor_policy<mean_pool>>(geometry{4, 8}, stream("mean", 16, 2), {}, o);
      REQUIRE_THAT(r, kit::conforms());
    }
  }
  SECTION("fixed weights, per-slot inputs, a staggered origin and a zero in the profile") {
    stream_params p;
    p.slot_profile = {0.5f, 0.0f, 2.0f, 1.0f, 0.25f, 3.0f};
    {
      const kit::report r = kit::check_stream<compressor_policy<fixed_weight_pool>>(geometry{3, 6, 1}, stream("fixed", 12, 1, input_layout::per_slot), p, o);
      REQUIRE_THAT(r, kit::conforms());
    }
  }
  SECTION("scalar gates with a slot bias, RoPE before pooling, block-end anchors") {
    stream_params p;
    p.slot_bias = uniform(rng, 2 * 5 * 1, -2.0f, 2.0f);
    {
      const kit::report r = kit::check_stream<compressor_policy<scalar_gated_pool, rope_before_pool>>(
                     geometry{2, 5, 0, anchor_mode::block_end}, stream("scalar", 12, 2, input_layout::per_branch, 4), p, o);
      REQUIRE_THAT(r, kit::conforms());
    }
  }
  SECTION("vector gates, RMSNorm, YaRN RoPE after pooling, window-centre anchors, origin 2") {
    stream_config c = stream("vector", 32, 1, input_layout::per_branch, 8);
    c.rope.yarn.enabled = true;
    c.rope.yarn.factor = 4.0;
    c.rope.yarn.original_context = 64;
    stream_params p;
    p.slot_bias = uniform(rng, 1 * 8 * 32, -1.0f, 1.0f);
    p.norm_weight = uniform(rng, 32, 0.5f, 1.5f);
    {
      const kit::report r = kit::check_stream<compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>>(
                     geometry{4, 8, 2, anchor_mode::window_centre}, c, p, o);
      REQUIRE_THAT(r, kit::conforms());
    }
  }
  SECTION("mean with RoPE before pooling and RMSNorm (half-split pairs)") {
    stream_config c = stream("mean_rope", 16, 1, input_layout::per_branch, 6);
    c.rope.layout = rope_layout::half_split;
    {
      const kit::report r = kit::check_stream<compressor_policy<mean_pool, rope_before_pool, rms_norm>>(geometry{3, 3, 1}, c, {}, o);
      REQUIRE_THAT(r, kit::conforms());
    }
  }
}

TEST_CASE("kit: storage types, GQA, an indexer and an untied window conform", "[testing][kit]") {
  using gated = stream_compressor<compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>>;
  const kit::options o = kit_options();
  const geometry g{2, 4};

  SECTION("K and V streams of two heads in bf16 and f16, four query heads, an untied f32 window, FlashMLA's lse") {
    kit::layer_under_test<mean, mean> layer = phasekv_test::split_kv_layer();
    layer.reader.lse = lse_convention::flashmla;
    {
      const kit::report r = kit::check(layer, o);
      REQUIRE_THAT(r, kit::conforms());
    }
  }
  SECTION("tied K/V in FP8 with an FP8 window, and a bf16 indexer choosing the top 3") {
    stream_config kv = stream("kv", 128, 1, input_layout::per_branch, 64), ix = stream("indexer", 32, 1, input_layout::per_branch, 16);
    ix.role = stream_role::indexer;
    cache_config cc;
    cc.name = "fp8";
    cc.page_size = 2;
    cc.stream_storage = {storage_type::fp8_e4m3_block, storage_type::bf16};
    cc.window = raw_window_config{4, 1, 128, 0, storage_type::fp8_e4m3_block, 64};
    reader_config rc;
    rc.name = "fp8.reader";
    rc.query_heads = 2;
    rc.indexer_stream = 1;
    rc.indexer_heads = 3;
    rc.top_k = 3;
    rc.precision = indexer_precision::bf16;
    rc.sink = true;
    rc.derotate_output = true;
    kit::layer_under_test<gated, gated> layer(layer_compressor<gated, gated>(gated(g, kv), gated(g, ix)), cc, rc);
    {
      const kit::report r = kit::check(layer, o);
      REQUIRE_THAT(r, kit::conforms());
    }
  }
}

TEST_CASE("kit: the DeepSeek-V4 presets conform, in fp32 and at DeepSeek-V4's precision", "[testing][kit][presets]") {
  std::mt19937 rng(11);
  const kit::options o = kit_options();
  auto params = [&](std::int64_t channels) {
    stream_params p;
    p.slot_bias = uniform(rng, static_cast<std::size_t>(8 * channels), -1.0f, 1.0f);  // W ≤ 8 here
    p.norm_weight = uniform(rng, static_cast<std::size_t>(channels), 0.5f, 1.5f);
    return p;
  };
  SECTION("CSA") {
    for (bool precision : {false, true}) {
      const stream_params kv = params(512), ix = params(128);
      {
        const kit::report r = kit::check_preset(presets::deepseek_v4_csa_layer, precision, {kv, ix}, o);
        REQUIRE_THAT(r, kit::conforms());
      }
    }
  }
  SECTION("V4.1 CSA") {
    for (bool precision : {false, true}) {
      stream_params kv = params(512), ix = params(128);
      kv.slot_bias.resize(4 * 512);
      ix.slot_bias.resize(4 * 128);
      {
        const kit::report r = kit::check_preset(presets::deepseek_v4_1_csa_layer, precision, {kv, ix}, o);
        REQUIRE_THAT(r, kit::conforms());
      }
    }
  }
  SECTION("HCA") {
    for (bool precision : {false, true}) {
      const kit::report r = kit::check_preset(presets::deepseek_v4_hca_layer, precision, {}, o);
      REQUIRE_THAT(r, kit::conforms());
    }
  }
}

TEST_CASE("kit: a report says what each property exercised", "[testing][kit][coverage]") {
  const kit::options o = kit_options();
  SECTION("DeepSeek-V4 CSA at the default sizes: its selection drops entries, the window wraps, forks share pages") {
    const kit::report r = kit::check_preset(presets::deepseek_v4_csa_layer, false, {}, o);
    INFO(r.to_string());
    REQUIRE_THAT(r, kit::conforms());
    REQUIRE_FALSE(r.selection_unexercised());
    for (kit::property p : {kit::property::streaming, kit::property::round_trips, kit::property::reads}) {
      const kit::coverage& c = r.result(p).exercised;
      CHECK(c.top_k == 512);
      CHECK(c.selecting_reads > 0);
      CHECK(c.selecting_reads <= c.reads);
      CHECK(c.most_candidates > 512);  // a read that selected had more candidates than it read
    }
    const kit::coverage& streaming = r.result(kit::property::streaming).exercised;
    CHECK(streaming.wrapped_windows > 0);  // 128-token window, history 0: sequences of 384 tokens wrap it
    CHECK(streaming.wrapped_windows <= streaming.sequences);
    const kit::coverage& trips = r.result(kit::property::round_trips).exercised;
    CHECK(trips.forks > 0);
    CHECK(trips.sharing_forks == trips.forks);  // paged_cache's fork takes no page: it shares them all
    CHECK(trips.shared_page_writes > 0);
    CHECK(r.result(kit::property::entries).exercised.reads == 0);  // the entries property reads nothing
    CHECK(r.to_string().find("selecting top_k 512 of up to") != std::string::npos);
  }
  SECTION("the ring wraps exactly when a sequence outgrows window + history") {
    kit::layer_under_test<mean> tight = small_mean_layer("tight");  // window 3, history 0 (the kit's: W + S = 6)
    kit::layer_under_test<mean> roomy = small_mean_layer("roomy");
    roomy.cache.history = 1000;
    const kit::report a = kit::check(tight, o), b = kit::check(roomy, o);
    REQUIRE_THAT(a, kit::conforms());
    REQUIRE_THAT(b, kit::conforms());
    for (kit::property p : {kit::property::streaming, kit::property::round_trips}) {
      CHECK(a.result(p).exercised.sequences > 0);
      CHECK(a.result(p).exercised.sequences == b.result(p).exercised.sequences);  // the same cases
      CHECK(b.result(p).exercised.wrapped_windows == 0);
    }
    CHECK(a.result(kit::property::streaming).exercised.wrapped_windows > 0);
    CHECK(a.result(kit::property::streaming).exercised.top_k == 0);  // no selection: nothing to flag
    CHECK_FALSE(a.selection_unexercised());
  }
  SECTION("a selection no case of the kit's can reach is flagged, not passed silently") {
    stream_config kv = stream("kv", 8), ix = stream("indexer", 8);
    ix.role = stream_role::indexer;
    cache_config cc;
    cc.name = "wide";
    cc.page_size = 4;
    reader_config rc;
    rc.name = "wide.reader";
    rc.query_heads = 2;
    rc.indexer_stream = 1;
    rc.indexer_heads = 2;
    rc.top_k = 40000;  // 2 · 40,000 tokens: beyond the kit's longest case (2^16)
    rc.precision = indexer_precision::f32;
    kit::layer_under_test<mean, mean> layer(layer_compressor<mean, mean>(mean(geometry{2, 4}, kv), mean(geometry{2, 4}, ix)),
                                            cc, rc);
    const kit::report r = kit::check(layer, o);
    INFO(r.to_string());
    REQUIRE(r.passed());
    CHECK(r.selection_unexercised());
    CHECK(r.result(kit::property::reads).exercised.selecting_reads == 0);
    CHECK(r.result(kit::property::reads).note.find("never dropped an entry") != std::string::npos);
  }
}

TEST_CASE("kit: NSA's compressor (a pooling of the host's) on models/nsa.hpp's geometry conforms", "[testing][kit][presets]") {
  std::mt19937 rng(5);
  const geometry g = presets::nsa_compressed_geometry();
  constexpr std::int64_t C = 8, D = 6;
  const std::int64_t W = g.window;
  auto position = uniform(rng, static_cast<std::size_t>(W * C), -0.1f, 0.1f), w1 = uniform(rng, static_cast<std::size_t>(D * W * C), -0.05f, 0.05f),
       b1 = uniform(rng, D, -0.01f, 0.01f), w2 = uniform(rng, static_cast<std::size_t>(C * D), -0.3f, 0.3f), b2 = uniform(rng, C, -0.01f, 0.01f);
  phasekv_examples::nsa_mlp_pool mlp(W, C, D, position, w1, b1, w2, b2);
  // NSA's compressor in double: z = [x_i + e_i] (padding slots 0), K̂ = W2·ReLU(W1·z + b1) + b2.
  kit::pooling_oracle oracle = [=](const kit::oracle_window& w) {
    std::vector<double> z(static_cast<std::size_t>(W * C), 0.0), h(D);
    for (std::int64_t k = 0; k < w.count(); ++k)
      for (std::int64_t c = 0; c < C; ++c)
        z[static_cast<std::size_t>(w.slot(k) * C + c)] = w.payload[static_cast<std::size_t>(k)][static_cast<std::size_t>(c)] + position[static_cast<std::size_t>(w.slot(k) * C + c)];
    kit::pooled_head p;
    double scale = 0.0;
    for (std::int64_t d = 0; d < D; ++d) {
      double s = b1[static_cast<std::size_t>(d)], m = std::abs(b1[static_cast<std::size_t>(d)]);
      for (std::size_t i = 0; i < z.size(); ++i) {
        s += w1[static_cast<std::size_t>(d) * z.size() + i] * z[i];
        m += std::abs(w1[static_cast<std::size_t>(d) * z.size() + i] * z[i]);
      }
      h[static_cast<std::size_t>(d)] = std::max(s, 0.0);
      scale = std::max(scale, m);
    }
    for (std::int64_t c = 0; c < C; ++c) {
      double s = b2[static_cast<std::size_t>(c)];
      for (std::int64_t d = 0; d < D; ++d) s += w2[static_cast<std::size_t>(c * D + d)] * h[static_cast<std::size_t>(d)];
      p.values.push_back(s);
    }
    p.scale = scale;
    return p;
  };
  {
    const kit::report r = kit::check_stream<compressor_policy<phasekv_examples::nsa_mlp_pool>>(g, stream("nsa", C), {}, kit_options(), mlp, oracle);
    REQUIRE_THAT(r, kit::conforms());
  }
}

TEST_CASE("kit: a planted state leak between chunks fails streaming == prefill (micro-batch split)", "[testing][kit][planted]") {
  const kit::report r = kit::check_stream<compressor_policy<phasekv_test::planted::leaky_mean_pool>>(
      geometry{2, 4}, stream("leaky", 8), {}, kit::options{}, {}, phasekv_test::planted::mean_oracle);
  require_caught(r, kit::property::streaming);
  // A leak between sequences needs two of them, appended together, and no more.
  REQUIRE(r.failure->counterexample.chunks.size() == 2);
  REQUIRE(r.failure->message.find("sequence") != std::string::npos);
}

TEST_CASE("kit: a planted off-by-one window fails the entries' oracle", "[testing][kit][planted]") {
  const kit::report r = kit::check_stream<compressor_policy<phasekv_test::planted::short_mean_pool>>(
      geometry{2, 4}, stream("short", 8), {}, kit::options{}, {}, phasekv_test::planted::mean_oracle);
  require_caught(r, kit::property::entries);
  // The first full window is entry 1 (tokens 0 … 3): four tokens, one chunk.
  REQUIRE(kit::size_of(r.failure->counterexample).tokens == 4);
  REQUIRE(r.failure->counterexample.chunks[0].size() == 1);
  REQUIRE(r.failure->message.find("entry 1") != std::string::npos);
}

TEST_CASE("kit: a planted copy-on-write hole in a host's fork fails the round trips", "[testing][kit][planted]") {
  using cache_t = paged_cache<mean>;
  kit::layer_under_test<mean> layer = small_mean_layer("lazy");
  layer.subject = [](const cache_t::layer& l, const cache_config& c) {
    return std::make_unique<phasekv_test::planted::lazy_fork_subject<cache_t>>(l, c);
  };
  const kit::report r = kit::check(layer);
  require_caught(r, kit::property::round_trips);
  // Shrunk to one operation: the parent written while its fork still shares it.
  const kit::scenario& s = r.failure->counterexample;
  REQUIRE(s.steps.size() == 1);
  REQUIRE(s.steps[0].op == kit::operation::fork_follow_fork);
  REQUIRE(s.steps[0].junk == 1);
}

TEST_CASE("kit: the same subject without the hole passes, so the hole is what the round trips see", "[testing][kit][planted]") {
  kit::layer_under_test<mean> layer = small_mean_layer("plain");
  {
    const kit::report r = kit::check(layer);
    REQUIRE_THAT(r, kit::conforms());
  }
}

TEST_CASE("kit: a report is deterministic in its seed", "[testing][kit]") {
  kit::options o;
  o.seed = 42;
  const auto run = [&] {
    return kit::check_stream<compressor_policy<phasekv_test::planted::short_mean_pool>>(
        geometry{3, 6}, stream("short", 4), {}, o, {}, phasekv_test::planted::mean_oracle);
  };
  const kit::report a = run(), b = run();
  REQUIRE(a.to_string() == b.to_string());
  REQUIRE_FALSE(a.passed());
}

TEST_CASE("kit: the shrinker returns the smallest failing scenario it can reach, never a larger one", "[testing][kit][shrink]") {
  // Fails while the sequence holds at least 7 tokens in at least 2 chunks and an operation with
  // at least 3 junk tokens: the minimum is exactly that.
  auto fails = [](const kit::scenario& s) -> std::optional<std::string> {
    bool junk = false;
    for (const kit::step& st : s.steps) junk = junk || st.junk >= 3;
    if (s.tokens(0) >= 7 && s.chunks[0].size() >= 2 && junk) return std::string("fails");
    return std::nullopt;
  };
  kit::scenario big;
  big.chunks = {{5, 1, 9, 3, 20, 2}, {4, 4}};
  big.forms = {{1, 0, 2, 3, 0, 1}, {0, 2}};
  big.steps = {{kit::operation::rollback, 3, 9}, {kit::operation::copy_over, 10, 5}, {kit::operation::keep_only, 30, 1}};
  big.pad = 5;
  big.reads = {4, 17, 39};
  REQUIRE(fails(big));
  const kit::shrunk s = kit::shrink(big, "fails", fails, 10000);
  const kit::scenario_size small = kit::size_of(s.smallest), original = kit::size_of(big);
  REQUIRE(small.no_larger_than(original));
  REQUIRE(fails(s.smallest));
  CHECK(small.tokens == 7);
  CHECK(small.chunks == 2);
  CHECK(small.sequences == 1);
  CHECK(small.operations == 1);
  CHECK(small.junk == 3);
  CHECK(small.pad == 0);
  CHECK(small.bf16_chunks == 0);
  CHECK(small.reads == 1);

  SECTION("every candidate is no larger, and smaller in some measure") {
    for (const kit::scenario& c : kit::shrink_candidates(big)) REQUIRE(kit::size_of(c).smaller_than(original));
  }
  SECTION("a budget of zero runs keeps the case as it was") {
    const kit::shrunk none = kit::shrink(big, "fails", fails, 0);
    REQUIRE(kit::size_of(none.smallest).total() == original.total());
    REQUIRE(none.runs == 0);
  }
}

TEST_CASE("kit: the kit's entry oracle agrees with tests/oracle's twin", "[testing][kit][oracle]") {
  std::mt19937 rng(3);
  const geometry g{3, 7, 2, anchor_mode::window_centre};
  const std::int64_t H = 2, C = 10, tokens = 40, branches = g.branches();
  stream_config c = stream("twin", C, H, input_layout::per_branch, 4);
  c.rope.yarn = {true, 2.0, 32, 32.0, 1.0};
  stream_params p;
  p.slot_bias = uniform(rng, static_cast<std::size_t>(H * 7 * C), -1.0f, 1.0f);
  p.norm_weight = uniform(rng, C, 0.5f, 2.0f);
  const std::vector<float> payload = uniform(rng, static_cast<std::size_t>(tokens * H * branches * C), -1.0f, 1.0f);
  const std::vector<float> logits = uniform(rng, static_cast<std::size_t>(tokens * H * branches * C), -3.0f, 3.0f);
  using policy = compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>;
  const auto mine = kit::oracle_entries<policy>(g, c, p, kit::builtin_pooling_oracle<vector_gated_pool>(p), payload.data(),
                                                logits.data(), tokens);
  const auto twin = phasekv_test::oracle_compress<policy>(g, c, p, payload, logits, tokens);
  REQUIRE(mine.size() == twin.size());
  for (std::size_t e = 0; e < mine.size(); ++e) {
    REQUIRE(mine[e].index == twin[e].index);
    REQUIRE(mine[e].anchor == twin[e].anchor);
    for (std::size_t i = 0; i < mine[e].values.size(); ++i) REQUIRE(mine[e].values[i] == Approx(twin[e].values[i]).margin(1e-12));
    for (std::size_t i = 0; i < mine[e].slot_weights.size(); ++i)
      REQUIRE(mine[e].slot_weights[i] == Approx(twin[e].slot_weights[i]).margin(1e-12));
  }
}

TEST_CASE("kit: bad options are config_errors naming the field", "[testing][kit][errors]") {
  kit::options o;
  o.cases = -1;
  REQUIRE_THROWS_WITH(o.validate(), Catch::Contains("options.cases = -1"));
  o = {};
  o.tolerance.reads = std::nan("");
  REQUIRE_THROWS_WITH(o.validate(), Catch::Contains("options.tolerance.reads"));
  o = {};
  o.max_tokens = std::int64_t{1} << 30;
  REQUIRE_THROWS_AS(kit::check_stream<compressor_policy<mean_pool>>(geometry{2, 2}, stream("m", 4), {}, o), config_error);
  // A configuration the cache cannot take: the cache's own message, before any case runs.
  REQUIRE_THROWS_WITH(kit::check_stream<compressor_policy<mean_pool>>(geometry{2, 2}, stream("m", 0), {}, {}),
                      Catch::Contains("m.channels"));
}

}  // namespace test_testing_kit
