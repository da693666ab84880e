// study/ for evaluations: the phase-sweep planner and harness with its reports (table, CSV,
// JSON), the statistics (phasekv.stats) and the SVG plot (phasekv.plot). The plan/analyze
// protocol and Dask runs (python/phasekv/sweep.py) build on these: plan_sweep() is deterministic
// in the config, so outcomes recorded anywhere are replayed through run_sweep() by a trial that
// looks them up by (residue, trial).

#include <phasekv/study/haystacks.hpp>
#include <phasekv/study/logistic.hpp>
#include <phasekv/study/phase_sweep.hpp>
#include <phasekv/study/statistics.hpp>
#include <phasekv/study/svg_plot.hpp>

#include "common.hpp"

namespace pyphasekv {
// This file's own namespace: the study's names are unqualified here alone, not in the files the
// module's unity build compiles after it.
namespace sweep_bindings {

using namespace phasekv;
using namespace phasekv::diag;

namespace {

// A Python trial for run_sweep. An exception raised by the trial is an errored trial, as in C++,
// recorded as "threw: <Type>: <message>". KeyboardInterrupt and SystemExit are not outcomes: the
// first one stops the sweep (later trials error without being called) and is raised again once
// run_sweep returns.
struct python_trial {
  py::function call;
  std::shared_ptr<py::error_already_set> stop;

  py::object operator()(const placement& p) {
    if (stop) throw std::runtime_error("not run: the sweep was interrupted");
    try {
      return call(p);
    } catch (py::error_already_set& e) {
      if (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) {
        stop = std::make_shared<py::error_already_set>(std::move(e));
        throw std::runtime_error("interrupted");
      }
      // The protocol's own "no outcome" exception reports its message alone, no class name.
      if (py::hasattr(e.value(), "phasekv_message_only")) throw std::runtime_error(py::str(e.value()).cast<std::string>());
      throw std::runtime_error(py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
                               py::str(e.value()).cast<std::string>());
    }
  }
};

sweep_result run_python_sweep(const sweep_config& config, const py::function& trial, outcome_kind kind) {
  python_trial call{trial, nullptr};
  sweep_result result;
  if (kind == outcome_kind::binary) {
    // Strict: only a bool (or NumPy bool) is an outcome; 0.7 is not "true".
    const py::object numpy_bool = py::module_::import("numpy").attr("bool_");
    result = run_sweep(config, [&](const placement& p) -> attributed_outcome {
      const py::object outcome = call(p);
      if (py::isinstance<attributed_outcome>(outcome)) return outcome.cast<attributed_outcome>();
      if (!py::isinstance<py::bool_>(outcome) && !py::isinstance(outcome, numpy_bool))
        throw std::runtime_error("returned " + py::repr(outcome).cast<std::string>() +
                                 ", not a bool or an AttributedOutcome (a probability sweep takes "
                                 "kind=OutcomeKind.probability)");
      return attributed_outcome{outcome.cast<bool>(), failure_cause::unattributed};
    });
  } else {
    result = run_sweep(config, [&](const placement& p) -> double { return call(p).cast<double>(); });
  }
  if (call.stop) throw *call.stop;
  return result;
}

}  // namespace

void init_sweep(const modules& m) {
  py::module_ root = m.root;

  // ---- record layouts (diag/record_layout.hpp)
  struct_binding<record_shape>(root, "RecordShape", "A record's tokens: key, gap, then value (the target is its first token).")
      .field("key_tokens", &record_shape::key_tokens)
      .field("value_tokens", &record_shape::value_tokens)
      .field("gap", &record_shape::gap, "tokens between the key and the value")
      .checked_when_built([](const record_shape& r) { r.validate(); })
      .done()
      .def("length", &record_shape::length)
      .def("validate", &record_shape::validate);
  py::enum_<layout_class>(root, "LayoutClass", "How a record sits against a stream's entries.")
      .value("contained", layout_class::contained, "inside one block")
      .value("straddle_covered", layout_class::straddle_covered, "crosses a block boundary; some window holds it whole")
      .value("straddle_split", layout_class::straddle_split, "no window holds it whole");
  py::enum_<layout_mode>(root, "LayoutMode", "Which residues a plan holds.")
      .value("any", layout_mode::any)
      .value("contained", layout_mode::contained)
      .value("straddle", layout_mode::straddle);
  py::enum_<failure_cause>(root, "FailureCause", "Why a failed trial failed (classify_failure).")
      .value("unattributed", failure_cause::unattributed)
      .value("selection_miss", failure_cause::selection_miss)
      .value("read_dilution", failure_cause::read_dilution)
      .value("write_dilution", failure_cause::write_dilution)
      .value("readout", failure_cause::readout);
  py::class_<record_layout>(root, "RecordLayout", "A record's span against a stream's entries (classify_record).")
      .def_readonly("first", &record_layout::first)
      .def_readonly("last", &record_layout::last)
      .def_readonly("first_offset", &record_layout::first_offset, "in-block offset (phase) of the first token")
      .def_readonly("last_offset", &record_layout::last_offset)
      .def_readonly("boundaries", &record_layout::boundaries, "block boundaries inside the record")
      .def_readonly("covering_entries", &record_layout::covering_entries, "entries whose window holds it whole")
      .def_readonly("first_covering", &record_layout::first_covering)
      .def_readonly("first_slot", &record_layout::first_slot)
      .def_readonly("kind", &record_layout::kind)
      .def("__repr__", [](const record_layout& l) {
        return "RecordLayout(first=" + std::to_string(l.first) + ", last=" + std::to_string(l.last) +
               ", kind=" + to_string(l.kind) + ", boundaries=" + std::to_string(l.boundaries) +
               ", covering_entries=" + std::to_string(l.covering_entries) + ")";
      });
  root.def("classify_record", &classify_record, py::arg("geometry"), py::arg("first"), py::arg("length"));
  root.def(
      "crowding",
      [](const geometry& g, std::int64_t first, std::int64_t length, const std::vector<std::int64_t>& others,
         std::int64_t others_length) {
        return crowding(g, first, length, span<const std::int64_t>(others), others_length);
      },
      py::arg("geometry"), py::arg("first"), py::arg("length"), py::arg("others"), py::arg("others_length"),
      "How many other records (starting at `others`) have a token in the tokens this record's entries pool.");

  // ---- phase sweep (study/phase_sweep.hpp)
  struct_binding<sweep_config>(root, "SweepConfig", "What a phase sweep sweeps (validate() names a bad field).")
      .field("stride", &sweep_config::stride, "S")
      .field("modulus", &sweep_config::modulus, "M, a multiple of S; 0 means 2S")
      .field("trials_per_residue", &sweep_config::trials_per_residue, ">= 10")
      .field("query_position", &sweep_config::query_position, "the latest query (see query_jitter)")
      .field("query_jitter", &sweep_config::query_jitter,
             "J: trial i queries at query_position - o_i, o_i in [0, J) the same for every residue")
      .field("span", &sweep_config::span, "width of the target range, >= 3M")
      .field("min_distance", &sweep_config::min_distance, "targets at least this far before the query")
      .field("seed", &sweep_config::seed, "run order and the permutation draws")
      .field("window", &sweep_config::window, "W of the stream layouts are classified against; 0 means stride")
      .field("origin", &sweep_config::origin, "the stream's chunk origin")
      .field("record", &sweep_config::record, "RecordShape of each trial's record")
      .field("layout", &sweep_config::layout, "LayoutMode: any, contained (within-window test) or straddle")
      .field("permutations", &sweep_config::permutations, "of the phase fold's permutation null")
      .checked_when_built([](const sweep_config& c) { c.validate(); })
      .done()
      .def("resolved_window", &sweep_config::resolved_window)
      .def("stream", &sweep_config::stream, "the Geometry layouts are classified against")
      .def("planned_residues", &sweep_config::planned_residues)
      .def_readonly_static("minimum_trials", &sweep_config::minimum_trials)
      .def("resolved_modulus", &sweep_config::resolved_modulus)
      .def("earliest_query", &sweep_config::earliest_query)
      .def("query_offset", &sweep_config::query_offset, py::arg("trial"))
      .def("first_target", &sweep_config::first_target)
      .def("last_target", &sweep_config::last_target)
      .def("validate", &sweep_config::validate);
  py::class_<placement>(root, "Placement", "One trial of a sweep: where its needle goes.")
      .def(py::init([](std::int64_t residue, std::int64_t trial, std::int64_t target, std::int64_t query) {
             placement p;
             p.residue = residue;
             p.trial = trial;
             p.target_position = target;
             p.query_position = query;
             return p;
           }),
           py::arg("residue"), py::arg("trial"), py::arg("target_position"), py::arg("query_position"))
      .def_readonly("residue", &placement::residue)
      .def_readonly("trial", &placement::trial, "index within the residue; equal index -> same anchor block")
      .def_readonly("target_position", &placement::target_position)
      .def_readonly("query_position", &placement::query_position)
      .def_readonly("layout", &placement::layout, "RecordLayout against the sweep's stream")
      .def("distance", &placement::distance)
      .def("__eq__",
           [](const placement& a, const placement& b) {
             return a.residue == b.residue && a.trial == b.trial && a.target_position == b.target_position &&
                    a.query_position == b.query_position;
           })
      .def("__hash__",
           [](const placement& p) {
             return py::hash(py::make_tuple(p.residue, p.trial, p.target_position, p.query_position));
           })
      .def("__repr__", [](const placement& p) {
        return "Placement(residue=" + std::to_string(p.residue) + ", trial=" + std::to_string(p.trial) +
               ", target_position=" + std::to_string(p.target_position) +
               ", query_position=" + std::to_string(p.query_position) + ")";
      });
  py::class_<residue_position_stats>(root, "ResiduePositionStats")
      .def_readonly("residue", &residue_position_stats::residue)
      .def_readonly("count", &residue_position_stats::count)
      .def_readonly("mean", &residue_position_stats::mean)
      .def_readonly("variance", &residue_position_stats::variance)
      .def_readonly("distinct", &residue_position_stats::distinct, "distinct target positions: effective trials");
  root.def("plan_sweep", &plan_sweep, py::arg("config"),
           "Every residue's placements in the seeded, shuffled run order (deterministic in the config).");
  root.def("plan_position_statistics", &plan_position_statistics, py::arg("plan"), py::arg("modulus"));
  root.def("assign_haystacks", &assign_haystacks, py::arg("plan"), py::arg("needle_tokens"),
           "The haystack of each placement (in plan order): the first one where its needle "
           "[target, target + needle_tokens) overlaps no other.");

  py::enum_<outcome_kind>(root, "OutcomeKind")
      .value("binary", outcome_kind::binary)
      .value("probability", outcome_kind::probability);
  py::class_<attributed_outcome>(root, "AttributedOutcome", "A binary outcome with the cause of a failure.")
      .def(py::init([](bool success, failure_cause cause) { return attributed_outcome{success, cause}; }),
           py::arg("success"), py::arg("cause") = failure_cause::unattributed)
      .def_readonly("success", &attributed_outcome::success)
      .def_readonly("cause", &attributed_outcome::cause);
  const auto failure_dict = [](const std::int64_t (&f)[failure_causes]) {
    py::dict d;
    for (std::size_t c = 0; c < failure_causes; ++c) d[to_string(static_cast<failure_cause>(c))] = f[c];
    return d;
  };
  py::class_<residue_outcome>(root, "ResidueOutcome")
      .def_readonly("residue", &residue_outcome::residue)
      .def_readonly("phase", &residue_outcome::phase)
      .def_readonly("layout", &residue_outcome::layout)
      .def_property_readonly("failures", [failure_dict](const residue_outcome& r) { return failure_dict(r.failures); },
                             "wrong answers by cause (a dict)")
      .def_readonly("planned", &residue_outcome::planned)
      .def_readonly("valid", &residue_outcome::valid)
      .def_readonly("errored", &residue_outcome::errored, "threw / NaN / out of range: no outcome, not a wrong answer")
      .def_readonly("successes", &residue_outcome::successes)
      .def_readonly("estimate", &residue_outcome::estimate)
      .def_readonly("ci_low", &residue_outcome::ci_low)
      .def_readonly("ci_high", &residue_outcome::ci_high);
  py::class_<layout_outcome>(root, "LayoutOutcome", "The trials of one layout class.")
      .def_readonly("layout", &layout_outcome::layout)
      .def_readonly("residues", &layout_outcome::residues)
      .def_readonly("valid", &layout_outcome::valid)
      .def_readonly("successes", &layout_outcome::successes)
      .def_readonly("estimate", &layout_outcome::estimate)
      .def_readonly("ci_low", &layout_outcome::ci_low)
      .def_readonly("ci_high", &layout_outcome::ci_high)
      .def_property_readonly("failures", [failure_dict](const layout_outcome& l) { return failure_dict(l.failures); });
  py::class_<homogeneity_result>(root, "HomogeneityResult")
      .def_readonly("test", &homogeneity_result::test, "chi_square or anova")
      .def_readonly("statistic", &homogeneity_result::statistic)
      .def_readonly("dof", &homogeneity_result::dof)
      .def_readonly("dof_within", &homogeneity_result::dof_within)
      .def_readonly("p_value", &homogeneity_result::p_value)
      .def_readonly("approximate", &homogeneity_result::approximate);
  py::class_<stats::interval_estimate>(m.stats, "IntervalEstimate")
      .def_readonly("estimate", &stats::interval_estimate::estimate)
      .def_readonly("low", &stats::interval_estimate::low)
      .def_readonly("high", &stats::interval_estimate::high);
  py::class_<stats::permutation_result>(m.stats, "PermutationResult")
      .def_readonly("statistic", &stats::permutation_result::statistic)
      .def_readonly("null_mean", &stats::permutation_result::null_mean)
      .def_readonly("p_value", &stats::permutation_result::p_value)
      .def_readonly("permutations", &stats::permutation_result::permutations);
  py::class_<profile_summary>(root, "ProfileSummary", "One profile of a sweep: all, contained or straddle.")
      .def_readonly("name", &profile_summary::name)
      .def_readonly("residues", &profile_summary::residues)
      .def_readonly("trials", &profile_summary::trials)
      .def_readonly("valid", &profile_summary::valid)
      .def_readonly("invalid_reason", &profile_summary::invalid_reason)
      .def_readonly("mean", &profile_summary::mean)
      .def_readonly("gap_points", &profile_summary::gap_points)
      .def_readonly("best_residue", &profile_summary::best_residue)
      .def_readonly("worst_residue", &profile_summary::worst_residue)
      .def_readonly("homogeneity", &profile_summary::homogeneity)
      .def_readonly("period", &profile_summary::period)
      .def_readonly("debiased_gap", &profile_summary::debiased_gap, "fractions, cross-fitted, with a 95% interval")
      .def_readonly("phase_amplitude", &profile_summary::phase_amplitude, "the debiased gap of the phase fold")
      .def_readonly("phase_test", &profile_summary::phase_test, "permutation test of the phase fold")
      .def("has_period", &profile_summary::has_period);
  py::class_<sweep_result>(root, "SweepResult", "A sweep's per-residue outcomes and summary, and its reports.")
      .def_readonly("config", &sweep_result::config)
      .def_readonly("kind", &sweep_result::kind)
      .def_readonly("residues", &sweep_result::residues)
      .def_readonly("errored_trials", &sweep_result::errored_trials)
      .def_readonly("first_error", &sweep_result::first_error)
      .def_readonly("valid", &sweep_result::valid)
      .def_readonly("invalid_reason", &sweep_result::invalid_reason)
      .def_property_readonly("all", &sweep_result::all, py::return_value_policy::reference_internal,
                             "the all-trials profile (profiles[0]): the figures below are its")
      .def_property_readonly("mean", [](const sweep_result& r) { return r.all().mean; })
      .def_property_readonly("gap_points", [](const sweep_result& r) { return r.all().gap_points; })
      .def_property_readonly("best_residue", [](const sweep_result& r) { return r.all().best_residue; })
      .def_property_readonly("worst_residue", [](const sweep_result& r) { return r.all().worst_residue; })
      .def_property_readonly(
          "homogeneity", [](const sweep_result& r) -> const homogeneity_result& { return r.all().homogeneity; },
          py::return_value_policy::reference_internal)
      .def_property_readonly(
          "period", [](const sweep_result& r) -> const stats::periodicity& { return r.all().period; },
          py::return_value_policy::reference_internal, "the fitted period; it means something only if has_period()")
      .def_readonly("layouts", &sweep_result::layouts, "per layout class: contained, straddle_covered, straddle_split")
      .def_readonly("profiles", &sweep_result::profiles, "all, contained, straddle")
      .def_readonly("attributed", &sweep_result::attributed)
      .def(
          "profile", [](const sweep_result& r, const std::string& name) { return r.profile(name); }, py::arg("name"),
          py::return_value_policy::reference_internal)
      .def_readonly_static("phase_effect_alpha", &sweep_result::phase_effect_alpha)
      .def("has_period", &sweep_result::has_period, "valid, not flat, and homogeneity p < phase_effect_alpha")
      .def("to_table", [](const sweep_result& r) { return to_table(r); })
      .def("to_csv", [](const sweep_result& r) { return to_csv(r); }, "one plain table, a row per residue")
      .def("to_summary_csv", [](const sweep_result& r) { return to_summary_csv(r); }, "the summary as key,value rows")
      .def("to_json", [](const sweep_result& r) { return to_json(r); });
  root.def("run_sweep", &run_python_sweep, py::arg("config"), py::arg("trial"), py::arg("kind") = outcome_kind::binary,
           "Runs trial(placement) on every placement of plan_sweep(config) in the plan's order and summarises. "
           "kind=binary: the trial returns a bool; kind=probability: a float in [0, 1]. A trial that raises is an "
           "errored trial (counted, excluded); KeyboardInterrupt stops the sweep and is raised again.");

  // ---- statistics (study/statistics.hpp), in phasekv.stats
  py::module_ stats = m.stats;
  stats.attr("z_95") = stats::z_95;
  stats.attr("period_fit_alpha") = stats::period_fit_alpha;
  stats.attr("period_explained_fraction") = stats::period_explained_fraction;
  py::class_<stats::proportion_interval>(stats, "ProportionInterval")
      .def_readonly("estimate", &stats::proportion_interval::estimate)
      .def_readonly("low", &stats::proportion_interval::low)
      .def_readonly("high", &stats::proportion_interval::high);
  py::class_<stats::chi_square_test>(stats, "ChiSquareTest")
      .def_readonly("statistic", &stats::chi_square_test::statistic)
      .def_readonly("dof", &stats::chi_square_test::dof)
      .def_readonly("p_value", &stats::chi_square_test::p_value)
      .def_readonly("min_expected", &stats::chi_square_test::min_expected);
  py::class_<stats::anova_test>(stats, "AnovaTest")
      .def_readonly("f_statistic", &stats::anova_test::f_statistic)
      .def_readonly("dof_between", &stats::anova_test::dof_between)
      .def_readonly("dof_within", &stats::anova_test::dof_within)
      .def_readonly("p_value", &stats::anova_test::p_value)
      .def_readonly("between_sum_squares", &stats::anova_test::between_sum_squares)
      .def_readonly("within_sum_squares", &stats::anova_test::within_sum_squares);
  // The logistic fit (study/logistic.hpp): x row-major n × k (the intercept column is the caller's).
  py::class_<stats::logistic_fit>(stats, "LogisticFit")
      .def_readonly("names", &stats::logistic_fit::names)
      .def_property_readonly("held",
                             [](const stats::logistic_fit& f) {
                               py::list out;
                               for (bool h : f.held) out.append(py::bool_(h));
                               return out;
                             })
      .def_readonly("coefficients", &stats::logistic_fit::coefficients)
      .def_readonly("standard_errors", &stats::logistic_fit::standard_errors)
      .def_readonly("z", &stats::logistic_fit::z)
      .def_readonly("p_values", &stats::logistic_fit::p_values)
      .def_readonly("log_likelihood", &stats::logistic_fit::log_likelihood)
      .def_readonly("penalized_log_likelihood", &stats::logistic_fit::penalized_log_likelihood)
      .def_readonly("observations", &stats::logistic_fit::observations)
      .def_readonly("iterations", &stats::logistic_fit::iterations)
      .def_readonly("converged", &stats::logistic_fit::converged)
      .def_readonly("firth", &stats::logistic_fit::firth);
  py::class_<stats::likelihood_ratio>(stats, "LikelihoodRatio")
      .def_readonly("statistic", &stats::likelihood_ratio::statistic)
      .def_readonly("dof", &stats::likelihood_ratio::dof)
      .def_readonly("p_value", &stats::likelihood_ratio::p_value);
  stats.def(
      "fit_logistic",
      [](const std::vector<double>& x, const std::vector<double>& y, std::size_t k, std::vector<std::string> names,
         bool firth, const std::vector<std::size_t>& zero, std::int64_t max_iterations) {
        stats::logistic_options options;
        options.firth = firth;
        options.zero = zero;
        options.max_iterations = max_iterations;
        return stats::fit_logistic(x, y, k, std::move(names), options);
      },
      py::arg("x"), py::arg("y"), py::arg("k"), py::arg("names") = std::vector<std::string>{},
      py::arg("firth") = true, py::arg("zero") = std::vector<std::size_t>{}, py::arg("max_iterations") = 100,
      "Firth-penalised (firth=True) logistic regression of y on the n × k covariates x (row-major, flat); "
      "zero: columns held at 0 (a null hypothesis for likelihood_ratio_test).");
  stats.def("likelihood_ratio_test", &stats::likelihood_ratio_test, py::arg("free"), py::arg("held"),
            "2 (l*_free − l*_held) against χ² with the columns held only by `held`.");
  py::class_<stats::periodicity>(stats, "Periodicity")
      .def_readonly("period", &stats::periodicity::period, "P, a divisor of M in [2, M]; 0 when flat")
      .def_readonly("frequency", &stats::periodicity::frequency)
      .def_readonly("power_fraction", &stats::periodicity::power_fraction)
      .def_readonly("flat", &stats::periodicity::flat);
  py::class_<stats::residue_summary>(stats, "ResidueSummary")
      .def_readonly("best_residue", &stats::residue_summary::best_residue)
      .def_readonly("worst_residue", &stats::residue_summary::worst_residue)
      .def_readonly("best", &stats::residue_summary::best)
      .def_readonly("worst", &stats::residue_summary::worst)
      .def_readonly("gap_points", &stats::residue_summary::gap_points)
      .def_readonly("mean", &stats::residue_summary::mean);
  // Sequences of numbers come in as lists or arrays (copied: a profile is a few dozen numbers).
  using counts = std::vector<std::int64_t>;
  using values = std::vector<double>;
  stats.def("wilson_interval", &stats::wilson_interval, py::arg("successes"), py::arg("trials"),
            py::arg("z") = stats::z_95);
  stats.def(
      "chi_square_homogeneity",
      [](const counts& successes, const counts& trials) {
        return stats::chi_square_homogeneity(span<const std::int64_t>(successes), span<const std::int64_t>(trials));
      },
      py::arg("successes"), py::arg("trials"));
  stats.def("anova_homogeneity", &stats::anova_homogeneity, py::arg("groups"));
  stats.def(
      "fold_fraction", [](const values& profile, std::int64_t period) { return stats::fold_fraction(profile, period); },
      py::arg("profile"), py::arg("period"));
  stats.def(
      "dominant_period",
      [](const values& profile, const values& standard_errors) {
        return stats::dominant_period(profile, standard_errors);
      },
      py::arg("profile"), py::arg("standard_errors") = values{});
  stats.def(
      "summarize_residues", [](const values& accuracy) { return stats::summarize_residues(accuracy); },
      py::arg("accuracy"));
  // Trials as (group, stratum, value) columns of one length.
  const auto observations = [](const char* function, const counts& groups, const counts& strata, const values& outcomes) {
    phasekv::detail::require<input_error>(groups.size() == strata.size() && groups.size() == outcomes.size(),
                                          std::string(function) + ": len(strata), len(values)", strata.size(),
                                          "must equal len(groups) = " + std::to_string(groups.size()));
    std::vector<stats::observation> obs;
    for (std::size_t i = 0; i < groups.size(); ++i) obs.push_back({groups[i], strata[i], outcomes[i]});
    return obs;
  };
  stats.def(
      "debiased_gap",
      [observations](const counts& groups, const counts& strata, const values& outcomes, const counts& class_of,
                     std::int64_t classes) {
        return stats::debiased_gap(observations("debiased_gap", groups, strata, outcomes), class_of, classes);
      },
      py::arg("groups"), py::arg("strata"), py::arg("values"), py::arg("class_of"), py::arg("classes"),
      "Cross-fitted best-minus-worst class gap of trials (group, stratum, value), with a 95% interval.");
  stats.def(
      "fold_permutation_test",
      [observations](const counts& groups, const counts& strata, const values& outcomes, const counts& class_of,
                     std::int64_t classes, std::int64_t permutations, std::uint64_t seed) {
        return stats::fold_permutation_test(observations("fold_permutation_test", groups, strata, outcomes), class_of,
                                            classes, permutations, seed);
      },
      py::arg("groups"), py::arg("strata"), py::arg("values"), py::arg("class_of"), py::arg("classes"),
      py::arg("permutations") = 999, py::arg("seed") = 0,
      "Between-class sum of squares and its within-stratum permutation null.");
  stats.def("log_gamma", &stats::log_gamma, py::arg("a"));
  stats.def("regularized_gamma_p", &stats::regularized_gamma_p, py::arg("a"), py::arg("x"));
  stats.def("regularized_gamma_q", &stats::regularized_gamma_q, py::arg("a"), py::arg("x"));
  stats.def("regularized_beta", &stats::regularized_beta, py::arg("a"), py::arg("b"), py::arg("x"));
  stats.def("chi_square_upper_tail", &stats::chi_square_upper_tail, py::arg("statistic"), py::arg("dof"));
  stats.def("f_upper_tail", &stats::f_upper_tail, py::arg("f"), py::arg("dof1"), py::arg("dof2"));

  // ---- SVG plot (study/svg_plot.hpp), in phasekv.plot
  py::module_ plot = m.plot;
  struct_binding<plot::plot_point>(plot, "PlotPoint", "(x, y) with an optional [low, high] error bar (NaN: none).")
      .field("x", &plot::plot_point::x)
      .field("y", &plot::plot_point::y)
      .field("low", &plot::plot_point::low)
      .field("high", &plot::plot_point::high)
      .field("hollow", &plot::plot_point::hollow, "an open marker (a record crossing a block boundary)")
      .done();
  struct_binding<plot::plot_series>(plot, "PlotSeries", "One line: label, points (a list), dashed.")
      .field("label", &plot::plot_series::label)
      .field("points", &plot::plot_series::points)
      .field("dashed", &plot::plot_series::dashed)
      .done();
  struct_binding<plot::plot_axes>(plot, "PlotAxes",
                                  "Title, labels, ranges, ticks ((value, label) lists), boundary lines and size.")
      .field("title", &plot::plot_axes::title)
      .field("x_label", &plot::plot_axes::x_label)
      .field("y_label", &plot::plot_axes::y_label)
      .field("x_min", &plot::plot_axes::x_min)
      .field("x_max", &plot::plot_axes::x_max)
      .field("y_min", &plot::plot_axes::y_min)
      .field("y_max", &plot::plot_axes::y_max)
      .field("x_ticks", &plot::plot_axes::x_ticks)
      .field("y_ticks", &plot::plot_axes::y_ticks)
      .field("x_boundaries", &plot::plot_axes::x_boundaries, "x of vertical boundary lines (a list)")
      .field("width", &plot::plot_axes::width)
      .field("height", &plot::plot_axes::height)
      .field("dodge_px", &plot::plot_axes::dodge_px, "sideways distance between neighbouring series' markers (px)")
      .field("filled_marker_meaning", &plot::plot_axes::filled_marker_meaning, "the legend's key to filled markers")
      .field("open_marker_meaning", &plot::plot_axes::open_marker_meaning, "the legend's key to open markers")
      .checked_when_built([](const plot::plot_axes& a) { a.validate(); })
      .done()
      .def("validate", &plot::plot_axes::validate);
  plot.def("svg_line_plot", &plot::svg_line_plot, py::arg("series"), py::arg("axes"), "The SVG document as a string.");
  plot.def("svg_escape", &plot::svg_escape, py::arg("text"));
  plot.def("format_p_value", &plot::format_p_value, py::arg("p"),
           "A p-value for a legend: 'p=0.042' from 0.001 up, else a bound 'p<1e-3' … 'p<1e-6'.");
  plot.def("phase_sweep_series", &plot::phase_sweep_series, py::arg("result"), py::arg("label"),
           py::arg("profile") = "all",
           "A sweep's accuracy (%) by residue with its 95% interval at x = (residue + 1) / stride: chunk "
           "boundaries at whole numbers for every stride. profile: all, contained or straddle residues.");
}

}  // namespace sweep_bindings

void init_sweep(const modules& m) { sweep_bindings::init_sweep(m); }

}  // namespace pyphasekv
