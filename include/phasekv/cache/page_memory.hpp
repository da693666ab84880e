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
//                                   it must not throw.
// The page_memory must outlive every pool that uses it; allocate/deallocate may be called from
// any thread (pools are constructed and destroyed wherever the host does that).

#include <cstddef>
#include <new>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

namespace phasekv {

class page_memory {
 public:
  virtual ~page_memory() = default;
  virtual void* allocate(std::size_t bytes, std::size_t alignment) = 0;
  virtual void deallocate(void* block, std::size_t bytes, std::size_t alignment) noexcept = 0;
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
