#pragma once
// The page pool: one allocation holding `capacity` fixed-size pages of compressed entries, a free
// list and a reference count per page (vLLM's block pool) — a page_allocator (the ids) paired with
// a page_arena (the memory). Sequences hold page tables of page ids; the pool owns the memory.
//
// Page layout — entry-major, "NHD" (FlashInfer's paged_kv_t convention, see page_layout):
//
//   page p: [entry_in_page: page_size][head: kv_heads][channel: channels], storage-type elements
//   element (p, e, h, c) at  base() + p·page_stride_bytes + e·entry_stride_bytes
//                                   + h·head_stride_bytes + c·element_bytes
//
// One entry (all heads × channels) is contiguous, so writing an entry is one row conversion and
// copying the first n entries of a page is one memcpy. Every page starts on a 64-byte boundary:
// the page stride is rounded up to 64 bytes (no padding in realistic configs, where a page is
// already a multiple of 64 bytes).
//
// fp8_e4m3_block (format/fp8.hpp) keeps the entry-major order, but a head is a block layout of
// fp8_head_layout::of(channels, rope_channels).bytes bytes — codes, bf16 RoPE channels, scales,
// padding to 8 bytes — not channels equal elements: 584 bytes for DeepSeek-V4's 512 channels with
// 64 RoPE channels. Its element is the byte, so the strides in elements equal the strides in bytes:
//
//   head h of entry (p, e) at  base() + p·page_stride_bytes + e·entry_stride_bytes + h·head_stride_bytes
//   head_stride_bytes = fp8 head bytes,  entry_stride_bytes = kv_heads · head_stride_bytes
//
// and channel c of that head lies where fp8_head_layout says (code c at byte c for c < channels −
// rope_channels). page_pool_config::rope_channels says how many trailing channels are RoPE
// channels; it must be 0 for the other storage types, whose channels are all alike.
//
// fp4_e2m1_hadamard (format/fp4.hpp) is laid out the same way with a head of
// fp4_head_layout::of(channels).bytes bytes — channels / 2 bytes of e2m1 codes, then one scale
// byte per 32 channels, no padding: 68 bytes for DeepSeek-V4's 128-channel indexer keys. Its
// channel count must be a power of two from 32 to 1024 (the Hadamard transform, the blocks).
//
// Memory: one contiguous block from the config's page_memory (the host's arena, pinned or
// huge-page memory; by default anonymous memory the OS commits on first write, page_memory.hpp).
// The pool never touches a page before handing it out and hands out the lowest free pages
// first, so resident memory follows the pages in use (pages_touched() bounds it), not the
// capacity. A page's contents are undefined until written; one allocated again holds whatever
// its previous owner wrote. Readers only read entries that were written.
//
// Reference counts: allocate() hands out a page with count 1; retain() adds a holder (a forked
// sequence sharing a full page); release() drops one and returns the page to the free list when
// the count reaches 0. The free list is intrusive (a next-index per page) and LIFO, so the page
// released last is reused first while it is still warm in cache.
//
// Thread safety:
//   - allocate / retain / release and the accounting queries may be called from several threads
//     at once. Every change of pool state (free list, reference counts, used-page count) happens
//     under one mutex, so each operation is atomic and all-or-nothing, and a page handed from
//     one thread's release to another thread's allocate is ordered by that mutex (the new owner's
//     writes happen after the old owner's last access). Reference counts are std::atomic only so
//     that refcount() and the "is this page allocated?" checks in the data accessors can read them
//     without the lock; they are never modified outside it. (Those checks catch a page the caller
//     never allocated or already released; they are diagnostics, not synchronisation — though
//     stores are release and loads acquire, so a writer that sees a count of 1 also sees every
//     access of the holder that released the page.) This is
//     the simplest design that is correct: retain/release are not hot (they run when sequences
//     fork or drop pages, not per token), so a lock-free free list would buy nothing worth its
//     subtlety.
//   - Page contents are not synchronised by the pool: one writer per page; a full page is
//     immutable and may be read by any number of threads at once. Publishing a page's contents
//     to readers in another thread is the caller's job (e.g. the lock that guards a page table).
//   - Moving a pool is not thread-safe, and a moved-from pool may only be destroyed or assigned to.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/cache/entry_io.hpp"
#include "phasekv/cache/page_allocator.hpp"
#include "phasekv/cache/page_arena.hpp"
#include "phasekv/cache/page_layout.hpp"
#include "phasekv/cache/page_memory.hpp"
#include "phasekv/format/storage.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/types.hpp"

namespace phasekv {

class page_pool {
 public:
  using page_id = phasekv::page_id;

  explicit page_pool(page_pool_config config) : config_(std::move(config)) {
    config_.validate();
    detail::allocate_or_fail([&] { ids_ = page_allocator(config_.name, config_.capacity); }, config_.name + ".capacity",
                             config_.capacity, config_.capacity * 8);
    arena_ = page_arena(config_);
  }

  page_pool(const page_pool&) = delete;
  page_pool& operator=(const page_pool&) = delete;
  page_pool(page_pool&&) noexcept = default;
  page_pool& operator=(page_pool&&) noexcept = default;
  ~page_pool() = default;

  const page_pool_config& config() const noexcept { return config_; }
  const std::string& name() const noexcept { return config_.name; }
  const page_layout& layout() const noexcept { return arena_.layout(); }

  // ---- allocation and reference counts (thread-safe; page_allocator.hpp) ---------------------

  // A free page with reference count 1. Throws capacity_error when none is left.
  page_id allocate() { return ids_.allocate(); }
  // `count` pages into out[0 … count), or capacity_error with the pool unchanged.
  void allocate(std::int64_t count, page_id* out) { ids_.allocate(count, out); }
  // Adds a holder to an allocated page.
  void retain(page_id id) { ids_.retain(id); }
  // Drops a holder; the page returns to the free list when the last holder is gone.
  void release(page_id id) { ids_.release(id); }
  // 0 for a free page. A snapshot: other threads may change it right after.
  std::int32_t refcount(page_id id) const { return ids_.refcount(id); }

  std::int64_t capacity() const noexcept { return config_.capacity; }
  std::int64_t used_pages() const { return ids_.used_pages(); }
  std::int64_t free_pages() const { return ids_.free_pages(); }
  // Memory one page occupies, including the padding to 64 bytes.
  std::int64_t bytes_per_page() const noexcept { return arena_.bytes_per_page(); }
  std::int64_t bytes_used() const { return used_pages() * bytes_per_page(); }
  // Pages ever handed out: [0, pages_touched()). Freed pages are reused before untouched ones, so
  // this is the most memory the pool can have made resident (the rest was never written).
  std::int64_t pages_touched() const { return ids_.pages_touched(); }
  // The whole block: capacity × bytes_per_page().
  std::int64_t bytes_reserved() const noexcept { return arena_.bytes_reserved(); }

  // ---- page contents (one writer per page; full pages may be read concurrently) -----------

  // Page 0; page p starts at base() + p · layout().page_stride_bytes. For interop views.
  std::byte* base() noexcept { return arena_.base(); }
  const std::byte* base() const noexcept { return arena_.base(); }

  // First byte of an allocated page.
  std::byte* data(page_id id) {
    ids_.require_allocated(id, "data");
    return arena_.page(id);
  }
  const std::byte* data(page_id id) const {
    ids_.require_allocated(id, "data");
    return arena_.page(id);
  }

  // Stores one entry (kv_heads × channels fp32, head-major) at `slot`, converted to the storage
  // type (fp8_e4m3_block: quantized, format/fp8.hpp; fp4_e2m1_hadamard: transformed and
  // quantized, format/fp4.hpp).
  void write_entry(page_id id, std::int64_t slot, const float* values) {
    ids_.require_allocated(id, "write_entry");
    require_slot(slot, "write_entry");
    require_pointer(values, "write_entry", "values");
    store_entries(layout(), values, 1, arena_.entry(id, slot));
  }

  // Loads the entry at `slot` into out (kv_heads × channels fp32; fp4_e2m1_hadamard: the stored,
  // transformed values).
  void read_entry(page_id id, std::int64_t slot, float* out) const {
    ids_.require_allocated(id, "read_entry");
    require_slot(slot, "read_entry");
    require_pointer(out, "read_entry", "out");
    load_entries(layout(), arena_.entry(id, slot), 1, out);
  }

  // Copies entries [0, count) of page `source` to the same slots of page `destination`: the
  // copy-on-write of a shared, partially filled last page.
  void copy_entries(page_id source, page_id destination, std::int64_t count) {
    ids_.require_allocated(source, "copy_entries");
    ids_.require_allocated(destination, "copy_entries");
    if (count < 0 || count > layout().page_size)
      detail::fail<input_error>(config_.name + ".copy_entries(count)", count,
                                "must lie in [0, page_size = " + std::to_string(layout().page_size) + "]");
    arena_.copy_entries(source, destination, count);
  }

 private:
  // The checks below run on every data access, so they build their messages only on failure.
  void require_slot(std::int64_t slot, const char* operation) const {
    if (slot < 0 || slot >= layout().page_size)
      detail::fail<input_error>(config_.name + "." + operation + "(slot)", slot,
                                "must lie in [0, page_size = " + std::to_string(layout().page_size) + ")");
  }
  void require_pointer(const void* pointer, const char* operation, const char* argument) const {
    if (pointer == nullptr)
      detail::fail<input_error>(config_.name + "." + operation + "(" + argument + ")", "null",
                                "must point to kv_heads × channels = " + std::to_string(layout().values_per_entry()) +
                                    " floats");
  }

  page_pool_config config_;
  page_allocator ids_;  // before the arena: a pool that cannot count its pages allocates no memory
  page_arena arena_;
};

}  // namespace phasekv
