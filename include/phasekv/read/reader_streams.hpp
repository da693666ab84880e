#pragma once
// Which streams a reader reads, from the layer's stream roles (cache/layer_shape.hpp): the roles
// are authoritative, so a reader_config leaves key_stream, value_stream and indexer_stream at
// from_roles (their default) and gets
//   key     — the first stream of role key or key_value;
//   value   — the first of role value, else the key stream when it is key_value (tied K/V);
//   indexer — with selection (top_k > 0), the first of role indexer, else none (the host selects:
//             read_request::indices); without selection, none.
// A window-only layer (no stream) reads none of them. An index a config names instead must agree
// with the role — key: key or key_value; value: value or key_value; indexer: indexer, or a key
// stream scoring entries by their own keys (the needle probe's reader), or no_stream — else it is
// a config_error naming the field. An index past the streams is left for check_reader_config to
// name.

#include <cstddef>
#include <string>
#include <vector>

#include "phasekv/cache/layer_shape.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/read/read_types.hpp"

namespace phasekv {

inline reader_config resolve_reader_streams(const std::vector<stream_shape>& streams, reader_config config,
                                            const std::string& field) {
  const auto first = [&](auto accepts) {
    for (std::size_t k = 0; k < streams.size(); ++k)
      if (accepts(streams[k].role)) return k;
    return no_stream;
  };
  const auto is_key = [](stream_role r) { return r == stream_role::key || r == stream_role::key_value; };
  const auto is_value = [](stream_role r) { return r == stream_role::value || r == stream_role::key_value; };
  const auto scores = [](stream_role r) {
    return r == stream_role::indexer || r == stream_role::key || r == stream_role::key_value;
  };
  const std::size_t key = first(is_key);
  std::size_t value = first([](stream_role r) { return r == stream_role::value; });
  if (value == no_stream && key != no_stream && streams[key].role == stream_role::key_value) value = key;
  const std::size_t indexer = config.top_k > 0 ? first([](stream_role r) { return r == stream_role::indexer; }) : no_stream;
  // `optional`: no_stream is a valid choice (the indexer's: the host selects, or no selection).
  const auto agree = [&](std::size_t& chosen, std::size_t derived, auto accepts, const char* what, const char* roles,
                         bool optional) {
    if (chosen == from_roles) {
      chosen = derived;
      return;
    }
    if (chosen == no_stream && (streams.empty() || optional)) return;
    if (chosen < streams.size() && !accepts(streams[chosen].role))
      detail::fail(field + "." + what, chosen,
                   std::string("must name a stream of role ") + roles + " (stream '" + streams[chosen].name +
                       "' has another), or be from_roles");
  };
  agree(config.key_stream, key, is_key, "key_stream", "key or key_value", false);
  agree(config.value_stream, value, is_value, "value_stream", "value or key_value", false);
  agree(config.indexer_stream, indexer, scores, "indexer_stream", "indexer, key or key_value", true);
  if (!streams.empty() && config.key_stream == no_stream)
    detail::fail(field + ".key_stream", "from_roles", "finds no stream of role key or key_value to attend to");
  if (!streams.empty() && config.value_stream == no_stream)
    detail::fail(field + ".value_stream", "from_roles", "finds no stream of role value or key_value");
  return config;
}

}  // namespace phasekv
