// Inputs of the third adversarial probe — each pinned by a test that failed before its fix:
//
//   1. finite values that check_finite accepted and the storage then held as ±inf or NaN (FP4's
//      Hadamard transform, FP8's bf16 RoPE channels in entries and window rows, fp32 pooling that
//      overflows), and the property behind them: every finite entry or window row that
//      check_finite accepts reads back finite, in every storage type
//   2. window rows never scanned by check_finite (append, append_batch, append_entries)
//   3. a host's pooling policy: gate_channels() of 2^62, a null parameters() span (at construction
//      and at snapshot time), NaN output under check_finite
//   6. a failed append that made earlier views stale; softmax_state given a NaN or +inf LSE
//   7. (the snapshot campaign's finding) a resealed snapshot whose FP8 window row reads back as
//      ±inf: restored, it did not snapshot to what it was, and its requantized block turned NaN

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "oracle/cache_dump.hpp"
#include "oracle/snapshot_format.hpp"
#include "support/prelude.hpp"
#include "support/deepseek_layer.hpp"
#include "support/message_of.hpp"
#include "support/read_result.hpp"
#include "support/small_layers.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/read/softmax_state.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace test_reliability_third {

namespace {

using namespace phasekv_test::prelude;

constexpr float inf = std::numeric_limits<float>::infinity();

// ---- a DeepSeek-V4 CSA layer in any storage, fed host entries --------------------------------

// K/V (512 channels, the last 64 RoPE) and indexer keys (128) in `storage`, a window of 8 tokens
// in `window_precision` (FP8 keeps a key head's last 64 channels in bf16).
phasekv_test::csa_cache csa(std::vector<storage_type> storage, storage_type window_precision) {
  cache_config c = phasekv_test::csa_config("csa", 4, std::move(storage), 64, 8);
  c.window.precision = window_precision;
  c.window.rope_channels = window_precision == storage_type::fp8_e4m3_block ? 64 : 0;
  return phasekv_test::csa_cache(phasekv_test::make_csa_layer(), c);
}

append_options checked() {
  append_options o;
  o.check_finite = true;
  return o;
}

// Magnitudes around every storage type's edge: f16's 65504, the point where FP8's e4m3 blocks
// overflow on the way back (1.9375 · 2^127), bf16's last finite value, fp32's largest.
float extreme(std::mt19937& rng) {
  static const float magnitudes[] = {1.0f,   6.0e4f,  65504.0f, 65519.0f, 65520.0f, 1e5f,     1e19f,
                                     1e37f,  1e38f,   1.7e38f,  2.9e38f,  3.3e38f,  3.39e38f, 3.4e38f,
                                     std::numeric_limits<float>::max()};
  const float m = magnitudes[std::uniform_int_distribution<std::size_t>(0, std::size(magnitudes) - 1)(rng)];
  return std::uniform_int_distribution<int>(0, 1)(rng) ? m : -m;
}

// Random values in [−1, 1) with a few elements (none, one, or many) at extreme magnitudes.
std::vector<float> values_with_extremes(std::mt19937& rng, std::size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  const int kind = std::uniform_int_distribution<int>(0, 3)(rng);
  if (kind == 1) v[std::uniform_int_distribution<std::size_t>(0, n - 1)(rng)] = extreme(rng);
  if (kind == 2)
    for (int k = 0; k < 8; ++k) v[std::uniform_int_distribution<std::size_t>(0, n - 1)(rng)] = extreme(rng);
  if (kind == 3)
    for (float& x : v) x = extreme(rng);
  return v;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

TEST_CASE("reliability 3: every finite entry and window row check_finite accepts reads back finite, in every storage",
          "[reliability][cache]") {
  struct combination {
    storage_type kv, indexer, window;
  };
  const combination combinations[] = {
      {storage_type::f32, storage_type::f32, storage_type::f32},
      {storage_type::bf16, storage_type::bf16, storage_type::f32},
      {storage_type::f16, storage_type::f16, storage_type::f32},
      {storage_type::fp8_e4m3_block, storage_type::fp4_e2m1_hadamard, storage_type::fp8_e4m3_block},
  };
  std::mt19937 rng(3001);
  for (const combination& c : combinations) {
    CAPTURE(to_string(c.kv), to_string(c.window));
    auto cache = csa({c.kv, c.indexer}, c.window);
    const sequence_id seq = cache.create();
    int accepted = 0, refused = 0;
    for (int trial = 0; trial < 150; ++trial) {
      // One entry per stream (S = 4 tokens), and the window rows of those 4 tokens.
      const std::vector<float> kv = values_with_extremes(rng, 512), ix = values_with_extremes(rng, 128),
                               rows = values_with_extremes(rng, 4 * 512);
      const phasekv_test::cache_dump before = phasekv_test::dump(cache);
      try {
        cache.append_entries(seq, 4, {span<const float>(kv), span<const float>(ix)}, rows, {}, checked());
      } catch (const input_error& e) {
        ++refused;
        REQUIRE_THAT(e.what(), Contains("check_finite"));
        REQUIRE(phasekv_test::first_difference(before, phasekv_test::dump(cache)).empty());
        continue;
      }
      ++accepted;
      const i64 j = cache.entries(seq, 0) - 1;
      std::vector<float> back_kv(512), back_ix(128), row(512);
      cache.read_entry(seq, 0, j, back_kv.data());
      cache.read_entry(seq, 1, j, back_ix.data());
      REQUIRE(all_finite(back_kv));
      REQUIRE(all_finite(back_ix));
      for (i64 t = cache.tokens(seq) - 4; t < cache.tokens(seq); ++t) {
        cache.copy_window_key(seq, t, row);
        REQUIRE(all_finite(row));
      }
    }
    // Both outcomes happen where the storage's range is narrower than fp32's, so neither half of
    // the property is vacuous; fp32 storage holds every finite host value.
    CHECK(accepted > 10);
    if (c.kv == storage_type::f32) CHECK(refused == 0);
    else CHECK(refused > 10);
  }
}

TEST_CASE("reliability 3: FP4 indexer keys whose Hadamard transform overflows are refused under check_finite",
          "[reliability][cache][fp4]") {
  auto cache = csa({storage_type::fp8_e4m3_block, storage_type::fp4_e2m1_hadamard}, storage_type::f32);
  const sequence_id seq = cache.create();
  const std::vector<float> kv(512, 0.5f), rows(4 * 512, 0.25f);
  std::vector<float> ix(128, 1e38f);  // finite; C^−1/2 · Σ over 128 channels is 1.1e39 > FLT_MAX
  const phasekv_test::cache_dump before = phasekv_test::dump(cache);
  CHECK_THAT(message_of<input_error>([&] { cache.append_entries(seq, 4, {span<const float>(kv), span<const float>(ix)}, rows, {}, checked()); }),
             Contains("csa.append: stream 1 entry 0 value[0] = 1e+38: makes its head's Hadamard transform leave fp32's range"));
  CHECK(phasekv_test::first_difference(before, phasekv_test::dump(cache)).empty());
  // Unchecked, the block is stored as NaN, as documented (format/fp4.hpp).
  cache.append_entries(seq, 4, {span<const float>(kv), span<const float>(ix)}, rows);
  std::vector<float> back(128);
  cache.read_entry(seq, 1, 0, back.data());
  CHECK(std::isnan(back[0]));
}

TEST_CASE("reliability 3: FP8 RoPE channels beyond bf16's range are refused under check_finite, in entries and window rows",
          "[reliability][cache][fp8]") {
  auto cache = csa({storage_type::fp8_e4m3_block, storage_type::fp4_e2m1_hadamard}, storage_type::fp8_e4m3_block);
  const sequence_id seq = cache.create();
  std::vector<float> kv(512, 0.5f), ix(128, 0.5f), rows(4 * 512, 0.25f);
  const phasekv_test::cache_dump before = phasekv_test::dump(cache);

  kv[500] = 3.4e38f;  // a RoPE channel (the last 64), kept in bf16: rounds to +inf
  CHECK_THAT(message_of<input_error>([&] { cache.append_entries(seq, 4, {span<const float>(kv), span<const float>(ix)}, rows, {}, checked()); }),
             Contains("csa.append: stream 0 entry 0 value[500] = 3.4e+38: is not representable in fp8_e4m3_block storage"));
  CHECK(phasekv_test::first_difference(before, phasekv_test::dump(cache)).empty());

  kv[500] = 0.5f;
  rows[2 * 512 + 480] = -3.4e38f;  // token 2's key row, a RoPE channel of the FP8 window
  CHECK_THAT(message_of<input_error>([&] { cache.append_entries(seq, 4, {span<const float>(kv), span<const float>(ix)}, rows, {}, checked()); }),
             Contains("csa.append_entries: window_keys[token 2, element 480] = -3.4e+38: is not representable in the "
                      "window's fp8_e4m3_block storage"));
  CHECK(phasekv_test::first_difference(before, phasekv_test::dump(cache)).empty());

  // The same row through append() (the write path's own entries).
  std::mt19937 rng(7);
  const auto in = phasekv_test::random_tokens(cache, 4, rng, phasekv_test::csa_draw);
  CHECK_THAT(message_of<input_error>([&] { cache.append(seq, in.chunks(), rows, {}, checked()); }),
             Contains("csa.append: window_keys[token 2, element 480] = -3.4e+38"));
  CHECK(phasekv_test::first_difference(before, phasekv_test::dump(cache)).empty());
}

TEST_CASE("reliability 3: window rows are scanned by check_finite in append, append_batch and append_entries",
          "[reliability][cache]") {
  auto cache = csa({storage_type::f32, storage_type::f32}, storage_type::f32);
  const sequence_id a = cache.create(), b = cache.create();
  std::mt19937 rng(11);
  const auto in = phasekv_test::random_tokens(cache, 4, rng, phasekv_test::csa_draw);
  std::vector<float> rows(4 * 512, 0.25f), good(4 * 512, 0.25f);
  rows[3 * 512 + 7] = std::numeric_limits<float>::quiet_NaN();
  const phasekv_test::cache_dump before = phasekv_test::dump(cache);

  CHECK_THAT(message_of<input_error>([&] { cache.append(a, in.chunks(), rows, {}, checked()); }),
             Contains("csa.append: window_keys[token 3, element 7] = nan: must be finite"));
  using item = phasekv_test::csa_cache::append_item;
  const item items[] = {item{a, in.chunks(), good, {}}, item{b, in.chunks(), rows, {}}};
  CHECK_THAT(message_of<input_error>([&] { cache.append_batch(span<const item>(items, 2), default_executor(), checked()); }),
             Contains("items[1]"));
  CHECK_THAT(message_of<input_error>([&] { cache.append_batch(span<const item>(items, 2), default_executor(), checked()); }),
             Contains("window_keys[token 3, element 7] = nan"));
  const std::vector<float> kv(512, 0.5f), ix(128, 0.5f);
  CHECK_THAT(message_of<input_error>([&] { cache.append_entries(b, 4, {span<const float>(kv), span<const float>(ix)}, rows, {}, checked()); }),
             Contains("csa.append_entries: window_keys[token 3, element 7] = nan"));
  CHECK(phasekv_test::first_difference(before, phasekv_test::dump(cache)).empty());
  // Unchecked, the row is stored as given (IEEE, documented), and the good items go through.
  cache.append(a, in.chunks(), rows);
  std::vector<float> row(512);
  cache.copy_window_key(a, 3, row);
  CHECK(std::isnan(row[7]));
}

// ---- finite inputs that pool to a non-finite entry --------------------------------------------

using mean_stream = stream_compressor<compressor_policy<mean_pool>>;

stream_config kv_config(i64 channels) {
  stream_config c;
  c.name = "kv";
  c.channels = channels;
  return c;
}

TEST_CASE("reliability 3: f32 payloads whose pooled, rotated entry overflows are refused under check_finite",
          "[reliability][cache]") {
  using rotated_stream = stream_compressor<compressor_policy<mean_pool, rope_after_pool>>;
  stream_config c = kv_config(4);
  c.rope.channels = 4;
  paged_cache<rotated_stream> cache(layer_compressor<rotated_stream>(rotated_stream(geometry{2, 4}, c)),
                                    phasekv_test::cache_of("kv", 2, 8));
  const sequence_id seq = cache.create();
  // Each value is finite and so is their mean; RoPE's x·cos − y·sin of two of them is not (for
  // the entries whose anchor turns the pair by more than a few degrees).
  std::vector<float> payload(6 * 2 * 4);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = i % 2 ? -3e38f : 3e38f;
  const phasekv_test::cache_dump before = phasekv_test::dump(cache);
  CHECK_THAT(message_of<input_error>([&] { cache.append(seq, {token_chunk{6, payload, {}}}, {}, {}, checked()); }),
             Contains("is not finite although its inputs are: the built-in pooling overflowed fp32"));
  CHECK(phasekv_test::first_difference(before, phasekv_test::dump(cache)).empty());
  // Unchecked, the entry is stored as the IEEE arithmetic left it.
  cache.append(seq, {token_chunk{6, payload, {}}});
  bool non_finite = false;
  for (i64 j = 0; j < cache.entries(seq, 0); ++j) {
    std::vector<float> e(4);
    cache.read_entry(seq, 0, j, e.data());
    for (float x : e) non_finite = non_finite || !std::isfinite(x);
  }
  CHECK(non_finite);
}

// ---- a host's pooling policy ---------------------------------------------------------------------

struct huge_gates_pool {
  static constexpr const char* name = "huge_gates";
  static constexpr std::uint32_t version = 1;
  static constexpr std::int64_t gate_channels(std::int64_t) { return std::int64_t{1} << 62; }
  void pool(const window_rows&, float*) const {}
};

// Weights it reports through parameters(): set by the test, so a policy built valid can turn
// invalid before a snapshot asks again.
struct reported_weights {
  const float* data = nullptr;
  std::size_t size = 0;
};
reported_weights g_weights;

struct weighted_pool {
  static constexpr const char* name = "weighted";
  static constexpr std::uint32_t version = 1;
  static constexpr std::int64_t gate_channels(std::int64_t) { return 0; }
  span<const float> parameters() const { return {g_weights.data, g_weights.size}; }
  void pool(const window_rows& w, float* out) const {
    for (std::int64_t c = 0; c < w.channels; ++c) out[c] = w.payload[w.count() - 1][c];
  }
};

// Returns NaN for every entry after the first: the policy's own arithmetic, not its inputs.
struct nan_pool {
  static constexpr const char* name = "nan";
  static constexpr std::uint32_t version = 1;
  static constexpr std::int64_t gate_channels(std::int64_t) { return 0; }
  void pool(const window_rows& w, float* out) const {
    for (std::int64_t c = 0; c < w.channels; ++c) out[c] = w.entry == 0 ? 1.0f : std::numeric_limits<float>::quiet_NaN();
  }
};

TEST_CASE("reliability 3: a host pooling's gate_channels() beyond 2^20 is a config_error, not an overflow",
          "[reliability][compress]") {
  using huge = stream_compressor<compressor_policy<huge_gates_pool>>;
  CHECK_THAT(message_of<config_error>([] { huge(geometry{2, 4}, kv_config(4)); }),
             Contains("kv: huge_gates::gate_channels(4) = 4611686018427387904: must be at most 2^20"));
}

TEST_CASE("reliability 3: a host pooling's null parameters() span is refused at construction and at snapshot time",
          "[reliability][compress][snapshot]") {
  using weighted = stream_compressor<compressor_policy<weighted_pool>>;
  g_weights = {nullptr, 5};
  CHECK_THAT(message_of<config_error>([] { weighted(geometry{2, 2}, kv_config(4)); }),
             Contains("kv: weighted::parameters().data() = null: must not be null when the size is 5"));

  const std::vector<float> w{1.0f, 2.0f, 3.0f};
  g_weights = {w.data(), w.size()};
  paged_cache<weighted> cache(layer_compressor<weighted>(weighted(geometry{2, 2}, kv_config(4))),
                              phasekv_test::cache_of("kv", 2, 8));
  const sequence_id seq = cache.create();
  const std::vector<float> payload(4 * 4, 0.5f);
  cache.append(seq, {token_chunk{4, payload, {}}});
  const std::vector<std::byte> good = snapshot(cache, seq);
  CHECK_FALSE(good.empty());

  g_weights = {nullptr, 3};  // the policy now reports a null span: read through null before
  CHECK_THAT(message_of<input_error>([&] { snapshot(cache, seq); }),
             Contains("snapshot: weighted::parameters().data() = null: must not be null when the size is 3"));
  g_weights = {w.data(), w.size()};
  CHECK(snapshot(cache, seq) == good);
  g_weights = {};
}

TEST_CASE("reliability 3: a host pooling's NaN output is refused under check_finite", "[reliability][compress]") {
  using nans = stream_compressor<compressor_policy<nan_pool>>;
  paged_cache<nans> cache(layer_compressor<nans>(nans(geometry{2, 2}, kv_config(4))), phasekv_test::cache_of("kv", 2, 8));
  const sequence_id seq = cache.create();
  const std::vector<float> payload(4 * 4, 0.5f);
  const phasekv_test::cache_dump before = phasekv_test::dump(cache);
  CHECK_THAT(message_of<input_error>([&] { cache.append(seq, {token_chunk{4, payload, {}}}, {}, {}, checked()); }),
             Contains("kv: entry 1 value[0] = nan: is not finite although its inputs are: the nan pooling"));
  CHECK(phasekv_test::first_difference(before, phasekv_test::dump(cache)).empty());

  // The compressor alone, without a cache, refuses it too.
  nans alone(geometry{2, 2}, kv_config(4));
  stream_state state = alone.make_state();
  int seen = 0;
  CHECK_THROWS_AS(alone.append(state, token_chunk{4, payload, {}}, [&](const entry_view&) { ++seen; }, checked()),
                  input_error);
  CHECK(seen == 1);  // entry 0 reached the sink, entry 1 did not
  CHECK(state.tokens() == 0);
}

// ---- 6. views after a failed append; LSE conventions ----------------------------------------------

TEST_CASE("reliability 3: a failed append leaves earlier views readable", "[reliability][cache][views]") {
  auto cache = csa({storage_type::f32, storage_type::f32}, storage_type::f32);
  const sequence_id seq = cache.create();
  std::mt19937 rng(13);
  const auto first = phasekv_test::random_tokens(cache, 12, rng, phasekv_test::csa_draw);
  phasekv_test::append(cache, seq, first);
  sparse_reader reader(cache, phasekv_test::dsv4_reader(0, false));
  const sequence_view view = cache.view_of(seq);
  phasekv_test::request_inputs q = phasekv_test::random_csa_query(rng, 11, 1.0f);
  q.request.indexer_queries = {};  // no selection (top_k = 0)
  q.request.indexer_weights = {};
  const phasekv_test::read_result before = phasekv_test::read_one(reader, view, q.request);

  // Refused (a NaN window row under check_finite): nothing was written, so the view is not stale.
  const auto next = phasekv_test::random_tokens(cache, 4, rng, phasekv_test::csa_draw);
  std::vector<float> rows = next.window_keys;
  rows[5] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(cache.append(seq, next.chunks(), rows, {}, checked()), input_error);
  const phasekv_test::read_result after = phasekv_test::read_one(reader, view, q.request);
  CHECK(after.out == before.out);
  CHECK(after.lse == before.lse);

  // A successful append does make it stale.
  phasekv_test::append(cache, seq, next);
  CHECK_THAT(message_of<input_error>([&] { phasekv_test::read_one(reader, view, q.request); }), Contains("stale"));
}

TEST_CASE("reliability 3: softmax_state takes FlashMLA's +inf as empty and refuses a NaN LSE", "[reliability][read]") {
  const std::vector<float> out{1.0f, 2.0f, 3.0f, 4.0f}, other_out{5.0f, 6.0f, 7.0f, 8.0f};
  softmax_state a, b, empty;
  a.assign_normalised(2, 2, out.data(), std::vector<float>{0.5f, -1.0f}.data());
  b = a;
  // +inf is FlashMLA's LSE of a head that read nothing: merging it changes nothing.
  empty.assign_normalised(2, 2, other_out.data(), std::vector<float>{inf, -inf}.data());
  CHECK(empty.empty(0));
  CHECK(empty.empty(1));
  a.merge(empty);
  std::vector<float> fa(4), fb(4);
  a.finish(fa.data());
  b.finish(fb.data());
  CHECK(fa == fb);
  for (float x : fa) CHECK(std::isfinite(x));

  softmax_state kept;
  kept.assign_normalised(2, 2, out.data(), std::vector<float>{0.5f, -1.0f}.data());
  const std::vector<float> nan_lse{0.5f, std::numeric_limits<float>::quiet_NaN()};
  CHECK_THAT(message_of<input_error>([&] { kept.assign_normalised(2, 2, out.data(), nan_lse.data()); }),
             Contains("softmax_state.assign_normalised: lse[1] = nan"));
  std::vector<float> bad_out = out;
  bad_out[2] = inf;
  CHECK_THAT(message_of<input_error>([&] { kept.assign_normalised(2, 2, bad_out.data(), std::vector<float>{0.5f, -1.0f}.data()); }),
             Contains("out[1][0] = inf: must be finite where lse is finite"));
  std::vector<float> fk(4);
  kept.finish(fk.data());
  CHECK(fk == fb);  // unchanged by the refused calls
}

// The FP8 window's section of a snapshot of a 2-stream layer: its offset (docs/SNAPSHOT.md).
std::size_t window_section(const std::vector<std::byte>& snap) {
  std::size_t at = 160 + 200 * 2;
  for (std::size_t k = 0; k < 4; ++k) at += phasekv_test::get_u64(snap, phasekv_test::table_at(2) + 24 * k + 8);
  return at;
}

TEST_CASE("reliability 3: a snapshot's FP8 window row that would read back as inf is refused by restore",
          "[reliability][snapshot]") {
  using phasekv_test::precise_cache;
  auto make = [] { return precise_cache(phasekv_test::precise_layer(), phasekv_test::precise_config("cache", 24)); };
  precise_cache source = make();
  const sequence_id s = source.create();
  phasekv_test::append_tokens(source, s, 8, 3);
  const std::vector<std::byte> valid = snapshot(source, s);
  const std::size_t window = window_section(valid);
  const i64 rows = static_cast<i64>(phasekv_test::get_u64(valid, window + 8)), keys = 64;  // 56 e4m3 + 8 bf16 RoPE
  REQUIRE(rows == 3);  // window 2 + history 1
  // Element e of the key row of token 7 (the last, kept) set to v, the checksums recomputed.
  auto edited = [&](i64 element, float v) {
    std::vector<std::byte> b = valid;
    std::memcpy(b.data() + window + 16 + ((7 % rows) * keys + element) * 4, &v, 4);
    phasekv_test::reseal(b, 2);
    return b;
  };
  precise_cache destination = make();
  phasekv_test::populate(destination);
  const phasekv_test::cache_dump before = phasekv_test::dump(destination);
  const float beyond_e4m3 = -0x1.f4p+127f;  // ≥ 1.9375 · 2^127: its block's scale 2^120 times code 256
  const float beyond_bf16 = 3.4e38f;       // rounds to bf16's +inf
  for (const auto& bad : {std::tuple<i64, float, const char*>{10, beyond_e4m3, "-inf"},
                          {60, beyond_bf16, "+inf"},
                          {62, -inf, "-inf"}}) {  // a RoPE channel keeps ±inf
    const i64 element = std::get<0>(bad);  // copies: a lambda cannot capture a structured binding in C++17
    const float value = std::get<1>(bad);
    const char* sign = std::get<2>(bad);
    INFO("element " << element << " = " << value);
    CHECK_THAT(message_of<input_error>([&] { restore(destination, edited(element, value)); }),
               Contains("snapshot: raw window key row of token 7, element " + std::to_string(element)) &&
                   Contains(std::string("reads back as ") + sign + " from the window's fp8_e4m3_block storage"));
    CHECK(phasekv_test::dump(destination) == before);
  }
  // Values it can hold — a NaN or an inf in an e4m3 block (the block reads NaN, and so again after
  // a round trip), a value just below the bound — restore and snapshot to what they became.
  for (float held : {std::numeric_limits<float>::quiet_NaN(), inf, 240.0f * 0x1p120f}) {
    const sequence_id r = restore(destination, edited(10, held));
    const std::vector<std::byte> own = snapshot(destination, r);
    precise_cache fresh = make();
    CHECK(snapshot(fresh, restore(fresh, own)) == own);
    destination.free(r);
  }
}

}  // namespace

}  // namespace test_reliability_third
