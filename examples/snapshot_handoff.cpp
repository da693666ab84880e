// Moving a prefilled sequence between processes, as a disaggregated engine moves it from a
// prefill node to a decode node (models/model_snapshot.hpp). A DeepSeek-V4-shaped model behind the
// front door — window-only, CSA (tied 512-channel K/V plus a 128-channel indexer, S=4, W=8) and HCA
// (S=W=128) layers, 128-token raw windows, --layers of them — at DeepSeek-V4's precision:
//
//   snapshot_handoff prefill FILE [--prompt N]    prefill N tokens (2050), write the model snapshot to FILE
//   snapshot_handoff decode FILE [--steps N]      restore FILE into a fresh model (another page size,
//                                                 page count and history), then decode N steps (16)
//   snapshot_handoff local [--prompt N] [--steps N]   prefill and decode in one model, never moved
//
// `decode` and `local` end with the same line — a CRC-32C of every layer's entries and of every
// decode step's attention outputs — because a restored sequence continues bit-identically. The
// inputs stand in for the host's projections: a pure function of the token position, so both
// processes see the same token t whatever chunks it arrives in.

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

// The model on either node: the same spec; the page size, page count and history are the node's.
model_cache make_model(std::int64_t layers, std::int64_t page_size, std::int64_t tokens, std::int64_t history) {
  model_spec spec = presets::deepseek_v4_shaped(static_cast<std::size_t>(layers), true);
  for (layer_kind& kind : spec.kinds) kind.page_size = page_size;
  model_options options;
  options.pages = tokens / 4 / page_size + 2;  // enough for the CSA kind, the densest
  options.history = history;
  return model_cache(spec, options);
}

// One step of n tokens: every layer's inputs a function of (token, layer, stream); the last token
// read in every layer when `outputs` is given (its CRC-32C accumulated).
void step(model_cache& model, sequence_id seq, std::int64_t n, std::uint32_t* outputs) {
  const std::int64_t t0 = model.tokens(seq);
  model_step s = model.begin({seq}, n);
  for (std::size_t l = 0; l < model.layers(); ++l) {
    std::vector<std::vector<float>> in;
    std::vector<token_chunk> chunks;
    for (std::size_t k = 0; k < model.shape(l).streams.size(); ++k) {
      const stream_kernel& stream = model.stream(l, k);
      in.push_back(inputs(t0, n, 10 * l + 2 * k + 1, stream.payload_floats_per_token()));
      in.push_back(inputs(t0, n, 10 * l + 2 * k + 2, stream.logit_floats_per_token()));
    }
    for (std::size_t k = 0; k < in.size(); k += 2) chunks.push_back({n, in[k], in[k + 1]});
    const std::vector<float> window_keys = inputs(t0, n, 10 * l + 9, 512);
    s.append(l, {layer_append{chunks, window_keys, {}}});
    if (!outputs) continue;
    const std::int64_t t = t0 + n - 1;
    const reader_config& rc = model.reader(l);
    const auto queries = inputs(t, 1, 1000 + l, 64 * 512);
    std::vector<float> index_queries, weights;
    if (rc.top_k > 0) {
      index_queries = inputs(t, 1, 2000 + l, 64 * 128);
      weights = inputs(t, 1, 3000 + l, 64);
      for (float& w : weights) w = 0.5f * (w + 1.0f);
      presets::deepseek_scale_indexer_weights(weights);  // DeepSeek's index_head_dim^-0.5 · heads^-0.5
    }
    const auto sinks = inputs(t, 1, 4000 + l, 64);
    std::vector<float> out(64 * 512);
    layer_read read;
    read.request = read_request{t, queries, index_queries, weights, sinks};
    read.out = out.data();
    s.read(l, {&read, 1});
    *outputs = crc32c(out.data(), out.size() * sizeof(float), *outputs);
  }
  s.commit();
}

// Decodes `steps` tokens and prints the CRC-32C of every layer's entries and of the attention outputs.
void decode(model_cache& model, sequence_id seq, std::int64_t steps) {
  std::uint32_t outputs = 0, entries = 0;
  for (std::int64_t i = 0; i < steps; ++i) step(model, seq, 1, &outputs);
  for (std::size_t l = 0; l < model.layers(); ++l)
    for (std::size_t k = 0; k < model.shape(l).streams.size(); ++k) {
      const stream_shape& st = model.shape(l).streams[k];
      std::vector<float> entry(static_cast<std::size_t>(st.kv_heads * st.channels));
      for (std::int64_t j = 0; j < model.shape(l).geom.completed_entries(model.tokens(seq)); ++j) {
        model.read_entry(l, k, seq, j, span<float>(entry.data(), entry.size()));
        entries = crc32c(entry.data(), entry.size() * sizeof(float), entries);
      }
    }
  std::printf("%lld tokens in %zu layers: entries crc32c %08x, %lld decode steps' outputs crc32c %08x\n",
              static_cast<long long>(model.tokens(seq)), model.layers(), entries, static_cast<long long>(steps), outputs);
}

}  // namespace

int main(int argc, char** argv) try {
  std::string mode, file;
  std::int64_t prompt = 2050, steps = 16, layers = 6;  // 2050 = 512 blocks of 4 and 2 pending tokens
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
  args.integer("--layers", "N", "layers of the model on both nodes (2 window-only, then CSA and HCA)", layers, 1, 61);
  args.parse(argc, argv);
  const bool has_file = mode == "prefill" || mode == "decode";
  if (!has_file && mode != "local") args.fail("MODE '" + mode + "' must be one of prefill, decode, local");
  if (has_file == file.empty()) args.fail(has_file ? mode + " needs a FILE" : "local takes no FILE");
  // An option the mode ignores is a mistake worth naming (e.g. --steps on the prefill node).
  if (mode == "prefill" && steps_given) args.fail("--steps is for decode and local; prefill does not decode");
  if (mode == "decode" && prompt_given) args.fail("--prompt is for prefill and local; decode's prompt is in FILE");

  if (mode == "local") {
    model_cache model = make_model(layers, 64, prompt + steps, 0);
    const sequence_id seq = model.create();
    step(model, seq, prompt, nullptr);
    decode(model, seq, steps);
  } else if (mode == "prefill") {
    model_cache model = make_model(layers, 64, prompt, 0);
    const sequence_id seq = model.create();
    step(model, seq, prompt, nullptr);  // one chunk: its reads would need no history either
    const std::vector<std::byte> bytes = snapshot(model, seq);
    std::ofstream out(file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write " + file);
    std::printf("prefill: %lld tokens, model snapshot of %zu bytes (%zu layers) written to %s\n",
                static_cast<long long>(prompt), bytes.size(), model.layers(), file.c_str());
  } else {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + file);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Another page size, page count and history than the prefill node's.
    model_cache model = make_model(layers, 16, 1 << 17, 8);
    const sequence_id seq =
        restore(model, span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
    decode(model, seq, steps);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "snapshot_handoff: %s\n", e.what());
  return 1;
}
