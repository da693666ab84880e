// bf16 inputs to the write path (token_chunk::payload_bf16 / logits_bf16). A bf16 input means
// exactly its fp32 widening, so every entry must be bit-identical to the one the fp32 path gives
// on the widened values: for every policy, every chunking, payload and logits in either form
// independently, forms mixed across the appends of one sequence, channel counts with SIMD tails,
// slot weights, the prefetching prefill path, and through paged_cache. The pending state must be
// the same as well (the ring holds fp32 whatever the form). Malformed bf16 chunks are
// input_errors that name the field and leave the state unchanged.

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/prelude.hpp"
#include "support/configs.hpp"
#include "support/random_inputs.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/kernels/pooling.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/models/deepseek_v4.hpp"

namespace test_compress_bf16_inputs {

namespace {

using namespace phasekv_test::prelude;
using namespace phasekv_test;

stream_config make_config(std::int64_t channels, std::int64_t heads, input_layout inputs, std::int64_t rope_channels) {
  return rotated_stream_of("bf16", channels, heads, inputs, rope_channels);
}

// Inputs in both forms: bf16 bits (the fp32 draws rounded to bf16) and their exact widenings.
struct both_forms {
  std::vector<std::uint16_t> payload_bf16, logits_bf16;
  std::vector<float> payload, logits;  // widened
};

both_forms round_to_bf16(const stream_inputs& in) {
  both_forms b;
  for (float v : in.payload) b.payload_bf16.push_back(float_to_bf16(v));
  for (float v : in.logits) b.logits_bf16.push_back(float_to_bf16(v));
  for (std::uint16_t v : b.payload_bf16) b.payload.push_back(bf16_to_float(v));
  for (std::uint16_t v : b.logits_bf16) b.logits.push_back(bf16_to_float(v));
  return b;
}

// Which form each append gives its payload and logits in.
enum class forms { fp32, bf16, bf16_payload, bf16_logits, mixed };

// Tokens [t, t + n) as a chunk, payload and logits each in the form asked for.
token_chunk slice(const both_forms& in, std::int64_t ppt, std::int64_t lpt, std::int64_t t, std::int64_t n,
                  bool payload_bf16, bool logits_bf16) {
  token_chunk c;
  c.tokens = n;
  const auto count = [n](std::int64_t per_token) { return static_cast<std::size_t>(n * per_token); };
  if (payload_bf16) c.payload_bf16 = span<const std::uint16_t>(in.payload_bf16.data() + t * ppt, count(ppt));
  else c.payload = span<const float>(in.payload.data() + t * ppt, count(ppt));
  if (lpt > 0) {
    if (logits_bf16) c.logits_bf16 = span<const std::uint16_t>(in.logits_bf16.data() + t * lpt, count(lpt));
    else c.logits = span<const float>(in.logits.data() + t * lpt, count(lpt));
  }
  return c;
}

struct recorded {
  std::vector<std::int64_t> index;
  std::vector<float> values, weights;
};

bool bit_identical(const recorded& a, const recorded& b) {
  return a.index == b.index && a.values.size() == b.values.size() && a.weights.size() == b.weights.size() &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0 &&
         std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * sizeof(float)) == 0;
}

template <class Policy>
stream_params make_params(const geometry& g, const stream_config& config, std::mt19937& rng) {
  stream_params params;
  using pooling = typename Policy::pooling;
  if constexpr (is_gated_v<pooling>)
    params.slot_bias = random_bias(
        rng, static_cast<std::size_t>(config.kv_heads * g.window *
                                      (std::is_same_v<pooling, vector_gated_pool> ? config.channels : 1)));
  if constexpr (has_norm_v<Policy>) params.norm_weight = random_norm_weight(rng, static_cast<std::size_t>(config.channels));
  if constexpr (std::is_same_v<pooling, fixed_weight_pool>) params.slot_profile = random_profile(rng, g.window);
  return params;
}

template <class Policy>
void check_bf16_equals_widened(const geometry& g, const stream_config& config, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const stream_compressor<Policy> compressor(g, config, make_params<Policy>(g, config, rng));
  const std::int64_t ppt = compressor.payload_floats_per_token(), lpt = compressor.logit_floats_per_token();
  const std::int64_t tokens = 5 * g.window + 3;
  const both_forms in = round_to_bf16(random_stream_inputs(rng, tokens, ppt, lpt));

  std::ostringstream what;
  what << "S=" << g.stride << " W=" << g.window << " origin=" << g.origin << " C=" << config.channels
       << " H=" << config.kv_heads << " seed=" << seed;
  INFO(what.str());
  append_options options;
  options.slot_weights = true;

  // The chunk sizes and forms of one run; returns its entries and its final state.
  auto run = [&](const std::vector<std::int64_t>& sizes, forms f, stream_state& state) {
    recorded rec;
    std::bernoulli_distribution coin(0.5);
    std::int64_t t = 0;
    for (std::int64_t n : sizes) {
      bool pb = f == forms::bf16 || f == forms::bf16_payload, lb = f == forms::bf16 || f == forms::bf16_logits;
      if (f == forms::mixed) pb = coin(rng), lb = coin(rng);
      const token_chunk c = slice(in, ppt, lpt, t, n, pb, lb);
      compressor.append(state, c, [&](const entry_view& e) {
        rec.index.push_back(e.index);
        rec.values.insert(rec.values.end(), e.values, e.values + e.kv_heads * e.channels);
        rec.weights.insert(rec.weights.end(), e.slot_weights, e.slot_weights + e.kv_heads * e.window);
      }, options);
      t += n;
    }
    return rec;
  };

  stream_state reference_state = compressor.make_state();
  const recorded reference = run({tokens}, forms::fp32, reference_state);  // fp32 prefill of the widened values
  REQUIRE(reference.index.size() >= 4);

  std::uniform_int_distribution<std::int64_t> any(0, 2 * g.window);
  for (int chunking = 0; chunking < 4; ++chunking) {
    std::vector<std::int64_t> sizes;
    for (std::int64_t left = tokens; left > 0;) {
      std::int64_t n = chunking == 0 ? left : chunking == 1 ? 1 : chunking == 2 ? any(rng) : g.stride + 1;
      n = std::min(n, left);
      sizes.push_back(n);
      left -= n;
    }
    for (forms f : {forms::bf16, forms::bf16_payload, forms::bf16_logits, forms::mixed, forms::mixed}) {
      INFO("chunking " << chunking << " (" << sizes.size() << " chunks), forms " << static_cast<int>(f));
      stream_state state = compressor.make_state();
      const recorded rec = run(sizes, f, state);
      CHECK(bit_identical(rec, reference));
      CHECK(state == reference_state);
    }
  }
}

const geometry geometries[] = {
    geometry{1, 1, 0, anchor_mode::block_start}, geometry{4, 8, 0, anchor_mode::block_start},
    geometry{3, 7, 1, anchor_mode::window_centre}, geometry{4, 6, 3, anchor_mode::block_end},
    geometry{2, 12, 0, anchor_mode::block_start},  // more than 8 slots: the two-pass gated kernel
};

}  // namespace

TEMPLATE_TEST_CASE("bf16 inputs: entries and states are bit-identical to fp32 on the widened values",
                   "[compress][bf16_inputs]", (compressor_policy<mean_pool, no_rope, no_norm>),
                   (compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>),
                   (compressor_policy<vector_gated_pool, rope_before_pool, no_norm>),
                   (compressor_policy<scalar_gated_pool, rope_after_pool, rms_norm>),
                   (compressor_policy<scalar_gated_pool, rope_before_pool, no_norm>),
                   (compressor_policy<fixed_weight_pool, rope_before_pool, rms_norm>)) {
  std::uint32_t seed = 500;
  for (const geometry& g : geometries) {
    check_bf16_equals_widened<TestType>(g, make_config(5, 1, input_layout::per_branch, 4), seed++);
    check_bf16_equals_widened<TestType>(g, make_config(37, 3, input_layout::per_slot, 6), seed++);
    check_bf16_equals_widened<TestType>(g, make_config(72, 2, input_layout::per_branch, 8), seed++);
  }
  check_bf16_equals_widened<TestType>(geometry{4, 8, 0, anchor_mode::block_start},
                                      make_config(512, 1, input_layout::per_branch, 64), seed++);
}

// A bf16 prefill of 16 MiB or more takes the prefetching path (kernels::prefetch_min_bytes, on
// the bytes it reads), with bf16 rows to prefetch: still the fp32 result, bit for bit.
TEST_CASE("bf16 inputs: a DeepSeek-V4 CSA prefill large enough to prefetch equals the fp32 one",
          "[compress][bf16_inputs]") {
  using preset = stream_compressor<presets::deepseek_v4_csa_policy>;
  std::mt19937 rng(17);
  stream_params params;
  params.slot_bias = random_bias(rng, 8 * 512);
  params.norm_weight = random_norm_weight(rng, 512);
  const preset compressor(presets::deepseek_v4_csa_layer.geom,
                          presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer), params);
  const std::int64_t tokens = 4352;  // 4 KiB of bf16 payload and logits a token: 17 MiB
  const std::int64_t ppt = compressor.payload_floats_per_token(), lpt = compressor.logit_floats_per_token();
  REQUIRE(tokens * (ppt + lpt) * 2 >= kernels::prefetch_min_bytes);
  const both_forms in = round_to_bf16(random_stream_inputs(rng, tokens, ppt, lpt));
  auto run = [&](bool bf16) {
    std::vector<float> entries;
    stream_state s = compressor.make_state();
    compressor.append(s, slice(in, ppt, lpt, 0, tokens, bf16, bf16), [&](const entry_view& e) {
      entries.insert(entries.end(), e.values, e.values + compressor.floats_per_entry());
    });
    return entries;
  };
  const std::vector<float> wide = run(false), narrow = run(true);
  REQUIRE(wide.size() == static_cast<std::size_t>((tokens / 4) * compressor.floats_per_entry()));
  REQUIRE(narrow.size() == wide.size());
  CHECK(std::memcmp(wide.data(), narrow.data(), wide.size() * sizeof(float)) == 0);
}

TEST_CASE("bf16 inputs: malformed chunks name the field and change nothing", "[compress][bf16_inputs]") {
  using policy = compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>;
  const geometry g{4, 8, 0, anchor_mode::block_start};
  const stream_compressor<policy> compressor(g, make_config(8, 2, input_layout::per_branch, 4));
  const std::int64_t ppt = compressor.payload_floats_per_token(), lpt = compressor.logit_floats_per_token();
  std::mt19937 rng(5);
  both_forms in = round_to_bf16(random_stream_inputs(rng, 12, ppt, lpt));
  stream_state state = compressor.make_state();
  compressor.append(state, slice(in, ppt, lpt, 0, 6, true, true), entry_buffer{});
  const stream_state before = state;
  entry_buffer sink;
  auto rejects = [&](const token_chunk& c, const std::string& field, append_options options = {}) {
    CHECK_THROWS_WITH(compressor.append(state, c, sink, options), Contains(field));
    CHECK_THROWS_AS(compressor.check(state, c, options), input_error);
    CHECK(state == before);
    CHECK(sink.size() == 0);
  };

  token_chunk both = slice(in, ppt, lpt, 6, 6, true, true);
  both.payload = span<const float>(in.payload.data() + 6 * ppt, static_cast<std::size_t>(6 * ppt));
  rejects(both, "bf16: chunk.payload_bf16.size() = " + std::to_string(6 * ppt));
  both = slice(in, ppt, lpt, 6, 6, true, true);
  both.logits = span<const float>(in.logits.data() + 6 * lpt, static_cast<std::size_t>(6 * lpt));
  rejects(both, "bf16: chunk.logits_bf16.size() = " + std::to_string(6 * lpt));

  token_chunk short_payload = slice(in, ppt, lpt, 6, 6, true, true);
  short_payload.payload_bf16 = span<const std::uint16_t>(in.payload_bf16.data() + 6 * ppt, static_cast<std::size_t>(5 * ppt));
  rejects(short_payload, "bf16: chunk.payload_bf16.size() = " + std::to_string(5 * ppt));
  token_chunk long_logits = slice(in, ppt, lpt, 5, 6, false, true);
  long_logits.logits_bf16 = span<const std::uint16_t>(in.logits_bf16.data() + 5 * lpt, static_cast<std::size_t>(7 * lpt));
  rejects(long_logits, "bf16: chunk.logits_bf16.size() = " + std::to_string(7 * lpt));
  token_chunk null_data = slice(in, ppt, lpt, 6, 6, true, true);
  null_data.payload_bf16 = span<const std::uint16_t>(nullptr, 3);
  rejects(null_data, "bf16: chunk.payload_bf16.data()");

  // NaN and ±Inf in bf16 (exponent bits all ones), with check_finite on.
  append_options finite;
  finite.check_finite = true;
  for (std::uint16_t bad : {std::uint16_t{0x7FC0}, std::uint16_t{0x7F80}, std::uint16_t{0xFF80}, std::uint16_t{0xFF81}}) {
    both_forms poisoned = in;
    poisoned.payload_bf16[static_cast<std::size_t>(7 * ppt + 3)] = bad;
    rejects(slice(poisoned, ppt, lpt, 6, 6, true, true), "bf16: chunk.payload_bf16[token 1, element 3]", finite);
    poisoned = in;
    poisoned.logits_bf16[static_cast<std::size_t>(8 * lpt + 2)] = bad;
    rejects(slice(poisoned, ppt, lpt, 6, 6, true, true), "bf16: chunk.logits_bf16[token 2, element 2]", finite);
  }
  // The largest finite bf16 passes.
  both_forms largest = in;
  largest.payload_bf16[static_cast<std::size_t>(7 * ppt)] = 0x7F7F;
  CHECK_NOTHROW(compressor.check(state, slice(largest, ppt, lpt, 6, 6, true, true), finite));

  // A policy without gates takes no logits in either form.
  const stream_compressor<compressor_policy<mean_pool>> mean(g, make_config(8, 2, input_layout::per_branch, 4));
  stream_state ms = mean.make_state();
  token_chunk with_logits = slice(in, mean.payload_floats_per_token(), 0, 0, 6, true, false);
  with_logits.logits_bf16 = span<const std::uint16_t>(in.logits_bf16.data(), 4);
  CHECK_THROWS_WITH(mean.append(ms, with_logits, sink), Contains("bf16: chunk.logits_bf16.size() = 4"));
  CHECK(ms.tokens() == 0);
}

// Through the cache: one sequence appended with bf16 chunks (in several appends, forms mixed),
// another with the fp32 widenings in one prefill, hold the same entries bit for bit.
TEST_CASE("bf16 inputs: paged_cache stores the entries of the widened fp32 inputs", "[compress][bf16_inputs][cache]") {
  using key_stream = stream_compressor<compressor_policy<mean_pool>>;
  using value_stream = stream_compressor<compressor_policy<vector_gated_pool, no_rope, rms_norm>>;
  using cache_type = paged_cache<key_stream, value_stream>;
  const geometry g{4, 8};
  std::mt19937 rng(9);
  stream_config kc = make_config(19, 2, input_layout::per_branch, 0);
  kc.name = "keys";
  kc.role = stream_role::key;
  stream_config vc = make_config(21, 2, input_layout::per_slot, 0);
  vc.name = "values";
  vc.role = stream_role::value;
  stream_params vp;
  vp.slot_bias = random_bias(rng, static_cast<std::size_t>(2 * 8 * 21));
  vp.norm_weight = random_norm_weight(rng, 21);
  const key_stream keys(g, kc);
  const value_stream values(g, vc, vp);
  cache_config config;
  config.name = "cache";
  config.page_size = 4;
  config.pages = 64;
  cache_type cache(layer_compressor<key_stream, value_stream>(keys, values), config);

  const std::int64_t tokens = 61;
  const std::int64_t kpt = keys.payload_floats_per_token(), vpt = values.payload_floats_per_token();
  const std::int64_t lpt = values.logit_floats_per_token();
  const both_forms k = round_to_bf16(random_stream_inputs(rng, tokens, kpt, 0));
  const both_forms v = round_to_bf16(random_stream_inputs(rng, tokens, vpt, lpt));

  const sequence_id wide = cache.create(), narrow = cache.create();
  cache.append(wide, {slice(k, kpt, 0, 0, tokens, false, false), slice(v, vpt, lpt, 0, tokens, false, false)});
  std::int64_t t = 0;
  int step = 0;
  for (std::int64_t n : {1, 6, 13, 2, 30, 9}) {
    const bool b = step++ % 3 != 2;  // every third append in fp32
    cache.append(narrow, {slice(k, kpt, 0, t, n, b, false), slice(v, vpt, lpt, t, n, b, !b || step == 2)});
    t += n;
  }
  REQUIRE(t == tokens);
  REQUIRE(cache.entries(narrow, 0) == cache.entries(wide, 0));
  REQUIRE(cache.entries(wide, 0) >= 10);
  for (std::size_t stream = 0; stream < 2; ++stream) {
    const std::int64_t floats = stream == 0 ? keys.floats_per_entry() : values.floats_per_entry();
    std::vector<float> a(static_cast<std::size_t>(floats)), b(a.size());
    for (std::int64_t j = 0; j < cache.entries(wide, stream); ++j) {
      cache.read_entry(wide, stream, j, a.data());
      cache.read_entry(narrow, stream, j, b.data());
      INFO("stream " << stream << " entry " << j);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
  }

  // A malformed bf16 chunk is rejected by the cache before anything changes.
  const std::int64_t before = cache.entries(narrow, 0);
  token_chunk bad = slice(k, kpt, 0, 0, 4, true, false);
  bad.payload = span<const float>(k.payload.data(), static_cast<std::size_t>(4 * kpt));
  CHECK_THROWS_AS(cache.append(narrow, {bad, slice(v, vpt, lpt, 0, 4, true, true)}), input_error);
  CHECK(cache.entries(narrow, 0) == before);
}

}  // namespace test_compress_bf16_inputs
