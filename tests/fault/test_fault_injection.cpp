// Allocation-failure injection: every mutating call of paged_cache keeps the strong guarantee
// when an allocation inside it fails.
//
// This binary replaces the global operator new (every form) with one that can be told to fail:
// either exactly the n-th allocation from now (a transient failure), or the n-th and every one
// after it (memory stays exhausted, so error paths that allocate are caught too). For each call
// — append (fresh pages, copy on write, raw window), fork, copy, remove_suffix, keep, free,
// clear, create, and a read — and for n = 1, 2, … until the call makes fewer than n allocations:
//
//   1. build the same small world, take a full dump (tests/oracle/cache_dump.hpp),
//   2. arm the injector, make the call, disarm,
//   3. if an allocation failed, the call must have thrown std::bad_alloc or capacity_error and
//      the dump must equal the one before; then the same call without faults must give exactly
//      what it gives in a world that never saw a fault.
//
// It lives in a binary of its own so that the replaced operator new touches no other test.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "fault/injector.hpp"
#include "oracle/cache_dump.hpp"
#include "support/configs.hpp"
#include "support/tokens.hpp"
#include "phasekv/cache/model_cache.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/read/sparse_reader.hpp"

// ---- the injector ------------------------------------------------------------------------------

// The replaced operator new allocates with malloc and the replaced delete frees with free; GCC's
// check for new/delete pairs cannot see that they match.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace fault {

std::atomic<long> countdown{0};  // 0: off; n > 0: the n-th allocation from arming fails
std::atomic<bool> persistent{false};
std::atomic<bool> fired{false};

// Called by every operator new: true when this allocation must fail.
bool should_fail() noexcept {
  long c = countdown.load(std::memory_order_relaxed);
  while (c > 0) {
    if (c == 1) {
      fired.store(true, std::memory_order_relaxed);
      if (!persistent.load(std::memory_order_relaxed)) countdown.store(0, std::memory_order_relaxed);
      return true;
    }
    if (countdown.compare_exchange_weak(c, c - 1, std::memory_order_relaxed)) return false;
  }
  return false;
}

std::atomic<std::size_t> largest{0};  // the largest allocation since arm() or arm_tracking()

void arm(long n, bool keep_failing) {
  fired = false;
  persistent = keep_failing;
  largest = 0;
  countdown = n;
}
void arm_tracking() { arm(0, false); }
std::size_t largest_since() { return largest.load(); }
bool disarm() {
  countdown = 0;
  return fired.load();
}

void* allocate(std::size_t size, std::size_t alignment) {
  for (std::size_t seen = largest.load(std::memory_order_relaxed);
       size > seen && !largest.compare_exchange_weak(seen, size, std::memory_order_relaxed);) {
  }
  if (should_fail()) throw std::bad_alloc();
  if (size == 0) size = 1;
  void* p = nullptr;
  if (alignment <= alignof(std::max_align_t)) {
    p = std::malloc(size);
  } else if (posix_memalign(&p, alignment, size) != 0) {
    p = nullptr;
  }
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace fault

void* operator new(std::size_t size) { return fault::allocate(size, 0); }
void* operator new[](std::size_t size) { return fault::allocate(size, 0); }
void* operator new(std::size_t size, std::align_val_t a) { return fault::allocate(size, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t size, std::align_val_t a) { return fault::allocate(size, static_cast<std::size_t>(a)); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return fault::allocate(size, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return fault::allocate(size, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

// ---- the world ---------------------------------------------------------------------------------

namespace {

using namespace phasekv;
using i64 = std::int64_t;
using phasekv_test::append_tokens;

// Gated, normalised, rotated K/V entries (DeepSeek-V4's policy) and mean-pooled indexer keys.
using kv_stream = stream_compressor<compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>>;
using ix_stream = stream_compressor<compressor_policy<mean_pool>>;
using world_cache = paged_cache<kv_stream, ix_stream>;
using world_reader = sparse_reader;

constexpr i64 kStride = 2, kWindow = 4, kKvChannels = 8, kIxChannels = 4, kQueryHeads = 2;

world_cache make_cache() {
  const geometry g{kStride, kWindow};
  stream_config kv = phasekv_test::stream_of("kv", stream_role::key_value, kKvChannels);
  kv.rope.channels = 4;
  const stream_config ix = phasekv_test::stream_of("ix", stream_role::indexer, kIxChannels);
  const cache_config cc = phasekv_test::cache_of("cache", 2, 24, 3, raw_window_config{3, 1, kKvChannels, 0});  // tied
  return world_cache(layer_compressor<kv_stream, ix_stream>(kv_stream(g, kv), ix_stream(g, ix)), cc);
}

// Sequences a (11 tokens), b = fork(a) (shares a's pages, the last one partially filled) and
// c (5 tokens): an append to b copies on write, one to a or c takes fresh pages.
struct world {
  world_cache cache = make_cache();
  sequence_id a = -1, b = -1, c = -1;

  world() {
    a = cache.create();
    append_tokens(cache, a, 11, 1u);
    b = cache.fork(a);
    c = cache.create();
    append_tokens(cache, c, 5, 2u);
  }
  phasekv_test::cache_dump dump() const { return phasekv_test::dump(cache); }
};

struct read_result {
  std::vector<float> out;
  read_trace trace;
};

read_result read_a(world& w, world_reader& reader) {
  const std::vector<float> q(kQueryHeads * kKvChannels, 0.25f), iq(2 * kIxChannels, 0.5f), iw{1.0f, -0.5f};
  read_result r;
  r.out.assign(kQueryHeads * kKvChannels, 0.0f);
  reader.read(w.cache, w.a, read_request{10, q, iq, iw, {}}, r.out.data(), &r.trace);
  return r;
}

reader_config world_reader_config() {
  reader_config rc;
  rc.query_heads = kQueryHeads;
  rc.indexer_stream = 1;
  rc.top_k = 3;
  rc.indexer_heads = 2;
  rc.derotate_output = true;
  return rc;
}

using operation = std::function<void(world&)>;

const std::vector<std::pair<std::string, operation>>& operations() {
  static const std::vector<std::pair<std::string, operation>> ops = {
      {"append (copy on write, fresh pages, window)", [](world& w) { append_tokens(w.cache, w.b, 3, 3u); }},
      {"append (fresh pages)", [](world& w) { append_tokens(w.cache, w.c, 6, 4u); }},
      {"append (no entry)", [](world& w) { append_tokens(w.cache, w.a, 1, 5u); }},
      {"fork", [](world& w) { w.cache.fork(w.a); }},
      {"copy", [](world& w) { w.cache.copy(w.c, w.b); }},
      {"remove_suffix", [](world& w) { w.cache.remove_suffix(w.a, 9); }},
      {"keep", [](world& w) { w.cache.keep(w.c); }},
      {"free", [](world& w) { w.cache.free(w.b); }},
      {"clear", [](world& w) { w.cache.clear(); }},
      {"create", [](world& w) { w.cache.create(); }},
  };
  return ops;
}

TEST_CASE("fault injection: every mutating call keeps the strong guarantee when one allocation fails",
          "[cache][fault]") {
  for (const auto& [name, op] : operations()) fault::check_strong_guarantee<world>(name, op, false);
}

TEST_CASE("fault injection: every mutating call keeps the strong guarantee when memory stays exhausted",
          "[cache][fault]") {
  for (const auto& [name, op] : operations()) fault::check_strong_guarantee<world>(name, op, true);
}

// ---- the same for a model cache: one layer of the first kind, two of a second -------------------
// The two second-kind layers have pools of their own, or share one (`shared`).

using mean_stream = stream_compressor<compressor_policy<mean_pool>>;
using second_cache = paged_cache<mean_stream>;
using two_kinds = model_cache<world_cache, second_cache>;

struct model_world {
  two_kinds model;
  sequence_id a = -1, b = -1, c = -1;

  static two_kinds make(bool shared) {
    cache_config second = phasekv_test::cache_of("second", 1, 24);
    if (shared) second.shared_pools = {std::make_shared<page_pool>(phasekv_test::pool_of("shared", 1, 1, 3, 24))};
    const stream_config hkv = phasekv_test::stream_of("hkv", stream_role::key_value, 3);
    std::vector<layer_spec<second_cache>> seconds;
    for (int i = 0; i < 2; ++i) {
      second.name = "second" + std::to_string(i);
      seconds.push_back({second_cache::layer(mean_stream(geometry{4, 4}, hkv)), second});
    }
    world_cache first = make_cache();  // (only its configuration is reused)
    return two_kinds(layer_spec<world_cache>{first.compressors(), first.config()}, std::move(seconds));
  }
  void forward(sequence_id s, i64 n, unsigned seed) {
    append_tokens(model.layer<0>(), model.layer_id(s, 0), n, seed);
    for (std::size_t i = 0; i < 2; ++i) {
      const auto& hkv = model.layer<1>(i).compressors().stream<0>();
      std::vector<float> x(static_cast<std::size_t>(n * hkv.payload_floats_per_token()),
                           0.25f * static_cast<float>(seed + i));
      model.append<1>(s, i, {token_chunk{n, x, {}}});
    }
  }
  explicit model_world(bool shared) : model(make(shared)) {
    a = model.create();
    forward(a, 11, 1);
    b = model.fork(a);
    c = model.create();
    forward(c, 5, 2);
  }
  // Every layer's dump, one after another, and the model's sequence count.
  phasekv_test::cache_dump dump() const {
    phasekv_test::cache_dump d = phasekv_test::dump(model.layer<0>());
    for (std::size_t i = 0; i < 2; ++i) {
      const phasekv_test::cache_dump layer = phasekv_test::dump(model.layer<1>(i));
      d.lines.push_back("second-kind layer " + std::to_string(i));
      d.lines.insert(d.lines.end(), layer.lines.begin(), layer.lines.end());
      d.states.insert(d.states.end(), layer.states.begin(), layer.states.end());
    }
    d.lines.push_back("model sequences " + std::to_string(model.sequences()));
    return d;
  }
};

TEST_CASE("fault injection: model_cache operations keep every layer unchanged when an allocation fails",
          "[cache][model][fault]") {
  using model_operation = std::function<void(model_world&)>;
  const std::vector<std::pair<std::string, model_operation>> ops = {
      {"create", [](model_world& w) { w.model.create(); }},
      {"fork", [](model_world& w) { w.model.fork(w.a); }},
      {"copy", [](model_world& w) { w.model.copy(w.c, w.b); }},
      {"remove_suffix", [](model_world& w) { w.model.remove_suffix(w.a, 10); }},
      {"keep", [](model_world& w) { w.model.keep(w.c); }},
      {"free", [](model_world& w) { w.model.free(w.b); }},
      {"clear", [](model_world& w) { w.model.clear(); }},
  };
  for (bool shared : {false, true})
    for (bool keep_failing : {false, true})
      for (const auto& [name, op] : ops)
        fault::check_strong_guarantee<model_world>(name + (shared ? " (shared pool)" : ""), op, keep_failing, shared);
}

TEST_CASE("fault injection: a read that runs out of memory throws, and the next read is exact", "[read][fault]") {
  world reference;
  world_reader fresh(reference.cache, world_reader_config());
  const read_result expected = read_a(reference, fresh);
  for (bool keep_failing : {false, true}) {
    for (long n = 1;; ++n) {
      world w;
      world_reader reader(w.cache, world_reader_config());
      const phasekv_test::cache_dump before = w.dump();
      const fault::outcome o = fault::failing(n, keep_failing, [&] { (void)read_a(w, reader); });
      const bool fired = o.fired;
      INFO("allocation " << n << (keep_failing ? " and every later one" : "") << " failed; threw " << o.what);
      REQUIRE(o.threw == fired);
      REQUIRE((!o.threw || o.what == "std::bad_alloc"));
      REQUIRE(phasekv_test::first_difference(w.dump(), before) == "");
      const read_result again = read_a(w, reader);
      REQUIRE(again.out == expected.out);
      REQUIRE(again.trace.selected == expected.trace.selected);
      if (!fired) break;
    }
  }
}

TEST_CASE("fault injection: constructors and create() turn a failed allocation into capacity_error or bad_alloc",
          "[cache][fault]") {
  for (long n = 1;; ++n) {
    const fault::outcome o = fault::failing(n, false, [] { world w; });  // pools, sequences, appends
    INFO("allocation " << n << " failed");
    REQUIRE(o.threw == o.fired);
    if (!o.fired) break;
  }
}

}  // namespace
