// libFuzzer target for host-built views: a host that owns its KV memory describes it
// to the reader with a sequence_view of its own. This harness copies a real cache's sequence into
// host arenas of exactly the size their views state (so a read a byte outside them is an ASan
// report), then lets the input corrupt what the reader promises to validate — page ids, entry
// counts, tokens, the window's first/tokens/rows, layouts, storage codes, strides, the stated
// geometry, the stream count, a null base, the read position and top_k — and reads.
// tests/fuzz/README.md says how to run it; scripts/fuzz --target view builds and runs it.
//
// What stays the host's duty is kept true: `capacity` and the page stride never exceed the
// arena's and `rows` never exceeds the window buffer's (the reader cannot know how much memory
// is behind a pointer).
//
// Checks, each a "phasekv fuzz: FAILED" and an abort when it does not hold:
//   (i)   the read throws input_error or succeeds — nothing else, no sanitizer report (no read
//         outside the arenas, no overflow in a position formula);
//   (ii)  an untouched host view reads bit-identically to the cache's own view;
//   (iii) an accepted read writes finite outputs (every stored value is finite), and a refused
//         one leaves the output as it was.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "harness.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace {

using namespace phasekv;
using i64 = std::int64_t;
using phasekv_fuzz::fail;

// A value for an integer field: small, near the truth, or at the edges of its type.
i64 pick(std::uint8_t how, std::uint8_t small, i64 truth) {
  switch (how % 6) {
    case 0: return small;
    case 1:  // wraps (an earlier edit may have left the field at an edge)
      return static_cast<i64>(static_cast<std::uint64_t>(truth) +
                              static_cast<std::uint64_t>(static_cast<i64>(static_cast<std::int8_t>(small))));
    case 2: return -static_cast<i64>(small);
    case 3: return std::numeric_limits<i64>::max() - small;
    case 4: return std::numeric_limits<i64>::min() + small;
    default: return (i64{1} << (small % 63)) - 1;
  }
}

using stream = stream_compressor<compressor_policy<mean_pool>>;
using cache_t = paged_cache<stream, stream>;
constexpr i64 channels = 8, query_heads = 2;

cache_t make_cache(storage_type kv_storage) {
  const geometry g{2, 4};
  stream_config kv, ix;
  kv.name = "kv";
  kv.channels = channels;
  ix.name = "indexer";
  ix.role = stream_role::indexer;
  ix.channels = channels;
  cache_config c;
  c.page_size = 3;
  c.pages = 12;
  c.stream_storage = {kv_storage, storage_type::f32};
  c.window.tokens = 3;
  c.window.key_channels = channels;
  return cache_t(layer_compressor<stream, stream>(stream(g, kv), stream(g, ix)), c);
}

reader_config make_reader(bool sink) {
  reader_config rc;
  rc.query_heads = query_heads;
  rc.key_stream = rc.value_stream = 0;
  rc.indexer_stream = 1;
  rc.top_k = 2;
  rc.indexer_heads = 1;
  rc.sink = sink;
  return rc;
}

// A sequence of 1–30 tokens in a cache, its host copy (arenas and a window buffer of exactly the
// size the view states, so a read one byte outside is an ASan report), a reader and its request:
// all determined by the input's first three bytes, so made once per key (harness.hpp's memo) and
// read by every input that starts with them. The reads never write what they read.
struct world {
  cache_t cache;
  sequence_view own;
  std::vector<std::vector<std::byte>> arenas;
  std::vector<std::vector<page_id>> tables;
  std::vector<float> window;
  sparse_reader reader;
  std::vector<float> q, iq, sinks, iw{1.0f};
  read_request request;
  std::vector<float> want;

  world(storage_type kv_storage, bool sink, i64 tokens, std::uint8_t seed)
      : cache(make_cache(kv_storage)), reader(cache, make_reader(sink)) {
    const sequence_id id = cache.create();
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const auto values = [&](i64 n) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (float& f : x) f = u(rng);
      return x;
    };
    const std::vector<float> kv = values(tokens * cache.compressors().stream<0>().payload_floats_per_token()),
                             ix = values(tokens * cache.compressors().stream<1>().payload_floats_per_token()),
                             keys = values(tokens * channels);
    cache.append(id, {token_chunk{tokens, kv, {}}, token_chunk{tokens, ix, {}}}, keys);
    own = cache.view_of(id);
    arenas.resize(own.stream_count);
    tables.resize(own.stream_count);
    for (std::size_t k = 0; k < own.stream_count; ++k) {
      const stream_view& s = own.streams[k];
      arenas[k].assign(s.base, s.base + s.capacity * s.layout.page_stride_bytes);
      tables[k].assign(s.pages.begin(), s.pages.end());
    }
    const std::size_t window_floats = static_cast<std::size_t>(own.window.rows * own.window.kv_heads * own.window.key_channels);
    window.assign(own.window.keys, own.window.keys + window_floats);
    request.position = tokens - 1;
    q = values(query_heads * channels);
    iq = values(channels);
    sinks = values(query_heads);
    request.queries = q;
    request.indexer_queries = iq;
    request.indexer_weights = iw;
    if (sink) request.sinks = sinks;
    want.assign(static_cast<std::size_t>(reader.output_floats()), 0.0f);
    reader.read(own, request, want.data());
    // The untouched host view reads bit-identically to the cache's.
    std::vector<float> got(want.size());
    std::vector<std::vector<page_id>> copies = tables;
    reader.read(host_view(copies), request, got.data());
    if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0)
      fail("an untouched host view reads differently from the cache's view");
  }

  // The host's view over the arenas and window buffer, with page tables `t` (the input's copies).
  sequence_view host_view(std::vector<std::vector<page_id>>& t) {
    sequence_view host = own;
    host.stamp = view_stamp{};
    for (std::size_t k = 0; k < own.stream_count; ++k) {
      host.streams[k].base = arenas[k].data();
      host.streams[k].pages = span<const page_id>(t[k].data(), t[k].size());
    }
    host.window.keys = host.window.values = window.data();
    return host;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  phasekv_fuzz::input_bytes in{data, size};
  const std::uint8_t shape = in.byte();
  const storage_type kv_storage = (shape & 1) ? storage_type::bf16 : storage_type::f32;
  const bool sink = shape & 2;
  const i64 tokens = 1 + in.byte() % 30;
  const std::uint8_t seed = in.byte();
  phasekv_fuzz::setup() = "tokens=" + std::to_string(tokens) + ((shape & 1) ? " bf16" : " f32") + (sink ? " sink" : "");

  static phasekv_fuzz::memo<std::tuple<int, int, i64, int>, world> worlds(512);
  world& w = worlds.get(std::tuple<int, int, i64, int>{shape & 1, sink, tokens, seed},
                        [&] { return std::make_unique<world>(kv_storage, sink, tokens, seed); });
  std::vector<std::vector<page_id>> tables = w.tables;
  sequence_view host = w.host_view(tables);
  const sequence_view& own = w.own;
  read_request request = w.request;
  sparse_reader& reader = w.reader;
  const std::vector<float>& want = w.want;

  // The corruptions.
  const int edits = 1 + in.byte() % 6;
  for (int e = 0; e < edits; ++e) {
    const std::uint8_t what = in.byte(), how = in.byte(), small = in.byte();
    stream_view& s = host.streams[what % 2];
    switch ((what >> 1) % 16) {
      case 0:
        if (!tables[what % 2].empty()) tables[what % 2][small % tables[what % 2].size()] = static_cast<page_id>(pick(how, small, 0));
        break;
      case 1: s.entries = pick(how, small, s.entries); break;
      case 2: host.tokens = pick(how, small, host.tokens); break;
      case 3: host.window.first = pick(how, small, host.window.first); break;
      case 4: host.window.tokens = pick(how, small, host.window.tokens); break;
      case 5: host.window.rows = small % (own.window.rows + 1); break;  // never more than the buffer holds
      case 6: s.layout.channels = pick(how, small, s.layout.channels); break;
      case 7: s.layout.storage = static_cast<storage_type>(small % 7); break;
      case 8:  // never more than the truth: capacity × page stride is the arena (the host's word)
        s.layout.page_stride_bytes = std::min(pick(how, small, s.layout.page_stride_bytes), s.layout.page_stride_bytes);
        break;
      case 9: s.layout.entry_stride_bytes = pick(how, small, s.layout.entry_stride_bytes); break;
      case 10: s.layout.page_size = pick(how, small, s.layout.page_size); break;
      case 11: s.capacity = small % (own.streams[what % 2].capacity + 1); break;  // never more than the arena
      case 12: host.geom.stride = pick(how, small, host.geom.stride); break;
      case 13: host.stream_count = small % 10; break;
      case 14: request.position = pick(how, small, request.position); break;
      default: request.top_k = pick(how, small, request.top_k); break;
    }
    phasekv_fuzz::setup() += " " + std::to_string((what >> 1) % 16) + ":" + std::to_string(how % 6) + "/" + std::to_string(small);
  }
  std::vector<float> out(want.size(), 7.0f);
  try {
    reader.read(host, request, out.data());
  } catch (const input_error&) {
    for (float x : out)
      if (x != 7.0f) fail("a refused read wrote its output");
    return 0;
  } catch (const std::exception& e) {
    fail(std::string("the read threw something other than input_error: ") + e.what());
  }
  for (float x : out)
    if (!std::isfinite(x)) fail("an accepted read wrote a non-finite output");
  return 0;
}
