// core/: stride/window/phase geometry and its phase helpers, RoPE configs, and the enums every
// other area uses.

#include <phasekv/core/geometry.hpp>
#include <phasekv/core/rope.hpp>

#include "common.hpp"

namespace pyphasekv {

void init_core(const modules& m) {
  using namespace phasekv;
  py::module_ root = m.root;

  py::enum_<anchor_mode>(root, "AnchorMode", "Where an entry's post-pool RoPE places it.")
      .value("block_start", anchor_mode::block_start)
      .value("block_end", anchor_mode::block_end)
      .value("window_centre", anchor_mode::window_centre);
  py::enum_<rope_layout>(root, "RopeLayout")
      .value("interleaved", rope_layout::interleaved)
      .value("half_split", rope_layout::half_split);

  py::class_<entry_range>(root, "EntryRange", "Half-open range of entry indices [first, last).")
      .def(py::init([](std::int64_t first, std::int64_t last) {
             return entry_range{first, last};
           }),
           py::arg("first"), py::arg("last"))
      .def_readwrite("first", &entry_range::first)
      .def_readwrite("last", &entry_range::last)
      .def("__len__", &entry_range::size)
      .def("__contains__", &entry_range::contains)
      .def("__iter__", [](const entry_range& r) { return py::iter(py::make_tuple(r.first, r.last)); })
      .def("__eq__", [](const entry_range& a, const entry_range& b) { return a.first == b.first && a.last == b.last; })
      .def("__repr__", [](const entry_range& r) {
        return "EntryRange(" + std::to_string(r.first) + ", " + std::to_string(r.last) + ")";
      });

  auto geometry_class =
      struct_binding<geometry>(root, "Geometry",
                               "Stride S, window W, origin and anchor of a compressed layer (core/geometry.hpp). "
                               "Token-valued methods also take NumPy integer arrays.")
          .field("stride", &geometry::stride, "S >= 1: a new entry every S tokens")
          .field("window", &geometry::window, "W >= S: slots per entry")
          .field("origin", &geometry::origin, "0 <= origin < S: blocks start at t = origin (mod S)")
          .field("anchor", &geometry::anchor, "where post-pool RoPE places an entry")
          .done();
  // Per-token helpers are vectorised (NumPy arrays of positions in, arrays out): a phase profile
  // of a whole sequence is one call, not a Python loop. The geometry is taken by value: pybind11
  // 2.10's vectorize cannot pass a const reference through.
  geometry_class.def("validate", &geometry::validate, "Raises ConfigError naming the field that is wrong.")
      .def("__eq__", [](const geometry& a, const geometry& b) { return a == b; })
      .def_property_readonly("lead", &geometry::lead, "virtual padding tokens before token 0: (S - origin) mod S")
      .def_property_readonly("branches", &geometry::branches, "blocks a window touches: ceil(W / S)")
      .def_property_readonly("boundary_phase", &geometry::boundary_phase, "S - 1")
      .def("phase_of", py::vectorize([](geometry g, std::int64_t t) { return g.phase_of(t); }), py::arg("t"),
           "(t - origin) mod S")
      .def_static("residue_of",
                  py::vectorize([](std::int64_t t, std::int64_t modulus) { return geometry::residue_of(t, modulus); }),
                  py::arg("t"), py::arg("modulus"), "t mod modulus, non-negative")
      .def("block_of", py::vectorize([](geometry g, std::int64_t t) { return g.block_of(t); }), py::arg("t"))
      .def("coverage", py::vectorize([](geometry g, std::int64_t t) { return g.coverage(t); }), py::arg("t"),
           "entries whose window contains token t")
      .def("entries_covering", &geometry::entries_covering, py::arg("t"))
      .def("block_start", &geometry::block_start, py::arg("entry"))
      .def("block_end", &geometry::block_end, py::arg("entry"))
      .def("window_start", &geometry::window_start, py::arg("entry"))
      .def("slot_token", &geometry::slot_token, py::arg("entry"), py::arg("slot"))
      .def("slot_of", &geometry::slot_of, py::arg("t"), py::arg("entry"))
      .def("is_padding", &geometry::is_padding, py::arg("entry"), py::arg("slot"))
      .def("first_real_slot", &geometry::first_real_slot, py::arg("entry"))
      .def("branch_of_slot", &geometry::branch_of_slot, py::arg("slot"))
      .def("anchor_position", &geometry::anchor_position, py::arg("entry"))
      .def("completion_token", &geometry::completion_token, py::arg("entry"))
      .def("completed_entries", &geometry::completed_entries, py::arg("tokens"))
      .def("visible_entries", &geometry::visible_entries, py::arg("query_position"));

  root.def("floor_div", py::vectorize([](std::int64_t a, std::int64_t b) { return floor_div(a, b); }), py::arg("a"),
           py::arg("b"), "Floor division of signed positions (b != 0).");
  root.def("floor_mod", py::vectorize([](std::int64_t a, std::int64_t b) { return floor_mod(a, b); }), py::arg("a"),
           py::arg("b"), "Non-negative modulo of signed positions (b > 0).");

  struct_binding<yarn_config>(root, "YarnConfig", "YaRN frequency scaling of a RoPE (core/rope.hpp).")
      .field("enabled", &yarn_config::enabled)
      .field("factor", &yarn_config::factor)
      .field("original_context", &yarn_config::original_context)
      .field("beta_fast", &yarn_config::beta_fast)
      .field("beta_slow", &yarn_config::beta_slow)
      .done();
  struct_binding<rope_config>(root, "RopeConfig", "Rotary embedding on the last `channels` channels (core/rope.hpp).")
      .field("channels", &rope_config::channels)
      .field("base", &rope_config::base)
      .field("layout", &rope_config::layout)
      .field("yarn", &rope_config::yarn)
      .done()
      .def("validate", &rope_config::validate, py::arg("prefix"), py::arg("vector_channels"))
      .def(
          "inverse_frequencies",
          [](const rope_config& r, std::int64_t vector_channels) {
            r.validate("rope", vector_channels);
            return copy_of(rope_rotation(r, vector_channels).inverse_frequencies());
          },
          py::arg("vector_channels"), "theta_k (YaRN-scaled when enabled), float64 [channels / 2]");
}

}  // namespace pyphasekv
