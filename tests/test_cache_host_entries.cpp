// Entries the host computed (paged_cache::append_entries) and the raw bytes of stored entries:
//
//   - stored exactly as the write path stores its own: the fp32 entries of an f32 twin handed to
//     append_entries give the very bytes a cache fed through its compressor holds — FP8 entries,
//     FP4 indexer keys and the FP8 window of DeepSeek-V4's precision cache, bf16 and f16 — and
//     reads of the two caches agree bit for bit;
//   - the continuation rule: append() after host entries only where no entry pools a skipped
//     token (W = S at an entry boundary), then equal to a cache fed through the compressor;
//   - rollback: a host-fed sequence rolls back to any length its raw window allows (it had no
//     compressor inputs to lose), equal to one fed only that far, and goes on either way;
//   - snapshots of a host-fed sequence restore to the same bytes and the same rule;
//   - bad entries and a full pool: errors naming the field, the cache unchanged.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/prelude.hpp"
#include "support/deepseek_layer.hpp"
#include "support/message_of.hpp"
#include "support/random_inputs.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/read/sparse_reader.hpp"
#include "support/read_world.hpp"

namespace test_cache_host_entries {

namespace {

using namespace phasekv_test::prelude;
using namespace phasekv_test::read_support;
using phasekv_test::csa_cache;

// Entries [first, first + count) of every stream of `cache` as fp32, concatenated per stream.
template <class Cache>
std::vector<std::vector<float>> entries_of(const Cache& cache, sequence_id seq, i64 first, i64 count) {
  std::vector<std::vector<float>> out(Cache::stream_count);
  for (std::size_t k = 0; k < Cache::stream_count; ++k) {
    const stream_config& c = cache.compressors().config(k);
    for (i64 j = first; j < first + count; ++j) {
      const auto e = entry_of(cache, seq, k, j, c.kv_heads * c.channels);
      out[k].insert(out[k].end(), e.begin(), e.end());
    }
  }
  return out;
}

template <class Cache>
std::vector<std::byte> bytes_of(const Cache& cache, sequence_id seq, std::size_t k, i64 j) {
  const span<const std::byte> b = cache.entry_bytes(seq, k, j);
  return std::vector<std::byte>(b.begin(), b.end());
}

// The same tokens, entries (byte for byte) and raw window rows; with `same_window_first` false a
// sequence may hold older rows than the other (one rolled back), and the rows both hold must agree.
template <class Cache>
bool same_stored(const Cache& a, sequence_id sa, const Cache& b, sequence_id sb, bool same_window_first = true) {
  if (a.tokens(sa) != b.tokens(sb)) return false;
  if (same_window_first && a.window_first(sa) != b.window_first(sb)) return false;
  const i64 keys = a.config().window.kv_heads * a.config().window.key_channels;
  std::vector<float> ra(sz(keys)), rb(sz(keys));
  for (i64 t = std::max(a.window_first(sa), b.window_first(sb)); t < a.tokens(sa); ++t) {
    a.copy_window_key(sa, t, span<float>(ra));
    b.copy_window_key(sb, t, span<float>(rb));
    if (ra != rb) return false;
  }
  for (std::size_t k = 0; k < Cache::stream_count; ++k) {
    if (a.entries(sa, k) != b.entries(sb, k)) return false;
    for (i64 j = 0; j < a.entries(sa, k); ++j)
      if (bytes_of(a, sa, k, j) != bytes_of(b, sb, k, j)) return false;
  }
  return true;
}

// DeepSeek-V4 CSA, fed through its compressor (a), and by the host (b) with the entries an f32
// twin (t) pooled from the same tokens: chunk by chunk, each chunk's entries from the twin.
struct csa_trio {
  csa_cache::layer layer = phasekv_test::make_csa_layer();
  csa_cache a, b, t;
  sequence_id sa, sb, st;
  explicit csa_trio(const cache_config& stored)
      : a(layer, stored), b(layer, stored), t(layer, phasekv_test::csa_config("twin", 64, {storage_type::f32, storage_type::f32})),
        sa(a.create()), sb(b.create()), st(t.create()) {}

  void append(i64 tokens, std::mt19937& rng) {
    const i64 views = presets::deepseek_v4_csa_layer.geom.branches();
    const auto kv = phasekv_test::random_uniform(rng, sz(tokens * views * 512), -1.0f, 1.0f);
    const auto kv_logits = phasekv_test::random_uniform(rng, sz(tokens * views * 512), -2.0f, 2.0f);
    const auto ix = phasekv_test::random_uniform(rng, sz(tokens * views * 128), -1.0f, 1.0f);
    const auto ix_logits = phasekv_test::random_uniform(rng, sz(tokens * views * 128), -2.0f, 2.0f);
    const auto window = phasekv_test::random_uniform(rng, sz(tokens * 512), -1.0f, 1.0f);
    const csa_cache::chunks in = {token_chunk{tokens, kv, kv_logits}, token_chunk{tokens, ix, ix_logits}};
    const i64 first = t.entries(st, 0);
    a.append(sa, in, window);
    t.append(st, in, window);
    const auto pooled = entries_of(t, st, first, t.entries(st, 0) - first);
    REQUIRE(b.entries_after(sb, tokens) == t.entries(st, 0) - first);
    b.append_entries(sb, tokens, {span<const float>(pooled[0]), span<const float>(pooled[1])}, window);
  }
};

TEST_CASE("append_entries: host entries are stored as the write path stores them, FP8/FP4 included",
          "[cache][host_entries]") {
  for (const bool precision : {true, false}) {
    INFO((precision ? "DeepSeek-V4 precision cache (FP8 entries, FP4 indexer, FP8 window)" : "bf16 K/V, f16 indexer"));
    const cache_config stored = precision
                                    ? presets::deepseek_cache(presets::deepseek_v4_csa_layer, 40, 0, true)
                                    : phasekv_test::csa_config("half", 64, {storage_type::bf16, storage_type::f16});
    csa_trio trio(stored);
    std::mt19937 rng(precision ? 11 : 12);
    for (const i64 n : {301, 1, 2, 397}) trio.append(n, rng);
    REQUIRE(trio.a.entries(trio.sa, 0) == 175);
    CHECK(same_stored(trio.a, trio.sa, trio.b, trio.sb));
    for (i64 t = trio.a.tokens(trio.sa) - 4; t < trio.a.tokens(trio.sa); ++t) {
      if (precision) {
        CHECK(std::memcmp(trio.a.window_key_bytes(trio.sa, t), trio.b.window_key_bytes(trio.sb, t), 584) == 0);
      } else {
        CHECK(std::memcmp(trio.a.window_key(trio.sa, t), trio.b.window_key(trio.sb, t), 512 * sizeof(float)) == 0);
      }
    }
    // The entry's bytes are the pool's: an FP8 head of 584 bytes, an FP4 key of 68.
    CHECK(trio.a.entry_bytes(trio.sa, 0, 0).size() == sz(trio.a.pool(0).layout().entry_stride_bytes));
    if (precision) CHECK(trio.a.entry_bytes(trio.sa, 1, 0).size() == 68u);
    // Reads of both caches: the same bits.
    reader_config rc = precision ? presets::deepseek_reader(presets::deepseek_v4_csa_layer, true)
                                 : presets::deepseek_reader(presets::deepseek_v4_csa_layer);
    rc.top_k = 32;
    if (!precision) rc.precision = indexer_precision::f32;
    sparse_reader ra(trio.a, rc), rb(trio.b, rc);
    const phasekv_test::request_inputs in = phasekv_test::random_csa_query(rng, trio.a.tokens(trio.sa) - 1, 0.05f);
    std::vector<float> oa(sz(ra.output_floats())), ob(oa.size());
    ra.read(trio.a, trio.sa, in.request, oa.data());
    rb.read(trio.b, trio.sb, in.request, ob.data());
    CHECK(std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)) == 0);
    // The compressor cannot continue the host's sequence (W = 8 > S = 4: its next entry pools
    // tokens whose inputs it never saw); the host can.
    const std::vector<float> kv(4 * 2 * 512, 0.25f), ix(4 * 2 * 128, 0.25f), logits(4 * 2 * 512, 0.0f), ixl(4 * 2 * 128, 0.0f);
    const csa_cache::chunks more = {token_chunk{4, kv, logits}, token_chunk{4, ix, ixl}};
    const std::vector<float> window(4 * 512, 0.5f);
    const std::vector<std::byte> before = bytes_of(trio.b, trio.sb, 0, 174);
    CHECK_THROWS_WITH(trio.b.append(trio.sb, more, window), Contains("does not hold the inputs of tokens [696, 701)") &&
                                                              Contains("continue with host-computed entries"));
    CHECK(trio.b.tokens(trio.sb) == 701);
    CHECK(bytes_of(trio.b, trio.sb, 0, 174) == before);
    trio.append(7, rng);
    CHECK(same_stored(trio.a, trio.sa, trio.b, trio.sb));
  }
}

// One mean-pooled tied K/V stream with S = W (no overlap): the compressor can take over.
using mean_cache = paged_cache<mean_stream>;

mean_cache make_mean(i64 stride, i64 window, i64 pages = 16, i64 history = 0, i64 window_tokens = 4) {
  cache_config cc;
  cc.name = "mean";
  cc.history = history;
  cc.page_size = 3;
  cc.pages = pages;
  cc.window = raw_window_config{window_tokens, 1, 8, 0};
  return mean_cache(layer_compressor<mean_stream>(mean_stream(geometry{stride, window},
                                                              make_stream("kv", stream_role::key_value, 1, 8))),
                    cc);
}

TEST_CASE("append_entries: with W = S the compressor continues at an entry boundary, not inside an entry",
          "[cache][host_entries]") {
  std::mt19937 rng(21);
  mean_cache fed = make_mean(4, 4), host = make_mean(4, 4);
  const sequence_id sf = fed.create(), sh = host.create();
  const auto x = uniform(rng, 40 * 8, -1.0f, 1.0f), w = uniform(rng, 40 * 8, -1.0f, 1.0f);
  auto tokens = [&](i64 first, i64 n) { return span<const float>(x.data() + first * 8, sz(n * 8)); };
  auto rows = [&](i64 first, i64 n) { return span<const float>(w.data() + first * 8, sz(n * 8)); };
  fed.append(sf, {token_chunk{16, tokens(0, 16), {}}}, rows(0, 16));
  const auto pooled = entries_of(fed, sf, 0, 4);
  CHECK(host.append_entries(sh, 16, {span<const float>(pooled[0])}, rows(0, 16)) == 4);
  // 16 tokens: a boundary; entry 4 pools tokens 16 … 19 only.
  fed.append(sf, {token_chunk{10, tokens(16, 10), {}}}, rows(16, 10));
  host.append(sh, {token_chunk{10, tokens(16, 10), {}}}, rows(16, 10));
  CHECK(same_stored(fed, sf, host, sh));
  // 26 tokens: inside entry 6 — its first tokens 24, 25 were the compressor's, so it goes on.
  fed.append(sf, {token_chunk{2, tokens(26, 2), {}}}, rows(26, 2));
  host.append(sh, {token_chunk{2, tokens(26, 2), {}}}, rows(26, 2));
  CHECK(same_stored(fed, sf, host, sh));
  // Host entries ending inside an entry: 2 tokens of entry 7 the compressor never saw.
  const std::vector<float> none;
  CHECK(host.append_entries(sh, 2, {span<const float>(none)}, rows(28, 2)) == 0);
  CHECK_THROWS_WITH(host.append(sh, {token_chunk{2, tokens(30, 2), {}}}, rows(30, 2)),
                    Contains("does not hold the inputs of tokens [28, 30)"));
  const std::vector<float> seventh(8, 0.125f);
  CHECK(host.append_entries(sh, 2, {span<const float>(seventh)}, rows(30, 2)) == 1);
  std::vector<float> got(8);
  host.read_entry(sh, 0, 7, got.data());
  CHECK(got == seventh);
  // W > S: never inside the window of a host entry.
  mean_cache overlap = make_mean(2, 4);
  const sequence_id so = overlap.create();
  const std::vector<float> two(2 * 8, 0.5f);  // 4 tokens complete entries 0 and 1 (lead 2)
  REQUIRE(overlap.entries_after(so, 4) == 2);
  overlap.append_entries(so, 4, {span<const float>(two)}, rows(0, 4));
  const std::vector<float> branches(2 * 2 * 8, 0.25f);  // W = 2S: two views per token
  CHECK_THROWS_WITH(overlap.append(so, {token_chunk{2, branches, {}}}, rows(4, 2)),
                    Contains("does not hold the inputs of tokens [2, 4)"));
}

TEST_CASE("append_entries: a host-fed sequence rolls back as far as its raw window allows", "[cache][host_entries]") {
  std::mt19937 rng(23);
  const auto x = uniform(rng, 40 * 8, -1.0f, 1.0f), w = uniform(rng, 40 * 8, -1.0f, 1.0f);
  auto tokens = [&](i64 first, i64 n) { return span<const float>(x.data() + first * 8, sz(n * 8)); };
  auto rows = [&](i64 first, i64 n) { return span<const float>(w.data() + first * 8, sz(n * 8)); };
  mean_cache fed = make_mean(4, 4, 16, 8), host = make_mean(4, 4, 16, 8);
  const sequence_id sf = fed.create(), sh = host.create();
  fed.append(sf, {token_chunk{24, tokens(0, 24), {}}}, rows(0, 24));
  const auto pooled = entries_of(fed, sf, 0, 6);
  host.append_entries(sh, 24, {span<const float>(pooled[0])}, rows(0, 24));
  // To an entry boundary: equal to the compressor-fed twin rolled back alike, and both go on with
  // the compressor.
  REQUIRE(host.can_remove_suffix(sh, 16));
  host.remove_suffix(sh, 16);
  fed.remove_suffix(sf, 16);
  CHECK(same_stored(fed, sf, host, sh));
  fed.append(sf, {token_chunk{10, tokens(16, 10), {}}}, rows(16, 10));
  host.append(sh, {token_chunk{10, tokens(16, 10), {}}}, rows(16, 10));
  CHECK(same_stored(fed, sf, host, sh));
  // Fed by the compressor again, the sequence keeps W + history tokens of inputs, as any other.
  CHECK_FALSE(host.can_remove_suffix(sh, 14));
  CHECK_THROWS_WITH(host.remove_suffix(sh, 14), Contains("the compressor inputs needed to continue are gone"));
  CHECK(host.tokens(sh) == 26);

  // Inside an entry: equal to a host-fed twin that stopped there, and it goes on with host entries.
  mean_cache a = make_mean(2, 4, 16, 8), b = make_mean(2, 4, 16, 8);
  const sequence_id sa = a.create(), sb = b.create();
  const auto e = uniform(rng, 16 * 8, -1.0f, 1.0f);
  auto host_entries = [&](i64 first, i64 n) { return span<const float>(e.data() + first * 8, sz(n * 8)); };
  REQUIRE(a.entries_after(sa, 20) == 10);  // S = 2, W = 4: entries 0 … 9 (the first with a pad)
  REQUIRE(b.entries_after(sb, 13) == 6);
  a.append_entries(sa, 20, {host_entries(0, 10)}, rows(0, 20));
  b.append_entries(sb, 13, {host_entries(0, 6)}, rows(0, 13));
  a.remove_suffix(sa, 13);
  CHECK(same_stored(a, sa, b, sb, false));
  CHECK(a.append_entries(sa, 5, {host_entries(6, 3)}, rows(13, 5)) == 3);
  CHECK(b.append_entries(sb, 5, {host_entries(6, 3)}, rows(13, 5)) == 3);
  CHECK(same_stored(a, sa, b, sb, false));

  // Without history the raw window bounds it: the error says so, and nothing changes.
  mean_cache c = make_mean(4, 4);
  const sequence_id sc = c.create();
  c.append_entries(sc, 24, {span<const float>(pooled[0])}, rows(0, 24));
  CHECK_FALSE(c.can_remove_suffix(sc, 20));
  CHECK_THROWS_WITH(c.remove_suffix(sc, 20),
                    "mean.remove_suffix(p0) = 20: rolls back further than the kept history allows (tokens = 24, history "
                    "= 0): the raw window rows of tokens from 16 are gone (the window keeps tokens from 20)");
  CHECK(c.tokens(sc) == 24);
  CHECK(c.entries(sc, 0) == 6);
  c.remove_suffix(sc, 24);
}

TEST_CASE("remove_suffix: a compressor-fed sequence rolled back to no inputs is not host-fed", "[cache][host_entries]") {
  // S = W = 4, no raw window, no history: the state keeps 4 tokens' inputs. Rolled back to the
  // boundary 20 it keeps none (its next entry needs none) — as a host-fed state — yet a further
  // rollback stays refused, as it is straight from 40 tokens: the rule does not depend on the path,
  // and it survives a snapshot.
  std::mt19937 rng(29);
  const auto x = uniform(rng, 40 * 8, -1.0f, 1.0f), e = uniform(rng, 10 * 8, -1.0f, 1.0f);
  auto tokens = [&](i64 first, i64 n) { return span<const float>(x.data() + first * 8, sz(n * 8)); };
  mean_cache fed = make_mean(4, 4, 16, 0, 0), host = make_mean(4, 4, 16, 0, 0);
  const sequence_id sf = fed.create(), sh = host.create();
  fed.append(sf, {token_chunk{40, tokens(0, 40), {}}}, {});
  host.append_entries(sh, 40, {span<const float>(e)}, {});
  CHECK_FALSE(fed.can_remove_suffix(sf, 18));
  fed.remove_suffix(sf, 20);
  CHECK_FALSE(fed.can_remove_suffix(sf, 18));
  CHECK_THROWS_WITH(fed.remove_suffix(sf, 18), Contains("the compressor inputs needed to continue are gone"));
  CHECK(fed.tokens(sf) == 20);
  host.remove_suffix(sh, 20);
  CHECK(host.can_remove_suffix(sh, 18));
  // Through a snapshot: the restored sequences keep their rules.
  mean_cache other = make_mean(4, 4, 16, 0, 0);
  const sequence_id rf = restore(other, span<const std::byte>(snapshot(fed, sf)));
  const sequence_id rh = restore(other, span<const std::byte>(snapshot(host, sh)));
  CHECK_FALSE(other.can_remove_suffix(rf, 18));
  CHECK(other.can_remove_suffix(rh, 18));
  // Both go on with the compressor from the boundary, as a sequence fed only that far.
  mean_cache twin = make_mean(4, 4, 16, 0, 0);
  const sequence_id st = twin.create();
  twin.append(st, {token_chunk{26, tokens(0, 26), {}}}, {});
  fed.append(sf, {token_chunk{6, tokens(20, 6), {}}}, {});
  CHECK(same_stored(fed, sf, twin, st));
  // A rollback to 0 leaves a fresh sequence: it rolls back no further than one.
  host.remove_suffix(sh, 0);
  host.append(sh, {token_chunk{26, tokens(0, 26), {}}}, {});
  CHECK(same_stored(host, sh, twin, st));
  CHECK_FALSE(host.can_remove_suffix(sh, 18));
}

TEST_CASE("append_entries: a host-fed sequence snapshots and restores as it is", "[cache][host_entries][snapshot]") {
  csa_trio trio(presets::deepseek_cache(presets::deepseek_v4_csa_layer, 40, 0, true));
  std::mt19937 rng(31);
  for (const i64 n : {133, 70}) trio.append(n, rng);
  const std::vector<std::byte> bytes = snapshot(trio.b, trio.sb);
  csa_cache other(trio.layer, presets::deepseek_cache(presets::deepseek_v4_csa_layer, 40, 0, true));
  const sequence_id back = restore(other, span<const std::byte>(bytes));
  CHECK(same_stored(trio.b, trio.sb, other, back));
  CHECK(snapshot(other, back) == bytes);
  const std::vector<float> kv(4 * 2 * 512, 0.25f), ix(4 * 2 * 128, 0.25f), zeros(4 * 2 * 512, 0.0f), ixl(4 * 2 * 128, 0.0f);
  CHECK_THROWS_WITH(other.append(back, {token_chunk{4, kv, zeros}, token_chunk{4, ix, ixl}}, std::vector<float>(4 * 512, 0.5f)),
                    Contains("continue with host-computed entries"));
}

TEST_CASE("append_entries: bad entries and a full pool are errors that change nothing", "[cache][host_entries][errors]") {
  std::mt19937 rng(41);
  cache_config cc;
  cc.name = "half";
  cc.page_size = 2;
  cc.pages = 3;
  cc.storage = storage_type::bf16;
  cc.window = raw_window_config{4, 1, 8, 0};
  mean_cache cache(layer_compressor<mean_stream>(mean_stream(geometry{4, 4}, make_stream("kv", stream_role::key_value, 1, 8))), cc);
  const sequence_id seq = cache.create();
  const auto w = uniform(rng, 64 * 8, -1.0f, 1.0f);
  auto rows = [&](i64 n) { return span<const float>(w.data(), sz(n * 8)); };
  std::vector<float> two = uniform(rng, 2 * 8, -1.0f, 1.0f);
  cache.append_entries(seq, 8, {span<const float>(two)}, rows(8));
  const std::vector<std::byte> first = bytes_of(cache, seq, 0, 1);
  const i64 used = cache.pool(0).used_pages();
  auto unchanged = [&] {
    CHECK(cache.tokens(seq) == 8);
    CHECK(cache.entries(seq, 0) == 2);
    CHECK(cache.pool(0).used_pages() == used);
    CHECK(bytes_of(cache, seq, 0, 1) == first);
  };
  std::vector<float> three = uniform(rng, 3 * 8, -1.0f, 1.0f);
  CHECK_THROWS_WITH(cache.append_entries(seq, 8, {span<const float>(three)}, rows(8)),
                    "half.append_entries: entries[0].size() = 24: must be the 2 entries these tokens complete × kv_heads × "
                    "channels = 2 × 8");
  unchanged();
  CHECK_THROWS_WITH(cache.append_entries(seq, 8, {span<const float>(two)}, rows(7)), Contains("window_keys"));
  unchanged();
  CHECK_THROWS_WITH(cache.append_entries(seq, -1, {span<const float>()}, rows(0)), Contains("half: history") ||
                    Contains("tokens = -1"));
  unchanged();
  two[3] = std::numeric_limits<float>::quiet_NaN();
  append_options checked;
  checked.check_finite = true;
  CHECK_THROWS_WITH(cache.append_entries(seq, 8, {span<const float>(two)}, rows(8), {}, checked),
                    Contains("half.append_entries: entries[0][3] = ") && Contains("must be finite"));
  unchanged();
  two[3] = 3.4e38f;  // finite in fp32, rounds to bf16 infinity
  CHECK_THROWS_WITH(cache.append_entries(seq, 8, {span<const float>(two)}, rows(8), {}, checked),
                    Contains("is not representable in bf16"));
  unchanged();
  two[3] = 0.5f;
  // 3 pages of 2 entries, one held: 6 more entries need 3 more pages.
  std::vector<float> six = uniform(rng, 6 * 8, -1.0f, 1.0f);
  CHECK_THROWS_AS(cache.append_entries(seq, 24, {span<const float>(six)}, rows(24)), capacity_error);
  unchanged();
  CHECK(cache.append_entries(seq, 8, {span<const float>(two)}, rows(8)) == 2);
  CHECK_THROWS_WITH(cache.append_entries(999, 8, {span<const float>(two)}, rows(8)), Contains("999"));
  CHECK_THROWS_WITH(cache.entry_bytes(seq, 0, 4), "half.entry_bytes(entry) = 4: must lie in [0, 4)");
}

}  // namespace

}  // namespace test_cache_host_entries
