#pragma once
// What a phase sweep found (sweep_result): per residue, per layout class and per profile — all
// trials, contained records, straddling records — each profile with its homogeneity test,
// period, debiased gap and phase amplitude. run_sweep (phase_sweep.hpp) fills it; the table, CSV
// and JSON reports are sweep_report.hpp's.

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/diag/read_attribution.hpp"
#include "phasekv/diag/record_layout.hpp"
#include "phasekv/study/resampling.hpp"
#include "phasekv/study/statistics.hpp"
#include "phasekv/study/sweep_plan.hpp"

namespace phasekv::diag {

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

}  // namespace detail
}  // namespace phasekv::diag
