#pragma once
// Sparse attention over a paged compressed cache (DESIGN.md §5), the way DeepSeek-V4's
// compressed sparse attention reads:
//
//   1. candidates  — the complete entries a query at position t may see: j < floor((t+1+lead)/S)
//   2. selection   — all of them (HCA), or the lightning indexer's top k:
//                      I_j = Σ_h w_h · ReLU(q^I_h · k^I_j)     (ties: lower j first)
//   3. attention   — over the selected entries plus the raw window tokens [t − N_win + 1, t],
//                    normalised jointly: logits scale·q·k, an optional per-head sink logit in the
//                    denominator only, output Σ p·v. The compressed and window parts are
//                    computed as separate online-softmax states and merged exactly.
//   4. GQA/MQA     — query head h reads KV head h / (query_heads / kv_heads).
//
// Tied K/V (one stream read as both, DeepSeek-V4): the output's RoPE channels carry the entries'
// rotations; `derotate_output` rotates them back by the query position, as DeepSeek-V4 does.
//
// Indexer scores come from a fused xsimd kernel over whole pages (indexer_kernel.hpp; in bf16,
// indexer_bf16_kernel.hpp, when reader_config::precision asks for it); attention
// runs a kernel with the query heads in SIMD lanes (attention_kernel.hpp) over row pointers: the
// selected entries and the window tokens are read where they lie (fp32 storage), never gathered.
//
// Parallelism (optional): with an executor (core/executor.hpp), scoring runs as chunks of pages
// (each with its own top-k, merged after) and attention as pieces of keys per KV head, merged
// through the online softmax in key order. The pieces have a fixed size, so results are
// bit-identical on every executor; the default runs them in order.
// A reader holds scratch space: use one reader per thread (or per executor). It keeps a pointer to
// its cache, which must outlive it; a read of a sequence must not overlap a write of it.
// Non-finite queries, indexer queries or weights, and sinks other than finite or −inf (no sink),
// are input_errors (docs/RELIABILITY.md lists every promise).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/executor.hpp"
#include "phasekv/core/rope.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/read/attention_kernel.hpp"
#include "phasekv/read/indexer_bf16_kernel.hpp"
#include "phasekv/read/indexer_kernel.hpp"
#include "phasekv/read/softmax_state.hpp"
#include "phasekv/read/top_k.hpp"
#include "phasekv/simd/finite.hpp"

namespace phasekv {

// Streams of a cache: "none" for an absent indexer.
inline constexpr std::size_t no_stream = static_cast<std::size_t>(-1);

// What the lightning indexer multiplies: fp32 queries and keys (widened from the indexer
// stream's storage), or — bf16 — queries rounded to bf16 against keys stored in bf16
// (indexer_bf16_kernel.hpp): products exact, sums in fp32, twice the throughput with AVX512-BF16
// and half the key bytes. Attention itself always runs in fp32.
enum class indexer_precision { f32, bf16 };

struct reader_config {
  std::string name = "reader";
  std::int64_t query_heads = 1;
  float scale = 0.0f;            // logit scale; 0 means 1/sqrt(key channels)
  std::size_t key_stream = 0;
  std::size_t value_stream = 0;  // = key_stream for tied K/V
  std::size_t indexer_stream = no_stream;
  std::int64_t top_k = 0;        // 0: attend to every candidate; > 0 needs an indexer stream
  std::int64_t indexer_heads = 0;
  indexer_precision precision = indexer_precision::f32;  // bf16: the indexer stream must be stored in bf16
  bool sink = false;             // read_request.sinks holds one logit per query head
  bool derotate_output = false;  // tied K/V with RoPE: rotate the output back by the query position
};

struct read_request {
  std::int64_t position = 0;             // t: the query token, already appended
  span<const float> queries;             // [query_heads][key channels], RoPE'd at t
  span<const float> indexer_queries;     // [indexer_heads][indexer channels] (top_k > 0)
  span<const float> indexer_weights;     // [indexer_heads] (top_k > 0)
  span<const float> sinks;               // [query_heads] (sink)
};

// What one read looked at, for the diagnostics. Masses are means over query heads; for each
// head the entries, the window and the sink together hold probability 1 (0 for a query that sees
// nothing — no entry, no window token, no sink — whose output is then all zeros).
struct read_trace {
  std::int64_t candidates = 0;
  std::vector<std::int64_t> selected;  // entry ids in rank order (index order without an indexer)
  std::vector<float> scores;           // their indexer scores (empty without an indexer)
  std::vector<float> entry_mass;       // attention mass per selected entry
  std::int64_t window_first = 0;       // window tokens read: [window_first, position]
  std::vector<float> window_token_mass;
  float window_mass = 0.0f;
  float sink_mass = 0.0f;
};

template <class Cache>
class sparse_reader {
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using attention_kernel = kernels::attention<>;

 public:
  sparse_reader(const Cache& cache, reader_config config) : cache_(&cache), config_(std::move(config)) {
    validate();
    const auto& key_cfg = stream_config_of(config_.key_stream);
    if (config_.derotate_output) rope_ = rope_rotation(key_cfg.rope, key_cfg.channels);
    scale_ = config_.scale > 0.0f ? config_.scale : 1.0f / std::sqrt(static_cast<float>(key_channels_));
  }

  const reader_config& config() const noexcept { return config_; }
  std::int64_t output_floats() const noexcept { return config_.query_heads * value_channels_; }

  // Where read() runs its parallel pieces (default: serially, on the calling thread). The
  // executor must outlive its use by this reader.
  void set_executor(executor& e) noexcept { executor_ = &e; }

  // Attention output of one query: out[query_heads][value channels].
  void read(sequence_id seq, const read_request& request, float* out, read_trace* trace = nullptr) {
    check(seq, request, out);
    const geometry& geom = cache_->compressors().geom();
    const std::int64_t t = request.position;
    const std::int64_t candidates = geom.visible_entries(t);

    // 1–2: candidates and selection.
    selected_ = config_.top_k > 0;
    if (selected_) select(seq, request, candidates);
    const std::int64_t n_entries = selected_ ? static_cast<std::int64_t>(selection_.size()) : candidates;

    // 3: attention over the keys [entries …, window tokens …], split into pieces of a fixed number
    // of keys per KV head — selected entries, every candidate in order, or window tokens — each
    // an online-softmax state, merged in key order.
    const std::int64_t n_win_tokens = config_window_tokens();
    const std::int64_t w_first = n_win_tokens > 0 ? std::max<std::int64_t>(0, t - n_win_tokens + 1) : t + 1;
    const std::int64_t n_win = t + 1 - w_first;
    find_window(seq, w_first, n_win);
    plan_pieces(n_entries, n_win);
    const std::int64_t group = config_.query_heads / kv_heads_;
    queries_.resize(static_cast<std::size_t>(kv_heads_));
    for (std::int64_t g = 0; g < kv_heads_; ++g)
      attention_kernel::prepare(request.queries.data() + g * group * key_channels_, group, key_channels_, scale_,
                                queries_[static_cast<std::size_t>(g)]);
    tracing_ = trace != nullptr;
    if (tracing_) {
      entry_logits_.resize(config_.query_heads, n_entries);
      window_logits_.resize(config_.query_heads, n_win);
      final_max_.resize(config_.query_heads);
      final_norm_.resize(config_.query_heads);
    }
    const std::int64_t n_pieces = static_cast<std::int64_t>(pieces_.size());
    piece_states_.resize(static_cast<std::size_t>(kv_heads_ * n_pieces));
    auto attend = [&](std::int64_t task) {
      attend_piece(seq, task / n_pieces, pieces_[static_cast<std::size_t>(task % n_pieces)],
                   piece_states_[static_cast<std::size_t>(task)]);
    };
    executor_->for_each(kv_heads_ * n_pieces, attend);
    for (std::int64_t g = 0; g < kv_heads_; ++g) {
      total_.reset(group, value_channels_);
      for (std::int64_t i = 0; i < n_pieces; ++i) total_.merge(piece_states_[static_cast<std::size_t>(g * n_pieces + i)].state);
      const float* sinks = config_.sink ? request.sinks.data() + g * group : nullptr;
      total_.finish(out + g * group * value_channels_, sinks);
      if (tracing_)
        for (std::int64_t h = 0; h < group; ++h) {
          final_max_[g * group + h] = total_.max_logit(h);
          final_norm_[g * group + h] = total_.normaliser(h, sinks);
        }
    }
    if (trace) write_trace(*trace, candidates, n_entries, w_first, n_win);

    if (config_.derotate_output) {
      std::vector<float>& c = rope_cos_;
      c.resize(static_cast<std::size_t>(2 * rope_.pairs()));
      rope_.angles(static_cast<double>(t), c.data(), c.data() + rope_.pairs());
      for (std::int64_t h = 0; h < config_.query_heads; ++h)
        rope_.apply(out + h * value_channels_, c.data(), c.data() + rope_.pairs(), -1.0f);
    }
  }

  // Sizes of the parallel pieces. Fixed (not derived from the executor) so that results never
  // depend on it: 4096 entries of indexer keys per scoring chunk (~2 MiB at 128 channels, one
  // L2-sized stream); 256 keys per attention piece: its values (512 KiB at 512 channels) are
  // still in the L2 when the output pass re-reads them, and a top-512 read with a 128-token
  // window splits three ways.
  static constexpr std::int64_t score_chunk_entries = 4096;
  static constexpr std::int64_t attention_piece_keys = 256;
  static constexpr std::int64_t max_selectable_entries = (std::int64_t{1} << 32) - 1;

 private:
  const stream_config& stream_config_of(std::size_t k) const { return cache_->compressors().config(k); }

  std::int64_t config_window_tokens() const noexcept { return cache_->config().window.tokens; }

  void validate() {
    using detail::require;
    const std::string& n = config_.name;
    const std::size_t streams = Cache::stream_count;
    require(config_.query_heads >= 1, n + ".query_heads", config_.query_heads, "must be at least 1");
    require(config_.key_stream < streams, n + ".key_stream", config_.key_stream,
            "must name a stream of the cache (it has " + std::to_string(streams) + ")");
    require(config_.value_stream < streams, n + ".value_stream", config_.value_stream,
            "must name a stream of the cache (it has " + std::to_string(streams) + ")");
    require(std::isfinite(config_.scale) && config_.scale >= 0.0f, n + ".scale", config_.scale,
            "must be finite and non-negative (0 = 1/sqrt(channels))");
    require(config_.top_k >= 0, n + ".top_k", config_.top_k, "must be non-negative (0 = no selection)");
    const stream_config& keys = stream_config_of(config_.key_stream);
    const stream_config& values = stream_config_of(config_.value_stream);
    kv_heads_ = keys.kv_heads;
    key_channels_ = keys.channels;
    value_channels_ = values.channels;
    require(values.kv_heads == kv_heads_, n + ".value_stream kv_heads", values.kv_heads,
            "must equal the key stream's kv_heads = " + std::to_string(kv_heads_));
    require(config_.query_heads % kv_heads_ == 0, n + ".query_heads", config_.query_heads,
            "must be a multiple of the key stream's kv_heads = " + std::to_string(kv_heads_));
    const raw_window_config& w = cache_->config().window;
    if (w.tokens > 0) {
      require(w.kv_heads == kv_heads_, n + ": cache window.kv_heads", w.kv_heads,
              "must equal the key stream's kv_heads = " + std::to_string(kv_heads_));
      require(w.key_channels == key_channels_, n + ": cache window.key_channels", w.key_channels,
              "must equal the key stream's channels = " + std::to_string(key_channels_));
      const std::int64_t wv = w.value_channels == 0 ? w.key_channels : w.value_channels;
      require(wv == value_channels_, n + ": cache window value channels", wv,
              "must equal the value stream's channels = " + std::to_string(value_channels_));
    }
    if (config_.top_k > 0) {
      require(config_.indexer_stream < streams, n + ".indexer_stream", static_cast<long long>(config_.indexer_stream),
              "must name a stream of the cache when top_k > 0");
      const stream_config& ix = stream_config_of(config_.indexer_stream);
      require(ix.kv_heads == 1, n + ": indexer stream kv_heads", ix.kv_heads, "must be 1");
      require(config_.indexer_heads >= 1, n + ".indexer_heads", config_.indexer_heads, "must be at least 1 when top_k > 0");
      indexer_channels_ = ix.channels;
      if (config_.precision == indexer_precision::bf16) {
        const storage_type stored = cache_->pool(config_.indexer_stream).layout().storage;
        require(stored == storage_type::bf16, n + ".precision", "bf16",
                std::string("needs the indexer stream stored in bf16 (cache_config.stream_storage), not ") +
                    to_string(stored));
      }
    }
    if (config_.derotate_output) {
      require(config_.key_stream == config_.value_stream, n + ".derotate_output", "true",
              "applies to tied K/V only (key_stream == value_stream)");
      // A stream's rope config means something only when its policy rotates the entries; the
      // compressor validated it then (rope.channels ≤ channels), and ignores it otherwise.
      require(cache_->compressors().applies_rope(config_.key_stream), n + ".derotate_output", "true",
              "needs a key stream whose policy applies RoPE (stream '" + keys.name + "' rotates nothing)");
      require(keys.rope.channels >= 2, n + ".derotate_output", "true",
              "needs RoPE channels in the key stream's config (rope.channels = " + std::to_string(keys.rope.channels) + ")");
    }
  }

  void check(sequence_id seq, const read_request& r, const float* out) const {
    const std::string& n = config_.name;
    auto require_span = [&](span<const float> s, std::int64_t expected, const char* what, const char* shape) {
      if (s.data() == nullptr && s.size() != 0)
        detail::fail<input_error>(n + ": request." + what + ".data()", "null", "must not be null when the size is not 0");
      if (static_cast<std::int64_t>(s.size()) != expected)
        detail::fail<input_error>(n + ": request." + what + ".size()", s.size(),
                                  "must be " + std::to_string(expected) + " (" + shape + ")");
    };
    if (out == nullptr) detail::fail<input_error>(n + ": out", "null", "must point to query_heads × value channels floats");
    require_span(r.queries, config_.query_heads * key_channels_, "queries", "query_heads × key channels");
    require_span(r.indexer_queries, config_.top_k > 0 ? config_.indexer_heads * indexer_channels_ : 0, "indexer_queries",
                 "indexer_heads × indexer channels, empty without top_k");
    require_span(r.indexer_weights, config_.top_k > 0 ? config_.indexer_heads : 0, "indexer_weights",
                 "indexer_heads, empty without top_k");
    require_span(r.sinks, config_.sink ? config_.query_heads : 0, "sinks", "query_heads when the sink is on, else empty");
    // Non-finite inputs would turn into a silently wrong selection (a NaN score ranks anywhere)
    // or an all-NaN output, so they are rejected. A sink of −inf is allowed: it means "no sink".
    require_finite(r.queries, "queries", false);
    require_finite(r.indexer_queries, "indexer_queries", false);
    require_finite(r.indexer_weights, "indexer_weights", false);
    require_finite(r.sinks, "sinks", true);
    const std::int64_t tokens = cache_->tokens(seq);  // throws for an unknown sequence
    if (tokens == 0) detail::fail<input_error>(n + ": sequence", seq, "is empty: append the query's token first");
    if (r.position < 0 || r.position >= tokens)
      detail::fail<input_error>(n + ": request.position", r.position,
                                "must lie in [0, tokens = " + std::to_string(tokens) +
                                    "): the query's own token must be appended before it reads");
    // Top-k ranks entries by 64-bit keys that hold a 32-bit index (top_k.hpp).
    if (config_.top_k > 0 && cache_->compressors().geom().visible_entries(r.position) > max_selectable_entries)
      detail::fail<input_error>(n + ": request.position", r.position,
                                "sees more than 2^32 − 1 entries, the most top-k selection can rank");
    if (config_window_tokens() > 0) {
      const std::int64_t first = std::max<std::int64_t>(0, r.position - config_window_tokens() + 1);
      const std::int64_t kept = cache_->window_first(seq);
      if (first < kept)
        detail::fail<input_error>(n + ": request.position", r.position,
                                  "needs window tokens from " + std::to_string(first) +
                                      ", but the cache keeps only tokens from " + std::to_string(kept));
    }
  }

  // One vectorised pass that only looks further when something is not finite (the common case
  // costs about a microsecond for DeepSeek-V4's 64 × 512 queries).
  void require_finite(span<const float> values, const char* what, bool allow_minus_infinity) const {
    if (kernels::all_finite(values.data(), static_cast<std::int64_t>(values.size()))) return;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const float v = values[i];
      if (std::isfinite(v) || (allow_minus_infinity && v == -std::numeric_limits<float>::infinity())) continue;
      detail::fail<input_error>(config_.name + ": request." + what + "[" + std::to_string(i) + "]", v,
                                allow_minus_infinity ? "must be finite or −inf (no sink)" : "must be finite");
    }
  }

  // Scoring and top-k, per chunk of whole pages (in parallel), then once more over the chunks'
  // winners: I_j into scores_, the top k in rank order into selection_.
  void select(sequence_id seq, const read_request& r, std::int64_t candidates) {
    const page_pool& pool = cache_->pool(config_.indexer_stream);
    const auto& table = cache_->page_table(seq, config_.indexer_stream);
    const std::int64_t page_size = pool.layout().page_size;
    const std::int64_t chunk = std::max<std::int64_t>(1, score_chunk_entries / page_size) * page_size;
    const std::int64_t chunks = (candidates + chunk - 1) / chunk;
    [[maybe_unused]] const bool bf16_dot = prepare_indexer(r);
    scores_.resize(static_cast<std::size_t>(candidates));
    score_tasks_.resize(static_cast<std::size_t>(chunks));
    auto score = [&](std::int64_t c) {
      score_task& task = score_tasks_[static_cast<std::size_t>(c)];
      const std::int64_t first = c * chunk, last = std::min(candidates, first + chunk);
      for (std::int64_t j = first; j < last; j += page_size) {
        const std::int64_t count = std::min(page_size, last - j);
        const page_id page = table[static_cast<std::size_t>(j / page_size)];
#if PHASEKV_HAS_BF16_DOT
        if (bf16_dot) {
          const auto* keys = reinterpret_cast<const std::uint16_t*>(pool.base() + page * pool.layout().page_stride_bytes);
          kernels::indexer_bf16::score(indexer_bf16_queries_, keys, pool.layout().entry_stride, count, scores_.data() + j);
          continue;
        }
#endif
        const float* keys = page_floats(pool, page, count, task.page);
        kernels::indexer<>::score(indexer_queries_, keys, count, scores_.data() + j);
      }
      rank_keys(span<const float>(scores_.data() + first, static_cast<std::size_t>(last - first)), first, task.best);
      keep_top_keys(task.best, config_.top_k, false);
    };
    executor_->for_each(chunks, score);
    selection_.clear();
    winners_.clear();
    for (const score_task& task : score_tasks_) winners_.insert(winners_.end(), task.best.begin(), task.best.end());
    keep_top_keys(winners_, config_.top_k, true);
    selection_.resize(winners_.size());
    for (std::size_t r = 0; r < winners_.size(); ++r) {
      const std::int64_t j = rank_key_index(winners_[r]);
      selection_[r] = {j, scores_[static_cast<std::size_t>(j)]};
    }
  }

  // The indexer queries in the layout of the kernel that will score them; true when that is the
  // bf16 dot-product kernel (bf16 precision, AVX512-BF16, an even channel count).
  bool prepare_indexer(const read_request& r) {
    const float* queries = r.indexer_queries.data();
    if (config_.precision == indexer_precision::bf16) {
#if PHASEKV_HAS_BF16_DOT
      if (kernels::indexer_bf16::supports(indexer_channels_)) {
        kernels::indexer_bf16::prepare(queries, r.indexer_weights.data(), config_.indexer_heads, indexer_channels_,
                                       indexer_bf16_queries_);
        return true;
      }
#endif
      rounded_queries_.resize(r.indexer_queries.size());
      kernels::round_to_bf16(queries, static_cast<std::int64_t>(r.indexer_queries.size()), rounded_queries_.data());
      queries = rounded_queries_.data();
    }
    kernels::indexer<>::prepare(queries, r.indexer_weights.data(), config_.indexer_heads, indexer_channels_,
                                indexer_queries_);
    return false;
  }

  // A page's first `count` entries as fp32 rows: the page itself, or a converted copy in `scratch`.
  static const float* page_floats(const page_pool& pool, page_id page, std::int64_t count, std::vector<float>& scratch) {
    const page_layout& layout = pool.layout();
    const std::byte* bytes = pool.base() + page * layout.page_stride_bytes;
    if (layout.storage == storage_type::f32) return reinterpret_cast<const float*>(bytes);
    scratch.resize(static_cast<std::size_t>(count * layout.entry_stride));
    load_row(bytes, scratch.data(), count * layout.entry_stride, layout.storage);
    return scratch.data();
  }

  // Where the window tokens [first, first + n) lie in the cache's ring (fp32 rows).
  void find_window(sequence_id seq, std::int64_t first, std::int64_t n) {
    window_keys_.resize(static_cast<std::size_t>(n));
    window_values_.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      window_keys_[static_cast<std::size_t>(i)] = cache_->window_key(seq, first + i);
      window_values_[static_cast<std::size_t>(i)] = cache_->window_value(seq, first + i);
    }
  }

  struct score_task {
    std::vector<float> page;         // a converted page (non-fp32 storage)
    std::vector<std::uint64_t> best;  // rank keys of this chunk's top k (top_k.hpp)
  };
  // A run of keys of one kind: ranks [first, first + count) of the selection, entries
  // [first, first + count) (no selection: every candidate), or window tokens [first, first + count)
  // of the read.
  enum class key_source { selected, candidates, window };
  struct piece {
    key_source source;
    std::int64_t first, count;
  };
  struct piece_state {
    softmax_state state;
    attention_kernel::aligned_floats logits;   // [keys][padded heads], then the probabilities
    std::vector<float> max, sum;               // per padded head
    std::vector<const float*> keys, values;    // the piece's rows, KV head g's channels
    std::vector<float> key_rows, value_rows;   // converted rows (non-fp32 storage)
  };

  // Pieces are never empty: a read without keys has no pieces, and its heads' states stay empty.
  void plan_pieces(std::int64_t n_entries, std::int64_t n_win) {
    pieces_.clear();
    const key_source entries = selected_ ? key_source::selected : key_source::candidates;
    for (std::int64_t i = 0; i < n_entries; i += attention_piece_keys)
      pieces_.push_back({entries, i, std::min(attention_piece_keys, n_entries - i)});
    for (std::int64_t i = 0; i < n_win; i += attention_piece_keys)
      pieces_.push_back({key_source::window, i, std::min(attention_piece_keys, n_win - i)});
  }

  // The state of the query heads of KV head g over one piece's keys.
  void attend_piece(sequence_id seq, std::int64_t g, const piece& pc, piece_state& ps) {
    const attention_kernel::prepared& q = queries_[static_cast<std::size_t>(g)];
    find_rows(seq, g, pc, ps);
    ps.logits.resize(static_cast<std::size_t>(pc.count * q.padded));
    attention_kernel::logits(q, ps.keys.data(), pc.count, ps.logits.data());
    if (tracing_) {
      matrix& kept = pc.source == key_source::window ? window_logits_ : entry_logits_;
      for (std::int64_t k = 0; k < pc.count; ++k)
        for (std::int64_t h = 0; h < q.heads; ++h) kept(g * q.heads + h, pc.first + k) = ps.logits[k * q.padded + h];
    }
    ps.max.resize(static_cast<std::size_t>(q.padded));
    ps.sum.resize(static_cast<std::size_t>(q.padded));
    attention_kernel::softmax(ps.logits.data(), pc.count, q.padded, ps.max.data(), ps.sum.data());
    float* out = ps.state.assign(q.heads, value_channels_, ps.max.data(), ps.sum.data());
    attention_kernel::output(ps.logits.data(), q.padded, q.heads, ps.values.data(), pc.count, value_channels_, out);
  }

  // Row pointers to KV head g's keys and values of a piece.
  void find_rows(sequence_id seq, std::int64_t g, const piece& pc, piece_state& ps) const {
    const auto n = static_cast<std::size_t>(pc.count);
    ps.keys.resize(n);
    ps.values.resize(n);
    if (pc.source == key_source::window) {
      for (std::size_t i = 0; i < n; ++i) {
        ps.keys[i] = window_keys_[static_cast<std::size_t>(pc.first) + i] + g * key_channels_;
        ps.values[i] = window_values_[static_cast<std::size_t>(pc.first) + i] + g * value_channels_;
      }
      return;
    }
    entry_rows(seq, config_.key_stream, g, key_channels_, pc, ps.key_rows, ps.keys);
    if (config_.key_stream == config_.value_stream) ps.values = ps.keys;
    else entry_rows(seq, config_.value_stream, g, value_channels_, pc, ps.value_rows, ps.values);
  }

  // KV head g's channels of the piece's entries in one stream: pointers into the pages (fp32
  // storage), or to rows converted into `converted`.
  void entry_rows(sequence_id seq, std::size_t stream, std::int64_t g, std::int64_t channels, const piece& pc,
                  std::vector<float>& converted, std::vector<const float*>& rows) const {
    const page_pool& pool = cache_->pool(stream);
    const page_layout& layout = pool.layout();
    const auto& table = cache_->page_table(seq, stream);
    const bool f32 = layout.storage == storage_type::f32;
    if (!f32) converted.resize(static_cast<std::size_t>(pc.count * channels));
    for (std::int64_t i = 0; i < pc.count; ++i) {
      const std::int64_t j =
          pc.source == key_source::selected ? selection_[static_cast<std::size_t>(pc.first + i)].index : pc.first + i;
      const std::byte* src = pool.base() + table[static_cast<std::size_t>(j / layout.page_size)] * layout.page_stride_bytes +
                             (j % layout.page_size) * layout.entry_stride_bytes + g * layout.head_stride_bytes;
      if (f32) {
        rows[static_cast<std::size_t>(i)] = reinterpret_cast<const float*>(src);
      } else {
        float* row = converted.data() + i * channels;
        load_row(src, row, channels, layout.storage);
        rows[static_cast<std::size_t>(i)] = row;
      }
    }
  }

  // The read's final probabilities, exp(ℓ − m) · normaliser per head, averaged over query heads.
  void write_trace(read_trace& tr, std::int64_t candidates, std::int64_t n_entries, std::int64_t w_first,
                   std::int64_t n_win) const {
    tr.candidates = candidates;
    tr.selected.resize(static_cast<std::size_t>(n_entries));
    tr.scores.clear();
    for (std::int64_t i = 0; i < n_entries; ++i) {
      tr.selected[static_cast<std::size_t>(i)] = selected_ ? selection_[static_cast<std::size_t>(i)].index : i;
      if (selected_) tr.scores.push_back(selection_[static_cast<std::size_t>(i)].score);
    }
    tr.entry_mass.assign(static_cast<std::size_t>(n_entries), 0.0f);
    tr.window_first = w_first;
    tr.window_token_mass.assign(static_cast<std::size_t>(n_win), 0.0f);
    tr.window_mass = 0.0f;
    tr.sink_mass = 0.0f;
    for (std::int64_t h = 0; h < config_.query_heads; ++h) {
      const float norm = final_norm_[h], m = final_max_[h];
      float total = 0.0f;
      for (std::int64_t i = 0; i < n_entries; ++i) {
        const float p = norm > 0.0f ? std::exp(entry_logits_(h, i) - m) * norm : 0.0f;
        tr.entry_mass[static_cast<std::size_t>(i)] += p;
        total += p;
      }
      for (std::int64_t i = 0; i < n_win; ++i) {
        const float p = norm > 0.0f ? std::exp(window_logits_(h, i) - m) * norm : 0.0f;
        tr.window_token_mass[static_cast<std::size_t>(i)] += p;
        tr.window_mass += p;
        total += p;
      }
      if (config_.sink) tr.sink_mass += std::max(0.0f, 1.0f - total);
    }
    const float inv = 1.0f / static_cast<float>(config_.query_heads);
    for (float& m : tr.entry_mass) m *= inv;
    for (float& m : tr.window_token_mass) m *= inv;
    tr.window_mass *= inv;
    tr.sink_mass *= inv;
  }

  const Cache* cache_;
  reader_config config_;
  rope_rotation rope_;
  float scale_ = 1.0f;
  std::int64_t kv_heads_ = 0, key_channels_ = 0, value_channels_ = 0, indexer_channels_ = 0;

  executor* executor_ = &default_executor();

  // Scratch, reused across reads.
  bool selected_ = false, tracing_ = false;
  std::vector<float> scores_, rope_cos_;
  kernels::indexer<>::prepared indexer_queries_;
#if PHASEKV_HAS_BF16_DOT
  kernels::indexer_bf16::prepared indexer_bf16_queries_;
#endif
  std::vector<float> rounded_queries_;  // bf16 precision without the bf16 kernel
  std::vector<scored_entry> selection_;
  std::vector<score_task> score_tasks_;
  std::vector<std::uint64_t> winners_;
  std::vector<piece> pieces_;
  std::vector<attention_kernel::prepared> queries_;  // per KV head
  std::vector<piece_state> piece_states_;  // [KV head][piece]
  softmax_state total_;
  std::vector<const float*> window_keys_, window_values_;  // the read's window rows in the ring
  matrix entry_logits_, window_logits_;    // per query head, for the trace
  Eigen::VectorXf final_max_, final_norm_;  // per query head, for the trace
};

}  // namespace phasekv
