#pragma once
// The helpers nearly every test needs: a size from a signed count, and a float's bits and the
// float of given bits (for bit-for-bit comparisons, where == would call -0 and +0 equal and NaN
// unequal to itself).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

namespace phasekv_test {

inline std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

inline std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
inline float float_of(std::uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// A uniform draw from [lo, hi], and one of `values` uniformly.
inline std::int64_t pick(std::mt19937& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}
template <class T>
T pick_of(std::mt19937& rng, std::initializer_list<T> values) {
  return *(values.begin() + pick(rng, 0, static_cast<std::int64_t>(values.size()) - 1));
}

// Same length and the same bits in every element.
inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace phasekv_test
