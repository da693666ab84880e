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
// Indexer scores come from a fused xsimd kernel over whole pages (indexer_kernel.hpp); the
// attention logits and outputs are Eigen GEMMs over the gathered keys.
// A reader holds scratch space: use one reader per thread.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/rope.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/read/indexer_kernel.hpp"
#include "phasekv/read/softmax_state.hpp"
#include "phasekv/read/top_k.hpp"

namespace phasekv {

// Streams of a cache: "none" for an absent indexer.
inline constexpr std::size_t no_stream = static_cast<std::size_t>(-1);

struct reader_config {
  std::string name = "reader";
  std::int64_t query_heads = 1;
  float scale = 0.0f;            // logit scale; 0 means 1/sqrt(key channels)
  std::size_t key_stream = 0;
  std::size_t value_stream = 0;  // = key_stream for tied K/V
  std::size_t indexer_stream = no_stream;
  std::int64_t top_k = 0;        // 0: attend to every candidate; > 0 needs an indexer stream
  std::int64_t indexer_heads = 0;
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

 public:
  sparse_reader(const Cache& cache, reader_config config) : cache_(&cache), config_(std::move(config)) {
    validate();
    const auto& key_cfg = stream_config_of(config_.key_stream);
    if (config_.derotate_output) rope_ = rope_rotation(key_cfg.rope, key_cfg.channels);
    scale_ = config_.scale > 0.0f ? config_.scale : 1.0f / std::sqrt(static_cast<float>(key_channels_));
  }

  const reader_config& config() const noexcept { return config_; }
  std::int64_t output_floats() const noexcept { return config_.query_heads * value_channels_; }

  // Attention output of one query: out[query_heads][value channels].
  void read(sequence_id seq, const read_request& request, float* out, read_trace* trace = nullptr) {
    check(seq, request, out);
    const geometry& geom = cache_->compressors().geom();
    const std::int64_t t = request.position;
    const std::int64_t candidates = geom.visible_entries(t);

    // 1–2: candidates and selection.
    selection_.clear();
    if (config_.top_k > 0) {
      score_candidates(seq, request, candidates);
      select_top_k(span<const float>(scores_.data(), static_cast<std::size_t>(candidates)), config_.top_k, selection_);
    } else {
      selection_.resize(static_cast<std::size_t>(candidates));
      for (std::int64_t j = 0; j < candidates; ++j) selection_[static_cast<std::size_t>(j)] = {j, 0.0f};
    }

    // 3: gather the selected entries and the window tokens, then attend per KV head.
    const std::int64_t n_sel = static_cast<std::int64_t>(selection_.size());
    const std::int64_t n_win_tokens = config_window_tokens();
    const std::int64_t w_first = n_win_tokens > 0 ? std::max<std::int64_t>(0, t - n_win_tokens + 1) : t + 1;
    const std::int64_t n_win = t + 1 - w_first;
    gather_entries(seq, n_sel);
    gather_window(seq, w_first, n_win);

    const std::int64_t group = config_.query_heads / kv_heads_;
    const float* sinks = config_.sink ? request.sinks.data() : nullptr;
    if (trace) start_trace(*trace, candidates, n_sel, w_first, n_win);
    for (std::int64_t g = 0; g < kv_heads_; ++g) {
      const Eigen::Map<const matrix> q(request.queries.data() + g * group * key_channels_, group, key_channels_);
      attend_part(q, entry_keys_, entry_values_, config_.key_stream == config_.value_stream, g, n_sel, compressed_,
                  compressed_p_);
      attend_part(q, window_keys_, window_values_, cache_->tied_window(), g, n_win, window_, window_p_);
      merged_ = compressed_;
      merged_.merge(window_);
      merged_.finish(out + g * group * value_channels_, sinks ? sinks + g * group : nullptr);
      if (trace) add_trace(*trace, sinks ? sinks + g * group : nullptr);
    }
    if (trace) finish_trace(*trace);

    if (config_.derotate_output) {
      std::vector<float>& c = rope_cos_;
      c.resize(static_cast<std::size_t>(2 * rope_.pairs()));
      rope_.angles(static_cast<double>(t), c.data(), c.data() + rope_.pairs());
      for (std::int64_t h = 0; h < config_.query_heads; ++h)
        rope_.apply(out + h * value_channels_, c.data(), c.data() + rope_.pairs(), -1.0f);
    }
  }

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
    }
    if (config_.derotate_output) {
      require(config_.key_stream == config_.value_stream, n + ".derotate_output", "true",
              "applies to tied K/V only (key_stream == value_stream)");
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
    const std::int64_t tokens = cache_->tokens(seq);  // throws for an unknown sequence
    if (tokens == 0) detail::fail<input_error>(n + ": sequence", seq, "is empty: append the query's token first");
    if (r.position < 0 || r.position >= tokens)
      detail::fail<input_error>(n + ": request.position", r.position,
                                "must lie in [0, tokens = " + std::to_string(tokens) +
                                    "): the query's own token must be appended before it reads");
    if (config_window_tokens() > 0) {
      const std::int64_t first = std::max<std::int64_t>(0, r.position - config_window_tokens() + 1);
      const std::int64_t kept = cache_->window_first(seq);
      if (first < kept)
        detail::fail<input_error>(n + ": request.position", r.position,
                                  "needs window tokens from " + std::to_string(first) +
                                      ", but the cache keeps only tokens from " + std::to_string(kept));
    }
  }

  // I_j for every candidate j into scores_, page by page with the fused indexer kernel.
  void score_candidates(sequence_id seq, const read_request& r, std::int64_t candidates) {
    const page_pool& pool = cache_->pool(config_.indexer_stream);
    const auto& table = cache_->page_table(seq, config_.indexer_stream);
    const std::int64_t page_size = pool.layout().page_size;
    kernels::indexer<>::prepare(r.indexer_queries.data(), r.indexer_weights.data(), config_.indexer_heads,
                                indexer_channels_, indexer_queries_);
    scores_.resize(static_cast<std::size_t>(candidates));
    page_scratch_.resize(static_cast<std::size_t>(page_size * indexer_channels_));
    for (std::int64_t first = 0; first < candidates; first += page_size) {
      const std::int64_t count = std::min(page_size, candidates - first);
      const float* keys = page_floats(pool, table[static_cast<std::size_t>(first / page_size)], count);
      kernels::indexer<>::score(indexer_queries_, keys, count, scores_.data() + first);
    }
  }

  // A page's first `count` entries as fp32: the page itself, or a converted copy.
  const float* page_floats(const page_pool& pool, page_id page, std::int64_t count) {
    const page_layout& layout = pool.layout();
    if (layout.storage == storage_type::f32) return reinterpret_cast<const float*>(pool.base() + page * layout.page_stride_bytes);
    load_row(pool.base() + page * layout.page_stride_bytes, page_scratch_.data(), count * layout.entry_stride, layout.storage);
    return page_scratch_.data();
  }

  // The selected entries as fp32 rows, straight from the pages (one page-table lookup per read).
  void gather_entries(sequence_id seq, std::int64_t n) {
    gather_stream(seq, config_.key_stream, n, kv_heads_ * key_channels_, entry_keys_);
    if (config_.key_stream != config_.value_stream)
      gather_stream(seq, config_.value_stream, n, kv_heads_ * value_channels_, entry_values_);
  }
  void gather_stream(sequence_id seq, std::size_t stream, std::int64_t n, std::int64_t floats, matrix& rows) {
    const page_pool& pool = cache_->pool(stream);
    const auto& table = cache_->page_table(seq, stream);
    const std::int64_t page_size = pool.layout().page_size;
    rows.resize(n, floats);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t j = selection_[static_cast<std::size_t>(i)].index;
      pool.read_entry(table[static_cast<std::size_t>(j / page_size)], j % page_size, rows.row(i).data());
    }
  }

  void gather_window(sequence_id seq, std::int64_t first, std::int64_t n) {
    const bool tied = cache_->tied_window();
    window_keys_.resize(n, kv_heads_ * key_channels_);
    if (!tied) window_values_.resize(n, kv_heads_ * value_channels_);
    for (std::int64_t i = 0; i < n; ++i) {
      std::copy_n(cache_->window_key(seq, first + i), kv_heads_ * key_channels_, window_keys_.row(i).data());
      if (!tied)
        std::copy_n(cache_->window_value(seq, first + i), kv_heads_ * value_channels_, window_values_.row(i).data());
    }
  }

  // One part (entries or window) for the query heads of KV head g, as an online-softmax state;
  // `p` keeps exp(ℓ − m) for the trace.
  // With `tied`, the keys are also the values (`values` is not read).
  void attend_part(const Eigen::Map<const matrix>& q, const matrix& keys, const matrix& values, bool tied,
                   std::int64_t g, std::int64_t n, softmax_state& state, matrix& p) {
    state.reset(q.rows(), value_channels_);
    p.resize(q.rows(), n);
    if (n == 0) return;
    const auto k = keys.middleCols(g * key_channels_, key_channels_);
    p.noalias() = (q * k.transpose()) * scale_;
    if (tied) state.assign_block(p, k);
    else state.assign_block(p, values.middleCols(g * value_channels_, value_channels_));
  }

  void start_trace(read_trace& tr, std::int64_t candidates, std::int64_t n_sel, std::int64_t w_first, std::int64_t n_win) const {
    tr.candidates = candidates;
    tr.selected.resize(static_cast<std::size_t>(n_sel));
    tr.scores.clear();
    for (std::int64_t i = 0; i < n_sel; ++i) {
      tr.selected[static_cast<std::size_t>(i)] = selection_[static_cast<std::size_t>(i)].index;
      if (config_.top_k > 0) tr.scores.push_back(selection_[static_cast<std::size_t>(i)].score);
    }
    tr.entry_mass.assign(static_cast<std::size_t>(n_sel), 0.0f);
    tr.window_first = w_first;
    tr.window_token_mass.assign(static_cast<std::size_t>(n_win), 0.0f);
    tr.window_mass = 0.0f;
    tr.sink_mass = 0.0f;
  }

  // Adds the final probabilities of the heads of one group: exp(ℓ − m_part) · e^(m_part − m) / D.
  void add_trace(read_trace& tr, const float* sinks) const {
    for (Eigen::Index h = 0; h < compressed_p_.rows(); ++h) {
      const float norm = merged_.normaliser(h, sinks);
      const float m = merged_.max_logit(h);
      const float to_c = compressed_.empty(h) ? 0.0f : std::exp(compressed_.max_logit(h) - m) * norm;
      const float to_w = window_.empty(h) ? 0.0f : std::exp(window_.max_logit(h) - m) * norm;
      float total = 0.0f;
      for (Eigen::Index i = 0; i < compressed_p_.cols(); ++i) {
        const float p = compressed_p_(h, i) * to_c;
        tr.entry_mass[static_cast<std::size_t>(i)] += p;
        total += p;
      }
      for (Eigen::Index i = 0; i < window_p_.cols(); ++i) {
        const float p = window_p_(h, i) * to_w;
        tr.window_token_mass[static_cast<std::size_t>(i)] += p;
        tr.window_mass += p;
        total += p;
      }
      if (sinks) tr.sink_mass += std::max(0.0f, 1.0f - total);
    }
  }

  void finish_trace(read_trace& tr) const {
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

  // Scratch, reused across reads.
  std::vector<float> scores_, page_scratch_, rope_cos_;
  kernels::indexer<>::prepared indexer_queries_;
  std::vector<scored_entry> selection_;
  matrix entry_keys_, entry_values_, window_keys_, window_values_;
  matrix compressed_p_, window_p_;
  softmax_state compressed_, window_, merged_;
};

}  // namespace phasekv
