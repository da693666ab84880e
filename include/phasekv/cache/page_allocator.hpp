#pragma once
// Page ids and their reference counts, without the pages' memory: `capacity` ids, a LIFO free
// list and a holder count per id (vLLM's block pool). A page_pool pairs one with one page_arena
// (its memory); a model cache pairs one per layer kind with an arena per layer and stream, so
// every layer of a kind indexes its entries by the same page table.
//
// allocate() hands out the lowest free id first on a fresh allocator and the id released last
// after that (warm in cache), with count 1; retain() adds a holder (a fork sharing a full page);
// release() drops one and frees the id when the count reaches 0.
//
// Thread safety: allocate / retain / release and the accounting queries may be called from several
// threads at once. Every change happens under one mutex, so each operation is atomic and
// all-or-nothing, and an id handed from one thread's release to another thread's allocate is
// ordered by it. Counts are std::atomic only so that refcount() and the "is this id allocated?"
// checks can read them without the lock; they are never modified outside it (stores release,
// loads acquire). Moving an allocator is not thread-safe; a moved-from one may only be destroyed
// or assigned to.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/core/types.hpp"

namespace phasekv {

class page_allocator {
 public:
  // No ids (a window-only kind's): allocates nothing, counts nothing.
  page_allocator() = default;
  // `name` prefixes every error message ("<name>.capacity = 8: …"). Expects capacity in
  // [1, 2^31 − 1] (page ids are 32-bit); throws std::bad_alloc when the counts cannot be allocated.
  page_allocator(std::string name, std::int64_t capacity)
      : name_(std::move(name)), capacity_(capacity), book_(std::make_unique<bookkeeping>(capacity)) {}

  const std::string& name() const noexcept { return name_; }
  std::int64_t capacity() const noexcept { return capacity_; }

  // A free id with reference count 1. Throws capacity_error when none is left.
  page_id allocate() {
    std::lock_guard<std::mutex> lock(book_->mutex);
    if (book_->free_head < 0)
      detail::fail<capacity_error>(name_ + ".capacity", capacity_, "no free page left (all pages are in use)");
    return pop_free_locked();
  }

  // `count` ids into out[0 … count), or capacity_error with the allocator unchanged.
  void allocate(std::int64_t count, page_id* out) {
    if (count < 0) detail::fail<input_error>(name_ + ".allocate(count)", count, "must be non-negative");
    if (count > 0 && out == nullptr)
      detail::fail<input_error>(name_ + ".allocate(count)", count, "needs a non-null output array");
    if (count == 0) return;  // (an allocator made with no capacity has no bookkeeping)
    std::lock_guard<std::mutex> lock(book_->mutex);
    const std::int64_t free = capacity_ - book_->used;
    if (count > free)
      detail::fail<capacity_error>(name_ + ".capacity", capacity_,
                                   "cannot allocate " + std::to_string(count) + (count == 1 ? " page" : " pages") +
                                       ", only " + std::to_string(free) + " free");
    for (std::int64_t i = 0; i < count; ++i) out[i] = pop_free_locked();
  }

  // Adds a holder to an allocated id.
  void retain(page_id id) {
    std::lock_guard<std::mutex> lock(book_->mutex);
    const std::int32_t count = allocated_refcount(id, "retain");
    if (count == std::numeric_limits<std::int32_t>::max())
      detail::fail<capacity_error>(name_ + ".retain(page)", id, "reference count is at its maximum");
    book_->refcounts[index(id)].store(count + 1, std::memory_order_release);
  }

  // Drops a holder; the id returns to the free list when the last holder is gone.
  void release(page_id id) {
    std::lock_guard<std::mutex> lock(book_->mutex);
    const std::int32_t count = allocated_refcount(id, "release");
    book_->refcounts[index(id)].store(count - 1, std::memory_order_release);
    if (count == 1) push_free_locked(id);
  }

  // Gives back ids this caller allocated and nobody else holds, last first, so that the free list
  // is exactly as it was before they were allocated. Cannot fail for such ids.
  void release_reversed(const page_id* ids, std::size_t count) noexcept {
    for (std::size_t i = count; i-- > 0;) {
      try {
        release(ids[i]);
      } catch (...) {
      }
    }
  }

  // 0 for a free id. A snapshot: other threads may change it right after.
  std::int32_t refcount(page_id id) const {
    require_in_range(id, "refcount");
    return book_->refcounts[index(id)].load(std::memory_order_acquire);
  }

  std::int64_t used_pages() const {
    if (!book_) return 0;
    std::lock_guard<std::mutex> lock(book_->mutex);
    return book_->used;
  }
  std::int64_t free_pages() const { return capacity_ - used_pages(); }
  // Ids ever handed out: [0, pages_touched()). Freed ids are reused before untouched ones, so this
  // bounds the memory a caller's pages can have made resident.
  std::int64_t pages_touched() const {
    if (!book_) return 0;
    std::lock_guard<std::mutex> lock(book_->mutex);
    return book_->touched;
  }

  // The checks below run on every data access, so they build their messages only on failure.
  void require_in_range(page_id id, const char* operation) const {
    if (id < 0 || id >= capacity_)
      detail::fail<input_error>(name_ + "." + operation + "(page)", id,
                                "must lie in [0, capacity = " + std::to_string(capacity_) + ")");
  }
  // The id's reference count, or input_error if it is out of range or free.
  std::int32_t allocated_refcount(page_id id, const char* operation) const {
    require_in_range(id, operation);
    const std::int32_t count = book_->refcounts[index(id)].load(std::memory_order_acquire);
    if (count <= 0) detail::fail<input_error>(name_ + "." + operation + "(page)", id, "is not allocated (reference count 0)");
    return count;
  }
  void require_allocated(page_id id, const char* operation) const { (void)allocated_refcount(id, operation); }

 private:
  // Everything threads contend on, behind a pointer so the allocator can move (a mutex cannot).
  struct bookkeeping {
    explicit bookkeeping(std::int64_t capacity)
        : refcounts(static_cast<std::size_t>(capacity)), next_free(static_cast<std::size_t>(capacity)) {
      // Free list 0 → 1 → … → capacity−1, so a fresh allocator hands out ids in order.
      for (std::int64_t i = 0; i < capacity; ++i) {
        refcounts[static_cast<std::size_t>(i)].store(0, std::memory_order_relaxed);
        next_free[static_cast<std::size_t>(i)] = static_cast<page_id>(i + 1 < capacity ? i + 1 : -1);
      }
    }
    std::mutex mutex;
    std::vector<std::atomic<std::int32_t>> refcounts;  // modified only under `mutex`
    std::vector<page_id> next_free;                    // under `mutex`; −1 ends the list
    page_id free_head = 0;                             // under `mutex`; −1 when empty
    std::int64_t used = 0;                             // under `mutex`
    std::int64_t touched = 0;                          // under `mutex`: ids [0, touched) were handed out
  };

  static std::size_t index(page_id id) noexcept { return static_cast<std::size_t>(id); }

  page_id pop_free_locked() {
    const page_id id = book_->free_head;
    book_->free_head = book_->next_free[index(id)];
    book_->refcounts[index(id)].store(1, std::memory_order_release);
    ++book_->used;
    book_->touched = std::max<std::int64_t>(book_->touched, id + 1);
    return id;
  }
  void push_free_locked(page_id id) {
    book_->next_free[index(id)] = book_->free_head;
    book_->free_head = id;
    --book_->used;
  }

  std::string name_;
  std::int64_t capacity_ = 0;
  std::unique_ptr<bookkeeping> book_;
};

}  // namespace phasekv
