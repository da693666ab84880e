// The paged compressed cache (include/phasekv/cache/paged_cache.hpp).
//
// The centre is a model-based randomized test: thousands of random operations (create, append,
// fork, copy, remove_suffix, free, keep, clear, and calls that must fail) over several sequences,
// checked after every step against a plain reference — per sequence, the list of every token's
// inputs. The entries a sequence must hold are recomputed from that list by a FRESH compressor
// in one prefill, so the test also checks "streaming equals prefill" through the cache. Entries
// are read back through read_entry and through the interop view's pointer arithmetic, in fp32
// (bit-exact) and in bf16/f16 (the storage conversion of the fp32 entry). After every step every
// page's reference count must equal the number of page-table slots naming it.
//
// Which rollbacks are legal is decided by simulating the rings the way docs/DESIGN.md §3/§4
// describe them: token t's inputs sit in row t mod rows until a later token overwrites that row.
// A rollback to p0 is legal exactly when every input the continuation needs is still there.
//
// Then targeted tests (sharing, copy on write, the strong guarantee on pool exhaustion, error
// messages, memory accounting, the view of a batch) and a multi-threaded test that is meant to be
// run under ThreadSanitizer as well.

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/prelude.hpp"
#include "support/configs.hpp"
#include "support/random_inputs.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/compress/entry_buffer.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"

namespace test_cache_paged {

namespace {

using namespace phasekv_test::prelude;

// Two streams with different policies and shapes: mean-pooled keys with per-branch inputs, and
// vector-gated, RMS-normalised values with per-slot inputs.
using key_stream = stream_compressor<compressor_policy<mean_pool>>;
using value_stream = stream_compressor<compressor_policy<vector_gated_pool, no_rope, rms_norm>>;
using test_layer = layer_compressor<key_stream, value_stream>;
using test_cache = paged_cache<key_stream, value_stream>;
constexpr std::size_t kStreams = 2;

constexpr std::int64_t kHeads = 2;
constexpr std::int64_t kKeyChannels = 5;
constexpr std::int64_t kValueChannels = 3;
constexpr std::int64_t kWindowHeads = 2;
constexpr std::int64_t kWindowKeyChannels = 4;

// A cache configuration plus the geometry of its streams.
struct setup {
  std::int64_t stride = 2;
  std::int64_t window = 4;
  std::int64_t page_size = 2;
  std::int64_t pages = 32;
  storage_type storage = storage_type::f32;
  std::int64_t history = 0;
  std::int64_t window_tokens = 0;
  std::int64_t window_value_channels = 2;  // 0: tied window
};

std::string describe(const setup& s) {
  std::ostringstream out;
  out << "S=" << s.stride << " W=" << s.window << " page_size=" << s.page_size << " pages=" << s.pages
      << " storage=" << s.storage << " history=" << s.history << " window.tokens=" << s.window_tokens
      << " window.value_channels=" << s.window_value_channels;
  return out.str();
}

key_stream make_keys(const geometry& g) {
  return key_stream(g, phasekv_test::stream_of("keys", stream_role::key, kKeyChannels, kHeads, input_layout::per_branch));
}

value_stream make_values(const geometry& g, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const stream_config c =
      phasekv_test::stream_of("values", stream_role::value, kValueChannels, kHeads, input_layout::per_slot);
  stream_params p;
  p.slot_bias = phasekv_test::random_bias(rng, static_cast<std::size_t>(kHeads * g.window * kValueChannels));
  p.norm_weight = phasekv_test::random_norm_weight(rng, static_cast<std::size_t>(kValueChannels));
  return value_stream(g, c, p);
}

cache_config make_config(const setup& s) {
  cache_config c = phasekv_test::cache_of(
      "cache", s.page_size, s.pages, s.history,
      raw_window_config{s.window_tokens, kWindowHeads, kWindowKeyChannels, s.window_value_channels});
  c.storage = s.storage;
  return c;
}

// New tokens' inputs, token-major, for both streams and the raw window.
struct token_inputs {
  std::int64_t tokens = 0;
  std::vector<float> key_payload, value_payload, value_logits, window_keys, window_values;
};

// What one sequence must be: every token's inputs, the rings' contents (which token each row
// last received), and the stored entries those inputs produce.
struct reference {
  token_inputs inputs;
  std::vector<std::int64_t> input_ring;   // W + history rows
  std::vector<std::int64_t> window_ring;  // window.tokens + history rows (none without a window)
  std::array<std::vector<float>, kStreams> expected;  // stored entries, converted back to fp32
};

// The compressors and sizes everything below needs; the expectations use their own compressor
// objects (equal configuration, fresh states), never the cache's.
struct world {
  setup shape;
  geometry geom;
  cache_config config;
  key_stream keys;
  value_stream values;

  explicit world(const setup& s, std::uint32_t param_seed = 7)
      : shape(s),
        geom(geometry{s.stride, s.window}),
        config(make_config(s)),
        keys(make_keys(geom)),
        values(make_values(geom, param_seed)) {}

  test_cache make_cache() const { return test_cache(test_layer(keys, values), config); }

  std::int64_t key_floats() const { return keys.payload_floats_per_token(); }
  std::int64_t value_floats() const { return values.payload_floats_per_token(); }
  std::int64_t logit_floats() const { return values.logit_floats_per_token(); }
  std::int64_t window_key_floats() const { return shape.window_tokens > 0 ? kWindowHeads * kWindowKeyChannels : 0; }
  std::int64_t window_value_floats() const {
    return shape.window_tokens > 0 ? kWindowHeads * shape.window_value_channels : 0;
  }
  std::int64_t floats_per_entry(std::size_t k) const {
    return k == 0 ? keys.floats_per_entry() : values.floats_per_entry();
  }
  std::int64_t window_rows() const { return shape.window_tokens > 0 ? shape.window_tokens + shape.history : 0; }

  reference fresh_reference() const {
    reference r;
    r.input_ring.assign(static_cast<std::size_t>(shape.window + shape.history), -1);
    r.window_ring.assign(static_cast<std::size_t>(window_rows()), -1);
    return r;
  }

  token_inputs random_inputs(std::mt19937& rng, std::int64_t n) const {
    const auto count = [n](std::int64_t per_token) { return static_cast<std::size_t>(n * per_token); };
    token_inputs in;
    in.tokens = n;
    in.key_payload = phasekv_test::random_payload(rng, count(key_floats()));
    in.value_payload = phasekv_test::random_payload(rng, count(value_floats()));
    in.value_logits = phasekv_test::random_logits(rng, count(logit_floats()));
    in.window_keys = phasekv_test::random_payload(rng, count(window_key_floats()));
    in.window_values = phasekv_test::random_payload(rng, count(window_value_floats()));
    return in;
  }

  // Tokens [first, first + n) of a token list, as a new token list.
  token_inputs slice(const token_inputs& in, std::int64_t first, std::int64_t n) const {
    const auto part = [&](const std::vector<float>& v, std::int64_t per_token) {
      return std::vector<float>(v.begin() + first * per_token, v.begin() + (first + n) * per_token);
    };
    token_inputs out;
    out.tokens = n;
    out.key_payload = part(in.key_payload, key_floats());
    out.value_payload = part(in.value_payload, value_floats());
    out.value_logits = part(in.value_logits, logit_floats());
    out.window_keys = part(in.window_keys, window_key_floats());
    out.window_values = part(in.window_values, window_value_floats());
    return out;
  }

  static test_cache::chunks chunks_of(const token_inputs& in) {
    return {token_chunk{in.tokens, in.key_payload, {}}, token_chunk{in.tokens, in.value_payload, in.value_logits}};
  }

  std::int64_t append(test_cache& cache, sequence_id id, const token_inputs& in) const {
    return cache.append(id, chunks_of(in), in.window_keys, in.window_values);
  }

  // ---- the reference model ----

  // Entries of a whole token list by a fresh compressor in one prefill, stored and loaded back.
  template <class Compressor>
  std::vector<float> prefill_entries(const Compressor& c, std::int64_t tokens, const std::vector<float>& payload,
                                     const std::vector<float>& logits) const {
    stream_state state = c.make_state();
    entry_buffer buffer;
    c.append(state, token_chunk{tokens, payload, logits}, buffer);
    std::vector<float> values = buffer.all_values();
    std::vector<std::byte> stored(values.size() * 4);
    store_row(values.data(), stored.data(), static_cast<std::int64_t>(values.size()), shape.storage);
    load_row(stored.data(), values.data(), static_cast<std::int64_t>(values.size()), shape.storage);
    return values;
  }

  void refresh_expected(reference& r) const {
    const std::vector<float> none;
    r.expected[0] = prefill_entries(keys, r.inputs.tokens, r.inputs.key_payload, none);
    r.expected[1] = prefill_entries(values, r.inputs.tokens, r.inputs.value_payload, r.inputs.value_logits);
  }

  static void write_ring(std::vector<std::int64_t>& ring, std::int64_t t0, std::int64_t t_end) {
    const auto rows = static_cast<std::int64_t>(ring.size());
    if (rows == 0) return;
    for (std::int64_t t = std::max(t0, t_end - rows); t < t_end; ++t) ring[static_cast<std::size_t>(t % rows)] = t;
  }
  static bool ring_holds(const std::vector<std::int64_t>& ring, std::int64_t first, std::int64_t last) {
    const auto rows = static_cast<std::int64_t>(ring.size());
    for (std::int64_t t = std::max<std::int64_t>(first, 0); t < last; ++t)
      if (rows == 0 || ring[static_cast<std::size_t>(t % rows)] != t) return false;
    return true;
  }

  void model_append(reference& r, const token_inputs& in) const {
    const std::int64_t t0 = r.inputs.tokens, t_end = t0 + in.tokens;
    const auto cat = [](std::vector<float>& to, const std::vector<float>& from) {
      to.insert(to.end(), from.begin(), from.end());
    };
    cat(r.inputs.key_payload, in.key_payload);
    cat(r.inputs.value_payload, in.value_payload);
    cat(r.inputs.value_logits, in.value_logits);
    cat(r.inputs.window_keys, in.window_keys);
    cat(r.inputs.window_values, in.window_values);
    r.inputs.tokens = t_end;
    write_ring(r.input_ring, t0, t_end);
    write_ring(r.window_ring, t0, t_end);
    refresh_expected(r);
  }

  // Whether the inputs a continuation from p0 needs are still in the rings.
  bool can_remove_suffix(const reference& r, std::int64_t p0) const {
    if (p0 < 0 || p0 > r.inputs.tokens) return false;
    if (p0 == r.inputs.tokens) return true;
    const std::int64_t needed_from = geom.window_start(geom.completed_entries(p0));
    if (!ring_holds(r.input_ring, needed_from, p0)) return false;
    return shape.window_tokens == 0 || ring_holds(r.window_ring, p0 - shape.window_tokens, p0);
  }

  void model_remove_suffix(reference& r, std::int64_t p0) const {
    r.inputs = slice(r.inputs, 0, p0);
    refresh_expected(r);
  }

  // The oldest token whose window row the cache must still hold (history included).
  std::int64_t expected_window_first(const reference& r) const {
    const std::int64_t tokens = r.inputs.tokens;
    if (shape.window_tokens == 0) return tokens;
    std::int64_t first = tokens;
    while (first > 0 && ring_holds(r.window_ring, first - 1, first)) --first;
    return first;
  }

  // Pages stream k of a sequence needs from the pool to append n tokens.
  std::int64_t pages_needed(const test_cache& cache, sequence_id id, std::size_t k, std::int64_t n) const {
    const std::int64_t before = cache.entries(id, k);
    const std::int64_t after = geom.completed_entries(cache.tokens(id) + n);
    if (after == before) return 0;
    const auto& table = cache.page_table(id, k);
    const bool copy = before % shape.page_size != 0 && cache.pool(k).refcount(table.back()) > 1;
    return (copy ? 1 : 0) + (after + shape.page_size - 1) / shape.page_size - static_cast<std::int64_t>(table.size());
  }

  // ---- comparisons (each returns a description of the first difference, or "") ----

  std::string compare(const test_cache& cache, sequence_id id, const reference& r) const {
    std::ostringstream out;
    const std::int64_t tokens = r.inputs.tokens;
    if (cache.tokens(id) != tokens) {
      out << "tokens " << cache.tokens(id) << " != " << tokens;
      return out.str();
    }
    for (std::size_t k = 0; k < kStreams; ++k) {
      const std::int64_t per_entry = floats_per_entry(k);
      const std::int64_t n = static_cast<std::int64_t>(r.expected[k].size()) / per_entry;
      if (n != geom.completed_entries(tokens)) return "the reference prefill emitted a wrong entry count";
      if (cache.entries(id, k) != n || cache.state(id, k).entries() != n || cache.state(id, k).tokens() != tokens) {
        out << "stream " << k << ": entries " << cache.entries(id, k) << " != " << n;
        return out.str();
      }
      const auto pages = static_cast<std::size_t>((n + shape.page_size - 1) / shape.page_size);
      if (cache.page_table(id, k).size() != pages) {
        out << "stream " << k << ": page table of " << cache.page_table(id, k).size() << " pages, expected " << pages;
        return out.str();
      }
      std::vector<float> entry(static_cast<std::size_t>(per_entry));
      for (std::int64_t j = 0; j < n; ++j) {
        cache.read_entry(id, k, j, entry.data());
        if (std::memcmp(entry.data(), r.expected[k].data() + j * per_entry, entry.size() * sizeof(float)) != 0) {
          out << "stream " << k << ": read_entry(" << j << ") differs from the fresh prefill's entry";
          return out.str();
        }
      }
    }
    const std::int64_t first = expected_window_first(r);
    if (cache.window_first(id) != first) {
      out << "window_first " << cache.window_first(id) << " != " << first;
      return out.str();
    }
    const bool tied = shape.window_value_channels == 0;
    const std::int64_t wk = window_key_floats(), wv = tied ? wk : window_value_floats();
    for (std::int64_t t = first; t < tokens; ++t) {
      const float* want_value = tied ? r.inputs.window_keys.data() + t * wk : r.inputs.window_values.data() + t * wv;
      if (std::memcmp(cache.window_key(id, t), r.inputs.window_keys.data() + t * wk,
                      static_cast<std::size_t>(wk) * sizeof(float)) != 0 ||
          std::memcmp(cache.window_value(id, t), want_value, static_cast<std::size_t>(wv) * sizeof(float)) != 0) {
        out << "window row of token " << t << " differs";
        return out.str();
      }
    }
    return "";
  }

  // Reads every entry of a batch through the interop view's CSR tables and strides.
  std::string compare_view(const test_cache& cache, const std::vector<sequence_id>& batch,
                           const std::vector<const reference*>& refs) const {
    std::ostringstream out;
    for (std::size_t k = 0; k < kStreams; ++k) {
      const paged_view v = cache.view(span<const sequence_id>(batch.data(), batch.size()), k);
      if (v.indptr.size() != batch.size() + 1 || v.last_page_len.size() != batch.size() ||
          v.entries.size() != batch.size() || v.indptr[0] != 0 ||
          v.indptr.back() != static_cast<std::int32_t>(v.indices.size()))
        return "view: malformed CSR arrays";
      if (v.layout.element_bytes != bytes_per_element(shape.storage) || v.layout.storage != shape.storage ||
          v.layout.page_size != shape.page_size)
        return "view: layout does not describe the cache";
      const std::int64_t heads = kHeads, channels = k == 0 ? kKeyChannels : kValueChannels;
      for (std::size_t b = 0; b < batch.size(); ++b) {
        const std::vector<float>& want = refs[b]->expected[k];
        const std::int64_t n = static_cast<std::int64_t>(want.size()) / (heads * channels);
        const std::int64_t pages = (n + shape.page_size - 1) / shape.page_size;
        const std::int32_t last = n == 0 ? 0 : static_cast<std::int32_t>((n - 1) % shape.page_size + 1);
        if (v.entries[b] != n || v.indptr[b + 1] - v.indptr[b] != pages || v.last_page_len[b] != last) {
          out << "view row " << b << " (stream " << k << "): entries/pages/last_page_len "
              << v.entries[b] << "/" << v.indptr[b + 1] - v.indptr[b] << "/" << v.last_page_len[b] << " != " << n << "/"
              << pages << "/" << last;
          return out.str();
        }
        const auto& table = cache.page_table(batch[b], k);
        if (!std::equal(table.begin(), table.end(), v.indices.begin() + v.indptr[b])) return "view: indices != page table";
        for (std::int64_t e = 0; e < n; ++e) {
          const std::int32_t page = v.indices[static_cast<std::size_t>(v.indptr[b] + e / shape.page_size)];
          const std::int64_t slot = e % shape.page_size;
          for (std::int64_t h = 0; h < heads; ++h)
            for (std::int64_t c = 0; c < channels; ++c) {
              const std::byte* address = v.base + page * v.layout.page_stride_bytes + slot * v.layout.entry_stride_bytes +
                                         h * v.layout.head_stride_bytes + c * v.layout.element_bytes;
              float got = 0.0f;
              load_row(address, &got, 1, v.layout.storage);
              const float expected = want[static_cast<std::size_t>((e * heads + h) * channels + c)];
              if (std::memcmp(&got, &expected, sizeof(float)) != 0) {
                out << "view row " << b << " (stream " << k << "): entry " << e << " head " << h << " channel " << c
                    << " reads " << got << ", stored " << expected;
                return out.str();
              }
            }
        }
      }
    }
    return "";
  }
};

// Every page's reference count equals the page-table slots naming it; used_pages equals the
// number of distinct pages named. Returns the first inconsistency, or "".
std::string pool_consistency(const test_cache& cache, const std::vector<sequence_id>& live) {
  std::ostringstream out;
  for (std::size_t k = 0; k < kStreams; ++k) {
    const page_pool& pool = cache.pool(k);
    std::vector<std::int64_t> references(static_cast<std::size_t>(pool.capacity()), 0);
    for (sequence_id id : live)
      for (page_id p : cache.page_table(id, k)) {
        if (p < 0 || p >= pool.capacity()) return "a page table names a page outside the pool";
        ++references[static_cast<std::size_t>(p)];
      }
    std::int64_t distinct = 0;
    for (page_id p = 0; p < pool.capacity(); ++p) {
      const std::int64_t want = references[static_cast<std::size_t>(p)];
      distinct += want > 0 ? 1 : 0;
      if (pool.refcount(p) != want) {
        out << "stream " << k << ": page " << p << " has reference count " << pool.refcount(p) << " but " << want
            << " page-table references";
        return out.str();
      }
    }
    if (pool.used_pages() != distinct) {
      out << "stream " << k << ": used_pages " << pool.used_pages() << " != " << distinct << " referenced pages";
      return out.str();
    }
  }
  return "";
}

// Everything observable about the cache's structure, to check that a failed call changed nothing.
struct snapshot {
  struct sequence_snapshot {
    std::int64_t tokens = 0, window_first = 0;
    std::array<std::vector<page_id>, kStreams> tables;
    std::array<stream_state, kStreams> states;
    bool operator==(const sequence_snapshot& o) const {
      return tokens == o.tokens && window_first == o.window_first && tables == o.tables && states == o.states;
    }
  };
  std::map<sequence_id, sequence_snapshot> sequences;
  std::array<std::int64_t, kStreams> used{};
  std::array<std::vector<std::int32_t>, kStreams> refcounts;

  snapshot(const test_cache& cache, const std::vector<sequence_id>& live) {
    for (sequence_id id : live) {
      sequence_snapshot s;
      s.tokens = cache.tokens(id);
      s.window_first = cache.window_first(id);
      for (std::size_t k = 0; k < kStreams; ++k) {
        s.tables[k] = cache.page_table(id, k);
        s.states[k] = cache.state(id, k);
      }
      sequences.emplace(id, std::move(s));
    }
    for (std::size_t k = 0; k < kStreams; ++k) {
      used[k] = cache.pool(k).used_pages();
      for (page_id p = 0; p < cache.pool(k).capacity(); ++p) refcounts[k].push_back(cache.pool(k).refcount(p));
    }
  }
  bool operator==(const snapshot& o) const {
    return sequences == o.sequences && used == o.used && refcounts == o.refcounts;
  }
};

// ------------------------------------------------------------------------------------------------
// The model-based randomized test.

class random_run {
 public:
  random_run(const setup& s, std::uint32_t seed) : w_(s), cache_(w_.make_cache()), rng_(seed) {}

  void run(int steps) {
    for (step_ = 0; step_ < steps; ++step_) {
      one_operation();
      check();
    }
    cache_.clear();
    model_.clear();
    check();
    for (std::size_t k = 0; k < kStreams; ++k) REQUIRE(cache_.pool(k).free_pages() == cache_.pool(k).capacity());
    // The run reached the states it was meant to reach.
    CHECK(counts_["capacity_error"] > 0);
    CHECK(counts_["illegal remove_suffix"] > 0);
    CHECK(counts_["remove_suffix"] > 0);
    CHECK(counts_["fork"] > 0);
    if (w_.shape.page_size > 1) CHECK(counts_["copy-on-write"] > 0);  // pages of 1 entry are never partial
  }

 private:
  std::vector<sequence_id> live() const {
    std::vector<sequence_id> ids;
    for (const auto& [id, r] : model_) ids.push_back(id);
    return ids;
  }
  sequence_id pick() {
    auto it = model_.begin();
    std::advance(it, std::uniform_int_distribution<std::size_t>(0, model_.size() - 1)(rng_));
    return it->first;
  }
  sequence_id dead_or_unknown() {
    if (!dead_.empty() && coin(0.7)) {
      auto it = dead_.begin();
      std::advance(it, std::uniform_int_distribution<std::size_t>(0, dead_.size() - 1)(rng_));
      return *it;
    }
    return std::uniform_int_distribution<sequence_id>(0, 1)(rng_) ? -1 - step_ : 1000000 + step_;
  }
  bool coin(double p) { return std::bernoulli_distribution(p)(rng_); }
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_);
  }

  void describe_op(const std::string& what) {
    op_ = what;
    ++counts_[what.substr(0, what.find_first_of("(:"))];
  }

  // Runs a call that must fail with Error and change nothing.
  template <class Error, class F>
  void expect_failure(F&& call) {
    INFO("step " << step_ << ": " << op_);
    const snapshot before(cache_, live());
    bool threw = false;
    try {
      call();
    } catch (const Error&) {
      threw = true;
    }
    REQUIRE(threw);
    REQUIRE(snapshot(cache_, live()) == before);
  }

  void one_operation() {
    if (model_.empty() || (model_.size() < 6 && coin(0.06))) {
      const sequence_id id = cache_.create();
      describe_op("create() = " + std::to_string(id));
      REQUIRE(model_.count(id) == 0);
      REQUIRE(dead_.count(id) == 0);
      model_.emplace(id, w_.fresh_reference());
      return;
    }
    // Free more often when the pool is nearly full, fork less when there are many sequences.
    const bool crowded = cache_.pool(0).used_pages() * 5 > cache_.pool(0).capacity() * 4;
    const double forks = model_.size() >= 8 ? 0 : 10, frees = crowded ? 25 : 8;
    const int kind = std::discrete_distribution<int>({40, forks, 5, 20, frees, 0.6, 0.3, 2, 1.5, 1.5, 1.5})(rng_);
    switch (kind) {
      case 0: return append();
      case 1: return fork();
      case 2: return copy();
      case 3: return remove_suffix();
      case 4: return free_one();
      case 5: return keep();
      case 6: {
        describe_op("clear()");
        cache_.clear();
        for (const auto& [id, r] : model_) dead_.insert(id);
        model_.clear();
        return;
      }
      case 7: return unknown_sequence();
      case 8: {
        const sequence_id id = pick();
        describe_op("copy(" + std::to_string(id) + ", itself)");
        return expect_failure<input_error>([&] { cache_.copy(id, id); });
      }
      case 9: return bad_window_span();
      default: return bad_chunk();
    }
  }

  void append() {
    const sequence_id id = pick();
    // Mostly short appends; sometimes a prefill long enough to exhaust the pool.
    const std::int64_t n = coin(0.1) ? uniform(10, 40) : uniform(0, 20);
    const token_inputs in = w_.random_inputs(rng_, n);
    describe_op("append(" + std::to_string(id) + ", " + std::to_string(n) + " tokens)");
    bool fits = true, copies = false;
    for (std::size_t k = 0; k < kStreams; ++k) {
      fits = fits && w_.pages_needed(cache_, id, k, n) <= cache_.pool(k).free_pages();
      const std::int64_t before = cache_.entries(id, k);
      copies = copies || (before % w_.shape.page_size != 0 && w_.geom.completed_entries(cache_.tokens(id) + n) > before &&
                          cache_.pool(k).refcount(cache_.page_table(id, k).back()) > 1);
    }
    if (!fits) {
      describe_op("capacity_error: " + op_);
      return expect_failure<capacity_error>([&] { w_.append(cache_, id, in); });
    }
    const std::vector<page_id> old_table = cache_.page_table(id, 0);
    const std::int64_t emitted = w_.append(cache_, id, in);
    INFO("step " << step_ << ": " << op_);
    REQUIRE(emitted == w_.geom.completed_entries(cache_.tokens(id)) - w_.geom.completed_entries(cache_.tokens(id) - n));
    if (copies) {
      ++counts_["copy-on-write"];
      // The shared last page was replaced by a private copy; the pages before it were not.
      const auto& table = cache_.page_table(id, 0);
      REQUIRE(table[old_table.size() - 1] != old_table.back());
      REQUIRE(std::equal(old_table.begin(), old_table.end() - 1, table.begin()));
    }
    w_.model_append(model_.at(id), in);
  }

  void fork() {
    const sequence_id parent = pick();
    const std::int64_t used = cache_.pool(0).used_pages();
    const sequence_id child = cache_.fork(parent);
    describe_op("fork(" + std::to_string(parent) + ") = " + std::to_string(child));
    INFO("step " << step_ << ": " << op_);
    REQUIRE(model_.count(child) == 0);
    REQUIRE(dead_.count(child) == 0);
    REQUIRE(cache_.pool(0).used_pages() == used);  // sharing allocates nothing
    REQUIRE(cache_.page_table(child, 0) == cache_.page_table(parent, 0));
    model_.emplace(child, model_.at(parent));
  }

  void copy() {
    if (model_.size() < 2) return;
    const sequence_id source = pick();
    sequence_id destination = pick();
    while (destination == source) destination = pick();
    describe_op("copy(" + std::to_string(source) + ", " + std::to_string(destination) + ")");
    cache_.copy(source, destination);
    model_.at(destination) = model_.at(source);
  }

  void remove_suffix() {
    const sequence_id id = pick();
    const reference& r = model_.at(id);
    const std::int64_t tokens = r.inputs.tokens;
    std::int64_t p0 = 0;
    switch (uniform(0, 9)) {
      case 0: p0 = coin(0.5) ? -uniform(1, 3) : tokens + uniform(1, 3); break;  // outside [0, tokens]
      case 1:
      case 2: p0 = uniform(0, tokens); break;
      case 3:
      case 4: p0 = tokens - uniform(0, w_.shape.stride); break;
      default: p0 = tokens - uniform(0, w_.shape.window + w_.shape.history + w_.shape.window_tokens + 2); break;
    }
    describe_op("remove_suffix(" + std::to_string(id) + ", " + std::to_string(p0) + " of " + std::to_string(tokens) + ")");
    if (!w_.can_remove_suffix(r, p0)) {
      describe_op("illegal remove_suffix(" + std::to_string(id) + ", " + std::to_string(p0) + " of " +
                  std::to_string(tokens) + ")");
      return expect_failure<input_error>([&] { cache_.remove_suffix(id, p0); });
    }
    cache_.remove_suffix(id, p0);
    w_.model_remove_suffix(model_.at(id), p0);
  }

  void free_one() {
    const sequence_id id = pick();
    describe_op("free(" + std::to_string(id) + ")");
    cache_.free(id);
    model_.erase(id);
    dead_.insert(id);
  }

  void keep() {
    const sequence_id id = pick();
    describe_op("keep(" + std::to_string(id) + ")");
    cache_.keep(id);
    for (auto it = model_.begin(); it != model_.end();) {
      if (it->first == id) {
        ++it;
        continue;
      }
      dead_.insert(it->first);
      it = model_.erase(it);
    }
  }

  void unknown_sequence() {
    const sequence_id bad = dead_or_unknown();
    const sequence_id good = pick();
    const token_inputs in = w_.random_inputs(rng_, 3);
    switch (uniform(0, 7)) {
      case 0:
        describe_op("append(unknown " + std::to_string(bad) + ")");
        return expect_failure<input_error>([&] { w_.append(cache_, bad, in); });
      case 1:
        describe_op("fork(unknown " + std::to_string(bad) + ")");
        return expect_failure<input_error>([&] { cache_.fork(bad); });
      case 2:
        describe_op("copy(unknown " + std::to_string(bad) + ", " + std::to_string(good) + ")");
        return expect_failure<input_error>([&] { cache_.copy(bad, good); });
      case 3:
        describe_op("copy(" + std::to_string(good) + ", unknown " + std::to_string(bad) + ")");
        return expect_failure<input_error>([&] { cache_.copy(good, bad); });
      case 4:
        describe_op("remove_suffix(unknown " + std::to_string(bad) + ")");
        return expect_failure<input_error>([&] { cache_.remove_suffix(bad, 0); });
      case 5:
        describe_op("free(unknown " + std::to_string(bad) + ")");
        return expect_failure<input_error>([&] { cache_.free(bad); });
      case 6:
        describe_op("keep(unknown " + std::to_string(bad) + ")");
        return expect_failure<input_error>([&] { cache_.keep(bad); });
      default: {
        describe_op("view(including unknown " + std::to_string(bad) + ")");
        const std::vector<sequence_id> batch{good, bad};
        return expect_failure<input_error>([&] { (void)cache_.view(span<const sequence_id>(batch.data(), 2), 0); });
      }
    }
  }

  void bad_window_span() {
    const sequence_id id = pick();
    token_inputs in = w_.random_inputs(rng_, uniform(1, 6));
    if (coin(0.5)) in.window_keys.push_back(1.0f);
    else if (w_.window_value_floats() > 0) in.window_values.pop_back();
    else in.window_values.push_back(1.0f);
    describe_op("append(" + std::to_string(id) + ", window span of the wrong size)");
    expect_failure<input_error>([&] { w_.append(cache_, id, in); });
  }

  // A malformed chunk must be rejected with input_error even when the pool is nearly full.
  void bad_chunk() {
    const sequence_id id = pick();
    const std::int64_t n = uniform(1, 12);
    const token_inputs in = w_.random_inputs(rng_, n);
    test_cache::chunks chunks = world::chunks_of(in);
    if (coin(0.5)) chunks[1].logits = span<const float>(in.value_logits.data(), in.value_logits.size() - 1);
    else chunks[1].tokens = n - 1;
    describe_op("append(" + std::to_string(id) + ", malformed chunk)");
    expect_failure<input_error>([&] { cache_.append(id, chunks, in.window_keys, in.window_values); });
  }

  void check() {
    INFO(describe(w_.shape) << "; after step " << step_ << ": " << op_);
    const std::vector<sequence_id> ids = live();
    REQUIRE(cache_.sequences() == static_cast<std::int64_t>(ids.size()));
    std::vector<const reference*> refs;
    for (sequence_id id : ids) {
      INFO("sequence " << id);
      REQUIRE(cache_.contains(id));
      REQUIRE(w_.compare(cache_, id, model_.at(id)) == "");
      refs.push_back(&model_.at(id));
    }
    for (sequence_id id : dead_) REQUIRE_FALSE(cache_.contains(id));
    REQUIRE(w_.compare_view(cache_, ids, refs) == "");
    REQUIRE(pool_consistency(cache_, ids) == "");
    // Memory accounting agrees with the tables and the pool.
    for (sequence_id id : ids) {
      const sequence_memory m = cache_.memory(id);
      std::int64_t entries = 0, pages = 0, shared = 0;
      for (std::size_t k = 0; k < kStreams; ++k) {
        entries += cache_.entries(id, k);
        for (page_id p : cache_.page_table(id, k)) {
          ++pages;
          shared += cache_.pool(k).refcount(p) > 1 ? 1 : 0;
        }
      }
      REQUIRE(m.tokens == cache_.tokens(id));
      REQUIRE(m.entries == entries);
      REQUIRE(m.pages == pages);
      REQUIRE(m.shared_pages == shared);
    }
  }

  world w_;
  test_cache cache_;
  std::mt19937 rng_;
  std::map<sequence_id, reference> model_;
  std::set<sequence_id> dead_;
  std::map<std::string, int> counts_;
  std::string op_;
  std::int64_t step_ = 0;
};

TEST_CASE("paged_cache: random operations agree with a plain reference after every step", "[cache][paged]") {
  setup s;
  std::uint32_t seed = 0;
  SECTION("S=2 W=4, pages of 2, f32, window 3 with history 6") {
    s.stride = 2, s.window = 4, s.page_size = 2, s.pages = 24, s.history = 6, s.window_tokens = 3;
    seed = GENERATE(1u, 2u);
  }
  SECTION("S=3 W=7, pages of 3, f32, no window, no history") {
    s.stride = 3, s.window = 7, s.page_size = 3, s.pages = 14, s.history = 0, s.window_tokens = 0;
    seed = GENERATE(3u, 4u);
  }
  SECTION("S=W=1, pages of 4, bf16, tied window 3, no history") {
    s.stride = 1, s.window = 1, s.page_size = 4, s.pages = 40, s.storage = storage_type::bf16, s.history = 0;
    s.window_tokens = 3, s.window_value_channels = 0;
    seed = GENERATE(5u, 6u);
  }
  SECTION("S=2 W=4, pages of 1, f16, window 3, no history") {
    s.stride = 2, s.window = 4, s.page_size = 1, s.pages = 40, s.storage = storage_type::f16, s.history = 0;
    s.window_tokens = 3;
    seed = GENERATE(7u, 8u);
  }
  SECTION("S=3 W=7, pages of 4, bf16, no window, history 6") {
    s.stride = 3, s.window = 7, s.page_size = 4, s.pages = 12, s.storage = storage_type::bf16, s.history = 6;
    seed = GENERATE(9u, 10u);
  }
  SECTION("S=1 W=1, pages of 1, f32, window 3 with history 6") {
    s.stride = 1, s.window = 1, s.page_size = 1, s.pages = 60, s.history = 6, s.window_tokens = 3;
    seed = GENERATE(11u);
  }
  INFO(describe(s) << ", seed " << seed);
  random_run(s, seed).run(500);
}

// ------------------------------------------------------------------------------------------------
// Targeted tests.

// A sequence of `tokens` random tokens in a fresh cache; its reference alongside.
struct filled {
  world w;
  test_cache cache;
  sequence_id id;
  reference ref;

  filled(const setup& s, std::int64_t tokens, std::uint32_t seed = 1)
      : w(s), cache(w.make_cache()), id(cache.create()), ref(w.fresh_reference()) {
    std::mt19937 rng(seed);
    const token_inputs in = w.random_inputs(rng, tokens);
    w.append(cache, id, in);
    w.model_append(ref, in);
  }
};

TEST_CASE("paged_cache: fork shares every page; appending copies only a shared partial last page", "[cache][paged]") {
  setup s;
  s.stride = 2, s.window = 4, s.page_size = 4, s.pages = 16, s.window_tokens = 3;
  filled f(s, 2 * (2 * 4 + 2) + 1);  // 10 entries: two full pages and a last page holding 2
  test_cache& cache = f.cache;
  std::mt19937 rng(2);
  for (std::size_t k = 0; k < kStreams; ++k) REQUIRE(cache.page_table(f.id, k).size() == 3);
  const std::int64_t used = cache.pool(0).used_pages();

  const sequence_id child = cache.fork(f.id);
  REQUIRE(child != f.id);
  REQUIRE(cache.sequences() == 2);
  for (std::size_t k = 0; k < kStreams; ++k) {
    REQUIRE(cache.pool(k).used_pages() == used);
    REQUIRE(cache.page_table(child, k) == cache.page_table(f.id, k));
    for (page_id p : cache.page_table(f.id, k)) REQUIRE(cache.pool(k).refcount(p) == 2);
    REQUIRE(cache.state(child, k) == cache.state(f.id, k));
  }
  REQUIRE(f.w.compare(cache, child, f.ref) == "");
  REQUIRE(cache.memory(child).shared_pages == cache.memory(child).pages);

  const std::vector<page_id> parent_table = cache.page_table(f.id, 0);
  // One more token completes entry 10, the third entry of the shared partial page.
  reference child_ref = f.ref;
  const token_inputs one = f.w.random_inputs(rng, 1);
  REQUIRE(f.w.append(cache, child, one) == 1);
  f.w.model_append(child_ref, one);
  for (std::size_t k = 0; k < kStreams; ++k) {
    INFO("stream " << k);
    REQUIRE(cache.pool(k).used_pages() == used + 1);  // exactly one copy page
    const auto& table = cache.page_table(child, k);
    REQUIRE(table.size() == 3);
    REQUIRE(table[0] == parent_table[0]);
    REQUIRE(table[1] == parent_table[1]);
    REQUIRE(table[2] != parent_table[2]);
    REQUIRE(cache.pool(k).refcount(parent_table[2]) == 1);
    REQUIRE(cache.pool(k).refcount(table[2]) == 1);
    REQUIRE(cache.pool(k).refcount(table[0]) == 2);
  }
  REQUIRE(cache.page_table(f.id, 0) == parent_table);
  REQUIRE(f.w.compare(cache, f.id, f.ref) == "");  // the parent's entries are untouched
  REQUIRE(f.w.compare(cache, child, child_ref) == "");

  // The parent is now the only holder of its partial page: it writes in place.
  reference parent_ref = f.ref;
  const token_inputs two = f.w.random_inputs(rng, 2);
  f.w.append(cache, f.id, two);
  f.w.model_append(parent_ref, two);
  REQUIRE(cache.pool(0).used_pages() == used + 1);
  REQUIRE(cache.page_table(f.id, 0) == parent_table);
  REQUIRE(f.w.compare(cache, f.id, parent_ref) == "");
  REQUIRE(f.w.compare(cache, child, child_ref) == "");

  SECTION("a fork whose last page is full allocates a fresh page and copies nothing") {
    // Parent: 11 entries → fill its third page (12 entries), then fork and append.
    const token_inputs fill = f.w.random_inputs(rng, 2);
    f.w.append(cache, f.id, fill);
    f.w.model_append(parent_ref, fill);
    REQUIRE(cache.entries(f.id, 0) == 12);
    const sequence_id second = cache.fork(f.id);
    const std::int64_t before = cache.pool(0).used_pages();
    const token_inputs more = f.w.random_inputs(rng, 2);
    f.w.append(cache, second, more);
    REQUIRE(cache.pool(0).used_pages() == before + 1);
    for (std::size_t i = 0; i < 3; ++i) REQUIRE(cache.pool(0).refcount(cache.page_table(f.id, 0)[i]) >= 2);
    REQUIRE(f.w.compare(cache, f.id, parent_ref) == "");
  }
  SECTION("free and clear return every page") {
    cache.free(child);
    for (page_id p : parent_table) REQUIRE(cache.pool(0).refcount(p) == 1);
    REQUIRE_THROWS_AS(cache.tokens(child), input_error);
    cache.clear();
    for (std::size_t k = 0; k < kStreams; ++k) REQUIRE(cache.pool(k).free_pages() == cache.pool(k).capacity());
    REQUIRE(cache.sequences() == 0);
  }
  SECTION("copy(source, destination) replaces the destination and shares the source's pages") {
    const sequence_id other = cache.create();
    const token_inputs some = f.w.random_inputs(rng, 9);
    f.w.append(cache, other, some);
    cache.copy(f.id, other);
    REQUIRE(cache.page_table(other, 0) == cache.page_table(f.id, 0));
    REQUIRE(f.w.compare(cache, other, parent_ref) == "");
    REQUIRE(pool_consistency(cache, {f.id, child, other}) == "");
  }
  SECTION("keep(id) drops every other sequence") {
    const sequence_id extra = cache.fork(child);
    cache.keep(child);
    REQUIRE(cache.sequences() == 1);
    REQUIRE_FALSE(cache.contains(f.id));
    REQUIRE_FALSE(cache.contains(extra));
    REQUIRE(f.w.compare(cache, child, child_ref) == "");
    REQUIRE(pool_consistency(cache, {child}) == "");
    REQUIRE(cache.memory(child).shared_pages == 0);
  }
}

TEST_CASE("paged_cache: remove_suffix drops the entries it no longer covers and keeps the pending state",
          "[cache][paged]") {
  setup s;
  s.stride = 2, s.window = 4, s.page_size = 2, s.pages = 32, s.history = 6, s.window_tokens = 3;
  filled f(s, 21);
  test_cache& cache = f.cache;
  std::mt19937 rng(3);
  const sequence_id child = cache.fork(f.id);
  // Roll the child back 5 tokens, mid-block: entries 8 and 9 go, page 4 is released by the child.
  cache.remove_suffix(child, 16);
  reference child_ref = f.ref;
  f.w.model_remove_suffix(child_ref, 16);
  REQUIRE(cache.tokens(child) == 16);
  REQUIRE(cache.entries(child, 0) == 8);
  REQUIRE(cache.page_table(child, 0).size() == 4);
  REQUIRE(cache.pool(0).refcount(cache.page_table(f.id, 0)[4]) == 1);
  REQUIRE(f.w.compare(cache, child, child_ref) == "");
  REQUIRE(f.w.compare(cache, f.id, f.ref) == "");
  // Continuing from the rollback point gives the entries a fresh prefill of the new tokens gives.
  const token_inputs more = f.w.random_inputs(rng, 7);
  f.w.append(cache, child, more);
  f.w.model_append(child_ref, more);
  REQUIRE(f.w.compare(cache, child, child_ref) == "");
  REQUIRE(f.w.compare(cache, f.id, f.ref) == "");
  REQUIRE(pool_consistency(cache, {f.id, child}) == "");
  // p0 == tokens is a no-op.
  cache.remove_suffix(child, cache.tokens(child));
  REQUIRE(f.w.compare(cache, child, child_ref) == "");
  // p0 = 1 would need the window row of token 0, overwritten long ago...
  REQUIRE_THROWS_WITH(cache.remove_suffix(child, 1), Contains("history"));
  // ...but p0 = 0 empties the sequence and needs no input at all; it then starts over cleanly.
  REQUIRE(f.w.can_remove_suffix(child_ref, 0));
  cache.remove_suffix(child, 0);
  f.w.model_remove_suffix(child_ref, 0);
  REQUIRE(cache.page_table(child, 0).empty());
  REQUIRE(cache.window_first(child) == 0);
  REQUIRE(f.w.compare(cache, child, child_ref) == "");
  const token_inputs again = f.w.random_inputs(rng, 5);
  f.w.append(cache, child, again);
  f.w.model_append(child_ref, again);
  REQUIRE(cache.window_first(child) == 0);  // the ring (window + history rows) holds all five
  REQUIRE(f.w.compare(cache, child, child_ref) == "");
  REQUIRE(f.w.compare(cache, f.id, f.ref) == "");
  REQUIRE(pool_consistency(cache, {f.id, child}) == "");
}

TEST_CASE("paged_cache: rolling back twice never reads ring rows a later token overwrote", "[cache][paged]") {
  // S=2, W=4, no history: the state keeps the last 4 tokens' inputs. 20 → 18 needs tokens 16, 17
  // (kept). Then 18 → 17 needs tokens 14–16 for entry 8, but rows 14 and 15 now hold tokens 18
  // and 19 — that rollback must be refused, and one that is allowed must give the right entries.
  setup s;
  s.stride = 2, s.window = 4, s.page_size = 2, s.pages = 32, s.history = 0, s.window_tokens = 0;
  filled f(s, 20);
  test_cache& cache = f.cache;
  cache.remove_suffix(f.id, 18);
  f.w.model_remove_suffix(f.ref, 18);
  REQUIRE_FALSE(f.w.can_remove_suffix(f.ref, 17));
  const snapshot before(cache, {f.id});
  REQUIRE_THROWS_WITH(cache.remove_suffix(f.id, 17), Contains("history"));
  REQUIRE(snapshot(cache, {f.id}) == before);
  std::mt19937 rng(4);
  const token_inputs more = f.w.random_inputs(rng, 3);
  f.w.append(cache, f.id, more);
  f.w.model_append(f.ref, more);
  REQUIRE(f.w.compare(cache, f.id, f.ref) == "");
}

TEST_CASE("paged_cache: pool exhaustion mid-prefill throws capacity_error and changes nothing", "[cache][paged]") {
  setup s;
  s.stride = 2, s.window = 4, s.page_size = 1, s.pages = 3, s.history = 2, s.window_tokens = 3;
  filled f(s, 3);  // one entry, one page per stream
  test_cache& cache = f.cache;
  std::mt19937 rng(5);
  REQUIRE(cache.pool(0).used_pages() == 1);

  SECTION("a plain sequence") {
    // 9 more tokens → 6 entries → 5 more pages, but only 2 are free.
    const snapshot before(cache, {f.id});
    const token_inputs big = f.w.random_inputs(rng, 9);
    REQUIRE_THROWS_AS(f.w.append(cache, f.id, big), capacity_error);
    REQUIRE(snapshot(cache, {f.id}) == before);
    REQUIRE(f.w.compare(cache, f.id, f.ref) == "");
    REQUIRE_THROWS_WITH(f.w.append(cache, f.id, big), Contains("capacity") && Contains("3"));
    // A smaller append still fits and continues exactly where the sequence was.
    const token_inputs small = f.w.random_inputs(rng, 4);
    REQUIRE(f.w.append(cache, f.id, small) == 2);
    f.w.model_append(f.ref, small);
    REQUIRE(f.w.compare(cache, f.id, f.ref) == "");
    REQUIRE(cache.pool(0).used_pages() == 3);
  }
  SECTION("a fork whose shared partial last page needs a copy as well") {
    setup t = s;
    t.page_size = 2;
    filled g(t, 3);  // entry 0 alone in a partial page
    const sequence_id child = g.cache.fork(g.id);
    // 9 more tokens → 6 entries: the copy of the partial page plus 2 fresh pages, 2 are free.
    const snapshot before(g.cache, {g.id, child});
    const token_inputs big = g.w.random_inputs(rng, 9);
    REQUIRE_THROWS_AS(g.w.append(g.cache, child, big), capacity_error);
    REQUIRE(snapshot(g.cache, {g.id, child}) == before);
    REQUIRE(pool_consistency(g.cache, {g.id, child}) == "");
    g.cache.clear();
    for (std::size_t k = 0; k < kStreams; ++k) REQUIRE(g.cache.pool(k).free_pages() == g.cache.pool(k).capacity());
  }
  SECTION("a malformed chunk is an input_error even when the pool could not hold it") {
    const token_inputs big = f.w.random_inputs(rng, 9);
    test_cache::chunks chunks = world::chunks_of(big);
    chunks[1].tokens = 8;
    const snapshot before(cache, {f.id});
    REQUIRE_THROWS_AS(cache.append(f.id, chunks, big.window_keys, big.window_values), input_error);
    REQUIRE(snapshot(cache, {f.id}) == before);
  }
}

TEST_CASE("paged_cache: errors name the field and the value and change nothing", "[cache][paged]") {
  setup s;
  s.stride = 2, s.window = 4, s.page_size = 2, s.pages = 16, s.history = 2, s.window_tokens = 3;
  filled f(s, 11);
  test_cache& cache = f.cache;
  std::mt19937 rng(6);
  const sequence_id other = cache.fork(f.id);
  const std::vector<sequence_id> live{f.id, other};
  const snapshot before(cache, live);
  const sequence_id freed = cache.create();
  cache.free(freed);
  const token_inputs in = f.w.random_inputs(rng, 2);

  REQUIRE_THROWS_WITH(f.w.append(cache, 77, in), Contains("append(sequence) = 77") && Contains("not a live sequence"));
  REQUIRE_THROWS_WITH(f.w.append(cache, freed, in), Contains("append(sequence) = " + std::to_string(freed)));
  REQUIRE_THROWS_WITH(cache.fork(freed), Contains("fork(sequence) = " + std::to_string(freed)));
  REQUIRE_THROWS_WITH(cache.free(freed), Contains("free(sequence) = " + std::to_string(freed)));
  REQUIRE_THROWS_WITH(cache.keep(-5), Contains("keep(sequence) = -5"));
  REQUIRE_THROWS_WITH(cache.tokens(-5), Contains("tokens(sequence) = -5"));
  REQUIRE_THROWS_WITH(cache.copy(f.id, f.id), Contains("copy(destination) = " + std::to_string(f.id)));
  REQUIRE_THROWS_AS(cache.copy(f.id, f.id), input_error);
  REQUIRE_THROWS_WITH(cache.copy(f.id, freed), Contains("copy(sequence) = " + std::to_string(freed)));
  REQUIRE_THROWS_WITH(cache.remove_suffix(f.id, -1), Contains("remove_suffix(p0) = -1") && Contains("tokens = 11"));
  REQUIRE_THROWS_WITH(cache.remove_suffix(f.id, 12), Contains("remove_suffix(p0) = 12") && Contains("tokens = 11"));
  REQUIRE_THROWS_AS(cache.remove_suffix(f.id, 12), input_error);
  // History 2 and window 3: 11 tokens keep the window rows of tokens 6–10 (5 rows). p0 = 8 would
  // need window tokens 5–7, token 5 is gone; p0 = 9 is the furthest legal rollback.
  REQUIRE_FALSE(f.w.can_remove_suffix(f.ref, 8));
  REQUIRE_THROWS_WITH(cache.remove_suffix(f.id, 8), Contains("remove_suffix(p0) = 8") && Contains("history = 2"));
  REQUIRE_THROWS_AS(cache.remove_suffix(f.id, 1), input_error);  // window token 0 is gone
  token_inputs bad = f.w.random_inputs(rng, 2);
  bad.window_keys.pop_back();
  REQUIRE_THROWS_WITH(f.w.append(cache, f.id, bad), Contains("window_keys.size() = 15") && Contains("must be 16"));
  bad = f.w.random_inputs(rng, 2);
  bad.window_values.clear();
  REQUIRE_THROWS_WITH(f.w.append(cache, f.id, bad), Contains("window_values.size() = 0"));
  float out[kHeads * kKeyChannels];
  REQUIRE_THROWS_WITH(cache.read_entry(f.id, 0, 5, out), Contains("read_entry(entry) = 5") && Contains("entries = 5"));
  REQUIRE_THROWS_WITH(cache.window_key(f.id, 5), Contains("window token = 5"));  // rows 6–10 are held
  REQUIRE_THROWS_AS(cache.window_value(f.id, 11), input_error);
  const std::vector<sequence_id> batch{f.id};
  REQUIRE_THROWS_WITH(cache.view(span<const sequence_id>(batch.data(), 1), 2), Contains("view(stream) = 2"));

  REQUIRE(snapshot(cache, live) == before);
  REQUIRE(f.w.compare(cache, f.id, f.ref) == "");
  REQUIRE(f.w.compare(cache, other, f.ref) == "");
  cache.remove_suffix(f.id, 9);  // the furthest legal rollback still works afterwards
  REQUIRE(cache.tokens(f.id) == 9);
}

TEST_CASE("paged_cache: a bad cache_config names the field", "[cache][paged]") {
  const world w(setup{});
  const auto make = [&](cache_config c) { return test_cache(test_layer(w.keys, w.values), std::move(c)); };
  cache_config c = w.config;
  c.page_size = 0;
  REQUIRE_THROWS_WITH(make(c), Contains("cache.page_size = 0"));
  REQUIRE_THROWS_AS(make(c), config_error);
  c = w.config;
  c.pages = 0;
  REQUIRE_THROWS_WITH(make(c), Contains("cache.pages = 0"));
  c = w.config;
  c.history = -1;
  REQUIRE_THROWS_WITH(make(c), Contains("cache.history = -1"));
  c = w.config;
  c.window.tokens = -2;
  REQUIRE_THROWS_WITH(make(c), Contains("cache.window.tokens = -2"));
  c = w.config;
  c.window.tokens = 4;
  c.window.key_channels = 0;
  REQUIRE_THROWS_WITH(make(c), Contains("cache.window.key_channels = 0"));
  c.window.key_channels = 4;
  c.window.kv_heads = 0;
  REQUIRE_THROWS_WITH(make(c), Contains("cache.window.kv_heads = 0"));
  c.window.kv_heads = 1;
  c.window.value_channels = -1;
  REQUIRE_THROWS_WITH(make(c), Contains("cache.window.value_channels = -1"));
  // Without a window its shape is not read.
  c = w.config;
  c.window.tokens = 0;
  c.window.key_channels = 0;
  REQUIRE_NOTHROW(make(c));
}

TEST_CASE("paged_cache: memory accounting and the compression ratio", "[cache][paged]") {
  setup s;
  s.stride = 4, s.window = 8, s.page_size = 16, s.pages = 64, s.history = 4, s.window_tokens = 8;
  s.storage = storage_type::bf16;
  filled f(s, 4 * 200 + 3);
  test_cache& cache = f.cache;
  const sequence_memory m = cache.memory(f.id);
  REQUIRE(m.tokens == 803);
  REQUIRE(m.entries == 2 * 200);
  REQUIRE(m.pages == 2 * 13);
  REQUIRE(m.shared_pages == 0);
  const std::int64_t entry_bytes = 2 * kHeads * (kKeyChannels + kValueChannels);  // bf16
  REQUIRE(m.entry_bytes == 200 * entry_bytes);
  REQUIRE(m.uncompressed_bytes == 803 * entry_bytes);
  REQUIRE(m.page_bytes == 13 * (cache.pool(0).bytes_per_page() + cache.pool(1).bytes_per_page()));
  REQUIRE(m.page_bytes >= m.entry_bytes);
  REQUIRE(m.state_bytes > 0);
  REQUIRE(m.compression_ratio() == Approx(803.0 / 200.0));
  REQUIRE(m.compression_ratio() == Approx(4.0).epsilon(0.01));
  REQUIRE(cache.pool(0).bytes_used() == 13 * cache.pool(0).bytes_per_page());

  const sequence_id child = cache.fork(f.id);
  REQUIRE(cache.memory(child).shared_pages == m.pages);
  REQUIRE(cache.memory(f.id).shared_pages == m.pages);
  REQUIRE(cache.pool(0).bytes_used() == 13 * cache.pool(0).bytes_per_page());  // forks are free
  const sequence_id empty = cache.create();
  const sequence_memory e = cache.memory(empty);
  REQUIRE(e.tokens == 0);
  REQUIRE(e.entries == 0);
  REQUIRE(e.pages == 0);
  REQUIRE(e.compression_ratio() == 0.0);
}

TEST_CASE("paged_cache: the view of a batch reads exactly the stored entries", "[cache][paged]") {
  for (storage_type storage : {storage_type::f32, storage_type::bf16, storage_type::f16}) {
    INFO("storage " << storage);
    setup s;
    s.stride = 3, s.window = 7, s.page_size = 3, s.pages = 32, s.storage = storage;
    world w(s);
    test_cache cache = w.make_cache();
    std::mt19937 rng(8);
    std::vector<reference> refs(4, w.fresh_reference());
    std::vector<sequence_id> ids;
    const std::int64_t lengths[] = {22, 0, 2, 27};  // partial last page, empty, no entry yet, full pages
    for (std::size_t b = 0; b < 4; ++b) {
      ids.push_back(cache.create());
      const token_inputs in = w.random_inputs(rng, lengths[b]);
      w.append(cache, ids[b], in);
      w.model_append(refs[b], in);
    }
    // A fork in the batch shares pages with its parent.
    ids.push_back(cache.fork(ids[0]));
    refs.push_back(refs[0]);
    std::vector<const reference*> pointers;
    for (const reference& r : refs) pointers.push_back(&r);
    REQUIRE(w.compare_view(cache, ids, pointers) == "");

    const paged_view v = cache.view(span<const sequence_id>(ids.data(), ids.size()), 1);
    REQUIRE(v.indptr == std::vector<std::int32_t>{0, 3, 3, 3, 6, 9});
    REQUIRE(v.last_page_len == std::vector<std::int32_t>{1, 0, 0, 3, 1});
    REQUIRE(v.entries == std::vector<std::int64_t>{7, 0, 0, 9, 7});
    REQUIRE(v.base == cache.pool(1).base());
    REQUIRE(v.layout.entry_stride_bytes == kHeads * kValueChannels * bytes_per_element(storage));
    REQUIRE(v.layout.page_stride_bytes % 64 == 0);
    REQUIRE(v.layout.head_stride_bytes == kValueChannels * bytes_per_element(storage));
    const paged_view none = cache.view({}, 0);
    REQUIRE(none.indptr == std::vector<std::int32_t>{0});
    REQUIRE(none.indices.empty());
  }
}

// ------------------------------------------------------------------------------------------------
// Threads: one writer per sequence, several threads on one cache. Meant to be run under
// ThreadSanitizer too (it checks results without it, but races show only with it).

TEST_CASE("paged_cache: threads owning different sequences share one cache", "[cache][paged][threads]") {
  setup s;
  s.stride = 2, s.window = 4, s.page_size = 4, s.pages = 4096, s.history = 6, s.window_tokens = 3;
  const world w(s);
  test_cache cache = w.make_cache();
  std::mt19937 root_rng(9);

  // A shared prefix whose last page is partial (18 entries, pages of 4): every thread starts from
  // a fork of it, so the threads copy the same page on write and read the same full pages.
  const sequence_id root = cache.create();
  reference root_ref = w.fresh_reference();
  const token_inputs prefix = w.random_inputs(root_rng, 37);
  w.append(cache, root, prefix);
  w.model_append(root_ref, prefix);

  // A second prefix, forked to every thread and then dropped here: its pages end up held by the
  // workers alone, and the last holder of its partial page writes into it in place, after the
  // other threads have read it and let go.
  const sequence_id orphan = cache.create();
  reference orphan_ref = w.fresh_reference();
  const token_inputs other_prefix = w.random_inputs(root_rng, 29);
  w.append(cache, orphan, other_prefix);
  w.model_append(orphan_ref, other_prefix);

  constexpr int kThreads = 3;
  std::vector<sequence_id> forks, orphan_forks;
  for (int i = 0; i < kThreads; ++i) {
    forks.push_back(cache.fork(root));
    orphan_forks.push_back(cache.fork(orphan));
  }
  cache.free(orphan);

  std::atomic<bool> done{false};
  std::vector<std::string> problems(kThreads + 1);
  const auto worker = [&](int index) {
    std::mt19937 rng(100 + static_cast<std::uint32_t>(index));
    std::map<sequence_id, reference> own{{forks[static_cast<std::size_t>(index)], root_ref},
                                         {orphan_forks[static_cast<std::size_t>(index)], orphan_ref}};
    std::string& problem = problems[static_cast<std::size_t>(index)];
    const auto check_own = [&] {
      std::vector<sequence_id> ids;
      std::vector<const reference*> refs;
      for (const auto& [id, r] : own) {
        if (problem.empty()) problem = w.compare(cache, id, r);
        (void)cache.memory(id);
        ids.push_back(id);
        refs.push_back(&r);
      }
      if (problem.empty()) problem = w.compare_view(cache, ids, refs);
    };
    for (int step = 0; step < 120 && problem.empty(); ++step) {
      const int kind = std::discrete_distribution<int>({50, 10, 15, 10, 5})(rng);
      if (own.empty() || kind == 4) {
        own.emplace(cache.create(), w.fresh_reference());
        continue;
      }
      auto it = own.begin();
      std::advance(it, std::uniform_int_distribution<std::size_t>(0, own.size() - 1)(rng));
      const sequence_id id = it->first;
      reference& r = it->second;
      if (kind == 0) {
        const token_inputs in = w.random_inputs(rng, std::uniform_int_distribution<std::int64_t>(0, 9)(rng));
        w.append(cache, id, in);
        w.model_append(r, in);
      } else if (kind == 1 && own.size() < 5) {
        own.emplace(cache.fork(id), r);
      } else if (kind == 2) {
        const std::int64_t p0 =
            std::max<std::int64_t>(0, r.inputs.tokens - std::uniform_int_distribution<std::int64_t>(0, 8)(rng));
        if (w.can_remove_suffix(r, p0)) {
          cache.remove_suffix(id, p0);
          w.model_remove_suffix(r, p0);
        } else {
          try {
            cache.remove_suffix(id, p0);
            problem = "an illegal remove_suffix was accepted";
          } catch (const input_error&) {
          }
        }
      } else if (kind == 3 && own.size() > 1) {
        cache.free(id);
        own.erase(it);
      }
      check_own();
    }
    for (const auto& [id, r] : own) cache.free(id);
  };

  // The main thread reads the root — whose pages every fork shares — while the workers write.
  std::thread reader([&] {
    std::string& problem = problems[kThreads];
    while (!done.load() && problem.empty()) {
      problem = w.compare(cache, root, root_ref);
      const std::vector<sequence_id> batch{root};
      if (problem.empty()) problem = w.compare_view(cache, batch, {&root_ref});
      (void)cache.memory(root);
      (void)cache.sequences();
    }
  });
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (auto& t : threads) t.join();
  done.store(true);
  reader.join();

  for (int i = 0; i <= kThreads; ++i) {
    INFO("thread " << i);
    REQUIRE(problems[static_cast<std::size_t>(i)] == "");
  }
  REQUIRE(cache.sequences() == 1);
  REQUIRE(pool_consistency(cache, {root}) == "");
  REQUIRE(w.compare(cache, root, root_ref) == "");
  cache.free(root);
  for (std::size_t k = 0; k < kStreams; ++k) REQUIRE(cache.pool(k).free_pages() == cache.pool(k).capacity());
}

}  // namespace

}  // namespace test_cache_paged
