#pragma once
// Stride, window and phase, in one place.
//
// All positions are absolute token indices t = 0, 1, 2, … of one sequence. A new entry starts
// every `stride` tokens; entry j pools the `window` tokens that end with block j. The host may
// stagger the chunk boundaries by an `origin`: blocks then start at tokens t ≡ origin (mod S),
// and block 0 is short (it holds tokens 0 … origin−1). Internally that is the same as placing
// `lead() = (S − origin) mod S` virtual padding tokens before token 0, so one set of formulas
// serves both cases:
//
//   u = t + lead                         (virtual position; lead = 0 when origin = 0)
//   block of t       = floor(u / S)
//   window of entry j = tokens [(j+1)·S − W − lead, (j+1)·S − lead)
//   slot i of entry j = token (j+1)·S − W − lead + i; padding when that token is negative
//   branch of slot i  = floor((W − 1 − i) / S)      (0 = the entry's own block)
//   phase of t        = (t − origin) mod S
//   entry j complete  once token (j+1)·S − 1 − lead is appended
//   query at t sees   entries j < floor((t + 1 + lead) / S)

#include <algorithm>
#include <cstdint>
#include <string>

#include "phasekv/detail/enum_name.hpp"
#include "phasekv/core/error.hpp"

namespace phasekv {

// Where an entry's post-pool RoPE places it.
enum class anchor_mode {
  block_start,    // first token of the entry's own block (DeepSeek-V4)
  block_end,      // last token of the entry's own block
  window_centre,  // floor of the midpoint of the entry's window
};

inline const char* to_string(anchor_mode mode) noexcept {
  return phasekv::detail::enum_name(mode, {"block_start", "block_end", "window_centre"});
}

// Floor division and a non-negative modulo for signed positions.
constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
  const std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
constexpr std::int64_t floor_mod(std::int64_t a, std::int64_t b) noexcept { return a - floor_div(a, b) * b; }

// Half-open range of entry indices [first, last).
struct entry_range {
  std::int64_t first = 0;
  std::int64_t last = 0;
  constexpr std::int64_t size() const noexcept { return last - first; }
  constexpr bool contains(std::int64_t j) const noexcept { return first <= j && j < last; }
};

struct geometry {
  std::int64_t stride = 1;  // S ≥ 1: a new entry every S tokens
  std::int64_t window = 1;  // W ≥ S: slots per entry
  std::int64_t origin = 0;  // 0 ≤ origin < S: blocks start at t ≡ origin (mod S)
  anchor_mode anchor = anchor_mode::block_start;

  void validate() const {
    using detail::require;
    require(stride >= 1, "geometry.stride", stride, "must be at least 1");
    require(window >= stride, "geometry.window", window,
            "must be at least geometry.stride (" + std::to_string(stride) + ")");
    require(window <= (std::int64_t{1} << 20), "geometry.window", window, "must be at most 2^20");
    require(origin >= 0 && origin < stride, "geometry.origin", origin,
            "must lie in [0, geometry.stride = " + std::to_string(stride) + ")");
    require(anchor == anchor_mode::block_start || anchor == anchor_mode::block_end ||
                anchor == anchor_mode::window_centre,
            "geometry.anchor", static_cast<int>(anchor), "is not an anchor_mode");
  }

  // Virtual padding tokens before token 0 (see the header comment).
  constexpr std::int64_t lead() const noexcept { return (stride - origin) % stride; }
  // Number of branches: blocks a window touches, the last possibly partial.
  constexpr std::int64_t branches() const noexcept { return (window + stride - 1) / stride; }
  constexpr std::int64_t boundary_phase() const noexcept { return stride - 1; }

  // --- tokens -------------------------------------------------------------------------------
  constexpr std::int64_t phase_of(std::int64_t t) const noexcept { return floor_mod(t - origin, stride); }
  // Residue t mod M, for a multiple M of the stride (lets several strides share one axis).
  static constexpr std::int64_t residue_of(std::int64_t t, std::int64_t modulus) noexcept {
    return floor_mod(t, modulus);
  }
  constexpr std::int64_t block_of(std::int64_t t) const noexcept { return floor_div(t + lead(), stride); }
  // Entries whose window contains token t.
  constexpr entry_range entries_covering(std::int64_t t) const noexcept {
    return {block_of(t), floor_div(t + lead() + window, stride)};
  }
  constexpr std::int64_t coverage(std::int64_t t) const noexcept { return entries_covering(t).size(); }

  // --- entries and slots ----------------------------------------------------------------------
  constexpr std::int64_t block_start(std::int64_t j) const noexcept { return j * stride - lead(); }
  constexpr std::int64_t block_end(std::int64_t j) const noexcept { return (j + 1) * stride - 1 - lead(); }
  // First token of entry j's window (negative while the window reaches before the sequence).
  constexpr std::int64_t window_start(std::int64_t j) const noexcept { return (j + 1) * stride - window - lead(); }
  constexpr std::int64_t slot_token(std::int64_t j, std::int64_t slot) const noexcept {
    return window_start(j) + slot;
  }
  constexpr std::int64_t slot_of(std::int64_t t, std::int64_t j) const noexcept { return t - window_start(j); }
  constexpr bool is_padding(std::int64_t j, std::int64_t slot) const noexcept { return slot_token(j, slot) < 0; }
  // Slots [first_real_slot(j), window) hold real tokens; the ones before are padding.
  constexpr std::int64_t first_real_slot(std::int64_t j) const noexcept {
    return std::max<std::int64_t>(0, -window_start(j));
  }
  constexpr std::int64_t branch_of_slot(std::int64_t slot) const noexcept { return (window - 1 - slot) / stride; }

  // The position entry j's post-pool RoPE rotates it to. May be negative for block 0 when
  // origin ≠ 0 (its block start is virtual), and for early entries in window_centre mode when
  // W ≥ 2S (the centre counts padding positions); a rotation by a negative angle is well defined.
  constexpr std::int64_t anchor_position(std::int64_t j) const noexcept {
    switch (anchor) {
      case anchor_mode::block_start: return block_start(j);
      case anchor_mode::block_end: return block_end(j);
      case anchor_mode::window_centre: return floor_div(window_start(j) + block_end(j), 2);
    }
    return block_start(j);
  }

  // --- completion and visibility --------------------------------------------------------------
  // The token whose arrival completes entry j.
  constexpr std::int64_t completion_token(std::int64_t j) const noexcept { return block_end(j); }
  // Entries complete once `tokens` tokens (0 … tokens−1) have been appended.
  constexpr std::int64_t completed_entries(std::int64_t tokens) const noexcept {
    return floor_div(tokens + lead(), stride);
  }
  // Entries a query at position t may read: j < floor((t + 1 + lead) / S).
  constexpr std::int64_t visible_entries(std::int64_t query_position) const noexcept {
    return completed_entries(query_position + 1);
  }
};

inline bool operator==(const geometry& a, const geometry& b) noexcept {
  return a.stride == b.stride && a.window == b.window && a.origin == b.origin && a.anchor == b.anchor;
}
inline bool operator!=(const geometry& a, const geometry& b) noexcept { return !(a == b); }

}  // namespace phasekv
