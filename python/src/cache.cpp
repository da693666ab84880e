// cache/: the paged cache of one layer (one, two or three streams, each of any pooling: erased
// streams, layer.hpp), its config and accounting, the layer's read-side shape, and the DeepSeek-V4
// cache preset.

#include <cstring>

#include "layer.hpp"

namespace pyphasekv {

using namespace phasekv;

namespace {

// Writers hold the cache's lock exclusively, queries share it; both without the GIL.
template <class F>
decltype(auto) exclusive(layer_cache& c, F&& f) {
  py::gil_scoped_release nogil;
  std::unique_lock<std::shared_mutex> lock(c.lock);
  return c.visit(std::forward<F>(f));
}
template <class F>
decltype(auto) shared(const layer_cache& c, F&& f) {
  py::gil_scoped_release nogil;
  std::shared_lock<std::shared_mutex> lock(c.lock);
  return c.visit(std::forward<F>(f));
}

// policy: one Policy, Pooling or pooling id for every stream, or a list of them, one per stream.
std::unique_ptr<layer_cache> make_cache(const py::object& policy, const geometry& g,
                                        const std::vector<stream_config>& streams, const cache_config& config,
                                        std::vector<stream_params> params) {
  detail::require(streams.size() >= 1 && streams.size() <= 3, "streams.size()", streams.size(),
                  "must be 1 (a K/V layer), 2 (K/V and the indexer's keys, or K and V) or 3 (K, V and the "
                  "indexer's keys)");
  if (params.empty()) params.resize(streams.size());
  detail::require(params.size() == streams.size(), "params.size()", params.size(),
                  "must be 0 or streams.size() = " + std::to_string(streams.size()));
  auto made = std::make_unique<layer_cache>();
  made->policy = policy;
  if (py::isinstance<py::list>(policy) || py::isinstance<py::tuple>(policy)) {
    const auto list = py::reinterpret_borrow<py::sequence>(policy);
    detail::require(list.size() == streams.size(), "len(policy)", list.size(),
                    "must be streams.size() = " + std::to_string(streams.size()) + " (one pooling per stream)");
    for (std::size_t k = 0; k < streams.size(); ++k)
      made->poolings.push_back(pooling_from(list[k], "policy[" + std::to_string(k) + "]"));
  } else {
    made->poolings.assign(streams.size(), pooling_from(policy, "policy"));
  }
  std::vector<erased_stream> s;
  for (std::size_t k = 0; k < streams.size(); ++k)
    s.push_back(make_stream(made->poolings[k], g, streams[k], params[k]));
  using stream = layer_cache::stream;
  if (s.size() == 1) {
    made->cache = std::make_unique<paged_cache<stream>>(layer_compressor<stream>(s[0]), config);
  } else if (s.size() == 2) {
    made->cache = std::make_unique<paged_cache<stream, stream>>(layer_compressor<stream, stream>(s[0], s[1]), config);
  } else {
    made->cache = std::make_unique<paged_cache<stream, stream, stream>>(
        layer_compressor<stream, stream, stream>(s[0], s[1], s[2]), config);
  }
  return made;
}

// chunks[k] for each stream: the layer's fixed-size array, from the Python list.
template <class Cache>
typename Cache::chunks chunk_array(const std::vector<token_chunk>& in) {
  typename Cache::chunks out;
  detail::require<input_error>(in.size() == out.size(), "append: len(chunks)", in.size(),
                               "must be the layer's stream count, " + std::to_string(out.size()) +
                                   " (one payload or (payload, logits) per stream)");
  std::copy(in.begin(), in.end(), out.begin());
  return out;
}

// Entry `j` of a stream is kv_heads × channels floats.
template <class Cache>
std::int64_t entry_floats(const Cache& c, std::size_t stream) {
  const stream_config& s = c.compressors().config(stream);  // throws for a stream that does not exist
  return s.kv_heads * s.channels;
}

}  // namespace

void init_cache(const modules& m) {
  py::module_ root = m.root;
  py::module_ presets = m.presets;

  py::enum_<storage_type>(root, "StorageType", "Element type of the compressed pages.")
      .value("f32", storage_type::f32)
      .value("bf16", storage_type::bf16)
      .value("f16", storage_type::f16)
      .value("fp8_e4m3_block", storage_type::fp8_e4m3_block)
      .value("fp4_e2m1_hadamard", storage_type::fp4_e2m1_hadamard);

  struct_binding<raw_window_config>(root, "RawWindowConfig",
                                    "The raw local window a sequence keeps. Built invalid, it raises ConfigError.")
      .field("tokens", &raw_window_config::tokens, "N_win; 0 keeps no window")
      .field("kv_heads", &raw_window_config::kv_heads)
      .field("key_channels", &raw_window_config::key_channels)
      .field("value_channels", &raw_window_config::value_channels, "0: tied K/V")
      .field("precision", &raw_window_config::precision,
             "f32, or fp8_e4m3_block: rows rounded to DeepSeek-V4's FP8 values on append")
      .field("rope_channels", &raw_window_config::rope_channels,
             "fp8_e4m3_block: the last channels of a key head, kept in bf16 (else 0)")
      .checked_when_built([](const raw_window_config& w) { w.validate(); })
      .done();
  struct_binding<cache_config>(root, "CacheConfig",
                               "A paged cache's pools, history and raw window (cache/paged_cache.hpp). The host "
                               "memory and shared pools of the C++ config are not exposed.")
      .field("name", &cache_config::name)
      .field("page_size", &cache_config::page_size, "entries per page")
      .field("pages", &cache_config::pages, "capacity of each stream's pool")
      .field("storage", &cache_config::storage)
      .field("stream_storage", &cache_config::stream_storage, "per stream, overriding storage (a list)")
      .field("history", &cache_config::history, "tokens remove_suffix may roll back beyond the minimum")
      .field("window", &cache_config::window)
      .checked_when_built([](const cache_config& c) { c.validate(); })
      .done()
      .def("validate", &cache_config::validate);

  py::class_<sequence_memory>(root, "SequenceMemory", "What one sequence occupies.")
      .def_readonly("tokens", &sequence_memory::tokens)
      .def_readonly("entries", &sequence_memory::entries)
      .def_readonly("pages", &sequence_memory::pages)
      .def_readonly("shared_pages", &sequence_memory::shared_pages)
      .def_readonly("page_bytes", &sequence_memory::page_bytes)
      .def_readonly("entry_bytes", &sequence_memory::entry_bytes)
      .def_readonly("state_bytes", &sequence_memory::state_bytes)
      .def_readonly("uncompressed_bytes", &sequence_memory::uncompressed_bytes)
      .def("compression_ratio", &sequence_memory::compression_ratio);

  struct_binding<stream_shape>(root, "StreamShape", "One stream's entries as the reader sees them.")
      .field("name", &stream_shape::name)
      .field("role", &stream_shape::role)
      .field("kv_heads", &stream_shape::kv_heads)
      .field("channels", &stream_shape::channels)
      .field("storage", &stream_shape::storage)
      .field("applies_rope", &stream_shape::applies_rope)
      .field("rope", &stream_shape::rope)
      .done();
  struct_binding<layer_shape>(root, "LayerShape",
                              "What a reader needs to know about a layer (cache/layer_shape.hpp). `streams` is a "
                              "list: assign a whole new list to change it.")
      .field("geometry", &layer_shape::geom)
      .field("streams", &layer_shape::streams)
      .field("window", &layer_shape::window)
      .done();

  py::class_<layer_cache>(root, "PagedCache",
                          "The paged compressed cache of one layer (paged_cache<erased_stream...>): one, two or three "
                          "streams (K/V; K/V and indexer keys, or K and V; K, V and indexer keys). policy: a Policy, "
                          "Pooling or pooling id for every stream, or a list of them, one per stream. Sequences are "
                          "integer ids. Appends and reads release the GIL; writers are serialised against every "
                          "other call on the same cache.")
      .def(py::init(&make_cache), py::arg("policy"), py::arg("geometry"), py::arg("streams"), py::arg("config"),
           py::arg("params") = std::vector<stream_params>{})
      .def_readonly("policy", &layer_cache::policy, "what it was built with: a Policy, Pooling or id, or a list")
      .def_readonly("poolings", &layer_cache::poolings, "the pooling of each stream")
      .def_property_readonly("stream_count",
                             [](const layer_cache& c) { return c.visit([](const auto& x) { return x.stream_count; }); })
      .def_property_readonly(
          "geometry",
          [](const layer_cache& c) { return c.visit([](const auto& x) { return x.compressors().geom(); }); })
      .def_property_readonly("config",
                             [](const layer_cache& c) { return c.visit([](const auto& x) { return x.config(); }); })
      .def(
          "stream_config",
          [](const layer_cache& c, std::size_t k) {
            return c.visit([&](const auto& x) { return x.compressors().config(k); });
          },
          py::arg("stream"))
      .def(
          "shape", [](const layer_cache& c) { return c.visit([](const auto& x) { return x.shape(); }); },
          "The layer's read-side shape (what SparseReader is built from).")
      .def_property_readonly(
          "window_rows", [](const layer_cache& c) { return c.visit([](const auto& x) { return x.window_rows(); }); })
      .def_property_readonly(
          "tied_window", [](const layer_cache& c) { return c.visit([](const auto& x) { return x.tied_window(); }); })

      // ---- sequences
      .def("create", [](layer_cache& c) { return exclusive(c, [](auto& x) { return x.create(); }); })
      .def(
          "append",
          [](layer_cache& c, sequence_id seq, const py::sequence& chunks, const py::object& window_keys,
             const py::object& window_values, bool check_finite) {
            std::vector<py::array> keep;
            std::vector<token_chunk> in;
            const std::vector<token_shape> shapes = c.visit([](const auto& x) { return token_shapes_of(x.compressors()); });
            for (std::size_t k = 0; k < chunks.size(); ++k)
              in.push_back(chunk_from(chunks[k], "chunks[" + std::to_string(k) + "]", keep,
                                      k < shapes.size() ? &shapes[k] : nullptr));
            const span<const float> keys = optional_input<float>(window_keys, "window_keys", keep);
            const span<const float> values = optional_input<float>(window_values, "window_values", keep);
            append_options options;
            options.check_finite = check_finite;
            return exclusive(c, [&](auto& x) {
              using cache = std::decay_t<decltype(x)>;
              return x.append(seq, chunk_array<cache>(in), keys, values, options);
            });
          },
          py::arg("seq"), py::arg("chunks"), py::arg("window_keys") = py::none(), py::arg("window_values") = py::none(),
          py::kw_only(), py::arg("check_finite") = false,
          "Appends the same new tokens to every stream — chunks[k] is stream k's payload, or (payload, logits) "
          "for gated policies, token axis first; payload and logits each float32 or bf16 bits as uint16/int16, "
          "exactly their float32 widening — and to the raw window (window_keys [tokens][kv_heads][key "
          "channels], RoPE'd; window_values likewise, None when tied). Returns the entries emitted per stream.")
      .def(
          "append_batch",
          [](layer_cache& c, const std::vector<sequence_id>& seqs, const py::sequence& chunks,
             const py::object& window_keys, const py::object& window_values, bool check_finite) {
            const std::size_t batch = seqs.size();
            detail::require<input_error>(chunks.size() == batch, "append_batch: len(chunks)", chunks.size(),
                                         "must be len(seqs) = " + std::to_string(batch));
            auto per_item = [&](const py::object& o, const char* name) {
              std::vector<py::object> out(batch, py::none());
              if (o.is_none()) return out;
              const auto list = o.cast<py::sequence>();
              detail::require<input_error>(list.size() == batch, std::string("append_batch: len(") + name + ")",
                                           list.size(), "must be len(seqs) = " + std::to_string(batch));
              for (std::size_t b = 0; b < batch; ++b) out[b] = list[b];
              return out;
            };
            const std::vector<py::object> keys = per_item(window_keys, "window_keys");
            const std::vector<py::object> values = per_item(window_values, "window_values");
            std::vector<py::array> keep;
            const std::vector<token_shape> shapes = c.visit([](const auto& x) { return token_shapes_of(x.compressors()); });
            std::vector<std::vector<token_chunk>> in(batch);
            std::vector<span<const float>> key_rows(batch), value_rows(batch);
            for (std::size_t b = 0; b < batch; ++b) {
              const auto item = chunks[b].cast<py::sequence>();
              for (std::size_t k = 0; k < item.size(); ++k)
                in[b].push_back(chunk_from(item[k], "chunks[" + std::to_string(b) + "][" + std::to_string(k) + "]", keep,
                                           k < shapes.size() ? &shapes[k] : nullptr));
              key_rows[b] = optional_input<float>(keys[b], "window_keys", keep);
              value_rows[b] = optional_input<float>(values[b], "window_values", keep);
            }
            append_options options;
            options.check_finite = check_finite;
            exclusive(c, [&](auto& x) {
              using cache = std::decay_t<decltype(x)>;
              std::vector<typename cache::append_item> items(batch);
              for (std::size_t b = 0; b < batch; ++b)
                items[b] = {seqs[b], chunk_array<cache>(in[b]), key_rows[b], value_rows[b]};
              x.append_batch(span<const typename cache::append_item>(items.data(), items.size()), default_executor(),
                             options);
            });
          },
          py::arg("seqs"), py::arg("chunks"), py::arg("window_keys") = py::none(), py::arg("window_values") = py::none(),
          py::kw_only(), py::arg("check_finite") = false,
          "A decode step: appends to len(seqs) distinct sequences at once — chunks[b] is what append() takes for "
          "seqs[b], window_keys[b] its window rows — all or nothing (a bad item, a full pool: nothing changes), "
          "equal to single appends in order.")
      .def(
          "append_entries",
          [](layer_cache& c, sequence_id seq, std::int64_t tokens, const py::sequence& entries,
             const py::object& window_keys, const py::object& window_values, bool check_finite) {
            std::vector<py::array> keep;
            std::vector<span<const float>> in;
            // The shape to check against (the append checks the sizes again, under its lock).
            const std::int64_t n = shared(c, [&](const auto& x) { return x.entries_after(seq, tokens); });
            for (std::size_t k = 0; k < entries.size(); ++k) {
              const std::string name = "entries[" + std::to_string(k) + "]";
              keep.push_back(as_array(entries[k], name));
              const py::array& a = keep.back();
              const auto shape = c.visit([&](const auto& x) {
                const stream_config& sc = x.compressors().config(std::min(k, x.stream_count - 1));
                return std::pair<std::int64_t, std::int64_t>{sc.kv_heads, sc.channels};
              });
              if (py::isinstance<py::array_t<float>>(a))
                require_shape(a, name, {{"entries", n}, {"kv_heads", shape.first}, {"channels", shape.second}});
              in.push_back(input<float>(a, name));
            }
            const span<const float> keys = optional_input<float>(window_keys, "window_keys", keep);
            const span<const float> values = optional_input<float>(window_values, "window_values", keep);
            append_options options;
            options.check_finite = check_finite;
            return exclusive(c, [&](auto& x) {
              using cache = std::decay_t<decltype(x)>;
              std::array<span<const float>, cache::stream_count> per_stream;
              detail::require<input_error>(in.size() == per_stream.size(), "append_entries: len(entries)", in.size(),
                                           "must be the layer's stream count, " + std::to_string(per_stream.size()));
              std::copy(in.begin(), in.end(), per_stream.begin());
              return x.append_entries(seq, tokens, per_stream, keys, values, options);
            });
          },
          py::arg("seq"), py::arg("tokens"), py::arg("entries"), py::arg("window_keys") = py::none(),
          py::arg("window_values") = py::none(), py::kw_only(), py::arg("check_finite") = false,
          "Appends `tokens` tokens whose entries the host pooled itself: entries[k] is float32 [n][kv_heads]"
          "[channels] for stream k, n = entries_after(seq, tokens), stored in the stream's storage exactly as "
          "the write path stores its own (FP8/FP4 quantized); the window rows as append(). The compressor "
          "continues such a sequence (append) only where no entry pools a skipped token. Returns n.")
      .def(
          "entries_after",
          [](const layer_cache& c, sequence_id seq, std::int64_t tokens) {
            return shared(c, [&](const auto& x) { return x.entries_after(seq, tokens); });
          },
          py::arg("seq"), py::arg("tokens"), "Entries an append of `tokens` more tokens completes (every stream).")
      .def(
          "entry_bytes",
          [](const layer_cache& c, sequence_id seq, std::size_t stream, std::int64_t entry) {
            std::vector<std::uint8_t> bytes;
            shared(c, [&](const auto& x) {
              const span<const std::byte> b = x.entry_bytes(seq, stream, entry);
              bytes.resize(b.size());
              std::memcpy(bytes.data(), b.data(), b.size());
            });
            const auto n = static_cast<py::ssize_t>(bytes.size());
            return adopt(std::move(bytes), {n});
          },
          py::arg("seq"), py::arg("stream"), py::arg("entry"),
          "The stored bytes of entry j of a stream (a copy, uint8): FP8 heads, FP4 blocks, 16-bit or fp32 values.")
      .def(
          "fork", [](layer_cache& c, sequence_id seq) { return exclusive(c, [&](auto& x) { return x.fork(seq); }); },
          py::arg("seq"), "A new sequence sharing every page of seq.")
      .def(
          "copy",
          [](layer_cache& c, sequence_id source, sequence_id destination) {
            exclusive(c, [&](auto& x) { x.copy(source, destination); });
          },
          py::arg("source"), py::arg("destination"), "Makes destination a fork of source (llama.cpp's seq_cp).")
      .def(
          "remove_suffix",
          [](layer_cache& c, sequence_id seq, std::int64_t p0) {
            exclusive(c, [&](auto& x) { x.remove_suffix(seq, p0); });
          },
          py::arg("seq"), py::arg("p0"), "Forgets tokens [p0, end) (seq_rm(seq, p0, -1)).")
      .def(
          "can_remove_suffix",
          [](const layer_cache& c, sequence_id seq, std::int64_t p0) {
            return shared(c, [&](const auto& x) { return x.can_remove_suffix(seq, p0); });
          },
          py::arg("seq"), py::arg("p0"))
      .def(
          "keep", [](layer_cache& c, sequence_id seq) { exclusive(c, [&](auto& x) { x.keep(seq); }); }, py::arg("seq"),
          "Drops every sequence but seq (seq_keep).")
      .def(
          "free", [](layer_cache& c, sequence_id seq) { exclusive(c, [&](auto& x) { x.free(seq); }); }, py::arg("seq"))
      .def("clear", [](layer_cache& c) { exclusive(c, [](auto& x) { x.clear(); }); })

      // ---- queries
      .def(
          "contains",
          [](const layer_cache& c, sequence_id seq) {
            return shared(c, [&](const auto& x) { return x.contains(seq); });
          },
          py::arg("seq"))
      .def("__contains__", [](const layer_cache& c,
                              sequence_id seq) { return shared(c, [&](const auto& x) { return x.contains(seq); }); })
      .def_property_readonly(
          "sequences", [](const layer_cache& c) { return shared(c, [](const auto& x) { return x.sequences(); }); })
      .def("live_sequences",
           [](const layer_cache& c) { return shared(c, [](const auto& x) { return x.live_sequences(); }); })
      .def(
          "tokens",
          [](const layer_cache& c, sequence_id seq) { return shared(c, [&](const auto& x) { return x.tokens(seq); }); },
          py::arg("seq"))
      .def(
          "entries",
          [](const layer_cache& c, sequence_id seq, std::size_t stream) {
            return shared(c, [&](const auto& x) { return x.entries(seq, stream); });
          },
          py::arg("seq"), py::arg("stream") = 0)
      .def(
          "page_table",
          [](const layer_cache& c, sequence_id seq, std::size_t stream) {
            return copy_of(shared(c, [&](const auto& x) { return x.page_table(seq, stream); }));
          },
          py::arg("seq"), py::arg("stream") = 0, "The sequence's page ids (int32, a copy).")
      .def(
          "read_entry",
          [](const layer_cache& c, sequence_id seq, std::size_t stream, std::int64_t entry, py::object out) {
            const auto shape = c.visit([&](const auto& x) {
              const stream_config& s = x.compressors().config(stream);
              return std::vector<py::ssize_t>{s.kv_heads, s.channels};
            });
            float* to = output<float>(out, "out", shape, "kv_heads × channels",
                                      {{"kv_heads", shape[0]}, {"channels", shape[1]}});
            shared(c, [&](const auto& x) { x.read_entry(seq, stream, entry, to); });
            return out;
          },
          py::arg("seq"), py::arg("stream"), py::arg("entry"), py::kw_only(), py::arg("out") = py::none(),
          "Entry j of a stream converted to float32: [kv_heads][channels].")
      .def(
          "read_entries",
          [](const layer_cache& c, sequence_id seq, std::size_t stream) {
            std::vector<float> all;
            std::int64_t n = 0, floats = 0;
            std::vector<py::ssize_t> shape;
            shared(c, [&](const auto& x) {
              const stream_config& s = x.compressors().config(stream);
              n = x.entries(seq, stream);
              floats = entry_floats(x, stream);
              shape = {n, s.kv_heads, s.channels};
              all.resize(static_cast<std::size_t>(n * floats));
              for (std::int64_t j = 0; j < n; ++j) x.read_entry(seq, stream, j, all.data() + j * floats);
            });
            return adopt(std::move(all), shape);
          },
          py::arg("seq"), py::arg("stream") = 0, "Every entry of a stream, float32 [entries][kv_heads][channels].")
      .def(
          "window_first",
          [](const layer_cache& c, sequence_id seq) {
            return shared(c, [&](const auto& x) { return x.window_first(seq); });
          },
          py::arg("seq"), "Tokens whose raw window rows are held: [window_first, tokens).")
      .def(
          "window_key",
          [](const layer_cache& c, sequence_id seq, std::int64_t t) {
            const raw_window_config w = c.visit([](const auto& x) { return x.config().window; });
            std::vector<float> row(static_cast<std::size_t>(w.kv_heads * w.key_channels));
            shared(c, [&](const auto& x) { x.copy_window_key(seq, t, span<float>(row.data(), row.size())); });
            return adopt(std::move(row), {w.kv_heads, w.key_channels});
          },
          py::arg("seq"), py::arg("t"),
          "Token t's raw window key row (a copy: an FP8 window's row dequantized, the values a read sees).")
      .def(
          "window_value",
          [](const layer_cache& c, sequence_id seq, std::int64_t t) {
            const raw_window_config w = c.visit([](const auto& x) { return x.config().window; });
            const std::int64_t channels = w.value_channels == 0 ? w.key_channels : w.value_channels;
            std::vector<float> row(static_cast<std::size_t>(w.kv_heads * channels));
            shared(c, [&](const auto& x) { x.copy_window_value(seq, t, span<float>(row.data(), row.size())); });
            return adopt(std::move(row), {w.kv_heads, channels});
          },
          py::arg("seq"), py::arg("t"), "Token t's raw window value row (its key when tied; a copy).")
      .def(
          "window_key_bytes",
          [](const layer_cache& c, sequence_id seq, std::int64_t t) {
            const raw_window_config w = c.visit([](const auto& x) { return x.config().window; });
            const std::int64_t head = fp8_head_layout::of(w.key_channels, w.rope_channels).bytes;
            std::vector<std::uint8_t> row(static_cast<std::size_t>(w.kv_heads * head));
            shared(c, [&](const auto& x) {
              const std::byte* from = x.window_key_bytes(seq, t);
              std::memcpy(row.data(), from, row.size());
            });
            return adopt(std::move(row), {w.kv_heads, head});
          },
          py::arg("seq"), py::arg("t"),
          "Token t's raw window key row as an FP8 window stores it (window.precision fp8_e4m3_block): "
          "uint8 [kv_heads][head bytes], 584 per head for DeepSeek-V4 (e4m3fn codes, bf16 RoPE channels, "
          "UE8M0 scales, padding; docs/DESIGN.md section 9). A copy.")
      .def(
          "memory",
          [](const layer_cache& c, sequence_id seq) { return shared(c, [&](const auto& x) { return x.memory(seq); }); },
          py::arg("seq"))
      .def(
          "pages_held",
          [](const layer_cache& c, std::size_t stream) {
            return shared(c, [&](const auto& x) { return x.pages_held(stream); });
          },
          py::arg("stream"))
      .def(
          "pool_usage",
          [](const layer_cache& c, std::size_t stream) {
            std::map<std::string, std::int64_t> usage;
            shared(c, [&](const auto& x) {
              const page_pool& p = x.pool(stream);
              usage = {{"capacity", p.capacity()},
                       {"used_pages", p.used_pages()},
                       {"free_pages", p.free_pages()},
                       {"bytes_per_page", p.bytes_per_page()},
                       {"bytes_used", p.bytes_used()},
                       {"pages_touched", p.pages_touched()},
                       {"bytes_reserved", p.bytes_reserved()}};
            });
            return usage;
          },
          py::arg("stream"), "A stream's page pool accounting (capacity, used_pages, ... bytes_reserved).");

  presets.def(
      "deepseek_cache",
      [](int compress_ratio, std::int64_t pages, std::int64_t history, bool precision) {
        return presets::deepseek_cache(presets::deepseek_layer_of(compress_ratio, "deepseek_cache(compress_ratio)"),
                                       pages, history, precision);
      },
      py::arg("compress_ratio"), py::arg("pages"), py::arg("history") = 0, py::arg("precision") = false,
      "The cache of the layer of a compress ratio (4 CSA, 128 HCA, 2 V4.1's CSA): 64 entries a page, a 128-token "
      "tied 512-channel window; stream 0 K/V, a CSA layer's stream 1 its indexer keys. fp32 entries, or with "
      "precision DeepSeek-V4's: K/V in FP8 (fp8_e4m3_block), indexer keys in deepseek_v4_indexer_storage(); read "
      "with deepseek_reader(compress_ratio, precision).");
  presets.def("deepseek_v4_indexer_storage", &presets::deepseek_v4_indexer_storage,
              "how the precision caches store indexer keys: fp4_e2m1_hadamard (68 bytes per 128-channel key)");
  presets.def("deepseek_window", &presets::deepseek_window, py::arg("precision") = false,
              "The raw window: 128 tokens of tied 512-channel K/V; with precision FP8 values, the 64 RoPE "
              "channels in bf16.");
}

}  // namespace pyphasekv
