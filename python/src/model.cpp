// models/: a whole model's cache behind one front door — the model as data (stream specs, layer
// kinds, layers), model_cache with its sequences, reads and snapshots, and model_step, which
// appends and reads layer by layer and commits or aborts the whole model at once.
//
// Locks: each ModelCache carries one mutex, taken (after the GIL is released) for every C++ call
// on the model or on one of its steps, and dropped before the GIL is taken back. A step holds its
// sequences between calls, not the mutex, so a Python thread may run a step while another reads
// or steps other sequences; the calls themselves run one at a time.

#include <mutex>
#include <optional>
#include <phasekv/models/deepseek_v4.hpp>
#include <phasekv/models/model_cache.hpp>
#include <phasekv/models/model_snapshot.hpp>
#include <phasekv/read/detail/read_checks.hpp>

#include "common.hpp"

namespace pyphasekv {

using namespace phasekv;

namespace {

// Python's ModelCache: the model and its lock (model_cache cannot move: built in place).
struct model_object {
  model_object(model_spec spec, model_options options) : cache(std::move(spec), std::move(options)) {}
  model_cache cache;
  std::mutex lock;
};

// f() on the model with its lock held and the GIL released.
template <class F>
decltype(auto) locked(model_object& m, F&& f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> guard(m.lock);
  return f();
}

// Python's ModelStep: the step, the ModelCache object it keeps alive, and per row its sequence, its
// new tokens and the position of its last token once they are in (a read's default position) —
// copies, so that shape checks need not touch the step outside the model's lock.
struct step_object {
  py::object owner;
  model_object* model = nullptr;
  std::optional<model_step> step;  // used only under model->lock
  std::vector<sequence_id> seqs;
  std::vector<std::int64_t> tokens, last;

  step_object() = default;
  step_object(const step_object&) = delete;
  step_object& operator=(const step_object&) = delete;
  // An uncommitted step is aborted: every layer as before begin().
  ~step_object() {
    if (step) {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> guard(model->lock);
      step.reset();
    }
  }

  bool open() const {
    return locked(*model, [&] { return step && step->open(); });
  }
  // input_error unless the step is open; call under the model's lock.
  void require_open(const char* operation) const {
    if (!step || !step->open())
      detail::fail<input_error>(model->cache.name() + ".step." + operation, "closed", "the step was committed or aborted");
  }
  void require_open_now(const char* operation) const {
    locked(*model, [&] { require_open(operation); });
  }
  std::size_t row(std::size_t r, const char* operation) const {
    require_open_now(operation);
    if (r >= seqs.size())
      detail::fail<input_error>(model->cache.name() + ".step." + operation + "(row)", r,
                                "must be below the step's rows, " + std::to_string(seqs.size()));
    return r;
  }
  void abort() {
    locked(*model, [&] {
      if (step) step->abort();
    });
  }
};

// Per stream of a layer: what chunk_from checks a payload and its logits against.
token_shape token_shape_of(const stream_kernel& k) {
  const stream_config& c = k.config();
  const std::int64_t per_view = c.kv_heads * c.channels;
  return {c.kv_heads, per_view > 0 ? k.payload_floats_per_token() / per_view : 0, c.channels, k.gate_channels()};
}

// A window input (keys or values) of `tokens` rows: None, or float32 (tokens, kv_heads, channels).
span<const float> window_rows(const py::object& o, const std::string& name, std::int64_t tokens, std::int64_t kv_heads,
                              std::int64_t channels, std::vector<py::array>& keep) {
  if (o.is_none()) return {};
  py::array a = as_array(o, name);
  if (py::isinstance<py::array_t<float>>(a))
    require_shape(a, name, {{"tokens", tokens}, {"kv_heads", kv_heads}, {"channels", channels}});
  keep.push_back(a);
  return input<float>(keep.back(), name);
}

// One layer's append, from Python: rows[i] = (chunks, window_keys) or (chunks, window_keys,
// window_values), chunks one payload or (payload, logits) per stream of the layer's kind.
void append_layer(step_object& s, std::size_t layer, const py::sequence& rows, bool check_finite) {
  s.require_open_now("append");
  const model_cache& mc = s.model->cache;
  const layer_shape& shape = mc.shape(layer);  // input_error for a layer that does not exist
  const std::size_t n = s.seqs.size();
  const std::string f = mc.name() + ".step.append: layer " + std::to_string(layer) + " ";
  if (static_cast<std::size_t>(rows.size()) != n)
    detail::fail<input_error>(f + "len(rows)", rows.size(),
                              "must be the step's rows, " + std::to_string(n));
  std::vector<token_shape> shapes;
  for (std::size_t k = 0; k < shape.streams.size(); ++k) shapes.push_back(token_shape_of(mc.stream(layer, k)));
  const raw_window_config& w = shape.window;
  const std::int64_t value_channels = w.value_channels;
  std::vector<py::array> keep;
  std::vector<std::vector<token_chunk>> chunks(n);
  std::vector<layer_append> inputs(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string rf = f + "rows[" + std::to_string(i) + "]";
    const py::object row = rows[i];
    if (!(py::isinstance<py::tuple>(row) || py::isinstance<py::list>(row)) || (py::len(row) != 2 && py::len(row) != 3))
      detail::fail<input_error>(rf, py::repr(row.get_type()).cast<std::string>(),
                                "must be (chunks, window_keys) or (chunks, window_keys, window_values)");
    const auto item = py::reinterpret_borrow<py::sequence>(row);
    const py::object given = item[0];
    if (!(py::isinstance<py::tuple>(given) || py::isinstance<py::list>(given)))
      detail::fail<input_error>(rf + ".chunks", py::repr(given.get_type()).cast<std::string>(),
                                "must be a list with one payload or (payload, logits) per stream");
    const auto per_stream = py::reinterpret_borrow<py::sequence>(given);
    for (std::size_t k = 0; k < per_stream.size(); ++k)
      chunks[i].push_back(chunk_from(per_stream[k], rf + ".chunks[" + std::to_string(k) + "]", keep,
                                     k < shapes.size() ? &shapes[k] : nullptr));
    const std::int64_t tokens = s.tokens[i];
    inputs[i].chunks = span<const token_chunk>(chunks[i].data(), chunks[i].size());
    inputs[i].window_keys = window_rows(item[1], rf + ".window_keys", tokens, w.kv_heads, w.key_channels, keep);
    if (item.size() == 3)
      inputs[i].window_values = window_rows(item[2], rf + ".window_values", tokens, w.kv_heads, value_channels, keep);
  }
  append_options options;
  options.check_finite = check_finite;
  locked(*s.model, [&] {
    s.require_open("append");
    s.step->append(layer, span<const layer_append>(inputs.data(), inputs.size()), default_executor(), options);
  });
}

// A stacked read input [len(rows)][...] checked by its axes: None, or its memory.
span<const float> read_input(py::object& o, const char* name, std::vector<axis> axes, std::vector<py::array>& keep) {
  if (o.is_none()) return {};
  py::array a = as_array(o, name);
  if (!axes.empty() && py::isinstance<py::array_t<float>>(a)) require_shape(a, name, axes);
  keep.push_back(a);
  return input<float>(keep.back(), name);
}

// Reads of one layer, batched: `rows` are a step's rows (step given) or committed sequences. Returns
// (out, lse, selected_logical, selected_physical) as SparseReader.read_batch does.
py::tuple read_layer(model_object& m, step_object* s, std::size_t layer, const std::vector<std::int64_t>& rows,
                     const py::object& positions, py::object queries, py::object indexer_queries,
                     py::object indexer_weights, py::object sinks, const py::object& top_k, py::object out,
                     py::object lse, py::object selected_logical, py::object selected_physical, const py::object& traces,
                     py::object indices, index_kind indices_kind) {
  if (s) s->require_open_now("read");
  const model_cache& mc = m.cache;
  const char* what = s ? "rows" : "seqs";
  const std::string f = mc.name() + (s ? ".step.read: " : ".read: ");
  const reader_config& rc = mc.reader(layer);  // input_error for a layer that does not exist
  const detail::read_dims dims = detail::check_reader_config(mc.shape(layer), rc);
  const std::size_t batch = rows.size();
  const auto b = static_cast<py::ssize_t>(batch);
  const std::string lead = std::string("len(") + what + ")";
  std::vector<py::array> keep;
  const span<const float> q =
      read_input(queries, "queries", {{lead.c_str(), b}, {"query_heads", rc.query_heads}, {"channels", dims.key_channels}}, keep);
  span<const float> iq, iw, sk;
  if (rc.top_k > 0 && rc.indexer_stream != no_stream) {
    iq = read_input(indexer_queries, "indexer_queries",
                    {{lead.c_str(), b}, {"indexer_heads", rc.indexer_heads}, {"indexer_channels", dims.indexer_channels}}, keep);
    iw = read_input(indexer_weights, "indexer_weights", {{lead.c_str(), b}, {"indexer_heads", rc.indexer_heads}}, keep);
  } else {
    iq = read_input(indexer_queries, "indexer_queries", {}, keep);
    iw = read_input(indexer_weights, "indexer_weights", {}, keep);
  }
  sk = read_input(sinks, "sinks", rc.sink ? std::vector<axis>{{lead.c_str(), b}, {"query_heads", rc.query_heads}} : std::vector<axis>{},
                  keep);
  const auto per_item = [&](span<const float> all, std::size_t i) {
    if (all.empty() || batch == 0) return span<const float>();
    const std::size_t each = all.size() / batch;
    return span<const float>(all.data() + i * each, each);
  };
  std::vector<std::int64_t> k(batch, -1);
  if (py::isinstance<py::int_>(top_k)) {
    std::fill(k.begin(), k.end(), top_k.cast<std::int64_t>());
  } else if (!top_k.is_none()) {
    k = top_k.cast<std::vector<std::int64_t>>();
    detail::require<input_error>(k.size() == batch, f + "len(top_k)", k.size(), "must be " + lead + " = " + std::to_string(batch));
  }
  std::vector<std::int64_t> at;
  if (!positions.is_none()) {
    at = positions.cast<std::vector<std::int64_t>>();
    detail::require<input_error>(at.size() == batch, f + "len(positions)", at.size(), "must be " + lead + " = " + std::to_string(batch));
  }
  const std::int64_t vc = dims.value_channels;
  float* o = output<float>(out, "out", {b, rc.query_heads, vc}, lead + " × query_heads × value channels",
                           {{lead.c_str(), b}, {"query_heads", rc.query_heads}, {"channels", vc}});
  float* l = output<float>(lse, "lse", {b, rc.query_heads}, lead + " × query_heads", {{lead.c_str(), b}, {"query_heads", rc.query_heads}});
  std::int32_t* logical = selection_output(selected_logical, "selected_logical", batch, rc.top_k, "len(rows)");
  std::int32_t* physical = selection_output(selected_physical, "selected_physical", batch, rc.top_k, "len(rows)");
  const index_rows host = indices_of(indices, static_cast<std::int64_t>(batch), keep);
  std::vector<read_trace*> trace(batch, nullptr);
  if (!traces.is_none()) {
    trace = traces.cast<std::vector<read_trace*>>();
    detail::require<input_error>(trace.size() == batch, f + "len(traces)", trace.size(), "must be " + lead + " = " + std::to_string(batch));
  }
  std::vector<layer_read> reads(batch);
  for (std::size_t i = 0; i < batch; ++i) {
    layer_read& r = reads[i];
    if (s) {
      detail::require<input_error>(rows[i] >= 0 && static_cast<std::size_t>(rows[i]) < s->last.size(), f + "rows[" + std::to_string(i) + "]",
                                   rows[i], "must be below the step's rows, " + std::to_string(s->last.size()));
      r.row = static_cast<std::size_t>(rows[i]);
    } else {
      r.sequence = static_cast<sequence_id>(rows[i]);
    }
    r.request.queries = per_item(q, i);
    r.request.indexer_queries = per_item(iq, i);
    r.request.indexer_weights = per_item(iw, i);
    r.request.sinks = per_item(sk, i);
    r.request.top_k = k[i];
    r.request.indices = host.item(i);
    r.request.indices_kind = indices_kind;
    r.trace = trace[i];
    r.out = o + i * static_cast<std::size_t>(rc.query_heads * vc);
    r.lse = l + i * static_cast<std::size_t>(rc.query_heads);
    if (logical) r.selected_logical = logical + i * static_cast<std::size_t>(rc.top_k);
    if (physical) r.selected_physical = physical + i * static_cast<std::size_t>(rc.top_k);
  }
  locked(m, [&] {
    // Default positions: each row's last token (a step's new tokens included).
    for (std::size_t i = 0; i < batch; ++i) {
      if (!at.empty() || s) {
        reads[i].request.position = !at.empty() ? at[i] : s->last[reads[i].row];
        continue;
      }
      try {
        reads[i].request.position = mc.tokens(reads[i].sequence) - 1;
      } catch (const input_error& e) {
        throw input_error(f + "seqs[" + std::to_string(i) + "]: " + e.what());
      }
    }
    if (s) s->require_open("read");
    if (s) s->step->read(layer, span<const layer_read>(reads.data(), reads.size()));
    else m.cache.read(layer, span<const layer_read>(reads.data(), reads.size()));
  });
  return py::make_tuple(out, lse, selected_logical, selected_physical);
}

// A C-contiguous buffer's bytes (bytes, bytearray, memoryview, a NumPy array), held while in scope.
struct byte_buffer {
  Py_buffer view{};
  explicit byte_buffer(const py::object& o) {
    if (PyObject_GetBuffer(o.ptr(), &view, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      throw py::type_error("snapshot: " + py::str(o.get_type().attr("__name__")).cast<std::string>() +
                           " is not a C-contiguous buffer: pass bytes, a bytearray, a memoryview or a uint8 array");
    }
  }
  ~byte_buffer() { PyBuffer_Release(&view); }
  byte_buffer(const byte_buffer&) = delete;
  byte_buffer& operator=(const byte_buffer&) = delete;
  span<const std::byte> bytes() const {
    return span<const std::byte>(static_cast<const std::byte*>(view.buf), static_cast<std::size_t>(view.len));
  }
};

// The layer kind deepseek_v4_model builds for a compress ratio.
layer_kind deepseek_kind_of(int compress_ratio, bool precision) {
  if (compress_ratio == 0) return presets::deepseek_window_kind(precision);
  return presets::deepseek_kind(presets::deepseek_layer_of(compress_ratio, "deepseek_kind(compress_ratio)"), precision);
}

}  // namespace

void init_model(const modules& m) {
  py::module_ root = m.root;
  py::module_ presets = m.presets;

  // RopePlacement and EntryNorm are bound with Pooling (compress.cpp), which takes them.
  root.attr("FROM_ROLES") = py::int_(from_roles);

  struct_binding<stream_spec>(root, "StreamSpec", "One compressed stream of a layer kind (models/layer_kind.hpp).")
      .field("config", &stream_spec::config, "name, role, channels, kv_heads, inputs, rope, norm_eps")
      .field("pooling", &stream_spec::pooling, "an id of pooling_ids()")
      .field("rope", &stream_spec::rope, "where config.rope applies")
      .field("norm", &stream_spec::norm)
      .field("storage", &stream_spec::storage, "fp4_e2m1_hadamard: indexer streams only")
      .done();
  struct_binding<layer_kind>(root, "LayerKind",
                             "Every fact the layers of one kind share: geometry, streams, raw window, page size and "
                             "reader. No stream: a window-only kind. `streams` is a list: assign a whole new list "
                             "to change it. The reader's streams left at FROM_ROLES follow the stream roles.")
      .field("name", &layer_kind::name)
      .field("geometry", &layer_kind::geom, "ignored by a window-only kind")
      .field("streams", &layer_kind::streams)
      .field("window", &layer_kind::window)
      .field("window_rope", &layer_kind::window_rope, "a window-only kind's window keys' RoPE")
      .field("page_size", &layer_kind::page_size, "entries per page")
      .field("reader", &layer_kind::reader)
      .done()
      .def("window_only", &layer_kind::window_only);
  struct_binding<model_layer>(root, "ModelLayer", "One layer: its kind, and per stream its learned parameters (empty: defaults).")
      .field("kind", &model_layer::kind)
      .field("params", &model_layer::params)
      .done();
  struct_binding<model_spec>(root, "ModelSpec",
                             "A model as data: its layer kinds and which kind each layer is. `kinds` and `layers` are "
                             "lists: assign whole new lists to change them. Built invalid, it raises ConfigError.")
      .field("name", &model_spec::name)
      .field("kinds", &model_spec::kinds)
      .field("layers", &model_spec::layers, "in the model's order")
      .checked_when_built([](const model_spec& s) {
        if (!s.kinds.empty() && !s.layers.empty()) validate(s);
      })
      .done()
      .def("validate", [](const model_spec& s) { validate(s); }, "ConfigError naming the field for a spec no ModelCache can be built from.");
  struct_binding<model_options>(root, "ModelOptions", "A ModelCache's page ids and history (the page memory is not exposed).")
      .field("pages", &model_options::pages, "page ids per layer kind")
      .field("kind_pages", &model_options::kind_pages, "per kind instead of pages (a list; empty: pages for every kind)")
      .field("history", &model_options::history, "tokens remove_suffix may roll back beyond the minimum")
      .done();

  py::class_<model_memory>(root, "ModelMemory", "What one model sequence occupies, per layer and in total.")
      .def_readonly("layers", &model_memory::layers)
      .def_readonly("total", &model_memory::total);
  py::class_<model_pool_usage::kind_usage>(root, "KindPoolUsage", "Pages in use by one layer kind, and their bytes over its layers and streams.")
      .def_readonly("name", &model_pool_usage::kind_usage::name)
      .def_readonly("pages_used", &model_pool_usage::kind_usage::pages_used)
      .def_readonly("capacity", &model_pool_usage::kind_usage::capacity)
      .def_readonly("bytes_used", &model_pool_usage::kind_usage::bytes_used)
      .def_readonly("bytes_touched", &model_pool_usage::kind_usage::bytes_touched)
      .def_readonly("bytes_reserved", &model_pool_usage::kind_usage::bytes_reserved);
  py::class_<model_pool_usage>(root, "ModelPoolUsage", "Per layer kind the pages in use, and the total.")
      .def_readonly("kinds", &model_pool_usage::kinds)
      .def_readonly("total", &model_pool_usage::total);

  root.def(
      "pooling_ids", [] { return builtin_poolings().ids(); }, "The ids of the built-in poolings (StreamSpec.pooling).");

  const char* read_doc =
      "Reads of one layer, batched: queries [len][query_heads][key channels] (RoPE'd at the position), "
      "indexer_queries [len][indexer_heads][indexer channels] and indexer_weights [len][indexer_heads] with the "
      "reader's top_k, sinks [len][query_heads] with its sink. positions: None reads each one's last token. "
      "Returns (out [len][query_heads][value channels], lse [len][query_heads], selected_logical, "
      "selected_physical) as SparseReader.read_batch: the selections int32 [len][reader top_k] when asked for "
      "(True, or an array to fill), else None. traces: None, or one ReadTrace (or None) per read. indices: int32 "
      "[len][n] entry ids the host selected (−1 padded; the indexer inputs None), logical or, with "
      "indices_kind=IndexKind.physical, physical ids.";

  py::class_<step_object>(root, "ModelStep",
                          "One step of a ModelCache (ModelCache.begin): append every layer's new tokens, read "
                          "layers, then commit() — all or nothing. Aborted when closed uncommitted, or when a `with` "
                          "block ends without commit(). Calls release the GIL.")
      .def_property_readonly("rows", [](const step_object& s) { return s.open() ? s.seqs.size() : 0; })
      .def_property_readonly("open", &step_object::open)
      .def("sequence", [](const step_object& s, std::size_t row) { return s.seqs[s.row(row, "sequence")]; }, py::arg("row"))
      .def("tokens", [](const step_object& s, std::size_t row) { return s.tokens[s.row(row, "tokens")]; }, py::arg("row"),
           "The row's new tokens in this step.")
      .def("append", &append_layer, py::arg("layer"), py::arg("rows"), py::kw_only(), py::arg("check_finite") = false,
           "Appends one layer's new tokens for every row: rows[i] = (chunks, window_keys) or (chunks, window_keys, "
           "window_values); chunks one payload or (payload, logits) per stream, payload (tokens, kv_heads, views, "
           "channels) or (tokens, floats), float32 or bf16 bits; window rows float32 (tokens, kv_heads, channels) or "
           "None. All or nothing for the layer: a bad row raises InputError naming it, and the layer may be appended "
           "again.")
      .def(
          "read",
          [](step_object& s, std::size_t layer, const std::vector<std::int64_t>& rows, py::object queries,
             py::object indexer_queries, py::object indexer_weights, py::object sinks, const py::object& positions,
             const py::object& top_k, py::object out, py::object lse, py::object selected_logical,
             py::object selected_physical, const py::object& traces, py::object indices, index_kind indices_kind) {
            return read_layer(*s.model, &s, layer, rows, positions, queries, indexer_queries, indexer_weights, sinks, top_k,
                              out, lse, selected_logical, selected_physical, traces, indices, indices_kind);
          },
          py::arg("layer"), py::arg("rows"), py::arg("queries"), py::arg("indexer_queries") = py::none(),
          py::arg("indexer_weights") = py::none(), py::arg("sinks") = py::none(), py::kw_only(),
          py::arg("positions") = py::none(), py::arg("top_k") = py::none(), py::arg("out") = py::none(),
          py::arg("lse") = py::none(), py::arg("selected_logical") = py::none(), py::arg("selected_physical") = py::none(),
          py::arg("traces") = py::none(), py::arg("indices") = py::none(), py::arg("indices_kind") = index_kind::logical,
          (std::string("Reads of a layer appended in this step, over the cache and the new tokens; rows are the step's "
                       "row indices. ") + read_doc).c_str())
      .def(
          "commit",
          [](step_object& s) {
            locked(*s.model, [&] {
              s.require_open("commit");
              s.step->commit();
            });
          },
          "Publishes every layer's new tokens; InputError, changing nothing, while a layer was not appended.")
      .def("abort", &step_object::abort, "Puts every layer back as before begin() (no-op on a closed step).")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](step_object& s, const py::object&, const py::object&, const py::object&) {
            s.abort();
            return false;
          },
          py::arg("exc_type"), py::arg("exc"), py::arg("traceback"));

  py::class_<model_object>(root, "ModelCache",
                           "A whole model's compressed KV cache behind one front door (models/model_cache.hpp): one "
                           "sequence table for every layer, steps that append and read layer by layer, snapshots. "
                           "Calls release the GIL and run one at a time per ModelCache.")
      .def(py::init([](const model_spec& spec, const model_options& options) { return std::make_unique<model_object>(spec, options); }),
           py::arg("spec"), py::arg("options") = model_options{})
      .def_property_readonly("name", [](const model_object& m) { return m.cache.name(); })
      .def_property_readonly("spec", [](const model_object& m) { return m.cache.spec(); })
      .def_property_readonly("options", [](const model_object& m) { return m.cache.options(); })
      .def_property_readonly("layers", [](const model_object& m) { return m.cache.layers(); })
      .def_property_readonly("kinds", [](const model_object& m) { return m.cache.kinds(); })
      .def("kind_of", [](const model_object& m, std::size_t layer) { return m.cache.kind_of(layer); }, py::arg("layer"))
      .def("shape", [](const model_object& m, std::size_t layer) { return m.cache.shape(layer); }, py::arg("layer"),
           "The layer's read-side shape.")
      .def("reader", [](const model_object& m, std::size_t layer) { return m.cache.reader(layer); }, py::arg("layer"),
           "The layer's reader config, its streams resolved from the roles.")
      .def(
          "stream_floats",
          [](const model_object& m, std::size_t layer, std::size_t stream) {
            const stream_kernel& k = m.cache.stream(layer, stream);
            return py::make_tuple(k.payload_floats_per_token(), k.logit_floats_per_token());
          },
          py::arg("layer"), py::arg("stream"), "(payload floats, logit floats) per token of a layer's stream.")

      // ---- sequences
      .def("create", [](model_object& m) { return locked(m, [&] { return m.cache.create(); }); })
      .def("fork", [](model_object& m, sequence_id seq) { return locked(m, [&] { return m.cache.fork(seq); }); },
           py::arg("seq"), "A new sequence sharing every page of seq.")
      .def(
          "copy",
          [](model_object& m, sequence_id source, sequence_id destination) {
            locked(m, [&] { m.cache.copy(source, destination); });
          },
          py::arg("source"), py::arg("destination"), "Makes destination a fork of source.")
      .def(
          "remove_suffix", [](model_object& m, sequence_id seq, std::int64_t p0) { locked(m, [&] { m.cache.remove_suffix(seq, p0); }); },
          py::arg("seq"), py::arg("p0"), "Forgets tokens [p0, end) in every layer.")
      .def(
          "can_remove_suffix",
          [](model_object& m, sequence_id seq, std::int64_t p0) { return locked(m, [&] { return m.cache.can_remove_suffix(seq, p0); }); },
          py::arg("seq"), py::arg("p0"))
      .def("free", [](model_object& m, sequence_id seq) { locked(m, [&] { m.cache.free(seq); }); }, py::arg("seq"))
      .def("keep", [](model_object& m, sequence_id seq) { locked(m, [&] { m.cache.keep(seq); }); }, py::arg("seq"),
           "Drops every sequence but seq.")
      .def("clear", [](model_object& m) { locked(m, [&] { m.cache.clear(); }); })
      .def("contains", [](model_object& m, sequence_id seq) { return locked(m, [&] { return m.cache.contains(seq); }); },
           py::arg("seq"))
      .def("__contains__", [](model_object& m, sequence_id seq) { return locked(m, [&] { return m.cache.contains(seq); }); })
      .def_property_readonly("sequences", [](model_object& m) { return locked(m, [&] { return m.cache.sequences(); }); })
      .def("live_sequences", [](model_object& m) { return locked(m, [&] { return m.cache.live_sequences(); }); })
      .def("tokens", [](model_object& m, sequence_id seq) { return locked(m, [&] { return m.cache.tokens(seq); }); },
           py::arg("seq"))

      // ---- steps and reads
      .def(
          "begin",
          [](py::object self, const std::vector<sequence_id>& seqs, const py::object& tokens) {
            model_object& m = self.cast<model_object&>();
            std::vector<std::int64_t> each;
            if (py::isinstance<py::int_>(tokens)) each.assign(seqs.size(), tokens.cast<std::int64_t>());
            else each = tokens.cast<std::vector<std::int64_t>>();
            auto made = std::make_unique<step_object>();
            made->owner = self;
            made->model = &m;
            locked(m, [&] {
              std::vector<std::int64_t> before(seqs.size(), 0);
              for (std::size_t i = 0; i < seqs.size(); ++i) {
                try {
                  before[i] = m.cache.tokens(seqs[i]);
                } catch (const input_error&) {  // begin() names the sequence and why
                }
              }
              made->step.emplace(m.cache.begin(span<const sequence_id>(seqs.data(), seqs.size()),
                                               span<const std::int64_t>(each.data(), each.size())));
              made->seqs = seqs;
              made->tokens = each;
              for (std::size_t i = 0; i < seqs.size(); ++i) made->last.push_back(before[i] + each[i] - 1);
            });
            return made;
          },
          py::arg("seqs"), py::arg("tokens"),
          "A step appending `tokens` (an int, or one per sequence) new tokens to each of seqs (distinct, none in "
          "another open step); every page every layer kind needs is reserved here (CapacityError changes nothing).")
      .def(
          "read",
          [](model_object& m, std::size_t layer, const std::vector<std::int64_t>& seqs, py::object queries,
             py::object indexer_queries, py::object indexer_weights, py::object sinks, const py::object& positions,
             const py::object& top_k, py::object out, py::object lse, py::object selected_logical,
             py::object selected_physical, const py::object& traces, py::object indices, index_kind indices_kind) {
            return read_layer(m, nullptr, layer, seqs, positions, queries, indexer_queries, indexer_weights, sinks, top_k,
                              out, lse, selected_logical, selected_physical, traces, indices, indices_kind);
          },
          py::arg("layer"), py::arg("seqs"), py::arg("queries"), py::arg("indexer_queries") = py::none(),
          py::arg("indexer_weights") = py::none(), py::arg("sinks") = py::none(), py::kw_only(),
          py::arg("positions") = py::none(), py::arg("top_k") = py::none(), py::arg("out") = py::none(),
          py::arg("lse") = py::none(), py::arg("selected_logical") = py::none(), py::arg("selected_physical") = py::none(),
          py::arg("traces") = py::none(), py::arg("indices") = py::none(), py::arg("indices_kind") = index_kind::logical,
          (std::string("Reads of a layer over committed sequences. ") + read_doc).c_str())
      .def(
          "read_entry",
          [](model_object& m, std::size_t layer, std::size_t stream, sequence_id seq, std::int64_t j) {
            const stream_config& c = m.cache.stream(layer, stream).config();
            std::vector<float> values(static_cast<std::size_t>(c.kv_heads * c.channels));
            locked(m, [&] { m.cache.read_entry(layer, stream, seq, j, span<float>(values.data(), values.size())); });
            return adopt(std::move(values), {c.kv_heads, c.channels});
          },
          py::arg("layer"), py::arg("stream"), py::arg("seq"), py::arg("j"),
          "Entry j of a layer's stream as float32 [kv_heads][channels] (a copy).")
      .def(
          "copy_window_key",
          [](model_object& m, std::size_t layer, sequence_id seq, std::int64_t t) {
            const raw_window_config& w = m.cache.shape(layer).window;
            std::vector<float> row(static_cast<std::size_t>(w.kv_heads * w.key_channels));
            locked(m, [&] { m.cache.copy_window_key(layer, seq, t, span<float>(row.data(), row.size())); });
            return adopt(std::move(row), {w.kv_heads, w.key_channels});
          },
          py::arg("layer"), py::arg("seq"), py::arg("t"), "Token t's window key row as a read sees it, float32 [kv_heads][key channels].")
      .def(
          "copy_window_value",
          [](model_object& m, std::size_t layer, sequence_id seq, std::int64_t t) {
            const raw_window_config& w = m.cache.shape(layer).window;
            const std::int64_t channels = w.value_channels == 0 ? w.key_channels : w.value_channels;
            std::vector<float> row(static_cast<std::size_t>(w.kv_heads * channels));
            locked(m, [&] { m.cache.copy_window_value(layer, seq, t, span<float>(row.data(), row.size())); });
            return adopt(std::move(row), {w.kv_heads, channels});
          },
          py::arg("layer"), py::arg("seq"), py::arg("t"), "Token t's window value row (its key when tied), float32.")
      .def(
          "page_table",
          [](model_object& m, sequence_id seq, std::size_t kind) {
            return copy_of(locked(m, [&] { return m.cache.page_table(seq, kind); }));
          },
          py::arg("seq"), py::arg("kind"), "The page ids of a sequence's table for a kind (int32, a copy).")
      .def("memory", [](model_object& m, sequence_id seq) { return locked(m, [&] { return m.cache.memory(seq); }); },
           py::arg("seq"))
      .def("pool_usage", [](model_object& m) { return locked(m, [&] { return m.cache.pool_usage(); }); })

      // ---- snapshots
      .def(
          "snapshot",
          [](model_object& m, sequence_id seq) {
            const std::vector<std::byte> bytes = locked(m, [&] { return snapshot(m.cache, seq); });
            return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          },
          py::arg("seq"), "A sequence's snapshot of every layer (bytes; docs/SNAPSHOT.md).")
      .def(
          "restore",
          [](model_object& m, const py::object& snapshot) {
            const byte_buffer buffer(snapshot);
            return locked(m, [&] { return restore(m.cache, buffer.bytes()); });
          },
          py::arg("snapshot"),
          "A snapshot (bytes, bytearray, memoryview or uint8 array) restored as a new sequence; its id. A snapshot "
          "that does not fit this model, or a damaged one, raises InputError and changes nothing.");

  presets.def("deepseek_v4_model", &presets::deepseek_v4_model, py::arg("compress_ratios"), py::arg("precision") = false,
              py::arg("name") = "dsv4",
              "The model from its checkpoint's compress_ratios: 0 window-only, 4 CSA, 128 HCA, 2 V4.1's CSA.");
  presets.def("deepseek_v4_shaped", &presets::deepseek_v4_shaped, py::arg("layers"), py::arg("precision") = false,
              "A DeepSeek-V4-shaped model: two window-only layers, then CSA and HCA alternating.");
  presets.def("deepseek_kind", &deepseek_kind_of, py::arg("compress_ratio"), py::arg("precision") = false,
              "The layer kind of a compress ratio (0, 4, 128 or 2) as deepseek_v4_model builds it.");
  presets.def("deepseek_window_kind", &presets::deepseek_window_kind, py::arg("precision") = false,
              "A window-only layer kind: the last 128 tokens' tied K/V, read with the sink.");
  presets.def("deepseek_indexer_weight_scale", &presets::deepseek_indexer_weight_scale,
              "index_head_dim^-0.5 · index_heads^-0.5: the factor DeepSeek scales its indexer weights by.");
}

}  // namespace pyphasekv
