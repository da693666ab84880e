// DeepSeek-V4 checkpoint tensors through compress/deepseek_checkpoint.hpp reproduce DeepSeek's
// reference Compressor (tests/oracle/deepseek_compressor.hpp, a scalar twin written from its
// semantics); fed without the mapping, phasekv accepts them and computes something else.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "oracle/deepseek_compressor.hpp"
#include "support/prelude.hpp"
#include "support/message_of.hpp"
#include "support/random_inputs.hpp"
#include "phasekv/compress/deepseek_checkpoint.hpp"
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/models/deepseek_v4.hpp"

namespace test_compress_deepseek_checkpoint {

namespace {

using namespace phasekv_test::prelude;
using policy = presets::deepseek_v4_csa_policy;

// One Compressor's checkpoint tensors, random, and a sequence's hidden states.
struct checkpoint {
  std::int64_t dim = 0, tokens = 0;
  std::vector<float> x, wkv, wgate, ape, norm;
};

checkpoint random_checkpoint(std::mt19937& rng, const geometry& g, const stream_config& c, std::int64_t dim,
                             std::int64_t tokens) {
  const std::int64_t coff = g.window / g.stride, rows = coff * c.channels;
  checkpoint k;
  k.dim = dim;
  k.tokens = tokens;
  k.x = phasekv_test::random_payload(rng, static_cast<std::size_t>(tokens * dim));
  k.wkv = phasekv_test::random_payload(rng, static_cast<std::size_t>(rows * dim), 0.35f);
  k.wgate = phasekv_test::random_payload(rng, static_cast<std::size_t>(rows * dim), 0.6f);
  k.ape = phasekv_test::random_payload(rng, static_cast<std::size_t>(g.stride * rows));
  k.norm = phasekv_test::random_norm_weight(rng, static_cast<std::size_t>(c.channels));
  return k;
}

phasekv_test::deepseek_compressor_twin twin_of(const geometry& g, const stream_config& c, const checkpoint& k) {
  phasekv_test::deepseek_compressor_twin t;
  t.ratio = g.stride;
  t.head_dim = c.channels;
  t.overlap = g.window == 2 * g.stride;
  t.rope_dim = c.rope.channels;
  t.rope_base = c.rope.base;
  t.yarn.enabled = c.rope.yarn.enabled;
  t.yarn.original_seq_len = c.rope.yarn.original_context;
  t.yarn.factor = c.rope.yarn.factor;
  t.yarn.beta_fast = c.rope.yarn.beta_fast;
  t.yarn.beta_slow = c.rope.yarn.beta_slow;
  t.norm_eps = c.norm_eps;
  t.ape = k.ape;
  t.norm_weight = k.norm;
  return t;
}

// The compressor's entries for a whole sequence, appended in random chunks.
entry_buffer compress(const stream_compressor<policy>& c, const std::vector<float>& payload,
                      const std::vector<float>& logits, std::int64_t tokens, std::mt19937& rng) {
  const std::int64_t ppt = c.payload_floats_per_token(), lpt = c.logit_floats_per_token();
  REQUIRE(payload.size() == static_cast<std::size_t>(tokens * ppt));
  REQUIRE(logits.size() == static_cast<std::size_t>(tokens * lpt));
  stream_state state = c.make_state();
  entry_buffer out;
  std::uniform_int_distribution<std::int64_t> size(0, 11);
  for (std::int64_t t = 0; t < tokens;) {
    const std::int64_t n = std::min(tokens - t, size(rng));
    token_chunk chunk;
    chunk.tokens = n;
    chunk.payload = span<const float>(payload.data() + t * ppt, static_cast<std::size_t>(n * ppt));
    chunk.logits = span<const float>(logits.data() + t * lpt, static_cast<std::size_t>(n * lpt));
    c.append(state, chunk, out);
    t += n;
  }
  return out;
}

// max |phasekv − twin| over every channel of every entry (∞ for a different entry count).
double max_difference(const entry_buffer& got, const std::vector<std::vector<double>>& want, std::int64_t channels) {
  if (got.size() != want.size()) return HUGE_VAL;
  double worst = 0.0;
  for (std::size_t j = 0; j < want.size(); ++j)
    for (std::int64_t c = 0; c < channels; ++c) worst = std::max(worst, std::abs(got.values(j)[c] - want[j][c]));
  return worst;
}

double max_magnitude(const std::vector<std::vector<double>>& entries) {
  double m = 0.0;
  for (const auto& e : entries)
    for (double v : e) m = std::max(m, std::abs(v));
  return m;
}

span<const float> view(const std::vector<float>& v) { return span<const float>(v.data(), v.size()); }

// The whole round trip for one stream: checkpoint → helpers → phasekv vs the twin, and the
// tensors fed unmapped.
void check_against_twin(const geometry& g, stream_config c, std::uint32_t seed, std::int64_t tokens) {
  std::mt19937 rng(seed);
  const std::int64_t dim = 24;
  const checkpoint k = random_checkpoint(rng, g, c, dim, tokens);
  INFO(c.name << ": S=" << g.stride << " W=" << g.window << " D=" << c.channels << " tokens=" << tokens);

  deepseek::compressor_tensors tensors;
  tensors.wkv = view(k.wkv);
  tensors.wgate = view(k.wgate);
  tensors.ape = view(k.ape);
  tensors.norm_weight = view(k.norm);
  tensors.dim = dim;
  const deepseek::imported_compressor imported = deepseek::import_compressor<policy>(g, c, tensors);
  const stream_compressor<policy> mapped(g, c, imported.params);

  // The twin: DeepSeek's projections of the checkpoint's own rows, pooled DeepSeek's way.
  const std::vector<float> kv = phasekv_test::deepseek_project(k.x, k.wkv, tokens, dim);
  const std::vector<float> score = phasekv_test::deepseek_project(k.x, k.wgate, tokens, dim);
  const auto want = twin_of(g, c, k).compress(kv, score, tokens);
  REQUIRE(want.size() == static_cast<std::size_t>(tokens / g.stride));
  const double scale = std::max(1.0, max_magnitude(want));

  // (a) Projections with the reordered rows: the chunk layout directly. fp32 against double:
  // within 1e-6 of the largest entry value (entries reach ~8 here, where an fp32 ulp is 4.8e-7).
  const std::vector<float> payload = phasekv_test::deepseek_project(k.x, imported.wkv, tokens, dim);
  const std::vector<float> logits = phasekv_test::deepseek_project(k.x, imported.wgate, tokens, dim);
  const entry_buffer got = compress(mapped, payload, logits, tokens, rng);
  CHECK(max_difference(got, want, c.channels) < 1e-6 * scale);

  // (b) The checkpoint's own projections, reordered per token: the same bits.
  std::vector<float> payload_b(kv.size()), logits_b = score;
  deepseek::reorder_projected(g, c.channels, tokens, view(kv), span<float>(payload_b.data(), payload_b.size()));
  deepseek::reorder_projected(g, c.channels, span<float>(logits_b.data(), logits_b.size()));
  CHECK(payload_b == payload);
  CHECK(logits_b == logits);
  CHECK(compress(mapped, payload_b, logits_b, tokens, rng).all_values() == got.all_values());

  // Unmapped: the checkpoint's rows and ape as they come (the sizes agree, so phasekv accepts them).
  stream_params flat;
  flat.slot_bias = k.ape;
  flat.norm_weight = k.norm;
  const stream_compressor<policy> unmapped(g, c, flat);
  const double raw = max_difference(compress(unmapped, kv, score, tokens, rng), want, c.channels);
  const double rows_only = max_difference(compress(unmapped, payload, logits, tokens, rng), want, c.channels);
  const double ape_only = max_difference(compress(mapped, kv, score, tokens, rng), want, c.channels);
  INFO("unmapped " << raw << ", rows mapped but ape flat " << rows_only << ", ape mapped but rows not " << ape_only);
  if (g.window == 2 * g.stride) {
    CHECK(raw > 0.1);
    CHECK(rows_only > 0.01);
    CHECK(ape_only > 0.1);
  } else {  // no overlap: the checkpoint's layout is phasekv's
    CHECK(imported.params.slot_bias == k.ape);
    CHECK(imported.wkv == k.wkv);
    CHECK(raw < 1e-6 * scale);
  }
}

}  // namespace

TEST_CASE("deepseek: ape becomes the slot bias as overlap_transform places it", "[compress][deepseek]") {
  std::mt19937 rng(3);
  const std::int64_t D = 3;
  for (const geometry g : {geometry{4, 8}, geometry{2, 4}, geometry{1, 2}}) {
    const std::int64_t S = g.stride;
    const std::vector<float> ape = phasekv_test::random_payload(rng, static_cast<std::size_t>(S * 2 * D));
    const std::vector<float> bias = deepseek::slot_bias_from_ape(g, D, view(ape));
    REQUIRE(bias.size() == static_cast<std::size_t>(g.window * D));
    // The description, written out: slot s < S takes ape[s][0:D], slot s ≥ S ape[s−S][D:2D].
    for (std::int64_t s = 0; s < g.window; ++s)
      for (std::int64_t c = 0; c < D; ++c) {
        const float want = s < S ? ape[s * 2 * D + c] : ape[(s - S) * 2 * D + D + c];
        CHECK(bias[s * D + c] == want);
      }
  }
  // No overlap (HCA): ape is already [W][D].
  const geometry hca{4, 4};
  const std::vector<float> ape = phasekv_test::random_payload(rng, 4 * D);
  CHECK(deepseek::slot_bias_from_ape(hca, D, view(ape)) == ape);
  CHECK(deepseek::coff(presets::deepseek_v4_csa_layer.geom) == 2);
  CHECK(deepseek::coff(presets::deepseek_v4_hca_layer.geom) == 1);
  CHECK(deepseek::coff(presets::deepseek_v4_1_csa_layer.geom) == 2);
}

TEST_CASE("deepseek: reordered rows and reordered projections agree", "[compress][deepseek]") {
  std::mt19937 rng(5);
  const geometry g{4, 8};
  const std::int64_t D = 5, dim = 3, T = 7;
  const std::vector<float> w = phasekv_test::random_payload(rng, 2 * D * dim);
  const std::vector<float> rows = deepseek::projection_rows(g, D, dim, view(w));
  // Row v·D + c of the result is DeepSeek's row (v == 0 ? D : 0) + c: view 0 is the own block.
  for (std::int64_t c = 0; c < D; ++c)
    for (std::int64_t i = 0; i < dim; ++i) {
      CHECK(rows[c * dim + i] == w[(D + c) * dim + i]);
      CHECK(rows[(D + c) * dim + i] == w[c * dim + i]);
    }
  const std::vector<float> x = phasekv_test::random_payload(rng, T * dim);
  const std::vector<float> ours = phasekv_test::deepseek_project(x, rows, T, dim);
  const std::vector<float> theirs = phasekv_test::deepseek_project(x, w, T, dim);
  std::vector<float> out(theirs.size());
  deepseek::reorder_projected(g, D, T, view(theirs), span<float>(out.data(), out.size()));
  CHECK(out == ours);
  std::vector<float> in_place = theirs;
  deepseek::reorder_projected(g, D, span<float>(in_place.data(), in_place.size()));
  CHECK(in_place == ours);
  // Twice is the identity; without overlap it is the identity already.
  deepseek::reorder_projected(g, D, span<float>(in_place.data(), in_place.size()));
  CHECK(in_place == theirs);
  const geometry hca{4, 4};
  const std::vector<float> one(w.begin(), w.begin() + D * dim);
  CHECK(deepseek::projection_rows(hca, D, dim, view(one)) == one);
}

TEST_CASE("deepseek: phasekv through the helpers reproduces DeepSeek's Compressor", "[compress][deepseek]") {
  // 39 tokens: 9 CSA entries (entry 0 without a previous block) and three pending tokens.
  check_against_twin(presets::deepseek_v4_csa_layer.geom, presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer),
                     11, 39);
  check_against_twin(presets::deepseek_v4_csa_layer.geom,
                     *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer), 12, 39);
  // HCA: S = W = 128, two entries and a partial block.
  check_against_twin(presets::deepseek_v4_hca_layer.geom, presets::deepseek_kv_stream(presets::deepseek_v4_hca_layer),
                     13, 263);
  // V4.1's CSA: S = 2, W = 4.
  check_against_twin(presets::deepseek_v4_1_csa_layer.geom, presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer),
                     14, 21);
}

TEST_CASE("deepseek: shapes that do not fit are errors naming the field", "[compress][deepseek]") {
  using phasekv_test::message_of;
  const geometry g = presets::deepseek_v4_csa_layer.geom;
  const stream_config kv = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
  const std::vector<float> ape(4 * 1024, 0.0f), norm(512, 1.0f), w(1024 * 8, 0.0f), short_w(1024 * 8 - 1, 0.0f);
  deepseek::compressor_tensors t;
  t.ape = view(ape);
  t.norm_weight = view(norm);
  t.wkv = view(w);
  t.wgate = view(w);
  t.dim = 8;
  CHECK_NOTHROW(deepseek::import_compressor<policy>(g, kv, t));

  const std::vector<float> flat_hca(128 * 512, 0.0f);  // an HCA ape given to a CSA stream
  CHECK_THAT(message_of<config_error>([&] { deepseek::slot_bias_from_ape(g, 512, view(flat_hca)); }),
             Catch::StartsWith("ape.size() = 65536: must be 4096 ([ratio 4][2 × 512 channels])"));
  auto with = [&](auto change) {
    deepseek::compressor_tensors u = t;
    change(u);
    return message_of<config_error>([&] { deepseek::import_compressor<policy>(g, kv, u); });
  };
  CHECK_THAT(with([&](auto& u) { u.ape = view(flat_hca); }), Catch::StartsWith("csa.kv.ape.size() = 65536"));
  CHECK_THAT(with([&](auto& u) { u.wkv = view(short_w); }),
             Catch::StartsWith("csa.kv.wkv.size() = 8191: must be 8192 ([2 × 512 rows][dim 8])"));
  CHECK_THAT(with([&](auto& u) { u.wgate = view(short_w); }), Catch::StartsWith("csa.kv.wgate.size() = 8191"));
  CHECK_THAT(with([&](auto& u) { u.dim = 0; }), Catch::StartsWith("csa.kv.dim = 0"));
  CHECK_THAT(with([&](auto& u) { u.norm_weight = view(ape); }),
             Catch::StartsWith("csa.kv.norm_weight.size() = 4096: must be 512"));
  const std::vector<float> bad_ape = [&] {
    std::vector<float> a = ape;
    a[5] = NAN;
    return a;
  }();
  CHECK_THAT(with([&](auto& u) { u.ape = view(bad_ape); }),
             Catch::StartsWith("csa.kv.ape[0][5] = nan: must be finite"));

  stream_config two_heads = kv;
  two_heads.kv_heads = 2;
  CHECK_THAT(message_of<config_error>([&] { deepseek::import_compressor<policy>(g, two_heads, t); }),
             Catch::StartsWith("csa.kv.kv_heads = 2"));
  stream_config per_slot = kv;
  per_slot.inputs = input_layout::per_slot;
  CHECK_THAT(message_of<config_error>([&] { deepseek::import_compressor<policy>(g, per_slot, t); }),
             Catch::StartsWith("csa.kv.inputs = per_slot"));
  CHECK_THAT(message_of<config_error>([&] { deepseek::import_compressor<policy>(geometry{4, 12}, kv, t); }),
             Catch::StartsWith("geometry.window = 12"));
  CHECK_THAT(message_of<config_error>([&] { deepseek::import_compressor<policy>(geometry{4, 8, 1}, kv, t); }),
             Catch::StartsWith("geometry.origin = 1"));

  std::vector<float> rows(3 * 1024, 0.0f), out(3 * 1024, 0.0f);
  CHECK_THAT(message_of<input_error>([&] {
               deepseek::reorder_projected(g, 512, 2, view(rows), span<float>(out.data(), out.size()));
             }),
             Catch::StartsWith("in.size() = 3072: must be tokens × 1024"));
  CHECK_THAT(message_of<input_error>([&] {
               deepseek::reorder_projected(g, 512, 3, view(rows), span<float>(out.data(), 2048));
             }),
             Catch::StartsWith("out.size() = 2048"));
  CHECK_THAT(message_of<input_error>([&] {
               deepseek::reorder_projected(g, 512, 3, view(rows), span<float>(rows.data(), rows.size()));
             }),
             Catch::StartsWith("out = overlapping in"));
  CHECK_THAT(message_of<input_error>([&] { deepseek::reorder_projected(g, 512, span<float>(rows.data(), 1000)); }),
             Catch::StartsWith("rows.size() = 1000: must be a multiple of 1024"));
}

}  // namespace test_compress_deepseek_checkpoint
