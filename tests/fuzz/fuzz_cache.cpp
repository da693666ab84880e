// libFuzzer target for the paged cache: random operation sequences on a
// small pool, checked after every operation against a model. tests/fuzz/README.md says how to
// run it; scripts/fuzz builds and runs it.
//
// Input bytes, read front to back (a byte past the end reads as 0, so every input decodes):
//   1. a configuration within safe bounds: one of three compiled-in stream combinations (separate
//      K/V; tied K/V + indexer, DeepSeek-V4 CSA shaped; K, V and indexer), stride 1–4, window
//      S…2S+1, origin, anchor, page size 1–4, 4–24 pages per pool (small enough that
//      capacity_error is common), 1–2 KV heads, a few channels, RoPE (with YaRN or not), history
//      0–6, raw window 0–5 tokens (in fp32 or FP8, with 0 … key channels bf16 RoPE channels), one
//      stream stored in bf16 or f16, per-branch or per-slot inputs per stream;
//   2. up to kMaxOperations operations: create, append (0–9 tokens, sometimes a malformed chunk),
//      fork, copy, remove_suffix (often beyond what the history allows), keep, free, clear, and
//      reads through sparse_readers (with and without top-k, sink, de-rotation, bf16 indexer),
//      any of them sometimes on a sequence the cache must not know. Values come from a
//      generator seeded by a byte of the operation, so they are finite and moderate whatever the
//      fuzzer writes.
//
// The model keeps, per live sequence, every token's inputs (each stream's payload and logits,
// the window rows). After every operation it checks:
//   (i)   every entry of every stream equals, bit for bit, the entry a brand-new state of the
//         model's own compressor emits when given all the sequence's tokens in one chunk, passed
//         through the stream's storage conversion: every live sequence page by page in the
//         pool's bytes, and the sequence the operation named also through cache.read_entry;
//   (ii)  tokens, entries, the streams' states, page-table lengths, window_first and the raw
//         window rows, memory(), and the CSR view (one stream per operation, in turn);
//   (iii) every page's reference count equals the page-table references of the live sequences,
//         and used_pages() the number of distinct pages referenced;
//   (iv)  reads match the double-precision oracle of tests/oracle/scalar_attention.hpp (the
//         top-k selection up to rounding ties, the output to 1e-5 of the value scale, the
//         trace's masses);
//   (v)   an operation the model says must fail throws the right phasekv::error and leaves a full
//         dump of the cache (states, tables, reference counts, page bytes, window rows, memory())
//         exactly as it was; an operation that must succeed does not throw, and capacity_error
//         is predicted exactly (pages needed, copy on write included, against pages free).
// Structure is checked too: fork and copy share the source's pages, append keeps the table's
// prefix and copies a partial last page exactly when another sequence holds it, remove_suffix
// keeps a prefix.
//
// Cost: sequences stay short (kMaxTokens) and few (kMaxLive), so the checks of every operation
// stay cheap enough for a campaign of 10^7 executions; see README.md for the measured rate.
//
// Any mismatch prints "phasekv fuzz: FAILED: …" with the configuration and the operation on
// stderr and aborts. PHASEKV_FUZZ_TRACE=1 in the environment prints every operation as it runs
// (for reading a crash input: `fuzz_cache crash-…`); PHASEKV_FUZZ_STATS=1 prints at exit how
// often each outcome (copy on write, capacity_error, refused rollback …) was reached.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "oracle/scalar_attention.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/format/fp8.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace {

using namespace phasekv;
using i64 = std::int64_t;

// Bounds that keep one execution cheap: the model recomputes a sequence's entries from scratch
// after every append, and compares every entry of every live sequence after every operation.
constexpr i64 kMaxTokens = 48;  // per sequence (several laps of every ring); appends beyond it are shortened
constexpr std::size_t kMaxLive = 6;
constexpr int kMaxOperations = 24;  // the bugs planted by scripts/fuzz --plant need fewer than 10
constexpr double kReadTolerance = 1e-5;  // as tests/test_read.cpp: relative to the value scale
constexpr sequence_id no_sequence = std::numeric_limits<sequence_id>::max();

std::size_t sz(i64 n) { return static_cast<std::size_t>(n); }

// ---- reporting -----------------------------------------------------------------------------

// What is running, formatted only when something fails (or when tracing).
struct context {
  std::string (*describe_setup)(const void*) = nullptr;
  const void* setup = nullptr;
  int operation = -1;
  const char* name = "setup";
  i64 args[4] = {0, 0, 0, 0};
};
context g_context;

bool tracing() {
  static const bool on = std::getenv("PHASEKV_FUZZ_TRACE") != nullptr;
  return on;
}

// How often each outcome was reached, per stream combination: the evidence that a run exercises
// what it is meant to (copy on write, capacity_error, rollbacks refused beyond the history, top-k
// reads …). PHASEKV_FUZZ_STATS=1 prints the totals at exit; PHASEKV_FUZZ_STATS=each also prints
// one line per input (what scripts/fuzz --seeds selects the seed corpus by).
enum outcome {
  appended, appended_copy_on_write, append_capacity_error, append_malformed, created, forked, copied,
  removed_suffix, remove_suffix_refused, freed, kept, cleared, read_plain, read_top_k, read_refused,
  unknown_sequence, outcome_count
};
const char* const outcome_names[] = {
    "append", "append with copy on write", "append -> capacity_error", "malformed append -> input_error",
    "create", "fork", "copy", "remove_suffix", "remove_suffix -> input_error", "free", "keep", "clear",
    "read without top-k", "read with top-k", "read -> input_error", "unknown sequence -> input_error"};
constexpr int kCombinations = 3;
std::uint64_t outcomes[kCombinations][outcome_count] = {};
std::uint64_t input_outcomes[outcome_count] = {};
int g_combination = 0;

void count(outcome o) {
  ++outcomes[g_combination][o];
  ++input_outcomes[o];
}

void print_outcomes() {
  std::fprintf(stderr, "phasekv fuzz: %-34s %12s %12s %12s\n", "outcome", "separate K/V", "tied+indexer",
               "K, V, indexer");
  for (int o = 0; o < outcome_count; ++o)
    std::fprintf(stderr, "phasekv fuzz: %-34s %12llu %12llu %12llu\n", outcome_names[o],
                 static_cast<unsigned long long>(outcomes[0][o]), static_cast<unsigned long long>(outcomes[1][o]),
                 static_cast<unsigned long long>(outcomes[2][o]));
}

const char* const stats_mode = std::getenv("PHASEKV_FUZZ_STATS");
const bool stats_registered = stats_mode != nullptr && std::atexit(print_outcomes) == 0;

// PHASEKV_FUZZ_STATS=each: "phasekv fuzz: input <combination> <count per outcome …>".
void print_input_outcomes() {
  if (stats_mode == nullptr || std::strcmp(stats_mode, "each") != 0) return;
  std::fprintf(stderr, "phasekv fuzz: input %d", g_combination);
  for (std::uint64_t n : input_outcomes) std::fprintf(stderr, " %llu", static_cast<unsigned long long>(n));
  std::fprintf(stderr, "\n");
}

std::string describe_operation() {
  std::ostringstream out;
  out << "#" << g_context.operation << " " << g_context.name << "(" << g_context.args[0] << ", " << g_context.args[1]
      << ", " << g_context.args[2] << ", " << g_context.args[3] << ")";
  return out.str();
}

[[noreturn]] void fail(const std::string& what) {
  const std::string setup = g_context.describe_setup ? g_context.describe_setup(g_context.setup) : "?";
  std::fprintf(stderr, "\nphasekv fuzz: FAILED: %s\n  configuration: %s\n  operation: %s\n", what.c_str(),
               setup.c_str(), describe_operation().c_str());
  std::fflush(stderr);
  std::abort();
}

void begin_operation(int index, const char* name, i64 a = 0, i64 b = 0, i64 c = 0, i64 d = 0) {
  g_context.operation = index;
  g_context.name = name;
  g_context.args[0] = a;
  g_context.args[1] = b;
  g_context.args[2] = c;
  g_context.args[3] = d;
  if (tracing()) std::fprintf(stderr, "phasekv fuzz: %s\n", describe_operation().c_str());
}

template <class... Parts>
std::string str(const Parts&... parts) {
  std::ostringstream out;
  out.precision(9);
  (out << ... << parts);
  return out.str();
}

bool same_bits(const float* a, const float* b, i64 n) {
  return n == 0 || std::memcmp(a, b, sz(n) * sizeof(float)) == 0;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), static_cast<i64>(a.size()));
}

// ---- input bytes and values --------------------------------------------------------------------

class byte_source {
 public:
  byte_source(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool exhausted() const noexcept { return position_ >= size_; }
  std::uint8_t next() noexcept { return position_ < size_ ? data_[position_++] : 0; }
  // lo + next() mod (hi − lo + 1), for ranges of at most 256 values.
  i64 in(i64 lo, i64 hi) noexcept { return lo + next() % (hi - lo + 1); }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t position_ = 0;
};

// splitmix64: a few fuzzer bytes seed many values, so the fuzzer steers the structure of a run
// while the numbers stay finite and moderate.
class generator {
 public:
  explicit generator(std::uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi) from 24 random bits.
  float uniform(float lo, float hi) noexcept {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
  // Multiples of `step` in [lo, hi]: coarse values make equal entries and exactly tied indexer
  // scores, which exercise the tie-break of top-k.
  float grid(float lo, float hi, float step) noexcept {
    const auto steps = static_cast<std::uint64_t>((hi - lo) / step);
    return lo + step * static_cast<float>(next() % (steps + 1));
  }
  std::vector<float> fill(i64 n, float lo, float hi, bool coarse = false) {
    std::vector<float> out(sz(n));
    for (float& x : out) x = coarse ? grid(lo, hi, (hi - lo) / 8.0f) : uniform(lo, hi);
    return out;
  }

 private:
  std::uint64_t state_;
};

// ---- configurations ------------------------------------------------------------------------------

using gated_rope_norm = stream_compressor<compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>>;
using mean_plain = stream_compressor<compressor_policy<mean_pool>>;
using scalar_rope_before = stream_compressor<compressor_policy<scalar_gated_pool, rope_before_pool>>;
using fixed_plain = stream_compressor<compressor_policy<fixed_weight_pool>>;
using mean_norm = stream_compressor<compressor_policy<mean_pool, no_rope, rms_norm>>;

// The stream combinations: which compressors, and how the reader uses them.
struct separate_kv {
  static constexpr const char* name = "separate K/V (gated+RoPE-after+RMSNorm keys, mean values)";
  using cache = paged_cache<gated_rope_norm, mean_plain>;
  static constexpr std::array<stream_role, 2> roles{stream_role::key, stream_role::value};
  static constexpr std::size_t key_stream = 0, value_stream = 1, indexer_stream = no_stream;
};
struct tied_kv_indexer {  // DeepSeek-V4 CSA shaped
  static constexpr const char* name = "tied K/V + indexer (both gated+RoPE-after+RMSNorm)";
  using cache = paged_cache<gated_rope_norm, gated_rope_norm>;
  static constexpr std::array<stream_role, 2> roles{stream_role::key_value, stream_role::indexer};
  static constexpr std::size_t key_stream = 0, value_stream = 0, indexer_stream = 1;
};
struct kv_indexer {
  static constexpr const char* name = "K, V, indexer (scalar-gated+RoPE-before keys, fixed-weight values, mean+RMSNorm indexer)";
  using cache = paged_cache<scalar_rope_before, fixed_plain, mean_norm>;
  static constexpr std::array<stream_role, 3> roles{stream_role::key, stream_role::value, stream_role::indexer};
  static constexpr std::size_t key_stream = 0, value_stream = 1, indexer_stream = 2;
};
struct setup {
  int combination = 0;
  geometry geom;
  i64 page_size = 1, pages = 4, history = 0, window_tokens = 0;
  i64 kv_heads = 1, query_heads = 1, indexer_heads = 1;
  i64 key_channels = 2, value_channels = 1, indexer_channels = 2;
  rope_config key_rope, indexer_rope;
  std::array<input_layout, 3> inputs{};  // per stream
  std::size_t narrow_stream = 0;         // the stream stored in `narrow` (≥ stream count: none)
  storage_type narrow = storage_type::f32;
  bool fp8_window = false;  // raw_window_config::precision = fp8_e4m3_block
  i64 window_rope = 0;      // its rope_channels
  std::uint64_t param_seed = 0;
};

std::string describe_setup(const void* p) {
  const setup& s = *static_cast<const setup*>(p);
  const char* names[] = {separate_kv::name, tied_kv_indexer::name, kv_indexer::name};
  std::ostringstream out;
  out << names[s.combination] << "; S=" << s.geom.stride << " W=" << s.geom.window << " origin=" << s.geom.origin
      << " anchor=" << to_string(s.geom.anchor) << " page_size=" << s.page_size << " pages=" << s.pages
      << " history=" << s.history << " window.tokens=" << s.window_tokens << " kv_heads=" << s.kv_heads
      << " query_heads=" << s.query_heads << " channels k/v/indexer=" << s.key_channels << "/" << s.value_channels
      << "/" << s.indexer_channels << " indexer_heads=" << s.indexer_heads << " rope k/indexer=" << s.key_rope.channels
      << "/" << s.indexer_rope.channels << (s.key_rope.yarn.enabled ? " yarn" : "")
      << (s.key_rope.layout == rope_layout::half_split ? " half_split" : "") << " inputs=";
  for (input_layout l : s.inputs) out << (l == input_layout::per_branch ? 'b' : 's');
  out << " stream " << s.narrow_stream << " in " << to_string(s.narrow);
  if (s.fp8_window) out << " window in fp8_e4m3_block (rope " << s.window_rope << ")";
  out << " param_seed=" << s.param_seed;
  return out.str();
}

rope_config decode_rope(std::uint8_t b, i64 channels) {
  rope_config r;
  r.channels = std::min<i64>(2 * (1 + b % 3), channels - channels % 2);  // 2, 4 or 6, even, ≤ channels
  r.base = (b & 8) ? 10000.0 : 500.0;
  r.layout = (b & 16) ? rope_layout::half_split : rope_layout::interleaved;
  if (b & 32) {
    r.yarn.enabled = true;
    r.yarn.factor = 4.0;
    r.yarn.original_context = 32;
  }
  return r;
}

setup decode_setup(byte_source& in) {
  setup s;
  s.combination = static_cast<int>(in.next() % kCombinations);
  s.geom.stride = in.in(1, 4);
  s.geom.window = s.geom.stride + in.in(0, s.geom.stride + 1);
  const std::uint8_t placement = in.next();
  s.geom.origin = placement % s.geom.stride;
  s.geom.anchor = static_cast<anchor_mode>((placement / 4) % 3);
  s.page_size = in.in(1, 4);
  s.pages = in.in(4, 24);
  s.history = in.in(0, 6);
  s.window_tokens = in.in(0, 5);
  const std::uint8_t heads = in.next();
  s.kv_heads = 1 + heads % 2;
  s.query_heads = s.kv_heads * (1 + (heads / 2) % 2);
  s.indexer_heads = 1 + (heads / 4) % 3;
  s.key_channels = in.in(2, 6);
  s.value_channels = in.in(1, 5);
  s.indexer_channels = in.in(2, 7);
  s.key_rope = decode_rope(in.next(), s.key_channels);
  s.indexer_rope = decode_rope(in.next(), s.indexer_channels);
  const std::uint8_t layouts = in.next();
  for (std::size_t k = 0; k < 3; ++k) s.inputs[k] = (layouts >> k) & 1 ? input_layout::per_slot : input_layout::per_branch;
  const std::uint8_t narrow = in.next();
  s.narrow_stream = narrow % 4;
  s.narrow = (narrow / 4) % 2 ? storage_type::f16 : storage_type::bf16;
  s.fp8_window = (narrow / 8) % 2 == 1;
  s.window_rope = s.fp8_window ? (narrow / 16) % (s.key_channels + 1) : 0;
  s.param_seed = in.next();
  return s;
}

// The learned parameters of a stream (drawn from `rng`), and its RoPE only if its policy has one:
// a stream without RoPE keeps rope.channels = 0, so nothing reads an unvalidated RoPE setting.
template <class Compressor>
Compressor make_stream(const geometry& geom, stream_config c, generator& rng) {
  using policy = typename Compressor::policy;
  using pooling = typename policy::pooling;
  stream_params p;
  if constexpr (is_gated_v<pooling>) {
    if (rng.next() & 1)
      p.slot_bias = rng.fill(c.kv_heads * geom.window * gate_channels<pooling>(c.channels), -1.0f, 1.0f);
  }
  if constexpr (has_norm_v<policy>) {
    if (rng.next() & 1) p.norm_weight = rng.fill(c.channels, 0.25f, 2.0f);
  }
  if constexpr (std::is_same_v<pooling, fixed_weight_pool>) {
    p.slot_profile = rng.fill(geom.window, 0.0f, 1.0f);
    for (float& w : p.slot_profile)
      if (rng.next() % 4 == 0) w = 0.0f;  // some slots weigh nothing: entries over only those are zero
    p.slot_profile.back() = 0.5f;         // the last slot is never padding: a positive sum
  }
  if constexpr (!has_rope_v<policy>) c.rope = rope_config{};
  return Compressor(geom, c, p);
}

template <class Cache>
struct streams_of;
template <class... C>
struct streams_of<paged_cache<C...>> {
  using type = std::tuple<C...>;
};

// ---- the harness -----------------------------------------------------------------------------------

template <class Combo>
class harness {
 public:
  using cache_type = typename Combo::cache;
  using layer_type = typename cache_type::layer;
  using streams = typename streams_of<cache_type>::type;
  using reader_type = sparse_reader;
  static constexpr std::size_t N = cache_type::stream_count;
  static constexpr bool tied = Combo::key_stream == Combo::value_stream;
  static constexpr bool has_indexer = Combo::indexer_stream != no_stream;

  explicit harness(const setup& s)
      : s_(s),
        geom_(s.geom),
        fresh_(make_streams(s, std::make_index_sequence<N>{})),
        cache_(std::apply([](const auto&... c) { return layer_type(c...); }, fresh_), cache_config_of(s)) {
    for_each_stream([&](auto k) {
      const auto& c = std::get<decltype(k)::value>(fresh_);
      payload_floats_[k] = c.payload_floats_per_token();
      logit_floats_[k] = c.logit_floats_per_token();
      entry_floats_[k] = c.floats_per_entry();
      storage_[k] = cache_.pool(k).layout().storage;
      blank_states_[k] = c.make_state();
    });
    window_key_floats_ = s.window_tokens > 0 ? s.kv_heads * s.key_channels : 0;
    window_value_floats_ = s.window_tokens > 0 && !tied ? s.kv_heads * s.value_channels : 0;
    window_rows_ = s.window_tokens > 0 ? s.window_tokens + s.history : 0;
  }

  void run(byte_source& in) {
    check_all();
    for (op_ = 0; op_ < kMaxOperations && !in.exhausted(); ++op_) {
      const std::uint8_t code = in.next();
      touched_ = no_sequence;
      // With nothing live, every operation would only meet "unknown sequence": start one first.
      if (model_.empty() && code % 16 != 5 && code % 16 != 11) {
        op_create();
        check_all(touched_);
        touched_ = no_sequence;
      }
      // libFuzzer's mutations favour the bytes 0x00 and 0xFF: both append.
      switch (code % 16) {
        case 0: case 1: case 2: case 3: case 15: op_append(in, false); break;
        case 4: op_append(in, true); break;
        case 5: op_create(); break;
        case 6: case 7: op_fork(in); break;
        case 8: op_copy(in); break;
        case 9: case 10: op_remove_suffix(in); break;
        case 11:
          switch ((code >> 4) % 4) {
            case 0: case 1: op_free(in); break;
            case 2: op_keep(in); break;
            default: op_clear(); break;
          }
          break;
        case 12: case 13: case 14: op_read(in); break;
      }
      check_all(touched_);
    }
    // Dropping everything returns every page.
    begin_operation(op_, "final clear");
    expect_success([&] { cache_.clear(); });
    model_.clear();
    check_all();
    for (std::size_t k = 0; k < N; ++k)
      if (cache_.pool(k).free_pages() != cache_.pool(k).capacity())
        fail(str("stream ", k, ": ", cache_.pool(k).used_pages(), " pages still used after clear()"));
  }

 private:
  // Every token's inputs, token-major, in the layouts the cache takes.
  struct token_list {
    i64 tokens = 0;
    std::array<std::vector<float>, N> payload, logits;
    std::vector<float> window_keys, window_values;
  };
  struct sequence_model {
    token_list inputs;
    // Which token each ring row last received (docs/DESIGN.md §3/§4: token t in row t mod rows); −1
    // for none. Decides which rollbacks are legal and where the raw window starts.
    std::vector<i64> input_ring, window_ring;
    std::array<std::vector<float>, N> expected;         // the stored entries, widened back to fp32
    std::array<std::vector<std::byte>, N> stored;       // the same in the pool's storage format
  };

  // ---- construction ----

  template <std::size_t... K>
  static streams make_streams(const setup& s, std::index_sequence<K...>) {
    generator rng(s.param_seed);
    // Braces: the streams are made (and draw their parameters) in order.
    return streams{make_stream<std::tuple_element_t<K, streams>>(s.geom, stream_config_of(s, Combo::roles[K], K), rng)...};
  }

  static stream_config stream_config_of(const setup& s, stream_role role, std::size_t k) {
    stream_config c;
    c.name = str("stream", k);
    c.role = role;
    c.inputs = s.inputs[k];
    if (role == stream_role::indexer) {
      c.kv_heads = 1;
      c.channels = s.indexer_channels;
      c.rope = s.indexer_rope;
    } else if (role == stream_role::value) {
      c.kv_heads = s.kv_heads;
      c.channels = s.value_channels;
    } else {
      c.kv_heads = s.kv_heads;
      c.channels = s.key_channels;
      c.rope = s.key_rope;
    }
    return c;
  }

  static cache_config cache_config_of(const setup& s) {
    cache_config c;
    c.name = "cache";
    c.page_size = s.page_size;
    c.pages = s.pages;
    c.history = s.history;
    c.stream_storage.assign(N, storage_type::f32);
    if (s.narrow_stream < N) c.stream_storage[s.narrow_stream] = s.narrow;
    c.window.tokens = s.window_tokens;
    c.window.kv_heads = s.kv_heads;
    c.window.key_channels = s.key_channels;
    c.window.value_channels = tied ? 0 : s.value_channels;
    if (s.fp8_window) {
      c.window.precision = storage_type::fp8_e4m3_block;
      c.window.rope_channels = s.window_rope;
    }
    return c;
  }

  template <class F>
  static void for_each_stream(F&& f) {
    for_each_impl(f, std::make_index_sequence<N>{});
  }
  template <class F, std::size_t... K>
  static void for_each_impl(F& f, std::index_sequence<K...>) {
    (f(std::integral_constant<std::size_t, K>{}), ...);
  }

  // ---- the model ----

  i64 pages_for(i64 entries) const { return (entries + s_.page_size - 1) / s_.page_size; }

  sequence_model fresh_model() const {
    sequence_model m;
    m.input_ring.assign(sz(geom_.window + s_.history), -1);
    m.window_ring.assign(sz(window_rows_), -1);
    return m;
  }

  token_list random_tokens(i64 n, std::uint64_t seed, bool coarse) const {
    generator g(seed);
    token_list in;
    in.tokens = n;
    for (std::size_t k = 0; k < N; ++k) {
      in.payload[k] = g.fill(n * payload_floats_[k], -1.0f, 1.0f, coarse);
      in.logits[k] = g.fill(n * logit_floats_[k], -4.0f, 4.0f, coarse);
    }
    in.window_keys = g.fill(n * window_key_floats_, -1.0f, 1.0f);
    in.window_values = g.fill(n * window_value_floats_, -1.0f, 1.0f);
    return in;
  }

  typename cache_type::chunks chunks_of(const token_list& in) const {
    typename cache_type::chunks c;
    for (std::size_t k = 0; k < N; ++k) c[k] = token_chunk{in.tokens, in.payload[k], in.logits[k]};
    return c;
  }

  static void write_ring(std::vector<i64>& ring, i64 t0, i64 t_end) {
    const auto rows = static_cast<i64>(ring.size());
    if (rows == 0) return;
    for (i64 t = std::max(t0, t_end - rows); t < t_end; ++t) ring[sz(t % rows)] = t;
  }
  static bool ring_holds(const std::vector<i64>& ring, i64 first, i64 last) {
    const auto rows = static_cast<i64>(ring.size());
    for (i64 t = std::max<i64>(first, 0); t < last; ++t)
      if (rows == 0 || ring[sz(t % rows)] != t) return false;
    return true;
  }

  // The entries a brand-new state of the model's own compressor emits for all the sequence's
  // tokens in one chunk, stored and loaded back through the stream's storage type.
  void recompute(sequence_model& m) const {
    for_each_stream([&](auto k) {
      const auto& c = std::get<decltype(k)::value>(fresh_);
      const i64 n = geom_.completed_entries(m.inputs.tokens), floats = n * entry_floats_[k];
      std::vector<float>& values = m.expected[k];
      values.clear();
      values.reserve(sz(floats));
      stream_state& state = work_states_[k];
      state = blank_states_[k];  // a brand-new state, in storage kept from the last recomputation
      i64 emitted = 0;
      c.append(state, token_chunk{m.inputs.tokens, m.inputs.payload[k], m.inputs.logits[k]}, [&](const entry_view& e) {
        if (e.index != emitted++) fail(str("stream ", k, ": a fresh compressor emitted entry ", e.index, " out of order"));
        values.insert(values.end(), e.values, e.values + entry_floats_[k]);
      });
      if (emitted != n)
        fail(str("stream ", k, ": a fresh compressor emitted ", emitted, " entries for ", m.inputs.tokens,
                 " tokens, the geometry says ", n));
      m.stored[k].resize(sz(floats * bytes_per_element(storage_[k])));
      store_row(values.data(), m.stored[k].data(), floats, storage_[k]);
      load_row(m.stored[k].data(), values.data(), floats, storage_[k]);
    });
  }

  void model_append(sequence_model& m, const token_list& in) const {
    const i64 t0 = m.inputs.tokens, t_end = t0 + in.tokens;
    auto cat = [](std::vector<float>& to, const std::vector<float>& from) { to.insert(to.end(), from.begin(), from.end()); };
    for (std::size_t k = 0; k < N; ++k) {
      cat(m.inputs.payload[k], in.payload[k]);
      cat(m.inputs.logits[k], in.logits[k]);
    }
    cat(m.inputs.window_keys, in.window_keys);
    cat(m.inputs.window_values, in.window_values);
    if (s_.fp8_window && window_rows_ > 0) {  // the model keeps the values an FP8 window holds
      const fp8_head_layout keys = fp8_head_layout::of(s_.key_channels, s_.window_rope);
      const fp8_head_layout values = fp8_head_layout::of(s_.value_channels, 0);
      for (i64 t = t0; t < t_end; ++t)
        for (i64 h = 0; h < s_.kv_heads; ++h) {
          fp8_round_head(m.inputs.window_keys.data() + t * window_key_floats_ + h * s_.key_channels, keys);
          if (!tied) fp8_round_head(m.inputs.window_values.data() + t * window_value_floats_ + h * s_.value_channels, values);
        }
    }
    m.inputs.tokens = t_end;
    write_ring(m.input_ring, t0, t_end);
    write_ring(m.window_ring, t0, t_end);
    recompute(m);
  }

  void model_truncate(sequence_model& m, i64 p0) const {
    for (std::size_t k = 0; k < N; ++k) {
      m.inputs.payload[k].resize(sz(p0 * payload_floats_[k]));
      m.inputs.logits[k].resize(sz(p0 * logit_floats_[k]));
    }
    m.inputs.window_keys.resize(sz(p0 * window_key_floats_));
    m.inputs.window_values.resize(sz(p0 * window_value_floats_));
    m.inputs.tokens = p0;
    recompute(m);  // rows of the rings from p0 on are rewritten before they count again
  }

  // Whether the inputs a continuation from p0 needs are still in the rings.
  bool can_remove_suffix(const sequence_model& m, i64 p0) const {
    if (p0 < 0 || p0 > m.inputs.tokens) return false;
    if (p0 == m.inputs.tokens) return true;
    if (!ring_holds(m.input_ring, geom_.window_start(geom_.completed_entries(p0)), p0)) return false;
    return s_.window_tokens == 0 || ring_holds(m.window_ring, p0 - s_.window_tokens, p0);
  }

  // The oldest token whose window row is still intact.
  i64 window_first(const sequence_model& m) const {
    const i64 tokens = m.inputs.tokens;
    if (s_.window_tokens == 0) return tokens;
    i64 first = tokens;
    while (first > 0 && ring_holds(m.window_ring, first - 1, first)) --first;
    return first;
  }

  const float* window_key_row(const sequence_model& m, i64 t) const {
    return m.inputs.window_keys.data() + t * window_key_floats_;
  }
  const float* window_value_row(const sequence_model& m, i64 t) const {
    return tied ? window_key_row(m, t) : m.inputs.window_values.data() + t * window_value_floats_;
  }
  i64 value_row_floats() const { return tied ? window_key_floats_ : window_value_floats_; }

  // The cache's window row of token t as floats (an FP8 window's dequantized), in scratch that
  // the next call overwrites.
  const float* window_key_of(sequence_id id, i64 t) const {
    window_scratch_.resize(sz(window_key_floats_));
    cache_.copy_window_key(id, t, span<float>(window_scratch_.data(), window_scratch_.size()));
    return window_scratch_.data();
  }
  const float* window_value_of(sequence_id id, i64 t) const {
    window_value_scratch_.resize(sz(value_row_floats()));
    cache_.copy_window_value(id, t, span<float>(window_value_scratch_.data(), window_value_scratch_.size()));
    return window_value_scratch_.data();
  }

  // ---- picking sequences ----

  bool live(sequence_id id) const { return model_.count(id) != 0; }

  // A live sequence, or (for one byte value in 16, or when none is live) one the cache must not know.
  sequence_id pick(std::uint8_t b) const {
    if (model_.empty() || b % 16 == 13) {
      const int kind = b >> 4;
      if (!dead_.empty() && kind % 2 == 0) return dead_[sz(kind / 2) % dead_.size()];
      return kind % 3 == 0 ? -1 : kind % 3 == 1 ? 1000000 + b : std::numeric_limits<sequence_id>::min();
    }
    auto it = model_.begin();
    std::advance(it, b % model_.size());
    return it->first;
  }

  void bury(sequence_id id) {
    dead_.push_back(id);
    if (dead_.size() > 8) dead_.erase(dead_.begin());
  }

  void adopt_new_id(sequence_id id, sequence_model m) {
    if (live(id)) fail(str("a new sequence got the id ", id, " of a live one"));
    dead_.erase(std::remove(dead_.begin(), dead_.end(), id), dead_.end());
    model_.emplace(id, std::move(m));
  }

  // ---- the checks ----

  // Page-table references per page of each stream's pool, over the live sequences (valid until
  // the next call).
  const std::array<std::vector<std::int32_t>, N>& references() const {
    std::array<std::vector<std::int32_t>, N>& refs = references_;
    for (std::size_t k = 0; k < N; ++k) {
      refs[k].assign(sz(cache_.pool(k).capacity()), 0);
      for (const auto& [id, m] : model_)
        for (page_id p : cache_.page_table(id, k)) {
          if (p < 0 || p >= cache_.pool(k).capacity())
            fail(str("sequence ", id, " stream ", k, ": page table names page ", p, " outside the pool"));
          ++refs[k][sz(p)];
        }
    }
    return refs;
  }

  // `touched`: the sequence the last operation named, whose entries are also read back one by one
  // through read_entry (every sequence's pages are compared byte for byte).
  void check_all(sequence_id touched = no_sequence) const {
    if (cache_.sequences() != static_cast<i64>(model_.size()))
      fail(str("cache has ", cache_.sequences(), " sequences, the model ", model_.size()));
    for (sequence_id id : dead_)
      if (cache_.contains(id)) fail(str("dropped sequence ", id, " is still in the cache"));
    for (const auto& [id, m] : model_) check_sequence_basics(id, m);
    const auto& refs = references();
    for (std::size_t k = 0; k < N; ++k) {
      const page_pool& pool = cache_.pool(k);
      i64 distinct = 0;
      for (page_id p = 0; p < pool.capacity(); ++p) {
        const std::int32_t want = refs[k][sz(p)];
        distinct += want > 0 ? 1 : 0;
        if (pool.refcount(p) != want)
          fail(str("stream ", k, ": page ", p, " has reference count ", pool.refcount(p), " but ", want,
                   " page-table references"));
      }
      if (pool.used_pages() != distinct)
        fail(str("stream ", k, ": used_pages() = ", pool.used_pages(), " but ", distinct, " pages are referenced"));
    }
    for (const auto& [id, m] : model_) check_sequence_contents(id, m, refs, id == touched);
    check_view(static_cast<std::size_t>(op_ < 0 ? 0 : op_) % N);
  }

  void check_sequence_basics(sequence_id id, const sequence_model& m) const {
    if (!cache_.contains(id)) fail(str("live sequence ", id, " is missing from the cache"));
    const i64 tokens = m.inputs.tokens, n = geom_.completed_entries(tokens);
    if (cache_.tokens(id) != tokens) fail(str("sequence ", id, ": tokens() = ", cache_.tokens(id), ", model ", tokens));
    for (std::size_t k = 0; k < N; ++k) {
      const stream_state& st = cache_.state(id, k);
      if (cache_.entries(id, k) != n || st.entries() != n || st.tokens() != tokens)
        fail(str("sequence ", id, " stream ", k, ": entries() = ", cache_.entries(id, k), ", state ", st.tokens(),
                 " tokens / ", st.entries(), " entries; model ", tokens, " / ", n));
      if (static_cast<i64>(cache_.page_table(id, k).size()) != pages_for(n))
        fail(str("sequence ", id, " stream ", k, ": page table of ", cache_.page_table(id, k).size(), " pages for ", n,
                 " entries"));
    }
  }

  void check_sequence_contents(sequence_id id, const sequence_model& m,
                               const std::array<std::vector<std::int32_t>, N>& refs, bool read_back) const {
    const i64 tokens = m.inputs.tokens, n = geom_.completed_entries(tokens);
    for (std::size_t k = 0; k < N; ++k) {
      // The entries of each page, as stored, against the recomputation in the same format.
      const page_pool& pool = cache_.pool(k);
      const i64 entry_bytes = pool.layout().entry_stride_bytes;
      const auto& table = cache_.page_table(id, k);
      for (std::size_t i = 0; i < table.size(); ++i) {
        const i64 first = static_cast<i64>(i) * s_.page_size, count = std::min(s_.page_size, n - first);
        if (std::memcmp(pool.data(table[i]), m.stored[k].data() + first * entry_bytes, sz(count * entry_bytes)) != 0)
          fail(str("sequence ", id, " stream ", k, ": page ", table[i], " (entries ", first, "..", first + count - 1,
                   ") differs from a fresh one-chunk recomputation of its ", tokens, " tokens"));
      }
      if (!read_back) continue;
      entry_scratch_.resize(sz(entry_floats_[k]));
      for (i64 j = 0; j < n; ++j) {
        cache_.read_entry(id, k, j, entry_scratch_.data());
        if (!same_bits(entry_scratch_.data(), m.expected[k].data() + j * entry_floats_[k], entry_floats_[k]))
          fail(str("sequence ", id, " stream ", k, ": read_entry(", j, ") differs from a fresh one-chunk recomputation"
                   " of its ", tokens, " tokens"));
      }
    }
    const i64 first = window_first(m);
    if (cache_.window_first(id) != first)
      fail(str("sequence ", id, ": window_first() = ", cache_.window_first(id), ", model ", first));
    for (i64 t = first; t < tokens; ++t)
      if (!same_bits(window_key_of(id, t), window_key_row(m, t), window_key_floats_) ||
          !same_bits(window_value_of(id, t), window_value_row(m, t), value_row_floats()))
        fail(str("sequence ", id, ": the raw window row of token ", t, " differs from its input"));

    const sequence_memory mem = cache_.memory(id);
    i64 pages = 0, shared = 0, page_bytes = 0, entry_bytes = 0;
    for (std::size_t k = 0; k < N; ++k) {
      const auto& table = cache_.page_table(id, k);
      pages += static_cast<i64>(table.size());
      for (page_id p : table) shared += refs[k][sz(p)] > 1 ? 1 : 0;
      page_bytes += static_cast<i64>(table.size()) * cache_.pool(k).bytes_per_page();
      entry_bytes += n * cache_.pool(k).layout().entry_stride_bytes;
    }
    if (mem.tokens != tokens || mem.entries != static_cast<i64>(N) * n || mem.pages != pages ||
        mem.shared_pages != shared || mem.page_bytes != page_bytes || mem.entry_bytes != entry_bytes)
      fail(str("sequence ", id, ": memory() says tokens/entries/pages/shared/page bytes/entry bytes ", mem.tokens, "/",
               mem.entries, "/", mem.pages, "/", mem.shared_pages, "/", mem.page_bytes, "/", mem.entry_bytes,
               "; expected ", tokens, "/", static_cast<i64>(N) * n, "/", pages, "/", shared, "/", page_bytes, "/",
               entry_bytes));
  }

  // The CSR view of all live sequences names the same pages as their tables. One stream per
  // operation, in turn: a view is a pure function of the tables, and building one allocates.
  void check_view(std::size_t k) const {
    std::vector<sequence_id> batch;
    for (const auto& [id, m] : model_) batch.push_back(id);
    const paged_view v = cache_.view(span<const sequence_id>(batch.data(), batch.size()), k);
    if (v.base != cache_.pool(k).base() || v.indptr.size() != batch.size() + 1 || v.indptr[0] != 0 ||
        v.entries.size() != batch.size() || v.last_page_len.size() != batch.size())
      fail(str("stream ", k, ": malformed view"));
    for (std::size_t b = 0; b < batch.size(); ++b) {
      const auto& table = cache_.page_table(batch[b], k);
      const i64 n = geom_.completed_entries(model_.at(batch[b]).inputs.tokens);
      const i64 last = n == 0 ? 0 : (n - 1) % s_.page_size + 1;
      if (v.indptr[b + 1] - v.indptr[b] != static_cast<std::int32_t>(table.size()) ||
          !std::equal(table.begin(), table.end(), v.indices.begin() + v.indptr[b]) || v.entries[b] != n ||
          v.last_page_len[b] != last)
        fail(str("stream ", k, ": view row ", b, " (sequence ", batch[b], ") differs from its page table"));
    }
  }


  // ---- the strong guarantee ----

  // Everything observable about the cache. Filled in place, so that the vectors of a dump taken
  // before every call expected to fail keep their capacity from one call to the next.
  struct dump {
    struct sequence_dump {
      sequence_id id = 0;
      i64 tokens = 0, window_first = 0;
      std::array<std::vector<page_id>, N> tables;
      std::array<stream_state, N> states;
      std::array<std::vector<std::byte>, N> pages;  // the bytes of every page in the table
      std::vector<float> window;  // key rows, then value rows, of [window_first, tokens)
      std::array<i64, 8> memory{};
    };
    i64 sequences = 0;
    std::vector<sequence_dump> by_sequence;  // the live sequences in the model's (id) order
    std::array<i64, N> used{};
    std::array<std::vector<std::int32_t>, N> refcounts;
  };

  void take_dump(dump& d) const {
    d.sequences = cache_.sequences();
    d.by_sequence.resize(model_.size());
    auto s = d.by_sequence.begin();
    for (const auto& [id, m] : model_) {
      s->id = id;
      s->tokens = cache_.tokens(id);
      s->window_first = cache_.window_first(id);
      for (std::size_t k = 0; k < N; ++k) {
        s->tables[k] = cache_.page_table(id, k);
        s->states[k] = cache_.state(id, k);
        const page_pool& pool = cache_.pool(k);
        s->pages[k].clear();
        for (page_id p : s->tables[k])
          s->pages[k].insert(s->pages[k].end(), pool.data(p), pool.data(p) + pool.bytes_per_page());
      }
      s->window.clear();
      for (i64 t = s->window_first; t < s->tokens && window_rows_ > 0; ++t) {
        const float* key = window_key_of(id, t);
        s->window.insert(s->window.end(), key, key + window_key_floats_);
        const float* value = window_value_of(id, t);
        s->window.insert(s->window.end(), value, value + value_row_floats());
      }
      const sequence_memory mem = cache_.memory(id);
      s->memory = {mem.tokens, mem.entries, mem.pages, mem.shared_pages, mem.page_bytes, mem.entry_bytes,
                   mem.state_bytes, mem.uncompressed_bytes};
      ++s;
    }
    for (std::size_t k = 0; k < N; ++k) {
      d.used[k] = cache_.pool(k).used_pages();
      d.refcounts[k].resize(sz(cache_.pool(k).capacity()));
      for (page_id p = 0; p < cache_.pool(k).capacity(); ++p) d.refcounts[k][sz(p)] = cache_.pool(k).refcount(p);
    }
  }

  // The first difference between two dumps of the same live sequences, or "".
  static std::string difference(const dump& a, const dump& b) {
    if (a.sequences != b.sequences) return str("sequences() ", a.sequences, " became ", b.sequences);
    for (std::size_t k = 0; k < N; ++k) {
      if (a.used[k] != b.used[k]) return str("stream ", k, ": used_pages() ", a.used[k], " became ", b.used[k]);
      if (a.refcounts[k] != b.refcounts[k]) return str("stream ", k, ": a page's reference count changed");
    }
    for (std::size_t i = 0; i < a.by_sequence.size(); ++i) {
      const auto &x = a.by_sequence[i], &y = b.by_sequence[i];
      const sequence_id id = x.id;
      if (x.tokens != y.tokens || x.window_first != y.window_first)
        return str("sequence ", id, ": tokens/window_first ", x.tokens, "/", x.window_first, " became ", y.tokens, "/",
                   y.window_first);
      for (std::size_t k = 0; k < N; ++k) {
        if (x.tables[k] != y.tables[k]) return str("sequence ", id, " stream ", k, ": the page table changed");
        if (x.states[k] != y.states[k]) return str("sequence ", id, " stream ", k, ": the compressor state changed");
        if (x.pages[k] != y.pages[k]) return str("sequence ", id, " stream ", k, ": a page's contents changed");
      }
      if (!same_bits(x.window, y.window)) return str("sequence ", id, ": a raw window row changed");
      if (x.memory != y.memory) return str("sequence ", id, ": memory() changed");
    }
    return "";
  }

  // Runs a call that must throw Error and change nothing.
  template <class Error, class F>
  void expect_error(const char* error_name, F&& call) {
    take_dump(before_);
    try {
      call();
    } catch (const Error&) {
      take_dump(after_);
      const std::string changed = difference(before_, after_);
      if (!changed.empty()) fail(str("threw ", error_name, " but changed the cache: ", changed));
      return;
    } catch (const phasekv::error& e) {
      fail(str("threw the wrong error (expected ", error_name, "): ", e.what()));
    }
    fail(str("did not throw ", error_name));
  }

  // Runs a call that must succeed.
  template <class F>
  auto expect_success(F&& call) -> decltype(call()) {
    try {
      return call();
    } catch (const phasekv::error& e) {
      fail(str("threw unexpectedly: ", e.what()));
    }
  }

  // ---- operations ----

  void op_create() {
    begin_operation(op_, "create");
    if (model_.size() >= kMaxLive) return;
    const sequence_id id = expect_success([&] { return cache_.create(); });
    adopt_new_id(id, fresh_model());
    touched_ = id;
    count(created);
  }

  void op_append(byte_source& in, bool malformed) {
    const sequence_id id = touched_ = pick(in.next());
    i64 n = in.next() % 10;
    const std::uint8_t seed = in.next(), flags = in.next();
    begin_operation(op_, malformed ? "append (malformed)" : "append", id, n, seed, flags);
    append_options options;
    options.slot_weights = flags & 1;
    options.check_finite = flags & 2;
    if (live(id)) n = std::min(n, kMaxTokens - model_.at(id).inputs.tokens);
    const token_list tokens = random_tokens(n, (std::uint64_t{seed} << 8) ^ static_cast<std::uint64_t>(op_), flags & 4);
    auto chunks = chunks_of(tokens);
    span<const float> window_keys = tokens.window_keys, window_values = tokens.window_values;

    if (malformed) {
      // One thing wrong, chosen by the flags; each must be an input_error with nothing changed.
      std::vector<float> bigger;
      const std::size_t k = (flags >> 3) % N;
      switch ((flags >> 5) % 8) {
        case 0:  // the streams disagree on the token count
          if (N > 1) chunks[N - 1].tokens = n + 1;
          else chunks[0].tokens = -1;
          break;
        case 1:  // a payload one float too long
          bigger.assign(tokens.payload[k].begin(), tokens.payload[k].end());
          bigger.push_back(0.5f);
          chunks[k].payload = bigger;
          break;
        case 2:  // logits one float too long (an ungated stream takes none at all)
          bigger.assign(tokens.logits[k].begin(), tokens.logits[k].end());
          bigger.push_back(0.5f);
          chunks[k].logits = bigger;
          break;
        case 3:  // window keys one float too long (a cache without a window takes none)
          bigger.assign(tokens.window_keys.begin(), tokens.window_keys.end());
          bigger.push_back(0.5f);
          window_keys = bigger;
          break;
        case 4:  // window values one float too long (a tied window takes none)
          bigger.assign(tokens.window_values.begin(), tokens.window_values.end());
          bigger.push_back(0.5f);
          window_values = bigger;
          break;
        case 5:  // a negative token count
          for (auto& c : chunks) c = token_chunk{-1, {}, {}};
          window_keys = window_values = {};
          break;
        case 6:  // a NaN or an infinity with check_finite on (a chunk without payload: a short one)
          options.check_finite = true;
          if (!tokens.payload[k].empty()) {
            bigger.assign(tokens.payload[k].begin(), tokens.payload[k].end());
            bigger[seed % bigger.size()] = (seed & 1) ? std::numeric_limits<float>::quiet_NaN()
                                                      : -std::numeric_limits<float>::infinity();
          } else {
            bigger.assign(1, 0.0f);
          }
          chunks[k].payload = bigger;
          break;
        case 7:  // a null payload that claims a size
          chunks[k].payload = span<const float>(nullptr, std::max<std::size_t>(1, tokens.payload[k].size()));
          break;
      }
      expect_error<input_error>("input_error", [&] { cache_.append(id, chunks, window_keys, window_values, options); });
      count(append_malformed);
      return;
    }
    if (!live(id)) {
      expect_error<input_error>("input_error", [&] { cache_.append(id, chunks, window_keys, window_values, options); });
      count(unknown_sequence);
      return;
    }

    // Pages each stream needs: fresh ones past its table, plus a private copy of its last page
    // when that page is partial (about to be written) and another sequence holds it too.
    sequence_model& m = model_.at(id);
    const i64 before = geom_.completed_entries(m.inputs.tokens), after = geom_.completed_entries(m.inputs.tokens + n);
    const auto& refs = references();
    std::array<bool, N> copies{};
    std::array<std::vector<page_id>, N> tables;
    bool exceeds = false;
    for (std::size_t k = 0; k < N; ++k) {
      tables[k] = cache_.page_table(id, k);
      if (after == before) continue;
      copies[k] = before % s_.page_size != 0 && refs[k][sz(tables[k].back())] > 1;
      i64 used = 0;
      for (std::int32_t r : refs[k]) used += r > 0 ? 1 : 0;
      const i64 needed = pages_for(after) - static_cast<i64>(tables[k].size()) + (copies[k] ? 1 : 0);
      exceeds = exceeds || needed > cache_.pool(k).capacity() - used;
    }
    if (exceeds) {
      expect_error<capacity_error>("capacity_error",
                                   [&] { cache_.append(id, chunks, window_keys, window_values, options); });
      count(append_capacity_error);
      return;
    }
    const i64 emitted = expect_success([&] { return cache_.append(id, chunks, window_keys, window_values, options); });
    if (emitted != after - before) fail(str("append returned ", emitted, " entries, expected ", after - before));
    for (std::size_t k = 0; k < N; ++k) {
      const auto& now = cache_.page_table(id, k);
      for (std::size_t i = 0; i < tables[k].size() && i < now.size(); ++i) {
        const bool replaced = now[i] != tables[k][i];
        const bool should = copies[k] && i + 1 == tables[k].size();
        if (replaced != should)
          fail(str("stream ", k, ": page-table slot ", i, (should ? " was not copied on write" : " changed"),
                   " (page ", tables[k][i], " -> ", now[i], ")"));
      }
    }
    model_append(m, tokens);
    count(std::find(copies.begin(), copies.end(), true) != copies.end() ? appended_copy_on_write : appended);
  }

  void op_fork(byte_source& in) {
    const sequence_id parent = pick(in.next());
    begin_operation(op_, "fork", parent);
    if (!live(parent)) {
      expect_error<input_error>("input_error", [&] { cache_.fork(parent); });
      count(unknown_sequence);
      return;
    }
    if (model_.size() >= kMaxLive) return;
    const sequence_id child = expect_success([&] { return cache_.fork(parent); });
    for (std::size_t k = 0; k < N; ++k)
      if (cache_.page_table(child, k) != cache_.page_table(parent, k))
        fail(str("stream ", k, ": fork ", child, " does not share the pages of ", parent));
    adopt_new_id(child, model_.at(parent));
    touched_ = child;
    count(forked);
  }

  void op_copy(byte_source& in) {
    const sequence_id source = pick(in.next()), destination = touched_ = pick(in.next());
    begin_operation(op_, "copy", source, destination);
    if (source == destination || !live(source) || !live(destination)) {
      expect_error<input_error>("input_error", [&] { cache_.copy(source, destination); });
      count(unknown_sequence);
      return;
    }
    expect_success([&] { cache_.copy(source, destination); });
    for (std::size_t k = 0; k < N; ++k)
      if (cache_.page_table(destination, k) != cache_.page_table(source, k))
        fail(str("stream ", k, ": copy destination ", destination, " does not share the pages of ", source));
    model_.at(destination) = model_.at(source);
    count(copied);
  }

  void op_remove_suffix(byte_source& in) {
    const sequence_id id = touched_ = pick(in.next());
    const std::uint8_t mode = in.next(), amount = in.next();
    const i64 tokens = live(id) ? model_.at(id).inputs.tokens : 0;
    i64 p0;
    switch (mode % 8) {
      case 0: p0 = -1 - amount % 3; break;                   // before the start
      case 1: p0 = tokens + 1 + amount % 2; break;           // past the end
      case 2: p0 = amount % (tokens + 1); break;             // anywhere
      default:                                               // near the end, across the history limit
        p0 = std::max<i64>(0, tokens - amount % (geom_.window + s_.history + s_.window_tokens + 4));
    }
    begin_operation(op_, "remove_suffix", id, p0);
    if (!live(id) || !can_remove_suffix(model_.at(id), p0)) {
      expect_error<input_error>("input_error", [&] { cache_.remove_suffix(id, p0); });
      count(live(id) ? remove_suffix_refused : unknown_sequence);
      return;
    }
    std::array<std::vector<page_id>, N> tables;
    for (std::size_t k = 0; k < N; ++k) tables[k] = cache_.page_table(id, k);
    expect_success([&] { cache_.remove_suffix(id, p0); });
    const auto kept = sz(pages_for(geom_.completed_entries(p0)));
    for (std::size_t k = 0; k < N; ++k) {
      const auto& now = cache_.page_table(id, k);
      if (now.size() != kept || !std::equal(now.begin(), now.end(), tables[k].begin()))
        fail(str("stream ", k, ": the page table after remove_suffix is not the first ", kept, " pages of the old one"));
    }
    model_truncate(model_.at(id), p0);
    count(removed_suffix);
  }

  void op_free(byte_source& in) {
    const sequence_id id = pick(in.next());
    begin_operation(op_, "free", id);
    if (!live(id)) {
      expect_error<input_error>("input_error", [&] { cache_.free(id); });
      count(unknown_sequence);
      return;
    }
    expect_success([&] { cache_.free(id); });
    model_.erase(id);
    bury(id);
    count(freed);
  }

  void op_keep(byte_source& in) {
    const sequence_id id = touched_ = pick(in.next());
    begin_operation(op_, "keep", id);
    if (!live(id)) {
      expect_error<input_error>("input_error", [&] { cache_.keep(id); });
      count(unknown_sequence);
      return;
    }
    expect_success([&] { cache_.keep(id); });
    for (auto it = model_.begin(); it != model_.end();) {
      if (it->first == id) {
        ++it;
        continue;
      }
      bury(it->first);
      it = model_.erase(it);
    }
    count(kept);
  }

  void op_clear() {
    begin_operation(op_, "clear");
    expect_success([&] { cache_.clear(); });
    for (const auto& [id, m] : model_) bury(id);
    model_.clear();
    count(cleared);
  }

  // ---- reads ----

  void op_read(byte_source& in) {
    const sequence_id id = touched_ = pick(in.next());
    const std::uint8_t where = in.next(), flags = in.next(), seed = in.next();
    reader_config rc;
    rc.query_heads = s_.query_heads;
    rc.key_stream = Combo::key_stream;
    rc.value_stream = Combo::value_stream;
    if constexpr (has_indexer) {
      if (flags % 4 != 0) {
        rc.indexer_stream = Combo::indexer_stream;
        rc.top_k = 1 + (flags >> 2) % 6;
        rc.indexer_heads = s_.indexer_heads;
        if ((flags & 0x80) && storage_[Combo::indexer_stream] == storage_type::bf16)
          rc.precision = indexer_precision::bf16;
      }
    }
    rc.sink = flags & 0x20;
    // De-rotation only for tied K/V whose stream has RoPE (every tied combination here does).
    rc.derotate_output = tied && (flags & 0x40);
    const bool want_trace = rc.top_k > 0 || (flags & 0x10);

    generator g((std::uint64_t{seed} << 8) ^ static_cast<std::uint64_t>(op_) ^ 0xABCDEFull);
    const std::vector<float> queries = g.fill(s_.query_heads * s_.key_channels, -1.0f, 1.0f, flags & 0x10);
    std::vector<float> indexer_queries, indexer_weights, sinks;
    if (rc.top_k > 0) {
      indexer_queries = g.fill(s_.indexer_heads * s_.indexer_channels, -1.0f, 1.0f, flags & 0x10);
      indexer_weights = g.fill(s_.indexer_heads, -0.5f, 1.0f, flags & 0x10);
    }
    if (rc.sink) sinks = g.fill(s_.query_heads, -2.0f, 2.0f);

    // A position the cache can serve, or (where ≥ 224) one it must refuse.
    const i64 tokens = live(id) ? model_.at(id).inputs.tokens : 0;
    const i64 kept = live(id) ? window_first(model_.at(id)) : 0;
    const i64 lowest = s_.window_tokens > 0 && kept > 0 ? kept + s_.window_tokens - 1 : 0;
    begin_operation(op_, "read", id, where, flags, seed);
    bool valid = live(id) && tokens > 0 && where < 224;
    i64 t = 0;
    if (valid) {
      if (lowest >= tokens) fail(str("no position of sequence ", id, " can be read (window kept from ", kept, ")"));
      t = lowest + where % (tokens - lowest);
    } else {
      t = where % 3 == 0 ? tokens : where % 3 == 1 ? -1 : lowest - 1;
      if (t < 0 && where % 3 == 2) t = tokens;
    }
    g_context.args[1] = t;  // the position, in place of the byte it came from

    // One reader per configuration, kept for the whole run: hosts reuse readers across reads and
    // sequences, so its scratch must carry nothing from one read to the next.
    std::optional<reader_type>& kept_reader = readers_[flags % 4 == 0 || !has_indexer ? 0 : 1 + (flags >> 2) % 6]
                                                      [(flags >> 5) & 7];
    if (!kept_reader) kept_reader.emplace(cache_, rc);
    reader_type& reader = *kept_reader;
    read_request rq;
    rq.position = t;
    rq.queries = queries;
    rq.indexer_queries = indexer_queries;
    rq.indexer_weights = indexer_weights;
    rq.sinks = sinks;
    std::vector<float> out(sz(reader.output_floats()));
    read_trace trace;
    if (!valid) {
      expect_error<input_error>("input_error", [&] { reader.read(cache_, id, rq, out.data(), want_trace ? &trace : nullptr); });
      count(live(id) ? read_refused : unknown_sequence);
      return;
    }
    expect_success([&] { reader.read(cache_, id, rq, out.data(), want_trace ? &trace : nullptr); });
    check_read(model_.at(id), rc, rq, out, want_trace ? &trace : nullptr);
    count(rc.top_k > 0 ? read_top_k : read_plain);
  }

  static std::vector<float> row(const float* p, i64 n) { return std::vector<float>(p, p + n); }
  static double max_abs(const std::vector<std::vector<float>>& rows) {
    double m = 0.0;
    for (const auto& r : rows)
      for (float x : r) m = std::max(m, std::abs(static_cast<double>(x)));
    return m;
  }

  // The read against the double oracle over the model's entries and window rows.
  void check_read(const sequence_model& m, const reader_config& rc, const read_request& rq,
                  const std::vector<float>& out, const read_trace* trace) const {
    const i64 t = rq.position, candidates = geom_.visible_entries(t);
    std::vector<i64> chosen;
    if (rc.top_k > 0) {
      check_selection(m, rc, rq, *trace, candidates);
      chosen = trace->selected;
    } else {
      for (i64 j = 0; j < candidates; ++j) chosen.push_back(j);
      if (trace && trace->selected != chosen) fail("without top-k the trace must select every candidate in order");
    }

    const i64 H = s_.kv_heads, ck = s_.key_channels, cv = tied ? s_.key_channels : s_.value_channels;
    std::vector<std::vector<float>> entry_keys, entry_values, window_keys, window_values;
    for (i64 j : chosen) {
      entry_keys.push_back(row(m.expected[Combo::key_stream].data() + j * H * ck, H * ck));
      entry_values.push_back(row(m.expected[Combo::value_stream].data() + j * H * cv, H * cv));
    }
    const i64 w_first = s_.window_tokens > 0 ? std::max<i64>(0, t - s_.window_tokens + 1) : t + 1;
    for (i64 p = w_first; p <= t; ++p) {
      window_keys.push_back(row(window_key_row(m, p), H * ck));
      window_values.push_back(row(window_value_row(m, p), H * cv));
    }
    const phasekv_test::attention_shape shape{s_.query_heads, H, ck, cv};
    const std::vector<float> sinks(rq.sinks.begin(), rq.sinks.end());
    const std::vector<float> queries(rq.queries.begin(), rq.queries.end());
    const phasekv_test::sparse_read_result want =
        phasekv_test::sparse_read(shape, queries, 1.0 / std::sqrt(static_cast<double>(ck)), entry_keys, entry_values,
                                  window_keys, window_values, sinks);
    std::vector<double> expected = want.output;
    if (rc.derotate_output) {
      const rope_config& rope = std::get<Combo::key_stream>(fresh_).config().rope;
      phasekv_test::derotate_heads(expected, s_.query_heads, cv, rope, t);
    }

    // |got − want| ≤ tolerance · max(|want|, value scale): outputs are (sub-)convex combinations
    // of the values, so their largest magnitude bounds them (as in tests/test_read.cpp).
    const double scale = std::max({max_abs(entry_values), max_abs(window_values), 1e-30});
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const double got = out[i], err = std::abs(got - expected[i]) / std::max(std::abs(expected[i]), scale);
      if (!std::isfinite(got) || !(err <= kReadTolerance))
        fail(str("read at ", t, ": output element ", i, " is ", got, ", the oracle says ", expected[i],
                 " (relative error ", err, ", value scale ", scale, ")"));
    }

    if (!trace) return;
    if (trace->candidates != candidates || trace->window_first != w_first)
      fail(str("trace: candidates/window_first ", trace->candidates, "/", trace->window_first, ", expected ",
               candidates, "/", w_first));
    auto close = [](double a, double b) { return std::abs(a - b) <= kReadTolerance; };
    if (trace->entry_mass.size() != want.entry_mass.size() ||
        trace->window_token_mass.size() != want.window_token_mass.size())
      fail("trace: wrong number of masses");
    for (std::size_t i = 0; i < want.entry_mass.size(); ++i)
      if (!close(trace->entry_mass[i], want.entry_mass[i]))
        fail(str("trace: entry mass ", i, " is ", trace->entry_mass[i], ", the oracle says ", want.entry_mass[i]));
    for (std::size_t i = 0; i < want.window_token_mass.size(); ++i)
      if (!close(trace->window_token_mass[i], want.window_token_mass[i]))
        fail(str("trace: window token mass ", i, " is ", trace->window_token_mass[i], ", the oracle says ",
                 want.window_token_mass[i]));
    if (!close(trace->window_mass, want.window_mass) || !close(trace->sink_mass, want.sink_mass))
      fail(str("trace: window/sink mass ", trace->window_mass, "/", trace->sink_mass, ", the oracle says ",
               want.window_mass, "/", want.sink_mass));
  }

  // The scores are fp32 dot products, so ranks may differ from the double ranking where two
  // scores are within rounding: the selection must be a top-k of the oracle scores up to that
  // tolerance, in rank order, equal scores by the lower index.
  void check_selection(const sequence_model& m, const reader_config& rc, const read_request& rq,
                       const read_trace& trace, i64 candidates) const {
    const i64 ci = s_.indexer_channels;
    std::vector<float> iq(rq.indexer_queries.begin(), rq.indexer_queries.end());
    const std::vector<float> iw(rq.indexer_weights.begin(), rq.indexer_weights.end());
    if (rc.precision == indexer_precision::bf16)  // the queries are rounded to bf16 to meet bf16 keys
      for (float& q : iq) q = bf16_to_float(float_to_bf16(q));
    std::vector<std::vector<float>> keys;
    double score_scale = 0.0;
    for (i64 j = 0; j < candidates; ++j) {
      keys.push_back(row(m.expected[Combo::indexer_stream].data() + j * ci, ci));
      double a = 0.0;
      for (i64 h = 0; h < s_.indexer_heads; ++h)
        for (i64 c = 0; c < ci; ++c) a += std::abs(static_cast<double>(iw[sz(h)]) * iq[sz(h * ci + c)] * keys.back()[sz(c)]);
      score_scale = std::max(score_scale, a);
    }
    const std::vector<double> scores = phasekv_test::indexer_scores(iq, iw, keys, ci);
    const double tol = 1e-5 * std::max(score_scale, 1.0);
    const i64 keep = std::min(rc.top_k, candidates);
    if (static_cast<i64>(trace.selected.size()) != keep || trace.scores.size() != trace.selected.size())
      fail(str("top-", rc.top_k, " of ", candidates, " candidates selected ", trace.selected.size(), " entries"));
    std::vector<bool> taken(sz(candidates), false);
    double lowest = std::numeric_limits<double>::infinity();
    for (std::size_t r = 0; r < trace.selected.size(); ++r) {
      const i64 j = trace.selected[r];
      if (j < 0 || j >= candidates || taken[sz(j)]) fail(str("top-k selected entry ", j, " twice or out of range"));
      taken[sz(j)] = true;
      if (!(std::abs(trace.scores[r] - scores[sz(j)]) <= tol))
        fail(str("indexer score of entry ", j, " is ", trace.scores[r], ", the oracle says ", scores[sz(j)]));
      if (r > 0 && (trace.scores[r] > trace.scores[r - 1] ||
                    (trace.scores[r] == trace.scores[r - 1] && j < trace.selected[r - 1])))
        fail(str("top-k: rank ", r, " (entry ", j, ") is out of rank order"));
      lowest = std::min(lowest, scores[sz(j)]);
    }
    for (i64 j = 0; j < candidates; ++j)
      if (!taken[sz(j)] && scores[sz(j)] > lowest + tol)
        fail(str("top-k left out entry ", j, " (score ", scores[sz(j)], ") that beats a selected one (", lowest, ")"));
  }

  setup s_;
  geometry geom_;
  streams fresh_;  // the model's own compressors, equal to the cache's
  cache_type cache_;
  std::array<i64, N> payload_floats_{}, logit_floats_{}, entry_floats_{};
  std::array<storage_type, N> storage_{};
  i64 window_key_floats_ = 0, window_value_floats_ = 0, window_rows_ = 0;
  std::map<sequence_id, sequence_model> model_;
  std::vector<sequence_id> dead_;  // recently dropped ids, which must stay unknown
  int op_ = 0;
  sequence_id touched_ = no_sequence;  // the sequence the running operation named
  mutable std::vector<float> entry_scratch_;
  mutable std::vector<float> window_scratch_, window_value_scratch_;
  std::array<stream_state, N> blank_states_;                  // make_state() of the model's compressors
  mutable std::array<stream_state, N> work_states_;
  mutable std::array<std::vector<std::int32_t>, N> references_;
  dump before_, after_;  // around calls that must fail
  std::array<std::array<std::optional<reader_type>, 8>, 7> readers_;  // [top_k choice][sink, derotate, precision]
};

}  // namespace

// ASan's defaults for this target (ASAN_OPTIONS still overrides them). One execution frees far
// less than 16 MiB, so a 16 MiB quarantine still holds every freed block of several executions —
// enough to catch a use after free — while the default 256 MiB keeps handing out fresh pages,
// which the kernel must fault in: that was a fifth of the run time.
extern "C" const char* __asan_default_options() { return "quarantine_size_mb=16"; }

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  byte_source in(data, size);
  const setup s = decode_setup(in);
  g_context = context{};
  g_context.describe_setup = describe_setup;
  g_context.setup = &s;
  g_combination = s.combination;
  std::fill(std::begin(input_outcomes), std::end(input_outcomes), 0);
  switch (s.combination) {
    case 0: harness<separate_kv>(s).run(in); break;
    case 1: harness<tied_kv_indexer>(s).run(in); break;
    default: harness<kv_indexer>(s).run(in); break;
  }
  print_input_outcomes();
  g_context = context{};
  return 0;
}
