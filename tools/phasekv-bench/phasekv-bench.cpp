// phasekv-bench: microbenchmarks of one layer configuration — a preset, or a stride, window,
// policy, shape, storage and indexer of your own — against this machine's roofline, measured in
// the same run (phasekv::bench::run, include/phasekv/tools/bench.hpp): prefill and decode writes
// of every stream, a read at the end of a long context, and a batched read. It prints a table, or
// JSON (--json, "phasekv.bench/2": the configuration as fields, the environment — version, compiler,
// flags, kernels, CPU, command line, date — and per figure the median time of --repetitions runs,
// their range, time per token, bytes per token and fraction of its floor). --json to a file that
// cannot be written fails before anything is measured.
//
//   phasekv-bench                                   # the DeepSeek-V4 CSA preset, as bench/run_all measures it
//   phasekv-bench --preset deepseek_v4_hca_precision --context 32768
//   phasekv-bench --stride 8 --window 16 --policy max --channels 256 --indexer none --json out.json
//   phasekv-bench --smoke                           # every measurement, tiny, in about two seconds
//
// The layer is a layer kind (models/layer_kind.hpp) measured through the model front door, its
// pooling an id of phasekv-bench's registry (tools/phasekv-bench/poolings.hpp): mean,
// vector_gates and deepseek_v4 (vector gates, RMSNorm, RoPE after pooling) are phasekv's; max and
// nsa_mlp are poolings of the host's (examples/pools/), registered as a host registers its own. With
// --indexer other than none the layer has an indexer stream of the same pooling and the reader
// selects the top k entries by it. Figures for the DeepSeek-V4 presets agree with bench/run_all's
// within noise: the same workloads, kernels and floors.

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <phasekv/engine.hpp>
#include <phasekv/tools/bench.hpp>

#include "cli.hpp"
#include "poolings.hpp"

#ifndef PHASEKV_BENCH_FLAGS  // the compile flags, as examples/CMakeLists.txt states them
#define PHASEKV_BENCH_FLAGS ""
#endif

namespace {

using namespace phasekv;
enum class policy_choice { mean, vector_gates, deepseek_v4, max, nsa_mlp };
enum class indexer_choice { none, f32, bf16, fp4 };

// The pooling id the policy is registered under (phasekv_bench::poolings()).
const char* policy_name(policy_choice p) {
  switch (p) {
    case policy_choice::mean: return "mean";
    case policy_choice::vector_gates: return "vector_gates";
    case policy_choice::deepseek_v4: return "deepseek_v4";
    case policy_choice::max: return "max";
    case policy_choice::nsa_mlp: return "nsa_mlp";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) try {
  std::string preset = "deepseek_v4_csa";
  std::int64_t stride = 4, window = 8, origin = 0, channels = 512, heads = 1, query_heads = 64, rope = 64;
  std::int64_t indexer_channels = 128, indexer_heads = 64, top_k = 512, window_tokens = 128, page_size = 64;
  policy_choice policy = policy_choice::deepseek_v4;
  storage_type storage = storage_type::f32;
  indexer_choice indexer = indexer_choice::f32;
  bench::run_config rc;
  std::int64_t threads = 1, min_time_ms = 300, repetitions = rc.repetitions;
  bool smoke = false, quiet = false, bf16_inputs = false;
  std::string json;

  cli::parser args("phasekv-bench",
                   "Microbenchmarks of one layer configuration against this machine's roofline, measured in the same\n"
                   "run: prefill and decode writes, a read and a batched read (time, bytes per token, fraction of the\n"
                   "floor). A preset, or a configuration from the shape options (which replace the preset).");
  std::set<std::string> given;  // options on the command line, to tell a preset from a configuration
  auto track = [&](const std::string& name) { given.insert(name); };
  args.choice("--preset", "a layer preset (the default unless a shape option is given)", preset,
              {{"deepseek_v4_csa", std::string("deepseek_v4_csa")},
               {"deepseek_v4_csa_precision", std::string("deepseek_v4_csa_precision")},
               {"deepseek_v4_hca", std::string("deepseek_v4_hca")},
               {"deepseek_v4_hca_precision", std::string("deepseek_v4_hca_precision")},
               {"deepseek_v4_1_csa", std::string("deepseek_v4_1_csa")},
               {"deepseek_v4_1_csa_precision", std::string("deepseek_v4_1_csa_precision")},
               {"nsa", std::string("nsa")}});
  const std::vector<std::string> shape_options = {"--stride", "--window", "--origin", "--policy", "--channels", "--heads",
                                                  "--query-heads", "--storage", "--indexer", "--indexer-channels",
                                                  "--indexer-heads", "--top-k", "--window-tokens", "--rope-channels",
                                                  "--page-size"};
  args.integer("--stride", "S", "shape: stride", stride, 1, 4096);
  args.integer("--window", "W", "shape: window", window, 1, 4096);
  args.integer("--origin", "O", "shape: origin of the blocks", origin, 0, 4095);
  args.choice("--policy", "shape: pooling (max, nsa_mlp: poolings of the host's, examples/pools/)", policy,
              {{"mean", policy_choice::mean},
               {"vector_gates", policy_choice::vector_gates},
               {"deepseek_v4", policy_choice::deepseek_v4},
               {"max", policy_choice::max},
               {"nsa_mlp", policy_choice::nsa_mlp}});
  args.integer("--channels", "C", "shape: K/V channels per head", channels, 1, 8192);
  args.integer("--heads", "H", "shape: KV heads", heads, 1, 256);
  args.integer("--query-heads", "Q", "shape: query heads (a multiple of the KV heads)", query_heads, 1, 1024);
  args.choice("--storage", "shape: how K/V entries are stored", storage,
              {{"f32", storage_type::f32},
               {"bf16", storage_type::bf16},
               {"f16", storage_type::f16},
               {"fp8", storage_type::fp8_e4m3_block}});
  args.choice("--indexer", "shape: indexer precision, or none (read every entry)", indexer,
              {{"none", indexer_choice::none}, {"f32", indexer_choice::f32}, {"bf16", indexer_choice::bf16}, {"fp4", indexer_choice::fp4}});
  args.integer("--indexer-channels", "C", "shape: indexer key channels", indexer_channels, 1, 8192);
  args.integer("--indexer-heads", "N", "shape: indexer query heads", indexer_heads, 1, 1024);
  args.integer("--top-k", "K", "shape: entries the indexer selects", top_k, 1, 1 << 20);
  args.integer("--window-tokens", "N", "shape: raw window tokens (0: none)", window_tokens, 0, 1 << 20);
  args.integer("--rope-channels", "R", "shape: RoPE channels (deepseek_v4 policy)", rope, 0, 8192);
  args.integer("--page-size", "N", "shape: entries per page", page_size, 1, 1 << 16);
  args.integer("--context", "N", "tokens of the read's sequence (0: no read)", rc.context, 0, 1 << 26);
  args.integer("--batch", "N", "sequences of the batched read (0: none)", rc.batch, 0, 4096);
  args.integer("--batch-context", "N", "tokens of each batched sequence", rc.batch_context, 2, 1 << 24);
  args.integer("--prefill", "N", "tokens of the prefill write (0: none)", rc.prefill_tokens, 0, 1 << 24);
  args.integer("--decode", "N", "one-token appends of the decode write (0: none)", rc.decode_tokens, 0, 1 << 24);
  args.flag("--bf16-inputs", "the prefill's payload and logits as bf16 bits", bf16_inputs);
  args.integer("--threads", "N", "threads the reads run on (OpenMP)", threads, 1, 1024);
  args.integer("--min-time", "MS", "milliseconds each figure is timed for, at least, over all its repetitions",
               min_time_ms, 0, 3600000);
  args.integer("--repetitions", "N", "timed runs of each figure: its time is their median, their range its spread",
               repetitions, 1, 1000);
  args.option("--json", "FILE", "write the results as JSON to FILE ('-': stdout, instead of the table)", "none",
              [&](const std::string& v) {
                if (v.empty()) throw cli::bad_value("is not a file name");
                json = v;
              });
  args.flag("--smoke", "every measurement, tiny (context 2048, batch 2 x 1024, prefill 1024, decode 64, 10 ms)", smoke);
  args.flag("--quiet", "no progress and no machine lines on stderr", quiet);
  for (int k = 1; k < argc; ++k) {
    const std::string word = argv[k];
    track(word.substr(0, word.find('=')));
  }
  args.parse(argc, argv);

  bool shaped = false;
  for (const std::string& o : shape_options) shaped = shaped || given.count(o);
  if (shaped && given.count("--preset"))
    args.fail("--preset and the shape options (--stride, --policy, …) exclude each other: give one or the other");
  if (smoke) {  // tiny, but every measurement; explicit options win
    if (!given.count("--context")) rc.context = 2048;
    if (!given.count("--batch")) rc.batch = 2;
    if (!given.count("--batch-context")) rc.batch_context = 1024;
    if (!given.count("--prefill")) rc.prefill_tokens = 1024;
    if (!given.count("--decode")) rc.decode_tokens = 64;
    if (!given.count("--min-time")) min_time_ms = 10;
  }
  rc.min_time = static_cast<double>(min_time_ms) * 1e-3;
  rc.repetitions = repetitions;
  // The output file must be writable before minutes are spent measuring: opened for appending, so
  // an existing file keeps its contents until the results replace them; a file created here for
  // the check is removed again.
  if (!json.empty() && json != "-") {
    const bool existed = static_cast<bool>(std::ifstream(json));
    if (!std::ofstream(json, std::ios::app)) args.fail("--json '" + json + "': cannot write to this file");
    if (!existed) std::remove(json.c_str());
  }
  rc.bf16_inputs = bf16_inputs;
  rc.threads = threads;
  openmp_executor pool(static_cast<int>(threads));
  if (threads > 1) {
    if (pool.concurrency() < threads) args.fail("--threads " + std::to_string(threads) + ": built without OpenMP");
    rc.reads_on = &pool;
  }
  if (quiet) bench::limits_log() = nullptr;
  else rc.progress = [](const std::string& line) { std::fprintf(stderr, "phasekv-bench: %s\n", line.c_str()); };

  layer_kind kind;
  std::string name;
  if (!shaped) {
    if (preset == "nsa") {
      policy = policy_choice::nsa_mlp;
      kind.name = "nsa";
      kind.geom = presets::nsa_compressed_geometry();
      stream_spec kv;
      kv.config.name = "nsa.kv";
      kv.config.channels = 128;
      kv.pooling = "nsa_mlp";
      kind.streams = {kv};
      kind.reader.name = "nsa.reader";
      kind.reader.query_heads = 64;
      name = "preset nsa: NSA's compressed branch (S=16, W=32), its MLP compressor (examples/pools/nsa_mlp_pool.hpp), "
             "128 channels, 64 query heads, every entry read";
    } else {
      const bool precision = preset.find("_precision") != std::string::npos;
      const presets::deepseek_layer& layer = preset.rfind("deepseek_v4_1_csa", 0) == 0 ? presets::deepseek_v4_1_csa_layer
                                             : preset.rfind("deepseek_v4_hca", 0) == 0 ? presets::deepseek_v4_hca_layer
                                                                                       : presets::deepseek_v4_csa_layer;
      policy = policy_choice::deepseek_v4;
      kind = presets::deepseek_kind(layer, precision);
      for (stream_spec& st : kind.streams) st.pooling = "deepseek_v4";  // the policy compiled under that id
      name = "preset " + preset;
    }
  } else {
    kind.name = "bench";
    kind.geom = geometry{stride, window, origin, anchor_mode::block_start};
    stream_spec kv;
    kv.config.name = "kv";
    kv.config.channels = channels;
    kv.config.kv_heads = heads;
    kv.pooling = policy_name(policy);
    kv.storage = storage;
    const bool rotates = policy == policy_choice::deepseek_v4 && rope > 0;
    if (policy == policy_choice::deepseek_v4) {
      kv.rope = rope_placement::after_pool;
      kv.norm = entry_norm::rms;
    }
    if (rotates) {
      kv.config.rope = presets::deepseek_v4_compressed_rope();
      kv.config.rope.channels = rope;
    }
    kind.streams = {kv};
    kind.page_size = page_size;
    kind.window = raw_window_config{window_tokens, heads, channels, 0};
    kind.reader.name = "bench.reader";
    kind.reader.query_heads = query_heads;
    kind.reader.sink = true;
    kind.reader.derotate_output = rotates;
    if (indexer != indexer_choice::none) {
      stream_spec ix = kv;
      ix.config.name = "indexer";
      ix.config.role = stream_role::indexer;
      ix.config.channels = indexer_channels;
      ix.config.kv_heads = 1;
      if (rotates) ix.config.rope.channels = std::min(rope, indexer_channels - indexer_channels % 2);
      ix.storage = indexer == indexer_choice::bf16  ? storage_type::bf16
                   : indexer == indexer_choice::fp4 ? storage_type::fp4_e2m1_hadamard
                                                    : storage_type::f32;
      kind.streams.push_back(ix);
      kind.reader.indexer_heads = indexer_heads;
      kind.reader.top_k = top_k;
      kind.reader.precision = indexer == indexer_choice::bf16  ? indexer_precision::bf16
                              : indexer == indexer_choice::fp4 ? indexer_precision::fp4
                                                               : indexer_precision::f32;
    }
    name = std::string("S=") + std::to_string(stride) + " W=" + std::to_string(window) + " origin=" +
           std::to_string(origin) + ", policy " + policy_name(policy) + ", " + std::to_string(heads) + "x" +
           std::to_string(channels) + " K/V in " + to_string(storage) + ", " + std::to_string(query_heads) +
           " query heads, " +
           (kind.streams.size() > 1 ? "indexer " + std::to_string(indexer_heads) + "x" + std::to_string(indexer_channels) +
                                          " (" + to_string(kind.streams[1].storage) + "), top " + std::to_string(top_k)
                                    : std::string("no indexer (every entry read)")) +
           ", window " + std::to_string(window_tokens) + ", pages of " + std::to_string(page_size);
  }
  name += "; threads " + std::to_string(threads) + (bf16_inputs ? ", bf16 inputs" : "");

  bench::results r = bench::run(kind, phasekv_bench::poolings(), rc, name);
  std::string command;
  for (int k = 0; k < argc; ++k) command += (k ? " " : "") + std::string(argv[k]);
  r.environment = bench::environment_of(command, PHASEKV_BENCH_FLAGS);
  r.set("preset", shaped ? std::string("null") : phasekv::detail::json_string(preset));
  r.set("policy", phasekv::detail::json_string(policy_name(policy)));
  if (json == "-") {
    std::fputs(r.json().c_str(), stdout);
  } else {
    std::fputs(r.table().c_str(), stdout);
    if (!json.empty()) {
      std::ofstream out(json);
      out << r.json();
      if (!out) {
        std::fprintf(stderr, "phasekv-bench: cannot write %s\n", json.c_str());
        return 1;
      }
    }
  }
  return 0;
} catch (const phasekv::error& e) {  // a configuration the library refuses: a bad command line
  std::fprintf(stderr, "phasekv-bench: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "phasekv-bench: %s\n", e.what());
  return 1;
}
