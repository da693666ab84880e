#pragma once
// Top-k selection in O(n) (DESIGN.md §5): the k highest scores, ties broken by the lower index,
// returned in rank order. std::nth_element (introselect) partitions in linear time; only the
// k winners are then sorted, O(k log k), which does not grow with the context.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "phasekv/core/span.hpp"

namespace phasekv {

struct scored_entry {
  std::int64_t index = 0;
  float score = 0.0f;
};

// Higher score first; equal scores by lower index. A strict total order on distinct indices
// (NaN scores, which callers should not produce, rank last).
inline bool ranks_before(const scored_entry& a, const scored_entry& b) noexcept {
  const bool a_nan = a.score != a.score, b_nan = b.score != b.score;
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a.score != b.score) return a.score > b.score;
  return a.index < b.index;
}

// Keeps the top min(k, n) of `entries`, best first. Works on any set of entries, so the top k
// of a union is the top k of the union of each part's top k: the reader selects per chunk of
// pages (in parallel) and then once more over the chunks' winners, with the same result.
inline void keep_top_k(std::vector<scored_entry>& entries, std::int64_t k) {
  const auto keep = static_cast<std::size_t>(std::min<std::int64_t>(std::max<std::int64_t>(k, 0),
                                                                    static_cast<std::int64_t>(entries.size())));
  if (keep < entries.size()) {
    std::nth_element(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(keep), entries.end(), ranks_before);
    entries.resize(keep);
  }
  std::sort(entries.begin(), entries.end(), ranks_before);
}

// The top min(k, n) of scores[0 … n), best first, into `out` (reusing its storage); scores[j]
// belongs to entry first_index + j.
inline void select_top_k(span<const float> scores, std::int64_t k, std::vector<scored_entry>& out,
                         std::int64_t first_index = 0) {
  out.resize(scores.size());
  for (std::size_t j = 0; j < scores.size(); ++j) out[j] = {first_index + static_cast<std::int64_t>(j), scores[j]};
  keep_top_k(out, k);
}

}  // namespace phasekv
