// core/: stride/window/phase geometry and its phase helpers, RoPE configs, and the enums every
// other area uses.

#include <limits>
#include <string>

#include <phasekv/core/geometry.hpp>
#include <phasekv/core/detail/limits.hpp>
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

  // The C++ geometry's helpers are noexcept arithmetic on a valid geometry and positions within
  // the library's bounds (a stride of 0 divides by zero, a position near 2^63 overflows). From
  // Python every call checks both first, so no argument can kill the interpreter: a geometry
  // changed into an invalid one is a ConfigError, a position beyond ±2^48 an InputError.
  const auto valid = [](const geometry& g) -> const geometry& {
    g.validate();
    return g;
  };
  const auto position = [](std::int64_t t, const char* name) {
    detail::require<input_error>(t >= -limits::max_tokens && t <= limits::max_tokens, name, t,
                                 "must lie in [-2^48, 2^48]");
    return t;
  };
  // Entry indices: j · S must stay within the positions' bounds.
  const auto entry = [valid](const geometry& g, std::int64_t j) {
    const std::int64_t bound = limits::max_tokens / valid(g).stride;
    detail::require<input_error>(j >= -bound && j <= bound, "entry", j,
                                 "must lie in [-2^48 / stride, 2^48 / stride] = [-" + std::to_string(bound) + ", " +
                                     std::to_string(bound) + "]");
    return j;
  };
  auto geometry_class =
      struct_binding<geometry>(root, "Geometry",
                               "Stride S, window W, origin and anchor of a compressed layer (core/geometry.hpp). "
                               "Token-valued methods also take NumPy integer arrays. Built invalid (e.g. W < S), "
                               "it raises ConfigError; changed into an invalid one, its methods do.")
          .field("stride", &geometry::stride, "S >= 1: a new entry every S tokens")
          .field("window", &geometry::window, "W >= S: slots per entry")
          .field("origin", &geometry::origin, "0 <= origin < S: blocks start at t = origin (mod S)")
          .field("anchor", &geometry::anchor, "where post-pool RoPE places an entry")
          .checked_when_built([](const geometry& g) { g.validate(); })
          .done();
  // Per-token helpers are vectorised (NumPy arrays of positions in, arrays out): a phase profile
  // of a whole sequence is one call, not a Python loop. The geometry is taken by value: pybind11
  // 2.10's vectorize cannot pass a const reference through.
  geometry_class.def("validate", &geometry::validate, "Raises ConfigError naming the field that is wrong.")
      .def("__eq__", [](const geometry& a, const geometry& b) { return a == b; })
      .def_property_readonly("lead", [valid](const geometry& g) { return valid(g).lead(); },
                             "virtual padding tokens before token 0: (S - origin) mod S")
      .def_property_readonly("branches", [valid](const geometry& g) { return valid(g).branches(); },
                             "blocks a window touches: ceil(W / S)")
      .def_property_readonly("boundary_phase", [valid](const geometry& g) { return valid(g).boundary_phase(); }, "S - 1")
      .def("phase_of", py::vectorize([valid, position](geometry g, std::int64_t t) {
             return valid(g).phase_of(position(t, "t"));
           }),
           py::arg("t"), "(t - origin) mod S")
      .def_static("residue_of", py::vectorize([position](std::int64_t t, std::int64_t modulus) {
                    detail::require<input_error>(modulus >= 1 && modulus <= limits::max_tokens, "modulus", modulus,
                                                 "must lie in [1, 2^48]");
                    return geometry::residue_of(position(t, "t"), modulus);
                  }),
                  py::arg("t"), py::arg("modulus"), "t mod modulus, non-negative")
      .def("block_of", py::vectorize([valid, position](geometry g, std::int64_t t) {
             return valid(g).block_of(position(t, "t"));
           }),
           py::arg("t"))
      .def("coverage", py::vectorize([valid, position](geometry g, std::int64_t t) {
             return valid(g).coverage(position(t, "t"));
           }),
           py::arg("t"), "entries whose window contains token t")
      .def("entries_covering", [valid, position](const geometry& g, std::int64_t t) {
             return valid(g).entries_covering(position(t, "t"));
           }, py::arg("t"))
      .def("block_start", [entry](const geometry& g, std::int64_t j) { return g.block_start(entry(g, j)); }, py::arg("entry"))
      .def("block_end", [entry](const geometry& g, std::int64_t j) { return g.block_end(entry(g, j)); }, py::arg("entry"))
      .def("window_start", [entry](const geometry& g, std::int64_t j) { return g.window_start(entry(g, j)); },
           py::arg("entry"))
      .def("slot_token", [entry, position](const geometry& g, std::int64_t j, std::int64_t slot) {
             return g.slot_token(entry(g, j), position(slot, "slot"));
           }, py::arg("entry"), py::arg("slot"))
      .def("slot_of", [entry, position](const geometry& g, std::int64_t t, std::int64_t j) {
             return g.slot_of(position(t, "t"), entry(g, j));
           }, py::arg("t"), py::arg("entry"))
      .def("is_padding", [entry, position](const geometry& g, std::int64_t j, std::int64_t slot) {
             return g.is_padding(entry(g, j), position(slot, "slot"));
           }, py::arg("entry"), py::arg("slot"))
      .def("first_real_slot", [entry](const geometry& g, std::int64_t j) { return g.first_real_slot(entry(g, j)); },
           py::arg("entry"))
      .def("branch_of_slot", [valid, position](const geometry& g, std::int64_t slot) {
             return valid(g).branch_of_slot(position(slot, "slot"));
           }, py::arg("slot"))
      .def("anchor_position", [entry](const geometry& g, std::int64_t j) { return g.anchor_position(entry(g, j)); },
           py::arg("entry"))
      .def("completion_token", [entry](const geometry& g, std::int64_t j) { return g.completion_token(entry(g, j)); },
           py::arg("entry"))
      .def("completed_entries", [valid, position](const geometry& g, std::int64_t tokens) {
             return valid(g).completed_entries(position(tokens, "tokens"));
           }, py::arg("tokens"))
      .def("visible_entries", [valid, position](const geometry& g, std::int64_t t) {
             return valid(g).visible_entries(position(t, "query_position"));
           }, py::arg("query_position"));

  // Division by zero and INT64_MIN / -1 would trap (SIGFPE): refused as InputError instead.
  const auto divisor = [](std::int64_t a, std::int64_t b) {
    detail::require<input_error>(b != 0, "b", b, "must not be 0");
    detail::require<input_error>(!(b == -1 && a == std::numeric_limits<std::int64_t>::min()), "a", a,
                                 "divided by b = -1 overflows a 64-bit integer");
  };
  root.def("floor_div", py::vectorize([divisor](std::int64_t a, std::int64_t b) {
             divisor(a, b);
             return floor_div(a, b);
           }),
           py::arg("a"), py::arg("b"), "Floor division of signed positions (b != 0).");
  root.def("floor_mod", py::vectorize([divisor](std::int64_t a, std::int64_t b) {
             divisor(a, b);
             return floor_mod(a, b);
           }),
           py::arg("a"), py::arg("b"), "Non-negative modulo of signed positions (b > 0).");

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
