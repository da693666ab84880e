#pragma once
// Haystacks for the needle study: which context each placement's needle goes into, so that one
// prefill serves many trials without overlapping needles (the needle probe's sweeps, and a host's
// or a served model's through Python's phasekv.sweep).

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/study/sweep_plan.hpp"

namespace phasekv::diag {

// Haystacks for a plan (the paired design's content). A host that puts several needles into one
// context — one prefill serving many trials — needs needles that do not overlap, while plan_sweep
// places the M residues of one trial index at consecutive positions. This assigns every placement
// a haystack index: in plan order (which is shuffled), placement p goes to the first haystack
// h ≥ p.trial mod K (K = the plan's largest residue + 1, i.e. M) holding no needle that overlaps
// its own [target_position, target_position + needle_tokens). Starting at the trial index's
// haystack spreads each residue's trials over at least min(K, trials per residue)/2 haystacks and
// puts several residues in every haystack, so haystack content is not confounded with residue;
// no haystack has overlapping needles. The count stays near K: at most K + 2·needle_tokens in
// the tests (tests/test_diag_phase_sweep.cpp).
// Returns the haystack of each placement, in plan order.
inline std::vector<std::int64_t> assign_haystacks(const std::vector<placement>& plan, std::int64_t needle_tokens) {
  phasekv::detail::require<input_error>(needle_tokens >= 1 && needle_tokens <= (std::int64_t{1} << 20), "needle_tokens",
                                        needle_tokens, "must lie in [1, 2^20]");
  std::int64_t k = 1;
  for (const placement& p : plan) {
    phasekv::detail::require<input_error>(p.residue >= 0 && p.trial >= 0, "placement.residue", p.residue,
                                          "must be non-negative (and so must placement.trial)");
    k = std::max(k, p.residue + 1);
  }
  std::vector<std::set<std::int64_t>> needles;  // per haystack: its needles' target positions
  std::vector<std::int64_t> haystack(plan.size());
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const std::int64_t t = plan[i].target_position;
    auto h = static_cast<std::size_t>(plan[i].trial % k);
    for (; h < needles.size(); ++h) {  // overlap: another needle starts in (t − needle_tokens, t + needle_tokens)
      const auto next = needles[h].lower_bound(t - needle_tokens + 1);
      if (next == needles[h].end() || *next >= t + needle_tokens) break;
    }
    if (h >= needles.size()) needles.resize(h + 1);
    needles[h].insert(t);
    haystack[i] = static_cast<std::int64_t>(h);
  }
  return haystack;
}

}  // namespace phasekv::diag
