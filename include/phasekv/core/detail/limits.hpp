#pragma once
// The largest sizes phasekv agrees to describe, and overflow-safe products of sizes.
//
// Every size a caller passes (channels, heads, window, history, tokens per chunk, …) is checked
// against one of these bounds before it is used, and every product of sizes is formed only after
// checking that it stays below its bound, so no size arithmetic in the library can overflow. The
// bounds are far above any real model (DeepSeek-V4: 512 channels, 64 heads, W = 128) yet small
// enough that products of two or three of them still fit comfortably in std::int64_t. A value
// above a bound is a config_error or input_error naming the field; a size within the bounds whose
// memory cannot be allocated is a capacity_error naming the field.

#include <cstdint>
#include <new>
#include <string>

#include "phasekv/core/error.hpp"

namespace phasekv {
namespace limits {

inline constexpr std::int64_t max_channels = std::int64_t{1} << 20;  // per head and stream
inline constexpr std::int64_t max_heads = std::int64_t{1} << 16;     // KV, query or indexer heads
inline constexpr std::int64_t max_window = std::int64_t{1} << 20;    // slots per entry (W)
inline constexpr std::int64_t max_history = std::int64_t{1} << 40;   // rollback tokens kept
inline constexpr std::int64_t max_tokens = std::int64_t{1} << 48;    // tokens of one sequence or chunk
// Floats one token hands over to one stream (kv_heads × views × channels) or to the raw window.
inline constexpr std::int64_t max_floats_per_token = std::int64_t{1} << 36;
// Bytes of one allocation the library makes for a sequence or a pool (256 TiB).
inline constexpr std::int64_t max_bytes = std::int64_t{1} << 48;

}  // namespace limits

namespace detail {

// a · b for non-negative a, b when it is at most `bound`; false (and `product` untouched) otherwise.
constexpr bool product_within(std::int64_t a, std::int64_t b, std::int64_t bound, std::int64_t& product) noexcept {
  if (a < 0 || b < 0) return false;
  if (a != 0 && b > bound / a) return false;
  product = a * b;
  return true;
}

// a · b, or Error naming `field` and its `value` when the product exceeds `bound` (in the units
// `what` is counted in).
template <class Error = config_error>
std::int64_t checked_product(std::int64_t a, std::int64_t b, std::int64_t bound, const std::string& field,
                             std::int64_t value, const std::string& what) {
  std::int64_t product = 0;
  if (!product_within(a, b, bound, product))
    fail<Error>(field, value,
                "makes " + what + " exceed its limit of " + std::to_string(bound) + " (" + std::to_string(a) + " × " +
                    std::to_string(b) + ")");
  return product;
}

// Runs `allocate()`; turns std::bad_alloc into a capacity_error naming the field whose size asked
// for the memory, so a caller learns which setting to lower.
template <class Allocate>
void allocate_or_fail(Allocate&& allocate, const std::string& field, std::int64_t value, std::int64_t bytes) {
  try {
    allocate();
  } catch (const std::bad_alloc&) {
    fail<capacity_error>(field, value, "needs " + std::to_string(bytes) + " bytes, which could not be allocated");
  }
}

}  // namespace detail
}  // namespace phasekv
