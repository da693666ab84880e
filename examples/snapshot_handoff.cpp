// Moving a prefilled sequence between processes, as a disaggregated engine moves it from a
// prefill node to a decode node (cache/snapshot.hpp). One DeepSeek-V4-style CSA layer (tied
// 512-channel K/V plus a 128-channel indexer, S=4, W=8, 128-token raw window):
//
//   snapshot_handoff prefill FILE [--prompt N]    prefill N tokens (2050), write the snapshot to FILE
//   snapshot_handoff decode FILE [--steps N]      restore FILE into a fresh cache (another page
//                                                 size and capacity), then decode N steps (16)
//   snapshot_handoff local [--prompt N] [--steps N]   prefill and decode in one cache, never moved
//
// `decode` and `local` end with the same line — a CRC-32C of every entry and of every decode
// step's attention output — because a restored sequence continues bit-identically. The inputs
// stand in for the host's projections: a pure function of the token position, so both processes
// see the same token t whatever chunks it arrives in.

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <phasekv/phasekv.hpp>

#include "cli.hpp"

namespace {

using namespace phasekv;
using csa = stream_compressor<presets::deepseek_v4_csa_policy>;
using csa_cache = paged_cache<csa, csa>;

// Uniform in [−1, 1): splitmix64 of (token, what, element), so inputs depend on nothing else.
float input(std::int64_t token, std::uint64_t what, std::int64_t element) {
  std::uint64_t z = static_cast<std::uint64_t>(token) * 0x9E3779B97F4A7C15ull + what * 0xBF58476D1CE4E5B9ull +
                    static_cast<std::uint64_t>(element) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

std::vector<float> inputs(std::int64_t first, std::int64_t n, std::uint64_t what, std::int64_t per_token) {
  std::vector<float> v(static_cast<std::size_t>(n * per_token));
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t i = 0; i < per_token; ++i) v[static_cast<std::size_t>(t * per_token + i)] = input(first + t, what, i);
  return v;
}

csa_cache make_cache(std::int64_t page_size, std::int64_t tokens) {
  const geometry g = presets::deepseek_v4_csa_geometry();
  layer_compressor<csa, csa> layer(csa(g, presets::deepseek_v4_csa_kv()), csa(g, presets::deepseek_v4_csa_indexer()));
  cache_config cc;
  cc.page_size = page_size;
  cc.pages = tokens / g.stride / page_size + 2;
  cc.window.tokens = 128;
  cc.window.key_channels = 512;  // tied K/V
  return csa_cache(layer, cc);
}

void append_tokens(csa_cache& cache, sequence_id seq, std::int64_t n) {
  const csa& kv = cache.compressors().stream<0>();
  const csa& ix = cache.compressors().stream<1>();
  const std::int64_t t0 = cache.tokens(seq);
  const auto kv_payload = inputs(t0, n, 1, kv.payload_floats_per_token());
  const auto kv_logits = inputs(t0, n, 2, kv.logit_floats_per_token());
  const auto ix_payload = inputs(t0, n, 3, ix.payload_floats_per_token());
  const auto ix_logits = inputs(t0, n, 4, ix.logit_floats_per_token());
  const auto window_keys = inputs(t0, n, 5, 512);
  cache.append(seq, {token_chunk{n, kv_payload, kv_logits}, token_chunk{n, ix_payload, ix_logits}}, window_keys);
}

// Decodes `steps` tokens and prints the CRC-32C of the entries and of the attention outputs.
void decode(csa_cache& cache, sequence_id seq, std::int64_t steps) {
  reader_config rc;
  rc.query_heads = 64;
  rc.indexer_stream = 1;
  rc.top_k = 512;
  rc.indexer_heads = 64;
  rc.sink = true;
  rc.derotate_output = true;
  sparse_reader reader(cache, rc);
  std::vector<float> out(static_cast<std::size_t>(reader.output_floats()));
  std::uint32_t outputs = 0, entries = 0;
  for (std::int64_t step = 0; step < steps; ++step) {
    append_tokens(cache, seq, 1);
    const std::int64_t t = cache.tokens(seq) - 1;
    const auto queries = inputs(t, 1, 6, 64 * 512), index_queries = inputs(t, 1, 7, 64 * 128);
    auto weights = inputs(t, 1, 8, 64);
    for (float& w : weights) w = 0.5f * (w + 1.0f) / 64.0f;
    const auto sinks = inputs(t, 1, 9, 64);
    reader.read(cache, seq, read_request{t, queries, index_queries, weights, sinks}, out.data());
    outputs = crc32c(out.data(), out.size() * sizeof(float), outputs);
  }
  for (std::size_t k = 0; k < 2; ++k) {
    std::vector<float> entry(static_cast<std::size_t>(cache.pool(k).layout().entry_stride));
    for (std::int64_t j = 0; j < cache.entries(seq, k); ++j) {
      cache.read_entry(seq, k, j, entry.data());
      entries = crc32c(entry.data(), entry.size() * sizeof(float), entries);
    }
  }
  std::printf("%lld tokens: entries crc32c %08x, %lld decode steps' outputs crc32c %08x\n",
              static_cast<long long>(cache.tokens(seq)), entries, static_cast<long long>(steps), outputs);
}

}  // namespace

int main(int argc, char** argv) try {
  std::string mode, file;
  std::int64_t prompt = 2050, steps = 16;  // 2050 = 512 blocks of 4 and 2 pending tokens
  bool prompt_given = false, steps_given = false;
  cli::parser args("snapshot_handoff",
                   "Prefill in one process, snapshot the sequence to FILE, restore it in another and\n"
                   "decode; 'local' never moves it. decode and local print the same CRC line.");
  args.positional("MODE", "prefill (writes FILE), decode (reads FILE) or local (no FILE)", mode);
  args.positional("FILE", "the snapshot", file, false);
  // At most 128K prompt tokens: the prefill builds every token's inputs at once (about 12 KB each).
  args.option("--prompt", "N", "tokens prefilled (prefill, local), 0 to 131072", std::to_string(prompt),
              [&](const std::string& text) {
                prompt = cli::integer(text, std::int64_t{0}, std::int64_t{1} << 17);
                prompt_given = true;
              });
  args.option("--steps", "N", "decode steps (decode, local), 0 to 65536", std::to_string(steps),
              [&](const std::string& text) {
                steps = cli::integer(text, std::int64_t{0}, std::int64_t{1} << 16);
                steps_given = true;
              });
  args.parse(argc, argv);
  const bool has_file = mode == "prefill" || mode == "decode";
  if (!has_file && mode != "local") args.fail("MODE '" + mode + "' must be one of prefill, decode, local");
  if (has_file == file.empty()) args.fail(has_file ? mode + " needs a FILE" : "local takes no FILE");
  // An option the mode ignores is a mistake worth naming (e.g. --steps on the prefill node).
  if (mode == "prefill" && steps_given) args.fail("--steps is for decode and local; prefill does not decode");
  if (mode == "decode" && prompt_given) args.fail("--prompt is for prefill and local; decode's prompt is in FILE");

  if (mode == "local") {
    csa_cache cache = make_cache(64, prompt + steps);
    const sequence_id seq = cache.create();
    append_tokens(cache, seq, prompt);
    decode(cache, seq, steps);
  } else if (mode == "prefill") {
    csa_cache cache = make_cache(64, prompt);
    const sequence_id seq = cache.create();
    append_tokens(cache, seq, prompt);
    const std::vector<std::byte> bytes = snapshot(cache, seq);
    std::ofstream out(file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write " + file);
    std::printf("prefill: %lld tokens, snapshot of %zu bytes written to %s\n", static_cast<long long>(prompt),
                bytes.size(), file.c_str());
  } else {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + file);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    csa_cache cache = make_cache(16, 1 << 17);  // another page size and capacity than the prefill's
    const sequence_id seq =
        restore(cache, span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
    decode(cache, seq, steps);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "snapshot_handoff: %s\n", e.what());
  return 1;
}
