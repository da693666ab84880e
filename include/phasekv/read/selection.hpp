#pragma once
// The selection stage of a sparse read on its own: DeepSeek-V4's lightning indexer over a
// sequence's candidate entries, then their top k.
//
//   candidates  j < floor((t + 1 + lead) / S)                      (geometry::visible_entries)
//   score       I_j = Σ_h w_h · ReLU(q^I_h · k^I_j)                 (h over indexer heads)
//   top k       the k largest I_j in rank order, ties by lower j
//
// Results: logical entry ids and physical ids (page_id · page_size + slot of
// selection_config::physical_stream — FlashMLA's sparse-decode `indices`), −1 past the number
// selected. The sparse reader runs exactly these stages (bit-identical selections); a host uses
// them on its own to score or select without attention queries, or to hand the indices to its
// own attention — and can hand indices of its own to the reader (read_request::indices).
//
// Scoring runs over whole pages with the kernel of the configured precision: fp32 (keys of any
// storage widened), bf16 (queries rounded to bf16 against bf16 keys, exact products; the
// AVX512-BF16 dot-product kernel where present), or FP4 (queries Hadamard-transformed and
// quantized like the keys, exact integer dot products). With an executor, scoring runs as chunks
// of pages of a fixed size, so results are bit-identical on every executor. A selector holds
// scratch: use one per thread. It keeps no pointer to a cache; a view must stay valid, and its
// sequence unwritten, until the call returns.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/cache/entry_io.hpp"  // load_entries
#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/executor.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/kernels/indexer_bf16.hpp"
#include "phasekv/kernels/indexer_fp4.hpp"
#include "phasekv/kernels/indexer.hpp"
#include "phasekv/read/detail/read_checks.hpp"
#include "phasekv/read/read_types.hpp"
#include "phasekv/read/detail/top_k.hpp"
#include "phasekv/detail/simd/config.hpp"

namespace phasekv {

class sparse_reader;
namespace detail {
struct layout_access;  // tests/layout: reads the sizes of private scratch types
}  // namespace detail

class entry_selector {
 public:
  entry_selector(layer_shape shape, selection_config config) : shape_(std::move(shape)), config_(std::move(config)) {
    detail::check_stream_shapes(shape_, config_.name);
    // A reader's selection (selection_of) may leave its streams to the roles: resolve them here.
    if (config_.indexer_stream == from_roles || config_.physical_stream == from_roles) {
      reader_config r;
      r.name = config_.name;
      r.top_k = std::max<std::int64_t>(config_.top_k, 1);
      r.key_stream = config_.physical_stream;
      r.value_stream = from_roles;
      r.indexer_stream = config_.indexer_stream;
      r = resolve_reader_streams(shape_.streams, r, config_.name);
      config_.indexer_stream = r.indexer_stream;
      config_.physical_stream = r.key_stream;
    }
    detail::require(config_.indexer_stream != no_stream, config_.name + ".indexer_stream", "no_stream",
                    "must name the indexer's stream: a selector scores entries");
    indexer_channels_ = detail::check_selection_config(shape_, config_);
  }
  // The selector of a cache's layer: entry_selector(cache.shape(), config).
  template <class Cache, class = decltype(std::declval<const Cache&>().shape())>
  entry_selector(const Cache& cache, selection_config config) : entry_selector(cache.shape(), std::move(config)) {}

  const selection_config& config() const noexcept { return config_; }
  const layer_shape& shape() const noexcept { return shape_; }
  // Where scoring runs its chunks (default: serially). The executor must outlive its use here.
  void set_executor(executor& e) noexcept { executor_ = &e; }

  // The entries a query at `position` may see: the length of score()'s output.
  std::int64_t candidates(std::int64_t position) const noexcept { return shape_.geom.visible_entries(position); }

  // I_j of every candidate into scores[0, candidates(position)); returns that count. scores must
  // hold at least that many floats; the rest are left as they were. request.top_k is not used.
  std::int64_t score(const sequence_view& view, const selection_request& request, span<float> scores) {
    const detail::field_name field{config_.name};
    check(view, request, field, false);
    const std::int64_t n = candidates(request.position);
    if (static_cast<std::int64_t>(scores.size()) < n || (scores.data() == nullptr && n > 0))
      detail::fail<input_error>(field("scores.size()"), scores.size(),
                                "must be at least candidates(request.position) = " + std::to_string(n));
    plan(state_, view, request.position, request.indexer_queries.data(), request.indexer_weights.data(), 0, true);
    run_scoring(state_);
    std::copy(state_.scores.begin(), state_.scores.begin() + n, scores.data());
    return n;
  }

  // The top k entries (k = request.top_k, −1: the config's) in rank order: logical ids, physical
  // ids and their scores, each output optional (empty) or holding at least k values, of which the
  // first k are written (−1, and NaN for scores, past the number selected). Returns the number
  // selected, min(k, candidates).
  std::int64_t select(const sequence_view& view, const selection_request& request, span<std::int32_t> logical,
                      span<std::int32_t> physical = {}, span<float> scores = {}) {
    const detail::field_name field{config_.name};
    check(view, request, field, !physical.empty());
    const std::int64_t k = request.top_k < 0 ? config_.top_k : request.top_k;
    auto require_room = [&](std::size_t size, const void* data, const char* what) {
      if (size != 0 && (static_cast<std::int64_t>(size) < k || data == nullptr))
        detail::fail<input_error>(field(what), size, "must be empty or hold at least top_k = " + std::to_string(k) + " values");
    };
    require_room(logical.size(), logical.data(), "logical.size()");
    require_room(physical.size(), physical.data(), "physical.size()");
    require_room(scores.size(), scores.data(), "scores.size()");
    plan(state_, view, request.position, request.indexer_queries.data(), request.indexer_weights.data(), k, false);
    run_scoring(state_);
    rank(state_);
    write_ids(state_, view, k, logical.empty() ? nullptr : logical.data(), physical.empty() ? nullptr : physical.data());
    for (std::int64_t r = 0; r < static_cast<std::int64_t>(scores.size()) && r < k; ++r)
      scores[static_cast<std::size_t>(r)] = r < static_cast<std::int64_t>(state_.selection.size())
                                                ? state_.selection[static_cast<std::size_t>(r)].score
                                                : std::numeric_limits<float>::quiet_NaN();
    return static_cast<std::int64_t>(state_.selection.size());
  }

  // The same through a cache: its view of the sequence.
  template <class Cache>
  std::int64_t score(const Cache& cache, std::int64_t seq, const selection_request& request, span<float> scores) {
    return score(cache.view_of(seq), request, scores);
  }
  template <class Cache>
  std::int64_t select(const Cache& cache, std::int64_t seq, const selection_request& request,
                      span<std::int32_t> logical, span<std::int32_t> physical = {}, span<float> scores = {}) {
    return select(cache.view_of(seq), request, logical, physical, scores);
  }

  // Entries per scoring chunk: 4096 entries of indexer keys (~2 MiB at 128 channels, one
  // L2-sized stream), rounded to whole pages. Fixed, so results never depend on the executor.
  static constexpr std::int64_t score_chunk_entries = 4096;
  // Top-k ranks entries by 64-bit keys that hold a 32-bit index (top_k.hpp).
  static constexpr std::int64_t max_selectable_entries = (std::int64_t{1} << 32) - 1;

 private:
  friend class sparse_reader;  // runs the stages below inside its own task graph
  friend struct detail::layout_access;

  // Which kernel scores the indexer keys.
  enum class kernel_path { f32, bf16_dot, fp4 };

  // One query's selection in flight: its plan and its scratch (kept across calls).
  struct state {
    const sequence_view* view = nullptr;
    const float* indexer_queries = nullptr;
    const float* indexer_weights = nullptr;
    std::int64_t candidates = 0, top_k = 0, chunk = 0, chunks = 0;
    kernel_path path = kernel_path::f32;
    kernels::indexer_queries f32_queries;
    kernels::indexer_bf16_queries bf16_queries;  // used only where the bf16 kernel is built
    kernels::indexer_fp4_queries fp4_queries;
    std::vector<float> rounded_queries;  // bf16 precision without the bf16 kernel
    std::vector<float> scores;
    std::vector<std::vector<float>> pages;  // per chunk: a converted page (storage other than the kernel's)
    std::vector<std::uint64_t> winners, sort_scratch;
    std::vector<scored_entry> selection;
  };

  // What a selection of this view at request.position needs (physical: the physical stream too).
  void check(const sequence_view& view, const selection_request& r, const detail::field_name& field, bool physical) const {
    detail::check_view_common(view, r.position, shape_, field, "request.position");
    detail::check_selection_request(config_, indexer_channels_, r, true, field, "request.");
    const std::int64_t n = candidates(r.position);
    if (n > max_selectable_entries)
      detail::fail<input_error>(field("request.position"), r.position,
                                "sees more than 2^32 − 1 entries, the most top-k selection can rank");
    detail::check_stream(view, config_.indexer_stream, n, shape_, field);
    if (physical) {
      if (config_.physical_stream != config_.indexer_stream) detail::check_stream(view, config_.physical_stream, n, shape_, field);
      detail::check_physical_ids(view, config_.physical_stream, field("physical"));
    }
  }

  // ---- the stages (inputs checked) -------------------------------------------------------------

  // The plan: candidates and the scoring chunks — none when nothing is selected, unless `all`.
  void plan(state& s, const sequence_view& view, std::int64_t position, const float* queries, const float* weights,
            std::int64_t top_k, bool all) const {
    s.view = &view;
    s.indexer_queries = queries;
    s.indexer_weights = weights;
    s.candidates = candidates(position);
    s.top_k = top_k;
    s.chunks = 0;
    if (top_k > 0 || all) {
      const std::int64_t page_size = view.streams[config_.indexer_stream].layout.page_size;
      s.chunk = std::max<std::int64_t>(1, score_chunk_entries / page_size) * page_size;
      s.chunks = (s.candidates + s.chunk - 1) / s.chunk;
    }
  }

  // Before scoring: the indexer queries in the layout of the kernel that will score them — the
  // bf16 dot-product kernel (bf16 precision, AVX512-BF16, an even channel count), the FP4 kernel
  // (fp4 precision), or the fp32 kernel.
  void prepare(state& s) const {
    if (s.chunks == 0) return;
    s.scores.resize(static_cast<std::size_t>(s.candidates));
    if (s.pages.size() < static_cast<std::size_t>(s.chunks)) s.pages.resize(static_cast<std::size_t>(s.chunks));
    const float* queries = s.indexer_queries;
    const std::int64_t heads = config_.indexer_heads, channels = indexer_channels_;
    if (config_.precision == indexer_precision::fp4) {
      kernels::indexer_fp4::prepare(queries, s.indexer_weights, heads, channels, s.fp4_queries);
      s.path = kernel_path::fp4;
      return;
    }
    if (config_.precision == indexer_precision::bf16) {
#if PHASEKV_HAS_BF16_DOT
      if (kernels::indexer_bf16::supports(channels)) {
        kernels::indexer_bf16::prepare(queries, s.indexer_weights, heads, channels, s.bf16_queries);
        s.path = kernel_path::bf16_dot;
        return;
      }
#endif
      s.rounded_queries.resize(static_cast<std::size_t>(heads * channels));
      kernels::round_to_bf16(queries, heads * channels, s.rounded_queries.data());
      queries = s.rounded_queries.data();
    }
    kernels::indexer<>::prepare(queries, s.indexer_weights, heads, channels, s.f32_queries);
    s.path = kernel_path::f32;
  }

  // Scores I_j of chunk c (whole pages) into s.scores.
  void score_chunk(state& s, std::int64_t c) const {
    const stream_view& sv = s.view->streams[config_.indexer_stream];
    const page_layout& layout = sv.layout;
    const std::int64_t page_size = layout.page_size;
    std::vector<float>& converted = s.pages[static_cast<std::size_t>(c)];
    const std::int64_t first = c * s.chunk, last = std::min(s.candidates, first + s.chunk);
    for (std::int64_t j = first; j < last; j += page_size) {
      const std::int64_t count = std::min(page_size, last - j);
      const std::byte* bytes = sv.base + sv.pages[static_cast<std::size_t>(j / page_size)] * layout.page_stride_bytes;
      // The next page's keys, prefetched while this page's last entries are scored (fp32 and
      // FP4 pages: other storage is converted into scratch first).
      const std::byte* next = nullptr;
      std::int64_t next_count = 0;
      if (j + page_size < last) {
        next = sv.base + sv.pages[static_cast<std::size_t>((j + page_size) / page_size)] * layout.page_stride_bytes;
        next_count = std::min(page_size, last - j - page_size);
      }
      if (s.path == kernel_path::fp4) {
        kernels::indexer_fp4::score(s.fp4_queries, bytes, layout.entry_stride_bytes, count, s.scores.data() + j, next,
                                    next_count);
        continue;
      }
#if PHASEKV_HAS_BF16_DOT
      if (s.path == kernel_path::bf16_dot) {
        kernels::indexer_bf16::score(s.bf16_queries, reinterpret_cast<const std::uint16_t*>(bytes), layout.entry_stride,
                                     count, s.scores.data() + j);
        continue;
      }
#endif
      const bool f32 = layout.storage == storage_type::f32;
      const float* keys = reinterpret_cast<const float*>(bytes);
      if (!f32) {
        converted.resize(static_cast<std::size_t>(count * layout.values_per_entry()));
        load_entries(layout, bytes, count, converted.data());
        keys = converted.data();
      }
      kernels::indexer<>::score(s.f32_queries, keys, count, s.scores.data() + j,
                                f32 ? reinterpret_cast<const float*>(next) : nullptr, f32 ? next_count : 0);
    }
  }

  // The top k of all chunks' scores in rank order.
  void rank(state& s) const {
    s.selection.clear();
    select_top_keys(span<const float>(s.scores.data(), static_cast<std::size_t>(s.chunks > 0 ? s.candidates : 0)), 0,
                    s.top_k, s.winners, s.sort_scratch);
    s.selection.resize(s.winners.size());
    for (std::size_t r = 0; r < s.winners.size(); ++r) {
      const std::int64_t j = rank_key_index(s.winners[r]);
      s.selection[r] = {j, s.scores[static_cast<std::size_t>(j)]};
    }
  }

  // Logical ids and physical ids of `selection` in rank order, −1 after, `width` of each.
  static void write_ids(span<const scored_entry> selection, const stream_view& ids, std::int64_t width,
                        std::int32_t* logical, std::int32_t* physical) {
    const std::int64_t page_size = ids.layout.page_size;
    for (std::int64_t r = 0; r < width; ++r) {
      const auto rank = static_cast<std::size_t>(r);
      const std::int64_t j = rank < selection.size() ? selection[rank].index : -1;
      if (logical) logical[r] = static_cast<std::int32_t>(j);
      if (physical)
        physical[r] =
            j < 0 ? -1 : static_cast<std::int32_t>(ids.pages[static_cast<std::size_t>(j / page_size)] * page_size + j % page_size);
    }
  }
  void write_ids(const state& s, const sequence_view& view, std::int64_t width, std::int32_t* logical,
                 std::int32_t* physical) const {
    write_ids(span<const scored_entry>(s.selection.data(), s.selection.size()), view.streams[config_.physical_stream], width,
              logical, physical);
  }

  void run_scoring(state& s) {
    prepare(s);
    auto score = [&](std::int64_t c) { score_chunk(s, c); };
    executor_->for_each(s.chunks, score);
  }

  layer_shape shape_;
  selection_config config_;
  std::int64_t indexer_channels_ = 0;
  executor* executor_ = &default_executor();
  state state_;
};

}  // namespace phasekv
