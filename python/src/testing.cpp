// testing/: the conformance kit (phasekv::testing, include/phasekv/testing/conformance.hpp) from
// Python, as the submodule phasekv.testing — check() on a layer of one or two streams of a Policy,
// check_preset() on a DeepSeek-V4 preset —
// and the report: which properties held, and for the first that did not, the shrunk
// counterexample and the first difference it shows. Checks run without the GIL.

#include <phasekv/testing/conformance.hpp>

#include "layer.hpp"

namespace pyphasekv {

using namespace phasekv;
namespace kit = phasekv::testing;

namespace {

// One stream's parameters: a StreamParams as it is, or a mapping of float32 arrays in their
// documented shapes — slot_bias (kv_heads, window, gate_channels), norm_weight (channels,),
// slot_profile (window,) — each checked by shape, an error naming the entry otherwise.
stream_params params_from(const py::handle& given, const std::string& name, std::int64_t gate_channels,
                          const geometry& g, const stream_config& c) {
  if (given.is_none()) return {};
  if (py::isinstance<stream_params>(given)) return given.cast<stream_params>();
  if (!py::isinstance<py::dict>(given))
    throw py::type_error(name + ": must be a StreamParams or a dict of arrays (slot_bias, norm_weight, slot_profile), not " +
                         py::str(py::type::of(given).attr("__name__")).cast<std::string>());
  stream_params p;
  for (const auto& [key, value] : given.cast<py::dict>()) {
    const std::string k = py::str(key).cast<std::string>();
    const std::string field = name + "['" + k + "']";
    std::vector<axis> axes;
    std::vector<float>* target = nullptr;
    if (k == "slot_bias") {
      axes = {{"kv_heads", c.kv_heads}, {"window", g.window}, {"gate_channels", gate_channels}};
      target = &p.slot_bias;
    } else if (k == "norm_weight") {
      axes = {{"channels", c.channels}};
      target = &p.norm_weight;
    } else if (k == "slot_profile") {
      axes = {{"window", g.window}};
      target = &p.slot_profile;
    } else {
      phasekv::detail::fail<input_error>(field, "'" + k + "'", "is not a parameter: slot_bias, norm_weight or slot_profile");
    }
    const py::array a = as_array(py::reinterpret_borrow<py::object>(value), field);
    const span<const float> values = input<float>(a, field);
    require_shape(a, field, axes);
    target->assign(values.begin(), values.end());
  }
  return p;
}

// The kit checks typed layers: its oracles and its padding and geometry checks read the policy as
// a type (testing/oracle.hpp, conformance.hpp). So check() takes a Policy, and each Policy's
// compiled stream is named here — the PagedCache a Python host runs computes the same entries
// through the pooling registry (tests/test_compress_erased_stream.cpp holds the two equal).
template <class Stream>
std::vector<stream_params> typed_params(const py::object& params, const geometry& g,
                                        const std::vector<stream_config>& streams) {
  std::vector<stream_params> out(streams.size());
  if (params.is_none()) return out;
  const py::sequence list = params.cast<py::sequence>();
  phasekv::detail::require<input_error>(list.size() == streams.size(), "len(params)", list.size(),
                                        "must be the number of streams, " + std::to_string(streams.size()));
  using pooling = typename Stream::policy::pooling;
  for (std::size_t k = 0; k < streams.size(); ++k)
    out[k] = params_from(list[k], "params[" + std::to_string(k) + "]",
                         phasekv::gate_channels<pooling>(streams[k].channels), g, streams[k]);
  return out;
}

template <class Stream>
kit::report check_typed(const geometry& g, const std::vector<stream_config>& streams, const cache_config& cache,
                        const reader_config& reader, const std::vector<stream_params>& params,
                        const kit::options& options) {
  phasekv::detail::require(streams.size() == 1 || streams.size() == 2, "streams.size()", streams.size(),
                           "must be 1 (a K/V layer) or 2 (K/V and the indexer's keys, or K and V)");
  if (streams.size() == 1) {
    const kit::layer_under_test<Stream> layer(layer_compressor<Stream>(Stream(g, streams[0], params[0])), cache,
                                              reader);
    return kit::check(layer, options);
  }
  const kit::layer_under_test<Stream, Stream> layer(
      layer_compressor<Stream, Stream>(Stream(g, streams[0], params[0]), Stream(g, streams[1], params[1])), cache,
      reader);
  return kit::check(layer, options);
}

using mean_stream = stream_compressor<compressor_policy<mean_pool>>;
using deepseek_v4_stream = stream_compressor<presets::deepseek_v4_csa_policy>;

// The parameters from Python (with the GIL), then the check (without it).
template <class Stream>
kit::report check_layer(const geometry& g, const std::vector<stream_config>& streams, const cache_config& cache,
                        const reader_config& reader, const py::object& params, const kit::options& options) {
  const std::vector<stream_params> p = typed_params<Stream>(params, g, streams);
  py::gil_scoped_release nogil;
  return check_typed<Stream>(g, streams, cache, reader, p, options);
}

const presets::deepseek_layer& preset_named(const std::string& name) {
  if (name == "deepseek_v4_csa") return presets::deepseek_v4_csa_layer;
  if (name == "deepseek_v4_hca") return presets::deepseek_v4_hca_layer;
  if (name == "deepseek_v4_1_csa") return presets::deepseek_v4_1_csa_layer;
  phasekv::detail::fail<input_error>("preset", "'" + name + "'", "must be deepseek_v4_csa, deepseek_v4_hca or deepseek_v4_1_csa");
}

template <class T>
py::array_t<T> array_of(const std::vector<T>& v) {
  return copy_of(v);
}

}  // namespace

void init_testing(const modules& m) {
  py::module_ t = m.testing;

  py::enum_<kit::effort>(t, "Effort", "How long a check runs: quick (a test suite's seconds) or thorough (minutes).")
      .value("quick", kit::effort::quick)
      .value("thorough", kit::effort::thorough);
  py::enum_<kit::property>(t, "Property", "The properties a check holds a layer to, in the order it runs them.")
      .value("streaming", kit::property::streaming)
      .value("round_trips", kit::property::round_trips)
      .value("origin_padding", kit::property::origin_padding)
      .value("entries", kit::property::entries)
      .value("reads", kit::property::reads)
      .value("dense_control", kit::property::dense_control)
      .value("storage", kit::property::storage);
  py::enum_<kit::outcome>(t, "Outcome")
      .value("passed", kit::outcome::passed)
      .value("failed", kit::outcome::failed)
      .value("skipped", kit::outcome::skipped)
      .value("not_run", kit::outcome::not_run);
  py::enum_<kit::operation>(t, "Operation", "What a round trip does between chunks.")
      .value("fork_write_fork", kit::operation::fork_write_fork)
      .value("fork_follow_fork", kit::operation::fork_follow_fork)
      .value("copy_over", kit::operation::copy_over)
      .value("rollback", kit::operation::rollback)
      .value("keep_only", kit::operation::keep_only)
      .value("snapshot_other_cache", kit::operation::snapshot_other_cache)
      .value("snapshot_same_cache", kit::operation::snapshot_same_cache);

  struct_binding<kit::tolerances>(t, "Tolerances", "How far the oracle comparisons may differ (testing/conformance.hpp).")
      .field("entries", &kit::tolerances::entries, "relative, against the sizes of the terms summed")
      .field("slot_weights", &kit::tolerances::slot_weights, "absolute")
      .field("reads", &kit::tolerances::reads, "relative to the largest value a head attends to")
      .field("rope_turn", &kit::tolerances::rope_turn, "origin_padding's turned channels, relative")
      .done();
  struct_binding<kit::options>(t, "Options", "A check's seed, effort and tolerances.")
      .field("seed", &kit::options::seed, "the cases come from it: the same seed, the same report")
      .field("effort", &kit::options::effort, "quick (the default) or thorough")
      .field("cases", &kit::options::cases, "per property; 0: the effort's (6 quick, 120 thorough)")
      .field("max_tokens", &kit::options::max_tokens, "longest sequence; 0: from the geometry and page size")
      .field("shrink_runs", &kit::options::shrink_runs, "candidates the shrinker may run; 0: the effort's")
      .field("tolerance", &kit::options::tolerance)
      .checked_when_built([](const kit::options& o) { o.validate(); })
      .done()
      .def("validate", &kit::options::validate, "Raises ConfigError naming the field that is wrong.")
      .def_static("from_environment", py::overload_cast<kit::options>(&kit::options::from_environment),
                  py::arg("base") = kit::options{},
                  "base with PHASEKV_CONFORMANCE (quick | thorough | long) and PHASEKV_CONFORMANCE_SEED applied.");

  py::class_<kit::step>(t, "Step", "An operation of a round trip: after `at` tokens, `junk` tokens where they must not show.")
      .def_readonly("op", &kit::step::op)
      .def_readonly("at", &kit::step::at)
      .def_readonly("junk", &kit::step::junk);

  py::class_<kit::scenario>(t, "Scenario", "A case: sequences in chunks, operations, padding, read positions.")
      .def_property_readonly("chunks",
                             [](const kit::scenario& s) {
                               py::list out;
                               for (const auto& c : s.chunks) out.append(array_of(c));
                               return out;
                             },
                             "per sequence, its chunk sizes (int64 arrays)")
      .def_property_readonly("bf16_forms",
                             [](const kit::scenario& s) {
                               py::list out;
                               for (const auto& f : s.forms) out.append(array_of(f));
                               return out;
                             },
                             "per sequence and chunk: 1 payload as bf16, 2 logits as bf16 (uint8 arrays)")
      .def_readonly("steps", &kit::scenario::steps)
      .def_readonly("pad", &kit::scenario::pad)
      .def_property_readonly("reads", [](const kit::scenario& s) { return array_of(s.reads); }, "positions read at (int64)")
      .def_property_readonly("tokens", [](const kit::scenario& s) { return s.chunks.empty() ? 0 : s.tokens(0); },
                             "tokens of the first sequence")
      .def("size",
           [](const kit::scenario& s) {
             const kit::scenario_size z = kit::size_of(s);
             py::dict d;
             d["sequences"] = z.sequences;
             d["tokens"] = z.tokens;
             d["chunks"] = z.chunks;
             d["operations"] = z.operations;
             d["junk"] = z.junk;
             d["pad"] = z.pad;
             d["bf16_chunks"] = z.bf16_chunks;
             d["reads"] = z.reads;
             d["positions"] = z.positions;
             return d;
           },
           "every measure the shrinker reduces")
      .def("describe", &kit::describe)
      .def("__str__", &kit::describe);

  py::class_<kit::coverage>(t, "Coverage", "What a property's cases exercised (testing/report.hpp).")
      .def_readonly("top_k", &kit::coverage::top_k, "the reader's (0: no selection)")
      .def_readonly("reads", &kit::coverage::reads, "reads checked")
      .def_readonly("selecting_reads", &kit::coverage::selecting_reads,
                    "of them, reads whose selection left a visible entry out")
      .def_readonly("most_candidates", &kit::coverage::most_candidates, "the most entries one read could select from")
      .def_readonly("sequences", &kit::coverage::sequences, "sequences appended under the host's history, with a window")
      .def_readonly("wrapped_windows", &kit::coverage::wrapped_windows, "of them, sequences longer than their window ring")
      .def_readonly("forks", &kit::coverage::forks, "forks of a sequence holding entries")
      .def_readonly("sharing_forks", &kit::coverage::sharing_forks, "of them, forks that shared the parent's pages")
      .def_readonly("shared_page_writes", &kit::coverage::shared_page_writes, "copy-on-write of a shared page")
      .def("selection_unexercised", &kit::coverage::selection_unexercised)
      .def("__str__", &kit::coverage::to_string);
  py::class_<kit::property_result>(t, "PropertyResult")
      .def_readonly("property", &kit::property_result::property)
      .def_readonly("outcome", &kit::property_result::outcome)
      .def_readonly("cases", &kit::property_result::cases)
      .def_readonly("note", &kit::property_result::note)
      .def_readonly("exercised", &kit::property_result::exercised);

  py::class_<kit::failure>(t, "Failure", "The first property that failed: its shrunk counterexample and first difference.")
      .def_readonly("property", &kit::failure::property)
      .def_readonly("message", &kit::failure::message)
      .def_readonly("counterexample", &kit::failure::counterexample)
      .def_readonly("original", &kit::failure::original)
      .def_readonly("original_message", &kit::failure::original_message)
      .def_readonly("seed", &kit::failure::seed)
      .def_readonly("case_index", &kit::failure::case_index)
      .def_readonly("shrink_runs", &kit::failure::shrink_runs);

  py::class_<kit::report>(t, "Report", "What a check found; str() is the full text.")
      .def_property_readonly("passed", &kit::report::passed)
      .def_readonly("configuration", &kit::report::configuration)
      .def_readonly("properties", &kit::report::properties)
      .def_readonly("failure", &kit::report::failure)
      .def("result", &kit::report::result, py::arg("property"))
      .def("selection_unexercised", &kit::report::selection_unexercised,
           "A property passed with a selecting reader whose selection never dropped an entry.")
      .def("to_string", &kit::report::to_string)
      .def("__str__", &kit::report::to_string)
      .def("__bool__", &kit::report::passed);

  t.def(
      "check",
      [](policy_kind policy, const geometry& g, const std::vector<stream_config>& streams, const cache_config& cache,
         const reader_config& reader, const py::object& params, const kit::options& options) {
        if (policy == policy_kind::mean) return check_layer<mean_stream>(g, streams, cache, reader, params, options);
        return check_layer<deepseek_v4_stream>(g, streams, cache, reader, params, options);
      },
      py::arg("policy"), py::arg("geometry"), py::arg("streams"), py::arg("cache"), py::arg("reader"),
      py::arg("params") = py::none(), py::kw_only(), py::arg("options") = kit::options{},
      "Checks a layer of `policy` (one stream, or two) against every property; the Report names the first "
      "that fails with a shrunk counterexample. params: per stream a StreamParams or a dict of float32 "
      "arrays in their shapes (slot_bias (kv_heads, window, gate_channels), norm_weight (channels,), "
      "slot_profile (window,)).");
  t.def(
      "check_preset",
      [](const std::string& name, bool precision, const py::object& params, const kit::options& options) {
        const presets::deepseek_layer_preset p = presets::deepseek_preset(preset_named(name), 1, 0, precision);
        std::vector<stream_config> streams = {p.kv};
        if (p.indexer) streams.push_back(*p.indexer);
        return check_layer<deepseek_v4_stream>(p.geom, streams, p.cache, p.reader, params, options);
      },
      py::arg("preset"), py::arg("precision") = false, py::arg("params") = py::none(), py::kw_only(),
      py::arg("options") = kit::options{},
      "Checks a DeepSeek-V4 layer preset ('deepseek_v4_csa', 'deepseek_v4_hca', 'deepseek_v4_1_csa'), in fp32 or "
      "at DeepSeek-V4's precision, with the learned parameters given per stream (default: zero biases, unit weights).");
}

}  // namespace pyphasekv
