#pragma once
// The phase sweep's plan: which placements a sweep runs (sweep_config, placement, plan_sweep)
// and what their target positions are per residue (plan_position_statistics). The run and its
// summary are phase_sweep.hpp, the result sweep_result.hpp, its reports sweep_report.hpp.
//
// The plan (the "rotation" design). Trials come in rounds of M; trial i of residue r (round
// g = i / M, rotation j ∈ [0, M)) targets
//     p = A_i − j + ((r + j) mod M)        ≡ r (mod M)
// with A_i, a multiple of M, the anchor of trial index i. So for one trial index the M residues
// fill the M consecutive positions [A_i − j, A_i − j + M): every residue sees the same anchor,
// and a host that derives its haystack from `trial` gets a paired design (residues compared on
// the same content). Each trial index has an anchor of its own, spread evenly over the target
// range, so a residue's trials sit at distinct positions whenever the range allows anchors two
// blocks of M apart (span ≥ 2·M·trials_per_residue; plan_position_statistics counts the distinct
// ones otherwise): a host whose outcome depends on position never sees copies counted as trials.
// Relative to its anchor, residue r is at offset u = r (for j < M − r) or r − M (otherwise); over
// a full round (j = 0 … M−1) these sum to 0, so
//   * mean: the mean target position is EXACTLY the same for every residue when M divides
//     trials_per_residue (the anchors are shared). Otherwise the last, partial round of m trials
//     uses rotations spread evenly over [0, M) (j_k = floor((2k+1)M / 2m)), whose offsets sum to
//     within ±M/2, so means differ by at most M / trials_per_residue.
//   * variance: a round adds r(M − r) to residue r's variance, and the anchors' covariance with
//     the rotation a little more: rounds take their anchors in an alternating order (low, high,
//     low, …), mirrored in every other round so that a pair of rounds gives every rotation the
//     same anchor sum. Variances differ by at most M²/2 + 2M·span/trials_per_residue tokens²
//     (tested over many configs) — a relative 10⁻⁴ of the positions' variance (~span²/12) at the
//     study's sizes.
// The query. With query_jitter = 1 every trial queries at query_position, so a target's residue
// and its distance to the query modulo S move together: a phase effect and a distance effect
// cannot be told apart. With query_jitter = J > 1, trial index i queries at
//     query_position − o_i,   o_i = mix64(seed ⊕ a constant, i) mod J (core/random.hpp),
// the same o_i for every residue (the pairing holds); targets then lie at least min_distance
// before the earliest query, query_position − (J − 1). A J that is a multiple of S makes the
// query's phase, and with it the distance modulo S, independent of the target's residue.
// The run order of the trials is a Fisher–Yates
// shuffle seeded by `seed` (SplitMix64), so drift in a long run (warm caches, thermal state)
// cannot line up with residue; the plan is a deterministic function of the config.
//
// Layouts (record_layout.hpp). Each trial's record — sweep_config::record, starting at the
// target — is classified against the stream (stride, window, origin): contained in one block, or
// straddling a boundary (covered whole by a later window when W > S, or split). With M a multiple
// of S the class is a function of the residue. `layout` plans every residue (any), only the
// residues whose record fits in a block (contained: in-block offsets 0 … S − L, the within-window
// test), or only those that straddle. The result reports per residue, per layout class, and three
// profiles — all trials, contained only, straddle only — each with its homogeneity test, period,
// a debiased gap and the period-S amplitude with its permutation test (resampling.hpp); "the
// period" of the top-level summary is always the all-trials profile's.
//
// Target range: targets lie in [q₀ − min_distance − span, q₀ − min_distance] with
// q₀ = query_position − (query_jitter − 1) the earliest query: at least min_distance tokens
// before every trial's query.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/random.hpp"
#include "phasekv/detail/enum_name.hpp"
#include "phasekv/diag/record_layout.hpp"

namespace phasekv::diag {

// Which residues a plan holds: every one, only those whose record fits inside one block
// (the within-window test), or only those whose record crosses a block boundary.
enum class layout_mode { any, contained, straddle };

inline const char* to_string(layout_mode m) noexcept {
  return phasekv::detail::enum_name(m, {"any", "contained", "straddle"});
}

struct sweep_config {
  static constexpr std::int64_t minimum_trials = 10;  // valid trials per residue (see top)

  std::int64_t stride = 0;                // S
  std::int64_t modulus = 0;               // M, a multiple of S; 0 → 2·S
  std::int64_t trials_per_residue = 32;   // ≥ minimum_trials
  std::int64_t query_position = 0;        // the latest query (see query_jitter)
  std::int64_t query_jitter = 1;          // J: trial i queries at query_position − o_i, o_i ∈ [0, J)
  std::int64_t span = 0;                  // width of the target range, ≥ 3·M
  std::int64_t min_distance = 1;          // targets at least this far before the query, ≥ 1
  std::uint64_t seed = 0;                 // run order (and the resampling statistics' draws)
  // The layout of each trial's record (record_layout.hpp): the stream the sweep classifies
  // against (window 0 means stride) and the record that starts at each target position.
  std::int64_t window = 0;
  std::int64_t origin = 0;
  record_shape record;
  layout_mode layout = layout_mode::any;
  // Permutations of the phase fold's null (resampling.hpp).
  std::int64_t permutations = 999;

  std::int64_t resolved_modulus() const { return modulus == 0 ? 2 * stride : modulus; }
  std::int64_t resolved_window() const { return window == 0 ? stride : window; }
  geometry stream() const { return geometry{stride, resolved_window(), origin, anchor_mode::block_start}; }
  // The layout class of a record starting at residue r (a function of r: M is a multiple of S).
  layout_class class_of_residue(std::int64_t r) const { return classify_record(stream(), r, record.length()).kind; }
  // Whether the plan holds residue r under `layout`.
  bool planned_residue(std::int64_t r) const {
    const bool contained = class_of_residue(r) == layout_class::contained;
    return layout == layout_mode::any || (layout == layout_mode::contained) == contained;
  }
  std::int64_t earliest_query() const { return query_position - (query_jitter - 1); }
  std::int64_t first_target() const { return earliest_query() - min_distance - span; }
  std::int64_t last_target() const { return earliest_query() - min_distance; }
  // o_i of trial index i (see the top): the same for every residue.
  std::int64_t query_offset(std::int64_t trial) const {
    if (query_jitter <= 1) return 0;
    const std::uint64_t draw = phasekv::detail::mix64(seed ^ 0x71e5c0ffee0ddba1ull, static_cast<std::uint64_t>(trial));
    return static_cast<std::int64_t>(draw % static_cast<std::uint64_t>(query_jitter));
  }

  void validate() const {
    using phasekv::detail::require;
    require(stride >= 1, "stride", stride, "must be at least 1");
    require(modulus >= 0, "modulus", modulus, "must be 0 (meaning 2·stride) or a positive multiple of stride");
    const std::int64_t m = resolved_modulus();
    require(m % stride == 0, "modulus", m, "must be a multiple of stride = " + std::to_string(stride));
    require(m >= 2, "modulus", m, "must be at least 2 (one residue cannot be compared with another)");
    require(trials_per_residue >= minimum_trials, "trials_per_residue", trials_per_residue,
            "must be at least " + std::to_string(minimum_trials) +
                " (below that no residue can have the expected cell counts of 5 the homogeneity test needs)");
    require(min_distance >= 1, "min_distance", min_distance, "must be at least 1 (targets lie before the query)");
    require(span >= 3 * m, "span", span,
            "must be at least 3·modulus = " + std::to_string(3 * m) + " (room for one rotation round)");
    require(span <= (std::int64_t{1} << 40) && query_position <= (std::int64_t{1} << 40), "query_position",
            query_position, "must be at most 2^40 (and span too)");
    require(query_jitter >= 1 && query_jitter <= (std::int64_t{1} << 20), "query_jitter", query_jitter,
            "must lie in [1, 2^20] (1: every trial queries at query_position)");
    require(query_position - (query_jitter - 1) - min_distance - span >= 0, "query_position", query_position,
            "must be at least (query_jitter − 1) + min_distance + span = " +
                std::to_string(query_jitter - 1 + min_distance + span) + " so every target position is non-negative");
    require(window == 0 || (window >= stride && window <= (std::int64_t{1} << 20)), "window", window,
            "must be 0 (meaning stride) or lie in [stride = " + std::to_string(stride) + ", 2^20]");
    require(origin >= 0 && origin < stride, "origin", origin, "must lie in [0, stride = " + std::to_string(stride) + ")");
    record.validate();
    require(layout == layout_mode::any || layout == layout_mode::contained || layout == layout_mode::straddle, "layout",
            static_cast<int>(layout), "is not a layout_mode");
    require(layout != layout_mode::contained || record.length() <= stride, "record.length()", record.length(),
            "must be at most stride = " + std::to_string(stride) + " for layout = contained (the record must fit in a block)");
    require(layout != layout_mode::straddle || record.length() >= 2, "record.length()", record.length(),
            "must be at least 2 for layout = straddle (one token cannot cross a boundary)");
    require(permutations >= 1 && permutations <= 100000, "permutations", permutations, "must lie in [1, 10^5]");
  }

  // Residues the plan holds, in order.
  std::vector<std::int64_t> planned_residues() const {
    std::vector<std::int64_t> out;
    for (std::int64_t r = 0; r < resolved_modulus(); ++r)
      if (planned_residue(r)) out.push_back(r);
    return out;
  }
};

struct placement {
  std::int64_t residue = 0;          // target_position mod M
  std::int64_t trial = 0;            // index within the residue; equal index → same anchor block
  std::int64_t target_position = 0;  // the record's first token (its key's first token)
  std::int64_t query_position = 0;
  record_layout layout;              // of the record against sweep_config::stream()
  std::int64_t distance() const { return query_position - target_position; }
};

namespace detail {

// The order in which one round's M rotations take its M anchors (anchor rank π(j) for rotation
// j): alternately from the low and the high end, 0, M−1, 1, M−2, …, so every run of rotations
// has an anchor mean near the round's — the covariance of anchor and rotation, which would
// tilt the residues' variances, stays within a block (see the top).
inline std::int64_t alternating_rank(std::int64_t j, std::int64_t m) { return j % 2 == 0 ? j / 2 : m - 1 - j / 2; }

}  // namespace detail

// Every planned residue's trials_per_residue placements, in a seeded shuffled run order.
inline std::vector<placement> plan_sweep(const sweep_config& config) {
  config.validate();
  const std::int64_t m = config.resolved_modulus();
  const std::int64_t n = config.trials_per_residue;
  const std::int64_t lo = config.first_target(), hi = config.last_target();
  // Anchor indices a (anchor a·M) with every rotated position inside [lo, hi].
  const std::int64_t a_min = (lo + m - 1 + m - 1) / m;
  const std::int64_t a_max = (hi - m + 1) / m;
  const std::int64_t width = a_max - a_min;
  // One anchor per trial index, spread evenly over the range (sorted): trial indices 2 anchors
  // apart or more give every residue distinct positions; a narrower range repeats some
  // (plan_position_statistics counts the distinct ones).
  std::vector<std::int64_t> sorted(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    sorted[static_cast<std::size_t>(i)] = n == 1 ? a_min + width / 2 : a_min + (2 * i * width + (n - 1)) / (2 * (n - 1));
  // Trial i = round q, rotation j. Round q takes anchors [q·M, q·M + M) of the sorted list in
  // the alternating order, mirrored in odd rounds so that a pair of rounds gives every rotation
  // the same anchor sum; the last, partial round of `partial` trials spreads its rotations evenly
  // over [0, M) (j_k = floor((2k + 1)M / 2·partial)) as before.
  const std::int64_t full = n / m, partial = n % m;
  std::vector<placement> plan;
  plan.reserve(static_cast<std::size_t>(m * n));
  const geometry stream = config.stream();
  for (std::int64_t r = 0; r < m; ++r) {
    if (!config.planned_residue(r)) continue;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t q = i / m, k = i % m;
      const std::int64_t round_size = q < full ? m : partial;
      const std::int64_t j = q < full ? k : ((2 * k + 1) * m) / (2 * partial);
      std::int64_t rank = detail::alternating_rank(k, round_size);
      if (q % 2 == 1) rank = round_size - 1 - rank;
      const std::int64_t anchor = sorted[static_cast<std::size_t>(q * m + rank)];
      const std::int64_t position = anchor * m - j + (r + j) % m;
      plan.push_back({r, i, position, config.query_position - config.query_offset(i),
                      classify_record(stream, position, config.record.length())});
    }
  }
  std::uint64_t state = config.seed;
  for (std::size_t i = plan.size(); i > 1; --i) {
    const std::size_t pick = static_cast<std::size_t>(phasekv::detail::splitmix64(state) % i);
    std::swap(plan[i - 1], plan[pick]);
  }
  return plan;
}

struct residue_position_stats {
  std::int64_t residue = 0;
  std::int64_t count = 0;
  double mean = 0.0;      // of target_position
  double variance = 0.0;  // population variance (divide by count)
  std::int64_t distinct = 0;  // distinct target positions: the residue's effective trial count
};

// Per-residue count, mean and variance of the target positions of `plan` (any plan, so a host
// can check one it built or filtered itself). Residues are target_position mod `modulus`.
inline std::vector<residue_position_stats> plan_position_statistics(const std::vector<placement>& plan,
                                                                    std::int64_t modulus) {
  phasekv::detail::require<input_error>(modulus >= 1, "modulus", modulus, "must be at least 1");
  std::vector<residue_position_stats> out(static_cast<std::size_t>(modulus));
  std::vector<std::int64_t> sums(out.size(), 0);
  for (const placement& p : plan) {
    phasekv::detail::require<input_error>(p.target_position >= 0, "target_position", p.target_position,
                                          "must be non-negative");
    const auto r = static_cast<std::size_t>(p.target_position % modulus);
    ++out[r].count;
    sums[r] += p.target_position;  // exact: equal sums give bit-equal means
  }
  for (std::size_t r = 0; r < out.size(); ++r) {
    out[r].residue = static_cast<std::int64_t>(r);
    if (out[r].count > 0) out[r].mean = static_cast<double>(sums[r]) / static_cast<double>(out[r].count);
  }
  for (const placement& p : plan) {
    auto& s = out[static_cast<std::size_t>(p.target_position % modulus)];
    const double d = static_cast<double>(p.target_position) - s.mean;
    s.variance += d * d;
  }
  for (auto& s : out)
    if (s.count > 0) s.variance /= static_cast<double>(s.count);
  std::vector<std::set<std::int64_t>> positions(out.size());
  for (const placement& p : plan) positions[static_cast<std::size_t>(p.target_position % modulus)].insert(p.target_position);
  for (std::size_t r = 0; r < out.size(); ++r) out[r].distinct = static_cast<std::int64_t>(positions[r].size());
  return out;
}

}  // namespace phasekv::diag
