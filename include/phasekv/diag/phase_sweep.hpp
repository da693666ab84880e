#pragma once
// The phase sweep harness: run a host-supplied trial with the target placed at
// every residue r = t mod M (M a multiple of the stride S, default 2S) and report accuracy by
// residue, the gap, a homogeneity test, the dominant period — as a table, CSV and JSON.
//
//   sweep_config              what to sweep; validate() names the field that is wrong
//   plan_sweep                the placements: same count, matched position statistics per residue
//   plan_position_statistics  per-residue count, mean and variance of a plan's target positions
//   assign_haystacks          which context each placement's needle goes into (no overlaps)
//   run_sweep                 run a trial callable over a plan and summarise it
//
// The plan (the "rotation" design). Trials come in rounds of M; round g has an anchor A_g, a
// multiple of M. Trial i of residue r (round g = i / M, rotation j ∈ [0, M)) targets
//     p = A_g − j + ((r + j) mod M)        ≡ r (mod M)
// so for one trial index the M residues fill the M consecutive positions [A_g − j, A_g − j + M):
// every residue sees the same anchor, and a host that derives its haystack from `trial` gets a
// paired design (residues compared on the same content). Relative to the anchor, residue r is
// at offset u = r (for j < M − r) or r − M (otherwise); over a full round (j = 0 … M−1) these
// sum to 0, so
//   * mean: the mean target position is EXACTLY the same for every residue when M divides
//     trials_per_residue (it is the mean anchor). Otherwise the last, partial round of m trials
//     uses rotations spread evenly over [0, M) (j_k = floor((2k+1)M / 2m)), whose offsets sum to
//     within ±M/2, so means differ by at most M / trials_per_residue.
//   * variance: a full round adds r(M − r) to residue r's variance (the offsets r and r − M are
//     forced: M numbers ≡ r (mod M) with sum 0 have at least that spread), so variances differ by
//     at most M²/4 tokens² (M²/2 with a partial round) — against an anchor spread of ~span²/12.
//     Exact equality of both moments needs trials_per_residue to be a multiple of about M²/2
//     (a congruence argument on Σp and Σp²), which would make large strides unaffordable; this
//     design keeps the exact mean, which is the confound that matters (distance to the query),
//     and a variance difference that is a fraction of one block.
// Anchors of the full rounds are spread evenly over the target range; the partial round's anchor
// is the multiple of M nearest their mean (so its offsets cannot tilt the variance). The
// query position is the same for every trial. The run order of the trials is a Fisher–Yates
// shuffle seeded by `seed` (SplitMix64), so drift in a long run (warm caches, thermal state)
// cannot line up with residue; the plan is a deterministic function of the config.
//
// Target range: targets lie in [query_position − min_distance − span, query_position − min_distance],
// i.e. at least min_distance tokens before the query and at most min_distance + span.
//
// Outcomes. `trial(const placement&)` returns bool (success) or a floating-point probability in
// [0, 1]. A trial that throws, or returns NaN or a probability outside [0, 1], is an ERRORED trial:
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

#include "phasekv/core/error.hpp"
#include "phasekv/core/text.hpp"
#include "phasekv/diag/statistics.hpp"

namespace phasekv::diag {

struct sweep_config {
  static constexpr std::int64_t minimum_trials = 10;  // valid trials per residue (see top)

  std::int64_t stride = 0;                // S
  std::int64_t modulus = 0;               // M, a multiple of S; 0 → 2·S
  std::int64_t trials_per_residue = 32;   // ≥ minimum_trials
  std::int64_t query_position = 0;        // fixed for every trial
  std::int64_t span = 0;                  // width of the target range, ≥ 3·M
  std::int64_t min_distance = 1;          // targets at least this far before the query, ≥ 1
  std::uint64_t seed = 0;                 // run order only

  std::int64_t resolved_modulus() const { return modulus == 0 ? 2 * stride : modulus; }
  std::int64_t first_target() const { return query_position - min_distance - span; }
  std::int64_t last_target() const { return query_position - min_distance; }

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
    require(query_position - min_distance - span >= 0, "query_position", query_position,
            "must be at least min_distance + span = " + std::to_string(min_distance + span) +
                " so every target position is non-negative");
  }
};

struct placement {
  std::int64_t residue = 0;          // target_position mod M
  std::int64_t trial = 0;            // index within the residue; equal index → same anchor block
  std::int64_t target_position = 0;
  std::int64_t query_position = 0;
  std::int64_t distance() const { return query_position - target_position; }
};

namespace detail {

inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace detail

// Every residue's trials_per_residue placements, in a seeded shuffled run order.
inline std::vector<placement> plan_sweep(const sweep_config& config) {
  config.validate();
  const std::int64_t m = config.resolved_modulus();
  const std::int64_t n = config.trials_per_residue;
  const std::int64_t lo = config.first_target(), hi = config.last_target();
  // Anchor indices a (anchor a·M) with every rotated position inside [lo, hi].
  const std::int64_t a_min = (lo + m - 1 + m - 1) / m;
  const std::int64_t a_max = (hi - m + 1) / m;
  const std::int64_t full = n / m, partial = n % m;
  std::vector<std::int64_t> anchor(static_cast<std::size_t>(full + (partial > 0 ? 1 : 0)));
  const std::int64_t width = a_max - a_min;
  for (std::int64_t g = 0; g < full; ++g) {
    anchor[static_cast<std::size_t>(g)] =
        full == 1 ? a_min + width / 2 : a_min + (2 * g * width + (full - 1)) / (2 * (full - 1));
  }
  if (partial > 0) {
    std::int64_t sum = 0;
    for (std::int64_t g = 0; g < full; ++g) sum += anchor[static_cast<std::size_t>(g)];
    anchor.back() = full == 0 ? a_min + width / 2 : (2 * sum + full) / (2 * full);
  }
  std::vector<placement> plan;
  plan.reserve(static_cast<std::size_t>(m * n));
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t g = i / m, k = i % m;
      const std::int64_t j = g < full ? k : ((2 * k + 1) * m) / (2 * partial);
      const std::int64_t position = anchor[static_cast<std::size_t>(g)] * m - j + (r + j) % m;
      plan.push_back({r, i, position, config.query_position});
    }
  }
  std::uint64_t state = config.seed;
  for (std::size_t i = plan.size(); i > 1; --i) {
    const std::size_t pick = static_cast<std::size_t>(detail::splitmix64(state) % i);
    std::swap(plan[i - 1], plan[pick]);
  }
  return plan;
}

struct residue_position_stats {
  std::int64_t residue = 0;
  std::int64_t count = 0;
  double mean = 0.0;      // of target_position
  double variance = 0.0;  // population variance (divide by count)
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
  return out;
}

// Haystacks for a plan (the paired design's content). A host that puts several needles into one
// context — one prefill serving many trials — needs needles that do not overlap, while plan_sweep
// places targets at consecutive positions and repeats positions. This assigns every placement a
// haystack index: in plan order (which is shuffled), each placement goes to the first haystack
// holding no needle that overlaps its own [target_position, target_position + needle_tokens).
// So no haystack has overlapping needles, a repeated placement lands in another haystack (an
// independent context, not a copied outcome), and each residue's trials spread over many
// haystacks (at least min(M/2, trials_per_residue/2) in the tests), so haystack content is not confounded with residue.
// Measured: M haystacks for needle_tokens = 1, 2–3·M for 2 (the probe's records), never more
// than M·(needle_tokens + 1).
// Returns the haystack of each placement, in plan order; haystacks are numbered by first use.
inline std::vector<std::int64_t> assign_haystacks(const std::vector<placement>& plan, std::int64_t needle_tokens) {
  phasekv::detail::require<input_error>(needle_tokens >= 1 && needle_tokens <= (std::int64_t{1} << 20), "needle_tokens",
                                        needle_tokens, "must lie in [1, 2^20]");
  std::vector<std::set<std::int64_t>> needles;  // per haystack: its needles' target positions
  std::vector<std::int64_t> haystack(plan.size());
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const std::int64_t t = plan[i].target_position;
    std::size_t h = 0;
    for (; h < needles.size(); ++h) {  // overlap: another needle starts in (t − needle_tokens, t + needle_tokens)
      const auto next = needles[h].lower_bound(t - needle_tokens + 1);
      if (next == needles[h].end() || *next >= t + needle_tokens) break;
    }
    if (h == needles.size()) needles.emplace_back();
    needles[h].insert(t);
    haystack[i] = static_cast<std::int64_t>(h);
  }
  return haystack;
}

enum class outcome_kind { binary, probability };

struct residue_outcome {
  std::int64_t residue = 0;
  std::int64_t planned = 0;
  std::int64_t valid = 0;       // trials that returned a usable outcome
  std::int64_t errored = 0;     // threw / NaN / out of range: no outcome, not a wrong answer
  std::int64_t successes = 0;   // binary only; wrong answers are valid − successes
  double estimate = 0.0;        // accuracy or mean probability (NaN with no valid trial)
  double ci_low = 0.0;          // 95%: Wilson (binary) or normal approximation of the mean
  double ci_high = 0.0;
};

struct homogeneity_result {
  std::string test;              // "chi_square" or "anova"
  double statistic = 0.0;        // χ² or F
  std::int64_t dof = 0;          // χ²: M − 1; ANOVA: between-groups dof
  std::int64_t dof_within = 0;   // ANOVA only
  double p_value = 0.0;
  bool approximate = false;      // χ² with an expected cell below 5
};

namespace detail {

inline std::string format_number(double x, int precision = 10) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return phasekv::detail::general(x, precision);
}

inline std::string json_number(double x) { return std::isfinite(x) ? format_number(x, 17) : "null"; }

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          const char* hex = "0123456789abcdef";
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// Free text as one CSV field (RFC 4180): quoted when it holds a comma or a quote, with quotes
// doubled; line breaks become spaces so a line-based reader cannot be derailed either.
inline std::string csv_field(const std::string& s) {
  std::string out;
  bool quote = false;
  for (char c : s) {
    if (c == '\n' || c == '\r') c = ' ';
    if (c == ',' || c == '"') quote = true;
    out += c;
    if (c == '"') out += '"';
  }
  return quote ? '"' + out + '"' : out;
}

}  // namespace detail

struct sweep_result {
  sweep_config config;                      // as given, with modulus resolved
  outcome_kind kind = outcome_kind::binary;
  std::vector<residue_outcome> residues;    // M rows, residue order
  std::int64_t errored_trials = 0;
  std::string first_error;                  // message of the first errored trial ("" if none)
  bool valid = true;
  std::string invalid_reason;
  // Summary (NaN / −1 when invalid).
  double mean = 0.0;                        // unweighted mean over residues
  double gap_points = 0.0;                  // (best − worst)·100
  std::int64_t best_residue = -1;
  std::int64_t worst_residue = -1;
  homogeneity_result homogeneity;
  stats::periodicity period;                // of the per-residue estimate profile (fitted; see has_period)

  // Below this homogeneity p-value the residues differ: a phase effect, whose period is reported.
  static constexpr double phase_effect_alpha = 0.05;

  // Whether `period` means anything: a valid sweep, a profile that is not flat, and a phase effect
  // (homogeneity p < phase_effect_alpha). Without an effect dominant_period still fits a fold
  // (the smallest divisor that suits the noise), which would read as a finding. The writers
  // report the period only when this holds.
  bool has_period() const { return valid && !period.flat && homogeneity.p_value < phase_effect_alpha; }

  // A fixed-width table for a terminal or a log. An invalid sweep starts with "INVALID SWEEP".
  std::string to_table() const {
    phasekv::detail::classic_stream out;
    const bool binary = kind == outcome_kind::binary;
    if (!valid) out << "INVALID SWEEP: " << invalid_reason << "\n";
    out << "phase sweep: stride " << config.stride << ", modulus " << config.modulus << ", "
        << config.trials_per_residue << " trials/residue, query at " << config.query_position << ", targets in ["
        << config.first_target() << ", " << config.last_target() << "]\n";
    using phasekv::detail::fixed;
    using phasekv::detail::right;
    out << right("residue", 8) << ' ' << right("phase", 6) << ' ' << right("valid", 7) << ' ' << right("errored", 7)
        << ' ' << right(binary ? "accuracy%" : "mean_p%", 10) << ' ' << right("95% CI", 19) << '\n';
    for (const auto& r : residues) {
      const char* mark = (valid && r.residue == best_residue) ? " best" : (valid && r.residue == worst_residue) ? " worst" : "";
      out << right(std::to_string(r.residue), 8) << ' ' << right(std::to_string(r.residue % config.stride), 6) << ' '
          << right(std::to_string(r.valid), 7) << ' ' << right(std::to_string(r.errored), 7) << ' '
          << right(fixed(100.0 * r.estimate, 2), 10) << "   [" << right(fixed(100.0 * r.ci_low, 2), 6) << ", "
          << right(fixed(100.0 * r.ci_high, 2), 6) << ']' << mark << '\n';
    }
    if (!valid) {
      out << "summary: n/a (invalid sweep; gap, homogeneity and period not reported)\n";
    } else {
      out << "mean " << fixed(100.0 * mean, 2) << "%  gap " << fixed(gap_points, 2) << " points (best residue "
          << best_residue << ", worst " << worst_residue << ")\n";
      out << "homogeneity: " << homogeneity.test << " statistic " << detail::format_number(homogeneity.statistic, 6)
          << ", dof " << homogeneity.dof;
      if (!binary) out << "/" << homogeneity.dof_within;
      out << ", p = " << detail::format_number(homogeneity.p_value, 4)
          << (homogeneity.approximate ? " (approximate: an expected cell count is below 5)" : "") << "\n";
      if (period.flat)
        out << "dominant period: none (flat profile)\n";
      else if (!has_period())
        out << "dominant period: none (no significant phase effect)\n";
      else
        out << "dominant period: " << detail::format_number(period.period, 6) << " (frequency " << period.frequency
            << ", " << detail::format_number(100.0 * period.power_fraction, 4) << "% of the variation)\n";
    }
    if (errored_trials > 0)
      out << "errored trials: " << errored_trials << " (excluded; no outcome, not wrong answers); first error: "
          << first_error << "\n";
    return out.str();
  }

  // One plain table (one header row, then one row per residue, nothing else), so any CSV reader
  // takes it as is:
  //   residue,phase,planned,valid,errored,successes,estimate,ci_low,ci_high
  // (successes empty for probability sweeps; estimate/CI as fractions; NaN as "nan"). The summary
  // is to_summary_csv() or to_json().
  std::string to_csv() const {
    phasekv::detail::classic_stream out;
    const bool binary = kind == outcome_kind::binary;
    out << "residue,phase,planned,valid,errored,successes,estimate,ci_low,ci_high\n";
    for (const auto& r : residues) {
      out << r.residue << ',' << r.residue % config.stride << ',' << r.planned << ',' << r.valid << ',' << r.errored
          << ',' << (binary ? std::to_string(r.successes) : std::string()) << ',' << detail::format_number(r.estimate)
          << ',' << detail::format_number(r.ci_low) << ',' << detail::format_number(r.ci_high) << '\n';
    }
    return out.str();
  }

  // The summary as a two-column table with header "key,value", for a file of its own next to
  // to_csv()'s. Not-a-number values are "nan"; the period's fields are empty unless has_period().
  std::string to_summary_csv() const {
    using detail::csv_field;
    using detail::format_number;
    const bool reported = has_period();
    phasekv::detail::classic_stream out;
    out << "key,value\n"
        << "kind," << (kind == outcome_kind::binary ? "binary" : "probability") << '\n'
        << "valid," << (valid ? "true" : "false") << '\n'
        << "invalid_reason," << csv_field(invalid_reason) << '\n'
        << "stride," << config.stride << '\n'
        << "modulus," << config.modulus << '\n'
        << "trials_per_residue," << config.trials_per_residue << '\n'
        << "query_position," << config.query_position << '\n'
        << "mean," << format_number(mean) << '\n'
        << "gap_points," << format_number(gap_points) << '\n'
        << "best_residue," << best_residue << '\n'
        << "worst_residue," << worst_residue << '\n'
        << "test," << homogeneity.test << '\n'
        << "statistic," << format_number(homogeneity.statistic) << '\n'
        << "p_value," << format_number(homogeneity.p_value) << '\n'
        << "dominant_period," << (reported ? format_number(period.period) : "") << '\n'
        << "frequency," << (reported ? std::to_string(period.frequency) : "") << '\n'
        << "power_fraction," << (reported ? format_number(period.power_fraction) : "") << '\n'
        << "flat," << (period.flat ? "true" : "false") << '\n'
        << "errored_trials," << errored_trials << '\n'
        << "first_error," << csv_field(first_error) << '\n';
    return out.str();
  }

  // A JSON object; non-finite numbers are null, and so are the period's fields unless has_period().
  std::string to_json() const {
    using detail::json_number;
    using detail::json_string;
    const bool reported = has_period();
    phasekv::detail::classic_stream out;
    out << "{\"kind\":" << json_string(kind == outcome_kind::binary ? "binary" : "probability")
        << ",\"valid\":" << (valid ? "true" : "false") << ",\"invalid_reason\":" << json_string(invalid_reason)
        << ",\"stride\":" << config.stride << ",\"modulus\":" << config.modulus
        << ",\"trials_per_residue\":" << config.trials_per_residue << ",\"query_position\":" << config.query_position
        << ",\"first_target\":" << config.first_target() << ",\"last_target\":" << config.last_target()
        << ",\"mean\":" << json_number(mean) << ",\"gap_points\":" << json_number(gap_points)
        << ",\"best_residue\":" << best_residue << ",\"worst_residue\":" << worst_residue
        << ",\"homogeneity\":{\"test\":" << json_string(homogeneity.test)
        << ",\"statistic\":" << json_number(homogeneity.statistic) << ",\"dof\":" << homogeneity.dof
        << ",\"dof_within\":" << homogeneity.dof_within << ",\"p_value\":" << json_number(homogeneity.p_value)
        << ",\"approximate\":" << (homogeneity.approximate ? "true" : "false") << "}"
        << ",\"dominant_period\":{\"period\":" << (reported ? json_number(period.period) : "null")
        << ",\"frequency\":" << (reported ? std::to_string(period.frequency) : "null")
        << ",\"power_fraction\":" << (reported ? json_number(period.power_fraction) : "null")
        << ",\"flat\":" << (period.flat ? "true" : "false") << "}"
        << ",\"errored_trials\":" << errored_trials << ",\"first_error\":" << json_string(first_error)
        << ",\"residues\":[";
    for (std::size_t i = 0; i < residues.size(); ++i) {
      const auto& r = residues[i];
      out << (i ? "," : "") << "{\"residue\":" << r.residue << ",\"phase\":" << r.residue % config.stride
          << ",\"planned\":" << r.planned << ",\"valid\":" << r.valid << ",\"errored\":" << r.errored
          << ",\"successes\":" << (kind == outcome_kind::binary ? std::to_string(r.successes) : "null")
          << ",\"estimate\":" << json_number(r.estimate) << ",\"ci_low\":" << json_number(r.ci_low)
          << ",\"ci_high\":" << json_number(r.ci_high) << "}";
    }
    out << "]}";
    return out.str();
  }
};

namespace detail {

inline void invalidate_summary(sweep_result& result, std::string reason) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  result.valid = false;
  result.invalid_reason = std::move(reason);
  result.mean = result.gap_points = nan;
  result.best_residue = result.worst_residue = -1;
  result.homogeneity.statistic = result.homogeneity.p_value = nan;
  result.period = stats::periodicity{};
  result.period.period = result.period.power_fraction = nan;
}

}  // namespace detail

// Runs `trial` on every placement of plan_sweep(config), in the plan's shuffled order, and
// summarises. `trial(const placement&)` returns bool or a floating-point probability.
// Throws config_error for a bad config (before any trial runs); errored trials never throw.
template <class Trial>
sweep_result run_sweep(const sweep_config& config, Trial&& trial) {
  using returned = std::decay_t<std::invoke_result_t<Trial&, const placement&>>;
  static_assert(std::is_same_v<returned, bool> || std::is_floating_point_v<returned>,
                "run_sweep: the trial must return bool (success) or a floating-point probability in [0, 1]");
  constexpr bool binary = std::is_same_v<returned, bool>;
  const std::vector<placement> plan = plan_sweep(config);
  const std::int64_t m = config.resolved_modulus();

  sweep_result result;
  result.config = config;
  result.config.modulus = m;
  result.kind = binary ? outcome_kind::binary : outcome_kind::probability;
  result.residues.resize(static_cast<std::size_t>(m));
  std::vector<std::vector<double>> values(static_cast<std::size_t>(m));
  for (std::int64_t r = 0; r < m; ++r) {
    result.residues[static_cast<std::size_t>(r)].residue = r;
    result.residues[static_cast<std::size_t>(r)].planned = config.trials_per_residue;
  }

  for (const placement& p : plan) {
    residue_outcome& row = result.residues[static_cast<std::size_t>(p.residue)];
    std::string failure;
    double value = 0.0;
    try {
      const returned outcome = trial(p);
      if constexpr (binary) {
        value = outcome ? 1.0 : 0.0;
      } else {
        value = static_cast<double>(outcome);
        if (!(value >= 0.0 && value <= 1.0))  // NaN fails this too
          failure = "returned " + detail::format_number(value, 17) + ", not a probability in [0, 1]";
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
    values[static_cast<std::size_t>(p.residue)].push_back(value);
  }

  // Per-residue estimates and intervals (for every residue with at least one valid trial).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::int64_t short_residue = -1;
  for (std::size_t r = 0; r < result.residues.size(); ++r) {
    residue_outcome& row = result.residues[r];
    if (row.valid < sweep_config::minimum_trials && short_residue < 0) short_residue = static_cast<std::int64_t>(r);
    if (row.valid == 0) {
      row.estimate = row.ci_low = row.ci_high = nan;
      continue;
    }
    if constexpr (binary) {
      const auto w = stats::wilson_interval(row.successes, row.valid);
      row.estimate = w.estimate;
      row.ci_low = w.low;
      row.ci_high = w.high;
    } else {
      const auto& v = values[r];
      double sum = 0.0;
      for (double x : v) sum += x;
      const double mean = sum / static_cast<double>(v.size());
      double squares = 0.0;
      for (double x : v) squares += (x - mean) * (x - mean);
      const double half =
          v.size() > 1 ? stats::z_95 * std::sqrt(squares / static_cast<double>(v.size() - 1) / static_cast<double>(v.size()))
                       : nan;
      row.estimate = mean;
      row.ci_low = std::max(0.0, mean - half);
      row.ci_high = std::min(1.0, mean + half);
    }
  }
  if (short_residue >= 0) {
    const auto& row = result.residues[static_cast<std::size_t>(short_residue)];
    detail::invalidate_summary(result, "residue " + std::to_string(short_residue) + " has " +
                                           std::to_string(row.valid) + " valid trials (" + std::to_string(row.errored) +
                                           " errored); at least " + std::to_string(sweep_config::minimum_trials) +
                                           " are needed");
    result.homogeneity.test = binary ? "chi_square" : "anova";
    return result;
  }

  std::vector<double> profile(result.residues.size());
  for (std::size_t r = 0; r < profile.size(); ++r) profile[r] = result.residues[r].estimate;
  const auto summary = stats::summarize_residues(profile);
  result.mean = summary.mean;
  result.gap_points = summary.gap_points;
  result.best_residue = summary.best_residue;
  result.worst_residue = summary.worst_residue;
  // Standard errors for the period's χ² fit (stats::dominant_period). Binary: √(p̄(1 − p̄)/n_r)
  // with p̄ the success rate pooled over all residues — the spread a residue would have with no
  // phase effect, and never 0 at a residue that happened to score 0% or 100% (its own
  // p̂(1 − p̂) would be, making any departure from the fold infinitely significant). A pooled
  // p̄ of 0 or 1 means a flat profile, which never reaches the fit. Probabilities: the sample
  // standard error s_r/√n_r of the residue's mean; 0 when every trial of the residue returned
  // the same value, which dominant_period raises to its tiny floor.
  std::vector<double> standard_errors(profile.size());
  if constexpr (binary) {
    std::int64_t pooled_successes = 0, pooled_trials = 0;
    for (const auto& row : result.residues) {
      pooled_successes += row.successes;
      pooled_trials += row.valid;
    }
    const double rate = static_cast<double>(pooled_successes) / static_cast<double>(pooled_trials);
    for (std::size_t r = 0; r < profile.size(); ++r)
      standard_errors[r] = std::sqrt(rate * (1.0 - rate) / static_cast<double>(result.residues[r].valid));
  } else {
    for (std::size_t r = 0; r < profile.size(); ++r) {
      const auto& v = values[r];  // ≥ minimum_trials values: the summary is valid
      double squares = 0.0;
      for (double x : v) squares += (x - profile[r]) * (x - profile[r]);
      const double n = static_cast<double>(v.size());
      standard_errors[r] = std::sqrt(squares / (n - 1.0) / n);
    }
  }
  result.period = stats::dominant_period(profile, standard_errors);
  if constexpr (binary) {
    std::vector<std::int64_t> successes, trials;
    for (const auto& row : result.residues) {
      successes.push_back(row.successes);
      trials.push_back(row.valid);
    }
    const auto test = stats::chi_square_homogeneity(successes, trials);
    result.homogeneity = {"chi_square", test.statistic, test.dof, 0, test.p_value, test.min_expected < 5.0};
  } else {
    const auto test = stats::anova_homogeneity(values);
    result.homogeneity = {"anova", test.f_statistic, test.dof_between, test.dof_within, test.p_value, false};
  }
  return result;
}

}  // namespace phasekv::diag
