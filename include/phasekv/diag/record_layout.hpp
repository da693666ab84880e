#pragma once
// How a record sits against a stream's entries: the coordinate that separates "the record was
// cut in two" from "the record was whole but at a bad offset".
//
// A record is a key of K tokens, g tokens of gap, then a value of V tokens: tokens
// [first, first + L), L = K + g + V (record_shape). Against a geometry (S, W, origin):
//
//   boundaries        = block_of(last) − block_of(first)   block boundaries inside the record
//   first/last offset = phase_of(first), phase_of(last)      in-block offsets of its ends
//   covering entries  = {j ≥ 0 : window_start(j) ≤ first and last < window_start(j) + W}
//                     = [block_of(last), floor_div(first + lead + W, S))   (entries whose
//                       window holds every token of the record)
//
// and its class:
//   contained         boundaries = 0: the whole record lies in one block, so in the window of
//                     every entry that covers that block (W/S of them for W a multiple of S)
//   straddle_covered  boundaries ≥ 1, but some window still holds it whole (only when W > S)
//   straddle_split    no window holds it: every entry sees a part (always, at W = S, once it
//                     crosses a boundary)
//
// A record fits contained at in-block offsets 0 … S − L of its first token (none when L > S), so
// with a modulus M that is a multiple of S the class is a function of the residue first mod M.
//
// Crowding: another record with a token in the tokens the record's entries pool — the union of
// the windows of every entry that holds any of its tokens, [window_start(block_of(first)),
// block_end(last entry covering last)] — shares an entry with it and competes inside it.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/detail/enum_name.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/span.hpp"

namespace phasekv::diag {

// Why a failed trial failed (read_attribution.hpp's classify_failure says it from a read's
// trace): the indexer never selected an entry holding the record; it was selected but the
// attention went elsewhere; it was read but its pooled entry gave the record's tokens little
// weight; or none of these (the record was read and weighted — what failed is downstream).
enum class failure_cause { unattributed, selection_miss, read_dilution, write_dilution, readout };
inline constexpr std::size_t failure_causes = 5;

inline const char* to_string(failure_cause c) noexcept {
  return phasekv::detail::enum_name(c, {"unattributed", "selection_miss", "read_dilution", "write_dilution",
                                        "readout"});
}

// A record's tokens: key, gap, value (the value starts key_tokens + gap after the key).
struct record_shape {
  std::int64_t key_tokens = 1;
  std::int64_t value_tokens = 1;
  std::int64_t gap = 0;

  std::int64_t length() const noexcept { return key_tokens + gap + value_tokens; }
  std::int64_t value_offset() const noexcept { return key_tokens + gap; }

  void validate() const {
    using phasekv::detail::require;
    require(key_tokens >= 1 && key_tokens <= 4096, "record_shape.key_tokens", key_tokens, "must lie in [1, 4096]");
    require(value_tokens >= 1 && value_tokens <= 4096, "record_shape.value_tokens", value_tokens,
            "must lie in [1, 4096]");
    require(gap >= 0 && gap <= 4096, "record_shape.gap", gap, "must lie in [0, 4096]");
  }
};

inline bool operator==(const record_shape& a, const record_shape& b) noexcept {
  return a.key_tokens == b.key_tokens && a.value_tokens == b.value_tokens && a.gap == b.gap;
}
inline bool operator!=(const record_shape& a, const record_shape& b) noexcept { return !(a == b); }

enum class layout_class { contained, straddle_covered, straddle_split };

inline const char* to_string(layout_class c) noexcept {
  return phasekv::detail::enum_name(c, {"contained", "straddle_covered", "straddle_split"});
}

struct record_layout {
  std::int64_t first = 0;               // the record's first and last token
  std::int64_t last = 0;
  std::int64_t first_offset = 0;        // phase_of(first), phase_of(last)
  std::int64_t last_offset = 0;
  std::int64_t boundaries = 0;          // block boundaries inside the record
  std::int64_t covering_entries = 0;    // entries (j ≥ 0) whose window holds the whole record
  std::int64_t first_covering = -1;     // the first of them, −1 if none
  std::int64_t first_slot = -1;         // slot of `first` in that entry, −1 if none
  layout_class kind = layout_class::straddle_split;

  bool straddles() const noexcept { return boundaries > 0; }
};

// See the header comment. `first` ≥ 0, `length` ≥ 1.
inline record_layout classify_record(const geometry& geom, std::int64_t first, std::int64_t length) {
  using phasekv::detail::require;
  geom.validate();
  require<input_error>(first >= 0 && first <= (std::int64_t{1} << 50), "classify_record: first", first,
                       "must lie in [0, 2^50]");
  require<input_error>(length >= 1 && length <= (std::int64_t{1} << 20), "classify_record: length", length,
                       "must lie in [1, 2^20]");
  record_layout out;
  out.first = first;
  out.last = first + length - 1;
  out.first_offset = geom.phase_of(out.first);
  out.last_offset = geom.phase_of(out.last);
  out.boundaries = geom.block_of(out.last) - geom.block_of(out.first);
  const std::int64_t lo = std::max<std::int64_t>(0, geom.block_of(out.last));
  const std::int64_t hi = geom.entries_covering(out.first).last;  // windows that still hold `first`
  out.covering_entries = std::max<std::int64_t>(0, hi - lo);
  if (out.covering_entries > 0) {
    out.first_covering = lo;
    out.first_slot = geom.slot_of(out.first, lo);
  }
  out.kind = out.boundaries == 0        ? layout_class::contained
             : out.covering_entries > 0 ? layout_class::straddle_covered
                                        : layout_class::straddle_split;
  return out;
}

// The tokens the record's entries pool: [window_start(block_of(first)), block_end(j_last)] with
// j_last the last entry whose window holds `last` (see the header comment).
inline std::pair<std::int64_t, std::int64_t> pooled_neighbourhood(const geometry& geom, std::int64_t first,
                                                                  std::int64_t length) {
  const std::int64_t last = first + length - 1;
  return {std::max<std::int64_t>(0, geom.window_start(geom.block_of(first))),
          geom.block_end(geom.entries_covering(last).last - 1)};
}

// How many of `others` (records of `length` tokens starting at the given tokens, in any order)
// other than the one at `first` have a token in the record's pooled neighbourhood.
inline std::int64_t crowding(const geometry& geom, std::int64_t first, std::int64_t length,
                             span<const std::int64_t> others, std::int64_t others_length) {
  const auto [lo, hi] = pooled_neighbourhood(geom, first, length);
  std::int64_t n = 0;
  for (std::int64_t o : others)
    if (o != first && o <= hi && o + others_length - 1 >= lo) ++n;
  return n;
}

}  // namespace phasekv::diag
