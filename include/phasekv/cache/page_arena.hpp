#pragma once
// The memory of `capacity` pages of one layout: one block from a page_memory, page p at
// base() + p · layout().page_stride_bytes, 64-byte aligned. No ids, no counts: a page_pool pairs an
// arena with a page_allocator, and a model cache gives each layer and stream an arena indexed by
// its kind's allocator. The arena never touches a page, so resident memory follows the pages
// written (the OS commits system_page_memory() on first write).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "phasekv/cache/page_layout.hpp"
#include "phasekv/cache/page_memory.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/detail/limits.hpp"

namespace phasekv {

namespace detail {
// Gives an arena's block back to the page_memory it came from.
struct block_release {
  page_memory* source = nullptr;
  std::size_t bytes = 0;
  void operator()(std::byte* block) const noexcept { source->deallocate(block, bytes, page_layout::page_alignment); }
};
}  // namespace detail

class page_arena {
 public:
  page_arena() = default;
  // The block for a validated config's pages (config.memory, or system_page_memory()). Throws
  // capacity_error naming "<name>.capacity" when the memory cannot hold or allocate it.
  explicit page_arena(const page_pool_config& config) : layout_(page_layout::for_config(config)), capacity_(config.capacity) {
    const std::int64_t total_bytes = capacity_ * layout_.page_stride_bytes;
    page_memory& source = config.memory ? *config.memory : system_page_memory();
    const std::size_t room = source.capacity(page_layout::page_alignment);
    if (static_cast<std::uint64_t>(total_bytes) > room)
      detail::fail<capacity_error>(config.name + ".capacity", config.capacity,
                                   "needs " + std::to_string(total_bytes) + " bytes; its memory holds " +
                                       std::to_string(room) + " (page_memory::capacity)");
    detail::allocate_or_fail(
        [&] {
          void* block = source.allocate(static_cast<std::size_t>(total_bytes), page_layout::page_alignment);
          if (!block) throw std::bad_alloc();
          memory_ = block_ptr(static_cast<std::byte*>(block),
                              detail::block_release{&source, static_cast<std::size_t>(total_bytes)});
        },
        config.name + ".capacity", config.capacity, total_bytes);
    if (reinterpret_cast<std::uintptr_t>(memory_.get()) % page_layout::page_alignment != 0)
      detail::fail(config.name + ".memory", "a block at " + std::to_string(reinterpret_cast<std::uintptr_t>(memory_.get())),
                   "must be aligned to 64 bytes");
  }

  const page_layout& layout() const noexcept { return layout_; }
  std::int64_t capacity() const noexcept { return capacity_; }
  std::int64_t bytes_per_page() const noexcept { return layout_.page_stride_bytes; }
  std::int64_t bytes_reserved() const noexcept { return capacity_ * layout_.page_stride_bytes; }

  // Page 0; unchecked page addresses (callers check ids against their allocator).
  std::byte* base() noexcept { return memory_.get(); }
  const std::byte* base() const noexcept { return memory_.get(); }
  std::byte* page(page_id id) const noexcept { return memory_.get() + id * layout_.page_stride_bytes; }
  std::byte* entry(page_id id, std::int64_t slot) const noexcept { return page(id) + slot * layout_.entry_stride_bytes; }

  // Entries [0, count) of page `source` into the same slots of `destination`: the copy on write
  // of a shared, partially filled last page.
  void copy_entries(page_id source, page_id destination, std::int64_t count) const noexcept {
    if (source == destination || count <= 0) return;
    std::memcpy(page(destination), page(source), static_cast<std::size_t>(count * layout_.entry_stride_bytes));
  }

 private:
  using block_ptr = std::unique_ptr<std::byte, detail::block_release>;
  page_layout layout_;
  std::int64_t capacity_ = 0;
  block_ptr memory_;
};

}  // namespace phasekv
