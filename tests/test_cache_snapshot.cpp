// Sequence snapshots (include/phasekv/cache/snapshot.hpp) and their checksum (detail/crc32c.hpp).
//
// The checksum: every implementation this build has (table-driven, SSE4.2 three-chain, AVX-512
// folding, fused copy) against a bit-at-a-time CRC written from the definition, the RFC 3720
// test vectors, every length up to a few KiB, every alignment, and continuation in pieces.
//
// Round trips: a sequence is built in cache A, snapshotted mid-block (pending tokens), restored
// into cache B (other page size, capacity, name; sometimes another history or a widening storage
// type), and then both receive the same further tokens. After every step the two must agree bit
// for bit — entries, compressor states, window rows, sparse_reader outputs, remove_suffix —
// and, as checks that do not go through A at all, B's entries must equal a fresh compressor's
// one-chunk prefill of every token (bitwise) and the scalar double-precision oracle
// (tests/oracle/scalar_compressor.hpp, within its tolerance).
//
// Rejection: a small snapshot truncated at every length, with every single bit flipped, with
// each fingerprint field changed (the message must name it), crafted with consistent checksums
// but inconsistent counts, or restored into a full pool. After every rejection the destination
// must be unchanged: a full dump of everything observable (tests/oracle/cache_dump.hpp:
// sequences, tokens, entries, page tables, reference counts, used pages, memory figures, states,
// window rows), and a twin cache that never saw the failures must then hand out the same pages
// and advance its sequence ids the same way (so even the free lists and the id counter are as
// before). Allocation failures inside restore are injected in tests/fault/test_fault_snapshot.cpp.

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "oracle/cache_dump.hpp"
#include "support/prelude.hpp"
#include "support/random_inputs.hpp"
#include "oracle/scalar_compressor.hpp"
#include "oracle/snapshot_format.hpp"
#include "support/configs.hpp"
#include "support/deepseek_layer.hpp"
#include "support/message_of.hpp"
#include "support/small_layers.hpp"
#include "support/tokens.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/detail/crc32c.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace test_cache_snapshot {

namespace {

using namespace phasekv_test::prelude;
using Catch::Matchers::StartsWith;
using phasekv_test::crc32c_bitwise;
using phasekv_test::get_u64;
using phasekv_test::kLayer;
using phasekv_test::kStreams;
using phasekv_test::put_u32;
using phasekv_test::put_u64;
using phasekv_test::reseal;
using phasekv_test::table_at;

// ==================================================================================================
// CRC-32C

// Every implementation of this build, by name.
std::vector<std::pair<std::string, std::uint32_t>> all_crcs(const unsigned char* p, std::size_t n, std::uint32_t crc) {
  namespace impl = detail::crc32c_impl;
  std::vector<std::pair<std::string, std::uint32_t>> out;
  out.emplace_back("crc32c", crc32c(p, n, crc));
  out.emplace_back("crc32c_portable", crc32c_portable(p, n, crc));
  std::vector<unsigned char> copy(n + 1, 0xA5);
  out.emplace_back("crc32c_copy", crc32c_copy(copy.data(), p, n, crc));
  if (!std::equal(p, p + n, copy.begin()) || copy[n] != 0xA5) out.emplace_back("crc32c_copy's copy", 0xDEADu);
#if defined(__SSE4_2__)
  out.emplace_back("update_sse42", ~impl::update_sse42<false>(~crc, p, nullptr, n));
  std::fill(copy.begin(), copy.end(), 0x5A);
  out.emplace_back("update_sse42<copy>", ~impl::update_sse42<true>(~crc, p, copy.data(), n));
  if (!std::equal(p, p + n, copy.begin()) || copy[n] != 0x5A) out.emplace_back("update_sse42's copy", 0xDEADu);
#endif
#if defined(PHASEKV_CRC32C_FOLD)
  if (n >= 256) {
    out.emplace_back("update_fold", ~impl::update_fold<false>(~crc, p, nullptr, n));
    std::fill(copy.begin(), copy.end(), 0x3C);
    out.emplace_back("update_fold<copy>", ~impl::update_fold<true>(~crc, p, copy.data(), n));
    if (!std::equal(p, p + n, copy.begin()) || copy[n] != 0x3C) out.emplace_back("update_fold's copy", 0xDEADu);
  }
#endif
  return out;
}

TEST_CASE("crc32c: the RFC 3720 test vectors and the check value", "[snapshot][crc32c]") {
  const char* check = "123456789";
  std::array<unsigned char, 32> zeros{}, ones{}, up{}, down{};
  ones.fill(0xFF);
  for (int i = 0; i < 32; ++i) up[i] = static_cast<unsigned char>(i), down[i] = static_cast<unsigned char>(31 - i);
  const std::pair<std::vector<unsigned char>, std::uint32_t> cases[] = {
      {std::vector<unsigned char>(check, check + 9), 0xE3069283u},
      {std::vector<unsigned char>(zeros.begin(), zeros.end()), 0x8A9136AAu},
      {std::vector<unsigned char>(ones.begin(), ones.end()), 0x62A8AB43u},
      {std::vector<unsigned char>(up.begin(), up.end()), 0x46DD794Eu},
      {std::vector<unsigned char>(down.begin(), down.end()), 0x113FDB5Cu},
  };
  for (const auto& [bytes, want] : cases) {
    REQUIRE(crc32c_bitwise(bytes.data(), bytes.size()) == want);
    for (const auto& [name, got] : all_crcs(bytes.data(), bytes.size(), 0)) {
      INFO(name);
      REQUIRE(got == want);
    }
  }
  REQUIRE(crc32c(nullptr, 0) == 0);
}

TEST_CASE("crc32c: every implementation equals the bitwise definition", "[snapshot][crc32c]") {
  std::mt19937 rng(11);
  std::vector<unsigned char> data(70000);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 1100; ++n) lengths.push_back(n);
  // Around every block boundary of the three-chain loop (3·64, 3·512, 3·4096) and the fold (256).
  for (std::size_t n : {1535u, 1536u, 1537u, 12287u, 12288u, 12289u, 13824u, 24576u, 24577u, 65536u, 69999u})
    lengths.push_back(n);
  std::size_t failures = 0;
  std::string first;
  for (std::size_t n : lengths)
    for (std::size_t offset : {0u, 1u, 3u, 7u}) {
      if (offset + n > data.size()) continue;
      const unsigned char* p = data.data() + offset;
      const std::uint32_t seed = n % 3 == 0 ? 0u : static_cast<std::uint32_t>(rng());
      const std::uint32_t want = crc32c_bitwise(p, n, seed);
      for (const auto& [name, got] : all_crcs(p, n, seed))
        if (got != want && failures++ == 0) first = name + " at length " + std::to_string(n) + ", offset " + std::to_string(offset);
    }
  INFO(first);
  REQUIRE(failures == 0);
}

TEST_CASE("crc32c: a buffer checksummed in pieces equals the whole", "[snapshot][crc32c]") {
  std::mt19937 rng(5);
  std::vector<unsigned char> data(40000);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  const std::uint32_t whole = crc32c(data.data(), data.size());
  for (int trial = 0; trial < 50; ++trial) {
    std::uint32_t crc = 0;
    std::size_t at = 0;
    while (at < data.size()) {
      const std::size_t n = std::min<std::size_t>(data.size() - at, std::uniform_int_distribution<std::size_t>(0, 5000)(rng));
      crc = crc32c(data.data() + at, n, crc);
      at += n;
    }
    REQUIRE(crc == whole);
  }
}

TEST_CASE("crc32c: the merge algebra shifts a register over zero bytes", "[snapshot][crc32c]") {
  // By definition the register update over n zero bytes multiplies the register by x^(8n) mod P;
  // the chains are merged with exactly that multiplication (the bitwise one, or PCLMULQDQ).
  namespace impl = detail::crc32c_impl;
  std::mt19937 rng(3);
  for (std::uint64_t n : {1u, 4u, 5u, 8u, 64u, 100u, 512u, 1024u, 4096u, 8192u}) {
    for (int trial = 0; trial < 20; ++trial) {
      const auto r = static_cast<std::uint32_t>(rng());
      std::uint32_t want = r;
      for (std::uint64_t bit = 0; bit < 8 * n; ++bit) want = (want & 1u) ? (want >> 1) ^ 0x82F63B78u : want >> 1;
      INFO(n << " zero bytes");
      REQUIRE(impl::multiply(r, impl::x_power(8 * n)) == want);
#if defined(__SSE4_2__)
      if (8 * n >= 33) REQUIRE(impl::shift(r, impl::x_power(8 * n - 33), impl::x_power(8 * n)) == want);
#endif
    }
  }
}

// ==================================================================================================
// Shared machinery: inputs, appends, comparisons, dumps.

using phasekv_test::append;
using phasekv_test::cache_of;
using phasekv_test::stream_of;
using phasekv_test::token_inputs;

// Random tokens for caches of one shape: payloads and window rows in [−1, 1), gate logits in
// [−3, 3) (tests/support/tokens.hpp).
template <class Cache>
struct shape_of {
  const Cache& cache;
  explicit shape_of(const Cache& c) : cache(c) {}
  token_inputs<Cache::stream_count> random(std::mt19937& rng, std::int64_t n) const {
    return phasekv_test::random_tokens(cache, n, rng, phasekv_test::token_draw{-1.0f, 1.0f, -3.0f, 3.0f});
  }
};

std::string hex_floats(const float* p, std::int64_t n) {
  std::string s;
  char buffer[12];
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, p + i, 4);
    std::snprintf(buffer, sizeof buffer, "%08x ", bits);
    s += buffer;
  }
  return s;
}

template <class Cache>
std::int64_t floats_per_entry(const Cache& cache, std::size_t k) {
  return cache.pool(k).layout().values_per_entry();
}

// Everything observable about a sequence, as lines (bitwise for floats).
template <class Cache>
std::vector<std::string> describe_sequence(const Cache& cache, sequence_id id, bool with_pages) {
  std::vector<std::string> lines;
  std::ostringstream head;
  head << "tokens " << cache.tokens(id) << " window_first " << cache.window_first(id);
  lines.push_back(head.str());
  for (std::size_t k = 0; k < Cache::stream_count; ++k) {
    const std::int64_t n = cache.entries(id, k);
    std::ostringstream s;
    s << "stream " << k << ": entries " << n << " state tokens " << cache.state(id, k).tokens() << " ring "
      << cache.state(id, k).ring_rows();
    if (with_pages) {
      s << " pages";
      for (page_id p : cache.page_table(id, k)) s << ' ' << p << '/' << cache.pool(k).refcount(p);
    }
    lines.push_back(s.str());
    std::vector<float> entry(static_cast<std::size_t>(floats_per_entry(cache, k)));
    for (std::int64_t j = 0; j < n; ++j) {
      cache.read_entry(id, k, j, entry.data());
      lines.push_back("  entry " + std::to_string(j) + ": " + hex_floats(entry.data(), static_cast<std::int64_t>(entry.size())));
    }
  }
  const raw_window_config& w = cache.config().window;
  if (w.tokens > 0) {
    const std::int64_t keys = w.kv_heads * w.key_channels;
    const std::int64_t values = w.kv_heads * (w.value_channels > 0 ? w.value_channels : w.key_channels);
    std::vector<float> key(static_cast<std::size_t>(keys)), value(static_cast<std::size_t>(values));
    for (std::int64_t t = cache.window_first(id); t < cache.tokens(id); ++t) {
      cache.copy_window_key(id, t, span<float>(key.data(), key.size()));  // either precision
      cache.copy_window_value(id, t, span<float>(value.data(), value.size()));
      lines.push_back("  window " + std::to_string(t) + ": " + hex_floats(key.data(), keys) + "| " +
                      hex_floats(value.data(), values));
    }
  }
  return lines;
}

// "" when the two sequences are the same bit for bit (states included), else the first difference.
template <class CacheA, class CacheB>
std::string same_sequence(const CacheA& a, sequence_id ia, const CacheB& b, sequence_id ib) {
  const std::vector<std::string> la = describe_sequence(a, ia, false), lb = describe_sequence(b, ib, false);
  for (std::size_t i = 0; i < std::min(la.size(), lb.size()); ++i)
    if (la[i] != lb[i]) return "line " + std::to_string(i) + ": '" + la[i] + "' vs '" + lb[i] + "'";
  if (la.size() != lb.size()) return "different line counts";
  for (std::size_t k = 0; k < CacheA::stream_count; ++k)
    if (a.state(ia, k) != b.state(ib, k)) return "stream " + std::to_string(k) + ": compressor states differ";
  return "";
}

// Sparse reads at `positions` from both caches, compared bitwise ("" when all agree).
template <class CacheA, class CacheB>
std::string same_reads(const CacheA& a, sequence_id ia, const CacheB& b, sequence_id ib, const reader_config& rc,
                       const std::vector<std::int64_t>& positions, std::uint32_t seed) {
  sparse_reader ra(a, rc);
  sparse_reader rb(b, rc);
  std::mt19937 rng(seed);
  const std::int64_t key_channels = a.compressors().config(rc.key_stream).channels;
  const std::vector<float> queries = phasekv_test::random_payload(rng, static_cast<std::size_t>(rc.query_heads * key_channels));
  std::vector<float> indexer_queries, indexer_weights, sinks;
  if (rc.top_k > 0) {
    const std::int64_t ic = a.compressors().config(rc.indexer_stream).channels;
    indexer_queries = phasekv_test::random_payload(rng, static_cast<std::size_t>(rc.indexer_heads * ic));
    indexer_weights = phasekv_test::random_uniform(rng, static_cast<std::size_t>(rc.indexer_heads), 0.0f, 1.0f);
  }
  if (rc.sink) sinks = phasekv_test::random_payload(rng, static_cast<std::size_t>(rc.query_heads));
  std::vector<float> out_a(static_cast<std::size_t>(ra.output_floats())), out_b(out_a.size());
  for (std::int64_t t : positions) {
    read_request r{t, queries, indexer_queries, indexer_weights, sinks};
    read_trace ta, tb;
    ra.read(a, ia, r, out_a.data(), &ta);
    rb.read(b, ib, r, out_b.data(), &tb);
    if (std::memcmp(out_a.data(), out_b.data(), out_a.size() * sizeof(float)) != 0 || ta.selected != tb.selected)
      return "read at position " + std::to_string(t) + " differs";
  }
  return "";
}

// Entries of every stream of a cache's sequence against a FRESH compressor's one-chunk prefill
// of all of `in` (stored and loaded through the pool's storage type): "" when bitwise equal.
template <class Cache, std::size_t... K>
std::string equals_prefill(const Cache& cache, sequence_id id, const token_inputs<Cache::stream_count>& in,
                           std::index_sequence<K...>) {
  std::string result;
  const auto one = [&](std::size_t k, const auto& compressor) {
    if (!result.empty()) return;
    stream_state state = compressor.make_state();
    entry_buffer buffer;
    compressor.append(state, token_chunk{in.tokens, in.payload[k], in.logits[k]}, buffer);
    std::vector<float> want = buffer.all_values();
    std::vector<std::byte> stored(want.size() * 4);
    const storage_type type = cache.pool(k).layout().storage;
    store_row(want.data(), stored.data(), static_cast<std::int64_t>(want.size()), type);
    load_row(stored.data(), want.data(), static_cast<std::int64_t>(want.size()), type);
    const std::int64_t per = compressor.floats_per_entry();
    if (cache.entries(id, k) * per != static_cast<std::int64_t>(want.size())) {
      result = "stream " + std::to_string(k) + ": entry count differs from the prefill's";
      return;
    }
    std::vector<float> got(static_cast<std::size_t>(per));
    for (std::int64_t j = 0; j < cache.entries(id, k); ++j) {
      cache.read_entry(id, k, j, got.data());
      if (std::memcmp(got.data(), want.data() + j * per, got.size() * sizeof(float)) != 0) {
        result = "stream " + std::to_string(k) + ": entry " + std::to_string(j) + " differs from the prefill's";
        return;
      }
    }
  };
  (one(K, cache.compressors().template stream<K>()), ...);
  return result;
}

// The same against the double-precision scalar oracle, within its tolerance (f32 caches).
template <class Cache, std::size_t... K>
std::string equals_oracle(const Cache& cache, sequence_id id, const token_inputs<Cache::stream_count>& in,
                          std::index_sequence<K...>) {
  std::string result;
  const auto one = [&](std::size_t k, const auto& c) {
    using policy = typename std::decay_t<decltype(c)>::policy;
    if (!result.empty()) return;
    const auto expected = phasekv_test::oracle_compress<policy>(c.geom(), c.config(), c.params(), in.payload[k],
                                                                in.logits[k], in.tokens);
    if (static_cast<std::int64_t>(expected.size()) != cache.entries(id, k)) {
      result = "stream " + std::to_string(k) + ": the oracle has another entry count";
      return;
    }
    std::vector<float> got(static_cast<std::size_t>(c.floats_per_entry()));
    for (std::size_t j = 0; j < expected.size(); ++j) {
      cache.read_entry(id, k, static_cast<std::int64_t>(j), got.data());
      const std::string m = phasekv_test::oracle_mismatch(expected[j], c.config().kv_heads, c.config().channels,
                                                          c.geom().window, got.data(), nullptr);
      if (!m.empty()) {
        result = "stream " + std::to_string(k) + ": " + m;
        return;
      }
    }
  };
  (one(K, cache.compressors().template stream<K>()), ...);
  return result;
}

// ==================================================================================================
// The layers under test.

// 1. The DeepSeek-V4 CSA preset: tied K/V (512 channels) and the indexer (128), vector gates with
//    learned biases, RMSNorm with learned weights, YaRN RoPE after pooling; a tied raw window.
using phasekv_test::csa_cache;
using csa_stream = phasekv_test::csa_stream;
csa_cache::layer csa_layer() { return phasekv_test::make_csa_layer(); }

cache_config csa_config(const std::string& name, std::int64_t page_size, std::int64_t pages, std::int64_t history,
                        std::vector<storage_type> storage = {}) {
  return phasekv_test::csa_config(name, page_size, std::move(storage), pages, 16, history);
}

reader_config csa_reader() {
  reader_config r;
  r.name = "reader";
  r.query_heads = 4;
  r.key_stream = 0;
  r.value_stream = 0;
  r.indexer_stream = 1;
  r.top_k = 8;
  r.indexer_heads = 3;
  r.sink = true;
  r.derotate_output = true;
  return r;
}

// 2. Gated keys (vector gates, RoPE before pooling, RMSNorm, per-slot inputs, two heads) with
//    mean-pooled values (per-branch), a window with separate values, a non-zero origin and a
//    window-centred anchor.
using gated_keys = stream_compressor<compressor_policy<vector_gated_pool, rope_before_pool, rms_norm>>;
using mean_values = stream_compressor<compressor_policy<mean_pool>>;
using kv_cache = paged_cache<gated_keys, mean_values>;

kv_cache::layer kv_layer() {
  const geometry g{3, 7, 2, anchor_mode::window_centre};
  std::mt19937 rng(3);
  stream_config k = stream_of("keys", stream_role::key, 6, 2, input_layout::per_slot);
  k.rope.channels = 4;
  k.rope.base = 1000.0;
  k.rope.layout = rope_layout::half_split;
  k.norm_eps = 1e-5;
  stream_params kp;
  kp.slot_bias = phasekv_test::random_bias(rng, static_cast<std::size_t>(2 * 7 * 6));
  kp.norm_weight = phasekv_test::random_norm_weight(rng, 6);
  return kv_cache::layer(gated_keys(g, k, kp), mean_values(g, stream_of("values", stream_role::value, 5, 2)));
}

cache_config kv_config(const std::string& name, std::int64_t page_size, std::int64_t pages, std::int64_t history) {
  return cache_of(name, page_size, pages, history, raw_window_config{5, 2, 6, 5});
}

reader_config kv_reader() {
  reader_config r;
  r.name = "reader";
  r.query_heads = 4;
  r.key_stream = 0;
  r.value_stream = 1;
  return r;
}

// 3. The other policies: scalar gates; fixed weights with YaRN RoPE after pooling and RMSNorm;
//    mean pooling with RoPE before pooling. fp16 storage, no raw window.
using scalar_stream = stream_compressor<compressor_policy<scalar_gated_pool>>;
using fixed_stream = stream_compressor<compressor_policy<fixed_weight_pool, rope_after_pool, rms_norm>>;
using mean_rope_stream = stream_compressor<compressor_policy<mean_pool, rope_before_pool>>;
using mixed_cache = paged_cache<scalar_stream, fixed_stream, mean_rope_stream>;

mixed_cache::layer mixed_layer() {
  const geometry g{2, 5, 0, anchor_mode::block_end};
  std::mt19937 rng(4);
  const stream_config a = stream_of("scalar", stream_role::key_value, 3, 2);
  stream_params ap;
  ap.slot_bias = phasekv_test::random_bias(rng, static_cast<std::size_t>(2 * 5 * 1));
  stream_config b = stream_of("fixed", stream_role::key_value, 8, 1, input_layout::per_slot);
  b.rope.channels = 4;
  b.rope.base = 50000.0;
  b.rope.yarn.enabled = true;
  b.rope.yarn.factor = 4.0;
  b.rope.yarn.original_context = 64;
  b.rope.yarn.beta_fast = 8.0;
  b.rope.yarn.beta_slow = 1.0;
  stream_params bp;
  bp.slot_profile = phasekv_test::random_profile(rng, 5);
  bp.norm_weight = phasekv_test::random_norm_weight(rng, 8);
  stream_config c = stream_of("mean_rope", stream_role::key_value, 4);
  c.rope.channels = 2;
  return mixed_cache::layer(scalar_stream(g, a, ap), fixed_stream(g, b, bp), mean_rope_stream(g, c));
}

cache_config mixed_config(const std::string& name, std::int64_t page_size, std::int64_t pages, storage_type storage) {
  cache_config c = cache_of(name, page_size, pages, 2);
  c.storage = storage;
  return c;
}

// ==================================================================================================
// Round trips.

// remove_suffix(id, p0) went through (false: refused as input_error).
template <class Cache>
bool rolls_back(Cache& cache, sequence_id id, std::int64_t p0) {
  try {
    cache.remove_suffix(id, p0);
    return true;
  } catch (const input_error&) {
    return false;
  }
}

// A snapshot of A's sequence after `before` tokens restored into B; then both get the same
// chunks, and everything is compared after each. Returns the ids.
template <class Cache>
struct round_trip {
  using shape = shape_of<Cache>;
  Cache& a;
  Cache& b;
  shape s;
  std::mt19937 rng;
  token_inputs<Cache::stream_count> all;  // every token either cache received
  sequence_id ia = -1, ib = -1;

  round_trip(Cache& from, Cache& to, std::uint32_t seed) : a(from), b(to), s(from), rng(seed) {}

  void build(std::int64_t tokens, std::int64_t chunk) {
    ia = a.create();
    for (std::int64_t done = 0; done < tokens; done += chunk) {
      const token_inputs<Cache::stream_count> in = s.random(rng, std::min(chunk, tokens - done));
      append(a, ia, in);
      all.extend(in);
    }
  }
  void move() {
    const std::vector<std::byte> bytes = snapshot(a, ia);
    REQUIRE(bytes.size() == snapshot_size(a, ia));
    ib = restore(b, bytes);
  }
  // build(), move(), and the two sequences are the same.
  void build_and_move(std::int64_t tokens, std::int64_t chunk) {
    build(tokens, chunk);
    move();
    REQUIRE(same_sequence(a, ia, b, ib) == "");
  }
  void append_both(std::int64_t n) {
    const token_inputs<Cache::stream_count> in = s.random(rng, n);
    append(a, ia, in);
    append(b, ib, in);
    all.extend(in);
  }
  // remove_suffix to p0 on forks of both: both go through or both refuse; the forks are then the
  // same sequence, and then(fa, fb) may look further. The forks are freed.
  template <class Then>
  void roll_back_both(std::int64_t p0, Then&& then) {
    const sequence_id fa = a.fork(ia), fb = b.fork(ib);
    const bool ok = rolls_back(a, fa, p0);
    REQUIRE(rolls_back(b, fb, p0) == ok);
    if (ok) {
      REQUIRE(same_sequence(a, fa, b, fb) == "");
      then(fa, fb);
    }
    a.free(fa);
    b.free(fb);
  }
};

TEST_CASE("snapshot: DeepSeek-V4 CSA streams move mid-block and continue bit-identically", "[snapshot]") {
  const csa_cache::layer layer = csa_layer();
  csa_cache a(layer, csa_config("prefill", 4, 80, 6));
  csa_cache b(layer, csa_config("decode", 7, 50, 6));
  round_trip<csa_cache> rt(a, b, 17);
  rt.build(203, 64);  // 203 = 50 blocks of 4 + 3 pending tokens
  REQUIRE(a.tokens(rt.ia) % 4 != 0);
  rt.move();
  REQUIRE(b.tokens(rt.ib) == 203);
  REQUIRE(b.page_table(rt.ib, 0).size() == 8);  // 50 entries in pages of 7
  REQUIRE(same_sequence(a, rt.ia, b, rt.ib) == "");
  REQUIRE(same_reads(a, rt.ia, b, rt.ib, csa_reader(), {202, 201, 196}, 1) == "");  // the window keeps 181 on
  const sequence_memory ma = a.memory(rt.ia), mb = b.memory(rt.ib);
  REQUIRE(ma.entries == mb.entries);
  REQUIRE(ma.entry_bytes == mb.entry_bytes);
  REQUIRE(ma.state_bytes == mb.state_bytes);
  REQUIRE(ma.uncompressed_bytes == mb.uncompressed_bytes);

  std::uint32_t seed = 2;
  for (std::int64_t n : {1, 2, 5, 1, 13, 3, 1, 1, 37, 4}) {
    rt.append_both(n);
    INFO("after appending " << n << " tokens, " << a.tokens(rt.ia) << " in all");
    REQUIRE(same_sequence(a, rt.ia, b, rt.ib) == "");
    const std::int64_t t = a.tokens(rt.ia);
    REQUIRE(same_reads(a, rt.ia, b, rt.ib, csa_reader(), {t - 1, std::max(t - n, t - 7), t - 7}, seed++) == "");
  }
  REQUIRE(equals_prefill(b, rt.ib, rt.all, std::make_index_sequence<2>{}) == "");

  SECTION("remove_suffix within the history behaves identically on both") {
    const std::int64_t t = a.tokens(rt.ia);
    for (std::int64_t p0 = t; p0 >= t - 14; --p0) {
      INFO("remove_suffix to " << p0 << " of " << t);
      rt.roll_back_both(p0, [&](sequence_id fa, sequence_id fb) {
        const token_inputs<2> more = rt.s.random(rt.rng, 6);
        append(a, fa, more);
        append(b, fb, more);
        REQUIRE(same_sequence(a, fa, b, fb) == "");
        REQUIRE(same_reads(a, fa, b, fb, csa_reader(), {p0 + 5}, 9) == "");
      });
    }
  }
}

TEST_CASE("snapshot: gated keys with mean values, a separate-value window and an origin move", "[snapshot]") {
  const kv_cache::layer layer = kv_layer();
  kv_cache a(layer, kv_config("a", 3, 60, 4));
  kv_cache b(layer, kv_config("b", 2, 90, 4));
  // Occupy some of B first, so the restored pages are not simply 0, 1, 2, …
  shape_of<kv_cache> shape(b);
  std::mt19937 rng(8);
  const sequence_id other = b.create();
  append(b, other, shape.random(rng, 20));

  for (std::int64_t tokens : {0, 1, 2, 3, 4, 8, 31, 47}) {
    INFO("snapshot after " << tokens << " tokens (origin 2, S=3: " << layer.geom().completed_entries(tokens)
                           << " entries)");
    round_trip<kv_cache> rt(a, b, 100 + static_cast<std::uint32_t>(tokens));
    rt.build_and_move(tokens, 5);
    for (std::int64_t n : {1, 1, 4, 2, 9, 1}) {
      rt.append_both(n);
      REQUIRE(same_sequence(a, rt.ia, b, rt.ib) == "");
      const std::int64_t t = a.tokens(rt.ia);
      REQUIRE(same_reads(a, rt.ia, b, rt.ib, kv_reader(), {t - 1, std::max<std::int64_t>(0, t - 4)}, 5) == "");
    }
    REQUIRE(equals_prefill(b, rt.ib, rt.all, std::make_index_sequence<2>{}) == "");
    REQUIRE(equals_oracle(b, rt.ib, rt.all, std::make_index_sequence<2>{}) == "");
    // remove_suffix into the history, then continue.
    const std::int64_t t = a.tokens(rt.ia);
    for (std::int64_t p0 : {t - 1, t - 3, t - 6, t - 9}) rt.roll_back_both(p0, [](sequence_id, sequence_id) {});
    a.free(rt.ia);
    b.free(rt.ib);
  }
}

TEST_CASE("snapshot: scalar gates, fixed weights with YaRN and mean with RoPE before pooling move in fp16",
          "[snapshot]") {
  const mixed_cache::layer layer = mixed_layer();
  mixed_cache a(layer, mixed_config("a", 5, 30, storage_type::f16));
  mixed_cache b(layer, mixed_config("b", 1, 200, storage_type::f16));
  round_trip<mixed_cache> rt(a, b, 21);
  rt.build_and_move(37, 6);
  for (std::int64_t n : {1, 3, 8, 1}) {
    rt.append_both(n);
    REQUIRE(same_sequence(a, rt.ia, b, rt.ib) == "");
  }
  REQUIRE(equals_prefill(b, rt.ib, rt.all, std::make_index_sequence<3>{}) == "");

  SECTION("and in fp32, where the oracle can hold them") {
    mixed_cache c(layer, mixed_config("c", 3, 40, storage_type::f32));
    mixed_cache d(layer, mixed_config("d", 4, 40, storage_type::f32));
    round_trip<mixed_cache> r2(c, d, 22);
    r2.build(29, 29);
    r2.move();
    r2.append_both(7);
    REQUIRE(same_sequence(c, r2.ia, d, r2.ib) == "");
    REQUIRE(equals_oracle(d, r2.ib, r2.all, std::make_index_sequence<3>{}) == "");
  }
}

TEST_CASE("snapshot: bytes written to a file restore into a fresh cache of the same configuration", "[snapshot]") {
  const std::string path = "phasekv_test_snapshot.bin";
  token_inputs<2> all;
  std::vector<std::string> expected;
  {  // the "prefill process"
    csa_cache prefill(csa_layer(), csa_config("prefill", 16, 20, 0));
    shape_of<csa_cache> s(prefill);
    std::mt19937 rng(31);
    const sequence_id id = prefill.create();
    all = s.random(rng, 97);
    append(prefill, id, all);
    const std::vector<std::byte> bytes = snapshot(prefill, id);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
    expected = describe_sequence(prefill, id, false);
  }
  // The "decode process": a cache built from the configuration alone, bytes from the file.
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path.c_str());
  csa_cache decode(csa_layer(), csa_config("decode", 32, 12, 0));
  const sequence_id id =
      restore(decode, span<const std::byte>(reinterpret_cast<const std::byte*>(file.data()), file.size()));
  REQUIRE(describe_sequence(decode, id, false) == expected);
  REQUIRE(equals_prefill(decode, id, all, std::make_index_sequence<2>{}) == "");
  // and it decodes on
  shape_of<csa_cache> s(decode);
  std::mt19937 rng(32);
  const token_inputs<2> more = s.random(rng, 11);
  append(decode, id, more);
  all.extend(more);
  REQUIRE(equals_prefill(decode, id, all, std::make_index_sequence<2>{}) == "");
}

TEST_CASE("snapshot: a snapshot written into an unaligned caller buffer restores from it", "[snapshot]") {
  const kv_cache::layer layer = kv_layer();
  kv_cache a(layer, kv_config("a", 3, 20, 0));
  kv_cache b(layer, kv_config("b", 3, 20, 0));
  round_trip<kv_cache> rt(a, b, 5);
  rt.build(26, 26);
  const std::size_t size = snapshot_size(a, rt.ia);
  std::vector<std::byte> buffer(size + 3, std::byte{0x77});
  REQUIRE(snapshot_into(a, rt.ia, span<std::byte>(buffer.data() + 1, size + 1)) == size);
  REQUIRE(buffer[size + 1] == std::byte{0x77});  // nothing written past the snapshot
  const sequence_id id = restore(b, span<const std::byte>(buffer.data() + 1, size));
  REQUIRE(same_sequence(a, rt.ia, b, id) == "");
  REQUIRE_THROWS_WITH(snapshot_into(a, rt.ia, span<std::byte>(buffer.data(), size - 1)),
                      Contains("snapshot: out.size()") && Contains("must be at least"));
  REQUIRE_THROWS_WITH(snapshot(a, 12345), Contains("12345") && Contains("not a live sequence"));
  REQUIRE_THROWS_WITH(snapshot_size(a, -1), Contains("not a live sequence"));
  REQUIRE_THROWS_AS(restore(b, span<const std::byte>(nullptr, 5)), input_error);
}

// ---- history ------------------------------------------------------------------------------------

TEST_CASE("snapshot: a destination with another history re-lays the rings", "[snapshot]") {
  const kv_cache::layer layer = kv_layer();
  constexpr std::int64_t source_history = 4;
  kv_cache a(layer, kv_config("a", 3, 60, source_history));
  shape_of<kv_cache> s(a);
  std::mt19937 rng(44);
  const sequence_id ia = a.create();
  token_inputs<2> all = s.random(rng, 41);
  append(a, ia, all);
  const std::vector<std::byte> bytes = snapshot(a, ia);

  for (std::int64_t history : {0, 1, 2, 4, 9}) {
    INFO("destination history " << history);
    kv_cache b(layer, kv_config("b", 4, 60, history));
    const sequence_id ib = restore(b, bytes);
    // A cache of the destination's history that received the same tokens directly.
    kv_cache direct(layer, kv_config("direct", 4, 60, history));
    const sequence_id id = direct.create();
    append(direct, id, all);
    // The same history keeps the rings verbatim; a smaller one keeps their last rows, exactly as
    // a cache of that history would have them.
    if (history <= source_history) REQUIRE(same_sequence(direct, id, b, ib) == "");
    // What remove_suffix allows: as far as both histories reach.
    const std::int64_t t = a.tokens(ia);
    for (std::int64_t p0 = t; p0 >= t - 16; --p0) {
      INFO("remove_suffix to " << p0);
      const sequence_id fb = b.fork(ib), fd = direct.fork(id), fa = a.fork(ia);
      const bool ok_b = rolls_back(b, fb, p0);
      // the reference: the cache with the smaller history
      REQUIRE(ok_b == (history <= source_history ? rolls_back(direct, fd, p0) : rolls_back(a, fa, p0)));
      if (ok_b) {
        const token_inputs<2> more = s.random(rng, 5);
        append(b, fb, more);
        token_inputs<2> expected = all.slice(0, p0);
        expected.extend(more);
        REQUIRE(equals_prefill(b, fb, expected, std::make_index_sequence<2>{}) == "");
      }
      b.free(fb);
      direct.free(fd);
      a.free(fa);
    }
    // After `window + history` more tokens the destination holds what a direct cache holds.
    const token_inputs<2> more = s.random(rng, 7 + history + 5);
    append(b, ib, more);
    append(direct, id, more);
    REQUIRE(same_sequence(direct, id, b, ib) == "");
  }
}

// ---- storage types ---------------------------------------------------------------------------

// A sequence whose indexer keys are stored as `from`, restored into a cache that stores them as
// `to`: what restore() said, and what the destination holds afterwards.
struct converting_restore {
  std::string message;
  std::int64_t sequences = -1, indexer_pages = -1;
};
converting_restore restore_converting(const csa_cache::layer& layer, storage_type from, storage_type to,
                                      std::uint32_t seed) {
  csa_cache a(layer, csa_config("a", 8, 10, 0, {storage_type::f32, from}));
  csa_cache b(layer, csa_config("b", 8, 10, 0, {storage_type::f32, to}));
  round_trip<csa_cache> rt(a, b, seed);
  rt.build(20, 20);
  const std::vector<std::byte> bytes = snapshot(a, rt.ia);
  converting_restore r;
  r.message = phasekv_test::message_of<input_error>([&] { restore(b, bytes); });
  r.sequences = static_cast<std::int64_t>(b.sequences());
  r.indexer_pages = static_cast<std::int64_t>(b.pool(1).used_pages());
  return r;
}

TEST_CASE("snapshot: bf16 and f16 entries widen losslessly into f32; narrowing is rejected as lossy",
          "[snapshot]") {
  const csa_cache::layer layer = csa_layer();
  SECTION("bf16 indexer keys (the bf16-indexer layout) and f16 K/V into an all-f32 cache") {
    csa_cache a(layer, csa_config("a", 8, 30, 2, {storage_type::f16, storage_type::bf16}));
    csa_cache b(layer, csa_config("b", 5, 40, 2));
    round_trip<csa_cache> rt(a, b, 61);
    // The restored entries are the bf16/f16-rounded values, exactly; states and window too.
    rt.build_and_move(90, 90);
    REQUIRE(same_reads(a, rt.ia, b, rt.ib, csa_reader(), {89, 87}, 3) == "");
  }
  SECTION("same type into same type") {
    csa_cache a(layer, csa_config("a", 8, 30, 2, {storage_type::bf16, storage_type::bf16}));
    csa_cache b(layer, csa_config("b", 3, 60, 2, {storage_type::bf16, storage_type::bf16}));
    round_trip<csa_cache> rt(a, b, 62);
    rt.build(50, 7);
    rt.move();
    rt.append_both(9);
    REQUIRE(same_sequence(a, rt.ia, b, rt.ib) == "");
  }
  SECTION("narrowing or sideways") {
    const std::pair<storage_type, storage_type> lossy[] = {{storage_type::f32, storage_type::bf16},
                                                           {storage_type::f32, storage_type::f16},
                                                           {storage_type::bf16, storage_type::f16},
                                                           {storage_type::f16, storage_type::bf16}};
    for (const auto& [from, to] : lossy) {
      INFO(to_string(from) << " -> " << to_string(to));
      const converting_restore r = restore_converting(layer, from, to, 63);
      REQUIRE_THAT(r.message, StartsWith("snapshot: stream 1 (csa.indexer) entries are stored as " +
                                         std::string(to_string(from))) &&
                                  Contains("lossy"));
      REQUIRE(r.sequences == 0);
      REQUIRE(r.indexer_pages == 0);
    }
  }
}

TEST_CASE("snapshot: fp8 entries move byte for byte, widen exactly into f32, and nothing else converts",
          "[snapshot][fp8]") {
  const csa_cache::layer layer = csa_layer();
  const storage_type fp8 = storage_type::fp8_e4m3_block;
  SECTION("fp8 into fp8 with another page size: the same snapshot bytes, entries and reads, and after") {
    csa_cache a(layer, csa_config("a", 8, 30, 2, {fp8, storage_type::bf16}));
    csa_cache b(layer, csa_config("b", 3, 80, 2, {fp8, storage_type::bf16}));
    round_trip<csa_cache> rt(a, b, 64);
    rt.build(90, 17);
    rt.move();
    REQUIRE(snapshot(b, rt.ib) == snapshot(a, rt.ia));
    REQUIRE(same_sequence(a, rt.ia, b, rt.ib) == "");
    REQUIRE(same_reads(a, rt.ia, b, rt.ib, csa_reader(), {89, 88, 87}, 4) == "");
    REQUIRE(a.memory(rt.ia).entry_bytes == a.entries(rt.ia, 0) * 584 + a.entries(rt.ia, 1) * 256);
    for (std::int64_t n : {1, 3, 13}) {
      rt.append_both(n);
      REQUIRE(same_sequence(a, rt.ia, b, rt.ib) == "");
      REQUIRE(snapshot(b, rt.ib) == snapshot(a, rt.ia));
      const std::int64_t t = a.tokens(rt.ia);
      REQUIRE(same_reads(a, rt.ia, b, rt.ib, csa_reader(), {t - 1, t - 2}, 5) == "");
    }
  }
  SECTION("fp8 into f32: the dequantized values exactly, and reads of the same bits") {
    csa_cache a(layer, csa_config("a", 8, 30, 2, {fp8, fp8}));
    csa_cache b(layer, csa_config("b", 5, 40, 2));
    round_trip<csa_cache> rt(a, b, 65);
    rt.build_and_move(90, 90);
    REQUIRE(same_reads(a, rt.ia, b, rt.ib, csa_reader(), {89, 87}, 6) == "");
  }
  SECTION("into fp8 from another type, and fp8 into bf16 or f16, are lossy") {
    const std::pair<storage_type, storage_type> lossy[] = {{storage_type::f32, fp8},  {storage_type::bf16, fp8},
                                                           {storage_type::f16, fp8},  {fp8, storage_type::bf16},
                                                           {fp8, storage_type::f16}};
    for (const auto& [from, to] : lossy) {
      INFO(to_string(from) << " -> " << to_string(to));
      const converting_restore r = restore_converting(layer, from, to, 66);
      REQUIRE_THAT(r.message, StartsWith("snapshot: stream 1 (csa.indexer) entries are stored as " +
                                         std::string(to_string(from)) + "; the cache stores " + to_string(to)) &&
                                  Contains("lossy"));
      REQUIRE(r.sequences == 0);
      REQUIRE(r.indexer_pages == 0);
    }
  }
}

// ==================================================================================================
// Rejection, with the destination unchanged.

// Two small layers, so every bit of their snapshots can be flipped (tests/support/small_layers.hpp):
// f32 keys and gated values; FP8 K/V, FP4 indexer keys and an FP8 raw window, DeepSeek-V4's
// precision at the smallest channel counts the formats take.
using precise_kv = phasekv_test::small_mean;
using phasekv_test::precise_cache;

struct precise_spec {
  using cache = precise_cache;
  static cache::layer layer() { return phasekv_test::precise_layer(); }
  static cache_config config(const std::string& name, std::int64_t pages) { return phasekv_test::precise_config(name, pages); }
};

struct gated_spec {
  using cache = phasekv_test::gated_cache;
  static cache::layer layer() { return phasekv_test::gated_layer(); }
  static cache_config config(const std::string& name, std::int64_t pages) { return phasekv_test::gated_config(name, pages); }
};

// A destination holding a few sequences (one a fork, sharing pages), its twin, and a snapshot of
// a source sequence of `tokens` tokens (stride 2: an odd count leaves one pending in the
// compressor). `forked`: the snapshot is of a fork of it, one token further (its pages shared).
template <class Spec>
struct rejection_world_of {
  using cache = typename Spec::cache;
  static constexpr std::size_t streams = cache::stream_count;
  typename cache::layer layer = Spec::layer();
  cache source{layer, Spec::config("source", 16)};
  cache destination{layer, Spec::config("destination", 24)};
  cache twin{layer, Spec::config("twin", 24)};  // receives the same successful calls only
  std::vector<sequence_id> ids, twin_ids;      // the sequences each holds, in the same order
  std::vector<std::byte> bytes;
  shape_of<cache> shape{source};
  std::mt19937 rng{77};

  explicit rejection_world_of(std::int64_t tokens = 5, bool forked = false) {
    ids = phasekv_test::populate(destination);
    twin_ids = phasekv_test::populate(twin);
    sequence_id s = source.create();
    append(source, s, shape.random(rng, tokens));
    if (forked) {
      const sequence_id f = source.fork(s);
      append(source, f, shape.random(rng, 1));
      s = f;
    }
    bytes = snapshot(source, s);
  }

  phasekv_test::cache_dump dump() const { return phasekv_test::dump(destination); }

  // The destination and its twin behave the same from here on: the same successful calls give
  // the same dumps (pages included) and advance the sequence ids by the same steps (ids carry a
  // per-cache tag, so they are compared as distances from each cache's first sequence).
  void check_twin() {
    const sequence_id a = restore(destination, bytes), b = restore(twin, bytes);
    REQUIRE(a - ids[0] == b - twin_ids[0]);
    std::mt19937 same(10);
    const token_inputs<streams> more = shape.random(same, 9);
    const sequence_id c = destination.create(), d = twin.create();
    REQUIRE(c - ids[0] == d - twin_ids[0]);
    append(destination, c, more);
    append(twin, d, more);
    REQUIRE(phasekv_test::first_difference(phasekv_test::dump(destination), phasekv_test::dump(twin)) == "");
  }
};
using rejection_world = rejection_world_of<gated_spec>;

// restore() must throw Error with a message containing `expected`, and change nothing.
template <class Error = input_error, class World>
std::string expect_rejected(World& w, const std::vector<std::byte>& bytes, const std::string& expected) {
  const phasekv_test::cache_dump before = w.dump();
  std::string message;
  try {
    restore(w.destination, bytes);
    return "accepted";
  } catch (const Error& e) {
    message = e.what();
  } catch (const std::exception& e) {
    return std::string("the wrong exception: ") + e.what();
  }
  if (message.rfind("snapshot: ", 0) != 0) return "message without the 'snapshot: ' prefix: " + message;
  if (message.find(expected) == std::string::npos) return "message '" + message + "' lacks '" + expected + "'";
  const phasekv_test::cache_dump after = w.dump();
  if (after != before) return "the destination changed: " + phasekv_test::first_difference(before, after);
  return "";
}

// Every truncation of the world's snapshot is rejected with its length, and one extra byte too.
template <class World>
void every_truncation_rejected(World& w) {
  const std::size_t size = w.bytes.size();
  INFO("snapshot of " << size << " bytes");
  std::size_t failures = 0;
  std::string first;
  for (std::size_t n = 0; n < size; ++n) {
    const std::vector<std::byte> cut(w.bytes.begin(), w.bytes.begin() + static_cast<std::ptrdiff_t>(n));
    const std::string expected = n < 32 ? "truncated at byte " + std::to_string(n) + " of at least 32"
                                        : "truncated at byte " + std::to_string(n) + " of " + std::to_string(size);
    const std::string r = expect_rejected(w, cut, expected);
    if (!r.empty() && failures++ == 0) first = "length " + std::to_string(n) + ": " + r;
  }
  INFO(first);
  REQUIRE(failures == 0);
  std::vector<std::byte> longer = w.bytes;
  longer.push_back(std::byte{0});
  REQUIRE(expect_rejected(w, longer, "1 bytes follow the end of the snapshot") == "");
  w.check_twin();
}

// Every single-bit flip of the world's snapshot is rejected by the checksum of the part it hit.
template <class World>
void every_flip_rejected(World& w) {
  constexpr std::size_t K = World::streams;
  const std::size_t size = w.bytes.size(), header = 160 + 200 * K;
  // Where each section starts, from the table: K entry sections, K compressor states, the window.
  std::vector<std::size_t> starts{header};
  for (std::size_t i = 0; i < 2 * K + 1; ++i) starts.push_back(starts.back() + get_u64(w.bytes, table_at(K) + 24 * i + 8));
  REQUIRE(starts.back() == size);
  const auto section = [&](std::size_t i) {
    const std::string k = std::to_string(i < K ? i : i - K);
    return "section " + std::to_string(i) + " (" +
           (i < K ? "stream " + k + " entries" : i < 2 * K ? "stream " + k + " compressor state" : "raw window") + ")";
  };
  INFO("snapshot of " << size << " bytes, " << 8 * size << " bits");
  std::size_t failures = 0;
  std::string first;
  for (std::size_t bit = 0; bit < 8 * size; ++bit) {
    std::vector<std::byte> flipped = w.bytes;
    flipped[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    const std::size_t byte = bit / 8;
    std::string expected;
    if (byte < 8) expected = "bad magic";
    else if (byte < 32) expected = "preamble checksum mismatch";
    else if (byte < header) expected = "header checksum mismatch";
    else expected = section(static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), byte) - starts.begin() - 1)) +
                    " checksum mismatch";
    const std::string r = expect_rejected(w, flipped, expected);
    if (!r.empty() && failures++ == 0) first = "bit " + std::to_string(bit) + ": " + r;
  }
  INFO(first);
  REQUIRE(failures == 0);
  w.check_twin();
}

// check(w) in each world the rejection tests take apart, a section each (every one leaves a
// token pending in the compressor): gated f32 streams, a fork of them, DeepSeek-V4's precision
// and, with precise_fork, a fork at that precision.
template <class Check>
void in_rejection_worlds(Check&& check, bool precise_fork) {
  SECTION("f32 and a gated stream, a pending token") {
    rejection_world w;
    check(w);
  }
  SECTION("a forked sequence, a pending token") {
    rejection_world w(6, true);
    check(w);
  }
  SECTION("FP8 entries, FP4 indexer keys, an FP8 window, a pending token") {
    rejection_world_of<precise_spec> w(5);
    check(w);
  }
  if (precise_fork) {
    SECTION("the same, forked") {
      rejection_world_of<precise_spec> w(4, true);
      check(w);
    }
  }
}

TEST_CASE("snapshot: truncated at every length, rejected with the length; trailing bytes too", "[snapshot][reject]") {
  in_rejection_worlds([](auto& w) { every_truncation_rejected(w); }, false);
}

TEST_CASE("snapshot: every single bit flip is rejected, by the checksum of the part it hit", "[snapshot][reject]") {
  in_rejection_worlds([](auto& w) { every_flip_rejected(w); }, true);
}

TEST_CASE("snapshot: consistent checksums around inconsistent contents are rejected", "[snapshot][reject]") {
  rejection_world w;  // 5 tokens: 2 entries per stream, 1 pending token
  const std::size_t header = 160 + 200 * 2, table = table_at(2);
  const std::size_t state0 = header + get_u64(w.bytes, table + 8) + get_u64(w.bytes, table + 32);
  const std::size_t state1 = state0 + get_u64(w.bytes, table + 56);
  const std::size_t window = state1 + get_u64(w.bytes, table + 80);
  struct crafted {
    const char* what;
    std::size_t at;
    std::uint64_t value;
    bool u32;
    const char* expected;
  };
  const crafted cases[] = {
      {"version 2", 8, 2, true, "format version 2 is not supported (this build reads version 1)"},
      {"preamble reserved", 24, 1, true, "reserved field of the preamble = 1"},
      {"header_bytes too small", 12, 100, true, "header_bytes = 100"},
      {"header_bytes past the end", 12, 1u << 20, true, "header_bytes = 1048576"},
      {"total_bytes", 16, 1, false, "header_bytes = 560: must lie in [160, total_bytes = 1]"},
      {"stream count", kLayer + 8, 3, false, "does not fit the 3 streams"},
      {"history negative", kLayer + 48, static_cast<std::uint64_t>(-1), false, "snapshot: history = -1"},
      {"history huge", kLayer + 48, std::uint64_t{1} << 50, false, "snapshot: history = 1125899906842624"},
      {"tokens", kLayer, 6, false, "section 0 (stream 0 entries) has 24 bytes, expected 36"},
      {"tokens absurd", kLayer, std::uint64_t{1} << 62, false, "tokens = 4611686018427387904: must be at most 2^48"},
      {"pooling code", kStreams, 9, true, "stream 0 (keys) pooling unknown (9) does not match the cache's mean"},
      {"storage code", kStreams + 36, 7, true, "stream 0 (keys) storage = 7: is not a storage type"},
      {"parameter reserved", kStreams + 116, 1, true, "reserved field of stream 0 slot_bias"},
      {"section count", table - 8, 4, false, "section count = 4: must be 5"},
      {"section kind", table + 24, 2, true, "section 1 is kind 2 of stream 1, expected section 1 (stream 1 entries)"},
      {"section stream", table + 4, 1, true, "section 0 is kind 1 of stream 1"},
      {"section flags", table + 20, 1, true, "section 0 flags = 1: must be 0 (reserved)"},
      {"state section flags", table + 2 * 24 + 20, 2, true, "section 2 flags = 2: must be 0 or 1 (host-fed)"},
      {"host-fed state with inputs", table + 2 * 24 + 20, 1, true,
       "stream 0 compressor state: intact_from = 1: must equal tokens = 5 > 0 in a host-fed state"},
      {"section length", table + 8, 9, false, "the sections end at byte"},
      {"section past the end", table + 8, 1u << 30, false, "runs past the end of the snapshot"},
      {"header reserved", header - 8, 1, true, "reserved field of the header"},
      {"state tokens", state0, 4, false, "stream 0 compressor state: tokens = 4: must equal the sequence's 5"},
      {"state entries", state1 + 8, 3, false, "stream 1 compressor state: entries = 3: must equal completed_entries(5) = 2"},
      {"state ring_rows", state0 + 16, 5, false, "ring_rows = 5: must be window + history = 4"},
      {"intact_from too late", state0 + 24, 6, false, "intact_from = 6: must lie in [1, 5]"},
      {"intact_from too early", state1 + 24, 0, false, "intact_from = 0: must lie in [1, 5]"},
      {"window_first too late", window, 4, false, "window_first = 4: must lie in [2, 3]"},
      {"window_first negative", window, static_cast<std::uint64_t>(-1), false, "window_first = -1"},
      {"window rows", window + 8, 2, false, "raw window rows = 2: must be window.tokens + history = 3"},
  };
  for (const crafted& c : cases) {
    INFO(c.what);
    std::vector<std::byte> b = w.bytes;
    if (c.u32) put_u32(b, c.at, static_cast<std::uint32_t>(c.value));
    else put_u64(b, c.at, c.value);
    if (std::string(c.what) == "header_bytes past the end" || std::string(c.what) == "header_bytes too small" ||
        std::string(c.what) == "total_bytes")
      put_u32(b, 28, crc32c_bitwise(reinterpret_cast<const unsigned char*>(b.data()), 28));  // the header is elsewhere now
    else
      reseal(b, 2);
    REQUIRE(expect_rejected(w, b, c.expected) == "");
  }
  // A reseal that changes nothing is accepted (the crafting itself is sound).
  std::vector<std::byte> b = w.bytes;
  reseal(b, 2);
  REQUIRE(b == w.bytes);
  w.check_twin();
}

TEST_CASE("snapshot: bytes that are not a snapshot", "[snapshot][reject]") {
  rejection_world w;
  std::vector<std::byte> text(600, std::byte{'x'});
  REQUIRE(expect_rejected(w, text, "bad magic: these bytes are not a phasekv snapshot") == "");
  REQUIRE(expect_rejected(w, {}, "truncated at byte 0 of at least 32") == "");
  std::vector<std::byte> wrong = w.bytes;
  wrong[0] = std::byte{'P'};
  REQUIRE(expect_rejected(w, wrong, "bad magic") == "");
  w.check_twin();
}

// Fills the world's destination (and its twin alike) until fewer than 7 pages are free in each
// pool, so the snapshot's 14 entries per stream (7 pages of 2) cannot be restored: capacity_error
// with nothing changed; then, with room made in both, the twins agree.
template <class World>
void full_pool_refuses(World& w) {
  std::mt19937 rng(3);
  std::vector<sequence_id> added, twin_added;
  while (w.destination.pool(0).free_pages() >= 7) {
    const token_inputs<World::streams> in = w.shape.random(rng, 4);
    added.push_back(w.destination.create());
    append(w.destination, added.back(), in);
    twin_added.push_back(w.twin.create());
    append(w.twin, twin_added.back(), in);
  }
  REQUIRE(expect_rejected<capacity_error>(w, w.bytes, "snapshot: restoring 14 entries of stream 0 needs 7 pages") ==
          "");
  // Make room in both (7 pages for the restore, 2 for check_twin's append).
  for (std::size_t i = 0; i < 3; ++i) {
    w.destination.free(added[i]);
    w.twin.free(twin_added[i]);
  }
  w.check_twin();
}

TEST_CASE("snapshot: a full destination pool throws capacity_error and changes nothing", "[snapshot][reject]") {
  rejection_world w(29);  // 14 entries per stream: 7 pages of 2
  full_pool_refuses(w);
}

TEST_CASE("snapshot: a full FP8/FP4 destination refuses a forked snapshot and changes nothing", "[snapshot][reject]") {
  rejection_world_of<precise_spec> w(28, true);  // 29 tokens: 14 entries per stream
  full_pool_refuses(w);
}

// Restores that fail one after another (a truncation, a resealed field, a full pool, a flip)
// leave nothing behind: the destination then behaves exactly as its twin that saw none of them.
TEST_CASE("snapshot: a run of rejected restores leaves the destination as its twin", "[snapshot][reject]") {
  rejection_world_of<precise_spec> w(5);
  std::vector<std::byte> cut(w.bytes.begin(), w.bytes.end() - 7), resealed = w.bytes, flipped = w.bytes;
  put_u64(resealed, kLayer, std::uint64_t{1} << 62);  // tokens
  reseal(resealed, 2);
  flipped[w.bytes.size() / 2] ^= std::byte{4};
  for (int round = 0; round < 3; ++round) {
    REQUIRE(expect_rejected(w, cut, "truncated at byte") == "");
    REQUIRE(expect_rejected(w, resealed, "tokens = 4611686018427387904") == "");
    REQUIRE(expect_rejected(w, flipped, "checksum mismatch") == "");
  }
  REQUIRE(w.destination.sequences() == 2);
  w.check_twin();
}

TEST_CASE("snapshot: a corrupt entry section releases the pages it was restoring into", "[snapshot][reject]") {
  rejection_world w(29);
  // The last byte of stream 1's entries: found only after both streams' pages were allocated.
  const std::size_t header = 160 + 200 * 2;
  const std::size_t last = header + get_u64(w.bytes, table_at(2) + 8) + get_u64(w.bytes, table_at(2) + 32) - 1;
  std::vector<std::byte> b = w.bytes;
  b[last] ^= std::byte{0x10};
  REQUIRE(expect_rejected(w, b, "section 1 (stream 1 entries) checksum mismatch") == "");
  w.check_twin();
}

// ---- the fingerprint ------------------------------------------------------------------------------

// One stream with every configurable field set to something other than its default.
using rich_policy = compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>;
template <class Policy>
using rich_stream = stream_compressor<Policy>;

struct rich_spec {
  geometry geom{2, 4, 1, anchor_mode::block_end};
  stream_config config = [] {
    stream_config c = phasekv_test::stream_of("rich", stream_role::key_value, 8, 2, input_layout::per_slot);
    c.rope.channels = 4;
    c.rope.base = 500.0;
    c.rope.layout = rope_layout::interleaved;
    c.rope.yarn.enabled = true;
    c.rope.yarn.factor = 4.0;
    c.rope.yarn.original_context = 64;
    c.rope.yarn.beta_fast = 16.0;
    c.rope.yarn.beta_slow = 2.0;
    c.norm_eps = 1e-5;
    return c;
  }();
  std::uint32_t bias_seed = 1, weight_seed = 2;
  bool with_bias = true, with_weight = true;
  cache_config cache = phasekv_test::cache_of("rich", 3, 20, 2, raw_window_config{3, 2, 8, 5});

  template <class Policy>
  stream_compressor<Policy> stream() const {
    stream_params p;
    if constexpr (is_gated_v<typename Policy::pooling>) {
      std::mt19937 rng(bias_seed);
      if (with_bias)
        p.slot_bias = phasekv_test::random_bias(
            rng, static_cast<std::size_t>(config.kv_heads * geom.window *
                                          gate_channels<typename Policy::pooling>(config.channels)));
    }
    if constexpr (has_norm_v<Policy>) {
      std::mt19937 rng(weight_seed);
      if (with_weight) p.norm_weight = phasekv_test::random_norm_weight(rng, static_cast<std::size_t>(config.channels));
    }
    if constexpr (std::is_same_v<typename Policy::pooling, fixed_weight_pool>) {
      std::mt19937 rng(bias_seed);
      p.slot_profile = phasekv_test::random_profile(rng, static_cast<std::size_t>(geom.window));
    }
    return stream_compressor<Policy>(geom, config, p);
  }
  template <class... Policies>
  paged_cache<stream_compressor<Policies>...> make() const {
    return paged_cache<stream_compressor<Policies>...>(
        layer_compressor<stream_compressor<Policies>...>(stream<Policies>()...), cache);
  }
};

// A snapshot of `source` (12 tokens) restored into `destination`: "" when the message names `field`.
template <class Source, class Destination>
std::string rejects(Source& source, Destination& destination, const std::string& field) {
  shape_of<Source> s(source);
  std::mt19937 rng(12);
  const sequence_id id = source.create();
  append(source, id, s.random(rng, 12));
  const std::vector<std::byte> bytes = snapshot(source, id);
  const std::int64_t sequences = destination.sequences();
  std::vector<std::int64_t> used;
  for (std::size_t k = 0; k < Destination::stream_count; ++k) used.push_back(destination.pool(k).used_pages());
  try {
    restore(destination, bytes);
  } catch (const input_error& e) {
    const std::string m = e.what();
    if (m.rfind("snapshot: ", 0) != 0 || m.find(field) == std::string::npos)
      return "message '" + m + "' does not name '" + field + "'";
    if (destination.sequences() != sequences) return "a sequence was added";
    for (std::size_t k = 0; k < Destination::stream_count; ++k)
      if (destination.pool(k).used_pages() != used[k]) return "pages stayed allocated";
    return "";
  }
  return "accepted";
}

TEST_CASE("snapshot: each field of the fingerprint, changed, is rejected by name", "[snapshot][reject]") {
  const rich_spec base;
  {  // the unchanged configuration is accepted (page size, capacity and names may differ)
    auto source = base.make<rich_policy>();
    rich_spec other = base;
    other.cache.name = "elsewhere";
    other.cache.page_size = 5;
    other.cache.pages = 7;
    other.config.name = "renamed";
    auto destination = other.make<rich_policy>();
    REQUIRE(rejects(source, destination, "") == "accepted");
  }
  using change = std::pair<std::string, void (*)(rich_spec&)>;
  const change changes[] = {
      {"stride 2 does not match the cache's 3", [](rich_spec& s) { s.geom.stride = 3, s.geom.window = 6, s.geom.origin = 0; }},
      {"window 4 does not match the cache's 5", [](rich_spec& s) { s.geom.window = 5; }},
      {"origin 1 does not match the cache's 0", [](rich_spec& s) { s.geom.origin = 0; }},
      {"anchor block_end does not match the cache's window_centre", [](rich_spec& s) { s.geom.anchor = anchor_mode::window_centre; }},
      {"window.tokens 3 does not match the cache's 4", [](rich_spec& s) { s.cache.window.tokens = 4; }},
      {"window.tokens 3 does not match the cache's 0", [](rich_spec& s) { s.cache.window.tokens = 0; }},
      {"window.kv_heads 2 does not match the cache's 1", [](rich_spec& s) { s.cache.window.kv_heads = 1; }},
      {"window.key_channels 8 does not match the cache's 6", [](rich_spec& s) { s.cache.window.key_channels = 6; }},
      {"window.value_channels 5 does not match the cache's 0", [](rich_spec& s) { s.cache.window.value_channels = 0; }},
      {"stream 0 (rich) role key_value does not match the cache's indexer", [](rich_spec& s) { s.config.role = stream_role::indexer; }},
      {"stream 0 (rich) channels 8 does not match the cache's 10", [](rich_spec& s) { s.config.channels = 10; }},
      {"stream 0 (rich) kv_heads 2 does not match the cache's 1", [](rich_spec& s) { s.config.kv_heads = 1; }},
      {"stream 0 (rich) inputs per_slot does not match the cache's per_branch", [](rich_spec& s) { s.config.inputs = input_layout::per_branch; }},
      {"stream 0 (rich) rope.channels 4 does not match the cache's 6", [](rich_spec& s) { s.config.rope.channels = 6; }},
      {"stream 0 (rich) rope.base 500 does not match the cache's 10000", [](rich_spec& s) { s.config.rope.base = 10000.0; }},
      {"stream 0 (rich) rope.layout interleaved does not match the cache's half_split", [](rich_spec& s) { s.config.rope.layout = rope_layout::half_split; }},
      {"stream 0 (rich) rope.yarn.enabled 1 does not match the cache's 0", [](rich_spec& s) { s.config.rope.yarn.enabled = false; }},
      {"stream 0 (rich) rope.yarn.factor 4 does not match the cache's 8", [](rich_spec& s) { s.config.rope.yarn.factor = 8.0; }},
      {"stream 0 (rich) rope.yarn.original_context 64 does not match the cache's 128", [](rich_spec& s) { s.config.rope.yarn.original_context = 128; }},
      {"stream 0 (rich) rope.yarn.beta_fast 16 does not match the cache's 32", [](rich_spec& s) { s.config.rope.yarn.beta_fast = 32.0; }},
      {"stream 0 (rich) rope.yarn.beta_slow 2 does not match the cache's 1", [](rich_spec& s) { s.config.rope.yarn.beta_slow = 1.0; }},
      {"stream 0 (rich) norm_eps 1.0000000000000001e-05 does not match the cache's 9.9999999999999995e-07", [](rich_spec& s) { s.config.norm_eps = 1e-6; }},
      {"stream 0 (rich) slot_bias (64 floats, CRC-32C", [](rich_spec& s) { s.bias_seed = 99; }},
      {"stream 0 (rich) slot_bias (64 floats", [](rich_spec& s) { s.with_bias = false; }},
      {"stream 0 (rich) norm_weight (8 floats, CRC-32C", [](rich_spec& s) { s.weight_seed = 99; }},
      {"stream 0 (rich) entries are stored as f32; the cache stores bf16, a lossy conversion", [](rich_spec& s) { s.cache.storage = storage_type::bf16; }},
  };
  for (const auto& [field, apply] : changes) {
    INFO(field);
    auto source = base.make<rich_policy>();
    rich_spec other = base;
    apply(other);
    auto destination = other.make<rich_policy>();
    REQUIRE(rejects(source, destination, field) == "");
  }
  SECTION("the compile-time policy: pooling, RoPE placement, norm") {
    auto source = base.make<rich_policy>();
    auto mean = base.make<compressor_policy<mean_pool, rope_after_pool, rms_norm>>();
    REQUIRE(rejects(source, mean, "stream 0 (rich) pooling vector gates does not match the cache's mean") == "");
    auto scalar = base.make<compressor_policy<scalar_gated_pool, rope_after_pool, rms_norm>>();
    REQUIRE(rejects(source, scalar, "pooling vector gates does not match the cache's scalar gates") == "");
    auto before = base.make<compressor_policy<vector_gated_pool, rope_before_pool, rms_norm>>();
    REQUIRE(rejects(source, before, "stream 0 (rich) RoPE placement after pooling does not match the cache's before pooling") == "");
    auto plain = base.make<compressor_policy<vector_gated_pool, no_rope, rms_norm>>();
    REQUIRE(rejects(source, plain, "RoPE placement after pooling does not match the cache's none") == "");
    auto unnormed = base.make<compressor_policy<vector_gated_pool, rope_after_pool, no_norm>>();
    REQUIRE(rejects(source, unnormed, "stream 0 (rich) norm RMSNorm does not match the cache's none") == "");
  }
  SECTION("the slot profile of fixed weights") {
    using fixed = compressor_policy<fixed_weight_pool, rope_after_pool, rms_norm>;
    auto source = base.make<fixed>();
    rich_spec other = base;
    other.bias_seed = 5;
    auto destination = other.make<fixed>();
    REQUIRE(rejects(source, destination, "stream 0 (rich) slot_profile (4 floats, CRC-32C") == "");
  }
  SECTION("the number of streams, and the stream a mismatch is in") {
    auto source = base.make<rich_policy>();
    auto two = base.make<rich_policy, rich_policy>();
    REQUIRE(rejects(source, two, "stream count 1 does not match the cache's 2") == "");
    auto pair = base.make<rich_policy, rich_policy>();
    auto mixed = base.make<rich_policy, compressor_policy<vector_gated_pool, rope_after_pool, no_norm>>();
    REQUIRE(rejects(pair, mixed, "stream 1 (rich) norm RMSNorm does not match the cache's none") == "");
  }
}

// ==================================================================================================
// The parts a snapshot is made of: paged_cache::parts lends a sequence's record, adopt makes one.

// A copy of `source`'s sequence made through parts() and adopt() alone: states and window copied,
// the entries' bytes copied page by page (both caches share a layout).
template <class Cache>
sequence_id adopt_copy(const Cache& from, sequence_id id, Cache& to) {
  const typename Cache::sequence_parts p = from.parts(id);
  typename Cache::layer::states states;
  for (std::size_t k = 0; k < Cache::stream_count; ++k) states[k] = *p.states[k];
  return to.adopt(p.tokens, std::move(states), raw_window(*p.window),
                  [&](std::size_t k, page_pool& pool, const std::vector<page_id>& pages) {
                    REQUIRE(pages.size() == p.tables[k]->size());
                    for (std::size_t i = 0; i < pages.size(); ++i)
                      std::memcpy(pool.data(pages[i]), from.pool(k).data((*p.tables[k])[i]),
                                  static_cast<std::size_t>(pool.layout().page_stride_bytes));
                  });
}

TEST_CASE("snapshot parts: a sequence adopted from another's parts is that sequence", "[snapshot][parts]") {
  rejection_world_of<precise_spec> w(9, true);  // a fork: its last page shared, then copied
  const sequence_id source = w.source.live_sequences().back();
  const sequence_id copy = adopt_copy(w.source, source, w.destination);
  REQUIRE(same_sequence(w.source, source, w.destination, copy) == "");
  REQUIRE(snapshot(w.destination, copy) == w.bytes);
  // Both go on alike: appends and a rollback into the history.
  std::mt19937 rng(4);
  for (std::int64_t n : {1, 3, 2}) {
    const token_inputs<2> more = w.shape.random(rng, n);
    append(w.source, source, more);
    append(w.destination, copy, more);
    REQUIRE(same_sequence(w.source, source, w.destination, copy) == "");
  }
  w.source.remove_suffix(source, w.source.tokens(source) - 1);
  w.destination.remove_suffix(copy, w.destination.tokens(copy) - 1);
  REQUIRE(same_sequence(w.source, source, w.destination, copy) == "");
}

TEST_CASE("snapshot parts: adopt refuses parts of another cache, and a failing writer, with nothing changed",
          "[snapshot][parts]") {
  rejection_world_of<precise_spec> w(9);
  const sequence_id source = w.source.live_sequences().back();
  const precise_cache::sequence_parts p = w.source.parts(source);
  const auto states = [&] {
    precise_cache::layer::states s;
    for (std::size_t k = 0; k < 2; ++k) s[k] = *p.states[k];
    return s;
  };
  const auto no_entries = [](std::size_t, page_pool&, const std::vector<page_id>&) {};
  const auto refused = [&](auto&& call, const std::string& expected) -> std::string {
    const phasekv_test::cache_dump before = w.dump();
    try {
      call();
      return "accepted";
    } catch (const input_error& e) {
      if (std::string(e.what()).find(expected) == std::string::npos) return std::string("message: ") + e.what();
    }
    const phasekv_test::cache_dump after = w.dump();
    return after == before ? "" : "changed: " + phasekv_test::first_difference(before, after);
  };
  // States for other tokens, or from another compressor (another geometry).
  REQUIRE(refused([&] { w.destination.adopt(p.tokens + 1, states(), raw_window(*p.window), no_entries); },
                  "destination.adopt: states[0].tokens") == "");
  const geometry other{3, 3};
  stream_config kv = w.source.compressors().config(0), ix = w.source.compressors().config(1);
  const precise_cache::layer foreign(precise_kv(other, kv), precise_kv(other, ix));
  REQUIRE(refused([&] { w.destination.adopt(0, foreign.make_state(1), raw_window(*p.window), no_entries); },
                  "was not made for this compressor") == "");
  // A window for another history, or another precision.
  raw_window_config window = w.source.config().window;
  REQUIRE(refused([&] { w.destination.adopt(p.tokens, states(), raw_window(window, 3), no_entries); },
                  "destination.adopt: window.rows()") == "");
  window.precision = storage_type::f32;
  window.rope_channels = 0;
  REQUIRE(refused([&] { w.destination.adopt(p.tokens, states(), raw_window(window, 1), no_entries); },
                  "window.rows()") == "");
  // A writer that throws once every page is allocated: they go back, last first (the twin check).
  const phasekv_test::cache_dump before = w.dump();
  std::size_t writes = 0;
  REQUIRE_THROWS_WITH(w.destination.adopt(p.tokens, states(), raw_window(*p.window),
                                          [&](std::size_t k, page_pool&, const std::vector<page_id>& pages) {
                                            REQUIRE(!pages.empty());
                                            if (++writes == 2) throw input_error("writer of stream " + std::to_string(k));
                                          }),
                      "writer of stream 1");
  REQUIRE(phasekv_test::first_difference(before, w.dump()) == "");
  w.check_twin();
}

}  // namespace

}  // namespace test_cache_snapshot
