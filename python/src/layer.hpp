#pragma once
// The objects the Python classes hold: a stream compressor and a paged cache of one, two or three
// streams, each stream an erased_stream (compress/erased_stream.hpp) whose pooling, RoPE placement
// and norm are chosen at run time through the pooling registry — so the bindings are written once
// for every built-in pooling, and the only variant left is over the stream count — and the locks
// that make them safe to call from Python threads.
//
// The GIL is released around every append and read. The C++ objects are not safe against every
// interleaving of calls that Python threads could produce (a read overlapping an append of the
// same sequence, two reads sharing one reader's scratch), so each Python object carries a lock:
// a cache serialises its writers against everything else, a reader and a compressor state run one
// call at a time. Locks are taken only after the GIL is released and dropped before it is taken
// back, so no thread ever waits for a lock while holding the GIL another thread needs.

#include <memory>
#include <mutex>
#include <phasekv/cache/paged_cache.hpp>
#include <phasekv/compress/erased_stream.hpp>
#include <phasekv/compress/pooling_registry.hpp>
#include <phasekv/models/deepseek_v4.hpp>
#include <phasekv/models/model_cache.hpp>
#include <phasekv/models/nsa.hpp>
#include <phasekv/read/sparse_reader.hpp>
#include <shared_mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common.hpp"

namespace pyphasekv {

// ---- poolings ----------------------------------------------------------------------------------
// Python's Policy names two poolings of the registry with their RoPE placement and norm; Pooling
// (pooling_spec) names any built-in one. Neither is a type: every stream is built by
// phasekv::builtin_poolings(), whose compiled kernels do the per-entry work.

enum class policy_kind {
  mean,         // "mean", no RoPE, no norm: compressor_policy<mean_pool>
  deepseek_v4,  // "vector_gates", RoPE after pooling, RMSNorm: presets::deepseek_v4_csa_policy (= _hca_policy)
};
inline constexpr const char* policy_names[] = {"mean", "deepseek_v4"};

// A pooling of the registry by id, with its RoPE placement and norm (Python's Pooling).
struct pooling_spec {
  std::string id = "mean";
  phasekv::rope_placement rope = phasekv::rope_placement::none;
  phasekv::entry_norm norm = phasekv::entry_norm::none;

  bool operator==(const pooling_spec& o) const { return id == o.id && rope == o.rope && norm == o.norm; }
};

inline pooling_spec pooling_of(policy_kind kind) {
  using phasekv::entry_norm, phasekv::rope_placement;
  if (kind == policy_kind::deepseek_v4) return {"vector_gates", rope_placement::after_pool, entry_norm::rms};
  return {};
}

// A Policy, a Pooling or a pooling id (str) given as `name`, as a pooling_spec; TypeError otherwise.
pooling_spec pooling_from(const py::handle& given, const std::string& name);

// The stream `pooling` pools, built by the registry (config_error as stream_compressor's
// constructor, or naming "<config.name>.pooling" for an unknown id).
phasekv::erased_stream make_stream(const pooling_spec& pooling, const phasekv::geometry& g,
                                   const phasekv::stream_config& c, const phasekv::stream_params& p);

// A stream compressor of any pooling (Python's Compressor); `policy` is what it was built with.
struct compressor {
  py::object policy;
  pooling_spec pooling;
  phasekv::erased_stream stream;
};

// A compressor's per-sequence state (Python's CompressorState); one call at a time.
struct compressor_state {
  phasekv::stream_state state;
  std::mutex lock;
};

// A paged cache of one, two or three streams, each of any pooling (Python's PagedCache). Writers
// lock `lock` exclusively, everything else shares it (see the top of this file).
struct layer_cache {
  using stream = phasekv::erased_stream;
  // paged_cache holds a mutex and cannot move: the variant holds it by pointer.
  using caches = std::variant<std::unique_ptr<phasekv::paged_cache<stream>>,
                              std::unique_ptr<phasekv::paged_cache<stream, stream>>,
                              std::unique_ptr<phasekv::paged_cache<stream, stream, stream>>>;

  py::object policy;                   // what it was built with: a Policy, a Pooling, or one per stream
  std::vector<pooling_spec> poolings;  // per stream
  caches cache;
  mutable std::shared_mutex lock;

  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit([&](auto& c) -> decltype(auto) { return f(*c); }, cache);
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit([&](const auto& c) -> decltype(auto) { return f(std::as_const(*c)); }, cache);
  }
};

// A reader and the lock that keeps its scratch to one read at a time (Python's SparseReader).
struct reader {
  reader(phasekv::layer_shape shape, phasekv::reader_config config) : sparse(std::move(shape), std::move(config)) {}
  phasekv::sparse_reader sparse;
  std::mutex lock;
};

struct selector {
  selector(phasekv::layer_shape shape, phasekv::selection_config config) : stage(std::move(shape), std::move(config)) {}
  phasekv::entry_selector stage;
  std::mutex lock;
};

// reader.read(cache, seq, request, out, trace) on whichever cache `c` holds: what SparseReader.read
// runs once its arguments are converted and its locks taken. Out of line, so the benchmark's C++
// loop (bench/python/bench_module.cpp) runs the very same machine code as a read from Python.
void read_one(reader& r, const layer_cache& c, phasekv::sequence_id seq, const phasekv::read_request& request,
              float* out, phasekv::read_trace* trace);

}  // namespace pyphasekv
