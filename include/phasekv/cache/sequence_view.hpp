#pragma once
// A non-owning view of one sequence's KV memory, as the reader reads it: per
// stream the pages (base, layout, page table, entry count), the raw window ring, the token count.
// Data only, no engine code: paged_cache::view_of() fills one under a single lock, and a host
// that owns its KV memory — its own arena, its own page tables — fills one by hand and reads it
// through sparse_reader the same way. Engines build dozens per step, so a view holds its streams
// in a fixed-capacity array and never allocates.
//
// Stream k's entry e (of entries [0, entries)) lives in page pages[e / page_size], slot
// e % page_size; its head h, channel c at
//
//   base + pages[e / page_size] · page_stride_bytes + (e % page_size) · entry_stride_bytes
//        + h · head_stride_bytes + c · element_bytes
//
// — FlashInfer's NHD paged layout with the page stride free, so a host may interleave other
// data between its pages (a vLLM-style [pages][K|V][slots][heads][channels] arena is two stream
// views with the same page table and bases 0 and slots·heads·channels elements apart). Within a
// page, entries and heads are packed: head_stride = channels, entry_stride = kv_heads · channels
// (the reader's kernels stream whole entries). page_layout::for_config() makes such a layout.
// FP8 entries (fp8_e4m3_block) are packed the same way with a head of fp8_head_layout bytes —
// head_stride = 584 bytes for DeepSeek-V4 — and layout.rope_channels = the stream's RoPE
// channels (format/fp8.hpp; stored_rope_channels in layer_shape.hpp). FP4 indexer keys
// (fp4_e2m1_hadamard) too, with a head of fp4_head_layout bytes — 68 for DeepSeek-V4's 128
// channels — and no RoPE channels apart (format/fp4.hpp).
// `capacity` is the number of pages from `base` the host's arena holds: the reader checks every
// page id it will touch against it, so a bad page table is an input_error, never a stray read.
//
// Raw window: token t's key row (kv_heads × key_channels fp32, already RoPE'd at t) is row
// t % rows of `keys`, its value row likewise in `values` (== keys for tied K/V). Tokens
// [first, tokens) are valid. A read at position t needs window tokens
// [max(0, t − N_win + 1), t] (N_win: the layer_shape's window.tokens). An FP8 window (storage =
// fp8_e4m3_block, DeepSeek-V4's: raw_window_config::precision) holds its rows as bytes instead:
// row t % rows of `key_bytes` is kv_heads FP8 heads of fp8_head_layout::of(key_channels,
// rope_channels) bytes each — 584 for DeepSeek-V4, the entries' format — and of `value_bytes`
// kv_heads heads of fp8_head_layout::of(value_channels, 0) bytes, or value_bytes == key_bytes
// for tied K/V (the values are the key heads, RoPE channels included); keys/values are unused.
// The reader dequantizes the rows inside the attention kernel, as it does FP8 entries.
//
// Coverage: a read at position t reads entries [0, geom.visible_entries(t)) of the streams it
// uses (key, value, and the indexer's when it selects), so each such stream view must hold at
// least that many (entries ≥ visible_entries(t), and pages cover them). A host view may hold more
// than geom.completed_entries(tokens) — the reader never looks past what the position sees — but
// not fewer. Validation names the field: "view.streams[1].entries = 7: ...".
//
// Geometry: `geom` states the stride, window, origin and anchor the entries were pooled with, so
// a reader built for another geometry refuses the view instead of reading entries as if they were
// its own (the page layouts of two geometries can be the same). paged_cache::view_of() sets it; a
// host view may leave it unstated (stride 0, the default), and the reader then takes the
// geometry on trust.
//
// Lifetime: a view borrows. One from paged_cache stays valid until the next call that writes that
// sequence (append, remove_suffix, copy onto it, free); reading it concurrently with appends to
// other sequences is safe (their pages are different or immutable, see paged_cache.hpp). Such a
// view carries a `stamp`: the cache, the sequence and how many times it had been written. The
// reader asks the cache whether the stamp is still current before it touches a page, so a view
// read after its sequence was freed, shortened or appended to is an input_error ("view: stale"),
// not a use after free. A host view leaves the stamp empty and is read on trust; the cache a
// stamped view came from must outlive the view (it owns the memory the view points into).

#include <array>
#include <cstddef>
#include <cstdint>

#include "phasekv/cache/page_layout.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/core/types.hpp"

namespace phasekv {

struct stream_view {
  const std::byte* base = nullptr;  // page 0 of the stream's arena
  page_layout layout;
  std::int64_t capacity = 0;        // pages the arena holds from base: page ids lie in [0, capacity)
  span<const page_id> pages;        // the sequence's page table
  std::int64_t entries = 0;         // complete entries of the sequence in this stream
};

struct window_view {
  const float* keys = nullptr;    // f32: [rows][kv_heads][key_channels]
  const float* values = nullptr;  // f32: [rows][kv_heads][value_channels]; == keys for tied K/V
  std::int64_t rows = 0;          // ring rows: token t in row t % rows
  std::int64_t first = 0;         // valid tokens [first, tokens)
  std::int64_t tokens = 0;
  std::int64_t kv_heads = 0;
  std::int64_t key_channels = 0;
  std::int64_t value_channels = 0;
  // An FP8 window (after the fields above, so that a host's aggregate initialisation of an f32
  // window stays as it was):
  storage_type storage = storage_type::f32;  // f32 or fp8_e4m3_block
  std::int64_t rope_channels = 0;            // fp8_e4m3_block: the last ones of a key head, in bf16
  const std::byte* key_bytes = nullptr;      // fp8_e4m3_block: [rows][kv_heads][key head bytes]
  const std::byte* value_bytes = nullptr;    // fp8_e4m3_block: [rows][kv_heads][value head bytes]; == key_bytes when tied
};

// Whether a view is still current: `current(owner, sequence, writes)` is the owner's answer
// (false once the sequence is freed or written again). Empty (current == nullptr) for host views.
struct view_stamp {
  const void* owner = nullptr;
  bool (*current)(const void* owner, std::int64_t sequence, std::uint64_t writes) = nullptr;
  std::int64_t sequence = 0;
  std::uint64_t writes = 0;
};

struct sequence_view {
  static constexpr std::size_t max_streams = 8;

  std::int64_t tokens = 0;  // tokens appended: a read's position lies in [0, tokens)
  std::array<stream_view, max_streams> streams{};
  std::size_t stream_count = 0;
  window_view window;
  // After the fields above, so that a host's aggregate initialisation stays as it was.
  geometry geom{0, 0, 0, anchor_mode::block_start};  // stride 0: not stated (see the top)
  view_stamp stamp;                                   // set by paged_cache::view_of (see the top)
};

}  // namespace phasekv
