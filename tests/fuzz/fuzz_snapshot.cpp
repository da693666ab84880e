// libFuzzer target for snapshot restore from hostile bytes: a valid snapshot of a small
// sequence, edited by the input, restored into a destination that holds other sequences, and
// checked against a twin destination that never sees a hostile restore. tests/fuzz/README.md says
// how to run it; scripts/fuzz --target snapshot builds and runs it.
//
// Input bytes, read front to back (a byte past the end reads as 0, so every input decodes):
//   1. the source: which layer (f32 keys with a gated, RMS-normed value stream; or FP8 K/V, FP4
//      indexer keys and an FP8 raw window), 1–24 tokens (odd counts leave a compressor token
//      pending), whether the snapshot is of a fork (pages shared with its parent), a value seed;
//   2. up to 8 edits of the snapshot's bytes: flip a bit, set a byte, set a little-endian u64
//      (sizes, counts), truncate, or insert a byte — at a position taken modulo the length;
//   3. whether to reseal: recompute every checksum (tests/oracle/snapshot_format.hpp), so edits
//      reach the parser's checks of values, sizes and consistency instead of a checksum.
//
// Checks, each a "phasekv fuzz: FAILED" and an abort when it does not hold:
//   (i)   restore throws input_error or capacity_error, or succeeds — nothing else, no sanitizer
//         report;
//   (ii)  a refused restore leaves the destination's full dump (pages, reference counts,
//         sequences, states, windows) unchanged;
//   (iii) an unedited snapshot restores to the source sequence exactly (the same snapshot bytes);
//   (iv)  an accepted one is a sequence the cache can use: its own snapshot restores into a fresh
//         cache and snapshots to the same bytes, and it takes an append (or, a state without its
//         next entry's inputs, refuses one as host-fed);
//   (v)   afterwards the destination and its twin behave the same: the same valid restore and
//         append give the same dumps (so nothing a refused restore did lingers — a page off the
//         free list, a sequence id consumed, a pool count).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "oracle/cache_dump.hpp"
#include "oracle/snapshot_format.hpp"
#include "support/small_layers.hpp"
#include "harness.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"

namespace {

using namespace phasekv;
using i64 = std::int64_t;
using phasekv_fuzz::fail;

bool tracing() {
  static const bool on = std::getenv("PHASEKV_FUZZ_TRACE") != nullptr;
  return on;
}

// The two layers (tests/support/small_layers.hpp): f32 keys with a gated, RMS-normed value stream;
// FP8 K/V, FP4 indexer keys and an FP8 raw window.
using phasekv_test::append_tokens;
using phasekv_test::gated_cache;
using phasekv_test::precise_cache;

gated_cache make_gated(i64 pages) { return gated_cache(phasekv_test::gated_layer(), phasekv_test::gated_config("cache", pages)); }
precise_cache make_precise(i64 pages) {
  return precise_cache(phasekv_test::precise_layer(), phasekv_test::precise_config("cache", pages));
}

// append_tokens(cache, id, tokens, seed) with the tokens drawn once per (tokens, seed) for each
// cache type (the same shapes): drawing them — a log per value in uniform_real_distribution —
// took a sixth of a run when the destination was populated afresh for every input.
template <class Cache>
void append_drawn(Cache& cache, sequence_id id, i64 tokens, unsigned seed) {
  using inputs = decltype(phasekv_test::random_tokens(cache, tokens, std::declval<std::mt19937&>()));
  static phasekv_fuzz::memo<std::pair<i64, unsigned>, inputs> drawn(4096);
  const inputs& in = drawn.get({tokens, seed}, [&] {
    std::mt19937 rng(seed);
    return std::make_unique<inputs>(phasekv_test::random_tokens(cache, tokens, rng));
  });
  phasekv_test::append(cache, id, in);
}

// phasekv_test::populate with drawn tokens: a forked pair (7 tokens, and a fork one token further,
// its last page copied on write) and a hole in the free list (a 3-token sequence, freed).
template <class Cache>
void populate_drawn(Cache& cache) {
  const sequence_id x = cache.create();
  append_drawn(cache, x, 7, 1u);
  const sequence_id y = cache.fork(x);
  append_drawn(cache, y, 1, 2u);
  const sequence_id z = cache.create();
  append_drawn(cache, z, 3, 3u);
  cache.free(z);
}

// What the first source bytes determine, made once per key (harness.hpp's memo): the valid
// snapshot, and a twin destination's dump after the same valid restore and append that check (v)
// gives the destination — the twin never sees a hostile restore, so it need not be rebuilt for
// every input. Likewise the populated destination's dump before any restore.
struct source {
  std::vector<std::byte> valid;
  phasekv_test::cache_dump twin_after;
};
using source_key = std::tuple<bool, i64, bool, std::uint32_t>;

template <class Cache, class Make>
const phasekv_test::cache_dump& populated_dump(Make make) {
  static const phasekv_test::cache_dump dump = [&] {
    Cache destination = make(24);
    populate_drawn(destination);
    return phasekv_test::dump(destination);
  }();
  return dump;
}

template <class Cache, class Make>
const source& source_of(bool precise, i64 tokens, bool forked, std::uint32_t seed, Make make) {
  static phasekv_fuzz::memo<source_key, source> sources(4096);
  return sources.get(source_key{precise, tokens, forked, seed}, [&] {
    auto made = std::make_unique<source>();
    Cache cache = make(32);
    sequence_id s = cache.create();
    append_tokens(cache, s, tokens, seed);
    if (forked) {
      const sequence_id f = cache.fork(s);
      append_tokens(cache, f, 1, seed + 1);
      s = f;
    }
    made->valid = snapshot(cache, s);
    Cache twin = make(24);
    populate_drawn(twin);
    append_drawn(twin, restore(twin, made->valid), 2, 5);
    made->twin_after = phasekv_test::dump(twin);
    return made;
  });
}

template <class Cache, class Make>
void run(phasekv_fuzz::input_bytes& in, bool precise, Make make) {
  const i64 tokens = 1 + in.byte() % 24;
  const bool forked = in.byte() & 1;
  const std::uint32_t seed = in.byte();

  // The source's snapshot.
  const source& src = source_of<Cache>(precise, tokens, forked, seed, make);
  const std::vector<std::byte>& valid = src.valid;
  std::vector<std::byte> bytes = valid;

  // The edits.
  const int edits = in.byte() % 9;
  phasekv_fuzz::setup() += " tokens=" + std::to_string(tokens) + (forked ? " forked" : "") + " snapshot=" +
             std::to_string(valid.size()) + "B edits:";
  for (int e = 0; e < edits; ++e) {
    const int op = in.byte() % 5;
    const std::size_t at = bytes.empty() ? 0 : in.u16() % bytes.size();
    const std::uint8_t value = in.byte();
    phasekv_fuzz::setup() += " " + std::to_string(op) + "@" + std::to_string(at);
    if (bytes.empty() && op != 4) continue;
    switch (op) {
      case 0: bytes[at] ^= static_cast<std::byte>(1u << (value % 8)); break;
      case 1: bytes[at] = static_cast<std::byte>(value); break;
      case 2: {  // a u64 field: small, near a power of two, or huge
        const std::uint64_t v = value < 64 ? value : value < 128 ? (std::uint64_t{1} << (value % 64)) + (value & 3) - 1
                                                                 : ~std::uint64_t{0} - value;
        if (at + 8 <= bytes.size()) phasekv_test::put_u64(bytes, at, v);
        break;
      }
      case 3: bytes.resize(at); break;
      case 4: bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::byte>(value)); break;
    }
  }
  const bool resealed = in.byte() & 1;
  if (resealed) phasekv_test::reseal(bytes, 2);
  phasekv_fuzz::setup() += resealed ? " resealed" : "";
  if (tracing()) std::fprintf(stderr, "phasekv fuzz:%s\n", phasekv_fuzz::setup().c_str());

  Cache destination = make(24);
  populate_drawn(destination);
  const phasekv_test::cache_dump& before = populated_dump<Cache>(make);
  bool accepted = false;
  sequence_id restored = -1;
  try {
    restored = restore(destination, bytes);
    accepted = true;
  } catch (const input_error&) {
  } catch (const capacity_error&) {
  } catch (const std::exception& e) {
    fail(std::string("restore threw neither input_error nor capacity_error: ") + e.what());
  }
  if (!accepted) {
    const phasekv_test::cache_dump after = phasekv_test::dump(destination);
    if (after != before) fail("a refused restore changed the destination: " + phasekv_test::first_difference(before, after));
  } else {
    // (iii) an unedited snapshot gives back the source sequence: the same snapshot bytes.
    const std::vector<std::byte> own = snapshot(destination, restored);
    if (bytes == valid && own != valid) fail("an unedited snapshot restored to another sequence");
    // (iv) usable: its own snapshot round-trips through a fresh cache, and it takes an append.
    Cache fresh = make(32);
    if (snapshot(fresh, restore(fresh, own)) != own) fail("an accepted snapshot does not round-trip");
    try {
      append_drawn(destination, restored, 3, 99);
    } catch (const capacity_error&) {  // the destination may be full
    } catch (const input_error& e) {
      // A state that holds none of its next entry's inputs (intact_from up to tokens: entries the
      // host computed, paged_cache::append_entries) takes host entries only.
      if (std::string(e.what()).find("continue with host-computed entries") == std::string::npos) throw;
    }
    destination.free(restored);
  }
  // (v) the destination and its twin: the same valid restore and append, the same dumps.
  if (!accepted) {
    append_drawn(destination, restore(destination, valid), 2, 5);
    const phasekv_test::cache_dump dx = phasekv_test::dump(destination);
    if (dx != src.twin_after)
      fail("after a refused restore the destination and its twin differ: " + phasekv_test::first_difference(dx, src.twin_after));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  phasekv_fuzz::input_bytes in{data, size};
  const bool precise = in.byte() & 1;
  phasekv_fuzz::setup() = precise ? "fp8/fp4 layer" : "f32 layer";
  if (precise) run<precise_cache>(in, true, make_precise);
  else run<gated_cache>(in, false, make_gated);
  return 0;
}
