// The C++ side of bench/python/bench_read.py, compiled only into _phasekv_bench: the whole
// binding (python/src/*.cpp) built once more with this file and a hook that times reads from C++.
// time_reads() calls read_one() — the function SparseReader.read calls once its arguments are
// converted and its locks taken — in a loop without the GIL, the way a C++ host calls
// reader.read(cache, seq, request, out): no argument conversion, no locks. Both sides run the
// same machine code in the same module, so the comparison measures the binding and nothing else
// (two separately compiled copies of the reader differ by several percent in code placement).

#include <time.h>

#include <utility>
#include <vector>

#include "layer.hpp"

namespace pyphasekv {

namespace {

double seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

void init_bench(const modules& m) {
  py::module_ root = m.root;
  root.def(
      "time_reads",
      [](reader& r, const layer_cache& c, phasekv::sequence_id seq, std::int64_t position, const py::array& queries,
         const py::array& indexer_queries, const py::array& indexer_weights, const py::array& sinks, py::object out,
         int reads) {
        phasekv::read_request request;
        request.position = position;
        request.queries = input<float>(queries, "queries");
        request.indexer_queries = input<float>(indexer_queries, "indexer_queries");
        request.indexer_weights = input<float>(indexer_weights, "indexer_weights");
        request.sinks = input<float>(sinks, "sinks");
        float* to = output<float>(out, "out", {r.sparse.output_floats()}, "query_heads × value channels");
        std::vector<std::pair<double, double>> times;  // per read: wall seconds, thread CPU seconds
        times.reserve(static_cast<std::size_t>(reads));
        py::gil_scoped_release nogil;
        for (int i = 0; i < reads; ++i) {
          const double wall = seconds(CLOCK_MONOTONIC), cpu = seconds(CLOCK_THREAD_CPUTIME_ID);
          read_one(r, c, seq, request, to, nullptr);
          times.emplace_back(seconds(CLOCK_MONOTONIC) - wall, seconds(CLOCK_THREAD_CPUTIME_ID) - cpu);
        }
        return times;
      },
      py::arg("reader"), py::arg("cache"), py::arg("seq"), py::arg("position"), py::arg("queries"),
      py::arg("indexer_queries"), py::arg("indexer_weights"), py::arg("sinks"), py::arg("out"), py::arg("reads"),
      "Times `reads` reads from C++: a list of (wall seconds, thread CPU seconds).");
}

}  // namespace pyphasekv
