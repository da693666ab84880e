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
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"

namespace fault {  // tests/fault/test_fault_injection.cpp
void arm(long n, bool keep_failing);
bool disarm();
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

void append_tokens(snap_cache& cache, sequence_id id, i64 tokens, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto values = [&](i64 n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& f : x) f = u(rng);
    return x;
  };
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

// A destination with a forked pair (sharing pages) and a hole in its free list.
struct world {
  snap_cache cache = make_cache(storage_type::f32);
  world() {
    const sequence_id a = cache.create();
    append_tokens(cache, a, 7, 1);
    const sequence_id b = cache.fork(a);
    append_tokens(cache, b, 1, 2);
    const sequence_id c = cache.create();
    append_tokens(cache, c, 5, 3);
    cache.free(c);
  }
};

TEST_CASE("fault injection: restore keeps the destination unchanged when an allocation fails", "[snapshot][fault]") {
  for (storage_type from : {storage_type::f32, storage_type::bf16}) {  // bf16: the widening path too
    const std::vector<std::byte> bytes = snapshot_bytes(from);
    world reference;
    restore(reference.cache, bytes);
    const phasekv_test::cache_dump expected = phasekv_test::dump(reference.cache);
    for (bool keep_failing : {false, true}) {
      long failures = 0;
      for (long n = 1;; ++n) {
        world w;
        const phasekv_test::cache_dump before = phasekv_test::dump(w.cache);
        bool threw = false;
        std::string what;
        fault::arm(n, keep_failing);
        try {
          restore(w.cache, bytes);
        } catch (const std::bad_alloc&) {
          threw = true;
          what = "std::bad_alloc";
        } catch (const capacity_error& e) {
          threw = true;
          what = e.what();
        }
        const bool fired = fault::disarm();
        INFO("from " << to_string(from) << ": allocation " << n << (keep_failing ? " and every later one" : "")
                     << " failed; threw " << what);
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
      REQUIRE(failures >= 5);  // restore allocates: the loop really injected failures
    }
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
