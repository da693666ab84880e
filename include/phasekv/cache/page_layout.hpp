#pragma once
// A pool's shape (page_pool_config: entries per page, heads, channels, storage type, pages) and
// where its elements lie (page_layout): what a view of a sequence needs to hand pages to a kernel,
// without the pool itself (cache/page_pool.hpp). The layout is entry-major "NHD"; page_pool.hpp's
// header comment draws it.

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "phasekv/format/fp4.hpp"
#include "phasekv/format/fp8.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/types.hpp"

namespace phasekv {

class page_memory;

struct page_pool_config {
  std::string name = "pool";  // prefixes every error message, e.g. "pool.page_size = 0: …"
  std::int64_t page_size = 0;  // entries per page
  std::int64_t kv_heads = 0;
  std::int64_t channels = 0;
  storage_type storage = storage_type::f32;
  std::int64_t capacity = 0;  // pages
  // Where the pages live; null = system_page_memory(). Must outlive the pool.
  page_memory* memory = nullptr;
  // fp8_e4m3_block: the last rope_channels channels of each head, stored in bf16 (paged_cache sets
  // it from the stream's RoPE config). 0 for every other storage type.
  std::int64_t rope_channels = 0;

  // The largest pool the library agrees to describe (256 TiB): keeps every byte offset well
  // inside std::int64_t and std::size_t.
  static constexpr std::int64_t max_pool_bytes = limits::max_bytes;

  void validate() const {
    using detail::require;
    require(page_size >= 1, name + ".page_size", page_size, "must be at least 1");
    require(kv_heads >= 1, name + ".kv_heads", kv_heads, "must be at least 1");
    require(channels >= 1, name + ".channels", channels, "must be at least 1");
    require(is_valid(storage), name + ".storage", static_cast<int>(storage), "is not a storage_type");
    if (storage == storage_type::fp4_e2m1_hadamard)
      require(is_fp4_channel_count(channels), name + ".channels", channels,
              "must be a power of two in [32, 1024] for fp4_e2m1_hadamard storage (a Hadamard transform "
              "over the head, a scale per 32 channels)");
    if (storage == storage_type::fp8_e4m3_block)
      require(rope_channels >= 0 && rope_channels <= channels, name + ".rope_channels", rope_channels,
              "must lie in [0, channels = " + std::to_string(channels) + "]");
    else
      require(rope_channels == 0, name + ".rope_channels", rope_channels,
              std::string("must be 0 for ") + to_string(storage) + " storage (only fp8_e4m3_block keeps RoPE channels apart)");
    require(capacity >= 1, name + ".capacity", capacity, "must be at least 1");
    require(capacity <= std::numeric_limits<page_id>::max(), name + ".capacity", capacity,
            "must be at most 2^31 - 1 (page ids are 32-bit)");
    // Multiply step by step so no product can overflow before it is checked. A block head counts
    // as its bytes (fp8: at most 2 · channels + 8, so the channel count is bounded first; fp4:
    // fewer than channels).
    std::int64_t bytes = bytes_per_element(storage), per_head = channels;
    if (storage == storage_type::fp8_e4m3_block) {
      require(channels <= max_pool_bytes / 4, name + ".channels", channels, "makes the pool larger than 2^48 bytes");
      per_head = fp8_head_layout::of(channels, rope_channels).bytes;
    } else if (storage == storage_type::fp4_e2m1_hadamard) {
      per_head = fp4_head_layout::of(channels).bytes;
    }
    const std::pair<const char*, std::int64_t> factors[] = {
        {"channels", per_head}, {"kv_heads", kv_heads}, {"page_size", page_size}, {"capacity", capacity}};
    for (const auto& [field, factor] : factors) {
      require(factor <= max_pool_bytes / bytes, name + "." + field, factor,
              "makes the pool larger than 2^48 bytes");
      bytes *= factor;
    }
  }
};

// Where an element lives inside the pool, in elements and in bytes, ready to hand to a host
// kernel (FlashInfer's stride_page / stride_n / stride_h; channels have stride 1). For
// fp8_e4m3_block the element is a byte and a head is fp8() bytes, for fp4_e2m1_hadamard fp4()
// bytes (see the header comment).
struct page_layout {
  std::int64_t page_size = 0;
  std::int64_t kv_heads = 0;
  std::int64_t channels = 0;
  storage_type storage = storage_type::f32;
  std::int64_t element_bytes = 0;

  std::int64_t head_stride = 0;   // = channels (fp8, fp4: the head's bytes)
  std::int64_t entry_stride = 0;  // = kv_heads · head_stride
  std::int64_t page_stride = 0;   // = page_size · entry_stride, rounded up to a multiple of 64 bytes

  std::int64_t head_stride_bytes = 0;
  std::int64_t entry_stride_bytes = 0;
  std::int64_t page_stride_bytes = 0;

  std::int64_t rope_channels = 0;  // fp8_e4m3_block: trailing channels stored in bf16; else 0

  static constexpr std::int64_t page_alignment = 64;  // bytes; also a multiple of every element size

  // fp32 values one entry holds (what write_entry takes and read_entry gives).
  std::int64_t values_per_entry() const noexcept { return kv_heads * channels; }
  // The block layout of one head (fp8_e4m3_block only).
  fp8_head_layout fp8() const noexcept { return fp8_head_layout::of(channels, rope_channels); }
  // The block layout of one head (fp4_e2m1_hadamard only).
  fp4_head_layout fp4() const noexcept { return fp4_head_layout::of(channels); }

  // The element size and the head and entry strides of packed entries of this shape; the page
  // fields are left 0. Expects a valid shape (page_pool_config::validate's rules).
  static page_layout packed(storage_type storage, std::int64_t kv_heads, std::int64_t channels,
                            std::int64_t rope_channels = 0) noexcept {
    page_layout layout;
    layout.kv_heads = kv_heads;
    layout.channels = channels;
    layout.storage = storage;
    layout.element_bytes = bytes_per_element(storage);
    layout.rope_channels = rope_channels;
    layout.head_stride = storage == storage_type::fp8_e4m3_block      ? layout.fp8().bytes
                         : storage == storage_type::fp4_e2m1_hadamard ? layout.fp4().bytes
                                                                      : channels;
    layout.entry_stride = kv_heads * layout.head_stride;
    layout.head_stride_bytes = layout.head_stride * layout.element_bytes;
    layout.entry_stride_bytes = layout.entry_stride * layout.element_bytes;
    return layout;
  }

  // Expects a validated config.
  static page_layout for_config(const page_pool_config& config) noexcept {
    page_layout layout = packed(config.storage, config.kv_heads, config.channels, config.rope_channels);
    layout.page_size = config.page_size;
    const std::int64_t payload_bytes = config.page_size * layout.entry_stride_bytes;
    layout.page_stride_bytes = (payload_bytes + page_alignment - 1) / page_alignment * page_alignment;
    layout.page_stride = layout.page_stride_bytes / layout.element_bytes;
    return layout;
  }
};

}  // namespace phasekv
