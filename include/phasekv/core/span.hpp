#pragma once
// A minimal contiguous view (C++17 has no std::span). Only what phasekv's interfaces need.

#include <cstddef>
#include <type_traits>
#include <vector>

namespace phasekv {

template <class T>
class span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  constexpr span() noexcept = default;
  constexpr span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}
  template <class U, class = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
  constexpr span(const span<U>& other) noexcept : data_(other.data()), size_(other.size()) {}
  template <class Alloc>
  span(std::vector<value_type, Alloc>& v) noexcept : data_(v.data()), size_(v.size()) {}
  template <class Alloc, class U = T, class = std::enable_if_t<std::is_const_v<U>>>
  span(const std::vector<value_type, Alloc>& v) noexcept : data_(v.data()), size_(v.size()) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr T& operator[](std::size_t i) const noexcept { return data_[i]; }
  constexpr T* begin() const noexcept { return data_; }
  constexpr T* end() const noexcept { return data_ + size_; }
  constexpr span subspan(std::size_t offset, std::size_t count) const noexcept {
    return span(data_ + offset, count);
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace phasekv
