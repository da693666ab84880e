#pragma once
// The reports of a phase sweep's result: a fixed-width table (to_table), the per-residue CSV
// (to_csv), the summary as key,value CSV (to_summary_csv) and JSON (to_json). Numbers are written
// in the classic locale whatever the host's; non-finite ones as "nan" (CSV) or null (JSON).

#include <cmath>
#include <cstdint>
#include <string>

#include "phasekv/detail/text.hpp"
#include "phasekv/study/sweep_result.hpp"

namespace phasekv::diag {
namespace detail {

// The period as the table says it: none, or the fit and, for one cycle over all M residues, why
// that says nothing.
inline std::string period_text(const sweep_config& config, const stats::periodicity& p, bool reported) {
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

}  // namespace detail

// A fixed-width table for a terminal or a log. An invalid sweep starts with "INVALID SWEEP".
inline std::string to_table(const sweep_result& result) {
  const profile_summary& a = result.all();
  phasekv::detail::classic_stream out;
  const bool binary = result.kind == outcome_kind::binary;
  using phasekv::detail::fixed;
  using phasekv::detail::right;
  using phasekv::detail::format_number;
  if (!result.valid) out << "INVALID SWEEP: " << result.invalid_reason << "\n";
  out << "phase sweep: stride " << result.config.stride << ", window " << result.config.resolved_window() << ", origin "
      << result.config.origin << ", modulus " << result.config.modulus << ", " << result.config.trials_per_residue
      << " trials/residue, query at " << result.config.query_position;
  if (result.config.query_jitter > 1) out << " − [0, " << result.config.query_jitter << ")";
  out << ", targets in [" << result.config.first_target() << ", "
      << result.config.last_target() << "]\n"
      << "record: key " << result.config.record.key_tokens << ", then " << result.config.record.gap << " between, value "
      << result.config.record.value_tokens << " tokens; layout " << to_string(result.config.layout) << "\n";
  out << right("residue", 8) << ' ' << right("phase", 6) << ' ' << right("layout", 16) << ' ' << right("valid", 7)
      << ' ' << right("errored", 7) << ' ' << right(binary ? "accuracy%" : "mean_p%", 10) << ' '
      << right("95% CI", 19);
  if (result.attributed) out << "  failures: select/read/write/readout/?";
  out << '\n';
  for (const auto& r : result.residues) {
    if (r.planned == 0) {
      out << right(std::to_string(r.residue), 8) << ' ' << right(std::to_string(r.phase), 6) << ' '
          << right(to_string(r.layout), 16) << "   (not planned: layout " << to_string(result.config.layout) << ")\n";
      continue;
    }
    const char* mark = !result.valid                  ? ""
                       : r.residue == a.best_residue  ? " best"
                       : r.residue == a.worst_residue ? " worst"
                                                      : "";
    out << right(std::to_string(r.residue), 8) << ' ' << right(std::to_string(r.phase), 6) << ' '
        << right(to_string(r.layout), 16) << ' ' << right(std::to_string(r.valid), 7) << ' '
        << right(std::to_string(r.errored), 7) << ' ' << right(fixed(100.0 * r.estimate, 2), 10) << "   ["
        << right(fixed(100.0 * r.ci_low, 2), 6) << ", " << right(fixed(100.0 * r.ci_high, 2), 6) << ']';
    if (result.attributed)
      out << "  " << r.failures[1] << '/' << r.failures[2] << '/' << r.failures[3] << '/' << r.failures[4] << '/'
          << r.failures[0];
    out << mark << '\n';
  }
  if (!result.valid) {
    out << "summary: n/a (invalid sweep; gap, homogeneity and period not reported)\n";
  } else {
    out << "mean " << fixed(100.0 * a.mean, 2) << "%  gap " << fixed(a.gap_points, 2) << " points (best residue "
        << a.best_residue << ", worst " << a.worst_residue << ")\n";
    out << "homogeneity: " << a.homogeneity.test << " statistic " << format_number(a.homogeneity.statistic, 6) << ", dof "
        << a.homogeneity.dof;
    if (!binary) out << "/" << a.homogeneity.dof_within;
    out << ", p = " << format_number(a.homogeneity.p_value, 4)
        << (a.homogeneity.approximate ? " (approximate: an expected cell count is below 5)" : "") << "\n";
    out << "dominant period (all trials): " << detail::period_text(result.config, a.period, result.has_period()) << "\n";
  }
  if (!result.valid) {
    out << "profiles: n/a (invalid sweep)\n";
  } else {
    out << "profiles (gaps in points; debiased = chosen on half the trials, measured on the other; phase = the fold "
           "onto the "
        << result.config.stride << " in-block offsets):\n"
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
    for (const auto& p : result.profiles) {
      out << right(p.name, 10) << ' ' << right(std::to_string(p.residues.size()), 8) << ' '
          << right(std::to_string(p.trials), 7) << ' ';
      if (!p.valid) {
        out << "  n/a: " << p.invalid_reason << '\n';
        continue;
      }
      out << right(fixed(100.0 * p.mean, 2), 7) << ' ' << right(fixed(p.gap_points, 2), 6) << ' '
          << right(interval(p.debiased_gap), 24) << ' ' << right(interval(p.phase_amplitude), 25) << ' '
          << right(std::isfinite(p.phase_test.p_value) ? format_number(p.phase_test.p_value, 3) : "n/a", 8) << ' '
          << right(format_number(p.homogeneity.p_value, 3), 9) << "  "
          << detail::period_text(result.config, p.period, p.has_period())
          << '\n';
    }
  }
  if (result.errored_trials > 0)
    out << "errored trials: " << result.errored_trials << " (excluded; no outcome, not wrong answers); first error: "
        << result.first_error << "\n";
  return out.str();
}

// One plain table (one header row, then one row per residue, nothing else), so any CSV reader
// takes it as is:
//   residue,phase,layout,planned,valid,errored,successes,estimate,ci_low,ci_high,
//   selection_miss,read_dilution,write_dilution,readout,unattributed
// (successes and the failure counts empty for probability sweeps; estimate/CI as fractions; NaN
// as "nan"). The summary is to_summary_csv() or to_json().
inline std::string to_csv(const sweep_result& result) {
  phasekv::detail::classic_stream out;
  const bool binary = result.kind == outcome_kind::binary;
  out << "residue,phase,layout,planned,valid,errored,successes,estimate,ci_low,ci_high,selection_miss,read_dilution,"
         "write_dilution,readout,unattributed\n";
  for (const auto& r : result.residues) {
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
inline std::string to_summary_csv(const sweep_result& result) {
  const profile_summary& a = result.all();
  using phasekv::detail::csv_field;
  using phasekv::detail::format_number;
  const bool reported = result.has_period();
  phasekv::detail::classic_stream out;
  out << "key,value\n"
      << "kind," << (result.kind == outcome_kind::binary ? "binary" : "probability") << '\n'
      << "valid," << (result.valid ? "true" : "false") << '\n'
      << "invalid_reason," << csv_field(result.invalid_reason) << '\n'
      << "stride," << result.config.stride << '\n'
      << "window," << result.config.resolved_window() << '\n'
      << "origin," << result.config.origin << '\n'
      << "modulus," << result.config.modulus << '\n'
      << "trials_per_residue," << result.config.trials_per_residue << '\n'
      << "query_position," << result.config.query_position << '\n'
      << "query_jitter," << result.config.query_jitter << '\n'
      << "record_length," << result.config.record.length() << '\n'
      << "layout_mode," << to_string(result.config.layout) << '\n'
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
      << "errored_trials," << result.errored_trials << '\n'
      << "first_error," << csv_field(result.first_error) << '\n';
  for (const auto& p : result.profiles) {
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
inline std::string to_json(const sweep_result& result) {
  const profile_summary& a = result.all();
  using phasekv::detail::json_number;
  using phasekv::detail::json_string;
  const bool reported = result.has_period();
  const bool binary = result.kind == outcome_kind::binary;
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
      << ",\"valid\":" << (result.valid ? "true" : "false") << ",\"invalid_reason\":" << json_string(result.invalid_reason)
      << ",\"stride\":" << result.config.stride << ",\"window\":" << result.config.resolved_window()
      << ",\"origin\":" << result.config.origin << ",\"modulus\":" << result.config.modulus
      << ",\"record\":{\"key_tokens\":" << result.config.record.key_tokens << ",\"gap\":" << result.config.record.gap
      << ",\"value_tokens\":" << result.config.record.value_tokens
      << "},\"layout_mode\":" << json_string(to_string(result.config.layout))
      << ",\"trials_per_residue\":" << result.config.trials_per_residue
      << ",\"query_position\":" << result.config.query_position
      << ",\"query_jitter\":" << result.config.query_jitter
      << ",\"first_target\":" << result.config.first_target() << ",\"last_target\":" << result.config.last_target()
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
      << ",\"errored_trials\":" << result.errored_trials << ",\"first_error\":" << json_string(result.first_error)
      << ",\"attributed\":" << (result.attributed ? "true" : "false") << ",\"residues\":[";
  for (std::size_t i = 0; i < result.residues.size(); ++i) {
    const auto& r = result.residues[i];
    out << (i ? "," : "") << "{\"residue\":" << r.residue << ",\"phase\":" << r.phase
        << ",\"layout\":" << json_string(to_string(r.layout)) << ",\"planned\":" << r.planned
        << ",\"valid\":" << r.valid << ",\"errored\":" << r.errored
        << ",\"successes\":" << (binary ? std::to_string(r.successes) : "null")
        << ",\"estimate\":" << json_number(r.estimate) << ",\"ci_low\":" << json_number(r.ci_low)
        << ",\"ci_high\":" << json_number(r.ci_high) << ",\"failures\":" << failures(r.failures) << "}";
  }
  out << "],\"layouts\":[";
  for (std::size_t i = 0; i < result.layouts.size(); ++i) {
    const auto& l = result.layouts[i];
    out << (i ? "," : "") << "{\"layout\":" << json_string(to_string(l.layout)) << ",\"residues\":" << l.residues
        << ",\"valid\":" << l.valid << ",\"successes\":" << (binary ? std::to_string(l.successes) : "null")
        << ",\"estimate\":" << json_number(l.estimate) << ",\"ci_low\":" << json_number(l.ci_low)
        << ",\"ci_high\":" << json_number(l.ci_high) << ",\"failures\":" << failures(l.failures) << "}";
  }
  out << "],\"profiles\":[";
  for (std::size_t i = 0; i < result.profiles.size(); ++i) {
    const auto& p = result.profiles[i];
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

}  // namespace phasekv::diag
