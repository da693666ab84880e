#pragma once
// The phase sweep harness: run a host-supplied trial with the target placed at
// every residue r = t mod M (M a multiple of the stride S, default 2S) and report accuracy by
// residue, the gap, a homogeneity test, the dominant period — as a table, CSV and JSON.
//
//   sweep_config              what to sweep; validate() names the field that is wrong
//   plan_sweep                the placements: same count, matched position statistics per residue
//   plan_position_statistics  per-residue count, mean and variance of a plan's target positions
//   run_sweep                 run a trial callable over a plan and summarise it, per residue,
//                             per layout class and per profile (all / contained / straddle)
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
//
// Outcomes. `trial(const placement&)` returns bool (success), an attributed_outcome (success, or
// the cause of a failure: read_attribution.hpp's classify_failure), or a floating-point
// probability in [0, 1]. A trial that throws, or returns NaN or a probability outside [0, 1], is an ERRORED trial:
// counted (per residue and in total, as `errored`), excluded from every statistic, and the first
// error's message is kept. It is never counted as a success or as a wrong answer (the outputs name
// it "errored", not "failed", so it cannot be read as one). If any residue is left with
// fewer than sweep_config::minimum_trials valid trials the result is INVALID: its gap, mean,
// p-value and period are NaN (null in JSON) and the table says so in its first line.
//
// Statistics (phasekv::diag::stats). Binary: accuracy with a Wilson 95% interval, Pearson χ²
// homogeneity over the M×2 table (flagged approximate when an expected cell is below 5).
// Probabilities: mean probability with a normal-approximation 95% interval of the mean
// (mean ± 1.96·s/√n, s the sample standard deviation, clipped to [0, 1]), one-way ANOVA.
// Both: best/worst/mean/gap via summarize_residues, dominant period via dominant_period on the
// M-residue accuracy profile with per-residue standard errors (binary: the binomial se at the
// pooled rate; probabilities: the standard error of each residue's mean), so the period is the
// smallest divisor of M whose fold fits the profile within its noise (χ², p ≥ 0.05). The period
// is REPORTED only with a phase effect to have one (sweep_result::has_period: valid, not flat,
// homogeneity p < 0.05); otherwise the fit only says which fold the noise happens to suit, and
// the table says "none" and JSON and the summary CSV leave the period empty (null).
//
// Why minimum_trials = 10: the χ² approximation wants expected cells of at least 5, and the
// smaller expected cell of a residue, min(n·p, n·(1 − p)), is at most n/2 — below 10 trials per
// residue no accuracy at all can satisfy it.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/detail/enum_name.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/random.hpp"
#include "phasekv/detail/text.hpp"
#include "phasekv/diag/record_layout.hpp"
#include "phasekv/study/resampling.hpp"
#include "phasekv/study/statistics.hpp"

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

enum class outcome_kind { binary, probability };

// A binary outcome with the cause of a failure; a trial may return this instead of a bool.
struct attributed_outcome {
  bool success = false;
  failure_cause cause = failure_cause::unattributed;  // ignored for a success
};

struct residue_outcome {
  std::int64_t residue = 0;
  std::int64_t phase = 0;                              // (residue − origin) mod S
  layout_class layout = layout_class::contained;       // of a record starting at this residue
  std::int64_t planned = 0;                            // 0: the plan's layout leaves it out
  std::int64_t valid = 0;       // trials that returned a usable outcome
  std::int64_t errored = 0;     // threw / NaN / out of range: no outcome, not a wrong answer
  std::int64_t successes = 0;   // binary only; wrong answers are valid − successes
  double estimate = 0.0;        // accuracy or mean probability (NaN with no valid trial)
  double ci_low = 0.0;          // 95%: Wilson (binary) or normal approximation of the mean
  double ci_high = 0.0;
  std::int64_t failures[failure_causes] = {};  // wrong answers by cause (binary), index = failure_cause
};

struct homogeneity_result {
  std::string test;              // "chi_square" or "anova"
  double statistic = 0.0;        // χ² or F
  std::int64_t dof = 0;          // χ²: M − 1; ANOVA: between-groups dof
  std::int64_t dof_within = 0;   // ANOVA only
  double p_value = 0.0;
  bool approximate = false;      // χ² with an expected cell below 5
};


// Per layout class: the trials of the residues whose record has that class.
struct layout_outcome {
  layout_class layout = layout_class::contained;
  std::int64_t residues = 0;    // planned residues of this class
  std::int64_t valid = 0;
  std::int64_t successes = 0;   // binary only
  double estimate = 0.0;        // accuracy or mean probability (NaN with no valid trial)
  double ci_low = 0.0;
  double ci_high = 0.0;
  std::int64_t failures[failure_causes] = {};
};

// One profile of a sweep: all its residues, or those of one layout — "contained" (the record
// inside one block: the within-window phase profile, the study's claim) or "straddle" (it
// crosses a block boundary: the trivial effect of a record cut in two, and, for W > S, of one
// still covered whole by the next window).
struct profile_summary {
  std::string name;                    // "all", "contained" or "straddle"
  std::vector<std::int64_t> residues;  // the planned residues it holds, in order
  std::int64_t trials = 0;             // valid trials over them
  bool valid = false;                  // ≥ 2 residues, each with ≥ minimum_trials valid trials
  std::string invalid_reason;
  double mean = std::numeric_limits<double>::quiet_NaN();        // unweighted over its residues
  double gap_points = std::numeric_limits<double>::quiet_NaN();  // plain max − min (biased up)
  std::int64_t best_residue = -1;
  std::int64_t worst_residue = -1;
  homogeneity_result homogeneity;
  stats::periodicity period;           // of its residues' profile (absent residues left out)
  // Debiased by cross-fitting (resampling.hpp), as fractions, with 95% intervals: the gap
  // between its best and worst residue, and between its best and worst phase of the fold onto
  // the S in-block offsets — the period-S amplitude.
  stats::interval_estimate debiased_gap;
  stats::interval_estimate phase_amplitude;
  // Permutation test of the fold onto the phases (the period-S component); NaN with one phase.
  stats::permutation_result phase_test;

  static constexpr double phase_effect_alpha = 0.05;
  bool has_period() const { return valid && !period.flat && homogeneity.p_value < phase_effect_alpha; }
};

struct sweep_result {
  sweep_config config;                      // as given, with modulus resolved
  outcome_kind kind = outcome_kind::binary;
  std::vector<residue_outcome> residues;    // M rows, residue order (planned = 0: left out by the layout)
  std::int64_t errored_trials = 0;
  std::string first_error;                  // message of the first errored trial ("" if none)
  bool valid = true;
  std::string invalid_reason;
  // The layout split: per class (contained, straddle_covered, straddle_split), and the profiles
  // all / contained / straddle (straddle = both straddling classes).
  std::vector<layout_outcome> layouts;
  std::vector<profile_summary> profiles;
  bool attributed = false;                  // some failure came with a cause

  // Below this homogeneity p-value the residues differ: a phase effect, whose period is reported.
  static constexpr double phase_effect_alpha = 0.05;

  // Whether `period` means anything: a valid sweep, a profile that is not flat, and a phase effect
  // (homogeneity p < phase_effect_alpha). Without an effect dominant_period still fits a fold
  // (the smallest divisor that suits the noise), which would read as a finding. The writers
  // report the period only when this holds.
  bool has_period() const { return valid && all().has_period(); }

  // The all-trials profile, profiles[0]: the sweep's figures — its mean, gap, best and worst
  // residue, homogeneity test and period (NaN / −1 when invalid). "period" always means this
  // profile's; profile("contained") is the within-window one. An empty profile for a result that
  // holds none (default-constructed).
  const profile_summary& all() const {
    static const profile_summary none = [] {
      profile_summary p;
      p.name = "all";
      p.invalid_reason = "no sweep was run";
      return p;
    }();
    return profiles.empty() ? none : profiles.front();
  }

  const profile_summary* profile(const std::string& name) const {
    for (const auto& p : profiles)
      if (p.name == name) return &p;
    return nullptr;
  }

  // A fixed-width table for a terminal or a log. An invalid sweep starts with "INVALID SWEEP".
  std::string to_table() const {
    const profile_summary& a = all();
    phasekv::detail::classic_stream out;
    const bool binary = kind == outcome_kind::binary;
    using phasekv::detail::fixed;
    using phasekv::detail::right;
    using phasekv::detail::format_number;
    if (!valid) out << "INVALID SWEEP: " << invalid_reason << "\n";
    out << "phase sweep: stride " << config.stride << ", window " << config.resolved_window() << ", origin "
        << config.origin << ", modulus " << config.modulus << ", " << config.trials_per_residue
        << " trials/residue, query at " << config.query_position;
    if (config.query_jitter > 1) out << " − [0, " << config.query_jitter << ")";
    out << ", targets in [" << config.first_target() << ", "
        << config.last_target() << "]\n"
        << "record: key " << config.record.key_tokens << ", then " << config.record.gap << " between, value "
        << config.record.value_tokens << " tokens; layout " << to_string(config.layout) << "\n";
    out << right("residue", 8) << ' ' << right("phase", 6) << ' ' << right("layout", 16) << ' ' << right("valid", 7)
        << ' ' << right("errored", 7) << ' ' << right(binary ? "accuracy%" : "mean_p%", 10) << ' '
        << right("95% CI", 19);
    if (attributed) out << "  failures: select/read/write/readout/?";
    out << '\n';
    for (const auto& r : residues) {
      if (r.planned == 0) {
        out << right(std::to_string(r.residue), 8) << ' ' << right(std::to_string(r.phase), 6) << ' '
            << right(to_string(r.layout), 16) << "   (not planned: layout " << to_string(config.layout) << ")\n";
        continue;
      }
      const char* mark = (valid && r.residue == a.best_residue) ? " best" : (valid && r.residue == a.worst_residue) ? " worst" : "";
      out << right(std::to_string(r.residue), 8) << ' ' << right(std::to_string(r.phase), 6) << ' '
          << right(to_string(r.layout), 16) << ' ' << right(std::to_string(r.valid), 7) << ' '
          << right(std::to_string(r.errored), 7) << ' ' << right(fixed(100.0 * r.estimate, 2), 10) << "   ["
          << right(fixed(100.0 * r.ci_low, 2), 6) << ", " << right(fixed(100.0 * r.ci_high, 2), 6) << ']';
      if (attributed)
        out << "  " << r.failures[1] << '/' << r.failures[2] << '/' << r.failures[3] << '/' << r.failures[4] << '/'
            << r.failures[0];
      out << mark << '\n';
    }
    if (!valid) {
      out << "summary: n/a (invalid sweep; gap, homogeneity and period not reported)\n";
    } else {
      out << "mean " << fixed(100.0 * a.mean, 2) << "%  gap " << fixed(a.gap_points, 2) << " points (best residue "
          << a.best_residue << ", worst " << a.worst_residue << ")\n";
      out << "homogeneity: " << a.homogeneity.test << " statistic " << format_number(a.homogeneity.statistic, 6) << ", dof "
          << a.homogeneity.dof;
      if (!binary) out << "/" << a.homogeneity.dof_within;
      out << ", p = " << format_number(a.homogeneity.p_value, 4)
          << (a.homogeneity.approximate ? " (approximate: an expected cell count is below 5)" : "") << "\n";
      out << "dominant period (all trials): " << period_text(a.period, has_period()) << "\n";
    }
    if (!valid) {
      out << "profiles: n/a (invalid sweep)\n";
    } else {
      out << "profiles (gaps in points; debiased = chosen on half the trials, measured on the other; phase = the fold "
             "onto the "
          << config.stride << " in-block offsets):\n"
          << right("profile", 10) << ' ' << right("residues", 8) << ' ' << right("trials", 7) << ' ' << right("mean%", 7)
          << ' ' << right("gap", 6) << ' ' << right("debiased gap [95% CI]", 24) << ' '
          << right("phase amplitude [95% CI]", 25) << ' ' << right("phase p", 8) << ' ' << right("homog. p", 9)
          << "  period\n";
      const auto interval = [](const stats::interval_estimate& e) {
        if (!std::isfinite(e.estimate)) return std::string("n/a");
        std::string t = fixed(100.0 * e.estimate, 2);
        if (std::isfinite(e.low)) t += " [" + fixed(100.0 * e.low, 2) + ", " + fixed(100.0 * e.high, 2) + "]";
        return t;
      };
      for (const auto& p : profiles) {
        out << right(p.name, 10) << ' ' << right(std::to_string(p.residues.size()), 8) << ' '
            << right(std::to_string(p.trials), 7) << ' ';
        if (!p.valid) {
          out << "  n/a: " << p.invalid_reason << '\n';
          continue;
        }
        out << right(fixed(100.0 * p.mean, 2), 7) << ' ' << right(fixed(p.gap_points, 2), 6) << ' '
            << right(interval(p.debiased_gap), 24) << ' ' << right(interval(p.phase_amplitude), 25) << ' '
            << right(std::isfinite(p.phase_test.p_value) ? format_number(p.phase_test.p_value, 3) : "n/a", 8) << ' '
            << right(format_number(p.homogeneity.p_value, 3), 9) << "  " << period_text(p.period, p.has_period())
            << '\n';
      }
    }
    if (errored_trials > 0)
      out << "errored trials: " << errored_trials << " (excluded; no outcome, not wrong answers); first error: "
          << first_error << "\n";
    return out.str();
  }

  // One plain table (one header row, then one row per residue, nothing else), so any CSV reader
  // takes it as is:
  //   residue,phase,layout,planned,valid,errored,successes,estimate,ci_low,ci_high,
  //   selection_miss,read_dilution,write_dilution,readout,unattributed
  // (successes and the failure counts empty for probability sweeps; estimate/CI as fractions; NaN
  // as "nan"). The summary is to_summary_csv() or to_json().
  std::string to_csv() const {
    phasekv::detail::classic_stream out;
    const bool binary = kind == outcome_kind::binary;
    out << "residue,phase,layout,planned,valid,errored,successes,estimate,ci_low,ci_high,selection_miss,read_dilution,"
           "write_dilution,readout,unattributed\n";
    for (const auto& r : residues) {
      out << r.residue << ',' << r.phase << ',' << to_string(r.layout) << ',' << r.planned << ',' << r.valid << ','
          << r.errored << ',' << (binary ? std::to_string(r.successes) : std::string()) << ','
          << phasekv::detail::format_number(r.estimate) << ',' << phasekv::detail::format_number(r.ci_low) << ','
          << phasekv::detail::format_number(r.ci_high);
      for (std::size_t c : {1, 2, 3, 4, 0}) out << ',' << (binary ? std::to_string(r.failures[c]) : std::string());
      out << '\n';
    }
    return out.str();
  }

  // The summary as a two-column table with header "key,value", for a file of its own next to
  // to_csv()'s. Not-a-number values are "nan"; the period's fields are empty unless has_period().
  // The profiles follow as "<profile>.<field>" keys.
  std::string to_summary_csv() const {
    const profile_summary& a = all();
    using phasekv::detail::csv_field;
    using phasekv::detail::format_number;
    const bool reported = has_period();
    phasekv::detail::classic_stream out;
    out << "key,value\n"
        << "kind," << (kind == outcome_kind::binary ? "binary" : "probability") << '\n'
        << "valid," << (valid ? "true" : "false") << '\n'
        << "invalid_reason," << csv_field(invalid_reason) << '\n'
        << "stride," << config.stride << '\n'
        << "window," << config.resolved_window() << '\n'
        << "origin," << config.origin << '\n'
        << "modulus," << config.modulus << '\n'
        << "trials_per_residue," << config.trials_per_residue << '\n'
        << "query_position," << config.query_position << '\n'
        << "query_jitter," << config.query_jitter << '\n'
        << "record_length," << config.record.length() << '\n'
        << "layout_mode," << to_string(config.layout) << '\n'
        << "mean," << format_number(a.mean) << '\n'
        << "gap_points," << format_number(a.gap_points) << '\n'
        << "best_residue," << a.best_residue << '\n'
        << "worst_residue," << a.worst_residue << '\n'
        << "test," << a.homogeneity.test << '\n'
        << "statistic," << format_number(a.homogeneity.statistic) << '\n'
        << "p_value," << format_number(a.homogeneity.p_value) << '\n'
        << "period_of,all\n"
        << "dominant_period," << (reported ? format_number(a.period.period) : "") << '\n'
        << "frequency," << (reported ? std::to_string(a.period.frequency) : "") << '\n'
        << "power_fraction," << (reported ? format_number(a.period.power_fraction) : "") << '\n'
        << "flat," << (a.period.flat ? "true" : "false") << '\n'
        << "errored_trials," << errored_trials << '\n'
        << "first_error," << csv_field(first_error) << '\n';
    for (const auto& p : profiles) {
      const std::string k = p.name + '.';
      out << k << "valid," << (p.valid ? "true" : "false") << '\n'
          << k << "residues," << p.residues.size() << '\n'
          << k << "trials," << p.trials << '\n'
          << k << "mean," << format_number(p.mean) << '\n'
          << k << "gap_points," << format_number(p.gap_points) << '\n'
          << k << "debiased_gap_points," << format_number(100.0 * p.debiased_gap.estimate) << '\n'
          << k << "debiased_gap_low," << format_number(100.0 * p.debiased_gap.low) << '\n'
          << k << "debiased_gap_high," << format_number(100.0 * p.debiased_gap.high) << '\n'
          << k << "phase_amplitude_points," << format_number(100.0 * p.phase_amplitude.estimate) << '\n'
          << k << "phase_amplitude_low," << format_number(100.0 * p.phase_amplitude.low) << '\n'
          << k << "phase_amplitude_high," << format_number(100.0 * p.phase_amplitude.high) << '\n'
          << k << "phase_p_value," << format_number(p.phase_test.p_value) << '\n'
          << k << "p_value," << format_number(p.homogeneity.p_value) << '\n'
          << k << "dominant_period," << (p.has_period() ? format_number(p.period.period) : "") << '\n';
    }
    return out.str();
  }

  // A JSON object; non-finite numbers are null, and so are the period's fields unless has_period().
  std::string to_json() const {
    const profile_summary& a = all();
    using phasekv::detail::json_number;
    using phasekv::detail::json_string;
    const bool reported = has_period();
    const bool binary = kind == outcome_kind::binary;
    phasekv::detail::classic_stream out;
    const auto failures = [&](const std::int64_t (&f)[failure_causes]) {
      if (!binary) return std::string("null");
      std::string t = "{";
      for (std::size_t c : {1, 2, 3, 4, 0})
        t += (t.size() > 1 ? "," : "") + json_string(to_string(static_cast<failure_cause>(c))) + ":" + std::to_string(f[c]);
      return t + "}";
    };
    const auto interval = [&](const stats::interval_estimate& e) {
      return "{\"points\":" + json_number(100.0 * e.estimate) + ",\"low\":" + json_number(100.0 * e.low) +
             ",\"high\":" + json_number(100.0 * e.high) + "}";
    };
    out << "{\"kind\":" << json_string(binary ? "binary" : "probability")
        << ",\"valid\":" << (valid ? "true" : "false") << ",\"invalid_reason\":" << json_string(invalid_reason)
        << ",\"stride\":" << config.stride << ",\"window\":" << config.resolved_window()
        << ",\"origin\":" << config.origin << ",\"modulus\":" << config.modulus
        << ",\"record\":{\"key_tokens\":" << config.record.key_tokens << ",\"gap\":" << config.record.gap
        << ",\"value_tokens\":" << config.record.value_tokens << "},\"layout_mode\":" << json_string(to_string(config.layout))
        << ",\"trials_per_residue\":" << config.trials_per_residue << ",\"query_position\":" << config.query_position
        << ",\"query_jitter\":" << config.query_jitter
        << ",\"first_target\":" << config.first_target() << ",\"last_target\":" << config.last_target()
        << ",\"mean\":" << json_number(a.mean) << ",\"gap_points\":" << json_number(a.gap_points)
        << ",\"best_residue\":" << a.best_residue << ",\"worst_residue\":" << a.worst_residue
        << ",\"homogeneity\":{\"test\":" << json_string(a.homogeneity.test)
        << ",\"statistic\":" << json_number(a.homogeneity.statistic) << ",\"dof\":" << a.homogeneity.dof
        << ",\"dof_within\":" << a.homogeneity.dof_within << ",\"p_value\":" << json_number(a.homogeneity.p_value)
        << ",\"approximate\":" << (a.homogeneity.approximate ? "true" : "false") << "}"
        << ",\"period_of\":\"all\",\"dominant_period\":{\"period\":" << (reported ? json_number(a.period.period) : "null")
        << ",\"frequency\":" << (reported ? std::to_string(a.period.frequency) : "null")
        << ",\"power_fraction\":" << (reported ? json_number(a.period.power_fraction) : "null")
        << ",\"flat\":" << (a.period.flat ? "true" : "false") << "}"
        << ",\"errored_trials\":" << errored_trials << ",\"first_error\":" << json_string(first_error)
        << ",\"attributed\":" << (attributed ? "true" : "false") << ",\"residues\":[";
    for (std::size_t i = 0; i < residues.size(); ++i) {
      const auto& r = residues[i];
      out << (i ? "," : "") << "{\"residue\":" << r.residue << ",\"phase\":" << r.phase
          << ",\"layout\":" << json_string(to_string(r.layout)) << ",\"planned\":" << r.planned
          << ",\"valid\":" << r.valid << ",\"errored\":" << r.errored
          << ",\"successes\":" << (binary ? std::to_string(r.successes) : "null")
          << ",\"estimate\":" << json_number(r.estimate) << ",\"ci_low\":" << json_number(r.ci_low)
          << ",\"ci_high\":" << json_number(r.ci_high) << ",\"failures\":" << failures(r.failures) << "}";
    }
    out << "],\"layouts\":[";
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      const auto& l = layouts[i];
      out << (i ? "," : "") << "{\"layout\":" << json_string(to_string(l.layout)) << ",\"residues\":" << l.residues
          << ",\"valid\":" << l.valid << ",\"successes\":" << (binary ? std::to_string(l.successes) : "null")
          << ",\"estimate\":" << json_number(l.estimate) << ",\"ci_low\":" << json_number(l.ci_low)
          << ",\"ci_high\":" << json_number(l.ci_high) << ",\"failures\":" << failures(l.failures) << "}";
    }
    out << "],\"profiles\":[";
    for (std::size_t i = 0; i < profiles.size(); ++i) {
      const auto& p = profiles[i];
      out << (i ? "," : "") << "{\"name\":" << json_string(p.name) << ",\"residues\":[";
      for (std::size_t k = 0; k < p.residues.size(); ++k) out << (k ? "," : "") << p.residues[k];
      out << "],\"trials\":" << p.trials << ",\"valid\":" << (p.valid ? "true" : "false")
          << ",\"invalid_reason\":" << json_string(p.invalid_reason) << ",\"mean\":" << json_number(p.mean)
          << ",\"gap_points\":" << json_number(p.gap_points) << ",\"best_residue\":" << p.best_residue
          << ",\"worst_residue\":" << p.worst_residue << ",\"p_value\":" << json_number(p.homogeneity.p_value)
          << ",\"debiased_gap\":" << interval(p.debiased_gap) << ",\"phase_amplitude\":" << interval(p.phase_amplitude)
          << ",\"phase_test\":{\"statistic\":" << json_number(p.phase_test.statistic)
          << ",\"null_mean\":" << json_number(p.phase_test.null_mean) << ",\"p_value\":" << json_number(p.phase_test.p_value)
          << ",\"permutations\":" << p.phase_test.permutations << "},\"dominant_period\":"
          << (p.has_period() ? json_number(p.period.period) : "null") << "}";
    }
    out << "]}";
    return out.str();
  }

 private:
  std::string period_text(const stats::periodicity& p, bool reported) const {
    if (p.flat) return "none (flat profile)";
    if (!reported) return "none (no significant phase effect)";
    const std::string text = phasekv::detail::format_number(p.period, 6) + " (frequency " +
                             std::to_string(p.frequency) + ", " +
                             phasekv::detail::format_number(100.0 * p.power_fraction, 4) + "% of the variation)";
    // One cycle over the whole profile fits any uneven profile: no evidence of a repeating pattern
    // (unless the residues are one block, M = S, where one cycle is the phase effect itself).
    const bool trivial = p.frequency == 1 && config.resolved_modulus() != config.stride;
    return trivial ? text + ", the trivial fit: one cycle over all residues, not a repeating pattern" : text;
  }
};

namespace detail {

// An invalid sweep reports no profile: each keeps its name, residues, trials and test, and says
// why; its figures are NaN / −1.
inline void invalidate_summary(sweep_result& result, std::string reason) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  result.valid = false;
  result.invalid_reason = std::move(reason);
  for (auto& p : result.profiles) {
    profile_summary blank;
    blank.name = p.name;
    blank.residues = p.residues;
    blank.trials = p.trials;
    blank.homogeneity.test = p.homogeneity.test;
    blank.homogeneity.statistic = blank.homogeneity.p_value = nan;
    blank.period.period = blank.period.power_fraction = nan;
    blank.invalid_reason = result.invalid_reason;
    p = std::move(blank);
  }
}

// Estimate and 95% interval of n values in [0, 1]: Wilson for 0/1 outcomes, else the normal
// approximation of the mean (clipped to [0, 1]).
inline void estimate_of(bool binary, std::int64_t successes, const std::vector<double>& v, double& estimate,
                        double& low, double& high) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (v.empty()) {
    estimate = low = high = nan;
    return;
  }
  if (binary) {
    const auto w = stats::wilson_interval(successes, static_cast<std::int64_t>(v.size()));
    estimate = w.estimate;
    low = w.low;
    high = w.high;
    return;
  }
  double sum = 0.0;
  for (double x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  double squares = 0.0;
  for (double x : v) squares += (x - mean) * (x - mean);
  const double half = v.size() > 1 ? stats::z_95 * std::sqrt(squares / static_cast<double>(v.size() - 1) /
                                                             static_cast<double>(v.size()))
                                   : nan;
  estimate = mean;
  low = std::max(0.0, mean - half);
  high = std::min(1.0, mean + half);
}

// One profile's statistics over the residues `members` (planned, in order). values[r] and
// strata[r] are residue r's valid outcomes and their trial indices.
inline profile_summary summarize_profile(std::string name, const sweep_result& result,
                                         const std::vector<std::int64_t>& members,
                                         const std::vector<std::vector<double>>& values,
                                         const std::vector<std::vector<std::int64_t>>& strata, std::uint64_t salt) {
  const sweep_config& config = result.config;
  const bool binary = result.kind == outcome_kind::binary;
  profile_summary out;
  out.name = std::move(name);
  out.residues = members;
  out.homogeneity.test = binary ? "chi_square" : "anova";
  out.homogeneity.statistic = out.homogeneity.p_value = std::numeric_limits<double>::quiet_NaN();
  for (std::int64_t r : members) out.trials += result.residues[static_cast<std::size_t>(r)].valid;
  if (members.size() < 2) {
    out.invalid_reason = members.empty() ? "no planned residue has this layout" : "one residue: nothing to compare";
    return out;
  }
  for (std::int64_t r : members)
    if (result.residues[static_cast<std::size_t>(r)].valid < sweep_config::minimum_trials) {
      out.invalid_reason = "residue " + std::to_string(r) + " has fewer than " +
                           std::to_string(sweep_config::minimum_trials) + " valid trials";
      return out;
    }
  out.valid = true;
  std::vector<double> profile;
  for (std::int64_t r : members) profile.push_back(result.residues[static_cast<std::size_t>(r)].estimate);
  const auto summary = stats::summarize_residues(profile);
  out.mean = summary.mean;
  out.gap_points = summary.gap_points;
  out.best_residue = members[static_cast<std::size_t>(summary.best_residue)];
  out.worst_residue = members[static_cast<std::size_t>(summary.worst_residue)];

  // Standard errors for the period's χ² fit (stats::dominant_period). Binary: √(p̄(1 − p̄)/n_r)
  // with p̄ the success rate pooled over the profile's residues — the spread a residue would have
  // with no phase effect, and never 0 at a residue that happened to score 0% or 100% (its own
  // p̂(1 − p̂) would be, making any departure from the fold infinitely significant). A pooled
  // p̄ of 0 or 1 means a flat profile, which never reaches the fit. Probabilities: the sample
  // standard error s_r/√n_r of the residue's mean; 0 when every trial of the residue returned
  // the same value, which dominant_period raises to its tiny floor.
  const std::size_t m = result.residues.size();
  std::vector<double> full(m, 0.0), errors(m, 0.0);
  std::vector<char> present(m, 0);
  std::int64_t pooled_successes = 0, pooled_trials = 0;
  for (std::int64_t r : members) {
    pooled_successes += result.residues[static_cast<std::size_t>(r)].successes;
    pooled_trials += result.residues[static_cast<std::size_t>(r)].valid;
  }
  const double rate = static_cast<double>(pooled_successes) / static_cast<double>(pooled_trials);
  for (std::int64_t r : members) {
    const auto i = static_cast<std::size_t>(r);
    const auto& v = values[i];
    const double n = static_cast<double>(v.size());
    full[i] = result.residues[i].estimate;
    present[i] = 1;
    if (binary) {
      errors[i] = std::sqrt(rate * (1.0 - rate) / n);
    } else {
      double squares = 0.0;
      for (double x : v) squares += (x - full[i]) * (x - full[i]);
      errors[i] = std::sqrt(squares / (n - 1.0) / n);
    }
  }
  if (members.size() == m)
    out.period = stats::dominant_period(full, errors);
  else
    out.period = stats::dominant_period_present(full, errors, present);

  if (binary) {
    std::vector<std::int64_t> successes, trials;
    for (std::int64_t r : members) {
      successes.push_back(result.residues[static_cast<std::size_t>(r)].successes);
      trials.push_back(result.residues[static_cast<std::size_t>(r)].valid);
    }
    const auto test = stats::chi_square_homogeneity(successes, trials);
    out.homogeneity = {"chi_square", test.statistic, test.dof, 0, test.p_value, test.min_expected < 5.0};
  } else {
    std::vector<std::vector<double>> groups;
    for (std::int64_t r : members) groups.push_back(values[static_cast<std::size_t>(r)]);
    const auto test = stats::anova_homogeneity(groups);
    out.homogeneity = {"anova", test.f_statistic, test.dof_between, test.dof_within, test.p_value, false};
  }

  // The resampling statistics: residues as groups; classes = the residues themselves (the gap)
  // or their in-block offsets (the phase fold).
  std::vector<stats::observation> obs;
  std::vector<std::int64_t> identity, phase_class;
  std::vector<std::int64_t> phase_index(static_cast<std::size_t>(config.stride), -1);
  std::int64_t phases = 0;
  for (std::size_t g = 0; g < members.size(); ++g) {
    const auto r = static_cast<std::size_t>(members[g]);
    identity.push_back(static_cast<std::int64_t>(g));
    auto& k = phase_index[static_cast<std::size_t>(result.residues[r].phase)];
    if (k < 0) k = phases++;
    phase_class.push_back(k);
    for (std::size_t i = 0; i < values[r].size(); ++i)
      obs.push_back({static_cast<std::int64_t>(g), strata[r][i], values[r][i]});
  }
  const std::uint64_t seed = config.seed ^ (0x9E3779B97F4A7C15ull * (salt + 1));
  out.debiased_gap = stats::debiased_gap(obs, identity, static_cast<std::int64_t>(members.size()));
  const auto clip = [](stats::interval_estimate& e) {  // a difference of fractions lies in [−1, 1]
    e.low = std::max(-1.0, e.low);
    e.high = std::min(1.0, e.high);
  };
  clip(out.debiased_gap);
  if (phases >= 2) {
    out.phase_amplitude = stats::debiased_gap(obs, phase_class, phases);
    clip(out.phase_amplitude);
    out.phase_test = stats::fold_permutation_test(obs, phase_class, phases, config.permutations, seed);
  }
  return out;
}

template <class T>
struct outcome_traits {
  static constexpr bool binary = std::is_same_v<T, bool> || std::is_same_v<T, attributed_outcome>;
  static constexpr bool supported = binary || std::is_floating_point_v<T>;
};

}  // namespace detail

// Runs `trial` on every placement of plan_sweep(config), in the plan's shuffled order, and
// summarises. `trial(const placement&)` returns bool, an attributed_outcome (a bool with the
// cause of a failure) or a floating-point probability.
// Throws config_error for a bad config (before any trial runs); errored trials never throw.
template <class Trial>
sweep_result run_sweep(const sweep_config& config, Trial&& trial) {
  using returned = std::decay_t<std::invoke_result_t<Trial&, const placement&>>;
  static_assert(detail::outcome_traits<returned>::supported,
                "run_sweep: the trial must return bool (success), attributed_outcome or a floating-point "
                "probability in [0, 1]");
  constexpr bool binary = detail::outcome_traits<returned>::binary;
  const std::vector<placement> plan = plan_sweep(config);
  const std::int64_t m = config.resolved_modulus();
  const geometry stream = config.stream();

  sweep_result result;
  result.config = config;
  result.config.modulus = m;
  result.kind = binary ? outcome_kind::binary : outcome_kind::probability;
  result.residues.resize(static_cast<std::size_t>(m));
  std::vector<std::vector<double>> values(static_cast<std::size_t>(m));
  std::vector<std::vector<std::int64_t>> strata(static_cast<std::size_t>(m));
  for (std::int64_t r = 0; r < m; ++r) {
    auto& row = result.residues[static_cast<std::size_t>(r)];
    row.residue = r;
    row.phase = stream.phase_of(r);
    row.layout = config.class_of_residue(r);
    row.planned = config.planned_residue(r) ? config.trials_per_residue : 0;
  }

  for (const placement& p : plan) {
    residue_outcome& row = result.residues[static_cast<std::size_t>(p.residue)];
    std::string failure;
    double value = 0.0;
    failure_cause cause = failure_cause::unattributed;
    try {
      const returned outcome = trial(p);
      if constexpr (std::is_same_v<returned, attributed_outcome>) {
        value = outcome.success ? 1.0 : 0.0;
        cause = outcome.cause;
        if (!outcome.success && static_cast<std::size_t>(cause) >= failure_causes)
          failure = "returned failure cause " + std::to_string(static_cast<int>(cause)) + ", not a failure_cause";
      } else if constexpr (binary) {
        value = outcome ? 1.0 : 0.0;
      } else {
        value = static_cast<double>(outcome);
        if (!(value >= 0.0 && value <= 1.0))  // NaN fails this too
          failure = "returned " + phasekv::detail::format_number(value, 17) + ", not a probability in [0, 1]";
      }
    } catch (const std::exception& e) {
      failure = std::string("threw: ") + e.what();
    } catch (...) {
      failure = "threw a non-std::exception";
    }
    if (!failure.empty()) {
      ++row.errored;
      ++result.errored_trials;
      if (result.first_error.empty())
        result.first_error = "trial " + std::to_string(p.trial) + " of residue " + std::to_string(p.residue) +
                             " (target " + std::to_string(p.target_position) + ") " + failure;
      continue;
    }
    ++row.valid;
    if (binary && value == 1.0) ++row.successes;
    if (binary && value == 0.0) {
      const auto c = static_cast<std::size_t>(cause);  // in range: an out-of-range cause errored above
      if (c < failure_causes) ++row.failures[c];
      if (cause != failure_cause::unattributed) result.attributed = true;
    }
    values[static_cast<std::size_t>(p.residue)].push_back(value);
    strata[static_cast<std::size_t>(p.residue)].push_back(p.trial);
  }

  // Per-residue and per-layout estimates and intervals.
  std::int64_t short_residue = -1;
  result.layouts.resize(3);
  std::vector<std::vector<double>> layout_values(3);
  for (std::size_t c = 0; c < 3; ++c) result.layouts[c].layout = static_cast<layout_class>(c);
  for (std::size_t r = 0; r < result.residues.size(); ++r) {
    residue_outcome& row = result.residues[r];
    if (row.planned == 0) {
      row.estimate = row.ci_low = row.ci_high = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (row.valid < sweep_config::minimum_trials && short_residue < 0) short_residue = static_cast<std::int64_t>(r);
    detail::estimate_of(binary, row.successes, values[r], row.estimate, row.ci_low, row.ci_high);
    auto& l = result.layouts[static_cast<std::size_t>(row.layout)];
    ++l.residues;
    l.valid += row.valid;
    l.successes += row.successes;
    for (std::size_t c = 0; c < failure_causes; ++c) l.failures[c] += row.failures[c];
    auto& lv = layout_values[static_cast<std::size_t>(row.layout)];
    lv.insert(lv.end(), values[r].begin(), values[r].end());
  }
  for (std::size_t c = 0; c < 3; ++c)
    detail::estimate_of(binary, result.layouts[c].successes, layout_values[c], result.layouts[c].estimate,
                        result.layouts[c].ci_low, result.layouts[c].ci_high);

  std::vector<std::int64_t> all, contained, straddle;
  for (const auto& row : result.residues) {
    if (row.planned == 0) continue;
    all.push_back(row.residue);
    (row.layout == layout_class::contained ? contained : straddle).push_back(row.residue);
  }
  result.profiles.push_back(detail::summarize_profile("all", result, all, values, strata, 0));
  result.profiles.push_back(detail::summarize_profile("contained", result, contained, values, strata, 1));
  result.profiles.push_back(detail::summarize_profile("straddle", result, straddle, values, strata, 2));

  if (short_residue >= 0) {
    const auto& row = result.residues[static_cast<std::size_t>(short_residue)];
    detail::invalidate_summary(result, "residue " + std::to_string(short_residue) + " has " +
                                           std::to_string(row.valid) + " valid trials (" + std::to_string(row.errored) +
                                           " errored); at least " + std::to_string(sweep_config::minimum_trials) +
                                           " are needed");
  }
  return result;
}

}  // namespace phasekv::diag
