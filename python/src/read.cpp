// read/: the sparse reader — single reads and batched reads of a PagedCache's sequences with
// their outputs, log-sum-exp and selected entries, the read trace — and the DeepSeek-V4 reader
// presets.

#include "layer.hpp"

namespace pyphasekv {

using namespace phasekv;

namespace {

// Runs f() with the reader's scratch and the cache's sequences to ourselves (shared: other
// readers may read the same cache at once), without the GIL.
template <class F>
void locked_read(reader& r, const layer_cache& c, F&& f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> reading(r.lock);
  std::shared_lock<std::shared_mutex> cache(c.lock);
  f();
}

std::int64_t value_channels(const reader& r) { return r.sparse.output_floats() / r.sparse.config().query_heads; }
std::int64_t stream_channels(const reader& r, std::size_t k) {
  const auto& streams = r.sparse.shape().streams;
  return k < streams.size() ? streams[k].channels : 0;
}

// The documented shapes of a read's inputs, checked before any size check: leading axes `batch`
// (read_batch: {B}) then the item's own.
void check_read_shapes(const reader& r, std::vector<py::array>& keep, py::object& queries,
                       py::object& indexer_queries, py::object& indexer_weights, py::object& sinks,
                       std::int64_t batch) {
  const reader_config& rc = r.sparse.config();
  const std::int64_t qh = rc.query_heads, ih = rc.indexer_heads, kc = stream_channels(r, rc.key_stream),
                     ic = stream_channels(r, rc.indexer_stream);
  // Each argument is replaced by its array, so the read that follows takes it as it is (a
  // tensor is imported through DLPack once, not twice).
  const auto check = [&](py::object& o, const char* name, std::initializer_list<axis> item) {
    if (o.is_none()) return;
    py::array a = as_array(o, name);
    o = a;
    if (!py::isinstance<py::array_t<float>>(a)) return;  // optional_input names a dtype error first
    keep.push_back(a);
    std::vector<axis> axes;
    if (batch >= 0) axes.push_back({"len(seqs)", batch});
    for (const axis& x : item) axes.push_back(x);
    require_shape(a, name, axes);
  };
  check(queries, "queries", {{"query_heads", qh}, {"channels", kc}});
  if (rc.top_k > 0) {
    check(indexer_queries, "indexer_queries", {{"indexer_heads", ih}, {"indexer_channels", ic}});
    check(indexer_weights, "indexer_weights", {{"indexer_heads", ih}});
  }
  if (rc.sink) check(sinks, "sinks", {{"query_heads", qh}});
}

// A batch input [B][...]: its memory and the floats of one item, or an empty span for None.
struct batch_rows {
  const float* data = nullptr;
  std::size_t per_item = 0;
  span<const float> item(std::size_t b) const {
    return data ? span<const float>(data + b * per_item, per_item) : span<const float>();
  }
};
batch_rows rows_of(const py::object& o, const char* name, std::size_t batch, std::vector<py::array>& keep) {
  const span<const float> all = optional_input<float>(o, name, keep);
  if (o.is_none()) return {};
  const py::array& a = keep.back();
  if (a.ndim() < 1 || static_cast<std::size_t>(a.shape(0)) != batch)
    detail::fail<input_error>(std::string(name) + ".shape[0]", a.ndim() < 1 ? 0 : a.shape(0),
                              "must be the batch size len(seqs) = " + std::to_string(batch));
  return {all.data(), batch == 0 ? 0 : all.size() / batch};
}

// A copied array property of the trace (a trace is reused by later reads, so views would dangle).
template <class T>
py::array_t<T> trace_copy(const std::vector<T>& v) {
  return copy_of(v);
}

// The selector's indexer inputs as a request, their shapes checked.
selection_request selection_inputs(const selector& s, std::vector<py::array>& keep, std::int64_t position,
                                   py::object& indexer_queries, py::object& indexer_weights, std::int64_t top_k) {
  const selection_config& sc = s.stage.config();
  const std::int64_t ih = sc.indexer_heads, ic = s.stage.shape().streams[sc.indexer_stream].channels;
  for (auto [o, name] : {std::pair<py::object*, const char*>{&indexer_queries, "indexer_queries"}, {&indexer_weights, "indexer_weights"}}) {
    py::array a = as_array(*o, name);
    *o = a;
    if (!py::isinstance<py::array_t<float>>(a)) continue;  // input() names the dtype
    if (o == &indexer_queries) require_shape(a, name, {{"indexer_heads", ih}, {"indexer_channels", ic}});
    else require_shape(a, name, {{"indexer_heads", ih}});
  }
  selection_request r;
  r.position = position;
  r.indexer_queries = optional_input<float>(indexer_queries, "indexer_queries", keep);
  r.indexer_weights = optional_input<float>(indexer_weights, "indexer_weights", keep);
  r.top_k = top_k;
  return r;
}

// Runs f(cache) with the selector's scratch and the cache's sequences to ourselves, without the GIL.
template <class F>
void locked_selection(selector& s, const layer_cache& c, F&& f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> selecting(s.lock);
  std::shared_lock<std::shared_mutex> cache(c.lock);
  c.visit([&](const auto& x) { f(x); });
}

}  // namespace

[[gnu::noinline]] void read_one(reader& r, const layer_cache& c, sequence_id seq, const read_request& request,
                                float* out, read_trace* trace) {
  c.visit([&](const auto& cache) { r.sparse.read(cache, seq, request, out, trace); });
}

void init_read(const modules& m) {
  py::module_ root = m.root;
  py::module_ presets = m.presets;

  py::enum_<indexer_precision>(root, "IndexerPrecision", "What the lightning indexer multiplies.")
      .value("f32", indexer_precision::f32)
      .value("bf16", indexer_precision::bf16)
      .value("fp4", indexer_precision::fp4);

  py::enum_<index_kind>(root, "IndexKind",
                        "What host indices count: logical entry ids, or FlashMLA's physical ids "
                        "(page * page_size + slot, as selected_physical returns them).")
      .value("logical", index_kind::logical)
      .value("physical", index_kind::physical);
  py::enum_<lse_convention>(root, "LseConvention", "What a read reports as its log-sum-exp.")
      .value("with_sink", lse_convention::with_sink, "ln(Σ exp ℓ + exp(sink)): an exact softmax state; −inf when empty")
      .value("flashmla", lse_convention::flashmla, "FlashMLA's: ln Σ exp ℓ over the keys only; +inf when no key");

  // indexer_stream is a std::size_t with no_stream for "none": None in Python.
  struct_binding<reader_config>(root, "ReaderConfig",
                                "A sparse reader's heads, streams and selection (read/read_types.hpp).")
      .field("name", &reader_config::name)
      .field("query_heads", &reader_config::query_heads)
      .field("scale", &reader_config::scale, "logit scale; 0 means 1/sqrt(key channels)")
      .field("key_stream", &reader_config::key_stream)
      .field("value_stream", &reader_config::value_stream, "= key_stream for tied K/V")
      .property(
          "indexer_stream",
          [](const reader_config& c) -> py::object {
            return c.indexer_stream == no_stream ? py::object(py::none()) : py::int_(c.indexer_stream);
          },
          [](reader_config& c, const py::object& v) {
            c.indexer_stream = v.is_none() ? no_stream : v.cast<std::size_t>();
          },
          "the indexer's stream, or None")
      .field("top_k", &reader_config::top_k, "0: attend to every candidate; > 0 needs an indexer stream")
      .field("indexer_heads", &reader_config::indexer_heads)
      .field("precision", &reader_config::precision)
      .field("sink", &reader_config::sink, "requests carry one sink logit per query head")
      .field("derotate_output", &reader_config::derotate_output, "tied K/V with RoPE: rotate the output back by t")
      .field("lse", &reader_config::lse, "the log-sum-exp convention of read_batch's lse")
      .done();

  struct_binding<selection_config>(root, "SelectionConfig",
                                   "The selection stage on its own (read/selection.hpp): the indexer's stream, "
                                   "heads and precision, top_k, and the stream physical ids index.")
      .field("name", &selection_config::name)
      .property(
          "indexer_stream",
          [](const selection_config& c) -> py::object {
            return c.indexer_stream == no_stream ? py::object(py::none()) : py::int_(c.indexer_stream);
          },
          [](selection_config& c, const py::object& v) {
            c.indexer_stream = v.is_none() ? no_stream : v.cast<std::size_t>();
          },
          "the indexer's stream")
      .field("indexer_heads", &selection_config::indexer_heads)
      .field("precision", &selection_config::precision)
      .field("top_k", &selection_config::top_k)
      .field("physical_stream", &selection_config::physical_stream,
             "the stream whose pages physical ids index (a reader's key stream)")
      .done();
  root.def("selection_of", &selection_of, py::arg("config"), "The selection stage of a ReaderConfig.");

  py::class_<read_trace>(root, "ReadTrace",
                         "What one read looked at (pass one as trace= to a read; it is overwritten). Array "
                         "properties are copies. Masses are means over query heads.")
      .def(py::init<>())
      .def_readonly("candidates", &read_trace::candidates)
      .def_property_readonly(
          "selected", [](const read_trace& t) { return trace_copy(t.selected); },
          "entry ids in rank order (index order without an indexer), int64")
      .def_property_readonly(
          "scores", [](const read_trace& t) { return trace_copy(t.scores); },
          "their indexer scores (empty without an indexer)")
      .def_property_readonly(
          "entry_mass", [](const read_trace& t) { return trace_copy(t.entry_mass); },
          "attention mass per selected entry")
      .def_readonly("window_first", &read_trace::window_first, "window tokens read: [window_first, position]")
      .def_property_readonly("window_token_mass", [](const read_trace& t) { return trace_copy(t.window_token_mass); })
      .def_readonly("window_mass", &read_trace::window_mass)
      .def_readonly("sink_mass", &read_trace::sink_mass);

  py::class_<reader>(root, "SparseReader",
                     "Sparse attention over a PagedCache's sequences (sparse_reader): selection by the lightning "
                     "indexer, attention over the selected entries and the raw window, an optional sink. Holds "
                     "scratch: one read at a time per reader (concurrent calls wait). Reads release the GIL.")
      .def(py::init([](const layer_cache& c, const reader_config& config) {
             return std::make_unique<reader>(c.visit([](const auto& x) { return x.shape(); }), config);
           }),
           py::arg("cache"), py::arg("config"))
      .def(py::init([](const layer_shape& shape, const reader_config& config) {
             return std::make_unique<reader>(shape, config);
           }),
           py::arg("shape"), py::arg("config"))
      .def_property_readonly("config", [](const reader& r) { return r.sparse.config(); })
      .def_property_readonly("shape", [](const reader& r) { return r.sparse.shape(); })
      .def_property_readonly("output_floats", [](const reader& r) { return r.sparse.output_floats(); })
      .def(
          "read",
          [](reader& r, const layer_cache& c, sequence_id seq, std::int64_t position, py::object queries,
             py::object indexer_queries, py::object indexer_weights, py::object sinks,
             std::int64_t top_k, py::object out, read_trace* trace, py::object indices, index_kind indices_kind) {
            std::vector<py::array> keep;
            check_read_shapes(r, keep, queries, indexer_queries, indexer_weights, sinks, -1);
            const index_rows host = indices_of(indices, -1, keep);
            read_request request;
            request.position = position;
            request.queries = optional_input<float>(queries, "queries", keep);
            request.indexer_queries = optional_input<float>(indexer_queries, "indexer_queries", keep);
            request.indexer_weights = optional_input<float>(indexer_weights, "indexer_weights", keep);
            request.sinks = optional_input<float>(sinks, "sinks", keep);
            request.top_k = top_k;
            request.indices = host.item(0);
            request.indices_kind = indices_kind;
            float* to = output<float>(out, "out", {r.sparse.config().query_heads, value_channels(r)},
                                      "query_heads × value channels",
                                      {{"query_heads", r.sparse.config().query_heads}, {"channels", value_channels(r)}});
            locked_read(r, c, [&] { read_one(r, c, seq, request, to, trace); });
            return out;
          },
          py::arg("cache"), py::arg("seq"), py::arg("position"), py::arg("queries"),
          py::arg("indexer_queries") = py::none(), py::arg("indexer_weights") = py::none(),
          py::arg("sinks") = py::none(), py::kw_only(), py::arg("top_k") = -1, py::arg("out") = py::none(),
          py::arg("trace") = static_cast<read_trace*>(nullptr), py::arg("indices") = py::none(),
          py::arg("indices_kind") = index_kind::logical,
          "Attention output of one query at `position` (already appended): queries [query_heads][key channels] "
          "RoPE'd at position; indexer_queries [indexer_heads][indexer channels] and indexer_weights "
          "[indexer_heads] with top_k; sinks [query_heads] with the sink. indices: int32 entry ids the host "
          "selected (−1 padding, at most the reader's top_k), read in their order instead of running the "
          "indexer (indexer inputs None); indices_kind says whether they are logical entry ids (the default) "
          "or physical ids as selected_physical returns them. Returns out [query_heads][value channels] (the array passed as "
          "out=, or a new one).")
      .def(
          "read_batch",
          [](reader& r, const layer_cache& c, const std::vector<sequence_id>& seqs,
             const std::vector<std::int64_t>& positions, py::object queries, py::object indexer_queries,
             py::object indexer_weights, py::object sinks, const py::object& top_k, py::object out,
             py::object lse, py::object selected_logical, py::object selected_physical, const py::object& traces,
             py::object indices, index_kind indices_kind) {
            const std::size_t batch = seqs.size();
            detail::require<input_error>(positions.size() == batch, "read_batch: len(positions)", positions.size(),
                                         "must be len(seqs) = " + std::to_string(batch));
            std::vector<py::array> keep;
            check_read_shapes(r, keep, queries, indexer_queries, indexer_weights, sinks,
                              static_cast<std::int64_t>(batch));
            const batch_rows q = rows_of(queries, "queries", batch, keep);
            const batch_rows iq = rows_of(indexer_queries, "indexer_queries", batch, keep);
            const batch_rows iw = rows_of(indexer_weights, "indexer_weights", batch, keep);
            const batch_rows s = rows_of(sinks, "sinks", batch, keep);
            const index_rows host = indices_of(indices, static_cast<std::int64_t>(batch), keep);
            std::vector<std::int64_t> k(batch, -1);
            if (!top_k.is_none()) {
              k = top_k.cast<std::vector<std::int64_t>>();
              detail::require<input_error>(k.size() == batch, "read_batch: len(top_k)", k.size(),
                                           "must be len(seqs) = " + std::to_string(batch));
            }
            const reader_config& rc = r.sparse.config();
            const auto b = static_cast<py::ssize_t>(batch);
            float* o = output<float>(out, "out", {b, rc.query_heads, value_channels(r)},
                                     "len(seqs) × query_heads × value channels",
                                     {{"len(seqs)", b}, {"query_heads", rc.query_heads}, {"channels", value_channels(r)}});
            float* l = output<float>(lse, "lse", {b, rc.query_heads}, "len(seqs) × query_heads",
                                     {{"len(seqs)", b}, {"query_heads", rc.query_heads}});
            std::int32_t* logical = selection_output(selected_logical, "selected_logical", batch, rc.top_k, "len(seqs)");
            std::int32_t* physical = selection_output(selected_physical, "selected_physical", batch, rc.top_k, "len(seqs)");
            std::vector<read_trace*> trace(batch, nullptr);
            if (!traces.is_none()) {
              trace = traces.cast<std::vector<read_trace*>>();
              detail::require<input_error>(trace.size() == batch, "read_batch: len(traces)", trace.size(),
                                           "must be len(seqs) = " + std::to_string(batch));
            }
            std::vector<sequence_view> views(batch);
            std::vector<read_item> items(batch);
            locked_read(r, c, [&] {
              c.visit([&](const auto& x) {
                for (std::size_t i = 0; i < batch; ++i) views[i] = x.view_of(seqs[i]);
              });
              for (std::size_t i = 0; i < batch; ++i) {
                read_item& item = items[i];
                item.view = &views[i];
                item.request = {positions[i], q.item(i), iq.item(i), iw.item(i), s.item(i), k[i], host.item(i), indices_kind};
                item.out = o + i * static_cast<std::size_t>(r.sparse.output_floats());
                item.lse = l + i * static_cast<std::size_t>(rc.query_heads);
                if (logical) item.selected_logical = logical + i * static_cast<std::size_t>(rc.top_k);
                if (physical) item.selected_physical = physical + i * static_cast<std::size_t>(rc.top_k);
                item.trace = trace[i];
              }
              r.sparse.read_batch(span<const read_item>(items.data(), items.size()));
            });
            return py::make_tuple(out, lse, selected_logical, selected_physical);
          },
          py::arg("cache"), py::arg("seqs"), py::arg("positions"), py::arg("queries"),
          py::arg("indexer_queries") = py::none(), py::arg("indexer_weights") = py::none(),
          py::arg("sinks") = py::none(), py::kw_only(), py::arg("top_k") = py::none(), py::arg("out") = py::none(),
          py::arg("lse") = py::none(), py::arg("selected_logical") = py::none(),
          py::arg("selected_physical") = py::none(), py::arg("traces") = py::none(), py::arg("indices") = py::none(),
          py::arg("indices_kind") = index_kind::logical,
          "B sequences in one call, bit-identical to B single reads. Inputs are stacked [B][...] arrays; top_k "
          "a list of B (None: the reader's), the per-sequence length of host indices [B][n] (int32, −1 "
          "padded; FlashMLA's indices and topk_length, logical entry ids or, with indices_kind=IndexKind.physical, "
          "physical ids). Returns (out [B][query_heads][value channels], lse "
          "[B][query_heads], selected_logical, selected_physical): the selections are int32 [B][reader top_k] "
          "when asked for (True, or an array to fill), else None.");

  py::class_<selector>(root, "EntrySelector",
                       "The lightning indexer and top-k alone (entry_selector): score a sequence's candidate "
                       "entries, or select the top k as logical and physical ids, without attention queries. "
                       "Holds scratch: one call at a time (concurrent calls wait). Calls release the GIL.")
      .def(py::init([](const layer_cache& c, const selection_config& config) {
             return std::make_unique<selector>(c.visit([](const auto& x) { return x.shape(); }), config);
           }),
           py::arg("cache"), py::arg("config"))
      .def(py::init([](const layer_shape& shape, const selection_config& config) {
             return std::make_unique<selector>(shape, config);
           }),
           py::arg("shape"), py::arg("config"))
      .def_property_readonly("config", [](const selector& s) { return s.stage.config(); })
      .def("candidates", [](const selector& s, std::int64_t position) { return s.stage.candidates(position); },
           py::arg("position"), "The entries a query at `position` may see.")
      .def(
          "score",
          [](selector& s, const layer_cache& c, sequence_id seq, std::int64_t position, py::object indexer_queries,
             py::object indexer_weights) {
            std::vector<py::array> keep;
            const selection_request request = selection_inputs(s, keep, position, indexer_queries, indexer_weights, -1);
            std::vector<float> scores;
            locked_selection(s, c, [&](const auto& cache) {
              const sequence_view view = cache.view_of(seq);
              // Sized only for a position the sequence holds; any other is the call's error.
              if (position >= 0 && position < view.tokens) scores.resize(static_cast<std::size_t>(s.stage.candidates(position)));
              s.stage.score(view, request, scores);
            });
            const auto n = static_cast<py::ssize_t>(scores.size());
            return adopt(std::move(scores), {n});
          },
          py::arg("cache"), py::arg("seq"), py::arg("position"), py::arg("indexer_queries"), py::arg("indexer_weights"),
          "Every candidate's indexer score I_j = Σ_h w_h · ReLU(q_h · k_j), float32 [candidates(position)].")
      .def(
          "select",
          [](selector& s, const layer_cache& c, sequence_id seq, std::int64_t position, py::object indexer_queries,
             py::object indexer_weights, std::int64_t top_k) {
            std::vector<py::array> keep;
            const selection_request request =
                selection_inputs(s, keep, position, indexer_queries, indexer_weights, top_k);
            // Never more than the config's top_k: a larger request is the call's error.
            const std::int64_t k = top_k < 0 ? s.stage.config().top_k : std::min(top_k, s.stage.config().top_k);
            std::vector<std::int32_t> logical(static_cast<std::size_t>(k)), physical(logical.size());
            std::vector<float> scores(logical.size());
            locked_selection(s, c, [&](const auto& cache) { s.stage.select(cache, seq, request, logical, physical, scores); });
            return py::make_tuple(adopt(std::move(logical), {k}), adopt(std::move(physical), {k}),
                                  adopt(std::move(scores), {k}));
          },
          py::arg("cache"), py::arg("seq"), py::arg("position"), py::arg("indexer_queries"), py::arg("indexer_weights"),
          py::kw_only(), py::arg("top_k") = -1,
          "The top k in rank order (ties: lower id first): (logical ids, physical ids, scores), int32/int32/"
          "float32 [top_k], −1 (NaN for scores) past the number selected. top_k −1: the config's.");

  presets.def(
      "deepseek_reader",
      [](int compress_ratio, bool precision) {
        return presets::deepseek_reader(presets::deepseek_layer_of(compress_ratio, "deepseek_reader(compress_ratio)"),
                                        precision);
      },
      py::arg("compress_ratio"), py::arg("precision") = false,
      "The reader of the layer of a compress ratio: 64 query heads, tied 512-channel K/V on stream 0, sink, "
      "de-rotated output; a CSA layer's (4, 2) indexer of 64 heads on stream 1 selects the top 512, in FP4 "
      "(IndexerPrecision.fp4) with precision; HCA (128) reads every complete entry.");
}

}  // namespace pyphasekv
