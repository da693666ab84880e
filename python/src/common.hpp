#pragma once
// What the binding's translation units share: how arrays cross the boundary, the entries the
// write path hands to diagnostics, and a helper that binds plain config structs. It includes no
// engine header (layer.hpp does), so the diagnostics and core files compile quickly.
//
// Arrays. Large inputs are read in place: an argument must already be a float32 (int64 for
// indices; bf16 where documented), C-contiguous, aligned array on the host — a NumPy array, any
// DLPack producer (a CPU torch tensor, bf16 included) or a buffer (a memoryview). Nothing is
// converted: a float64 array is a TypeError and a strided view a ValueError, each naming the
// argument and the fix (x.astype, np.ascontiguousarray or x.contiguous(), x.detach()), so a
// hidden copy can never cost a read its time. Outputs are written into arrays or tensors the
// caller passes (out=, returned as given) or into NumPy arrays the binding allocates (which
// export __dlpack__: torch.from_dlpack(result) is a view).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <phasekv/compress/entry_view.hpp>
#include <phasekv/core/error.hpp>
#include <phasekv/core/detail/limits.hpp>
#include <phasekv/core/span.hpp>
#include <string>
#include <utility>
#include <vector>

namespace pyphasekv {

namespace py = pybind11;
using phasekv::span;

// ---- arrays ------------------------------------------------------------------------------------

inline std::string describe_array(const py::array& a) {
  return "array of dtype " + py::str(a.dtype()).cast<std::string>() + ", shape " +
         py::str(py::tuple(a.attr("shape"))).cast<std::string>();
}

// T-typed, C-contiguous and aligned, or TypeError / ValueError naming the argument.
template <class T>
void require_layout(const py::array& a, const std::string& name) {
  if (!py::isinstance<py::array_t<T>>(a))  // dtype equivalence only, any strides
    throw py::type_error(name + ".dtype = " + py::str(a.dtype()).cast<std::string>() + ": must be " +
                         py::str(py::dtype::of<T>()).cast<std::string>() +
                         " (phasekv reads arrays in place and never converts them: pass x.astype(...))");
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(name + " = " + describe_array(a) +
                          ": must be C-contiguous (phasekv reads it in place: pass np.ascontiguousarray(x))");
  if (!(a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_))
    throw py::value_error(name + " = " + describe_array(a) + ": must be aligned to its element size");
}

// One axis of a documented shape: its name and size.
struct axis {
  const char* name;
  std::int64_t size;
};

// The array has exactly these axes (ndim and each size), else InputError in shape terms, e.g.
// "queries: shape (512, 64), expected (query_heads=64, channels=512)": a transposed or flattened
// array would otherwise be read as the right number of floats in the wrong order.
inline void require_shape(const py::array& a, const std::string& name, const std::vector<axis>& axes) {
  bool same = a.ndim() == static_cast<py::ssize_t>(axes.size());
  std::string expected = "(";
  std::size_t i = 0;
  for (const axis& x : axes) {
    if (same && a.shape(static_cast<py::ssize_t>(i)) != x.size) same = false;
    expected += (i++ ? ", " : "") + std::string(x.name) + "=" + std::to_string(x.size);
  }
  expected += axes.size() == 1 ? ",)" : ")";
  if (same) return;
  std::string shape = "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) shape += (d ? ", " : "") + std::to_string(a.shape(d));
  shape += a.ndim() == 1 ? ",)" : ")";
  throw phasekv::input_error(name + ": shape " + shape + ", expected " + expected);
}

// The object as a NumPy array viewing its memory (dlpack.cpp): an array as it is, a DLPack
// producer through its capsule (a bf16 tensor as its uint16 bits where bf16_ok, else a TypeError;
// one that requires grad, is not contiguous or not on the CPU an error naming the fix), anything
// else through the buffer protocol; a non-array a TypeError naming the argument.
py::array as_array(const py::object& o, const std::string& name, bool bf16_ok = false);

// The array's memory as a span (no copy). The array must outlive the span: callers keep the
// py::array (an argument, or an element of `keep`).
template <class T = float>
span<const T> input(const py::array& a, const std::string& name) {
  require_layout<T>(a, name);
  return span<const T>(static_cast<const T*>(a.data()), static_cast<std::size_t>(a.size()));
}

// An optional input: None is an empty span. A non-array object (a torch tensor) is viewed
// through NumPy; the view is kept in `keep` so its memory stays valid.
template <class T = float>
span<const T> optional_input(const py::object& o, const std::string& name, std::vector<py::array>& keep) {
  if (o.is_none()) return {};
  keep.push_back(as_array(o, name));
  return input<T>(keep.back(), name);
}

// Memory the call writes `size` elements into: the caller's array or tensor (checked: layout,
// writable, the documented axes when given, exactly `size` elements, else an error naming it;
// `o` stays the caller's object, which the call returns) or a new array of `shape`.
template <class T>
T* output(py::object& o, const std::string& name, const std::vector<py::ssize_t>& shape, const std::string& what,
          const std::vector<axis>& axes = {}) {
  py::ssize_t size = 1;
  for (py::ssize_t d : shape) size *= d;
  if (o.is_none()) {
    o = py::array_t<T>(shape);
    return static_cast<T*>(py::array(o).mutable_data());
  }
  py::array a = as_array(o, name);
  require_layout<T>(a, name);
  if (!a.writeable()) throw py::value_error(name + ": is read-only");
  if (axes.size() != 0) require_shape(a, name, axes);
  if (a.size() != size)
    phasekv::detail::fail<phasekv::input_error>(name + ".size", a.size(),
                                                "must be " + std::to_string(size) + " (" + what + ")");
  // The memory stays valid after `a` (a view) is gone: the caller's object owns it.
  return static_cast<T*>(a.mutable_data());
}

// Host indices: None, or int32 entry ids (−1 padding) of `batch` rows (read: batch = −1, one row)
// of at most the reader's top_k each.
struct index_rows {
  const std::int32_t* data = nullptr;
  std::size_t per_item = 0;
  span<const std::int32_t> item(std::size_t b) const {
    return data ? span<const std::int32_t>(data + b * per_item, per_item) : span<const std::int32_t>();
  }
};
inline index_rows indices_of(py::object& o, std::int64_t batch, std::vector<py::array>& keep) {
  if (o.is_none()) return {};
  py::array a = as_array(o, "indices");
  o = a;
  keep.push_back(a);
  const span<const std::int32_t> all = input<std::int32_t>(a, "indices");
  const py::ssize_t rows = batch < 0 ? 1 : batch;
  if (a.ndim() != (batch < 0 ? 1 : 2) || (batch >= 0 && a.shape(0) != rows))
    phasekv::detail::fail<phasekv::input_error>("indices.shape", describe_array(a),
                              batch < 0 ? "must be (n,): entry ids, −1 padded" : "must be (len(seqs), n): entry ids, −1 padded");
  return {all.data(), rows == 0 ? 0 : all.size() / static_cast<std::size_t>(rows)};
}

// selected_logical / selected_physical of a batched read: None or False (not written), True (a new
// int32 array, −1 filled), or the caller's int32 array of batch × top_k (slots past an item's own
// top_k are left as they are). `rows` names the batch axis in messages ("len(seqs)").
inline std::int32_t* selection_output(py::object& o, const char* name, std::size_t batch, std::int64_t top_k,
                                      const char* rows) {
  if (o.is_none() || (py::isinstance<py::bool_>(o) && !o.cast<bool>())) {
    o = py::none();
    return nullptr;
  }
  const bool allocate = py::isinstance<py::bool_>(o);
  if (allocate) o = py::none();
  std::int32_t* to =
      output<std::int32_t>(o, name, {static_cast<py::ssize_t>(batch), top_k}, std::string(rows) + " × reader top_k");
  if (allocate) std::fill_n(to, batch * static_cast<std::size_t>(top_k), -1);
  return to;
}

// A vector's memory handed to NumPy without a copy: the array owns the vector.
template <class T>
py::array_t<T> adopt(std::vector<T>&& values, std::vector<py::ssize_t> shape) {
  auto owned = std::make_unique<std::vector<T>>(std::move(values));
  T* data = owned->data();
  py::capsule free_when_done(owned.get(), [](void* p) { delete static_cast<std::vector<T>*>(p); });
  owned.release();  // the capsule owns it now
  return py::array_t<T>(std::move(shape), data, free_when_done);
}

// A small result copied into a new array (traces, profiles: a few KiB at most).
template <class T>
py::array_t<T> copy_of(const std::vector<T>& values) {
  py::array_t<T> a(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), a.mutable_data());
  return a;
}

// One stream's new tokens from Python: `payload` [tokens][...] and `logits` [tokens][...] (None
// without gates); tokens = payload.shape[0]. `chunk` is either a payload array or a
// (payload, logits) pair. The arrays (or NumPy views of tensors) are appended to `keep`.
// `shape` (when given) is the stream's per-token shape: a payload is then (tokens, kv_heads, views,
// channels) or (tokens, kv_heads·views·channels), its logits likewise with gate channels, and any
// other shape an InputError naming the axes.
struct token_shape {
  std::int64_t kv_heads = 0, views = 0, channels = 0, gate_channels = 0;
};
phasekv::token_chunk chunk_of(const py::object& payload, const py::object& logits, const std::string& name,
                              std::vector<py::array>& keep, const token_shape* shape = nullptr);
phasekv::token_chunk chunk_from(const py::handle& chunk, const std::string& name, std::vector<py::array>& keep,
                                const token_shape* shape = nullptr);

// A stream compressor's token_shape.
template <class Compressor>
token_shape token_shape_of(const Compressor& c) {
  return {c.config().kv_heads, c.views(), c.config().channels, c.gate_channels()};
}

// Every stream's token_shape of a layer_compressor.
template <class Layer, std::size_t... K>
std::vector<token_shape> token_shapes_of(const Layer& layer, std::index_sequence<K...>) {
  return {token_shape_of(layer.template stream<K>())...};
}
template <class Layer>
std::vector<token_shape> token_shapes_of(const Layer& layer) {
  return token_shapes_of(layer, std::make_index_sequence<Layer::stream_count>{});
}

// The entries one append emitted, as arrays (Python's Entries); also built by hand from a
// host's own arrays to feed the write profile or the slot-weight log.
struct entries {
  py::array_t<std::int64_t> index;   // [n]
  py::array_t<std::int64_t> anchor;  // [n]
  py::object values;                 // float32 [n][kv_heads][channels], or None
  py::object slot_weights;           // float32 [n][kv_heads][window], or None

  // entry_view k, pointing into the arrays (valid while they are).
  phasekv::entry_view view(std::size_t k) const;
  std::size_t size() const { return static_cast<std::size_t>(index.size()); }
};

// ---- config structs ----------------------------------------------------------------------------

// Binds a plain struct: each field read/write by name, a keyword constructor in which every
// field is optional (the C++ default otherwise, unknown names a TypeError), a __repr__ that
// lists the fields, and copy.copy / copy.deepcopy. Nested structs come back by reference, so
// `config.rope.channels = 64` changes the config.
template <class T>
class struct_binding {
 public:
  struct_binding(py::handle scope, const char* name, const char* doc)
      : cls_(scope, name, doc), names_(std::make_shared<std::vector<std::string>>()) {}

  template <class M>
  struct_binding& field(const char* name, M T::*member, const char* doc = "") {
    cls_.def_readwrite(name, member, doc);
    names_->push_back(name);
    return *this;
  }
  template <class Get, class Set>
  struct_binding& property(const char* name, Get&& get, Set&& set, const char* doc = "") {
    cls_.def_property(name, std::forward<Get>(get), std::forward<Set>(set), doc);
    names_->push_back(name);
    return *this;
  }

  // A check the keyword constructor runs once every field given is set: an object built invalid is
  // refused when it is built (ConfigError naming the field), not when it is first used. Built with
  // no fields it is a blank to fill in (some blanks, e.g. StreamConfig's 0 channels, are not yet
  // valid) and is checked where it is used.
  struct_binding& checked_when_built(std::function<void(const T&)> check) {
    check_ = std::move(check);
    return *this;
  }

  py::class_<T>& done() {
    auto names = names_;
    auto check = check_;
    // help() shows the fields as keyword-only parameters with their defaults, not **kwargs.
    py::options plain;
    plain.disable_function_signatures();
    cls_.def(py::init([names, check](const py::kwargs& fields) {
      auto made = std::make_unique<T>();
      py::object target = py::cast(made.get(), py::return_value_policy::reference);
      for (const auto& [key, value] : fields) {
        const auto name = key.template cast<std::string>();
        if (std::find(names->begin(), names->end(), name) == names->end())
          throw py::type_error(py::str(target.get_type().attr("__name__")).cast<std::string>() +
                               "() got an unexpected keyword argument '" + name + "'");
        py::setattr(target, key, value);
      }
      if (check && !fields.empty()) check(*made);
      return made;
    }),
             signature().c_str());
    cls_.def("__repr__", [names](const py::object& self) {
      std::string out = py::str(self.get_type().attr("__name__")).cast<std::string>() + "(";
      for (std::size_t i = 0; i < names->size(); ++i) {
        const py::object value = self.attr((*names)[i].c_str());
        const bool is_enum = py::hasattr(py::type::of(value), "__members__");  // StorageType.f32, not <…: 0>
        out += (i ? ", " : "") + (*names)[i] + "=" + (is_enum ? py::str(value) : py::repr(value)).cast<std::string>();
      }
      return out + ")";
    });
    cls_.def("__copy__", [](const T& self) { return T(self); });
    cls_.def(
        "__deepcopy__", [](const T& self, const py::dict&) { return T(self); }, py::arg("memo"));
    return cls_;
  }

 private:
  // "__init__(self, *, stride: int = 4, …) -> None": each field's type and default, read from a
  // default-constructed T (a field whose type is not bound yet shows its name alone).
  std::string signature() const {
    std::string out = "__init__(self, *";
    py::object made;
    try {
      made = py::cast(T());
    } catch (const std::exception&) {
      PyErr_Clear();
    }
    for (const std::string& name : *names_) {
      out += ", " + name;
      if (!made) continue;
      try {
        const py::object value = made.attr(name.c_str());
        if (value.is_none()) {  // an optional field, unset
          out += " = None";
          continue;
        }
        const py::object type = py::type::of(value);
        const bool is_enum = py::hasattr(type, "__members__");
        out += ": " + py::str(type.attr("__name__")).cast<std::string>() + " = " +
               (is_enum ? py::str(type.attr("__name__")).cast<std::string>() + "." +
                              py::str(value.attr("name")).cast<std::string>()
                        : py::repr(value).cast<std::string>());
      } catch (const std::exception&) {
        PyErr_Clear();
      }
    }
    return out + ") -> None\n\nEvery field is optional (its default above); an unknown name is a TypeError.";
  }

  py::class_<T> cls_;
  std::shared_ptr<std::vector<std::string>> names_;
  std::function<void(const T&)> check_;
};

// ---- one initialiser per area (each in its own .cpp) -------------------------------------------

struct modules {
  py::module_ root, presets, stats, plot, probe, testing;
};
void init_core(const modules& m);
void init_compress(const modules& m);
void init_cache(const modules& m);
void init_read(const modules& m);
void init_diag(const modules& m);
void init_sweep(const modules& m);
void init_probe(const modules& m);
void init_testing(const modules& m);
void init_model(const modules& m);
void init_bench(const modules& m);  // only in the benchmark's build of the module (bench/python)

}  // namespace pyphasekv
