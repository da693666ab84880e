// Allocation-failure injection into sequence snapshots (cache/snapshot.hpp): restore() must leave
// the destination exactly as it was whichever allocation inside it fails — once, or from then on
// (so the error paths that allocate are exercised too) — and throw std::bad_alloc or
// capacity_error; the same restore with memory back must then give exactly what it gives in a
// world that never saw a fault (the same dump, down to which pages the sequence received, so the
// pool's free list was restored exactly). snapshot() likewise throws and then writes the same
// bytes.
//
// This file is part of phasekv_fault_tests and drives the operator new that
// tests/fault/test_fault_injection.cpp installs for the whole binary (tests/fault/injector.hpp).

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fault/injector.hpp"
#include "oracle/cache_dump.hpp"
#include "oracle/snapshot_format.hpp"
#include "support/small_layers.hpp"
#include "phasekv/cache/snapshot.hpp"

namespace {

using namespace phasekv;
using phasekv_test::append_tokens;
using phasekv_test::gated_cache;
using phasekv_test::precise_cache;

// A destination (the small gated layer, tests/support/small_layers.hpp) holding a forked pair and
// a hole in its free list.
struct world {
  gated_cache cache{phasekv_test::gated_layer(), phasekv_test::gated_config("destination", 24)};
  world() { phasekv_test::populate(cache); }
  phasekv_test::cache_dump dump() const { return phasekv_test::dump(cache); }
};

// The snapshot of a 13-token sequence of the gated layer (6 entries per stream, one token
// pending), its entries stored as `storage`.
std::vector<std::byte> snapshot_bytes(storage_type storage) {
  gated_cache source(phasekv_test::gated_layer(), phasekv_test::gated_config("source", 24, storage));
  const sequence_id s = source.create();
  append_tokens(source, s, 13, 7u);
  return snapshot(source, s);
}

// Restores `bytes` under every injected failure, once and from then on (fault::check_strong_guarantee):
// how many failures were injected.
template <class World>
long restore_under_faults(const std::vector<std::byte>& bytes, const std::string& what) {
  const auto op = [&](World& w) { restore(w.cache, bytes); };
  return fault::check_strong_guarantee<World>(what, op, false) + fault::check_strong_guarantee<World>(what, op, true);
}

TEST_CASE("fault injection: restore keeps the destination unchanged when an allocation fails", "[snapshot][fault]") {
  for (storage_type from : {storage_type::f32, storage_type::bf16})  // bf16: the widening path too
    REQUIRE(restore_under_faults<world>(snapshot_bytes(from), "from " + std::string(to_string(from))) >= 10);
}

// ---- DeepSeek-V4's precision: FP8 entries, FP4 indexer keys, an FP8 raw window --------------

struct precise_world {
  precise_cache cache{phasekv_test::precise_layer(), phasekv_test::precise_config("destination", 24)};
  precise_world() { phasekv_test::populate(cache); }
  phasekv_test::cache_dump dump() const { return phasekv_test::dump(cache); }
};

// The snapshot of a fork (sharing its parent's pages) 13 tokens long: 6 entries, one token pending.
std::vector<std::byte> precise_snapshot() {
  precise_cache source(phasekv_test::precise_layer(), phasekv_test::precise_config("source", 24));
  const sequence_id parent = source.create();
  append_tokens(source, parent, 12, 7u);
  const sequence_id s = source.fork(parent);
  append_tokens(source, s, 1, 8u);
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
    const phasekv_test::cache_dump before = w.dump();
    fault::arm_tracking();
    REQUIRE_THROWS_AS(restore(w.cache, b), input_error);
    fault::disarm();
    CHECK(fault::largest_since() <= 4096);
    REQUIRE(phasekv_test::first_difference(w.dump(), before) == "");
  }
}

TEST_CASE("fault injection: snapshot() throws when its buffer cannot be allocated, then writes the same bytes",
          "[snapshot][fault]") {
  gated_cache source(phasekv_test::gated_layer(), phasekv_test::gated_config("source", 24));
  const sequence_id s = source.create();
  append_tokens(source, s, 13, 7u);
  const std::vector<std::byte> expected = snapshot(source, s);
  const phasekv_test::cache_dump before = phasekv_test::dump(source);
  for (long n = 1;; ++n) {
    const fault::outcome o = fault::failing(n, false, [&] { (void)snapshot(source, s); });
    INFO("allocation " << n << " failed; threw " << o.what);
    REQUIRE(o.threw == o.fired);
    REQUIRE(phasekv_test::first_difference(phasekv_test::dump(source), before) == "");
    REQUIRE(snapshot(source, s) == expected);
    if (!o.fired) break;
  }
}

}  // namespace
