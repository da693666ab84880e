// study/needle_probe.hpp in phasekv.probe: the synthetic needle-in-a-haystack probe that runs
// through the real write path, cache and reader. In Python it is also an `evaluate` of the sweep
// protocol (phasekv.sweep.NeedleEvaluate): prepare() one haystack of the plan, trials() its needles.
// The long calls release the GIL, so a Dask worker's other threads (heartbeats) keep running.

#include <phasekv/study/needle_probe.hpp>

#include "common.hpp"

namespace pyphasekv {
// This file's own namespace: the study's names are unqualified here alone, not in the files the
// module's unity build compiles after it.
namespace probe_bindings {

using namespace phasekv;
using namespace phasekv::diag;
using namespace phasekv::diag::probe;

namespace {

// Target positions from a list or an int64 array (copied: a haystack holds a few hundred).
std::vector<std::int64_t> positions_of(const py::object& targets) {
  if (py::isinstance<py::array>(targets) || py::hasattr(targets, "__dlpack__")) {
    const py::array a = as_array(targets, "target_positions");
    if (!py::isinstance<py::array_t<std::int64_t>>(a))
      throw py::type_error("target_positions.dtype = " + py::str(a.dtype()).cast<std::string>() + ": must be int64");
    if (a.ndim() != 1) throw py::value_error("target_positions = " + describe_array(a) + ": must be one-dimensional");
    const auto view = a.cast<py::array_t<std::int64_t>>().unchecked<1>();
    std::vector<std::int64_t> out(static_cast<std::size_t>(view.shape(0)));
    for (py::ssize_t i = 0; i < view.shape(0); ++i) out[static_cast<std::size_t>(i)] = view(i);
    return out;
  }
  return targets.cast<std::vector<std::int64_t>>();
}

}  // namespace

void init_probe(const modules& m) {
  py::module_ probe = m.probe;

  py::enum_<needle_policy>(probe, "NeedlePolicy", "The write path of the probe (study/needle_probe.hpp).")
      .value("full_attention", needle_policy::full_attention)
      .value("mean_pool", needle_policy::mean_pool)
      .value("concentrated_gates", needle_policy::concentrated_gates)
      .value("rope_after_pool", needle_policy::rope_after_pool)
      .value("deepseek_v4_csa", needle_policy::deepseek_v4_csa)
      .value("fixed_weight", needle_policy::fixed_weight)
      .value("positional_gates", needle_policy::positional_gates);
  py::enum_<needle_outcome>(probe, "NeedleOutcome")
      .value("success", needle_outcome::success)
      .value("probability", needle_outcome::probability)
      .value("attributed", needle_outcome::attributed);

  struct_binding<needle_config>(probe, "NeedleConfig", "The probe's task, write path and seed (validate() names a bad field).")
      .field("tokens", &needle_config::tokens, "context length N")
      .field("records", &needle_config::records, "key->value records, at most tokens / (2 x record length)")
      .field("channels", &needle_config::channels, "embedding dimension, a multiple of 4")
      .field("kappa", &needle_config::kappa, "shared component of distinct token embeddings, in [0, 1)")
      .field("logit_scale", &needle_config::logit_scale, "attention logit scale; 0 = automatic")
      .field("policy", &needle_config::policy)
      .field("stride", &needle_config::stride, "S (mean_pool, concentrated_gates, rope_after_pool)")
      .field("window", &needle_config::window, "W (likewise)")
      .field("gate_offset", &needle_config::gate_offset, "concentrated_gates: the key gates' peaked slot")
      .field("heads", &needle_config::heads, "concentrated_gates: KV heads at offsets r, r+1, ...")
      .field("seed", &needle_config::seed)
      .field("origin", &needle_config::origin, "chunk origin (blocks start at t = origin mod S)")
      .field("key_slot_bias", &needle_config::key_slot_bias, "concentrated_gates: [heads][W] biases (a list)")
      .field("value_slot_bias", &needle_config::value_slot_bias, "concentrated_gates: [heads][W] biases (a list)")
      .field("record", &needle_config::record, "RecordShape: key tokens, gap, value tokens (default 1, 0, 1)")
      .field("slot_profile", &needle_config::slot_profile,
             "fixed_weight: [W] weights; positional_gates: [W] logit biases (a list; empty = default)")
      .field("gate_content", &needle_config::gate_content, "positional_gates: scale of the content logits")
      .field("top_k", &needle_config::top_k, "entries the key stream selects; 0 reads every entry")
      .field("isolate_targets", &needle_config::isolate_targets,
             "keep the other records out of the targets' entries (the control for crowding)")
      .checked_when_built([](const needle_config& c) { c.validate(); })
      .done()
      .def("resolved_slot_profile", &needle_config::resolved_slot_profile)
      .def("haystack_spacing", &needle_config::haystack_spacing,
           "how far apart needle_sweep places a haystack's targets (the plan's needle_tokens)")
      .def("effective_stride", &needle_config::effective_stride)
      .def("effective_window", &needle_config::effective_window)
      .def("validate", &needle_config::validate);

  py::class_<needle_probe>(probe, "NeedleProbe",
                           "A needle-in-a-haystack task read through phasekv's own cache and reader. prepare() "
                           "builds a haystack holding the given targets; trials()/probabilities() read them.")
      .def(py::init<needle_config>(), py::arg("config"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("config", &needle_probe::config)
      .def_property_readonly("logit_scale", &needle_probe::logit_scale)
      .def_property_readonly("query_position", &needle_probe::query_position)
      .def("reseed", &needle_probe::reseed, py::arg("seed"), py::call_guard<py::gil_scoped_release>())
      .def(
          "prepare",
          [](needle_probe& p, const py::object& targets, std::int64_t query_position, std::uint64_t context) {
            const std::vector<std::int64_t> t = positions_of(targets);
            py::gil_scoped_release unlocked;
            p.prepare(span<const std::int64_t>(t.data(), t.size()), query_position, context);
          },
          py::arg("target_positions"), py::arg("query_position"), py::arg("context") = 0,
          "A haystack with a record at each target (non-overlapping: a record takes t ... t + L - 1) and the "
          "query at query_position; `context` salts the rest of the haystack.")
      .def(
          "trials",
          [](needle_probe& p, const py::object& targets) {
            const std::vector<std::int64_t> t = positions_of(targets);
            std::vector<char> found;
            {
              py::gil_scoped_release unlocked;
              found = p.trials(span<const std::int64_t>(t.data(), t.size()));
            }
            py::array_t<bool> out(static_cast<py::ssize_t>(found.size()));
            for (std::size_t i = 0; i < found.size(); ++i) out.mutable_data()[i] = found[i] != 0;
            return out;
          },
          py::arg("target_positions"), "Whether each prepared target's value is retrieved (bool array), one read.")
      .def(
          "probabilities",
          [](needle_probe& p, const py::object& targets) {
            const std::vector<std::int64_t> t = positions_of(targets);
            std::vector<double> out;
            {
              py::gil_scoped_release unlocked;
              out = p.probabilities(span<const std::int64_t>(t.data(), t.size()));
            }
            return adopt(std::move(out), {static_cast<py::ssize_t>(t.size())});
          },
          py::arg("target_positions"), "The probability of each prepared target's value (float64 array).")
      .def("explain", &needle_probe::explain, py::arg("target_position"), py::arg("read_threshold") = 0.5,
           py::arg("write_threshold") = 0.5, py::call_guard<py::gil_scoped_release>(),
           "Why the target's read fails (or would): a FailureAttribution of its value tokens, from a traced "
           "read and the value stream's slot weights.")
      .def("crowding", &needle_probe::crowding, py::arg("target_position"),
           "Other records with a token in the tokens the target's entries pool.")
      .def_property_readonly("stream_geometry", &needle_probe::stream_geometry);

  probe.def("needle_sweep", &needle_sweep, py::arg("probe"), py::arg("config"),
            py::arg("kind") = needle_outcome::success, py::call_guard<py::gil_scoped_release>(),
            "A phase sweep of the probe, haystacks by assign_haystacks(plan, L), L + 2W for isolated targets (what "
            "phasekv.sweep plans with NeedleEvaluate.needle_tokens()).");
}

}  // namespace probe_bindings

void init_probe(const modules& m) { probe_bindings::init_probe(m); }

}  // namespace pyphasekv
