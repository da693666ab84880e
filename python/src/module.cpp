// The module `phasekv._phasekv`: the exception types, the submodules, and every area's bindings
// (one .cpp each: core, compress, cache, read, model, diag, sweep, probe, testing).

#include <phasekv/version.hpp>

#include "common.hpp"

namespace {

// phasekv's exceptions as Python classes with the C++ hierarchy: Error (a RuntimeError, as
// phasekv::error is a std::runtime_error) and under it InputError, ConfigError and CapacityError.
// InputError and ConfigError are also ValueErrors — they are what Python code expects for a bad
// argument or setting — so `except ValueError` catches them too. The message is the C++ what(),
// unchanged: it names the field and its value.
PyObject* new_exception(pybind11::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("phasekv.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (!type) throw pybind11::error_already_set();
  m.add_object(name, pybind11::handle(type));  // the module holds a reference for its lifetime
  return type;
}

}  // namespace

// The benchmark builds the same sources as another module with a timing hook (bench/python).
#ifndef PHASEKV_PYTHON_MODULE
#define PHASEKV_PYTHON_MODULE _phasekv
#endif

PYBIND11_MODULE(PHASEKV_PYTHON_MODULE, m) {
  namespace py = pybind11;
  m.doc() = "phasekv: chunked KV-cache compression with per-phase diagnostics (C++ core).";
  m.attr("__version__") = PHASEKV_VERSION_STRING;
  m.attr("version") = PHASEKV_VERSION;

  static PyObject* error = new_exception(m, "Error", PyExc_RuntimeError, "Any error phasekv reports.");
  const py::tuple input_bases = py::make_tuple(py::handle(error), py::handle(PyExc_ValueError));
  static PyObject* input_error =
      new_exception(m, "InputError", input_bases.ptr(), "A call whose arguments do not fit the configuration.");
  const py::tuple config_bases = py::make_tuple(py::handle(error), py::handle(PyExc_ValueError));
  static PyObject* config_error =
      new_exception(m, "ConfigError", config_bases.ptr(), "A configuration that cannot describe a valid object.");
  static PyObject* capacity_error =
      new_exception(m, "CapacityError", error, "A resource ran out (a page pool is full).");
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const phasekv::input_error& e) {
      PyErr_SetString(input_error, e.what());
    } catch (const phasekv::config_error& e) {
      PyErr_SetString(config_error, e.what());
    } catch (const phasekv::capacity_error& e) {
      PyErr_SetString(capacity_error, e.what());
    } catch (const phasekv::error& e) {
      PyErr_SetString(error, e.what());
    }
  });

  const pyphasekv::modules modules{
      m,
      m.def_submodule("presets", "Configurations of published models (DeepSeek-V4, NSA): phasekv::presets."),
      m.def_submodule("stats", "The statistics of a phase sweep: phasekv::diag::stats."),
      m.def_submodule("plot", "A dependency-free SVG line plot: phasekv::diag::plot."),
      m.def_submodule("probe", "The synthetic needle-in-a-haystack probe: phasekv::diag::probe."),
      m.def_submodule("testing", "The conformance kit: phasekv::testing (include/phasekv/testing/conformance.hpp)."),
  };
  pyphasekv::init_core(modules);
  pyphasekv::init_compress(modules);
  pyphasekv::init_cache(modules);
  pyphasekv::init_read(modules);
  pyphasekv::init_model(modules);
  pyphasekv::init_diag(modules);
  pyphasekv::init_sweep(modules);
  pyphasekv::init_probe(modules);
  pyphasekv::init_testing(modules);
#ifdef PHASEKV_PYTHON_BENCH
  pyphasekv::init_bench(modules);
#endif
}
