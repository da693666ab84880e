#pragma once
// Sparse attention over paged compressed KV memory, the way DeepSeek-V4's
// compressed sparse attention reads:
//
//   1. candidates  — the complete entries a query at position t may see: j < floor((t+1+lead)/S)
//   2. selection   — all of them (HCA), the lightning indexer's top k (selection.hpp):
//                      I_j = Σ_h w_h · ReLU(q^I_h · k^I_j)     (ties: lower j first)
//                    or the entries the host selected (read_request::indices, read in its order)
//   3. attention   — over the selected entries plus the raw window tokens [t − N_win + 1, t],
//                    normalised jointly: logits scale·q·k, an optional per-head sink logit in the
//                    denominator only, output Σ p·v. The compressed and window parts are
//                    computed as separate online-softmax states and merged exactly.
//   4. GQA/MQA     — query head h reads KV head h / (query_heads / kv_heads).
//
// Tied K/V (one stream read as both, DeepSeek-V4): the output's RoPE channels carry the entries'
// rotations; `derotate_output` rotates them back by the query position, as DeepSeek-V4 does.
//
// The stages live apart: read_checks.hpp rejects a bad request before anything is written,
// selection.hpp scores and selects (a host can run it alone: entry_selector), this file plans the
// attention pieces, runs them and writes the outputs and the trace.
//
// What it reads: a sequence_view (cache/sequence_view.hpp) — per stream a page base, layout and
// page table, and the raw window ring — never the cache object itself. The reader is built from
// a layer_shape (cache/layer_shape.hpp): paged_cache::shape() for phasekv's own cache, or filled
// by hand by a host that keeps its pages in its own arena and builds the views itself. A view
// taken from a paged_cache and the cache read directly (read(cache, sequence, …)) give
// bit-identical results.
//
// Outputs (read_item): the attention output; the log-sum-exp per query head,
//
//   lse_h = ln( Σ_{i ∈ entries read ∪ window tokens} exp(ℓ_hi) + exp(sink_h) )
//
// (the sink term only when reader_config::sink is on; ℓ = scale · q·k, the scaled logits the
// softmax sees), so that (out, lse) is an exact softmax state: softmax_state::assign_normalised()
// turns it back into one, and merging it with another branch's (out', lse') gives attention over
// the union of both branches' keys. A host merging two branches turns the sink on in only one of
// them (it belongs in the denominator once). A read that sees nothing (no entry, no window token,
// no sink or a sink of −∞) gives lse = −∞ and a zero output, the identity of the merge.
// reader_config::lse = flashmla reports FlashMLA's instead: ln Σ exp(ℓ) over the keys alone
// (the sink only rescales the output; with_sink = ln(exp(lse) + exp(sink))) and +∞ for a query
// that sees no key.
// And optionally the selected entries: logical entry ids in rank order, and physical indices
// into the key stream's pages, page_id · page_size + slot (FlashMLA's sparse-decode indices),
// −1 in the slots past the number selected.
//
// Batched decode: read_batch() reads B sequences, each with its own position, queries, indexer
// inputs and top_k, as tasks on the executor: (sequence) preparation, (sequence × scoring chunk),
// (sequence) selection, then attention — (sequence × KV head) tasks that run their pieces in key
// order and merge as they go when there are enough of them to keep the executor busy, else
// (sequence × KV head × piece) tasks merged afterwards. Both orders perform the same floating-point
// operations in the same order, so a batched read is bit-identical to B single reads, on any
// executor.
//
// Kernels: the indexer's scores per page in fp32, bf16 or FP4 (kernels/indexer.hpp,
// kernels/indexer_bf16.hpp, kernels/indexer_fp4.hpp, as reader_config::precision says); attention
// with the query heads in SIMD lanes (kernels/attention.hpp) over row pointers, so the selected
// entries and window tokens are read where they lie, never gathered. FP8 entries and an FP8 raw
// window's rows are dequantized inside the kernel's passes (bit-identical to the fp32 read of the
// dequantized values); bf16/f16 entries are widened into scratch rows first, and indexer keys of
// any storage the chosen kernel does not read in place, page by page.
//
// Parallelism (optional): with an executor (core/executor.hpp), scoring runs as chunks of pages
// (one selection over all their scores after) and attention as pieces of keys per KV head, merged
// through the online softmax in key order. The pieces have a fixed size, so results are
// bit-identical on every executor; the default runs them in order.
// A reader holds scratch space: use one reader per thread (or per executor). It keeps no pointer
// to a cache: a view must stay valid, and its sequence unwritten, until the read returns.
// Non-finite queries, indexer queries or weights, and sinks other than finite or −inf (no sink),
// are input_errors (docs/RELIABILITY.md lists every promise).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/executor.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/rope.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/core/types.hpp"
#include "phasekv/kernels/attention.hpp"
#include "phasekv/read/detail/read_checks.hpp"
#include "phasekv/read/read_types.hpp"
#include "phasekv/read/selection.hpp"
#include "phasekv/read/softmax_state.hpp"
#include "phasekv/read/detail/top_k.hpp"

namespace phasekv {

namespace detail {
struct layout_access;  // tests/layout: reads the sizes of the reader's private scratch types
}  // namespace detail

class sparse_reader {
  using attention_kernel = kernels::attention<>;

  // A row-major table of floats (rows × cols), for the trace's per-head logits.
  struct float_table {
    std::int64_t cols = 0;
    std::vector<float> values;
    void resize(std::int64_t rows, std::int64_t columns) {
      cols = columns;
      values.resize(static_cast<std::size_t>(rows * columns));
    }
    float& operator()(std::int64_t r, std::int64_t c) noexcept { return values[static_cast<std::size_t>(r * cols + c)]; }
    float operator()(std::int64_t r, std::int64_t c) const noexcept {
      return values[static_cast<std::size_t>(r * cols + c)];
    }
  };

 public:
  // The config's streams left at from_roles follow the shape's roles (read/reader_streams.hpp);
  // config() returns them resolved.
  sparse_reader(layer_shape shape, reader_config config) : shape_(std::move(shape)), config_(std::move(config)) {
    const detail::read_dims dims = detail::check_reader_config(shape_, config_);
    config_ = resolve_reader_streams(shape_.streams, config_, config_.name);
    kv_heads_ = dims.kv_heads;
    key_channels_ = dims.key_channels;
    value_channels_ = dims.value_channels;
    indexer_channels_ = dims.indexer_channels;
    if (config_.top_k > 0 && config_.indexer_stream != no_stream) selector_.emplace(shape_, selection_of(config_));
    if (config_.derotate_output)
      rope_ = window_only() ? rope_rotation(shape_.window_rope, key_channels_)
                            : rope_rotation(shape_.streams[config_.key_stream].rope, shape_.streams[config_.key_stream].channels);
    scale_ = config_.scale > 0.0f ? config_.scale : 1.0f / std::sqrt(static_cast<float>(key_channels_));
  }
  // The reader of a cache's layer: sparse_reader(cache.shape(), config).
  template <class Cache, class = decltype(std::declval<const Cache&>().shape())>
  sparse_reader(const Cache& cache, reader_config config) : sparse_reader(cache.shape(), std::move(config)) {}

  const reader_config& config() const noexcept { return config_; }
  // No compressed stream: the layer reads its raw window alone (layer_shape.hpp).
  bool window_only() const noexcept { return shape_.streams.empty(); }
  const layer_shape& shape() const noexcept { return shape_; }
  std::int64_t output_floats() const noexcept { return config_.query_heads * value_channels_; }

  // Where reads run their parallel pieces (default: serially, on the calling thread). The
  // executor must outlive its use by this reader.
  void set_executor(executor& e) noexcept { executor_ = &e; }

  // Attention output of one query: out[query_heads][value channels].
  void read(const sequence_view& view, const read_request& request, float* out, read_trace* trace = nullptr) {
    read_item item;
    item.view = &view;
    item.request = request;
    item.out = out;
    item.trace = trace;
    run(span<const read_item>(&item, 1), true);
  }

  // The same through a cache: its view of the sequence, taken under one lock, read as above.
  template <class Cache>
  void read(const Cache& cache, sequence_id seq, const read_request& request, float* out, read_trace* trace = nullptr) {
    const sequence_view view = cache.view_of(seq);  // throws for an unknown sequence
    if (view.tokens == 0)
      detail::fail<input_error>(config_.name + ": sequence", seq, "is empty: append the query's token first");
    read(view, request, out, trace);
  }

  // B sequences in one call; bit-identical to B single reads. Every item is checked before
  // anything is written: a bad one throws input_error naming it ("items[3].request.position")
  // and leaves every output as it was.
  void read_batch(span<const read_item> items) { run(items, false); }

  // Sizes of the parallel pieces. Fixed (not derived from the executor) so that results never
  // depend on it: 4096 entries of indexer keys per scoring chunk (~2 MiB at 128 channels, one
  // L2-sized stream); 256 keys per attention piece: its values (512 KiB at 512 channels) are
  // still in the L2 when the output pass re-reads them, and a top-512 read with a 128-token
  // window splits three ways.
  static constexpr std::int64_t score_chunk_entries = entry_selector::score_chunk_entries;
  static constexpr std::int64_t attention_piece_keys = 256;
  static constexpr std::int64_t max_selectable_entries = entry_selector::max_selectable_entries;

 private:
  friend struct detail::layout_access;
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
    std::vector<float> key_rows, value_rows;   // converted rows (bf16, f16 storage)
    std::vector<const std::byte*> key_heads, value_heads;  // KV head g's blocks (fp8 storage)
    kernels::fp8_scratch fp8;                  // where the output pass widens fp8 values
  };
  // What a (sequence × KV head) task needs while it runs its pieces in order.
  struct attention_slot {
    piece_state piece;
    softmax_state total;
  };

  // One sequence of a read in flight: its plan and its scratch (kept across reads).
  struct sequence_work {
    const read_item* item = nullptr;
    std::int64_t position = 0, candidates = 0, top_k = 0, n_entries = 0, w_first = 0, n_win = 0;
    bool tracing = false;
    bool scored = false;                        // the indexer selected (not the host, not "all")
    entry_selector::state selection;            // the indexer's stages (selection.hpp)
    std::vector<scored_entry> host_selection;   // read_request::indices, in their order
    std::vector<std::int32_t> host_logical;     // physical read_request::indices, as logical ids
    span<const scored_entry> selected;          // what the read attends to: one of the two
    std::vector<float> rope_cos;
    std::vector<piece> pieces;
    std::vector<attention_kernel::prepared> queries;           // per KV head
    std::vector<const float*> window_keys, window_values;      // the read's window rows in the ring (f32)
    std::vector<const std::byte*> window_key_rows, window_value_rows;  // the same, FP8 window
    float_table entry_logits, window_logits;                   // per query head, for the trace
    std::vector<float> final_max, final_norm;                  // per query head, for the trace
  };

  // ---- checks of a read (read_checks.hpp) ------------------------------------------------------

  // The complete entries a query at t may see (none in a window-only layer).
  std::int64_t candidates_at(std::int64_t t) const noexcept { return window_only() ? 0 : shape_.geom.visible_entries(t); }

  static std::int64_t effective_top_k(const reader_config& c, const read_request& r) noexcept {
    return r.top_k < 0 ? c.top_k : r.top_k;
  }

  void check_item(const read_item& it, std::ptrdiff_t i) const {
    const read_request& r = it.request;
    const detail::field_name field{config_.name, i};
    if (it.out == nullptr) detail::fail<input_error>(field("out"), "null", "must point to query_heads × value channels floats");
    if (it.view == nullptr) detail::fail<input_error>(field("view"), "null", "must point to the sequence's view");
    detail::require_span_size(r.queries.size(), r.queries.data(), config_.query_heads * key_channels_,
                              field("request.queries"), "query_heads × key channels");
    const bool host = !r.indices.empty();
    if (host) {
      if (config_.top_k == 0)
        detail::fail<input_error>(field("request.indices"), "non-empty", "needs a reader that selects (top_k > 0)");
      if (r.indices.data() == nullptr)
        detail::fail<input_error>(field("request.indices.data()"), "null", "must not be null when the size is not 0");
      if (static_cast<std::int64_t>(r.indices.size()) > config_.top_k)
        detail::fail<input_error>(field("request.indices.size()"), r.indices.size(),
                                  "must be at most the reader's top_k = " + std::to_string(config_.top_k));
    } else if (config_.top_k > 0 && !selector_ && effective_top_k(config_, r) > 0) {
      detail::fail<input_error>(field("request.indices"), "empty",
                                "must name the entries to read: the reader has no indexer stream (indexer_stream = no_stream)");
    }
    // The indexer's inputs whenever the reader has one and the host did not select.
    detail::check_selection_request(selection_of(config_), indexer_channels_,
                                    {r.position, r.indexer_queries, r.indexer_weights, r.top_k}, selector_ && !host, field,
                                    "request.");
    detail::require_span_size(r.sinks.size(), r.sinks.data(), config_.sink ? config_.query_heads : 0, field("request.sinks"),
                              "query_heads when the sink is on, else empty");
    if ((it.selected_logical || it.selected_physical) && config_.top_k == 0)
      detail::fail<input_error>(field(it.selected_logical ? "selected_logical" : "selected_physical"), "non-null",
                                "needs a reader that selects (top_k > 0)");
    detail::require_finite(r.queries, field("request.queries"), false);
    detail::require_finite(r.sinks, field("request.sinks"), true);
    check_view(*it.view, it, field);
  }

  // The view holds what a read at the request's position touches, in the reader's shape.
  void check_view(const sequence_view& v, const read_item& it, const detail::field_name& field) const {
    const std::int64_t t = it.request.position;
    detail::check_view_common(v, t, shape_, field, "request.position");
    if (config_.derotate_output && !rope_.covers(t))
      detail::fail<input_error>(field("request.position"), t,
                                "must lie in the key stream's rope.table positions [0, " +
                                    std::to_string(rope_.table()->positions) +
                                    "): the output is rotated back at it with the host's table");
    const std::int64_t candidates = candidates_at(t);
    if (window_only()) return detail::check_window(v, t, shape_.window, field);
    if (config_.top_k > 0 && candidates > max_selectable_entries)
      detail::fail<input_error>(field("request.position"), t,
                                "sees more than 2^32 − 1 entries, the most top-k selection can rank");
    detail::check_stream(v, config_.key_stream, candidates, shape_, field);
    if (config_.value_stream != config_.key_stream) detail::check_stream(v, config_.value_stream, candidates, shape_, field);
    if (selector_ && it.request.indices.empty() && effective_top_k(config_, it.request) > 0 &&
        config_.indexer_stream != config_.key_stream && config_.indexer_stream != config_.value_stream)
      detail::check_stream(v, config_.indexer_stream, candidates, shape_, field);
    if (!it.request.indices.empty()) {
      const std::int64_t k = std::min<std::int64_t>(effective_top_k(config_, it.request),
                                                    static_cast<std::int64_t>(it.request.indices.size()));
      const span<const std::int32_t> ids = it.request.indices.subspan(0, static_cast<std::size_t>(k));
      const index_kind kind = it.request.indices_kind;
      if (kind == index_kind::logical) {
        detail::check_host_indices(ids, candidates, field("request.indices"));
      } else if (kind == index_kind::physical) {
        std::vector<std::int32_t> logical;
        detail::physical_to_logical(ids, v.streams[config_.key_stream], candidates, logical, field("request.indices"));
        detail::check_host_indices(logical, candidates, field("request.indices"));
      } else {
        detail::fail<input_error>(field("request.indices_kind"), static_cast<int>(kind), "is not an index_kind");
      }
    }
    if (it.selected_physical) detail::check_physical_ids(v, config_.key_stream, field("selected_physical"));
    detail::check_window(v, t, shape_.window, field);
  }

  // ---- the read ------------------------------------------------------------------------------

  // Every item checked first (so a bad one changes nothing), then the batch in waves of two
  // sequences per thread the executor runs (one on a serial executor, which needs no slack to
  // balance): each wave's scratch (prepared queries, scores, selections) is still in the caches
  // when its later phases use it, where phases over the whole batch would have evicted it
  // (bench/RESULTS.md, "Batched decode"). Waves change which sequences share a phase, never the
  // arithmetic of one sequence.
  void run(span<const read_item> items, bool single) {
    const std::size_t count = items.size();
    for (std::size_t i = 0; i < count; ++i) check_item(items[i], single ? -1 : static_cast<std::ptrdiff_t>(i));
    const std::int64_t threads = executor_->concurrency();
    const auto wave = static_cast<std::size_t>(threads <= 1 ? 1 : 2 * threads);
    for (std::size_t first = 0; first < count; first += wave)
      run_wave(items.subspan(first, std::min(wave, count - first)));
  }

  void run_wave(span<const read_item> items) {
    const std::size_t count = items.size();
    if (work_.size() < count) work_.resize(count);

    // The plan of every sequence, and the scoring tasks (sequence × chunk of whole pages).
    score_jobs_.clear();
    for (std::size_t s = 0; s < count; ++s) {
      sequence_work& w = work_[s];
      const read_request& r = items[s].request;
      w.item = &items[s];
      w.position = r.position;
      w.candidates = candidates_at(r.position);
      w.top_k = effective_top_k(config_, r);
      const std::int64_t n_win_tokens = shape_.window.tokens;
      w.w_first = n_win_tokens > 0 ? std::max<std::int64_t>(0, r.position - n_win_tokens + 1) : r.position + 1;
      w.n_win = r.position + 1 - w.w_first;
      w.tracing = items[s].trace != nullptr;
      w.scored = selector_ && r.indices.empty();
      w.selection.chunks = 0;
      if (w.scored) {
        selector_->plan(w.selection, *items[s].view, r.position, r.indexer_queries.data(), r.indexer_weights.data(),
                        w.top_k, false);
        for (std::int64_t c = 0; c < w.selection.chunks; ++c) score_jobs_.push_back({static_cast<std::int64_t>(s), c});
      }
    }

    auto prepare = [&](std::int64_t s) { prepare_sequence(work_[static_cast<std::size_t>(s)]); };
    executor_->for_each(static_cast<std::int64_t>(count), prepare);
    auto score = [&](std::int64_t job) {
      const auto [s, c] = score_jobs_[static_cast<std::size_t>(job)];
      selector_->score_chunk(work_[static_cast<std::size_t>(s)].selection, c);
    };
    executor_->for_each(static_cast<std::int64_t>(score_jobs_.size()), score);
    auto select = [&](std::int64_t s) { finish_selection(work_[static_cast<std::size_t>(s)]); };
    executor_->for_each(static_cast<std::int64_t>(count), select);

    // 3: attention over the keys [entries …, window tokens …] in pieces of a fixed number of keys
    // per KV head, each an online-softmax state merged in key order. With at least as many
    // (sequence × KV head) tasks as the executor runs at once, each task runs its pieces itself
    // and merges as it goes (its scratch stays in the core's caches); with fewer, pieces are
    // tasks of their own, merged afterwards. The merges are the same either way.
    const std::int64_t groups = static_cast<std::int64_t>(count) * kv_heads_;
    if (groups >= executor_->concurrency()) {
      auto attend = [&](std::int64_t task) {
        sequence_work& w = work_[static_cast<std::size_t>(task / kv_heads_)];
        attend_group(w, task % kv_heads_);
      };
      executor_->for_each(groups, attend);
    } else {
      piece_jobs_.clear();
      for (std::size_t s = 0; s < count; ++s)
        for (std::int64_t g = 0; g < kv_heads_; ++g)
          for (std::size_t p = 0; p < work_[s].pieces.size(); ++p)
            piece_jobs_.push_back({static_cast<std::int64_t>(s), g, static_cast<std::int64_t>(p)});
      if (piece_states_.size() < piece_jobs_.size()) piece_states_.resize(piece_jobs_.size());
      auto attend = [&](std::int64_t task) {
        const piece_job& j = piece_jobs_[static_cast<std::size_t>(task)];
        sequence_work& w = work_[static_cast<std::size_t>(j.sequence)];
        attend_piece(w, j.group, w.pieces[static_cast<std::size_t>(j.piece)], piece_states_[static_cast<std::size_t>(task)]);
      };
      executor_->for_each(static_cast<std::int64_t>(piece_jobs_.size()), attend);
      std::size_t task = 0;
      for (std::size_t s = 0; s < count; ++s)
        for (std::int64_t g = 0; g < kv_heads_; ++g) {
          total_.reset(config_.query_heads / kv_heads_, value_channels_);
          for (std::size_t p = 0; p < work_[s].pieces.size(); ++p) total_.merge(piece_states_[task++].state);
          finish_group(work_[s], g, total_);
        }
    }
    for (std::size_t s = 0; s < count; ++s)
      if (items[s].trace) write_trace(work_[s], *items[s].trace);
  }

  // Before scoring: the indexer queries in their kernel's layout (selection.hpp), the attention
  // queries per KV head, the window rows, the de-rotation angles.
  void prepare_sequence(sequence_work& w) {
    const read_item& it = *w.item;
    const read_request& r = it.request;
    if (w.scored) selector_->prepare(w.selection);
    const std::int64_t group = config_.query_heads / kv_heads_;
    w.queries.resize(static_cast<std::size_t>(kv_heads_));
    for (std::int64_t g = 0; g < kv_heads_; ++g)
      attention_kernel::prepare(r.queries.data() + g * group * key_channels_, group, key_channels_, scale_,
                                w.queries[static_cast<std::size_t>(g)]);
    find_window(w, it.view->window);
    if (config_.derotate_output) {
      w.rope_cos.resize(static_cast<std::size_t>(2 * rope_.pairs()));
      rope_.angles(static_cast<double>(w.position), w.rope_cos.data(), w.rope_cos.data() + rope_.pairs());
    }
  }

  // What the read attends to — the indexer's top k, the host's indices (−1 skipped, in their
  // order) or every candidate —, the selected-entry outputs, the attention pieces.
  void finish_selection(sequence_work& w) {
    const read_item& it = *w.item;
    const bool selecting = config_.top_k > 0;
    if (w.scored) {
      selector_->rank(w.selection);
      w.selected = span<const scored_entry>(w.selection.selection.data(), w.selection.selection.size());
    } else if (selecting) {
      span<const std::int32_t> indices = it.request.indices;
      const auto k = static_cast<std::size_t>(std::min<std::int64_t>(w.top_k, static_cast<std::int64_t>(indices.size())));
      if (it.request.indices_kind == index_kind::physical) {  // checked: every id translates
        detail::physical_to_logical(indices.subspan(0, k), it.view->streams[config_.key_stream], w.candidates,
                                    w.host_logical, "request.indices");
        indices = w.host_logical;
      }
      w.host_selection.clear();
      for (std::size_t r = 0; r < k; ++r)
        if (indices[r] >= 0) w.host_selection.push_back({indices[r], std::numeric_limits<float>::quiet_NaN()});
      w.selected = span<const scored_entry>(w.host_selection.data(), w.host_selection.size());
    }
    if (selecting) {
      const stream_view& keys = it.view->streams[config_.key_stream];
      entry_selector::write_ids(w.selected, keys, w.top_k, it.selected_logical, it.selected_physical);
    }
    w.n_entries = selecting ? static_cast<std::int64_t>(w.selected.size()) : w.candidates;
    plan_pieces(w);
    if (w.tracing) {
      w.entry_logits.resize(config_.query_heads, w.n_entries);
      w.window_logits.resize(config_.query_heads, w.n_win);
      w.final_max.resize(static_cast<std::size_t>(config_.query_heads));
      w.final_norm.resize(static_cast<std::size_t>(config_.query_heads));
    }
  }

  // Pieces are never empty: a read without keys has no pieces, and its heads' states stay empty.
  void plan_pieces(sequence_work& w) const {
    w.pieces.clear();
    const key_source entries = config_.top_k > 0 ? key_source::selected : key_source::candidates;
    for (std::int64_t i = 0; i < w.n_entries; i += attention_piece_keys)
      w.pieces.push_back({entries, i, std::min(attention_piece_keys, w.n_entries - i)});
    for (std::int64_t i = 0; i < w.n_win; i += attention_piece_keys)
      w.pieces.push_back({key_source::window, i, std::min(attention_piece_keys, w.n_win - i)});
  }

  // ---- attention -----------------------------------------------------------------------------

  // The query heads of KV head g over all the read's pieces, in key order, merged as they come.
  void attend_group(sequence_work& w, std::int64_t g) {
    attention_slot* slot = take_slot();
    struct give_back {
      sparse_reader* reader;
      attention_slot* slot;
      ~give_back() { reader->return_slot(slot); }
    } guard{this, slot};
    slot->total.reset(config_.query_heads / kv_heads_, value_channels_);
    for (const piece& pc : w.pieces) {
      attend_piece(w, g, pc, slot->piece);
      slot->total.merge(slot->piece.state);
    }
    finish_group(w, g, slot->total);
  }

  attention_slot* take_slot() {
    std::lock_guard<std::mutex> lock(slots_->mutex);
    if (slots_->free.empty()) {
      slots_->all.push_back(std::make_unique<attention_slot>());
      slots_->free.reserve(slots_->all.size());  // so that return_slot() never allocates
      return slots_->all.back().get();
    }
    attention_slot* slot = slots_->free.back();
    slots_->free.pop_back();
    return slot;
  }
  void return_slot(attention_slot* slot) noexcept {
    std::lock_guard<std::mutex> lock(slots_->mutex);
    slots_->free.push_back(slot);
  }

  // The state of the query heads of KV head g over one piece's keys.
  void attend_piece(sequence_work& w, std::int64_t g, const piece& pc, piece_state& ps) const {
    const attention_kernel::prepared& q = w.queries[static_cast<std::size_t>(g)];
    find_rows(w, g, pc, ps);
    const bool entries = pc.source != key_source::window;
    // A window-only layer has no streams: its pieces are all window pieces.
    const page_layout no_layout;
    const page_layout& key_layout = entries ? w.item->view->streams[config_.key_stream].layout : no_layout;
    const page_layout& value_layout = entries ? w.item->view->streams[config_.value_stream].layout : no_layout;
    // FP8 heads (entries of fp8 pools, or an FP8 window's rows) go to the kernel as bytes.
    const bool fp8_window = !entries && shape_.window.precision == storage_type::fp8_e4m3_block;
    const bool fp8_keys = entries ? key_layout.storage == storage_type::fp8_e4m3_block : fp8_window;
    const bool fp8_values = entries ? value_layout.storage == storage_type::fp8_e4m3_block : fp8_window;
    const fp8_head_layout key_format = entries ? key_layout.fp8() : window_key_head();
    const fp8_head_layout value_format = entries ? value_layout.fp8() : window_value_head();
    ps.logits.resize(static_cast<std::size_t>(pc.count * q.padded));
    // Tied FP8 K/V (DeepSeek-V4's entries and window): the logit pass keeps the keys it widens,
    // and the output pass reads them as fp32 rows — the same values, so the same bits.
    const bool tied_fp8 = fp8_keys && fp8_values && key_format.bytes == value_format.bytes &&
                          key_format.channels == value_format.channels &&
                          key_format.rope_channels == value_format.rope_channels && ps.key_heads == ps.value_heads;
    if (tied_fp8) {
      ps.fp8.slab.resize(static_cast<std::size_t>(pc.count * q.channels));
      ps.fp8.rows.resize(static_cast<std::size_t>(pc.count));
      for (std::int64_t k = 0; k < pc.count; ++k)
        ps.fp8.rows[static_cast<std::size_t>(k)] = ps.fp8.slab.data() + k * q.channels;
    }
    if (fp8_keys)
      attention_kernel::logits(q, kernels::fp8_heads{ps.key_heads.data(), key_format}, pc.count, ps.logits.data(),
                               tied_fp8 ? ps.fp8.slab.data() : nullptr);
    else
      attention_kernel::logits(q, ps.keys.data(), pc.count, ps.logits.data());
    if (w.tracing) {
      float_table& kept = pc.source == key_source::window ? w.window_logits : w.entry_logits;
      for (std::int64_t k = 0; k < pc.count; ++k)
        for (std::int64_t h = 0; h < q.heads; ++h) kept(g * q.heads + h, pc.first + k) = ps.logits[k * q.padded + h];
    }
    ps.max.resize(static_cast<std::size_t>(q.padded));
    ps.sum.resize(static_cast<std::size_t>(q.padded));
    attention_kernel::softmax(ps.logits.data(), pc.count, q.padded, ps.max.data(), ps.sum.data());
    float* out = ps.state.assign(q.heads, value_channels_, ps.max.data(), ps.sum.data());
    if (tied_fp8)
      attention_kernel::output(ps.logits.data(), q.padded, q.heads, ps.fp8.rows.data(), pc.count, value_channels_, out);
    else if (fp8_values)
      attention_kernel::output(ps.logits.data(), q.padded, q.heads,
                               kernels::fp8_heads{ps.value_heads.data(), value_format}, pc.count, value_channels_,
                               out, ps.fp8);
    else
      attention_kernel::output(ps.logits.data(), q.padded, q.heads, ps.values.data(), pc.count, value_channels_, out);
  }

  // KV head g's heads from the merged state: output, log-sum-exp, trace factors, de-rotation.
  void finish_group(sequence_work& w, std::int64_t g, const softmax_state& total) const {
    const read_item& it = *w.item;
    const std::int64_t group = config_.query_heads / kv_heads_;
    const float* sinks = config_.sink ? it.request.sinks.data() + g * group : nullptr;
    float* out = it.out + g * group * value_channels_;
    total.finish(out, sinks);
    if (it.lse && config_.lse == lse_convention::flashmla)
      for (std::int64_t h = 0; h < group; ++h) {
        const float keys_only = total.log_denominator(h, nullptr);
        it.lse[g * group + h] = keys_only == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::infinity() : keys_only;
      }
    else if (it.lse)
      for (std::int64_t h = 0; h < group; ++h) it.lse[g * group + h] = total.log_denominator(h, sinks);
    if (w.tracing)
      for (std::int64_t h = 0; h < group; ++h) {
        w.final_max[static_cast<std::size_t>(g * group + h)] = total.max_logit(h);
        w.final_norm[static_cast<std::size_t>(g * group + h)] = total.normaliser(h, sinks);
      }
    if (config_.derotate_output)
      for (std::int64_t h = 0; h < group; ++h)
        rope_.apply(out + h * value_channels_, w.rope_cos.data(), w.rope_cos.data() + rope_.pairs(), -1.0f);
  }

  // ---- rows ----------------------------------------------------------------------------------

  // An FP8 window's heads (window_view): keys with the layer's RoPE channels in bf16; values
  // the key heads when tied, else without RoPE channels.
  fp8_head_layout window_key_head() const noexcept {
    return fp8_head_layout::of(shape_.window.key_channels, shape_.window.rope_channels);
  }
  fp8_head_layout window_value_head() const noexcept {
    return shape_.window.value_channels == 0 ? window_key_head() : fp8_head_layout::of(shape_.window.value_channels, 0);
  }

  // Where the window tokens [w_first, w_first + n_win) lie in the ring: fp32 rows, or FP8 rows.
  void find_window(sequence_work& w, const window_view& ring) const {
    const auto n = static_cast<std::size_t>(w.n_win);
    if (ring.storage == storage_type::fp8_e4m3_block) {
      w.window_key_rows.resize(n);
      w.window_value_rows.resize(n);
      const std::int64_t key_bytes = ring.kv_heads * window_key_head().bytes;
      const std::int64_t value_bytes = ring.kv_heads * window_value_head().bytes;
      for (std::size_t i = 0; i < n; ++i) {
        const std::int64_t row = (w.w_first + static_cast<std::int64_t>(i)) % ring.rows;
        w.window_key_rows[i] = ring.key_bytes + row * key_bytes;
        w.window_value_rows[i] = ring.value_bytes + row * value_bytes;
      }
      return;
    }
    w.window_keys.resize(n);
    w.window_values.resize(n);
    const std::int64_t key_floats = ring.kv_heads * ring.key_channels, value_floats = ring.kv_heads * ring.value_channels;
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t row = (w.w_first + static_cast<std::int64_t>(i)) % ring.rows;
      w.window_keys[i] = ring.keys + row * key_floats;
      w.window_values[i] = ring.values + row * value_floats;
    }
  }

  // Row pointers to KV head g's keys and values of a piece.
  void find_rows(const sequence_work& w, std::int64_t g, const piece& pc, piece_state& ps) const {
    const auto n = static_cast<std::size_t>(pc.count);
    ps.keys.resize(n);
    ps.values.resize(n);
    if (pc.source == key_source::window && shape_.window.precision == storage_type::fp8_e4m3_block) {
      ps.key_heads.resize(n);
      ps.value_heads.resize(n);
      const std::int64_t key_head = window_key_head().bytes, value_head = window_value_head().bytes;
      for (std::size_t i = 0; i < n; ++i) {
        ps.key_heads[i] = w.window_key_rows[static_cast<std::size_t>(pc.first) + i] + g * key_head;
        ps.value_heads[i] = w.window_value_rows[static_cast<std::size_t>(pc.first) + i] + g * value_head;
      }
      return;
    }
    if (pc.source == key_source::window) {
      for (std::size_t i = 0; i < n; ++i) {
        ps.keys[i] = w.window_keys[static_cast<std::size_t>(pc.first) + i] + g * key_channels_;
        ps.values[i] = w.window_values[static_cast<std::size_t>(pc.first) + i] + g * value_channels_;
      }
      return;
    }
    const sequence_view& v = *w.item->view;
    entry_rows(w, v.streams[config_.key_stream], g, key_channels_, pc, ps.key_rows, ps.keys, ps.key_heads);
    if (config_.key_stream == config_.value_stream) {
      ps.values = ps.keys;
      ps.value_heads = ps.key_heads;
    } else {
      entry_rows(w, v.streams[config_.value_stream], g, value_channels_, pc, ps.value_rows, ps.values, ps.value_heads);
    }
  }

  // KV head g's channels of the piece's entries in one stream: pointers into the pages (fp32
  // storage), to rows converted into `converted` (bf16, f16), or to the heads' blocks (fp8,
  // which the kernel dequantizes itself).
  static void entry_rows(const sequence_work& w, const stream_view& sv, std::int64_t g, std::int64_t channels,
                         const piece& pc, std::vector<float>& converted, std::vector<const float*>& rows,
                         std::vector<const std::byte*>& heads) {
    const page_layout& layout = sv.layout;
    const bool f32 = layout.storage == storage_type::f32, fp8 = layout.storage == storage_type::fp8_e4m3_block;
    if (fp8) heads.resize(static_cast<std::size_t>(pc.count));
    else if (!f32) converted.resize(static_cast<std::size_t>(pc.count * channels));
    for (std::int64_t i = 0; i < pc.count; ++i) {
      const std::int64_t j =
          pc.source == key_source::selected ? w.selected[static_cast<std::size_t>(pc.first + i)].index : pc.first + i;
      const std::byte* src = sv.base + sv.pages[static_cast<std::size_t>(j / layout.page_size)] * layout.page_stride_bytes +
                             (j % layout.page_size) * layout.entry_stride_bytes + g * layout.head_stride_bytes;
      if (f32) {
        rows[static_cast<std::size_t>(i)] = reinterpret_cast<const float*>(src);
      } else if (fp8) {
        heads[static_cast<std::size_t>(i)] = src;
      } else {
        float* row = converted.data() + i * channels;
        load_row(src, row, channels, layout.storage);
        rows[static_cast<std::size_t>(i)] = row;
      }
    }
  }

  // ---- trace ---------------------------------------------------------------------------------

  // The read's final probabilities, exp(ℓ − m) · normaliser per head, averaged over query heads.
  void write_trace(const sequence_work& w, read_trace& tr) const {
    const bool selecting = config_.top_k > 0;
    const std::int64_t n_entries = w.n_entries, n_win = w.n_win;
    tr.candidates = w.candidates;
    tr.selected.resize(static_cast<std::size_t>(n_entries));
    tr.scores.clear();
    for (std::int64_t i = 0; i < n_entries; ++i) {
      tr.selected[static_cast<std::size_t>(i)] = selecting ? w.selected[static_cast<std::size_t>(i)].index : i;
      if (w.scored) tr.scores.push_back(w.selected[static_cast<std::size_t>(i)].score);
    }
    tr.entry_mass.assign(static_cast<std::size_t>(n_entries), 0.0f);
    tr.window_first = w.w_first;
    tr.window_token_mass.assign(static_cast<std::size_t>(n_win), 0.0f);
    tr.window_mass = 0.0f;
    tr.sink_mass = 0.0f;
    for (std::int64_t h = 0; h < config_.query_heads; ++h) {
      const float norm = w.final_norm[static_cast<std::size_t>(h)], m = w.final_max[static_cast<std::size_t>(h)];
      float total = 0.0f;
      for (std::int64_t i = 0; i < n_entries; ++i) {
        const float p = norm > 0.0f ? std::exp(w.entry_logits(h, i) - m) * norm : 0.0f;
        tr.entry_mass[static_cast<std::size_t>(i)] += p;
        total += p;
      }
      for (std::int64_t i = 0; i < n_win; ++i) {
        const float p = norm > 0.0f ? std::exp(w.window_logits(h, i) - m) * norm : 0.0f;
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

  struct score_job {
    std::int64_t sequence, chunk;
  };
  struct piece_job {
    std::int64_t sequence, group, piece;
  };

  layer_shape shape_;
  reader_config config_;
  rope_rotation rope_;
  float scale_ = 1.0f;
  std::int64_t kv_heads_ = 0, key_channels_ = 0, value_channels_ = 0, indexer_channels_ = 0;

  std::optional<entry_selector> selector_;  // the indexer's stages (top_k > 0 with an indexer stream)
  executor* executor_ = &default_executor();

  // Scratch, reused across reads.
  std::vector<sequence_work> work_;
  std::vector<score_job> score_jobs_;
  std::vector<piece_job> piece_jobs_;
  std::vector<piece_state> piece_states_;  // per piece task, when pieces are tasks of their own
  softmax_state total_;
  // Scratch of the (sequence × KV head) tasks running at once, handed out under a mutex (behind a
  // pointer, so the reader stays movable).
  struct slot_pool {
    std::mutex mutex;
    std::vector<std::unique_ptr<attention_slot>> all;
    std::vector<attention_slot*> free;
  };
  std::unique_ptr<slot_pool> slots_ = std::make_unique<slot_pool>();
};

}  // namespace phasekv
