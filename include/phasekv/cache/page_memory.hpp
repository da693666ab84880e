#pragma once
// Where a page pool's pages live: memory the host controls.
//
// A pool asks its page_memory once, at construction, for one contiguous block of
// capacity × page bytes (one base pointer, so page p is at base + p · page stride — the layout
// interop views and host kernels index), and gives it back when the pool is destroyed. An engine
// implements page_memory over its own arena, pinned or huge-page memory; the pool never touches a
// page before handing it out, so memory the host commits lazily stays uncommitted until used.
//
// The default, system_page_memory(), maps anonymous memory on POSIX systems: the kernel backs a
// page with physical memory only when it is first written, so a pool sized for a million entries
// that holds one short sequence costs resident memory for that sequence's pages only. Elsewhere it
// falls back to aligned operator new (large blocks are lazily committed by most allocators too).
//
// Contract for an implementation:
//   allocate(bytes, alignment)      returns a block of at least `bytes` bytes aligned to
//                                   `alignment` (a power of two, at most 4096), or throws
//                                   std::bad_alloc (returning null counts as the same);
//   deallocate(block, bytes, align) takes back a block allocate() returned, with the same sizes;
//                                   it must not throw;
//   capacity(alignment)             the largest block allocate() could return now, SIZE_MAX
//                                   (the default) for memory without a fixed bound. A pool
//                                   refuses to ask for more, so memory of a known size — an
//                                   arena — cannot be overrun by a pool sized past it.
// The page_memory must outlive every pool that uses it; allocate/deallocate may be called from
// any thread (pools are constructed and destroyed wherever the host does that).
//
// arena_page_memory is such memory over a buffer the host owns: blocks are cut from its front in
// turn and the space is reused once every block is given back.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <new>
#include <string>

#include "phasekv/core/error.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

namespace phasekv {

class page_memory {
 public:
  virtual ~page_memory() = default;
  virtual void* allocate(std::size_t bytes, std::size_t alignment) = 0;
  virtual void deallocate(void* block, std::size_t bytes, std::size_t alignment) noexcept = 0;
  virtual std::size_t capacity(std::size_t alignment) const noexcept {
    (void)alignment;
    return std::numeric_limits<std::size_t>::max();
  }
};

// Page memory over [base, base + bytes), a buffer the host owns and keeps alive longer than every
// pool that uses it. Blocks come from the front of what is left, aligned; a request larger than
// capacity() throws std::bad_alloc. When the last block outstanding is given back the whole
// buffer is free again. Thread-safe.
class arena_page_memory final : public page_memory {
 public:
  arena_page_memory(void* base, std::size_t bytes) : base_(reinterpret_cast<std::uintptr_t>(base)), bytes_(bytes) {
    detail::require<input_error>(base != nullptr || bytes == 0, "arena_page_memory: base", "null",
                                 "must point at the buffer of " + std::to_string(bytes) + " bytes");
    detail::require<input_error>(base_ <= std::numeric_limits<std::uintptr_t>::max() - bytes,
                                 "arena_page_memory: bytes", bytes, "runs past the end of the address space");
  }

  void* allocate(std::size_t bytes, std::size_t alignment) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t start = aligned_offset(alignment);
    if (start > bytes_ || bytes > bytes_ - start) throw std::bad_alloc();
    used_ = start + bytes;
    ++outstanding_;
    return reinterpret_cast<void*>(base_ + start);
  }
  void deallocate(void*, std::size_t, std::size_t) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (outstanding_ > 0 && --outstanding_ == 0) used_ = 0;
  }
  std::size_t capacity(std::size_t alignment) const noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t start = aligned_offset(alignment);
    return start > bytes_ ? 0 : bytes_ - start;
  }

  std::size_t bytes() const noexcept { return bytes_; }
  std::size_t used() const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return used_;
  }

 private:
  // The offset of the next block aligned to `alignment` (a power of two); may exceed bytes_.
  std::size_t aligned_offset(std::size_t alignment) const noexcept {
    const std::uintptr_t next = base_ + used_;
    const std::uintptr_t mask = static_cast<std::uintptr_t>(alignment == 0 ? 1 : alignment) - 1;
    return static_cast<std::size_t>(((next + mask) & ~mask) - base_);
  }

  std::uintptr_t base_;
  std::size_t bytes_;
  std::size_t used_ = 0;
  std::int64_t outstanding_ = 0;
  mutable std::mutex mutex_;
};

namespace detail {

class system_memory final : public page_memory {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment) override {
#if defined(__unix__) || defined(__APPLE__)
    (void)alignment;  // mappings start on a 4096-byte page boundary
    void* block = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) throw std::bad_alloc();
    return block;
#else
    return ::operator new(bytes, std::align_val_t{alignment});
#endif
  }
  void deallocate(void* block, std::size_t bytes, std::size_t alignment) noexcept override {
#if defined(__unix__) || defined(__APPLE__)
    (void)alignment;
    ::munmap(block, bytes);
#else
    (void)bytes;
    ::operator delete(block, std::align_val_t{alignment});
#endif
  }
};

}  // namespace detail

// The process-wide default: stateless, so one instance serves every pool and thread.
inline page_memory& system_page_memory() noexcept {
  static detail::system_memory memory;
  return memory;
}

}  // namespace phasekv
