// diag/ on the write and read paths: the per-phase write profile and gate concentration, and
// read attribution (a read's attention mass back to tokens and phases).

#include <phasekv/detail/text.hpp>
#include <phasekv/diag/read_attribution.hpp>
#include <phasekv/diag/write_profile.hpp>

#include "common.hpp"

namespace pyphasekv {
// This file's own namespace: the study's names are unqualified here alone, not in the files the
// module's unity build compiles after it.
namespace diag_bindings {

using namespace phasekv;
using namespace phasekv::diag;

namespace {

// Feeds every entry of `e` to a sink that takes entry_views (write_profile, slot_weight_log),
// all or nothing: a bad entry k must not leave entries 0…k−1 counted, so a copy takes them and
// replaces the sink only when every one was accepted.
template <class Sink>
void feed(Sink& sink, const entries& e) {
  Sink next = sink;
  for (std::size_t k = 0; k < e.size(); ++k) next(e.view(k));
  sink = std::move(next);
}

}  // namespace

void init_diag(const modules& m) {
  py::module_ root = m.root;

  // ---- write profile and gate concentration (diag/write_profile.hpp)
  py::class_<phase_weight>(root, "PhaseWeight", "What the write path gives one phase.")
      .def_readonly("phase", &phase_weight::phase)
      .def_readonly("tokens", &phase_weight::tokens)
      .def_readonly("mean_weight", &phase_weight::mean_weight)
      .def_readonly("stddev_weight", &phase_weight::stddev_weight)
      .def_readonly("coverage", &phase_weight::coverage)
      .def("__repr__", [](const phase_weight& w) {
        return "PhaseWeight(phase=" + std::to_string(w.phase) + ", tokens=" + std::to_string(w.tokens) +
               ", mean_weight=" + phasekv::detail::general(w.mean_weight) +
               ", coverage=" + phasekv::detail::general(w.coverage) + ")";
      });
  py::class_<write_profile>(root, "WriteProfile",
                            "Per-phase gate weight and coverage, and the two gate-concentration numbers, of the "
                            "entries it is given (Compressor.append(..., slot_weights=True)).")
      .def(py::init<const geometry&, std::int64_t>(), py::arg("geometry"), py::arg("kv_heads"))
      .def("add", &feed<write_profile>, py::arg("entries"), "Counts entries emitted with slot_weights.")
      .def("by_phase", &write_profile::by_phase, py::arg("head") = 0)
      .def(
          "slot_profile", [](const write_profile& p, std::int64_t head) { return copy_of(p.slot_profile(head)); },
          py::arg("head") = 0, "mean weight per slot (float64 [window])")
      .def(
          "unpadded_slot_profile",
          [](const write_profile& p, std::int64_t head) { return copy_of(p.unpadded_slot_profile(head)); },
          py::arg("head") = 0)
      .def("static_concentration", &write_profile::static_concentration, py::arg("head") = 0,
           "exp(H(E[alpha])), in [1, W]")
      .def("window_concentration", &write_profile::window_concentration, py::arg("head") = 0,
           "E[exp(H(alpha))], in [1, W]")
      .def("concentration_windows", &write_profile::concentration_windows, py::arg("head") = 0);

  // ---- read attribution (diag/read_attribution.hpp)
  py::class_<slot_weight_log>(root, "SlotWeightLog", "Per-slot weights of entries by index, for attribute().")
      .def(py::init<std::int64_t, std::int64_t>(), py::arg("window"), py::arg("head") = -1)
      .def("add", &feed<slot_weight_log>, py::arg("entries"))
      .def_property_readonly("window", &slot_weight_log::window)
      .def_property_readonly("head", &slot_weight_log::head)
      .def_property_readonly("recorded", &slot_weight_log::recorded)
      .def("has", &slot_weight_log::has, py::arg("entry"))
      .def(
          "weights",
          [](const slot_weight_log& log, std::int64_t j) {
            const span<const float> w = log.weights(j);
            return copy_of(std::vector<float>(w.begin(), w.end()));
          },
          py::arg("entry"))
      .def("clear", &slot_weight_log::clear);
  py::class_<phase_mass>(root, "PhaseMass")
      .def_readonly("phase", &phase_mass::phase)
      .def_readonly("tokens", &phase_mass::tokens)
      .def_readonly("sum", &phase_mass::sum)
      .def_readonly("mean", &phase_mass::mean);
  py::class_<token_attribution>(root, "TokenAttribution",
                                "Where one read's attention mass went. Per reached token (arrays in token order): "
                                "token, phase, mass, from_entries, from_window; per phase: phases.")
      .def_property_readonly("token",
                             [](const token_attribution& a) {
                               std::vector<std::int64_t> v;
                               for (const auto& t : a.tokens) v.push_back(t.token);
                               return copy_of(v);
                             })
      .def_property_readonly("phase",
                             [](const token_attribution& a) {
                               std::vector<std::int64_t> v;
                               for (const auto& t : a.tokens) v.push_back(t.phase);
                               return copy_of(v);
                             })
      .def_property_readonly("mass",
                             [](const token_attribution& a) {
                               std::vector<double> v;
                               for (const auto& t : a.tokens) v.push_back(t.mass);
                               return copy_of(v);
                             })
      .def_property_readonly("from_entries",
                             [](const token_attribution& a) {
                               std::vector<double> v;
                               for (const auto& t : a.tokens) v.push_back(t.from_entries);
                               return copy_of(v);
                             })
      .def_property_readonly("from_window",
                             [](const token_attribution& a) {
                               std::vector<double> v;
                               for (const auto& t : a.tokens) v.push_back(t.from_window);
                               return copy_of(v);
                             })
      .def_readonly("phases", &token_attribution::phases)
      .def_readonly("entry_mass", &token_attribution::entry_mass)
      .def_readonly("window_mass", &token_attribution::window_mass)
      .def_readonly("sink_mass", &token_attribution::sink_mass)
      .def_readonly("total", &token_attribution::total)
      .def("mass_of", &token_attribution::mass_of, py::arg("t"));
  py::class_<target_selection>(root, "TargetSelection", "Whether a target token was reachable in one read.")
      .def_readonly("token", &target_selection::token)
      .def_readonly("phase", &target_selection::phase)
      .def_readonly("covering_candidates", &target_selection::covering_candidates)
      .def_readonly("covering_selected", &target_selection::covering_selected)
      .def_readonly("selected", &target_selection::selected)
      .def_readonly("rank", &target_selection::rank)
      .def_readonly("entry", &target_selection::entry)
      .def_readonly("entry_mass", &target_selection::entry_mass)
      .def_readonly("in_window", &target_selection::in_window);
  root.def("attribute", &attribute, py::arg("geometry"), py::arg("log"), py::arg("trace"),
           "A read's attention mass back to tokens and phases.");
  root.def("find_target", &find_target, py::arg("geometry"), py::arg("trace"), py::arg("target_token"));
  py::class_<failure_attribution>(root, "FailureAttribution", "Why a read missed a record (classify_failure).")
      .def_readonly("cause", &failure_attribution::cause)
      .def_readonly("entries_selected", &failure_attribution::entries_selected)
      .def_readonly("read_mass", &failure_attribution::read_mass)
      .def_readonly("write_share", &failure_attribution::write_share)
      .def_readonly("uniform_share", &failure_attribution::uniform_share);
  root.def("classify_failure", &classify_failure, py::arg("geometry"), py::arg("log"), py::arg("trace"),
           py::arg("first"), py::arg("length"), py::arg("read_threshold") = 0.5, py::arg("write_threshold") = 0.5,
           "selection_miss, read_dilution, write_dilution or readout for a record [first, first + length).");
}

}  // namespace diag_bindings

void init_diag(const modules& m) { diag_bindings::init_diag(m); }

}  // namespace pyphasekv
