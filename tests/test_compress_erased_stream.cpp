// erased_stream (include/phasekv/compress/erased_stream.hpp): a paged_cache of streams the pooling
// registry built at run time is the cache of the typed stream_compressor<P> they wrap, byte for
// byte. Each test fills a typed cache and its erased twin with the same tokens in random chunks,
// forks, rolls back and forks again, and after every step requires of both: every stored entry's
// bytes in every stream, the raw window rows, the compressor states' counts, the memory figures
// and a sparse_reader read (outputs, log-sum-exp, selected ids) — all equal bit for bit. The
// policies: DeepSeek-V4's at its precision (FP8 K/V entries, FP4 indexer keys, an FP8 window,
// selecting reads through the FP4 indexer), and mean pooling over separate K and V streams; a
// third, scalar gates with RoPE before pooling and RMSNorm, covers the other template branches.
// A snapshot of either cache restores into the other (the snapshot format names a policy by its
// codes, not by its C++ type) and the restored sequence goes on identically.

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/common.hpp"
#include "support/configs.hpp"
#include "support/deepseek_layer.hpp"
#include "support/message_of.hpp"
#include "support/read_result.hpp"
#include "support/request_inputs.hpp"
#include "support/tokens.hpp"
#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/cache/snapshot.hpp"
#include "phasekv/compress/erased_stream.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/pooling_registry.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace test_compress_erased_stream {

namespace {

using namespace phasekv;
using namespace phasekv_test;

const pooling_registry& builtins() {
  static const pooling_registry r = pooling_registry::builtins();
  return r;
}

// The erased twin of a typed stream: the same geometry, config and parameters, through the registry.
template <class Typed>
erased_stream erase(const Typed& s, const std::string& pooling, rope_placement rope, entry_norm norm) {
  return erased_stream(builtins(), pooling, stream_build{s.geom(), s.config(), s.params(), rope, norm, 0});
}

bool same_bytes(const void* a, const void* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

template <class A, class B>
void require_same_reads(const A& a, sequence_id sa, const B& b, sequence_id sb, const reader_config& rc,
                        std::mt19937& rng) {
  const std::int64_t tokens = a.tokens(sa);
  if (tokens == 0) return;
  const layer_shape shape = a.shape();
  sparse_reader ra(shape, rc), rb(b.shape(), rc);
  const std::int64_t key_channels = shape.streams[rc.key_stream == from_roles ? 0 : rc.key_stream].channels;
  const std::int64_t indexer_channels = rc.top_k > 0 ? shape.streams[rc.indexer_stream].channels : 0;
  // The last token, and one half a window back when the kept rows still hold its window.
  const std::int64_t first = a.window_first(sa);
  const std::int64_t earliest = first == 0 ? 0 : first + shape.window.tokens - 1;
  const std::int64_t earlier = std::min(tokens - 1, std::max(earliest, tokens - 1 - shape.window.tokens / 2));
  for (const std::int64_t position : {tokens - 1, earlier}) {
    const request_inputs in = random_request(rc, key_channels, indexer_channels, rng, position, 1.0f);
    const sequence_view va = a.view_of(sa), vb = b.view_of(sb);
    const read_result x = read_one(ra, va, in.request), y = read_one(rb, vb, in.request);
    INFO("read at " << position << " of " << tokens << " tokens");
    REQUIRE(same_bytes(x.out.data(), y.out.data(), x.out.size() * 4));
    REQUIRE(same_bytes(x.lse.data(), y.lse.data(), x.lse.size() * 4));
    REQUIRE(x.logical == y.logical);
    REQUIRE(x.physical == y.physical);
    REQUIRE(same_trace(x.trace, y.trace));
  }
}

// Everything observable of sequence sa of a and sb of b, bit for bit.
template <class A, class B>
void require_same(const A& a, sequence_id sa, const B& b, sequence_id sb, const reader_config& rc, std::mt19937& rng) {
  static_assert(A::stream_count == B::stream_count, "twins have the same streams");
  REQUIRE(a.tokens(sa) == b.tokens(sb));
  for (std::size_t k = 0; k < A::stream_count; ++k) {
    const std::int64_t n = a.entries(sa, k);
    REQUIRE(b.entries(sb, k) == n);
    REQUIRE(a.state(sa, k).tokens() == b.state(sb, k).tokens());
    REQUIRE(a.state(sa, k).bytes() == b.state(sb, k).bytes());
    REQUIRE(a.page_table(sa, k) == b.page_table(sb, k));
    for (std::int64_t j = 0; j < n; ++j) {
      const span<const std::byte> x = a.entry_bytes(sa, k, j), y = b.entry_bytes(sb, k, j);
      INFO("stream " << k << " entry " << j);
      REQUIRE(x.size() == y.size());
      REQUIRE(same_bytes(x.data(), y.data(), x.size()));
    }
  }
  REQUIRE(a.window_rows() == b.window_rows());
  REQUIRE(a.window_first(sa) == b.window_first(sb));
  const raw_window_config& w = a.config().window;
  if (w.tokens > 0) {
    const std::int64_t value_floats = w.kv_heads * (w.value_channels > 0 ? w.value_channels : w.key_channels);
    std::vector<float> ka(sz(w.kv_heads * w.key_channels)), kb(ka.size()), va(sz(value_floats)), vb(va.size());
    for (std::int64_t t = a.window_first(sa); t < a.tokens(sa); ++t) {
      a.copy_window_key(sa, t, span<float>(ka.data(), ka.size()));
      b.copy_window_key(sb, t, span<float>(kb.data(), kb.size()));
      a.copy_window_value(sa, t, span<float>(va.data(), va.size()));
      b.copy_window_value(sb, t, span<float>(vb.data(), vb.size()));
      INFO("window row of token " << t);
      REQUIRE(same_bytes(ka.data(), kb.data(), ka.size() * 4));
      REQUIRE(same_bytes(va.data(), vb.data(), va.size() * 4));
    }
  }
  const sequence_memory ma = a.memory(sa), mb = b.memory(sb);
  REQUIRE(ma.entries == mb.entries);
  REQUIRE(ma.page_bytes == mb.page_bytes);
  REQUIRE(ma.entry_bytes == mb.entry_bytes);
  REQUIRE(ma.state_bytes == mb.state_bytes);
  require_same_reads(a, sa, b, sb, rc, rng);
}

// The same `tokens` random tokens appended to both, in random chunks of 1 to max_chunk tokens.
template <class A, class B>
void append_both(A& a, sequence_id sa, B& b, sequence_id sb, std::int64_t tokens, std::int64_t max_chunk,
                 std::mt19937& rng, const token_draw& draw) {
  std::uniform_int_distribution<std::int64_t> chunk(1, max_chunk);
  while (tokens > 0) {
    const std::int64_t n = std::min(tokens, chunk(rng));
    const auto in = random_tokens(a, n, rng, draw);
    const std::int64_t ea = a.append(sa, in.chunks(), in.window_keys, in.window_values);
    const std::int64_t eb = b.append(sb, in.chunks(), in.window_keys, in.window_values);
    REQUIRE(ea == eb);
    tokens -= n;
  }
}

// Fills both caches, forks, rolls back, snapshots across: requiring sameness after every step.
template <class A, class B>
void run_twins(A& a, B& b, const reader_config& rc, std::uint32_t seed, std::int64_t max_chunk,
               const token_draw& draw) {
  std::mt19937 rng(seed);
  const std::int64_t history = a.config().history;
  for (int round = 0; round < 3; ++round) {
    const sequence_id sa = a.create(), sb = b.create();
    append_both(a, sa, b, sb, 40 + 17 * round, max_chunk, rng, draw);
    require_same(a, sa, b, sb, rc, rng);

    // A fork that writes into the shared last page (copy on write), then rolls back within history.
    const sequence_id fa = a.fork(sa), fb = b.fork(sb);
    append_both(a, fa, b, fb, 1 + round * 5, max_chunk, rng, draw);
    require_same(a, fa, b, fb, rc, rng);
    require_same(a, sa, b, sb, rc, rng);
    const std::int64_t p0 = a.tokens(fa) - std::min<std::int64_t>(history, 3 + round);
    REQUIRE(a.can_remove_suffix(fa, p0) == b.can_remove_suffix(fb, p0));
    a.remove_suffix(fa, p0);
    b.remove_suffix(fb, p0);
    require_same(a, fa, b, fb, rc, rng);
    append_both(a, fa, b, fb, 9, max_chunk, rng, draw);
    require_same(a, fa, b, fb, rc, rng);

    // A rollback beyond the kept inputs is refused by both, with the same message.
    if (a.tokens(sa) > history + 20) {
      const std::int64_t far = 1;
      REQUIRE(a.can_remove_suffix(sa, far) == b.can_remove_suffix(sb, far));
      if (!a.can_remove_suffix(sa, far))
        REQUIRE(message_of<input_error>([&] { a.remove_suffix(sa, far); }) ==
                message_of<input_error>([&] { b.remove_suffix(sb, far); }));
    }

    // copy (seq_cp) onto the fork, and keep going.
    a.copy(sa, fa);
    b.copy(sb, fb);
    append_both(a, fa, b, fb, 5, max_chunk, rng, draw);
    require_same(a, fa, b, fb, rc, rng);

    // A snapshot of the typed cache restores into the erased one and the other way round; the
    // restored sequences then go on as the originals do.
    const std::vector<std::byte> from_a = snapshot(a, sa), from_b = snapshot(b, sb);
    REQUIRE(from_a == from_b);
    const sequence_id ra = restore(a, span<const std::byte>(from_b.data(), from_b.size()));
    const sequence_id rb = restore(b, span<const std::byte>(from_a.data(), from_a.size()));
    require_same(a, ra, b, rb, rc, rng);
    append_both(a, ra, b, rb, 11, max_chunk, rng, draw);
    require_same(a, ra, b, rb, rc, rng);
    a.free(ra);
    b.free(rb);
    a.free(fa);
    b.free(fb);
  }
}

}  // namespace

TEST_CASE("erased streams: a DeepSeek-V4 CSA layer at its precision equals the typed layer byte for byte",
          "[erased_stream]") {
  const csa_cache::layer typed_layer = make_csa_layer();
  const auto& kv = typed_layer.stream<0>();
  const auto& ix = typed_layer.stream<1>();
  const cache_config config = presets::deepseek_cache(presets::deepseek_v4_csa_layer, 24, 8, true);
  REQUIRE(config.stream_storage ==
          std::vector<storage_type>{storage_type::fp8_e4m3_block, storage_type::fp4_e2m1_hadamard});
  REQUIRE(config.window.precision == storage_type::fp8_e4m3_block);

  csa_cache typed(typed_layer, config);
  paged_cache<erased_stream, erased_stream> erased(
      layer_compressor<erased_stream, erased_stream>(
          erase(kv, "vector_gates", rope_placement::after_pool, entry_norm::rms),
          erase(ix, "vector_gates", rope_placement::after_pool, entry_norm::rms)),
      config);
  REQUIRE(erased.compressors().applies_rope(0));
  REQUIRE(erased.compressors().applies_rope(1));
  REQUIRE(erased.pool(0).layout().entry_stride_bytes == 584);  // 448 e4m3 + 64 bf16 RoPE channels + scales
  REQUIRE(erased.pool(1).layout().entry_stride_bytes == 68);

  const reader_config rc = dsv4_reader(8, true);  // selecting: 8 of up to ~25 entries
  run_twins(typed, erased, rc, 20260u, 13, csa_draw);
}

TEST_CASE("erased streams: mean pooling over separate K and V streams equals the typed layer", "[erased_stream]") {
  using mean = stream_compressor<compressor_policy<mean_pool>>;
  const geometry g{3, 6};
  const mean keys(g, stream_of("keys", stream_role::key, 24, 2));
  const mean values(g, stream_of("values", stream_role::value, 16, 2));
  const cache_config config = cache_of("mean", 4, 64, 6, raw_window_config{10, 2, 24, 16});

  paged_cache<mean, mean> typed(layer_compressor<mean, mean>(keys, values), config);
  paged_cache<erased_stream, erased_stream> erased(
      layer_compressor<erased_stream, erased_stream>(erase(keys, "mean", rope_placement::none, entry_norm::none),
                                                     erase(values, "mean", rope_placement::none, entry_norm::none)),
      config);
  REQUIRE_FALSE(erased.compressors().applies_rope(0));

  run_twins(typed, erased, phasekv_test::reader_of("mean.reader", 4), 7u, 9, token_draw{});  // K, V by role
}

TEST_CASE("erased streams: scalar gates with RoPE before pooling and RMSNorm equal the typed layer",
          "[erased_stream]") {
  using policy = compressor_policy<scalar_gated_pool, rope_before_pool, rms_norm>;
  using typed_stream = stream_compressor<policy>;
  std::mt19937 prng(5);
  const geometry g{2, 4, 1};
  stream_params p;
  p.slot_bias = random_bias(prng, sz(1 * g.window * 1));
  p.norm_weight = random_norm_weight(prng, 16);
  const typed_stream kv(g, rotated_stream_of("kv", 16, 1, input_layout::per_slot, 8), p);
  cache_config config = cache_of("scalar", 3, 64, 4, raw_window_config{6, 1, 16, 0});
  config.storage = storage_type::bf16;

  paged_cache<typed_stream> typed(layer_compressor<typed_stream>(kv), config);
  paged_cache<erased_stream> erased(
      layer_compressor<erased_stream>(erase(kv, "scalar_gates", rope_placement::before_pool, entry_norm::rms)), config);
  REQUIRE(erased.compressors().applies_rope(0));
  REQUIRE(erased.compressors().stream<0>().gate_channels() == 1);
  REQUIRE(erased.compressors().stream<0>().views() == kv.views());

  run_twins(typed, erased, phasekv_test::reader_of("scalar.reader", 2), 11u, 7, token_draw{});  // tied K/V
}

TEST_CASE("erased streams: construction errors name the field", "[erased_stream]") {
  const stream_build b{
      geometry{2, 4}, stream_of("kv", stream_role::key_value, 8), {}, rope_placement::none, entry_norm::none, 0};
  const std::string unknown = message_of<config_error>([&] { erased_stream(builtins(), "median", b); });
  REQUIRE(unknown.rfind("kv.pooling = 'median': is not a registered pooling", 0) == 0);
  REQUIRE(message_of<config_error>([] { erased_stream(std::shared_ptr<const stream_kernel>()); }) ==
          "erased_stream(kernel) = null: must be a stream_kernel");
}

}  // namespace test_compress_erased_stream
