// Arrays from any object: NumPy arrays as they are, DLPack producers (torch, JAX, CuPy's host
// arrays, NumPy itself) through their __dlpack__ capsule, anything else through NumPy's buffer
// protocol. A DLPack import is a view: the returned NumPy array points at the producer's memory
// and keeps the producer's tensor alive (through the capsule) for as long as it lives.

#include "common.hpp"

namespace pyphasekv {

namespace {

// The DLPack ABI (data-apis.org/array-api, DLPack 0.x): what a "dltensor" capsule holds.
struct dl_device {
  std::int32_t device_type;  // 1 = CPU
  std::int32_t device_id;
};
struct dl_data_type {
  std::uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct dl_tensor {
  void* data;
  dl_device device;
  std::int32_t ndim;
  dl_data_type dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; null = C-contiguous
  std::uint64_t byte_offset;
};
struct dl_managed_tensor {
  dl_tensor tensor;
  void* manager_ctx;
  void (*deleter)(dl_managed_tensor*);
};

constexpr std::uint8_t dl_int = 0, dl_uint = 1, dl_float = 2, dl_bfloat = 4, dl_bool = 6;

std::string dl_dtype_name(const dl_data_type& t) {
  const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  return (t.code < 7 ? std::string(kinds[t.code]) : "code " + std::to_string(t.code)) + std::to_string(t.bits) +
         (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

// The NumPy dtype a DLPack element type maps to (bf16 as its uint16 bits), or none.
py::object numpy_dtype(const dl_data_type& t) {
  if (t.lanes != 1) return py::none();
  const int b = t.bits;
  switch (t.code) {
    case dl_float:
      if (b == 32) return py::dtype::of<float>();
      if (b == 64) return py::dtype::of<double>();
      if (b == 16) return py::dtype("float16");
      break;
    case dl_bfloat:
      if (b == 16) return py::dtype::of<std::uint16_t>();
      break;
    case dl_int:
      if (b == 8 || b == 16 || b == 32 || b == 64) return py::dtype("int" + std::to_string(b));
      break;
    case dl_uint:
      if (b == 8 || b == 16 || b == 32 || b == 64) return py::dtype("uint" + std::to_string(b));
      break;
    case dl_bool:
      if (b == 8) return py::dtype::of<bool>();
      break;
    default:
      break;
  }
  return py::none();
}

// A torch tensor's problems named before export, with the fix torch users know.
void check_torch(const py::object& o, const std::string& name) {
  if (!py::hasattr(o, "requires_grad") || !py::hasattr(o, "is_contiguous")) return;
  if (o.attr("requires_grad").cast<bool>())
    throw py::type_error(name + ": a tensor that requires grad (phasekv reads it as data and tracks no "
                                "gradients: pass x.detach())");
  if (!o.attr("is_contiguous")().cast<bool>())
    throw py::value_error(name + ": a non-contiguous tensor of shape " +
                          py::str(py::module_::import("builtins").attr("tuple")(o.attr("shape"))).cast<std::string>() +
                          " (phasekv reads it in place: pass x.contiguous())");
}

py::array import_dlpack(const py::object& o, const std::string& name, bool bf16_ok) {
  check_torch(o, name);
  if (py::hasattr(o, "__dlpack_device__")) {
    const auto device = o.attr("__dlpack_device__")().cast<std::pair<int, int>>();
    if (device.first != 1)
      throw py::value_error(name + ": on DLPack device (" + std::to_string(device.first) + ", " +
                            std::to_string(device.second) +
                            "), not the CPU (phasekv reads host memory: pass x.cpu())");
  }
  py::object capsule = o.attr("__dlpack__")();
  PyObject* raw = capsule.ptr();
  if (!PyCapsule_IsValid(raw, "dltensor"))
    throw py::type_error(name + ": __dlpack__ did not return an unused DLPack capsule");
  auto* managed = static_cast<dl_managed_tensor*>(PyCapsule_GetPointer(raw, "dltensor"));
  // The tensor is ours from here: rename the capsule so its destructor leaves it alone, and hand
  // it to an owner whose destructor calls the producer's deleter.
  PyCapsule_SetName(raw, "used_dltensor");
  py::capsule owner(managed, [](void* p) {
    auto* m = static_cast<dl_managed_tensor*>(p);
    if (m->deleter) m->deleter(m);
  });
  const dl_tensor& t = managed->tensor;
  if (t.device.device_type != 1)
    throw py::value_error(name + ": on DLPack device type " + std::to_string(t.device.device_type) +
                          ", not the CPU (phasekv reads host memory: pass x.cpu())");
  const py::object dtype = numpy_dtype(t.dtype);
  if (dtype.is_none())
    throw py::type_error(name + ".dtype = " + dl_dtype_name(t.dtype) + ": not an element type phasekv reads");
  if (t.dtype.code == dl_bfloat && !bf16_ok)
    throw py::type_error(name + ".dtype = bfloat16: must be float32 here (pass x.float())");
  const py::ssize_t item = t.dtype.bits / 8;
  // A producer's header is not trusted further than NumPy's own arrays: a negative rank or extent,
  // or a null data pointer over elements, is refused — NumPy given a null pointer would allocate a
  // fresh array and phasekv would read (or write) memory the producer never sees.
  if (t.ndim < 0 || t.ndim > 32 || (t.ndim > 0 && t.shape == nullptr))
    throw py::value_error(name + ": a DLPack tensor of rank " + std::to_string(t.ndim) +
                          (t.ndim > 0 && t.shape == nullptr ? " without a shape" : "") + " (the producer's header is malformed)");
  std::int64_t elements = 1;
  for (std::int32_t d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0)
      throw py::value_error(name + ": DLPack shape[" + std::to_string(d) + "] = " + std::to_string(t.shape[d]) +
                            ": must be non-negative (the producer's header is malformed)");
    elements = t.shape[d] == 0 ? 0 : elements;
  }
  if (t.data == nullptr && elements != 0)
    throw py::value_error(name + ": a DLPack tensor with a null data pointer and elements "
                          "(the producer's header is malformed)");
  std::vector<py::ssize_t> shape(t.shape, t.shape + t.ndim), strides(static_cast<std::size_t>(t.ndim));
  for (std::int32_t d = t.ndim - 1; d >= 0; --d) {
    const auto k = static_cast<std::size_t>(d);
    strides[k] = t.strides ? static_cast<py::ssize_t>(t.strides[d]) * item
                           : (k + 1 < shape.size() ? strides[k + 1] * shape[k + 1] : item);
  }
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  return py::array(py::reinterpret_borrow<py::dtype>(dtype), std::move(shape), std::move(strides), data, owner);
}

}  // namespace

py::array as_array(const py::object& o, const std::string& name, bool bf16_ok) {
  if (py::isinstance<py::array>(o)) return py::reinterpret_borrow<py::array>(o);
  if (py::hasattr(o, "__dlpack__")) return import_dlpack(o, name, bf16_ok);
  // Only what NumPy can view (a buffer or an array interface); NumPy would also make arrays of
  // a str or a list, copies that are never what a caller meant.
  const bool viewable =
      PyObject_CheckBuffer(o.ptr()) || py::hasattr(o, "__array_interface__") || py::hasattr(o, "__array__");
  py::array a = viewable ? py::array::ensure(o) : py::array(py::reinterpret_steal<py::array>(py::handle()));
  if (!a) {
    PyErr_Clear();
    throw py::type_error(name + ": " + py::str(o.get_type().attr("__name__")).cast<std::string>() +
                         " is not an array (pass a NumPy array, or a tensor with __dlpack__)");
  }
  return a;
}

}  // namespace pyphasekv
