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
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/models/model_cache.hpp"
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

// ---- the same for a model cache (models/model_cache.hpp) ----------------------------------------
// Three kinds: window-only; K and V streams (S = 2, W = 4) in two layers sharing one page table;
// one tied stream (S = W = 4). Every sequence operation, and a whole step (begin, every layer's
// append and read, commit), fault-injected at each allocation: a failure leaves the model as it
// was — entries, window rows, compressor states, page tables, page counts.

model_spec fault_model_spec() {
  model_spec m;
  m.name = "fm";
  layer_kind window;
  window.name = "win";
  window.window = raw_window_config{4, 1, 3, 0};
  window.reader = reader_config{};
  window.reader.key_stream = window.reader.value_stream = window.reader.indexer_stream = no_stream;
  layer_kind kv;
  kv.name = "kv";
  kv.geom = geometry{2, 4};
  kv.page_size = 2;
  kv.window = raw_window_config{3, 1, 4, 4};
  for (auto [name, role] : {std::pair<const char*, stream_role>{"k", stream_role::key}, {"v", stream_role::value}}) {
    stream_spec st;
    st.config = phasekv_test::stream_of(name, role, 4);
    kv.streams.push_back(st);
  }
  layer_kind tied = kv;
  tied.name = "tied";
  tied.geom = geometry{4, 4};
  tied.window = raw_window_config{};
  tied.streams.resize(1);
  tied.streams[0].config = phasekv_test::stream_of("kv", stream_role::key_value, 3);
  m.kinds = {window, kv, tied};
  m.layers = model_spec::layers_of({0, 1, 2, 1});
  return m;
}

struct model_world {
  model_cache model;
  sequence_id a = -1, b = -1, c = -1;

  model_world() : model(fault_model_spec(), options()) {
    a = model.create();
    step({a}, 11, 1);
    b = model.fork(a);
    model.remove_suffix(b, 9);  // b's state blocks: shared with a, and ahead of its tokens
    c = model.create();
    step({c}, 5, 2);
  }
  static model_options options() {
    model_options o;
    o.pages = 24;
    o.history = 3;
    return o;
  }
  // One step of `n` tokens for every sequence given, every layer appended and its last token read.
  void step(std::initializer_list<sequence_id> seqs, i64 n, unsigned seed) {
    std::vector<i64> tokens_before;
    for (sequence_id id : seqs) tokens_before.push_back(model.tokens(id));
    model_step s = model.begin(seqs, n);
    for (std::size_t l = 0; l < model.layers(); ++l) {
      std::vector<std::vector<float>> inputs;
      std::vector<std::vector<token_chunk>> chunks(s.rows());
      std::vector<layer_append> in(s.rows());
      const raw_window_config& w = model.shape(l).window;
      for (std::size_t r = 0; r < s.rows(); ++r) {
        inputs.reserve(64);
        for (std::size_t k = 0; k < model.shape(l).streams.size(); ++k) {
          inputs.emplace_back(static_cast<std::size_t>(n * model.stream(l, k).payload_floats_per_token()),
                              0.25f * static_cast<float>(seed + l + k + r));
          chunks[r].push_back(token_chunk{n, inputs.back(), {}});
        }
        inputs.emplace_back(static_cast<std::size_t>(n * w.kv_heads * (w.key_channels + w.value_channels)),
                            0.5f * static_cast<float>(seed + l + r));
        const auto& rows = inputs.back();
        const std::size_t keys = static_cast<std::size_t>(n * w.kv_heads * w.key_channels);
        in[r] = {chunks[r], span<const float>(rows.data(), keys), span<const float>(rows.data() + keys, rows.size() - keys)};
      }
      s.append(l, in);
      const layer_shape& shape = model.shape(l);
      const i64 channels = shape.streams.empty() ? shape.window.key_channels : shape.streams[0].channels;
      std::vector<float> q(static_cast<std::size_t>(channels), 0.125f), out(static_cast<std::size_t>(channels));
      layer_read x;
      x.row = s.rows() - 1;
      x.request.position = tokens_before.back() + n - 1;
      x.request.queries = q;
      x.out = out.data();
      s.read(l, {&x, 1});
    }
    s.commit();
  }
  // Every layer's entries, window rows and compressor states of every live sequence; the page tables
  // and the pages in use per kind.
  phasekv_test::cache_dump dump() const {
    phasekv_test::cache_dump d;
    const std::vector<sequence_id> live = model.live_sequences();
    for (std::size_t i = 0; i < live.size(); ++i) {
      const sequence_id id = live[i];
      const i64 tokens = model.tokens(id);
      d.lines.push_back("sequence #" + std::to_string(i) + " (creation order) tokens " + std::to_string(tokens));
      for (std::size_t k = 0; k < model.kinds(); ++k) {
        std::string t = "  kind " + std::to_string(k) + " pages";
        for (page_id p : model.page_table(id, k)) t += " " + std::to_string(p);
        d.lines.push_back(t);
      }
      for (std::size_t l = 0; l < model.layers(); ++l) {
        const layer_shape& shape = model.shape(l);
        for (std::size_t k = 0; k < shape.streams.size(); ++k) {
          std::vector<float> e(static_cast<std::size_t>(shape.streams[k].kv_heads * shape.streams[k].channels));
          for (i64 j = 0; j < shape.geom.completed_entries(tokens); ++j) {
            model.read_entry(l, k, id, j, span<float>(e.data(), e.size()));
            d.lines.push_back("  layer " + std::to_string(l) + " stream " + std::to_string(k) + " entry " + std::to_string(j) +
                              ": " + phasekv_test::detail::hex_bits(e.data(), e.size()));
          }
          d.states.push_back(model.state(l, k, id));
        }
        if (shape.window.tokens == 0) continue;
        std::vector<float> row(static_cast<std::size_t>(shape.window.kv_heads * shape.window.key_channels));
        for (i64 t = std::max<i64>(0, tokens - shape.window.tokens); t < tokens; ++t) {
          model.copy_window_key(l, id, t, span<float>(row.data(), row.size()));
          d.lines.push_back("  layer " + std::to_string(l) + " window " + std::to_string(t) + ": " +
                            phasekv_test::detail::hex_bits(row.data(), row.size()));
        }
      }
    }
    for (const auto& k : model.pool_usage().kinds) d.lines.push_back(k.name + " pages used " + std::to_string(k.pages_used));
    return d;
  }
};

TEST_CASE("fault injection: model_cache operations and steps keep every layer unchanged when an allocation fails",
          "[model][fault]") {
  using model_operation = std::function<void(model_world&)>;
  const std::vector<std::pair<std::string, model_operation>> ops = {
      {"create", [](model_world& w) { w.model.create(); }},
      {"fork", [](model_world& w) { w.model.fork(w.a); }},
      {"copy", [](model_world& w) { w.model.copy(w.c, w.b); }},
      {"remove_suffix", [](model_world& w) { w.model.remove_suffix(w.a, 10); }},
      {"keep", [](model_world& w) { w.model.keep(w.c); }},
      {"free", [](model_world& w) { w.model.free(w.b); }},
      {"clear", [](model_world& w) { w.model.clear(); }},
      // Copy on write of a's shared last pages, b's blocks copied and rolled back, a fresh page for
      // c, every ring written, every layer read.
      {"step", [](model_world& w) { w.step({w.a, w.b, w.c}, 3, 7); }},
  };
  for (bool keep_failing : {false, true})
    for (const auto& [name, op] : ops) fault::check_strong_guarantee<model_world>(name, op, keep_failing);
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
