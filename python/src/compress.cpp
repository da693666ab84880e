// compress/: stream configs and learned parameters, the poolings a stream may name (Policy, and
// Pooling over the pooling registry), the stream compressor with its per-sequence state and the
// entries it emits, and the DeepSeek-V4 and NSA presets.

#include "layer.hpp"

namespace pyphasekv {

using namespace phasekv;

// bf16 inputs arrive as their raw bits: uint16, or int16 as torch's bf16 `.view(torch.int16)`
// (then `.numpy()`) gives them — the same bits, read in place.
bool holds_bf16_bits(const py::array& a) {
  return py::isinstance<py::array_t<std::uint16_t>>(a) || py::isinstance<py::array_t<std::int16_t>>(a);
}

// A chunk input read in place as fp32 or as bf16 bits, whichever its dtype is.
void chunk_input(const py::array& a, const std::string& name, span<const float>& fp32,
                 span<const std::uint16_t>& bf16) {
  if (!holds_bf16_bits(a)) {
    if (!py::isinstance<py::array_t<float>>(a))
      throw py::type_error(name + ".dtype = " + py::str(a.dtype()).cast<std::string>() +
                           ": must be float32, or uint16/int16 holding bf16 bits (phasekv reads arrays in "
                           "place and never converts them: pass x.astype(...))");
    fp32 = input<float>(a, name);
    return;
  }
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(name + " = " + describe_array(a) +
                          ": must be C-contiguous (phasekv reads it in place: pass np.ascontiguousarray(x))");
  if (!(a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_))
    throw py::value_error(name + " = " + describe_array(a) + ": must be aligned to its element size");
  bf16 = span<const std::uint16_t>(static_cast<const std::uint16_t*>(a.data()), static_cast<std::size_t>(a.size()));
}

pooling_spec pooling_from(const py::handle& given, const std::string& name) {
  if (py::isinstance<policy_kind>(given)) return pooling_of(given.cast<policy_kind>());
  if (py::isinstance<pooling_spec>(given)) return given.cast<pooling_spec>();
  if (py::isinstance<py::str>(given)) return pooling_spec{given.cast<std::string>()};
  throw py::type_error(name + ": must be a Policy, a Pooling or a pooling id (str), not " +
                       py::str(py::type::of(given).attr("__name__")).cast<std::string>());
}

erased_stream make_stream(const pooling_spec& pooling, const geometry& g, const stream_config& c,
                          const stream_params& p) {
  return erased_stream(builtin_poolings(), pooling.id, stream_build{g, c, p, pooling.rope, pooling.norm, 0});
}

namespace {

// (tokens, kv_heads, views, last) or (tokens, kv_heads·views·last), by the array's rank.
void require_token_shape(const py::array& a, const std::string& name, const token_shape& s, std::int64_t last,
                         const char* last_name) {
  const std::int64_t tokens = a.ndim() >= 1 ? a.shape(0) : 0;
  if (a.ndim() == 2)
    return require_shape(a, name, {{"tokens", tokens}, {"kv_heads·views·channels", s.kv_heads * s.views * last}});
  require_shape(a, name, {{"tokens", tokens}, {"kv_heads", s.kv_heads}, {"views", s.views}, {last_name, last}});
}

}  // namespace

token_chunk chunk_of(const py::object& payload, const py::object& logits, const std::string& name,
                     std::vector<py::array>& keep, const token_shape* shape) {
  keep.push_back(as_array(payload, name + " payload", true));
  const py::array& p = keep.back();
  token_chunk chunk;
  chunk_input(p, name + " payload", chunk.payload, chunk.payload_bf16);
  // The token count comes from the leading axis: a flat array would make every size error
  // read as a token-count error.
  if (p.ndim() < 2)
    throw py::value_error(
        name + " payload = " + describe_array(p) +
        ": needs a leading token axis, shape (tokens, kv_heads, views, channels) or (tokens, floats)");
  chunk.tokens = static_cast<std::int64_t>(p.shape(0));
  if (shape) require_token_shape(p, name + " payload", *shape, shape->channels, "channels");
  if (!logits.is_none()) {
    keep.push_back(as_array(logits, name + " logits", true));
    chunk_input(keep.back(), name + " logits", chunk.logits, chunk.logits_bf16);
    if (shape && shape->gate_channels > 0)
      require_token_shape(keep.back(), name + " logits", *shape, shape->gate_channels, "gate_channels");
  }
  return chunk;
}

token_chunk chunk_from(const py::handle& chunk, const std::string& name, std::vector<py::array>& keep,
                       const token_shape* shape) {
  // A tuple or list is (payload, logits); a list is never stacked into an array (a copy).
  if (py::isinstance<py::tuple>(chunk) || py::isinstance<py::list>(chunk)) {
    const auto pair = py::reinterpret_borrow<py::sequence>(chunk);
    if (pair.size() != 2) throw py::value_error(name + ": must be a payload array or a (payload, logits) pair");
    return chunk_of(pair[0], pair[1], name, keep, shape);
  }
  return chunk_of(py::reinterpret_borrow<py::object>(chunk), py::none(), name, keep, shape);
}

entry_view entries::view(std::size_t k) const {
  entry_view e;
  e.index = index.at(static_cast<py::ssize_t>(k));
  e.anchor = anchor.at(static_cast<py::ssize_t>(k));
  if (!values.is_none()) {
    const py::array v(values);
    e.kv_heads = v.shape(1);
    e.channels = v.shape(2);
    e.values = static_cast<const float*>(v.data()) + k * static_cast<std::size_t>(e.kv_heads * e.channels);
  }
  if (!slot_weights.is_none()) {
    const py::array w(slot_weights);
    e.kv_heads = w.shape(1);
    e.window = w.shape(2);
    e.slot_weights = static_cast<const float*>(w.data()) + k * static_cast<std::size_t>(e.kv_heads * e.window);
  }
  return e;
}

namespace {

// A float32 array of `ndim` dimensions with `n` rows, or None; checked once so views are plain
// pointer arithmetic.
// Runs f() on a compressor state with its lock held and the GIL released (layer.hpp).
template <class F>
decltype(auto) with_state(compressor_state& s, F&& f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(s.lock);
  return f();
}

py::object entry_array(const py::object& o, const char* name, py::ssize_t n) {
  if (o.is_none()) return o;
  py::array a = as_array(o, name);
  require_layout<float>(a, name);
  if (a.ndim() != 3 || a.shape(0) != n)
    throw py::value_error(std::string(name) + " = " + describe_array(a) + ": must have shape (" + std::to_string(n) +
                          ", kv_heads, ...) like index");
  return std::move(a);
}

}  // namespace

void init_compress(const modules& m) {
  py::module_ root = m.root;

  py::enum_<input_layout>(root, "InputLayout", "How a stream's inputs are laid out per token.")
      .value("per_branch", input_layout::per_branch)
      .value("per_slot", input_layout::per_slot);
  // `value` keeps its C++ name although pybind11 enums also have a `.value` property (the
  // integer): on StreamRole members that property now names the member; use int(role) instead.
  py::enum_<stream_role>(root, "StreamRole", "How the reader uses a stream (the integer of a member is int(role)).")
      .value("key", stream_role::key)
      .value("value", stream_role::value)
      .value("key_value", stream_role::key_value)
      .value("indexer", stream_role::indexer);
  py::enum_<policy_kind>(root, "Policy",
                         "Two poolings by name: mean = Pooling('mean') (compressor_policy<mean_pool>); deepseek_v4 "
                         "= Pooling('vector_gates', RopePlacement.after_pool, EntryNorm.rms) "
                         "(presets::deepseek_v4_csa_policy, also the HCA policy). Pooling names any other.")
      .value(policy_names[0], policy_kind::mean)
      .value(policy_names[1], policy_kind::deepseek_v4);
  py::enum_<rope_placement>(root, "RopePlacement", "Where a stream's RoPE applies to its entries.")
      .value("none", rope_placement::none)
      .value("after_pool", rope_placement::after_pool, "rotate each pooled entry at its anchor (DeepSeek-V4)")
      .value("before_pool", rope_placement::before_pool, "rotate each token's payload before pooling");
  py::enum_<entry_norm>(root, "EntryNorm", "The norm a stream applies to each pooled entry.")
      .value("none", entry_norm::none)
      .value("rms", entry_norm::rms, "RMSNorm with the stream's norm_weight (DeepSeek-V4)");
  py::class_<pooling_spec>(root, "Pooling",
                           "A pooling of the registry by id (pooling_ids(): mean, vector_gates, scalar_gates, "
                           "fixed_weights), with its RoPE placement and norm: what a Compressor or a PagedCache "
                           "stream computes, as the compiled compressor_policy<pooling, rope, norm> would.")
      .def(py::init([](const std::string& id, rope_placement rope, entry_norm norm) {
             if (!builtin_poolings().contains(id)) {
               std::string known;
               for (const std::string& k : builtin_poolings().ids()) known += (known.empty() ? "" : ", ") + k;
               detail::fail("Pooling.id", "'" + id + "'", "is not a built-in pooling (" + known + ")");
             }
             return pooling_spec{id, rope, norm};
           }),
           py::arg("id") = "mean", py::arg("rope") = rope_placement::none, py::arg("norm") = entry_norm::none)
      .def_static("of", &pooling_of, py::arg("policy"), "The pooling a Policy names.")
      .def_readonly("id", &pooling_spec::id)
      .def_readonly("rope", &pooling_spec::rope)
      .def_readonly("norm", &pooling_spec::norm)
      .def("__eq__", [](const pooling_spec& a, const pooling_spec& b) { return a == b; }, py::is_operator())
      .def("__hash__", [](const pooling_spec& p) {
        return py::hash(py::make_tuple(p.id, static_cast<int>(p.rope), static_cast<int>(p.norm)));
      })
      .def("__repr__", [](const pooling_spec& p) {
        return "Pooling('" + p.id + "', RopePlacement." + to_string(p.rope) + ", EntryNorm." + to_string(p.norm) + ")";
      });

  struct_binding<stream_config>(root, "StreamConfig",
                                "Shape of one compressed stream (compress/stream_config.hpp). Built invalid (e.g. 0 channels), "
                                "it raises ConfigError; what depends on the policy and geometry is checked where it is used.")
      .field("name", &stream_config::name, "used in error messages")
      .field("role", &stream_config::role)
      .field("channels", &stream_config::channels, "channels per entry and head")
      .field("kv_heads", &stream_config::kv_heads)
      .field("inputs", &stream_config::inputs)
      .field("rope", &stream_config::rope, "read only by policies with RoPE")
      .field("norm_eps", &stream_config::norm_eps, "read only by RMSNorm")
      .checked_when_built([](const stream_config& c) { c.validate(); })
      .done();

  // The vectors are copied in and out (the compressor keeps its own copy anyway); any array-like
  // of numbers is accepted and converted to float32.
  auto vector_property = [](std::vector<float> stream_params::*member) {
    return std::make_pair(
        [member](const stream_params& p) { return copy_of(p.*member); },
        [member](stream_params& p, const py::array_t<float, py::array::c_style | py::array::forcecast>& a) {
          p.*member = std::vector<float>(a.data(), a.data() + a.size());
        });
  };
  const auto bias = vector_property(&stream_params::slot_bias);
  const auto norm = vector_property(&stream_params::norm_weight);
  const auto profile = vector_property(&stream_params::slot_profile);
  struct_binding<stream_params>(root, "StreamParams",
                                "Learned or static parameters of a stream; empty takes the documented default.")
      .property("slot_bias", bias.first, bias.second, "gated: [kv_heads][window][gate channels]; empty = zeros")
      .property("norm_weight", norm.first, norm.second, "RMSNorm: [channels]; empty = ones")
      .property("slot_profile", profile.first, profile.second, "fixed-weight pooling: [window]")
      .done();

  root.def(
      "validate_stream",
      [](const py::object& policy, const geometry& g, const stream_config& c, const stream_params& p) {
        make_stream(pooling_from(policy, "policy"), g, c, p);
      },
      py::arg("policy"), py::arg("geometry"), py::arg("config"), py::arg("params") = stream_params{},
      "Raises ConfigError naming the field unless the stream is valid for the policy (a Policy, a Pooling or "
      "a pooling id).");
  root.def("views_per_token", &views_per_token, py::arg("layout"), py::arg("geometry"));

  py::class_<compressor_state>(root, "CompressorState",
                               "One sequence's pending inputs for one Compressor (make it with make_state).")
      .def_property_readonly("tokens",
                             [](compressor_state& s) { return with_state(s, [&] { return s.state.tokens(); }); })
      .def_property_readonly("entries",
                             [](compressor_state& s) { return with_state(s, [&] { return s.state.entries(); }); })
      .def_property_readonly("ring_rows",
                             [](compressor_state& s) { return with_state(s, [&] { return s.state.ring_rows(); }); })
      .def_property_readonly("bytes",
                             [](compressor_state& s) { return with_state(s, [&] { return s.state.bytes(); }); });

  py::class_<entries>(root, "Entries",
                      "Entries an append emitted, as arrays: index and anchor int64 [n], values float32 "
                      "[n][kv_heads][channels], slot_weights float32 [n][kv_heads][window] (None unless asked "
                      "for). Build one from a host's own arrays to feed WriteProfile or SlotWeightLog.")
      .def(py::init([](const py::object& index, const py::object& slot_weights, const py::object& values,
                       const py::object& anchor) {
             entries e;
             std::vector<py::array> keep;
             keep.push_back(as_array(index, "index"));
             require_layout<std::int64_t>(keep.back(), "index");
             e.index = keep.back();
             if (e.index.ndim() != 1) throw py::value_error("index = " + describe_array(e.index) + ": must be 1-D");
             const py::ssize_t n = e.index.size();
             if (anchor.is_none()) {
               e.anchor = py::array_t<std::int64_t>(n);
               std::fill_n(e.anchor.mutable_data(), n, std::int64_t{0});
             } else {
               keep.push_back(as_array(anchor, "anchor"));
               require_layout<std::int64_t>(keep.back(), "anchor");
               e.anchor = keep.back();
               require_shape(e.anchor, "anchor", {{"len(index)", n}});
             }
             e.values = entry_array(values, "values", n);
             e.slot_weights = entry_array(slot_weights, "slot_weights", n);
             // One kv_heads for both: an entry_view strides through each array by it.
             if (!e.values.is_none() && !e.slot_weights.is_none()) {
               const py::array v(e.values), w(e.slot_weights);
               require_shape(w, "slot_weights",
                             {{"len(index)", n}, {"kv_heads (of values)", v.shape(1)}, {"window", w.shape(2)}});
             }
             return e;
           }),
           py::arg("index"), py::arg("slot_weights") = py::none(), py::arg("values") = py::none(),
           py::arg("anchor") = py::none())
      .def_readonly("index", &entries::index)
      .def_readonly("anchor", &entries::anchor)
      .def_readonly("values", &entries::values)
      .def_readonly("slot_weights", &entries::slot_weights)
      .def("__len__", &entries::size);

  py::class_<compressor>(root, "Compressor",
                         "The streaming write path of one stream (stream_compressor<policy>, the policy chosen at run "
                         "time: erased_stream): immutable, shared by any number of states. policy: a Policy, a "
                         "Pooling, or a pooling id (str: that pooling with no RoPE and no norm).")
      .def(py::init([](const py::object& policy, const geometry& g, const stream_config& c, const stream_params& p) {
             pooling_spec pooling = pooling_from(policy, "policy");
             erased_stream stream = make_stream(pooling, g, c, p);
             return compressor{policy, std::move(pooling), std::move(stream)};
           }),
           py::arg("policy"), py::arg("geometry"), py::arg("config"), py::arg("params") = stream_params{})
      .def_readonly("policy", &compressor::policy, "what it was built with: a Policy, a Pooling or a pooling id")
      .def_readonly("pooling", &compressor::pooling, "the pooling it computes")
      .def_property_readonly("geometry", [](const compressor& c) { return c.stream.geom(); })
      .def_property_readonly("config", [](const compressor& c) { return c.stream.config(); })
      .def_property_readonly("params", [](const compressor& c) { return c.stream.params(); })
      .def_property_readonly("views", [](const compressor& c) { return c.stream.views(); })
      .def_property_readonly("gate_channels", [](const compressor& c) { return c.stream.gate_channels(); })
      .def_property_readonly("payload_floats_per_token",
                             [](const compressor& c) { return c.stream.payload_floats_per_token(); })
      .def_property_readonly("logit_floats_per_token",
                             [](const compressor& c) { return c.stream.logit_floats_per_token(); })
      .def_property_readonly("floats_per_entry", [](const compressor& c) { return c.stream.floats_per_entry(); })
      .def(
          "view_of_slot", [](const compressor& c, std::int64_t slot) { return c.stream.view_of_slot(slot); },
          py::arg("slot"))
      .def(
          "make_state",
          [](const compressor& c, std::int64_t history) {
            auto made = std::make_unique<compressor_state>();
            made->state = c.stream.make_state(history);
            return made;
          },
          py::arg("history") = 0, "A fresh state keeping `history` extra tokens for truncate().")
      .def(
          "entries_after",
          [](const compressor& c, compressor_state& st, std::int64_t tokens) {
            return with_state(st, [&] { return c.stream.entries_after(st.state, tokens); });
          },
          py::arg("state"), py::arg("tokens"))
      .def(
          "can_truncate",
          [](const compressor& c, compressor_state& st, std::int64_t tokens) {
            return with_state(st, [&] { return c.stream.can_truncate(st.state, tokens); });
          },
          py::arg("state"), py::arg("tokens"))
      .def(
          "truncate",
          [](const compressor& c, compressor_state& st, std::int64_t tokens) {
            with_state(st, [&] { c.stream.truncate(st.state, tokens); });
          },
          py::arg("state"), py::arg("tokens"))
      .def(
          "append",
          [](const compressor& c, compressor_state& st, const py::object& payload, const py::object& logits,
             bool slot_weights, bool check_finite) {
            std::vector<py::array> keep;
            const token_shape shape = token_shape_of(c.stream);
            const token_chunk chunk = chunk_of(payload, logits, "chunk", keep, &shape);
            append_options options;
            options.slot_weights = slot_weights;
            options.check_finite = check_finite;
            // The entries go into vectors while the GIL is released, then to NumPy without a copy.
            std::vector<std::int64_t> index, anchor;
            std::vector<float> values, weights;
            std::int64_t heads = 0, channels = 0, window = 0;
            with_state(st, [&] {
              const erased_stream& s = c.stream;
              s.check(st.state, chunk, options);
              const auto n = static_cast<std::size_t>(s.entries_after(st.state, chunk.tokens));
              heads = s.config().kv_heads;
              channels = s.config().channels;
              window = s.geom().window;
              index.reserve(n);
              anchor.reserve(n);
              values.reserve(n * static_cast<std::size_t>(heads * channels));
              if (slot_weights) weights.reserve(n * static_cast<std::size_t>(heads * window));
              s.emit(
                  st.state, chunk,
                  [&](const entry_view& e) {
                    index.push_back(e.index);
                    anchor.push_back(e.anchor);
                    values.insert(values.end(), e.values, e.values + heads * channels);
                    if (e.slot_weights)
                      weights.insert(weights.end(), e.slot_weights, e.slot_weights + heads * window);
                  },
                  options);
              s.commit(st.state, chunk);
            });
            const auto n = static_cast<py::ssize_t>(index.size());
            entries out;
            out.index = adopt(std::move(index), {n});
            out.anchor = adopt(std::move(anchor), {n});
            out.values = adopt(std::move(values), {n, heads, channels});
            out.slot_weights = slot_weights ? py::object(adopt(std::move(weights), {n, heads, window})) : py::none();
            return out;
          },
          py::arg("state"), py::arg("payload"), py::arg("logits") = py::none(), py::kw_only(),
          py::arg("slot_weights") = false, py::arg("check_finite") = false,
          "Appends tokens (payload [tokens][kv_heads][views][channels], logits likewise with gate channels, "
          "None without gates) and returns the entries they complete. Payload and logits are each float32, or "
          "bf16 bits as uint16 (or int16, torch's bf16 .view(torch.int16)): a bf16 input gives exactly the "
          "entries of its float32 widening, bit for bit, reading half the bytes. The GIL is released.");

  // ---- presets (models/deepseek_v4.hpp, models/nsa.hpp) ----
  py::module_ presets = m.presets;
  // The layers by their checkpoint's compress ratio (4: CSA, 128: HCA, 2: V4.1's CSA); any other
  // ratio raises ConfigError naming the argument. Their policy is Policy.deepseek_v4.
  presets.def(
      "deepseek_geometry",
      [](int compress_ratio) {
        return presets::deepseek_layer_of(compress_ratio, "deepseek_geometry(compress_ratio)").geom;
      },
      py::arg("compress_ratio"), "The layer's geometry: S=4, W=8 (4); S = W = 128 (128); S=2, W=4 (2).");
  presets.def("deepseek_v4_compressed_rope", &presets::deepseek_v4_compressed_rope,
              "interleaved RoPE on the last 64 channels, base 160000, YaRN x16 from 65536");
  presets.def(
      "deepseek_kv_stream",
      [](int compress_ratio) {
        return presets::deepseek_kv_stream(
            presets::deepseek_layer_of(compress_ratio, "deepseek_kv_stream(compress_ratio)"));
      },
      py::arg("compress_ratio"), "The layer's tied K/V stream: 512 channels, one KV head, per-branch inputs.");
  presets.def(
      "deepseek_indexer_stream",
      [](int compress_ratio) {
        return presets::deepseek_indexer_stream(
            presets::deepseek_layer_of(compress_ratio, "deepseek_indexer_stream(compress_ratio)"));
      },
      py::arg("compress_ratio"), "The indexer's keys of a CSA layer (4, 2): 128 channels; None for HCA (128).");
  presets.def("nsa_compressed_geometry", &presets::nsa_compressed_geometry, "S=16, W=32");
}

}  // namespace pyphasekv
