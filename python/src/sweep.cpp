// diag/ for evaluations: the phase-sweep planner and harness with its reports (table, CSV,
// JSON), the statistics (phasekv.stats) and the SVG plot (phasekv.plot). The plan/analyze
// protocol and Dask runs (python/phasekv/sweep.py) build on these: plan_sweep() is deterministic
// in the config, so outcomes recorded anywhere are replayed through run_sweep() by a trial that
// looks them up by (residue, trial).

#include <phasekv/diag/phase_sweep.hpp>
#include <phasekv/diag/statistics.hpp>
#include <phasekv/diag/svg_plot.hpp>

#include "common.hpp"

namespace pyphasekv {

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
    result = run_sweep(config, [&](const placement& p) -> bool {
      const py::object outcome = call(p);
      if (!py::isinstance<py::bool_>(outcome) && !py::isinstance(outcome, numpy_bool))
        throw std::runtime_error("returned " + py::repr(outcome).cast<std::string>() +
                                 ", not a bool (a probability sweep takes kind=OutcomeKind.probability)");
      return outcome.cast<bool>();
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

  // ---- phase sweep (diag/phase_sweep.hpp)
  struct_binding<sweep_config>(root, "SweepConfig", "What a phase sweep sweeps (validate() names a bad field).")
      .field("stride", &sweep_config::stride, "S")
      .field("modulus", &sweep_config::modulus, "M, a multiple of S; 0 means 2S")
      .field("trials_per_residue", &sweep_config::trials_per_residue, ">= 10")
      .field("query_position", &sweep_config::query_position, "fixed for every trial")
      .field("span", &sweep_config::span, "width of the target range, >= 3M")
      .field("min_distance", &sweep_config::min_distance, "targets at least this far before the query")
      .field("seed", &sweep_config::seed, "run order only")
      .done()
      .def_readonly_static("minimum_trials", &sweep_config::minimum_trials)
      .def("resolved_modulus", &sweep_config::resolved_modulus)
      .def("first_target", &sweep_config::first_target)
      .def("last_target", &sweep_config::last_target)
      .def("validate", &sweep_config::validate);
  py::class_<placement>(root, "Placement", "One trial of a sweep: where its needle goes.")
      .def(py::init([](std::int64_t residue, std::int64_t trial, std::int64_t target, std::int64_t query) {
             return placement{residue, trial, target, query};
           }),
           py::arg("residue"), py::arg("trial"), py::arg("target_position"), py::arg("query_position"))
      .def_readonly("residue", &placement::residue)
      .def_readonly("trial", &placement::trial, "index within the residue; equal index -> same anchor block")
      .def_readonly("target_position", &placement::target_position)
      .def_readonly("query_position", &placement::query_position)
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
      .def_readonly("variance", &residue_position_stats::variance);
  root.def("plan_sweep", &plan_sweep, py::arg("config"),
           "Every residue's placements in the seeded, shuffled run order (deterministic in the config).");
  root.def("plan_position_statistics", &plan_position_statistics, py::arg("plan"), py::arg("modulus"));
  root.def("assign_haystacks", &assign_haystacks, py::arg("plan"), py::arg("needle_tokens"),
           "The haystack of each placement (in plan order): the first one where its needle "
           "[target, target + needle_tokens) overlaps no other.");

  py::enum_<outcome_kind>(root, "OutcomeKind")
      .value("binary", outcome_kind::binary)
      .value("probability", outcome_kind::probability);
  py::class_<residue_outcome>(root, "ResidueOutcome")
      .def_readonly("residue", &residue_outcome::residue)
      .def_readonly("planned", &residue_outcome::planned)
      .def_readonly("valid", &residue_outcome::valid)
      .def_readonly("errored", &residue_outcome::errored, "threw / NaN / out of range: no outcome, not a wrong answer")
      .def_readonly("successes", &residue_outcome::successes)
      .def_readonly("estimate", &residue_outcome::estimate)
      .def_readonly("ci_low", &residue_outcome::ci_low)
      .def_readonly("ci_high", &residue_outcome::ci_high);
  py::class_<homogeneity_result>(root, "HomogeneityResult")
      .def_readonly("test", &homogeneity_result::test, "chi_square or anova")
      .def_readonly("statistic", &homogeneity_result::statistic)
      .def_readonly("dof", &homogeneity_result::dof)
      .def_readonly("dof_within", &homogeneity_result::dof_within)
      .def_readonly("p_value", &homogeneity_result::p_value)
      .def_readonly("approximate", &homogeneity_result::approximate);
  py::class_<sweep_result>(root, "SweepResult", "A sweep's per-residue outcomes and summary, and its reports.")
      .def_readonly("config", &sweep_result::config)
      .def_readonly("kind", &sweep_result::kind)
      .def_readonly("residues", &sweep_result::residues)
      .def_readonly("errored_trials", &sweep_result::errored_trials)
      .def_readonly("first_error", &sweep_result::first_error)
      .def_readonly("valid", &sweep_result::valid)
      .def_readonly("invalid_reason", &sweep_result::invalid_reason)
      .def_readonly("mean", &sweep_result::mean)
      .def_readonly("gap_points", &sweep_result::gap_points)
      .def_readonly("best_residue", &sweep_result::best_residue)
      .def_readonly("worst_residue", &sweep_result::worst_residue)
      .def_readonly("homogeneity", &sweep_result::homogeneity)
      .def_readonly("period", &sweep_result::period, "the fitted period; it means something only if has_period()")
      .def_readonly_static("phase_effect_alpha", &sweep_result::phase_effect_alpha)
      .def("has_period", &sweep_result::has_period, "valid, not flat, and homogeneity p < phase_effect_alpha")
      .def("to_table", &sweep_result::to_table)
      .def("to_csv", &sweep_result::to_csv, "one plain table, a row per residue")
      .def("to_summary_csv", &sweep_result::to_summary_csv, "the summary as key,value rows")
      .def("to_json", &sweep_result::to_json);
  root.def("run_sweep", &run_python_sweep, py::arg("config"), py::arg("trial"), py::arg("kind") = outcome_kind::binary,
           "Runs trial(placement) on every placement of plan_sweep(config) in the plan's order and summarises. "
           "kind=binary: the trial returns a bool; kind=probability: a float in [0, 1]. A trial that raises is an "
           "errored trial (counted, excluded); KeyboardInterrupt stops the sweep and is raised again.");

  // ---- statistics (diag/statistics.hpp), in phasekv.stats
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
  stats.def("log_gamma", &stats::log_gamma, py::arg("a"));
  stats.def("regularized_gamma_p", &stats::regularized_gamma_p, py::arg("a"), py::arg("x"));
  stats.def("regularized_gamma_q", &stats::regularized_gamma_q, py::arg("a"), py::arg("x"));
  stats.def("regularized_beta", &stats::regularized_beta, py::arg("a"), py::arg("b"), py::arg("x"));
  stats.def("chi_square_upper_tail", &stats::chi_square_upper_tail, py::arg("statistic"), py::arg("dof"));
  stats.def("f_upper_tail", &stats::f_upper_tail, py::arg("f"), py::arg("dof1"), py::arg("dof2"));

  // ---- SVG plot (diag/svg_plot.hpp), in phasekv.plot
  py::module_ plot = m.plot;
  struct_binding<plot::plot_point>(plot, "PlotPoint", "(x, y) with an optional [low, high] error bar (NaN: none).")
      .field("x", &plot::plot_point::x)
      .field("y", &plot::plot_point::y)
      .field("low", &plot::plot_point::low)
      .field("high", &plot::plot_point::high)
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
      .done()
      .def("validate", &plot::plot_axes::validate);
  plot.def("svg_line_plot", &plot::svg_line_plot, py::arg("series"), py::arg("axes"), "The SVG document as a string.");
  plot.def("svg_escape", &plot::svg_escape, py::arg("text"));
  plot.def("phase_sweep_series", &plot::phase_sweep_series, py::arg("result"), py::arg("label"),
           "A sweep's accuracy (%) by residue with its 95% interval at x = (residue + 1) / stride: chunk "
           "boundaries at whole numbers for every stride.");
}

}  // namespace pyphasekv
