#pragma once
// One read's inputs, owned, so that requests and read items can point at them, and random ones
// for a reader configuration.

#include <cstdint>
#include <random>
#include <vector>

#include "support/common.hpp"
#include "support/random_inputs.hpp"
#include "phasekv/read/read_types.hpp"

namespace phasekv_test {

struct request_inputs {
  std::vector<float> queries, indexer_queries, indexer_weights, sinks;
  phasekv::read_request request;  // its position and top_k are the caller's

  // Points `request` at this object's vectors (again after the object was copied).
  void point() {
    request.queries = queries;
    request.indexer_queries = indexer_queries;
    request.indexer_weights = indexer_weights;
    request.sinks = sinks;
  }
  // A request at `position` pointing at these vectors, its top_k the config's.
  phasekv::read_request at(std::int64_t position) const {
    return phasekv::read_request{position, queries, indexer_queries, indexer_weights, sinks};
  }
  // The selection the request at `position` makes, of top_k entries (−1: the config's).
  phasekv::selection_request selection(std::int64_t position, std::int64_t top_k = -1) const {
    return {position, indexer_queries, indexer_weights, top_k};
  }
};

// The inputs of a read by `rc` at `position` (request pointed at them), drawn in this order:
// queries of key_channels uniform in [−query_scale, query_scale); when the reader selects,
// indexer queries of indexer_channels in [−1, 1) and their weights in [0, 1); when it has a
// sink, sinks in [−1, 2).
inline request_inputs random_request(const phasekv::reader_config& rc, std::int64_t key_channels,
                                     std::int64_t indexer_channels, std::mt19937& rng, std::int64_t position,
                                     float query_scale) {
  request_inputs r;
  r.queries = random_uniform(rng, sz(rc.query_heads * key_channels), -query_scale, query_scale);
  if (rc.top_k > 0) {
    r.indexer_queries = random_uniform(rng, sz(rc.indexer_heads * indexer_channels), -1.0f, 1.0f);
    r.indexer_weights = random_uniform(rng, sz(rc.indexer_heads), 0.0f, 1.0f);
  }
  if (rc.sink) r.sinks = random_uniform(rng, sz(rc.query_heads), -1.0f, 2.0f);
  r.request.position = position;
  r.point();
  return r;
}

}  // namespace phasekv_test
