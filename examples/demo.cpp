// phasekv demo: compress one synthetic sequence with each pooling policy and show what the
// write path produced — entries, bytes saved, and the gate weight each phase receives.
//
//   demo [--tokens N] [--stride S] [--window W] [--channels C] [--seed K]
//
// The hidden states are random; the learned parts (projections, gate biases) are random too,
// so the gated rows show what an untrained gate does. The DeepSeek-V4 CSA row uses the preset's
// own shape (S=4, W=8, 512 channels) whatever the options say.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <phasekv/phasekv.hpp>

#include "cli.hpp"
#include "projection.hpp"

namespace {

struct options {
  std::int64_t tokens = 4096;
  std::int64_t stride = 4;
  std::int64_t window = 8;
  std::int64_t channels = 128;
  std::int64_t hidden = 64;
  unsigned seed = 7;
};

// Ranges keep one run within a few GB and minutes (at most 256K tokens of at most 1024 channels);
// the compressors check the rest (e.g. a window below the stride) and name what is wrong.
options parse(int argc, char** argv) {
  options o;
  cli::parser args("demo", "Compresses one random sequence with each pooling policy and shows the entries, the\n"
                           "bytes saved and the gate weight each phase receives.");
  args.integer("--tokens", "N", "tokens in the sequence", o.tokens, 1, 1 << 18);
  args.integer("--stride", "S", "a new entry every S tokens", o.stride, 1, 1024);
  args.integer("--window", "W", "tokens pooled into each entry", o.window, 1, 4096);
  args.integer("--channels", "C", "channels of each entry", o.channels, 2, 1024);
  args.integer("--seed", "K", "seed of the random tokens and weights", o.seed, 0, ~0u);
  args.parse(argc, argv);
  try {  // before any row is printed, so a bad pair fails as a usage error, not half-way
    phasekv::geometry{o.stride, o.window}.validate();
  } catch (const phasekv::error& e) {
    args.fail(e.what());
  }
  return o;
}

// Compresses `hidden` with one compressor and prints one table row plus its phase profile.
template <class Compressor>
void run(const char* label, const Compressor& compressor, const phasekv_examples::row_matrix& hidden, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  auto draw = [&] { return normal(rng); };
  const auto projection = phasekv_examples::stream_projection::random(
      compressor, hidden.cols(), draw, 1.0f / std::sqrt(static_cast<float>(hidden.cols())));

  std::vector<float> payload, logits;
  const phasekv::token_chunk chunk = projection.project(compressor, hidden, payload, logits);
  phasekv::stream_state state = compressor.make_state();
  phasekv::diag::write_profile profile(compressor.geom(), compressor.config().kv_heads);
  std::vector<float> first_entry;
  phasekv::append_options opts;
  opts.slot_weights = true;
  opts.check_finite = true;
  compressor.append(state, chunk, [&](const phasekv::entry_view& e) {
    if (first_entry.empty()) first_entry.assign(e.values, e.values + e.channels);
    profile(e);
  }, opts);

  const auto& g = compressor.geom();
  const std::int64_t C = compressor.config().channels, H = compressor.config().kv_heads;
  const double raw = static_cast<double>(state.tokens() * H * C) * sizeof(float);
  const double packed = static_cast<double>(state.entries() * H * C) * sizeof(float);
  std::printf("%-28s S=%-3lld W=%-3lld C=%-4lld %7lld tokens -> %6lld entries  %8.1f KiB -> %7.1f KiB (%.2fx)\n",
              label, static_cast<long long>(g.stride), static_cast<long long>(g.window), static_cast<long long>(C),
              static_cast<long long>(state.tokens()), static_cast<long long>(state.entries()), raw / 1024,
              packed / 1024, raw / packed);
  std::printf("    entry 0, first channels:");
  // Fewer tokens than one block leave no entry, and --channels may be below 4.
  if (first_entry.empty()) std::printf(" none (no complete entry)");
  for (std::size_t c = 0; c < std::min<std::size_t>(4, first_entry.size()); ++c) std::printf(" %+.4f", first_entry[c]);
  std::printf("\n    weight received by phase:");
  for (const auto& p : profile.by_phase(0)) std::printf(" %lld:%.3f", static_cast<long long>(p.phase), p.mean_weight);
  std::printf("\n    coverage by phase:       ");
  for (const auto& p : profile.by_phase(0)) std::printf(" %lld:%.1f", static_cast<long long>(p.phase), p.coverage);
  std::printf("\n    gate concentration (effective offsets of %lld): static %.2f, per window %.2f\n",
              static_cast<long long>(g.window), profile.static_concentration(0), profile.window_concentration(0));
}

}  // namespace

int main(int argc, char** argv) try {
  using namespace phasekv;
  const options o = parse(argc, argv);
  std::mt19937 rng(o.seed);
  std::normal_distribution<float> normal;

  phasekv_examples::row_matrix hidden(o.tokens, o.hidden);
  for (Eigen::Index k = 0; k < hidden.size(); ++k) hidden.data()[k] = normal(rng);

  geometry g{o.stride, o.window};
  geometry g_eq{o.stride, o.stride};
  stream_config cfg;
  cfg.name = "demo";
  cfg.channels = o.channels;
  cfg.rope.channels = std::min<std::int64_t>(64, o.channels - o.channels % 2);

  stream_params gated_params;  // random per-slot biases, like an untrained `ape`
  for (std::int64_t k = 0; k < g.window * o.channels; ++k) gated_params.slot_bias.push_back(normal(rng));
  stream_params one_hot;  // all weight on the last slot (the block's final token)
  one_hot.slot_profile.assign(static_cast<std::size_t>(g.window), 0.0f);
  one_hot.slot_profile.back() = 1.0f;

  std::printf("phasekv demo: %lld random tokens, hidden size %lld, seed %u\n\n", static_cast<long long>(o.tokens),
              static_cast<long long>(o.hidden), o.seed);
  run("mean pool, W = S", stream_compressor<compressor_policy<mean_pool>>(g_eq, cfg), hidden, rng);
  run("mean pool", stream_compressor<compressor_policy<mean_pool>>(g, cfg), hidden, rng);
  run("mean pool, RoPE before", stream_compressor<compressor_policy<mean_pool, rope_before_pool>>(g, cfg), hidden, rng);
  run("vector gates + bias", stream_compressor<compressor_policy<vector_gated_pool>>(g, cfg, gated_params), hidden, rng);
  stream_params scalar_params;
  for (std::int64_t k = 0; k < g.window; ++k) scalar_params.slot_bias.push_back(normal(rng));
  run("scalar gates + bias", stream_compressor<compressor_policy<scalar_gated_pool>>(g, cfg, scalar_params), hidden,
      rng);
  run("fixed one-hot (last slot)", stream_compressor<compressor_policy<fixed_weight_pool>>(g, cfg, one_hot), hidden,
      rng);
  run("DeepSeek-V4 CSA preset",
      stream_compressor<presets::deepseek_v4_csa_policy>(presets::deepseek_v4_csa_layer.geom,
                                                         presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer)),
      hidden, rng);
  std::printf("\nA token's total weight is what its phase gets from compression: mean pooling with W = S\n"
              "gives every phase 1/S of one entry; gates move weight between phases. Gate concentration\n"
              "is the study's effective number of offsets: W for uniform pooling, 1 for a one-hot gate.\n");
  return 0;
} catch (const phasekv::error& e) {
  std::fprintf(stderr, "demo: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {  // e.g. std::bad_alloc: a message, not an abort
  std::fprintf(stderr, "demo: %s\n", e.what());
  return 1;
}
