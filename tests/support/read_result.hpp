#pragma once
// One read through the batch API, everything it returns kept (output, lse, selected ids, trace), a
// read through the cache, a view's refusal, and the comparison of two traces: what the read tests
// that compare two reads bit for bit share.

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/read/sparse_reader.hpp"
#include "support/common.hpp"
#include "support/message_of.hpp"

namespace phasekv_test {

struct read_result {
  std::vector<float> out, lse;
  std::vector<std::int32_t> logical, physical;  // empty when the reader selects nothing (top_k = 0)
  phasekv::read_trace trace;
};

// Outputs start at sentinels (7, and 99 for ids) so that an element the read never writes shows.
inline read_result read_one(phasekv::sparse_reader& reader, const phasekv::sequence_view& view,
                            const phasekv::read_request& request) {
  const phasekv::reader_config& rc = reader.config();
  read_result r;
  r.out.assign(sz(reader.output_floats()), 7.0f);
  r.lse.assign(sz(rc.query_heads), 7.0f);
  phasekv::read_item it;
  it.view = &view;
  it.request = request;
  it.out = r.out.data();
  it.lse = r.lse.data();
  it.trace = &r.trace;
  if (rc.top_k > 0) {
    r.logical.assign(sz(rc.top_k), 99);
    r.physical.assign(sz(rc.top_k), 99);
    it.selected_logical = r.logical.data();
    it.selected_physical = r.physical.data();
  }
  reader.read_batch(phasekv::span<const phasekv::read_item>(&it, 1));
  return r;
}

// The output of reading `seq` through the cache itself (reader.read(cache, seq, ...)), for holding
// it to the bits of a read of the cache's view.
template <class Cache>
std::vector<float> read_through_cache(phasekv::sparse_reader& reader, const Cache& cache, phasekv::sequence_id seq,
                                      const phasekv::read_request& request) {
  std::vector<float> out(sz(reader.output_floats()));
  reader.read(cache, seq, request, out.data());
  return out;
}

// Reading a copy of `good` changed by edit(view) is refused with an input_error whose message
// contains `message`.
template <class Edit>
void check_view_refused(phasekv::sparse_reader& reader, const phasekv::sequence_view& good,
                        const phasekv::read_request& request, Edit edit, const std::string& message) {
  INFO("expecting " << message);
  phasekv::sequence_view view = good;
  edit(view);
  std::vector<float> out(sz(reader.output_floats()));
  CHECK_THAT(message_of<phasekv::input_error>([&] { reader.read(view, request, out.data()); }),
             Catch::Matchers::Contains(message));
}

inline bool same_trace(const phasekv::read_trace& a, const phasekv::read_trace& b) {
  return a.candidates == b.candidates && a.selected == b.selected && a.scores == b.scores &&
         a.entry_mass == b.entry_mass && a.window_first == b.window_first &&
         a.window_token_mass == b.window_token_mass && a.window_mass == b.window_mass && a.sink_mass == b.sink_mass;
}

}  // namespace phasekv_test
