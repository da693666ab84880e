#pragma once
// The conformance kit: one call checks a layer configuration — geometry, streams, policies (built in
// or your own) and their parameters, cache and reader — against the properties phasekv promises,
// and reports the first that fails with a minimal counterexample.
//
//   using csa = stream_compressor<presets::deepseek_v4_csa_policy>;
//   testing::layer_under_test<csa, csa> layer(layer_compressor<csa, csa>(csa(g, kv, kv_params), csa(g, ix)),
//                                             cache_config, reader_config);
//   testing::report r = testing::check(layer);          // or check_stream<Policy>(g, config, params)
//   if (!r.passed()) std::puts(r.to_string().c_str());   // the property, the counterexample, the difference
//
// Properties (report.hpp), in order:
//   streaming       a sequence appended in any chunking (1-token steps, block-sized, straddling
//                   boundaries, payload or logits as bf16 bits) — and several sequences appended
//                   together through append_batch, each in its own chunking — has the entries
//                   (their stored bytes), window rows and reads of one prefill of the same tokens,
//                   bit for bit, after every chunk read
//   round_trips     fork, copy, remove_suffix, keep and snapshot → restore (into another cache or the
//                   same) between chunks, each writing junk where the sequence must not see it,
//                   leave every later append and read bit-identical to never having done them
//   origin_padding  the sequence behind p tokens of padding, with the origin moved by p
//                   (docs/DESIGN.md §2: staggered origins shift phases and nothing else), gives the
//                   same entries — index shifted by the blocks the padding fills — bit for bit in the
//                   channels no RoPE turns, and the same up to the turn by p in those it does (within
//                   tolerance; bit for bit also where RMSNorm follows RoPE before pooling is not the
//                   case). Entries whose windows reach before token 0 are the oracle's to check.
//                   Skipped for a pooling of yours that reads absolute positions.
//   entries         every entry (and its slot weights) against a double-precision oracle
//                   (oracle.hpp): built in for mean, fixed-weight and gated pooling with RMSNorm and
//                   RoPE before or after pooling; yours for a pooling of yours (oracles[k])
//   reads           reads against double-precision attention over the entries the reader selected
//                   and the window tokens, sink and de-rotation included; the selection against the
//                   double indexer scores (up to near-ties; not for the FP4 indexer); candidates =
//                   the entries visible at the position
//   dense_control   the same shape at S = W = 1, mean pooling, no selection, no window: plain causal
//                   attention in double
//   storage         every stored entry and window row within its storage type's documented error
//                   of the fp32 value the write path made (oracle.hpp lists the bounds)
//
// Cases are generated from options::seed — the same seed gives the same cases, failures and
// counterexamples on every run. effort::quick (the default) is sized for a test suite: a few
// cases per property, sequences of a few hundred tokens, under a second for a DeepSeek-V4
// layer (optimised build); effort::thorough runs twenty times the cases on sequences four times as
// long (half a minute for it), and
// options::from_environment() picks it when PHASEKV_CONFORMANCE=thorough (PHASEKV_CONFORMANCE_SEED=N
// sets the seed): phasekv's own tests and the Catch2/GoogleTest adapters read it.
//
// Each property's result says what its cases exercised (coverage in report.hpp): reads, and how
// many of them selected fewer entries than were visible; how often the raw window's ring wrapped;
// forks that shared pages and the copy-on-write of a shared page. With a selecting reader the
// first case of streaming, round trips and reads (every 20th when thorough) is long enough for the
// selection to drop entries (2,048+ tokens for DeepSeek-V4's CSA: top_k = 512 at S = 4); when no
// case is (top_k beyond 2^16 tokens), the property's note flags the selection as not exercised.
//
// The kit gives the cache its own pools (pages enough for its cases, no host memory or shared
// pools). Streaming and round trips run under your history (at least the junk they roll back), so
// the raw window's ring wraps as it does in your engine; references, and the properties that read
// earlier positions, get a history long enough to read any of them. Page size, storage types and
// the raw window are yours. A configuration that cannot be built throws the
// config_error the cache or reader throws, naming the field; a case that throws is a failure of its
// property, reported with the exception's message.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/random.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/read/sparse_reader.hpp"
#include "phasekv/testing/oracle.hpp"
#include "phasekv/testing/report.hpp"
#include "phasekv/testing/scenario.hpp"
#include "phasekv/testing/model_subject.hpp"
#include "phasekv/testing/subject.hpp"

namespace phasekv::testing {

enum class effort {
  quick,     // a test suite's: seconds
  thorough,  // a long run: minutes
};

struct tolerances {
  double entries = 1e-5;       // relative, against the sizes of the terms summed (oracle.hpp)
  double slot_weights = 1e-5;  // absolute
  double reads = 1e-4;         // relative to the largest |value| a head attends to; lse: (1 + |lse|)
  double rope_turn = 1e-5;     // origin_padding's turned channels, relative to the head's largest |value|
};

struct options {
  std::uint64_t seed = 1;
  testing::effort effort = effort::quick;
  std::int64_t cases = 0;        // per property; 0: 6 (quick), 120 (thorough)
  // Longest sequence; 0: max(W + 4S + 8, min(two pages of entries, 384)) tokens, ×4 when thorough.
  // Inputs for six sequences of it are drawn up front (12 KiB a token for DeepSeek-V4 CSA).
  std::int64_t max_tokens = 0;
  std::int64_t shrink_runs = 0;  // candidates the shrinker may run; 0: 200 (quick), 3000 (thorough)
  // Every operation through the model front door (model_subject.hpp: the layer as the one layer of
  // a model_cache), for a layer without a subject of its own.
  bool front_door = false;
  tolerances tolerance;

  void validate() const {
    using phasekv::detail::require;
    require(cases >= 0 && cases <= 1000000, "options.cases", cases, "must lie in [0, 10^6] (0: the effort's)");
    require(max_tokens >= 0 && max_tokens <= (std::int64_t{1} << 16), "options.max_tokens", max_tokens,
            "must lie in [0, 2^16] (0: the effort's)");
    require(shrink_runs >= 0, "options.shrink_runs", shrink_runs, "must be non-negative (0: the effort's)");
    require(effort == effort::quick || effort == effort::thorough, "options.effort", static_cast<int>(effort),
            "is not an effort");
    for (auto [name, value] : {std::pair<const char*, double>{"entries", tolerance.entries},
                               {"slot_weights", tolerance.slot_weights},
                               {"reads", tolerance.reads},
                               {"rope_turn", tolerance.rope_turn}})
      require(std::isfinite(value) && value >= 0.0, std::string("options.tolerance.") + name, value,
              "must be finite and non-negative");
  }

  // `base` with the environment's choices: PHASEKV_CONFORMANCE = quick | thorough (or long) and
  // PHASEKV_CONFORMANCE_SEED = a decimal seed. A value it cannot read is a config_error naming it.
  static options from_environment() { return from_environment(options()); }
  static options from_environment(options base) {
    if (const char* e = std::getenv("PHASEKV_CONFORMANCE")) {
      const std::string v = e;
      if (v == "thorough" || v == "long") base.effort = effort::thorough;
      else if (v == "quick" || v.empty()) base.effort = effort::quick;
      else phasekv::detail::fail("PHASEKV_CONFORMANCE", v, "must be quick, thorough or long");
    }
    if (const char* e = std::getenv("PHASEKV_CONFORMANCE_SEED")) {
      const std::string v = e;
      if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
        phasekv::detail::fail("PHASEKV_CONFORMANCE_SEED", v, "must be a decimal integer below 10^19");
      base.seed = std::stoull(v);
    }
    return base;
  }
};

// The layer a check runs: its compressors (geometry, streams, policies with their parameters and
// pooling instances), its cache and its reader, and what only you know.
template <class... Compressors>
struct layer_under_test {
  using layer = layer_compressor<Compressors...>;
  using cache_type = paged_cache<Compressors...>;
  using subject_type = cache_subject<cache_type>;
  using subject_factory = std::function<std::unique_ptr<subject_type>(const layer&, const cache_config&)>;
  static constexpr std::size_t stream_count = sizeof...(Compressors);

  layer compressors;
  cache_config cache;
  reader_config reader;
  // Per stream, the double-precision oracle of a pooling of yours (oracle.hpp); empty for the
  // built-ins, whose oracles are the kit's. A stream of yours without one is not checked against
  // an oracle (the report says so).
  std::array<pooling_oracle, stream_count> oracles{};
  // Whether your poolings ignore absolute token positions (window_rows::first_position): only then
  // does padding shift nothing but phases. The built-ins do.
  bool position_free_pooling = true;
  // Your cache integration (subject.hpp); null: phasekv's paged_cache as it is.
  subject_factory subject;

  layer_under_test(layer compressors_, cache_config cache_, reader_config reader_)
      : compressors(std::move(compressors_)), cache(std::move(cache_)), reader(std::move(reader_)) {}
};

namespace kit_detail {

template <class Compressor>
struct compressor_traits {
  using policy = typename Compressor::policy;
  using pooling = typename policy::pooling;
  static constexpr bool builtin = oracle_detail::is_builtin_v<pooling>;
  static constexpr bool rope_before = std::is_same_v<typename policy::rope, rope_before_pool>;
  static constexpr bool rope_after = std::is_same_v<typename policy::rope, rope_after_pool>;
  static constexpr bool norm = std::is_same_v<typename policy::norm, rms_norm>;
  static std::string pooling_name() {
    if constexpr (std::is_same_v<pooling, mean_pool>) return "mean";
    else if constexpr (std::is_same_v<pooling, fixed_weight_pool>) return "fixed weights";
    else if constexpr (std::is_same_v<pooling, gated_pool<gate_width::vector>>) return "vector gates";
    else if constexpr (std::is_same_v<pooling, gated_pool<gate_width::scalar>>) return "scalar gates";
    else return std::string("'") + pooling::name + "'";
  }
};

// A float's value and bits, for messages: "0.123456789 (0x3dfcd6e9)".
inline std::string float_text(float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", bits);
  phasekv::detail::classic_stream out;
  out.precision(9);
  out << v << " (0x" << hex << ")";
  return out.str();
}

template <class... Compressors>
class conformance_run {
  using spec_type = layer_under_test<Compressors...>;
  using layer = typename spec_type::layer;
  using cache_type = typename spec_type::cache_type;
  using subject_type = typename spec_type::subject_type;
  using chunks = typename cache_type::chunks;
  using append_item = typename cache_type::append_item;
  static constexpr std::size_t N = sizeof...(Compressors);
  using result = std::optional<std::string>;

 public:
  conformance_run(const spec_type& spec, const options& o) : spec_(spec), opt_(o), geom_(spec.compressors.geom()) {
    opt_.validate();
    const bool thorough = opt_.effort == effort::thorough;
    if (opt_.cases == 0) opt_.cases = thorough ? 120 : 6;
    if (opt_.shrink_runs == 0) opt_.shrink_runs = thorough ? 3000 : 200;
    const std::int64_t S = geom_.stride, W = geom_.window;
    if (opt_.max_tokens == 0) {
      const std::int64_t base = W + 4 * S + 8;
      const std::int64_t two_pages = 2 * std::max<std::int64_t>(1, spec.cache.page_size) * S + W;
      opt_.max_tokens = std::max(base, std::min<std::int64_t>(two_pages, 384)) * (thorough ? 4 : 1);
    }
    max_junk_ = W + S;
    max_pad_ = 2 * S + W;
    track_rows_ = opt_.max_tokens + std::max(max_junk_, max_pad_) + 1;
    // A selecting reader drops entries only past top_k visible ones, which the sizes above may
    // never reach (a DeepSeek-V4 CSA layer selects 512 of S = 4 entries: 2,048 tokens): then the
    // first case of streaming, round trips and reads (and every 20th when thorough) is that long.
    if (spec.reader.top_k > 0) {
      const std::int64_t needed = tokens_past_top_k(spec.reader.top_k);
      if (needed > opt_.max_tokens / 2 && needed <= max_selecting_tokens) selecting_tokens_ = needed;
    }
    track0_rows_ = std::max(track_rows_, selecting_tokens_ + std::max(max_junk_, max_pad_) + 1);

    for_each_stream([&](auto k, const auto& c) {
      payload_[k] = c.payload_floats_per_token();
      logits_[k] = c.logit_floats_per_token();
    });
    const raw_window_config& w = spec.cache.window;
    window_key_floats_ = w.tokens > 0 ? w.kv_heads * w.key_channels : 0;
    window_value_floats_ = w.tokens > 0 && w.value_channels > 0 ? w.kv_heads * w.value_channels : 0;

    // The kit's caches: your config with its own pools. References, and the properties that read
    // earlier positions, get history for every read and rollback (a longer one for the selecting
    // cases); streaming and round trips run under your history (at least the junk they roll back),
    // so that the raw window's ring wraps as it does for you.
    kit_cache_ = spec.cache;
    kit_cache_.memory = nullptr;
    kit_cache_.shared_pools.clear();
    const std::int64_t entries_per_sequence = (track0_rows_ + max_pad_) / S + 2;
    const std::int64_t page = std::max<std::int64_t>(1, spec.cache.page_size);
    kit_cache_.pages = std::max(kit_cache_.pages, 16 * ((entries_per_sequence + page - 1) / page + 1) + 16);
    host_history_cache_ = kit_cache_;
    host_history_cache_.history = std::max(kit_cache_.history, max_junk_);
    selecting_cache_ = kit_cache_;
    selecting_cache_.history = std::max(kit_cache_.history, track0_rows_ + max_pad_);
    kit_cache_.history = std::max(kit_cache_.history, track_rows_ + max_pad_);

    // Building them checks the configuration (config_error naming the field) before any case.
    auto probe = make_subject(kit_cache_);
    shape_ = probe->shape();
    reader_.emplace(shape_, spec.reader);
    fill_bank();
  }

  report all() {
    report r;
    r.configuration = describe_configuration();
    for (property p : all_properties) {
      property_result pr;
      pr.property = p;
      if (std::string why = skip_reason(p); !why.empty()) {
        pr.outcome = outcome::skipped;
        pr.note = why;
        r.properties.push_back(pr);
        continue;
      }
      pr.note = note(p);
      pr.outcome = outcome::passed;
      cov_ = coverage{};
      cov_.top_k = selection_checked(p) ? reader_->config().top_k : 0;
      for (std::int64_t i = 0; i < opt_.cases; ++i) {
        std::uint64_t rng = mix64(opt_.seed, static_cast<std::uint64_t>(p) * 1000003u + static_cast<std::uint64_t>(i));
        const scenario sc = generate(p, rng, selecting_case(p, i));
        pr.cases = i + 1;
        result f = run_guarded(p, sc);
        pr.exercised = cov_;
        if (f) {
          pr.outcome = outcome::failed;
          failure fl;
          fl.property = p;
          fl.original = sc;
          fl.original_message = *f;
          fl.seed = opt_.seed;
          fl.case_index = i;
          shrunk s = shrink(sc, *f, [&](const scenario& c) { return run_guarded(p, c); }, opt_.shrink_runs);
          fl.counterexample = std::move(s.smallest);
          fl.message = std::move(s.failure);
          fl.shrink_runs = s.runs;
          r.failure = std::move(fl);
          break;
        }
      }
      if (pr.outcome == outcome::passed && pr.exercised.selection_unexercised())
        pr.note += (pr.note.empty() ? "" : "; ") + selection_flag();
      r.properties.push_back(pr);
      if (r.failure) break;
    }
    return r;
  }

  // One scenario of one property, as a check runs it (for tests of the kit itself).
  result run_guarded(property p, const scenario& sc) {
    try {
      switch (p) {
        case property::streaming: return run_streaming(sc);
        case property::round_trips: return run_round_trips(sc);
        case property::origin_padding: return run_origin_padding(sc);
        case property::entries: return run_entries(sc);
        case property::reads: return run_reads(sc);
        case property::dense_control: return run_dense_control(sc);
        case property::storage: return run_storage(sc);
      }
      return std::string("unknown property");
    } catch (const std::exception& e) {
      return std::string("threw: ") + e.what();
    }
  }

  // A case of property p; `selecting`: one long enough for the reader's selection to drop entries.
  scenario generate(property p, std::uint64_t& rng, bool selecting = false) const {
    scenario s;
    if (selecting) {
      add_sequence(s, rng, selecting_tokens_ + below(rng, static_cast<std::uint64_t>(geom_.stride)));
      const std::int64_t n = s.tokens(0);
      if (p == property::reads) {
        s.reads = {n - 1 - geom_.stride - below(rng, static_cast<std::uint64_t>(geom_.stride)), n - 1};
      } else if (p == property::round_trips) {
        add_steps(s, rng, n);
      }
      return s;
    }
    switch (p) {
      case property::streaming: {
        const std::int64_t sequences = below(rng, 2) == 0 ? 1 : 2 + below(rng, 3);
        for (std::int64_t b = 0; b < sequences; ++b) add_sequence(s, rng, tokens(rng, 1));
        break;
      }
      case property::round_trips: {
        const std::int64_t n = tokens(rng, 1);
        add_sequence(s, rng, n);
        add_steps(s, rng, n);
        break;
      }
      case property::origin_padding: {
        add_sequence(s, rng, tokens(rng, geom_.window + geom_.stride));
        s.pad = 1 + below(rng, max_pad_);
        if (has_rope_table()) s.pad = geom_.stride * (1 + below(rng, 2));  // anchors stay inside a table
        break;
      }
      case property::entries:
      case property::storage:
        add_sequence(s, rng, tokens(rng, 1));
        break;
      case property::reads:
      case property::dense_control: {
        const std::int64_t n = p == property::dense_control ? 1 + below(rng, 48) : tokens(rng, 1);
        add_sequence(s, rng, n);
        s.reads.push_back(n - 1);
        const std::int64_t more = below(rng, 3);
        for (std::int64_t k = 0; k < more; ++k) s.reads.push_back(below(rng, n));
        std::sort(s.reads.begin(), s.reads.end());
        s.reads.erase(std::unique(s.reads.begin(), s.reads.end()), s.reads.end());
        break;
      }
    }
    return s;
  }

 private:
  // ---- configuration -------------------------------------------------------------------------

  template <class F, std::size_t... K>
  void for_each_stream_impl(F& f, std::index_sequence<K...>) const {
    (f(std::integral_constant<std::size_t, K>{}, spec_.compressors.template stream<K>()), ...);
  }
  template <class F>
  void for_each_stream(F&& f) const {
    for_each_stream_impl(f, std::index_sequence_for<Compressors...>{});
  }

  std::unique_ptr<subject_type> make_subject(const cache_config& config) const {
    if (spec_.subject) return spec_.subject(spec_.compressors, config);
    return std::make_unique<subject_type>(spec_.compressors, config);
  }
  // The cache for a reference (or a property reading earlier positions) of n tokens.
  const cache_config& reference_cache(std::int64_t n) const {
    return n + max_pad_ <= kit_cache_.history ? kit_cache_ : selecting_cache_;
  }

  // The fewest tokens after which a read sees more than top_k entries (a few more, so that
  // several reads near the end select).
  std::int64_t tokens_past_top_k(std::int64_t top_k) const {
    const std::int64_t S = geom_.stride;
    if (top_k > max_selecting_tokens / S) return max_selecting_tokens + 1;
    std::int64_t n = (top_k + 1) * S + geom_.window;
    while (n <= max_selecting_tokens && geom_.visible_entries(n - 1) <= top_k) n += S;
    return n + 4 * S;
  }

  bool has_rope_table() const {
    bool table = false;
    for_each_stream([&](auto, const auto& c) {
      using T = compressor_traits<std::decay_t<decltype(c)>>;
      if (T::rope_before || T::rope_after) table = table || c.config().rope.table != nullptr;
    });
    return table;
  }

  std::string skip_reason(property p) const {
    if (p == property::origin_padding && !spec_.position_free_pooling)
      return "the pooling reads absolute positions (layer_under_test::position_free_pooling = false)";
    if (p == property::entries) {
      bool any = false;
      for_each_stream([&](auto k, const auto&) { any = any || oracle_of(k) != nullptr; });
      if (!any) return "no stream has an oracle (pass one in layer_under_test::oracles for a pooling of yours)";
    }
    return "";
  }

  // The properties that compare reads, and so would exercise a selecting reader.
  static bool reads_property(property p) {
    return p == property::streaming || p == property::round_trips || p == property::reads;
  }
  bool selection_checked(property p) const { return reads_property(p) && reader_->config().top_k > 0; }
  bool selecting_case(property p, std::int64_t i) const {
    return selecting_tokens_ > 0 && selection_checked(p) && i % 20 == 0;
  }
  std::string selection_flag() const {
    const std::int64_t needed = tokens_past_top_k(reader_->config().top_k);
    return "the selection never dropped an entry (top_k " + std::to_string(reader_->config().top_k) +
           "): not exercised; " +
           (needed <= max_selecting_tokens ? "options.max_tokens = " + std::to_string(2 * needed) + " would"
                                           : std::string("no sequence the kit runs is long enough"));
  }

  std::string note(property p) const {
    std::string out;
    if (p == property::entries)
      for_each_stream([&](auto k, const auto& c) {
        if (oracle_of(k) == nullptr)
          out += (out.empty() ? "" : "; ") + std::string("stream '") + c.config().name + "' has no oracle (oracles[" +
                 std::to_string(k) + "]): not checked";
      });
    if (p == property::reads && reader_->config().top_k > 0 && reader_->config().indexer_stream != no_stream &&
        reader_->config().precision == indexer_precision::fp4)
      out = "FP4 indexer: the selection is not held to double scores, the attention over it is";
    return out;
  }

  template <std::size_t K>
  const pooling_oracle* oracle_of(std::integral_constant<std::size_t, K>) const {
    using C = std::tuple_element_t<K, std::tuple<Compressors...>>;
    using T = compressor_traits<C>;
    if (spec_.oracles[K]) return &spec_.oracles[K];
    if constexpr (T::builtin) {
      if (!builtin_oracles_[K]) builtin_oracles_[K] = builtin_pooling_oracle<typename T::pooling>(
          spec_.compressors.template stream<K>().params());
      return &builtin_oracles_[K];
    }
    return nullptr;
  }

  std::string describe_configuration() const {
    const geometry& g = geom_;
    std::string out = "S=" + std::to_string(g.stride) + " W=" + std::to_string(g.window) +
                      " origin=" + std::to_string(g.origin) + " anchor=" + to_string(g.anchor) + "; streams";
    for_each_stream([&](auto k, const auto& c) {
      using T = compressor_traits<std::decay_t<decltype(c)>>;
      const stream_config& s = c.config();
      const storage_type st = kit_cache_.stream_storage.empty() ? kit_cache_.storage : kit_cache_.stream_storage[k];
      out += std::string(k ? "," : "") + " '" + s.name + "' (" + T::pooling_name() +
             (T::rope_before ? ", RoPE before pooling" : T::rope_after ? ", RoPE after pooling" : "") +
             (T::norm ? ", RMSNorm" : "") + ", " + std::to_string(s.kv_heads) + "x" + std::to_string(s.channels) +
             ", " + to_string(st) + ")";
    });
    const raw_window_config& w = kit_cache_.window;
    out += "; pages of " + std::to_string(kit_cache_.page_size) + "; window " + std::to_string(w.tokens) +
           (w.tokens > 0 ? std::string(" tokens (") + to_string(w.precision) + ")" : std::string(" tokens"));
    const reader_config& r = reader_->config();
    out += "; reader " + std::to_string(r.query_heads) + " query heads, top_k " + std::to_string(r.top_k) +
           (r.sink ? ", sink" : "") + (r.derotate_output ? ", de-rotated output" : "");
    if (opt_.front_door) out += "; through the model front door";
    out += "; seed " + std::to_string(opt_.seed) + ", " + (opt_.effort == effort::thorough ? "thorough" : "quick") +
           " (" + std::to_string(opt_.cases) + " cases a property, up to " + std::to_string(opt_.max_tokens) + " tokens" +
           (selecting_tokens_ > 0 ? ", selecting cases of " + std::to_string(selecting_tokens_) + "+" : std::string()) + ")";
    return out;
  }

  // ---- generation ------------------------------------------------------------------------------

  static std::int64_t below(std::uint64_t& rng, std::uint64_t n) {
    return n == 0 ? 0 : static_cast<std::int64_t>(phasekv::detail::splitmix64(rng) % n);
  }
  static std::uint64_t mix64(std::uint64_t seed, std::uint64_t salt) { return phasekv::detail::mix64(seed, salt); }

  // A sequence length in [at_least, max_tokens]: near a multiple of S or W, uniform, or long.
  std::int64_t tokens(std::uint64_t& rng, std::int64_t at_least) const {
    const std::int64_t hi = std::max(at_least, opt_.max_tokens);
    std::int64_t n;
    switch (below(rng, 3)) {
      case 0: {
        const std::int64_t unit = below(rng, 2) ? geom_.stride : geom_.window;
        n = unit * (1 + below(rng, static_cast<std::uint64_t>(std::max<std::int64_t>(1, hi / unit)))) + below(rng, 3) - 1;
        break;
      }
      case 1: n = 1 + below(rng, static_cast<std::uint64_t>(hi)); break;
      default: n = hi / 2 + below(rng, static_cast<std::uint64_t>(hi - hi / 2 + 1)); break;
    }
    return std::min(hi, std::max(at_least, n));
  }

  // A position in [0, n], often at or next to a block boundary.
  std::int64_t near_boundary(std::uint64_t& rng, std::int64_t n) const {
    if (below(rng, 2) == 0) return below(rng, static_cast<std::uint64_t>(n + 1));
    const std::int64_t lead = geom_.lead();
    const std::int64_t j = below(rng, static_cast<std::uint64_t>(n / geom_.stride + 1));
    return std::min(n, std::max<std::int64_t>(0, j * geom_.stride - lead + below(rng, 3) - 1));
  }

  // One to three round-trip operations on a sequence of n tokens, by position.
  void add_steps(scenario& s, std::uint64_t& rng, std::int64_t n) const {
    const std::int64_t count = 1 + below(rng, 3);
    for (std::int64_t k = 0; k < count; ++k) {
      step st;
      st.op = all_operations[below(rng, std::size(all_operations))];
      st.at = near_boundary(rng, n);
      st.junk = 1 + below(rng, max_junk_);
      s.steps.push_back(st);
    }
    std::stable_sort(s.steps.begin(), s.steps.end(), [](const step& a, const step& b) { return a.at < b.at; });
  }

  // A chunking of n tokens in one of several styles, with some chunks as bf16.
  void add_sequence(scenario& s, std::uint64_t& rng, std::int64_t n) const {
    std::vector<std::int64_t> sizes;
    const std::int64_t S = geom_.stride, W = geom_.window;
    const std::int64_t style = below(rng, 5);
    std::int64_t left = n;
    while (left > 0) {
      std::int64_t c;
      switch (style) {
        case 0: c = left; break;                                                   // one prefill
        case 1: c = sizes.size() < 24 ? 1 : left; break;                          // token by token, then the rest
        case 2: {                                                                  // sizes around S and W
          const std::int64_t near[] = {1, S - 1, S, S + 1, W - 1, W, W + 1, 2 * S + 1, 3 * W - 1};
          c = near[below(rng, std::size(near))];
          break;
        }
        case 3: c = 1 + below(rng, static_cast<std::uint64_t>(2 * W + S)); break;  // anything small
        default: c = sizes.empty() ? 1 + below(rng, static_cast<std::uint64_t>(n)) : left; break;  // two pieces
      }
      c = std::min(left, std::max<std::int64_t>(1, c));
      sizes.push_back(c);
      left -= c;
    }
    std::vector<std::uint8_t> forms(sizes.size(), 0);
    for (std::uint8_t& f : forms) {
      const std::int64_t r = below(rng, 6);
      f = r == 0 ? payload_bf16 : r == 1 ? logits_bf16 : r == 2 ? (payload_bf16 | logits_bf16) : 0;
    }
    s.chunks.push_back(std::move(sizes));
    s.forms.push_back(std::move(forms));
  }

  // ---- inputs ----------------------------------------------------------------------------------
  //
  // Tracks 1–5 hold track_rows rows each, then track 0 track0_rows (longer for the selecting
  // cases). Track 0 is the sequence under test, 1–3 other sequences, 4–5 junk and padding; junk
  // positions past its rows wrap around (junk is anything but the sequence's own tokens). Values
  // are uniform in [−1, 1) rounded to bf16, so any chunk can go over as bf16 bits and mean exactly
  // the same; logits are scaled by 3 so gates are far from uniform.

  static constexpr int tracks = 6, junk_track = 4, pad_track = 5;

  // Where a sequence's tokens come from: track `track`, behind `pad` tokens of the padding track.
  struct source {
    int track = 0;
    std::int64_t pad = 0;
  };

  std::int64_t track_start(int track) const { return track == 0 ? (tracks - 1) * track_rows_ : (track - 1) * track_rows_; }
  // The bank row of token t of `src`.
  std::int64_t bank_row(const source& src, std::int64_t t) const {
    if (t < src.pad) return track_start(pad_track) + t;
    const std::int64_t u = t - src.pad;
    return track_start(src.track) + (src.track == junk_track ? u % track_rows_ : u);
  }

  void fill_bank() {
    const std::int64_t rows = (tracks - 1) * track_rows_ + track0_rows_;
    std::uint64_t state = mix64(opt_.seed, 0x6b616e6b);
    auto value = [&](float scale) {
      const float u = static_cast<float>(phasekv::detail::splitmix64(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
      float v = u * scale;
      std::uint32_t bits;
      std::memcpy(&bits, &v, 4);
      bits &= 0xFFFF0000u;  // bf16-exact
      std::memcpy(&v, &bits, 4);
      return v;
    };
    for (std::size_t k = 0; k < N; ++k) {
      bank_payload_[k].resize(static_cast<std::size_t>(rows * payload_[k]));
      for (float& x : bank_payload_[k]) x = value(1.0f);
      bank_logits_[k].resize(static_cast<std::size_t>(rows * logits_[k]));
      for (float& x : bank_logits_[k]) x = value(3.0f);
    }
    bank_window_keys_.resize(static_cast<std::size_t>(rows * window_key_floats_));
    for (float& x : bank_window_keys_) x = value(1.0f);
    bank_window_values_.resize(static_cast<std::size_t>(rows * window_value_floats_));
    for (float& x : bank_window_values_) x = value(1.0f);
  }


  struct chunk_data {
    std::array<std::vector<float>, N> payload, logits;
    std::array<std::vector<std::uint16_t>, N> payload16, logits16;
    std::vector<float> window_keys, window_values;
    chunks in{};
  };

  static std::uint16_t bf16_bits(float v) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    return static_cast<std::uint16_t>(bits >> 16);
  }

  // Tokens [first, first + count) of `src`, in `form`.
  void fill_chunk(chunk_data& d, const source& src, std::int64_t first, std::int64_t count, std::uint8_t form) const {
    for (std::size_t k = 0; k < N; ++k) {
      d.payload[k].clear();
      d.logits[k].clear();
      d.payload16[k].clear();
      d.logits16[k].clear();
      for (std::int64_t t = first; t < first + count; ++t) {
        const std::int64_t row = bank_row(src, t);
        const float* p = bank_payload_[k].data() + row * payload_[k];
        const float* l = bank_logits_[k].data() + row * logits_[k];
        d.payload[k].insert(d.payload[k].end(), p, p + payload_[k]);
        d.logits[k].insert(d.logits[k].end(), l, l + logits_[k]);
      }
      token_chunk c;
      c.tokens = count;
      if ((form & payload_bf16) != 0) {
        for (float v : d.payload[k]) d.payload16[k].push_back(bf16_bits(v));
        c.payload_bf16 = span<const std::uint16_t>(d.payload16[k]);
      } else {
        c.payload = span<const float>(d.payload[k]);
      }
      if ((form & logits_bf16) != 0 && logits_[k] > 0) {
        for (float v : d.logits[k]) d.logits16[k].push_back(bf16_bits(v));
        c.logits_bf16 = span<const std::uint16_t>(d.logits16[k]);
      } else {
        c.logits = span<const float>(d.logits[k]);
      }
      d.in[k] = c;
    }
    d.window_keys.clear();
    d.window_values.clear();
    for (std::int64_t t = first; t < first + count; ++t) {
      const std::int64_t row = bank_row(src, t);
      const float* wk = bank_window_keys_.data() + row * window_key_floats_;
      const float* wv = bank_window_values_.data() + row * window_value_floats_;
      d.window_keys.insert(d.window_keys.end(), wk, wk + window_key_floats_);
      d.window_values.insert(d.window_values.end(), wv, wv + window_value_floats_);
    }
  }

  void append(subject_type& s, sequence_id id, const source& src, std::int64_t first, std::int64_t count,
              std::uint8_t form = 0) const {
    if (count <= 0) return;
    chunk_data d;
    fill_chunk(d, src, first, count, form);
    s.append(id, d.in, span<const float>(d.window_keys), span<const float>(d.window_values));
  }

  // Appends the scenario's sequence 0 to `id`, in its chunks.
  void append_sequence_0(subject_type& s, sequence_id id, const scenario& sc) const {
    std::int64_t done = 0;
    for (std::size_t k = 0; k < sc.chunks[0].size(); ++k) {
      append(s, id, source{0}, done, sc.chunks[0][k], sc.forms[0][k]);
      done += sc.chunks[0][k];
    }
  }

  // The layer's entries for tokens [0, n) of `src` through fresh compressor states, appended in
  // `chunks`: per stream every entry's values and slot weights, in order.
  struct written {
    std::array<std::vector<float>, N> values, weights;
    std::array<std::vector<std::int64_t>, N> index, anchor;
  };
  written write_alone(const layer& l, const source& src, const std::vector<std::int64_t>& chunk_sizes,
                      const std::vector<std::uint8_t>& forms) const {
    written w;
    typename layer::states states = l.make_state();
    append_options opts;
    opts.slot_weights = true;
    std::int64_t done = 0;
    for (std::size_t k = 0; k < chunk_sizes.size(); ++k) {
      chunk_data d;
      fill_chunk(d, src, done, chunk_sizes[k], forms[k]);
      l.append(states, d.in, [&](std::size_t s, const entry_view& e) {
        w.values[s].insert(w.values[s].end(), e.values, e.values + e.kv_heads * e.channels);
        if (e.slot_weights) w.weights[s].insert(w.weights[s].end(), e.slot_weights, e.slot_weights + e.kv_heads * e.window);
        w.index[s].push_back(e.index);
        w.anchor[s].push_back(e.anchor);
      }, opts);
      done += chunk_sizes[k];
    }
    return w;
  }

  // ---- reads -----------------------------------------------------------------------------------

  struct read_inputs {
    std::vector<float> queries, indexer_queries, indexer_weights, sinks;
  };

  // The request at position t: the same for every sequence and cache (seeded by t).
  const read_inputs& inputs_at(std::int64_t t) {
    auto found = read_inputs_.find(t);
    if (found != read_inputs_.end()) return found->second;
    read_inputs in;
    std::uint64_t state = mix64(opt_.seed ^ 0x72656164u, static_cast<std::uint64_t>(t));
    auto uniform = [&] { return static_cast<float>(phasekv::detail::splitmix64(state) >> 40) * (2.0f / 16777216.0f) - 1.0f; };
    const reader_config& r = reader_->config();
    const stream_shape& keys = shape_.streams[r.key_stream];
    in.queries.resize(static_cast<std::size_t>(r.query_heads * keys.channels));
    for (float& x : in.queries) x = uniform();
    if (r.top_k > 0 && r.indexer_stream != no_stream) {
      const stream_shape& ix = shape_.streams[r.indexer_stream];
      in.indexer_queries.resize(static_cast<std::size_t>(r.indexer_heads * ix.channels));
      for (float& x : in.indexer_queries) x = uniform();
      in.indexer_weights.resize(static_cast<std::size_t>(r.indexer_heads));
      for (float& x : in.indexer_weights) x = 0.5f * (uniform() + 1.0f) / static_cast<float>(r.indexer_heads) + 1e-3f;
    }
    if (r.sink) {
      in.sinks.resize(static_cast<std::size_t>(r.query_heads));
      for (float& x : in.sinks) x = uniform();
    }
    return read_inputs_.emplace(t, std::move(in)).first->second;
  }

  struct read_output {
    std::vector<float> out, lse;
    std::vector<std::int32_t> selected;
    read_trace trace;
  };

  read_output read(const subject_type& s, sequence_id id, std::int64_t t) {
    const read_inputs& in = inputs_at(t);
    read_output r;
    r.out.assign(static_cast<std::size_t>(reader_->output_floats()), 0.0f);
    r.lse.assign(static_cast<std::size_t>(reader_->config().query_heads), 0.0f);
    r.selected.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, reader_->config().top_k)), -1);
    const sequence_view view = s.view_of(id);
    read_item item;
    item.view = &view;
    item.request.position = t;
    item.request.queries = span<const float>(in.queries);
    item.request.indexer_queries = span<const float>(in.indexer_queries);
    item.request.indexer_weights = span<const float>(in.indexer_weights);
    item.request.sinks = span<const float>(in.sinks);
    item.out = r.out.data();
    item.lse = r.lse.data();
    if (reader_->config().top_k > 0) item.selected_logical = r.selected.data();
    item.trace = &r.trace;
    reader_->read_batch(span<const read_item>(&item, 1));
    return r;
  }

  // A read of the sequence under test, counted in the property's coverage.
  read_output read_counted(const subject_type& s, sequence_id id, std::int64_t t) {
    read_output r = read(s, id, t);
    ++cov_.reads;
    cov_.most_candidates = std::max(cov_.most_candidates, r.trace.candidates);
    if (static_cast<std::int64_t>(r.trace.selected.size()) < r.trace.candidates) ++cov_.selecting_reads;
    return r;
  }
  // A sequence of n tokens under the host's history: did its raw window ring wrap?
  void count_window(const subject_type& s, std::int64_t n) {
    const std::int64_t rows = s.window_rows();
    if (rows == 0) return;
    ++cov_.sequences;
    if (n > rows) ++cov_.wrapped_windows;
  }

  // Two reads at t, bit for bit.
  result same_read(const read_output& got, const read_output& want, std::int64_t t, const std::string& what) const {
    const std::int64_t cv = static_cast<std::int64_t>(got.out.size()) / reader_->config().query_heads;
    for (std::size_t i = 0; i < got.out.size(); ++i)
      if (std::memcmp(&got.out[i], &want.out[i], 4) != 0)
        return what + ": read at token " + std::to_string(t) + ": output[head " + std::to_string(i / cv) + "][channel " +
               std::to_string(i % cv) + "] = " + float_text(got.out[i]) + ", the prefill's " + float_text(want.out[i]);
    for (std::size_t h = 0; h < got.lse.size(); ++h)
      if (std::memcmp(&got.lse[h], &want.lse[h], 4) != 0)
        return what + ": read at token " + std::to_string(t) + ": lse[head " + std::to_string(h) + "] = " +
               float_text(got.lse[h]) + ", the prefill's " + float_text(want.lse[h]);
    if (got.selected != want.selected) return what + ": read at token " + std::to_string(t) + ": selects other entries than the prefill";
    return std::nullopt;
  }

  // A sequence against a prefill of at least its tokens: its count, and the entries and window
  // rows of its first `n` tokens (default: all the prefill's), stored bytes and values bit for bit.
  result same_sequence(const subject_type& a, sequence_id ia, const subject_type& b, sequence_id ib,
                       const std::string& what, std::int64_t n = -1) const {
    if (n < 0) n = b.tokens(ib);
    if (a.tokens(ia) != n)
      return what + ": holds " + std::to_string(a.tokens(ia)) + " tokens where it should hold " + std::to_string(n);
    result diff;
    for_each_stream([&](auto k, const auto& c) {
      if (diff) return;
      const std::int64_t entries = geom_.completed_entries(n);
      if (a.entries(ia, k) != entries || b.entries(ib, k) < entries) {
        diff = what + ": stream '" + c.config().name + "' holds " + std::to_string(a.entries(ia, k)) + " entries after " +
               std::to_string(n) + " tokens, where " + std::to_string(entries) + " are complete";
        return;
      }
      const std::int64_t H = c.config().kv_heads, C = c.config().channels;
      std::vector<float> x(static_cast<std::size_t>(H * C)), y(x.size());
      for (std::int64_t j = 0; j < entries && !diff; ++j) {
        const span<const std::byte> ea = a.entry_bytes(ia, k, j), eb = b.entry_bytes(ib, k, j);
        if (ea.size() == eb.size() && std::memcmp(ea.data(), eb.data(), ea.size()) == 0) continue;
        a.read_entry(ia, k, j, x.data());
        b.read_entry(ib, k, j, y.data());
        std::string where = "its stored bytes";
        for (std::size_t i = 0; i < x.size(); ++i)
          if (std::memcmp(&x[i], &y[i], 4) != 0) {
            where = "head " + std::to_string(static_cast<std::int64_t>(i) / C) + " channel " +
                    std::to_string(static_cast<std::int64_t>(i) % C) + " = " + float_text(x[i]) + ", the prefill's " +
                    float_text(y[i]);
            break;
          }
        diff = what + ": stream '" + c.config().name + "' entry " + std::to_string(j) + " differs: " + where;
      }
    });
    if (diff) return diff;
    if (window_key_floats_ == 0) return std::nullopt;
    const std::int64_t from = std::max({a.window_first(ia), b.window_first(ib), n - kit_cache_.window.tokens, std::int64_t{0}});
    std::vector<float> x(static_cast<std::size_t>(window_key_floats_)), y(x.size());
    std::vector<float> xv(static_cast<std::size_t>(window_value_floats_)), yv(xv.size());
    for (std::int64_t t = from; t < n; ++t) {
      a.copy_window_key(ia, t, span<float>(x));
      b.copy_window_key(ib, t, span<float>(y));
      if (std::memcmp(x.data(), y.data(), x.size() * 4) != 0)
        return what + ": the window's key row of token " + std::to_string(t) + " differs from the prefill's";
      if (window_value_floats_ > 0) {
        a.copy_window_value(ia, t, span<float>(xv));
        b.copy_window_value(ib, t, span<float>(yv));
        if (std::memcmp(xv.data(), yv.data(), xv.size() * 4) != 0)
          return what + ": the window's value row of token " + std::to_string(t) + " differs from the prefill's";
      }
    }
    return std::nullopt;
  }

  // Whether to read after chunk k of `count`: the first, the last and a few between.
  static bool read_after(std::size_t k, std::size_t count) {
    if (count <= 6) return true;
    return k == 0 || k + 1 == count || k % (count / 5) == 0;
  }

  // ---- properties ------------------------------------------------------------------------------

  result run_streaming(const scenario& sc) {
    const std::size_t B = sc.chunks.size();
    std::int64_t longest = 0;
    for (std::size_t b = 0; b < B; ++b) longest = std::max(longest, sc.tokens(b));
    auto ref = make_subject(reference_cache(longest));
    auto sub = make_subject(host_history_cache_);
    std::vector<sequence_id> rid(B), sid(B);
    for (std::size_t b = 0; b < B; ++b) {
      rid[b] = ref->create();
      append(*ref, rid[b], source{sc.track(b)}, 0, sc.tokens(b));
      sid[b] = sub->create();
    }
    std::size_t steps = 0;
    for (const auto& c : sc.chunks) steps = std::max(steps, c.size());
    std::vector<std::int64_t> done(B, 0);
    std::map<std::pair<std::size_t, std::int64_t>, read_output> reference_reads;
    for (std::size_t k = 0; k < steps; ++k) {
      std::vector<chunk_data> data;
      data.reserve(B);
      std::vector<append_item> items;
      std::vector<std::size_t> who;
      for (std::size_t b = 0; b < B; ++b) {
        if (k >= sc.chunks[b].size()) continue;
        data.emplace_back();
        fill_chunk(data.back(), source{sc.track(b)}, done[b], sc.chunks[b][k], sc.forms[b][k]);
        append_item it;
        it.seq = sid[b];
        it.in = data.back().in;
        it.window_keys = span<const float>(data.back().window_keys);
        it.window_values = span<const float>(data.back().window_values);
        items.push_back(it);
        who.push_back(b);
      }
      if (B == 1) sub->append(items[0].seq, items[0].in, items[0].window_keys, items[0].window_values);
      else sub->append_batch(span<const append_item>(items));
      for (std::size_t b : who) done[b] += sc.chunks[b][k];
      if (!read_after(k, steps)) continue;
      for (std::size_t b : who) {
        const std::int64_t t = done[b] - 1;
        auto key = std::make_pair(b, t);
        if (!reference_reads.count(key)) reference_reads.emplace(key, read(*ref, rid[b], t));
        const std::string what = B > 1 ? "sequence " + std::to_string(sc.track(b)) + " after step " + std::to_string(k) : "after chunk " + std::to_string(k);
        if (result d = same_read(read_counted(*sub, sid[b], t), reference_reads.at(key), t, what)) return d;
      }
    }
    for (std::size_t b = 0; b < B; ++b) count_window(*sub, sc.tokens(b));
    for (std::size_t b = 0; b < B; ++b)
      if (result d = same_sequence(*sub, sid[b], *ref, rid[b], B > 1 ? "sequence " + std::to_string(sc.track(b)) : "the sequence"))
        return d;
    return std::nullopt;
  }

  result run_round_trips(const scenario& sc) {
    const std::int64_t n = sc.tokens(0);
    auto ref = make_subject(reference_cache(n));
    const sequence_id rid = ref->create();
    append(*ref, rid, source{0}, 0, n);
    std::array<std::unique_ptr<subject_type>, 2> caches = {make_subject(host_history_cache_),
                                                           make_subject(host_history_cache_)};
    const std::int64_t page = std::max<std::int64_t>(1, kit_cache_.page_size);
    // A fork of `parent` (holding `entries` entries of stream 0 in `used` pages of its pool before
    // it): did it share the pages, and does the write that follows copy a shared one?
    auto fork_counted = [&](subject_type& s, sequence_id parent) {
      const std::int64_t entries = s.entries(parent, 0), used = s.pages_used(0);
      const sequence_id f = s.fork(parent);
      if (entries > 0) {
        ++cov_.forks;
        if (s.pages_used(0) == used) ++cov_.sharing_forks;
      }
      return std::make_pair(f, entries);
    };
    auto count_shared_write = [&](subject_type& s, sequence_id writer, std::int64_t entries_at_fork) {
      if (entries_at_fork % page != 0 && s.entries(writer, 0) > entries_at_fork) ++cov_.shared_page_writes;
    };
    int current = 0;
    sequence_id cur = caches[0]->create();
    std::int64_t pos = 0;
    std::size_t next = 0;
    std::vector<step> steps = sc.steps;
    std::stable_sort(steps.begin(), steps.end(), [](const step& a, const step& b) { return a.at < b.at; });
    const source real{0}, junk{junk_track};

    auto apply = [&](const step& st) {
      subject_type& s = *caches[static_cast<std::size_t>(current)];
      switch (st.op) {
        case operation::fork_write_fork: {
          const auto [f, entries] = fork_counted(s, cur);
          append(s, f, junk, pos, st.junk);
          count_shared_write(s, f, entries);
          break;
        }
        case operation::fork_follow_fork: {
          const auto [f, entries] = fork_counted(s, cur);
          append(s, cur, junk, pos, st.junk);
          count_shared_write(s, cur, entries);
          cur = f;
          break;
        }
        case operation::copy_over: {
          const sequence_id d = s.create();
          append(s, d, junk, 0, st.junk);
          s.copy(cur, d);
          append(s, cur, junk, pos, st.junk);
          cur = d;
          break;
        }
        case operation::rollback:
          append(s, cur, junk, pos, st.junk);
          s.remove_suffix(cur, pos);
          break;
        case operation::keep_only: {
          const sequence_id other = s.create();
          append(s, other, junk, 0, st.junk);
          const auto [f, entries] = fork_counted(s, cur);
          append(s, f, junk, pos, st.junk);
          count_shared_write(s, f, entries);
          s.keep(cur);
          break;
        }
        case operation::snapshot_other_cache:
        case operation::snapshot_same_cache: {
          const std::vector<std::byte> bytes = s.snapshot(cur);
          const int target = st.op == operation::snapshot_other_cache ? 1 - current : current;
          const sequence_id restored = caches[static_cast<std::size_t>(target)]->restore(span<const std::byte>(bytes));
          append(s, cur, junk, pos, st.junk);
          current = target;
          cur = restored;
          break;
        }
      }
    };
    // Right after an operation the sequence must be what it was: its tokens so far, as a prefill.
    auto apply_checked = [&](const step& st) -> result {
      apply(st);
      return same_sequence(*caches[static_cast<std::size_t>(current)], cur, *ref, rid,
                           std::string("right after '") + to_string(st.op) + "' at token " + std::to_string(st.at) +
                               ", the sequence it goes on with",
                           pos);
    };
    auto apply_at = [&](std::int64_t at) -> result {
      while (next < steps.size() && steps[next].at == at)
        if (result d = apply_checked(steps[next++])) return d;
      return std::nullopt;
    };
    if (result d = apply_at(0)) return d;
    std::map<std::int64_t, read_output> reference_reads;
    for (std::size_t k = 0; k < sc.chunks[0].size(); ++k) {
      std::int64_t left = sc.chunks[0][k];
      while (left > 0) {
        std::int64_t stop = pos + left;
        if (next < steps.size() && steps[next].at < stop) stop = steps[next].at;
        append(*caches[static_cast<std::size_t>(current)], cur, real, pos, stop - pos, sc.forms[0][k]);
        left -= stop - pos;
        pos = stop;
        if (result d = apply_at(pos)) return d;
      }
      if (!read_after(k, sc.chunks[0].size()) || pos == 0) continue;
      if (!reference_reads.count(pos - 1)) reference_reads.emplace(pos - 1, read(*ref, rid, pos - 1));
      if (result d = same_read(read_counted(*caches[static_cast<std::size_t>(current)], cur, pos - 1), reference_reads.at(pos - 1),
                               pos - 1, "after chunk " + std::to_string(k)))
        return d;
    }
    while (next < steps.size())  // steps at the end (at = n)
      if (result d = apply_checked(steps[next++])) return d;
    if (result d = same_sequence(*caches[static_cast<std::size_t>(current)], cur, *ref, rid, "the sequence at the end"))
      return d;
    count_window(*caches[static_cast<std::size_t>(current)], n);
    if (n > 0)
      if (result d = same_read(read_counted(*caches[static_cast<std::size_t>(current)], cur, n - 1), read(*ref, rid, n - 1), n - 1,
                               "at the end"))
        return d;
    return std::nullopt;
  }

  // The layer's compressors on another geometry (the same streams, parameters and poolings).
  template <std::size_t... K>
  layer with_geometry(const geometry& g, std::index_sequence<K...>) const {
    return layer(std::tuple_element_t<K, std::tuple<Compressors...>>(
        g, spec_.compressors.template stream<K>().config(), spec_.compressors.template stream<K>().params(),
        spec_.compressors.template stream<K>().pool())...);
  }

  result run_origin_padding(const scenario& sc) {
    const std::int64_t S = geom_.stride, p = sc.pad;
    geometry moved = geom_;
    moved.origin = (geom_.origin + p) % S;
    const layer padded = with_geometry(moved, std::index_sequence_for<Compressors...>{});
    const written a = write_alone(spec_.compressors, source{0}, sc.chunks[0], sc.forms[0]);
    const written b = write_alone(padded, source{0, p}, {sc.tokens(0) + p}, {0});
    const std::int64_t shift = (moved.lead() + p - geom_.lead()) / S;  // blocks the padding fills
    result diff;
    for_each_stream([&](auto k, const auto& c) {
      using T = compressor_traits<std::decay_t<decltype(c)>>;
      if (diff) return;
      const stream_config& cfg = c.config();
      const std::int64_t H = cfg.kv_heads, C = cfg.channels, R = (T::rope_before || T::rope_after) ? cfg.rope.channels : 0;
      const bool exact = !(T::rope_before && T::norm);  // RMSNorm over turned channels rounds differently
      const oracle_rope turn(cfg.rope);
      for (std::size_t e = 0; e < a.index[k].size() && !diff; ++e) {
        const std::int64_t j = a.index[k][e];
        if (geom_.window_start(j) < 0) continue;  // its window holds padding: the oracle's to check
        const std::size_t f = static_cast<std::size_t>(j + shift);
        if (f >= b.index[k].size()) {
          diff = "stream '" + cfg.name + "': entry " + std::to_string(j) + " has no counterpart " + std::to_string(j + shift) +
                 " behind " + std::to_string(p) + " tokens of padding (origin " + std::to_string(moved.origin) + ")";
          return;
        }
        for (std::int64_t h = 0; h < H && !diff; ++h) {
          const float* x = a.values[k].data() + e * static_cast<std::size_t>(H * C) + h * C;
          const float* y = b.values[k].data() + f * static_cast<std::size_t>(H * C) + h * C;
          double largest = 0.0;
          for (std::int64_t ch = 0; ch < C; ++ch) largest = std::max(largest, std::abs(static_cast<double>(x[ch])));
          auto differ = [&](std::int64_t ch, double u, double v, double bound) {
            diff = "stream '" + cfg.name + "' entry " + std::to_string(j) + " head " + std::to_string(h) + " channel " +
                   std::to_string(ch) + ": " + float_text(static_cast<float>(u)) + ", but behind " + std::to_string(p) +
                   " tokens of padding (origin " + std::to_string(moved.origin) + ", entry " + std::to_string(j + shift) +
                   ") " + float_text(static_cast<float>(v)) +
                   (bound > 0.0 ? " (beyond " + phasekv::detail::general(bound) + ")" : " (bit for bit expected)");
          };
          for (std::int64_t ch = 0; ch < C - R && !diff; ++ch) {
            if (exact && std::memcmp(&x[ch], &y[ch], 4) != 0) differ(ch, x[ch], y[ch], 0.0);
            const double bound = opt_.tolerance.rope_turn * largest;
            if (!exact && !(std::abs(static_cast<double>(x[ch]) - y[ch]) <= bound)) differ(ch, x[ch], y[ch], bound);
          }
          if (R == 0 || diff) continue;
          // The turned channels, each turned back by its entry's anchor: the same values.
          std::vector<double> u(x, x + C), v(y, y + C);
          if (T::rope_after) {
            turn.rotate(u.data(), C, static_cast<double>(a.anchor[k][e]), -1.0);
            turn.rotate(v.data(), C, static_cast<double>(b.anchor[k][f]), -1.0);
          } else {
            turn.turn(v.data(), C, -static_cast<double>(p));  // each slot turned p further
          }
          const double bound = opt_.tolerance.rope_turn * std::max(largest, 1e-30);
          for (std::int64_t ch = C - R; ch < C && !diff; ++ch)
            if (!(std::abs(u[static_cast<std::size_t>(ch)] - v[static_cast<std::size_t>(ch)]) <= bound))
              differ(ch, u[static_cast<std::size_t>(ch)], v[static_cast<std::size_t>(ch)], bound);
        }
      }
    });
    return diff;
  }

  result run_entries(const scenario& sc) {
    const std::int64_t n = sc.tokens(0);
    const written w = write_alone(spec_.compressors, source{0}, sc.chunks[0], sc.forms[0]);
    result diff;
    for_each_stream([&](auto k, const auto& c) {
      using C = std::decay_t<decltype(c)>;
      const pooling_oracle* oracle = oracle_of(k);
      if (diff || oracle == nullptr) return;
      const stream_config& cfg = c.config();
      const std::vector<oracle_entry> want = oracle_entries<typename C::policy>(
          geom_, cfg, c.params(), *oracle, bank_payload_[k].data() + track_start(0) * payload_[k],
          bank_logits_[k].data() + track_start(0) * logits_[k], n);
      if (want.size() != w.index[k].size()) {
        diff = "stream '" + cfg.name + "': " + std::to_string(w.index[k].size()) + " entries after " + std::to_string(n) +
               " tokens, the oracle " + std::to_string(want.size());
        return;
      }
      const std::int64_t H = cfg.kv_heads, Ch = cfg.channels, W = geom_.window;
      for (std::size_t e = 0; e < want.size() && !diff; ++e) {
        if (w.index[k][e] != want[e].index || w.anchor[k][e] != want[e].anchor) {
          diff = "stream '" + cfg.name + "': entry #" + std::to_string(e) + " has index/anchor " + std::to_string(w.index[k][e]) +
                 "/" + std::to_string(w.anchor[k][e]) + ", the oracle " + std::to_string(want[e].index) + "/" +
                 std::to_string(want[e].anchor);
          return;
        }
        const float* weights = w.weights[k].empty() ? nullptr : w.weights[k].data() + e * static_cast<std::size_t>(H * W);
        std::string m = entry_mismatch(want[e], H, Ch, W, w.values[k].data() + e * static_cast<std::size_t>(H * Ch), weights,
                                       opt_.tolerance.entries, opt_.tolerance.slot_weights);
        if (!m.empty()) diff = "stream '" + cfg.name + "' " + m;
      }
    });
    return diff;
  }

  result run_reads(const scenario& sc) {
    auto sub = make_subject(reference_cache(sc.tokens(0)));
    const sequence_id id = sub->create();
    append_sequence_0(*sub, id, sc);
    const reader_config& rc = reader_->config();
    const stream_shape& keys = shape_.streams[rc.key_stream];
    const stream_shape& values = shape_.streams[rc.value_stream];
    const std::int64_t kvh = keys.kv_heads, ck = keys.channels, cv = values.channels;
    const double scale = rc.scale > 0.0f ? rc.scale : 1.0 / std::sqrt(static_cast<double>(ck));
    for (std::int64_t t : sc.reads) {
      const read_output got = read_counted(*sub, id, t);
      const read_trace& tr = got.trace;
      const std::int64_t candidates = geom_.visible_entries(t);
      const std::string at = "read at token " + std::to_string(t);
      if (tr.candidates != candidates)
        return at + ": " + std::to_string(tr.candidates) + " candidate entries, " + std::to_string(candidates) +
               " are visible (docs/DESIGN.md §2)";
      const bool selecting = rc.top_k > 0;
      const std::int64_t want_selected = selecting ? std::min(rc.top_k, candidates) : candidates;
      if (static_cast<std::int64_t>(tr.selected.size()) != want_selected)
        return at + ": selected " + std::to_string(tr.selected.size()) + " entries, expected " + std::to_string(want_selected);
      if (!selecting)
        for (std::int64_t j = 0; j < candidates; ++j)
          if (tr.selected[static_cast<std::size_t>(j)] != j) return at + ": without selection, entry " + std::to_string(j) + " is not read in order";
      if (selecting && rc.indexer_stream != no_stream && rc.precision != indexer_precision::fp4)
        if (result d = check_selection(*sub, id, t, tr)) return at + ": " + *d;
      // Attention in double over what was selected and the window.
      std::vector<std::vector<float>> rows_k, rows_v;
      std::vector<const float*> kp, vp;
      for (std::int64_t j : tr.selected) {
        rows_k.emplace_back(static_cast<std::size_t>(kvh * ck));
        sub->read_entry(id, rc.key_stream, j, rows_k.back().data());
        rows_v.emplace_back(static_cast<std::size_t>(kvh * cv));
        sub->read_entry(id, rc.value_stream, j, rows_v.back().data());
      }
      const std::int64_t first_window = kit_cache_.window.tokens > 0 ? std::max<std::int64_t>(0, t - kit_cache_.window.tokens + 1) : t + 1;
      if (kit_cache_.window.tokens > 0 && tr.window_first != first_window)
        return at + ": reads the window from token " + std::to_string(tr.window_first) + ", expected " + std::to_string(first_window);
      for (std::int64_t u = first_window; u <= t; ++u) {
        rows_k.emplace_back(static_cast<std::size_t>(window_key_floats_));
        sub->copy_window_key(id, u, span<float>(rows_k.back()));
        rows_v.emplace_back(static_cast<std::size_t>(kvh * cv));
        sub->copy_window_value(id, u, span<float>(rows_v.back()));
      }
      for (auto& r : rows_k) kp.push_back(r.data());
      for (auto& r : rows_v) vp.push_back(r.data());
      const read_inputs& in = inputs_at(t);
      oracle_read_result want = oracle_read(rc.query_heads, kvh, ck, cv, scale, in.queries.data(),
                                            rc.sink ? in.sinks.data() : nullptr, kp, vp);
      if (rc.derotate_output) {
        const oracle_rope turn(keys.rope);
        for (std::int64_t h = 0; h < rc.query_heads; ++h) turn.rotate(want.out.data() + h * cv, cv, static_cast<double>(t), -1.0);
      }
      const std::int64_t group = rc.query_heads / kvh;
      for (std::int64_t h = 0; h < rc.query_heads; ++h) {
        double largest = 0.0;
        for (const float* v : vp)
          for (std::int64_t c = 0; c < cv; ++c) largest = std::max(largest, std::abs(static_cast<double>(v[(h / group) * cv + c])));
        const double bound = opt_.tolerance.reads * std::max(largest, 1e-30);
        for (std::int64_t c = 0; c < cv; ++c) {
          const double g = got.out[static_cast<std::size_t>(h * cv + c)], w = want.out[static_cast<std::size_t>(h * cv + c)];
          if (!(std::abs(g - w) <= bound))
            return at + ": output[head " + std::to_string(h) + "][channel " + std::to_string(c) + "] = " +
                   float_text(static_cast<float>(g)) + ", attention in double over the " + std::to_string(tr.selected.size()) +
                   " selected entries and " + std::to_string(t + 1 - first_window) + " window tokens gives " +
                   float_text(static_cast<float>(w));
        }
        double lse = want.lse[static_cast<std::size_t>(h)];
        if (rc.lse == lse_convention::flashmla) {  // over the keys alone; +inf for none
          const double sink = rc.sink ? static_cast<double>(in.sinks[static_cast<std::size_t>(h)]) : -INFINITY;
          if (std::isinf(lse) && lse < 0) lse = INFINITY;
          else if (rc.sink) lse = lse + std::log1p(-std::exp(sink - lse));
          if (rc.sink && kp.empty()) lse = INFINITY;
        }
        const double g = got.lse[static_cast<std::size_t>(h)];
        const bool both_inf = std::isinf(g) && std::isinf(lse) && (g > 0) == (lse > 0);
        if (!both_inf && !(std::abs(g - lse) <= opt_.tolerance.reads * (1.0 + std::abs(lse))))
          return at + ": lse[head " + std::to_string(h) + "] = " + float_text(static_cast<float>(g)) + ", in double " +
                 float_text(static_cast<float>(lse));
      }
    }
    return std::nullopt;
  }

  // Every selected entry scores at least the k-th best double score, less a rounding allowance.
  result check_selection(const subject_type& s, sequence_id id, std::int64_t t, const read_trace& tr) {
    const reader_config& rc = reader_->config();
    const stream_shape& ix = shape_.streams[rc.indexer_stream];
    const std::int64_t candidates = tr.candidates;
    std::vector<std::vector<float>> keys(static_cast<std::size_t>(candidates), std::vector<float>(static_cast<std::size_t>(ix.channels)));
    std::vector<const float*> kp;
    for (std::int64_t j = 0; j < candidates; ++j) {
      s.read_entry(id, rc.indexer_stream, j, keys[static_cast<std::size_t>(j)].data());
      kp.push_back(keys[static_cast<std::size_t>(j)].data());
    }
    const read_inputs& in = inputs_at(t);
    const std::vector<double> score = oracle_indexer_scores(in.indexer_queries.data(), in.indexer_weights.data(), rc.indexer_heads,
                                                            ix.channels, kp, rc.precision == indexer_precision::bf16);
    std::vector<double> sorted = score;
    const std::int64_t k = static_cast<std::int64_t>(tr.selected.size());
    if (k == 0) return std::nullopt;
    std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[static_cast<std::size_t>(k - 1)];
    double largest = 0.0;
    for (double v : score) largest = std::max(largest, std::abs(v));
    for (std::int64_t j : tr.selected)
      if (score[static_cast<std::size_t>(j)] < kth - 1e-5 * std::max(largest, 1e-30))
        return "entry " + std::to_string(j) + " was selected with a double-precision indexer score of " +
               phasekv::detail::general(score[static_cast<std::size_t>(j)], 9) + ", below the top " + std::to_string(k) + "'s least, " +
               phasekv::detail::general(kth, 9);
    return std::nullopt;
  }

  result run_dense_control(const scenario& sc) {
    using mean_stream = stream_compressor<compressor_policy<mean_pool>>;
    using control_cache = paged_cache<mean_stream, mean_stream>;
    const reader_config& rc = reader_->config();
    const stream_shape& keys = shape_.streams[rc.key_stream];
    const stream_shape& values = shape_.streams[rc.value_stream];
    const std::int64_t kvh = keys.kv_heads, ck = keys.channels, cv = values.channels, n = sc.tokens(0);
    const geometry g{1, 1, 0, anchor_mode::block_start};
    stream_config kc, vc;
    kc.name = "control.keys";
    kc.role = stream_role::key;
    kc.channels = ck;
    kc.kv_heads = kvh;
    vc.name = "control.values";
    vc.role = stream_role::value;
    vc.channels = cv;
    vc.kv_heads = kvh;
    cache_config cc;
    cc.name = "control";
    cc.page_size = 4;
    cc.pages = n / 4 + 2;
    control_cache cache(typename control_cache::layer(mean_stream(g, kc), mean_stream(g, vc)), cc);
    reader_config r;
    r.name = "control.reader";
    r.query_heads = rc.query_heads;
    r.scale = rc.scale;
    r.key_stream = 0;
    r.value_stream = 1;
    r.sink = rc.sink;
    sparse_reader reader(cache, r);
    // Raw tokens: keys and values [n][kv_heads][channels], from the bank's first stream and window.
    std::vector<float> k_in(static_cast<std::size_t>(n * kvh * ck)), v_in(static_cast<std::size_t>(n * kvh * cv));
    std::uint64_t state = mix64(opt_.seed ^ 0x636f6e74u, static_cast<std::uint64_t>(n));
    for (float& x : k_in) x = static_cast<float>(phasekv::detail::splitmix64(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    for (float& x : v_in) x = static_cast<float>(phasekv::detail::splitmix64(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    const sequence_id id = cache.create();
    std::int64_t done = 0;
    for (std::int64_t c : sc.chunks[0]) {
      cache.append(id, {token_chunk{c, span<const float>(k_in.data() + done * kvh * ck, static_cast<std::size_t>(c * kvh * ck)), {}},
                        token_chunk{c, span<const float>(v_in.data() + done * kvh * cv, static_cast<std::size_t>(c * kvh * cv)), {}}});
      done += c;
    }
    const double scale = rc.scale > 0.0f ? rc.scale : 1.0 / std::sqrt(static_cast<double>(ck));
    for (std::int64_t t : sc.reads) {
      const read_inputs& in = inputs_at(t);
      read_request q;
      q.position = t;
      q.queries = span<const float>(in.queries);
      q.sinks = span<const float>(in.sinks);
      std::vector<float> out(static_cast<std::size_t>(reader.output_floats()));
      reader.read(cache, id, q, out.data());
      std::vector<const float*> kp, vp;
      for (std::int64_t u = 0; u <= t; ++u) {
        kp.push_back(k_in.data() + u * kvh * ck);
        vp.push_back(v_in.data() + u * kvh * cv);
      }
      const oracle_read_result want = oracle_read(rc.query_heads, kvh, ck, cv, scale, in.queries.data(),
                                                  rc.sink ? in.sinks.data() : nullptr, kp, vp);
      for (std::size_t i = 0; i < out.size(); ++i)
        if (!(std::abs(static_cast<double>(out[i]) - want.out[i]) <= opt_.tolerance.reads))
          return "read at token " + std::to_string(t) + " of " + std::to_string(n) + ": output[head " +
                 std::to_string(static_cast<std::int64_t>(i) / cv) + "][channel " + std::to_string(static_cast<std::int64_t>(i) % cv) +
                 "] = " + float_text(out[i]) + ", causal attention in double gives " + float_text(static_cast<float>(want.out[i]));
    }
    return std::nullopt;
  }

  result run_storage(const scenario& sc) {
    auto sub = make_subject(kit_cache_);
    const sequence_id id = sub->create();
    append_sequence_0(*sub, id, sc);
    const written w = write_alone(spec_.compressors, source{0}, sc.chunks[0], sc.forms[0]);
    result diff;
    for_each_stream([&](auto k, const auto& c) {
      if (diff) return;
      const stream_shape& st = shape_.streams[k];
      const std::int64_t H = st.kv_heads, C = st.channels, rope = stored_rope_channels(st);
      std::vector<float> stored(static_cast<std::size_t>(H * C));
      const std::int64_t entries = sub->entries(id, k);
      if (entries != static_cast<std::int64_t>(w.index[k].size())) {
        diff = "stream '" + c.config().name + "': the cache holds " + std::to_string(entries) + " entries, the write path made " +
               std::to_string(w.index[k].size());
        return;
      }
      for (std::int64_t j = 0; j < entries && !diff; ++j) {
        sub->read_entry(id, k, j, stored.data());
        for (std::int64_t h = 0; h < H && !diff; ++h) {
          const std::string m = storage_mismatch(st.storage, w.values[k].data() + (j * H + h) * C, stored.data() + h * C, C, rope);
          if (!m.empty()) diff = "stream '" + c.config().name + "' entry " + std::to_string(j) + " head " + std::to_string(h) + ": " + m;
        }
      }
    });
    if (diff || window_key_floats_ == 0) return diff;
    const raw_window_config& wc = kit_cache_.window;
    const std::int64_t n = sc.tokens(0);
    std::vector<float> row(static_cast<std::size_t>(window_key_floats_)), vrow(static_cast<std::size_t>(window_value_floats_));
    for (std::int64_t t = std::max({std::int64_t{0}, n - wc.tokens, sub->window_first(id)}); t < n; ++t) {
      const float* given = bank_window_keys_.data() + (track_start(0) + t) * window_key_floats_;
      sub->copy_window_key(id, t, span<float>(row));
      for (std::int64_t h = 0; h < wc.kv_heads; ++h) {
        const std::string m = storage_mismatch(wc.precision, given + h * wc.key_channels, row.data() + h * wc.key_channels,
                                               wc.key_channels, wc.rope_channels);
        if (!m.empty()) return "the window's key row of token " + std::to_string(t) + " head " + std::to_string(h) + ": " + m;
      }
      if (window_value_floats_ == 0) continue;
      const float* vgiven = bank_window_values_.data() + (track_start(0) + t) * window_value_floats_;
      sub->copy_window_value(id, t, span<float>(vrow));
      for (std::int64_t h = 0; h < wc.kv_heads; ++h) {
        const std::string m = storage_mismatch(wc.precision, vgiven + h * wc.value_channels, vrow.data() + h * wc.value_channels,
                                               wc.value_channels, 0);
        if (!m.empty()) return "the window's value row of token " + std::to_string(t) + " head " + std::to_string(h) + ": " + m;
      }
    }
    return std::nullopt;
  }

  const spec_type& spec_;
  options opt_;
  geometry geom_;
  cache_config kit_cache_;
  layer_shape shape_;
  std::optional<sparse_reader> reader_;
  std::int64_t max_junk_ = 0, max_pad_ = 0, track_rows_ = 0;
  // Tokens of the selecting cases (0: none; the sizes above exercise the selection or it has none)
  // and the rows of track 0, which holds them.
  std::int64_t selecting_tokens_ = 0, track0_rows_ = 0;
  static constexpr std::int64_t max_selecting_tokens = std::int64_t{1} << 16;
  cache_config host_history_cache_, selecting_cache_;
  coverage cov_;
  std::array<std::int64_t, N> payload_{}, logits_{};
  std::int64_t window_key_floats_ = 0, window_value_floats_ = 0;
  std::array<std::vector<float>, N> bank_payload_, bank_logits_;
  std::vector<float> bank_window_keys_, bank_window_values_;
  std::map<std::int64_t, read_inputs> read_inputs_;
  mutable std::array<pooling_oracle, N> builtin_oracles_{};
};

}  // namespace kit_detail

// Checks the layer against every property (the header comment), stopping at the first that fails.
template <class... Compressors>
report check(const layer_under_test<Compressors...>& layer, const options& opts = {}) {
  if (opts.front_door && !layer.subject) {
    layer_under_test<Compressors...> through_model = layer;
    through_model.subject = model_subject_factory<Compressors...>();
    kit_detail::conformance_run<Compressors...> run(through_model, opts);
    return run.all();
  }
  options own = opts;
  own.front_door = false;  // the layer's own subject is what runs
  kit_detail::conformance_run<Compressors...> run(layer, own);
  return run.all();
}

// One stream of `Policy` on its own: a tied K/V layer with a raw window of W tokens (its own
// channels), pages of 4 entries, and a reader of 2·kv_heads query heads with a sink (de-rotating
// the output when the policy turns its entries). `pool` is a pooling of yours with its weights,
// `oracle` its double-precision oracle.
template <class Policy>
report check_stream(const geometry& g, const stream_config& config, const stream_params& params = {},
                    const options& opts = {}, typename Policy::pooling pool = {}, pooling_oracle oracle = {}) {
  using stream = stream_compressor<Policy>;
  cache_config cc;
  cc.name = config.name + ".cache";
  cc.page_size = 4;
  cc.window.tokens = g.window;
  cc.window.kv_heads = config.kv_heads;
  cc.window.key_channels = config.channels;
  reader_config rc;
  rc.name = config.name + ".reader";
  rc.query_heads = 2 * config.kv_heads;
  rc.sink = true;
  rc.derotate_output = std::is_same_v<typename Policy::rope, rope_after_pool> && config.rope.channels >= 2;
  layer_under_test<stream> layer(layer_compressor<stream>(stream(g, config, params, std::move(pool))), cc, rc);
  layer.oracles[0] = std::move(oracle);
  return check(layer, opts);
}

// A DeepSeek-V4 layer preset (models/deepseek_v4.hpp: CSA, HCA or V4.1 CSA; fp32 or DeepSeek-V4's
// precision) with the learned parameters you give per stream (empty: zero gate biases, unit norm
// weights).
inline report check_preset(const presets::deepseek_layer& preset, bool precision = false,
                           const std::vector<stream_params>& params = {}, const options& opts = {}) {
  using stream = stream_compressor<presets::deepseek_v4_csa_policy>;
  const presets::deepseek_layer_preset p = presets::deepseek_preset(preset, 1, 0, precision);
  auto param = [&](std::size_t k) { return k < params.size() ? params[k] : stream_params{}; };
  if (p.indexer) {
    layer_under_test<stream, stream> layer(
        layer_compressor<stream, stream>(stream(p.geom, p.kv, param(0)), stream(p.geom, *p.indexer, param(1))), p.cache,
        p.reader);
    return check(layer, opts);
  }
  layer_under_test<stream> layer(layer_compressor<stream>(stream(p.geom, p.kv, param(0))), p.cache, p.reader);
  return check(layer, opts);
}

}  // namespace phasekv::testing
