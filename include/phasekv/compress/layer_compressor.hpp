#pragma once
// Several compressed streams over one geometry, appended in step:
// keys and values with separate gates, tied K/V, an indexer stream with its own channels.
// The streams may use different policies; each gets its own chunk and its own state. A stream is
// a stream_compressor<P>, or an erased_stream (erased_stream.hpp) whose policy is chosen at run time.
//
// Every chunk is checked before any stream changes, and no state advances until every stream
// has emitted, so a rejected call — or a sink that throws — leaves all states as they were.

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/core/error.hpp"

namespace phasekv {

template <class... Compressors>
class layer_compressor {
 public:
  static constexpr std::size_t stream_count = sizeof...(Compressors);
  static_assert(stream_count >= 1, "a layer needs at least one stream");
  using states = std::array<stream_state, stream_count>;
  using chunks = std::array<token_chunk, stream_count>;

  explicit layer_compressor(Compressors... streams) : streams_(std::move(streams)...) {
    const geometry& g = std::get<0>(streams_).geom();
    for_each([&](std::size_t k, const auto& s) {
      if (s.geom() != g)
        detail::fail("layer.streams[" + std::to_string(k) + "] (" + s.config().name + ").geometry",
                     "S=" + std::to_string(s.geom().stride) + " W=" + std::to_string(s.geom().window) +
                         " origin=" + std::to_string(s.geom().origin),
                     "every stream of a layer must share streams[0]'s geometry");
    });
  }

  const geometry& geom() const noexcept { return std::get<0>(streams_).geom(); }
  template <std::size_t K>
  const auto& stream() const noexcept { return std::get<K>(streams_); }
  // The configuration of stream k, for callers that pick streams at run time.
  const stream_config& config(std::size_t k) const {
    const stream_config* found = nullptr;
    for_each([&](std::size_t i, const auto& c) {
      if (i == k) found = &c.config();
    });
    if (!found)
      detail::fail<input_error>("layer: stream", k, "must be below the stream count " + std::to_string(stream_count));
    return *found;
  }

  // Whether stream k's policy applies RoPE (only then does its config's `rope` mean anything): the
  // stream's applies_rope(), a constant of a typed stream's policy, a run-time fact of an erased one.
  bool applies_rope(std::size_t k) const {
    config(k);  // throws for a stream that does not exist
    bool rotates = false;
    for_each([&](std::size_t i, const auto& c) {
      if (i == k) rotates = c.applies_rope();
    });
    return rotates;
  }

  // Fresh states; `history` as in stream_compressor::make_state.
  states make_state(std::int64_t history = 0) const {
    states s;
    for_each([&](std::size_t k, const auto& c) { s[k] = c.make_state(history); });
    return s;
  }

  // Appends one chunk per stream (all with the same token count); sink(stream_index, entry)
  // sees each stream's entries in turn. Returns the entries emitted, the same for every stream
  // (they share one geometry).
  // Throws input_error unless append(s, in, …, options) would be accepted.
  void check(const states& s, const chunks& in, const append_options& options = {}) const {
    for_each([&](std::size_t k, const auto& c) {
      if (in[k].tokens != in[0].tokens)
        detail::fail<input_error>("layer: chunks[" + std::to_string(k) + "].tokens", in[k].tokens,
                                  "must equal chunks[0].tokens = " + std::to_string(in[0].tokens));
      c.check(s[k], in[k], options);
    });
  }

  // Every stream advanced by `tokens` tokens whose entries the host computed (stream_compressor::skip).
  void check_skip(const states& s, std::int64_t tokens) const {
    for_each([&](std::size_t k, const auto& c) { c.check_skip(s[k], tokens); });
  }
  void skip(states& s, std::int64_t tokens) const noexcept {
    for_each([&](std::size_t k, const auto& c) { c.skip(s[k], tokens); });
  }

  template <class Sink>
  std::int64_t append(states& s, const chunks& in, Sink&& sink, const append_options& options = {}) const {
    check(s, in, options);
    const std::int64_t emitted = emit(s, in, sink, options);
    commit(s, in);
    return emitted;
  }

  // append() in two phases (stream_compressor::emit/commit), for callers that keep several
  // sequences in step (a batched append): emit every stream's entries without advancing the
  // states, then commit, which cannot fail. Call check() first.
  template <class Sink>
  std::int64_t emit(states& s, const chunks& in, Sink&& sink, const append_options& options = {}) const {
    std::int64_t emitted = 0;
    for_each([&](std::size_t k, const auto& c) {
      emitted = c.emit(s[k], in[k], [&](const entry_view& e) { sink(k, e); }, options);
    });
    return emitted;
  }
  void commit(states& s, const chunks& in) const noexcept {
    for_each([&](std::size_t k, const auto& c) { c.commit(s[k], in[k]); });
  }

 private:
  template <class F>
  void for_each(F&& f) const {
    for_each_impl(f, std::index_sequence_for<Compressors...>{});
  }
  template <class F, std::size_t... K>
  void for_each_impl(F& f, std::index_sequence<K...>) const {
    (f(K, std::get<K>(streams_)), ...);
  }

  std::tuple<Compressors...> streams_;
};

}  // namespace phasekv
