// The conformance kit (phasekv/testing/conformance.hpp) on a layer: by default a pooling policy of
// your own — max pooling (examples/pools/max_pool.hpp) on a geometry and shape from the command
// line, held to its double-precision oracle (the maximum of the window's real rows) — or, with
// --layer, a whole DeepSeek-V4 layer (models/deepseek_v4.hpp: K/V stream, indexer stream, raw
// window and top-k reader, in fp32 or at DeepSeek-V4's precision) with seeded learned gate biases
// and norm weights. Every property phasekv promises is checked — streaming ≡ prefill, round trips,
// origin and padding, entries, reads, the dense control, storage — and the report says what each
// exercised (selection dropping entries, the window ring wrapping, forks sharing pages). It exits
// 0 when every property held, 1 when one failed.
//
//   conformance [--stride S] [--window W] [--channels C] [--heads H] [--storage T] [--seed N]
//               [--thorough] [--drop-oldest-slot]
//   conformance --layer max|v4-csa|v4.1-csa|v4-hca [--precision] [--seed N] [--thorough]
//   … --front-door    the same properties, every operation through the model front door
//
// --drop-oldest-slot plants an off-by-one window in the policy (it skips a full window's first
// row), to show what the kit reports when something is wrong: the entries' oracle fails, and the
// counterexample is shrunk to the first full window.

#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <phasekv/phasekv.hpp>
#include <phasekv/testing/conformance.hpp>

#include "cli.hpp"
#include "pools/max_pool.hpp"

namespace {

// max_pool, or max_pool with an off-by-one: a full window's first row left out.
struct max_pool_under_test : phasekv_examples::max_pool {
  bool drop_oldest = false;
  void pool(const phasekv::window_rows& w, float* out) const {
    if (!drop_oldest || w.first_slot != 0 || w.count() < 2) return max_pool::pool(w, out);
    phasekv::window_rows shorter = w;  // the bug: one row too few
    ++shorter.first_slot;
    ++shorter.first_position;
    ++shorter.payload;
    if (shorter.slot_weights) ++shorter.slot_weights;
    max_pool::pool(shorter, out);
  }
};

// What max pooling is, in double: K̂[c] = max over the real rows of x[c].
phasekv::testing::pooled_head max_oracle(const phasekv::testing::oracle_window& w) {
  phasekv::testing::pooled_head p;
  p.values.assign(static_cast<std::size_t>(w.channels), -std::numeric_limits<double>::infinity());
  for (const auto& row : w.payload)
    for (std::size_t c = 0; c < row.size(); ++c) p.values[c] = std::max(p.values[c], row[c]);
  return p;
}

}  // namespace

// A DeepSeek-V4 layer's learned parameters per stream (K/V, then the indexer): gate biases in
// [-1, 1) and norm weights in [0.5, 1.5), drawn from `seed`.
std::vector<phasekv::stream_params> deepseek_parameters(const phasekv::presets::deepseek_layer& layer, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto draw = [&](std::size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
  };
  const auto preset = phasekv::presets::deepseek_preset(layer, 1);
  std::vector<phasekv::stream_params> out;
  for (const phasekv::stream_config* c : {&preset.kv, preset.indexer ? &*preset.indexer : nullptr}) {
    if (c == nullptr) continue;
    phasekv::stream_params p;
    const std::size_t slots = static_cast<std::size_t>(c->kv_heads * layer.geom.window);  // vector gates
    p.slot_bias = draw(slots * static_cast<std::size_t>(c->channels), -1.0f, 1.0f);
    p.norm_weight = draw(static_cast<std::size_t>(c->channels), 0.5f, 1.5f);
    out.push_back(std::move(p));
  }
  return out;
}

int main(int argc, char** argv) try {
  using namespace phasekv;
  std::int64_t stride = 4, window = 8, channels = 32, heads = 2;
  std::uint64_t seed = 1;
  storage_type storage = storage_type::f32;
  bool thorough = false, drop_oldest = false, precision = false, front_door = false;
  const presets::deepseek_layer* layer_preset = nullptr;
  cli::parser args("conformance", "The conformance kit on max pooling, a pooling policy of the host's (examples/pools/),\n"
                                  "or on a whole DeepSeek-V4 layer (--layer).\n"
                                  "Exits 0 when every property holds, 1 when one fails (the report says which).");
  args.integer("--stride", "S", "stride", stride, 1, 256);
  args.integer("--window", "W", "window", window, 1, 1024);
  args.integer("--channels", "C", "channels per KV head", channels, 1, 4096);
  args.integer("--heads", "H", "KV heads", heads, 1, 64);
  args.choice("--storage", "how entries are stored", storage,
              {{"f32", storage_type::f32}, {"bf16", storage_type::bf16}, {"f16", storage_type::f16}, {"fp8", storage_type::fp8_e4m3_block}});
  args.integer("--seed", "N", "seed of the cases", seed, std::uint64_t{0});
  args.flag("--thorough", "run long: twenty times the cases on sequences four times as long", thorough);
  args.flag("--drop-oldest-slot", "plant an off-by-one window in the policy", drop_oldest);
  args.choice("--layer", "max pooling (max) or a whole DeepSeek-V4 layer (K/V, indexer, window, reader)", layer_preset,
              {{"max", nullptr},
               {"v4-csa", &presets::deepseek_v4_csa_layer},
               {"v4.1-csa", &presets::deepseek_v4_1_csa_layer},
               {"v4-hca", &presets::deepseek_v4_hca_layer}});
  args.flag("--precision", "with --layer: DeepSeek-V4's precision (FP8 entries and window, FP4 indexer)", precision);
  args.flag("--front-door", "every operation through the model front door (the layer as a one-layer model_cache)",
            front_door);
  args.parse(argc, argv);

  testing::options options = testing::options::from_environment();
  options.seed = seed;
  if (thorough) options.effort = testing::effort::thorough;
  options.front_door = front_door;
  if (layer_preset != nullptr) {
    if (drop_oldest) throw input_error("--drop-oldest-slot plants a bug in max pooling; it does not go with --layer");
    const testing::report report =
        testing::check_preset(*layer_preset, precision, deepseek_parameters(*layer_preset, seed), options);
    std::fputs(report.to_string().c_str(), stdout);
    return report.passed() ? 0 : 1;
  }
  if (precision) throw input_error("--precision is for --layer");

  using stream = stream_compressor<compressor_policy<max_pool_under_test>>;
  const geometry g{stride, window};
  stream_config config;
  config.name = "max";
  config.channels = channels;
  config.kv_heads = heads;
  max_pool_under_test pool;
  pool.drop_oldest = drop_oldest;

  cache_config cache;
  cache.name = "max.cache";
  cache.page_size = 4;
  cache.storage = storage;
  cache.window = raw_window_config{window, heads, channels, 0};
  reader_config reader;
  reader.name = "max.reader";
  reader.query_heads = 2 * heads;
  reader.sink = true;

  testing::layer_under_test<stream> layer(layer_compressor<stream>(stream(g, config, {}, pool)), cache, reader);
  layer.oracles[0] = max_oracle;

  const testing::report report = testing::check(layer, options);
  std::fputs(report.to_string().c_str(), stdout);
  return report.passed() ? 0 : 1;
} catch (const phasekv::error& e) {
  std::fprintf(stderr, "conformance: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "conformance: %s\n", e.what());
  return 1;
}
