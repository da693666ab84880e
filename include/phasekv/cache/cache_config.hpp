#pragma once
// What a paged_cache is built from (cache_config), what a sequence occupies (sequence_memory) and
// a batch's page tables in FlashInfer's CSR convention (paged_view): the types a host handles
// around a cache, apart from the cache itself (paged_cache.hpp).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "phasekv/cache/layer_shape.hpp"  // raw_window_config
#include "phasekv/cache/page_layout.hpp"
#include "phasekv/cache/sequence_view.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/types.hpp"
#include "phasekv/format/storage.hpp"

namespace phasekv {

class page_memory;
class page_pool;

struct cache_config {
  std::string name = "cache";
  std::int64_t page_size = 64;       // entries per page
  std::int64_t pages = 1024;         // capacity of each stream's pool
  storage_type storage = storage_type::f32;
  // Per stream, overriding `storage` (empty: every stream uses `storage`) — e.g. bf16 indexer
  // keys next to fp32 KV entries, for reader_config::indexer_precision = bf16. An
  // fp8_e4m3_block stream keeps its rope config's channels in bf16 when its policy applies RoPE
  // (DeepSeek-V4: 448 e4m3 channels + 64 bf16, 584 bytes an entry; format/fp8.hpp). An indexer
  // stream may be stored as fp4_e2m1_hadamard (DeepSeek-V4: 68 bytes an entry, format/fp4.hpp), for
  // reader_config::precision = indexer_precision::fp4; no other role may.
  std::vector<storage_type> stream_storage;
  std::int64_t history = 0;          // tokens remove_suffix may roll back beyond the minimum
  raw_window_config window;
  // Where the pools' pages live (an arena, pinned or huge-page memory; page_memory.hpp);
  // null = system_page_memory(), committed by the OS as pages are first written.
  page_memory* memory = nullptr;
  // Per stream, a pool shared with other caches — the other layers of a model draw their pages
  // from one budget, as vLLM's layers share one block pool. Empty, or a null
  // element, gives the stream a pool of its own (`pages` pages from `memory`). A shared pool's
  // page_size, kv_heads, channels and storage must be the stream's; its capacity and memory are
  // its own. Pages never move between caches: each cache holds, retains and releases only the
  // pages it allocated, so sharing changes which budget a page comes from, nothing else.
  std::vector<std::shared_ptr<page_pool>> shared_pools;

  void validate() const {
    using detail::require;
    require(page_size >= 1, name + ".page_size", page_size, "must be at least 1");
    require(pages >= 1, name + ".pages", pages, "must be at least 1");
    require(is_valid(storage), name + ".storage", static_cast<int>(storage), "is not a storage_type");
    for (std::size_t k = 0; k < stream_storage.size(); ++k)
      require(is_valid(stream_storage[k]), name + ".stream_storage[" + std::to_string(k) + "]",
              static_cast<int>(stream_storage[k]), "is not a storage_type");
    require(history >= 0 && history <= limits::max_history, name + ".history", history, "must lie in [0, 2^40]");
    window.validate(name + ".window");
    if (window.tokens > 0) {
      // Rows × (key + value floats) × 4 bytes: the ring every sequence allocates.
      const std::int64_t floats = window.kv_heads * (window.key_channels + window.value_channels);
      detail::checked_product(window.tokens + history, floats, limits::max_bytes / 4, name + ".window.tokens",
                              window.tokens, "each sequence's raw window ring (floats, with history)");
    }
  }

  static constexpr std::int64_t max_window_tokens = raw_window_config::max_tokens;
};

// What one sequence occupies.
struct sequence_memory {
  std::int64_t tokens = 0;
  std::int64_t entries = 0;            // summed over streams
  std::int64_t pages = 0;              // page references, summed over streams
  std::int64_t shared_pages = 0;       // of those, pages another sequence also holds
  std::int64_t page_bytes = 0;         // bytes of the referenced pages (shared ones in full)
  std::int64_t entry_bytes = 0;        // bytes of the entries themselves, without page rounding
  std::int64_t state_bytes = 0;        // pending compressor inputs and the raw window
  std::int64_t uncompressed_bytes = 0; // an uncompressed cache of the same tokens, shape and storage

  // Bytes an uncompressed cache of the same shape would need per byte of stored entries (≈ S).
  double compression_ratio() const noexcept {
    return entry_bytes > 0 ? static_cast<double>(uncompressed_bytes) / static_cast<double>(entry_bytes) : 0.0;
  }
};

// A batch of sequences' page tables for one stream in FlashInfer's CSR convention, plus the
// layout, so a host kernel can find entry e of batch row b with plain pointer arithmetic:
//   page = indices[indptr[b] + e / page_size], slot = e % page_size,
//   address = base + page · layout.page_stride_bytes + slot · layout.entry_stride_bytes
//             + head · layout.head_stride_bytes + channel · layout.element_bytes
// (fp8_e4m3_block: the head's block layout starts at the address without the channel term —
// 584 bytes per entry for DeepSeek-V4, FlashMLA's layout; format/fp8.hpp; fp4_e2m1_hadamard
// likewise, 68 bytes per DeepSeek-V4 indexer key, format/fp4.hpp).
// It is the batch of the rows' stream views (sequence_view.hpp, what the reader reads) with the
// CSR arrays derived from them. The view does not own anything; it is valid until the next call
// that writes the cache.
struct paged_view {
  const std::byte* base = nullptr;
  page_layout layout;
  std::vector<stream_view> rows;            // batch row b's stream view (its pages point into the cache)
  std::vector<std::int32_t> indptr;         // batch + 1
  std::vector<std::int32_t> indices;        // page ids, row after row
  std::vector<std::int32_t> last_page_len;  // entries in each row's last page (0 for no pages)
  std::vector<std::int64_t> entries;        // entries per row
};

}  // namespace phasekv
