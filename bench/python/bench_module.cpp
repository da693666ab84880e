// _phasekv_bench: the C++ side of bench/python/bench_read.py. It times the very read the Python
// binding makes — the same reader, cache, sequence, inputs and output memory, in the same process
// — the way a C++ host calls it: reader.read(cache, seq, request, out), no GIL, no locks, no
// argument conversion. The Python objects are _phasekv's (pybind11 shares its type registry
// between modules built from the same headers), so nothing is copied or rebuilt.

#include <time.h>

#include <vector>

#include "layer.hpp"

namespace {

namespace py = pybind11;
using namespace pyphasekv;

double seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// `reads` reads; per read (wall seconds, thread CPU seconds).
std::vector<std::pair<double, double>> time_reads(reader& r, const layer_cache& c, phasekv::sequence_id seq,
                                                  std::int64_t position, const py::array& queries,
                                                  const py::array& indexer_queries, const py::array& indexer_weights,
                                                  const py::array& sinks, py::object out, int reads) {
  phasekv::read_request request;
  request.position = position;
  request.queries = input<float>(queries, "queries");
  request.indexer_queries = input<float>(indexer_queries, "indexer_queries");
  request.indexer_weights = input<float>(indexer_weights, "indexer_weights");
  request.sinks = input<float>(sinks, "sinks");
  float* to = output<float>(out, "out", {r.sparse.output_floats()}, "query_heads × value channels");
  std::vector<std::pair<double, double>> times;
  times.reserve(static_cast<std::size_t>(reads));
  py::gil_scoped_release nogil;
  c.visit([&](const auto& cache) {
    for (int i = 0; i < reads; ++i) {
      const double wall = seconds(CLOCK_MONOTONIC), cpu = seconds(CLOCK_THREAD_CPUTIME_ID);
      r.sparse.read(cache, seq, request, to);
      times.emplace_back(seconds(CLOCK_MONOTONIC) - wall, seconds(CLOCK_THREAD_CPUTIME_ID) - cpu);
    }
  });
  return times;
}

}  // namespace

PYBIND11_MODULE(_phasekv_bench, m) {
  py::module_::import("phasekv._phasekv");  // registers the types this module takes
  m.def("time_reads", &time_reads, py::arg("reader"), py::arg("cache"), py::arg("seq"), py::arg("position"),
        py::arg("queries"), py::arg("indexer_queries"), py::arg("indexer_weights"), py::arg("sinks"), py::arg("out"),
        py::arg("reads"), "Times `reads` C++ reads: a list of (wall seconds, thread CPU seconds).");
}
