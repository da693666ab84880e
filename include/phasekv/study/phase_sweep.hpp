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
// The plan is sweep_plan.hpp, the result sweep_result.hpp, its table, CSV and JSON
// sweep_report.hpp; this header includes all three.
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
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/study/resampling.hpp"
#include "phasekv/study/statistics.hpp"
#include "phasekv/study/sweep_plan.hpp"
#include "phasekv/study/sweep_report.hpp"
#include "phasekv/study/sweep_result.hpp"

namespace phasekv::diag {
namespace detail {

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
