// The conformance kit through the model front door (testing/model_subject.hpp): the layer under
// test is the one layer of a model_cache, and every append, fork, rollback, batch and snapshot the
// kit makes goes through begin/append/commit, the model's sequence table and model snapshots. The
// kit's properties — streaming equals prefill, entries against the double-precision oracle, reads
// against dense attention, round trips through forks and snapshots — then hold the front door to
// what they hold paged_cache to.

#include <catch2/catch.hpp>

#include <phasekv/phasekv.hpp>
#include <phasekv/testing/catch2.hpp>
#include <phasekv/testing/conformance.hpp>
#include <phasekv/testing/model_subject.hpp>

#include <random>

#include "../examples/pools/max_pool.hpp"
#include "support/configs.hpp"
#include "support/kit_layers.hpp"
#include "support/random_inputs.hpp"

namespace test_model_kit {

namespace {

using namespace phasekv;
namespace kit = phasekv::testing;
constexpr auto uniform = &phasekv_test::random_uniform;

stream_config stream(const char* name, std::int64_t channels, std::int64_t heads = 1, std::int64_t rope = 0) {
  return phasekv_test::rotated_stream_of(name, channels, heads, input_layout::per_branch, rope);
}

template <class... C>
kit::report through_model(kit::layer_under_test<C...> layer) {
  layer.subject = kit::model_subject_factory<C...>();
  return kit::check(layer, kit::options::from_environment());
}

}  // namespace

TEST_CASE("kit through the model front door: K and V streams in bf16 and f16, GQA, an untied window",
          "[testing][kit][model]") {
  const kit::report r = through_model(phasekv_test::split_kv_layer());
  REQUIRE_THAT(r, kit::conforms());
}

TEST_CASE("kit through the model front door: DeepSeek-V4's CSA layer at its precision", "[testing][kit][model]") {
  using csa = stream_compressor<presets::deepseek_v4_csa_policy>;
  std::mt19937 rng(19);
  const auto params = [&](std::int64_t channels) {
    stream_params p;
    p.slot_bias = uniform(rng, static_cast<std::size_t>(8 * channels), -1.0f, 1.0f);
    p.norm_weight = uniform(rng, static_cast<std::size_t>(channels), 0.5f, 1.5f);
    return p;
  };
  const presets::deepseek_layer_preset p = presets::deepseek_preset(presets::deepseek_v4_csa_layer, 1, 0, true);
  kit::layer_under_test<csa, csa> layer(
      layer_compressor<csa, csa>(csa(p.geom, p.kv, params(512)), csa(p.geom, *p.indexer, params(128))), p.cache, p.reader);
  const kit::report r = through_model(std::move(layer));
  REQUIRE_THAT(r, kit::conforms());
}

TEST_CASE("kit through the model front door: a pooling of the host's, registered by name", "[testing][kit][model]") {
  using max_stream = stream_compressor<compressor_policy<phasekv_examples::max_pool, rope_after_pool>>;
  cache_config cc;
  cc.name = "max";
  cc.page_size = 2;
  cc.window = raw_window_config{3, 1, 8, 0};
  reader_config rc;
  rc.name = "max.reader";
  rc.query_heads = 2;
  const kit::report r = through_model(
      kit::layer_under_test<max_stream>(layer_compressor<max_stream>(max_stream(geometry{2, 4}, stream("kv", 8, 1, 4))), cc, rc));
  REQUIRE_THAT(r, kit::conforms());
}

}  // namespace test_model_kit
