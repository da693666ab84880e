// Allocation-failure injection into sequence snapshots (cache/snapshot.hpp): restore() must leave
// the destination exactly as it was whichever allocation inside it fails — once, or from then on
// (so the error paths that allocate are exercised too) — and throw std::bad_alloc or
// capacity_error; the same restore with memory back must then give exactly what it gives in a
// world that never saw a fault (the same dump, down to which pages the sequence received, so the
// pool's free list was restored exactly). snapshot() likewise throws and then writes the same
// bytes.
//
// This file is part of phasekv_fault_tests and drives the operator new that
// tests/fault/test_fault_injection.cpp installs for the whole binary.

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "oracle/cache_dump.hpp"
#include "oracle/snapshot_format.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"

namespace fault {  // tests/fault/test_fault_injection.cpp
void arm(long n, bool keep_failing);
bool disarm();
void arm_tracking();
std::size_t largest_since();
}  // namespace fault

namespace {

using namespace phasekv;
using i64 = std::int64_t;

// Gated values with RMSNorm and mean-pooled keys; a raw window with separate values; history 1.
using key_stream = stream_compressor<compressor_policy<mean_pool>>;
using value_stream = stream_compressor<compressor_policy<vector_gated_pool, no_rope, rms_norm>>;
using snap_cache = paged_cache<key_stream, value_stream>;

snap_cache make_cache(storage_type storage) {
  const geometry g{2, 3};
  stream_config k;
  k.name = "keys";
  k.channels = 3;
  stream_config v;
  v.name = "values";
  v.channels = 2;
  cache_config cc;
  cc.page_size = 2;
  cc.pages = 24;
  cc.storage = storage;
  cc.history = 1;
  cc.window.tokens = 2;
  cc.window.key_channels = 3;
  cc.window.value_channels = 2;
  return snap_cache(layer_compressor<key_stream, value_stream>(key_stream(g, k), value_stream(g, v)), cc);
}

// n uniform values in [−1, 1) from rng.
std::vector<float> uniform(std::mt19937& rng, i64 n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& f : x) f = u(rng);
  return x;
}

void append_tokens(snap_cache& cache, sequence_id id, i64 tokens, unsigned seed) {
  std::mt19937 rng(seed);
  const auto values = [&](i64 n) { return uniform(rng, n); };
  const auto& k = cache.compressors().stream<0>();
  const auto& v = cache.compressors().stream<1>();
  const auto keys = values(tokens * k.payload_floats_per_token());
  const auto payload = values(tokens * v.payload_floats_per_token());
  const auto logits = values(tokens * v.logit_floats_per_token());
  cache.append(id, {token_chunk{tokens, keys, {}}, token_chunk{tokens, payload, logits}}, values(tokens * 3),
               values(tokens * 2));
}

// The snapshot of a 13-token sequence (6 entries per stream, one token pending) in `storage`.
std::vector<std::byte> snapshot_bytes(storage_type storage) {
  snap_cache source = make_cache(storage);
  const sequence_id s = source.create();
  append_tokens(source, s, 13, 7);
  return snapshot(source, s);
}

// Gives a destination a forked pair (sharing pages) and a hole in its free list.
template <class Cache, class Append>
void populate(Cache& cache, Append append) {
  const sequence_id a = cache.create();
  append(cache, a, 7, 1);
  const sequence_id b = cache.fork(a);
  append(cache, b, 1, 2);
  const sequence_id c = cache.create();
  append(cache, c, 5, 3);
  cache.free(c);
}

struct world {
  snap_cache cache = make_cache(storage_type::f32);
  world() { populate(cache, append_tokens); }
};

// Restores `bytes` into a fresh World for n = 1, 2, … with the n-th allocation failing (once, or
// from then on): each failure throws bad_alloc or capacity_error and leaves the destination's full
// dump as it was, and the same restore with memory back gives exactly what a world that never
// failed gives. Returns how many failures were injected.
template <class World>
long restore_under_faults(const std::vector<std::byte>& bytes, const std::string& what) {
  World reference;
  restore(reference.cache, bytes);
  const phasekv_test::cache_dump expected = phasekv_test::dump(reference.cache);
  long failures = 0;
  for (bool keep_failing : {false, true}) {
    for (long n = 1;; ++n) {
      World w;
      const phasekv_test::cache_dump before = phasekv_test::dump(w.cache);
      bool threw = false;
      std::string thrown;
      fault::arm(n, keep_failing);
      try {
        restore(w.cache, bytes);
      } catch (const std::bad_alloc&) {
        threw = true;
        thrown = "std::bad_alloc";
      } catch (const capacity_error& e) {
        threw = true;
        thrown = e.what();
      }
      const bool fired = fault::disarm();
      INFO(what << ": allocation " << n << (keep_failing ? " and every later one" : "") << " failed; threw " << thrown);
      if (!fired) {
        REQUIRE_FALSE(threw);
        REQUIRE(phasekv_test::first_difference(phasekv_test::dump(w.cache), expected) == "");
        break;
      }
      ++failures;
      REQUIRE(threw);
      REQUIRE(phasekv_test::first_difference(phasekv_test::dump(w.cache), before) == "");
      restore(w.cache, bytes);  // with memory back
      REQUIRE(phasekv_test::first_difference(phasekv_test::dump(w.cache), expected) == "");
    }
  }
  return failures;
}

TEST_CASE("fault injection: restore keeps the destination unchanged when an allocation fails", "[snapshot][fault]") {
  for (storage_type from : {storage_type::f32, storage_type::bf16})  // bf16: the widening path too
    REQUIRE(restore_under_faults<world>(snapshot_bytes(from), "from " + std::string(to_string(from))) >= 10);
}

// ---- DeepSeek-V4's precision: FP8 entries, FP4 indexer keys, an FP8 raw window --------------

using precise_stream = stream_compressor<compressor_policy<mean_pool>>;
using precise_cache = paged_cache<precise_stream, precise_stream>;

precise_cache make_precise_cache() {
  const geometry g{2, 2};
  stream_config kv;
  kv.name = "kv";
  kv.channels = 64;
  stream_config ix;
  ix.name = "indexer";
  ix.role = stream_role::indexer;
  ix.channels = 32;
  cache_config cc;
  cc.page_size = 2;
  cc.pages = 24;
  cc.history = 1;
  cc.stream_storage = {storage_type::fp8_e4m3_block, storage_type::fp4_e2m1_hadamard};
  cc.window.tokens = 2;
  cc.window.key_channels = 64;
  cc.window.precision = storage_type::fp8_e4m3_block;
  cc.window.rope_channels = 8;
  return precise_cache(layer_compressor<precise_stream, precise_stream>(precise_stream(g, kv), precise_stream(g, ix)), cc);
}

void append_precise(precise_cache& cache, sequence_id id, i64 tokens, unsigned seed) {
  std::mt19937 rng(seed);
  const auto kv = uniform(rng, tokens * 64), ix = uniform(rng, tokens * 32);
  cache.append(id, {token_chunk{tokens, kv, {}}, token_chunk{tokens, ix, {}}}, uniform(rng, tokens * 64));
}

struct precise_world {
  precise_cache cache = make_precise_cache();
  precise_world() { populate(cache, append_precise); }
};

// The snapshot of a fork (sharing its parent's pages) 13 tokens long: 6 entries, one token pending.
std::vector<std::byte> precise_snapshot() {
  precise_cache source = make_precise_cache();
  const sequence_id parent = source.create();
  append_precise(source, parent, 12, 7);
  const sequence_id s = source.fork(parent);
  append_precise(source, s, 1, 8);
  return snapshot(source, s);
}

TEST_CASE("fault injection: an FP8/FP4 restore of a forked sequence keeps the destination unchanged",
          "[snapshot][fault]") {
  REQUIRE(restore_under_faults<precise_world>(precise_snapshot(), "fp8/fp4") >= 10);
}

// A resealed snapshot (valid checksums) whose sizes are absurd is refused from its header, before
// anything is allocated for them: nothing larger than an error message's few hundred bytes.
TEST_CASE("fault injection: absurd sizes in a resealed snapshot are refused before any allocation",
          "[snapshot][fault]") {
  using namespace phasekv_test;
  const std::vector<std::byte> good = precise_snapshot();
  const std::size_t table = table_at(2);
  struct absurd {
    const char* what;
    std::size_t at;
    std::uint64_t value;
  };
  const absurd cases[] = {
      {"tokens", kLayer, std::uint64_t{1} << 47},
      {"tokens past the limit", kLayer, std::uint64_t{1} << 62},
      {"history", kLayer + 48, std::uint64_t{1} << 40},
      {"an entry section's length", table + 8, std::uint64_t{1} << 40},
      {"the window section's length", table + 4 * 24 + 8, std::uint64_t{1} << 40},
      {"a state section's length", table + 2 * 24 + 8, std::uint64_t{1} << 33},
  };
  for (const absurd& c : cases) {
    INFO(c.what);
    std::vector<std::byte> b = good;
    put_u64(b, c.at, c.value);
    reseal(b, 2);
    precise_world w;
    const phasekv_test::cache_dump before = phasekv_test::dump(w.cache);
    fault::arm_tracking();
    REQUIRE_THROWS_AS(restore(w.cache, b), input_error);
    fault::disarm();
    CHECK(fault::largest_since() <= 4096);
    REQUIRE(phasekv_test::first_difference(phasekv_test::dump(w.cache), before) == "");
  }
}

TEST_CASE("fault injection: snapshot() throws when its buffer cannot be allocated, then writes the same bytes",
          "[snapshot][fault]") {
  snap_cache source = make_cache(storage_type::f32);
  const sequence_id s = source.create();
  append_tokens(source, s, 13, 7);
  const std::vector<std::byte> expected = snapshot(source, s);
  const phasekv_test::cache_dump before = phasekv_test::dump(source);
  for (long n = 1;; ++n) {
    bool threw = false;
    fault::arm(n, false);
    try {
      (void)snapshot(source, s);
    } catch (const std::bad_alloc&) {
      threw = true;
    } catch (const capacity_error&) {
      threw = true;
    }
    const bool fired = fault::disarm();
    INFO("allocation " << n << " failed");
    REQUIRE(threw == fired);
    REQUIRE(phasekv_test::first_difference(phasekv_test::dump(source), before) == "");
    REQUIRE(snapshot(source, s) == expected);
    if (!fired) break;
  }
}

}  // namespace
