#pragma once
// The objects the Python classes hold: the compressor policies the package instantiates, a
// stream compressor and a paged cache of any of them (type-erased behind std::variant, so the
// bindings are written once), and the locks that make them safe to call from Python threads.
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
#include <phasekv/compress/stream_compressor.hpp>
#include <phasekv/models/deepseek_v4.hpp>
#include <phasekv/models/nsa.hpp>
#include <phasekv/read/sparse_reader.hpp>
#include <shared_mutex>
#include <utility>
#include <variant>

#include "common.hpp"

namespace pyphasekv {

// ---- policies and layer forms ----------------------------------------------------------------
// Compressor policies are templates; Python picks one of a fixed list at run time. Each policy
// is instantiated as a stream compressor and as two cache forms: one stream (a K/V or tied K/V
// layer, DeepSeek-V4's HCA) and two streams of the same policy (K/V plus the indexer's keys,
// DeepSeek-V4's CSA; or separate K and V). Adding a policy: one entry in policy_kind and
// policy_names, one type in `policies`, its stub in _phasekv.pyi.

enum class policy_kind {
  mean,         // compressor_policy<mean_pool>: plain averaging, no RoPE, no norm
  deepseek_v4,  // presets::deepseek_v4_csa_policy (= _hca_policy): vector gates, RMSNorm, RoPE after pooling
};
inline constexpr const char* policy_names[] = {"mean", "deepseek_v4"};

template <class... Policy>
struct policy_list {
  template <class P>
  using stream = phasekv::stream_compressor<P>;
  template <class P>
  using one_stream = phasekv::paged_cache<stream<P>>;
  template <class P>
  using two_streams = phasekv::paged_cache<stream<P>, stream<P>>;

  using compressor = std::variant<stream<Policy>...>;
  // paged_cache holds a mutex and cannot move: the variant holds it by pointer.
  using cache = std::variant<std::unique_ptr<one_stream<Policy>>..., std::unique_ptr<two_streams<Policy>>...>;
};
// In policy_kind's order.
using policies = policy_list<phasekv::compressor_policy<phasekv::mean_pool>, phasekv::presets::deepseek_v4_csa_policy>;

template <class Policy>
struct policy_tag {
  using type = Policy;
};

// Calls f(policy_tag<P>{}) with the policy `kind` names.
template <class F>
decltype(auto) with_policy(policy_kind kind, F&& f) {
  switch (kind) {
    case policy_kind::mean:
      return f(policy_tag<phasekv::compressor_policy<phasekv::mean_pool>>{});
    case policy_kind::deepseek_v4:
      return f(policy_tag<phasekv::presets::deepseek_v4_csa_policy>{});
  }
  phasekv::detail::fail<phasekv::config_error>("policy", static_cast<int>(kind), "is not a Policy");
}

// A stream compressor of any listed policy (Python's Compressor).
struct compressor {
  policy_kind policy;
  policies::compressor stream;

  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit([&](const auto& c) -> decltype(auto) { return f(c); }, stream);
  }
};

// A compressor's per-sequence state (Python's CompressorState); one call at a time.
struct compressor_state {
  phasekv::stream_state state;
  std::mutex lock;
};

// A paged cache of any listed policy and form (Python's PagedCache). Writers lock `lock`
// exclusively, everything else shares it (see the top of this file).
struct layer_cache {
  policy_kind policy;
  policies::cache cache;
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
