// libFuzzer target for snapshot restore from hostile bytes (issue 35): a valid snapshot of a small
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
#include <string>
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
using phasekv_test::populate;
using phasekv_test::precise_cache;

gated_cache make_gated(i64 pages) { return gated_cache(phasekv_test::gated_layer(), phasekv_test::gated_config("cache", pages)); }
precise_cache make_precise(i64 pages) {
  return precise_cache(phasekv_test::precise_layer(), phasekv_test::precise_config("cache", pages));
}

template <class Cache, class Make>
void run(phasekv_fuzz::input_bytes& in, Make make) {
  const i64 tokens = 1 + in.byte() % 24;
  const bool forked = in.byte() & 1;
  const std::uint32_t seed = in.byte();

  // The source and its snapshot.
  Cache source = make(32);
  sequence_id s = source.create();
  append_tokens(source, s, tokens, seed);
  if (forked) {
    const sequence_id f = source.fork(s);
    append_tokens(source, f, 1, seed + 1);
    s = f;
  }
  const std::vector<std::byte> valid = snapshot(source, s);
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

  Cache destination = make(24), twin = make(24);
  populate(destination);
  populate(twin);
  const phasekv_test::cache_dump before = phasekv_test::dump(destination);
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
      append_tokens(destination, restored, 3, 99);
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
    const sequence_id x = restore(destination, valid), y = restore(twin, valid);
    append_tokens(destination, x, 2, 5);
    append_tokens(twin, y, 2, 5);
    const phasekv_test::cache_dump dx = phasekv_test::dump(destination), dy = phasekv_test::dump(twin);
    if (dx != dy) fail("after a refused restore the destination and its twin differ: " + phasekv_test::first_difference(dx, dy));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  phasekv_fuzz::input_bytes in{data, size};
  const bool precise = in.byte() & 1;
  phasekv_fuzz::setup() = precise ? "fp8/fp4 layer" : "f32 layer";
  if (precise) run<precise_cache>(in, make_precise);
  else run<gated_cache>(in, make_gated);
  return 0;
}
