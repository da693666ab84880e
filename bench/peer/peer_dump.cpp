// Writes the inputs and phasekv's outputs of the benchmarked steps to raw files, so that the
// PyTorch peer (peer.py) can recompute the same maths from the same numbers and be timed on the
// same shapes. Not a benchmark: bench/peer/run calls it once per comparison.
//
//   peer_dump OUT_DIR [--contexts 4096,131072]
//
// Cases (bench_read.cpp's shape, inputs and dense baseline come from ../decode_workload.hpp, which
// both programs include; bench_write.cpp's shapes and generators are re-created here, because that
// file keeps its setup private):
//   write_csa_kv, write_csa_indexer   the DeepSeek-V4 CSA preset's two streams, a prefill of 32768
//                                     tokens: payload, logits, slot bias, norm weight, entries.
//   sparse_ctx<N>                     one decode step of bench_read's BM_sparse_decode (page 64):
//                                     both streams' entries as the cache stores them, the raw
//                                     window rows, queries, indexer queries/weights, sinks, and
//                                     the reader's output and selection.
//   sparse_bf16_indexer_ctx131072     the same step of BM_sparse_decode_bf16_indexer: indexer
//                                     keys stored and scored in bf16 (dumped as their exact fp32
//                                     values); the peer rounds the indexer queries to bf16.
//   dense_ctx<N>                      bench_read's dense baseline over the first N raw tokens.
//
// Files: OUT_DIR/<case>.<array>.bin, raw little-endian float32 / int64 / float64, row-major, and
// OUT_DIR/manifest.json naming each array's file, dtype and shape, plus each case's parameters.
// The dense cases share one key/value file of the largest context (a context of N reads its first
// N rows, as in bench_read), so it is written once.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

// Only the parts it uses: the preset, the write path, the cache and the reader.
#include <phasekv/cache/paged_cache.hpp>
#include <phasekv/compress/presets.hpp>
#include <phasekv/compress/stream_compressor.hpp>
#include <phasekv/core/rope.hpp>
#include <phasekv/read/sparse_reader.hpp>

#include "../decode_workload.hpp"

namespace {

using namespace phasekv;
using namespace bench;  // decode_workload.hpp: bench_read's shape, inputs and dense baseline

// ---- shapes beyond decode_workload.hpp's -------------------------------------------------

constexpr std::int64_t kBf16IndexerContext = 131072;  // the context of BM_sparse_decode_bf16_indexer
constexpr std::int64_t kPageSize = 64;   // the page size of BM_sparse_decode/.../page:64
constexpr std::int64_t kPrefill = 32768;  // bench_write's prefill: keep the two equal

// ---- output ------------------------------------------------------------------------------

// Every .bin written is also described in the manifest; this collects those descriptions.
class dump_writer {
 public:
  explicit dump_writer(std::string dir) : dir_(std::move(dir)) {}

  void begin_case(const std::string& name, const std::string& kind) {
    if (!cases_.empty()) cases_ += ",\n";
    cases_ += "    {\"name\": \"" + name + "\", \"kind\": \"" + kind + "\", \"params\": {";
    name_ = name;
    first_param_ = true;
    arrays_.clear();
  }
  void param(const std::string& key, double value) {
    std::ostringstream s;
    s.precision(17);
    s << value;
    raw_param(key, s.str());
  }
  void param(const std::string& key, std::int64_t value) { raw_param(key, std::to_string(value)); }
  void param(const std::string& key, const std::string& value) { raw_param(key, "\"" + value + "\""); }
  void param(const std::string& key, bool value) { raw_param(key, value ? "true" : "false"); }

  // Writes the elements as <case>.<array>.bin, or as `file` when given (a file other cases share).
  template <class T>
  void array(const std::string& array, const T* data, const std::vector<std::int64_t>& shape,
             std::string file = "") {
    if (file.empty()) file = name_ + "." + array + ".bin";
    std::int64_t count = 1;
    for (std::int64_t d : shape) count *= d;
    std::ofstream out(dir_ + "/" + file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(count * sizeof(T)));
    if (!out) throw std::runtime_error("peer_dump: cannot write " + dir_ + "/" + file);
    describe(array, file, dtype<T>(), shape);
  }
  void shared_array(const std::string& array, const std::string& file, const std::string& type,
                    const std::vector<std::int64_t>& shape) {
    describe(array, file, type, shape);
  }
  void end_case() { cases_ += "}, \"arrays\": {" + arrays_ + "}}"; }

  void write_manifest() const {
    std::ofstream out(dir_ + "/manifest.json");
    // Little-endian is the only byte order this program runs on (x86-64, aarch64); say so anyway.
    out << "{\n  \"format\": \"phasekv-peer-dump/1\",\n  \"byte_order\": \"little\",\n  \"cases\": [\n"
        << cases_ << "\n  ]\n}\n";
    if (!out) throw std::runtime_error("peer_dump: cannot write " + dir_ + "/manifest.json");
  }

 private:
  template <class T>
  static std::string dtype() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t>,
                  "the manifest knows float32, float64 and int64");
    if constexpr (std::is_same_v<T, float>) return "float32";
    else if constexpr (std::is_same_v<T, double>) return "float64";
    else return "int64";
  }
  void raw_param(const std::string& key, const std::string& json) {
    if (!first_param_) cases_ += ", ";
    cases_ += "\"" + key + "\": " + json;
    first_param_ = false;
  }
  void describe(const std::string& array, const std::string& file, const std::string& type,
                const std::vector<std::int64_t>& shape) {
    if (!arrays_.empty()) arrays_ += ", ";
    arrays_ += "\"" + array + "\": {\"file\": \"" + file + "\", \"dtype\": \"" + type + "\", \"shape\": [";
    for (std::size_t i = 0; i < shape.size(); ++i) arrays_ += (i ? ", " : "") + std::to_string(shape[i]);
    arrays_ += "]}";
  }

  std::string dir_, name_, cases_, arrays_;
  bool first_param_ = true;
};

// The RoPE settings (with YaRN) a peer needs to rebuild the rotation.
void rope_params_json(dump_writer& w, const rope_config& rope) {
  w.param("rope_channels", rope.channels);
  w.param("rope_base", rope.base);
  w.param("rope_layout", std::string(to_string(rope.layout)));
  w.param("yarn", rope.yarn.enabled);
  w.param("yarn_factor", rope.yarn.factor);
  w.param("yarn_original_context", rope.yarn.original_context);
  w.param("yarn_beta_fast", rope.yarn.beta_fast);
  w.param("yarn_beta_slow", rope.yarn.beta_slow);
}

// The stream configuration a peer needs to redo the maths (preset values, not hard-coded there).
void stream_params_json(dump_writer& w, const geometry& g, const stream_config& c) {
  w.param("stride", g.stride);
  w.param("window", g.window);
  w.param("origin", g.origin);
  w.param("anchor", std::string(to_string(g.anchor)));
  w.param("channels", c.channels);
  w.param("kv_heads", c.kv_heads);
  w.param("inputs", std::string(c.inputs == input_layout::per_branch ? "per_branch" : "per_slot"));
  w.param("norm_eps", c.norm_eps);
  rope_params_json(w, c.rope);
}

// ---- case: compression (bench_write's prefill/deepseek_v4_csa) ------------------------------

// One prefill of kPrefill tokens through one stream of the preset, as bench_write times it. The
// inputs are bench_write's (mt19937(1), standard normal, payload then logits); the learned
// parameters, which the benchmark leaves at their defaults (zero bias, unit norm weight), are
// random here so the check exercises them: the kernel does the same arithmetic either way (the
// default bias is a zero row it reads like any other).
void dump_write(dump_writer& w, const std::string& name, const stream_config& config, std::uint64_t param_seed) {
  const geometry geom = presets::deepseek_v4_csa_geometry();
  stream_params params;
  {
    std::mt19937 rng(param_seed);
    std::uniform_real_distribution<float> bias(-1.0f, 1.0f), weight(0.5f, 1.5f);
    params.slot_bias.resize(static_cast<std::size_t>(config.kv_heads * geom.window * config.channels));
    for (float& b : params.slot_bias) b = bias(rng);
    params.norm_weight.resize(static_cast<std::size_t>(config.channels));
    for (float& v : params.norm_weight) v = weight(rng);
  }
  const csa_stream stream(geom, config, params);

  std::vector<float> payload(static_cast<std::size_t>(kPrefill * stream.payload_floats_per_token()));
  std::vector<float> logits(static_cast<std::size_t>(kPrefill * stream.logit_floats_per_token()));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& v : payload) v = normal(rng);
  for (float& v : logits) v = normal(rng);

  const std::int64_t n_entries = geom.completed_entries(kPrefill);
  std::vector<float> entries(static_cast<std::size_t>(n_entries * stream.floats_per_entry()));
  std::vector<std::int64_t> anchors(static_cast<std::size_t>(n_entries));
  stream_state state = stream.make_state();
  const token_chunk chunk{kPrefill, span<const float>(payload), span<const float>(logits)};
  stream.append(state, chunk, [&](const entry_view& e) {
    std::copy_n(e.values, stream.floats_per_entry(), entries.data() + e.index * stream.floats_per_entry());
    anchors[static_cast<std::size_t>(e.index)] = e.anchor;
  });

  const std::int64_t heads = config.kv_heads, views = stream.views(), channels = config.channels;
  w.begin_case(name, "compress");
  w.param("tokens", kPrefill);
  stream_params_json(w, geom, config);
  w.param("benchmark", std::string(name == "write_csa_kv" ? "prefill/deepseek_v4_csa" : ""));
  w.array("payload", payload.data(), {kPrefill, heads, views, channels});
  w.array("logits", logits.data(), {kPrefill, heads, views, stream.gate_channels()});
  w.array("slot_bias", params.slot_bias.data(), {heads, geom.window, channels});
  w.array("norm_weight", params.norm_weight.data(), {channels});
  w.array("entries", entries.data(), {n_entries, heads, channels});
  w.array("anchors", anchors.data(), {n_entries});
  const rope_rotation rope(config.rope, channels);
  w.array("rope_inv_freq", rope.inverse_frequencies().data(), {rope.pairs()});
  w.end_case();
}

// ---- case: sparse decode (bench_read's BM_sparse_decode, page 64) ---------------------------

// bench_read's sparse_setup: decode_workload.hpp's sparse_workload, filled from the same seeds
// (and the same page size, which seeds the indexer's inputs), so the cache, the request and the
// reader's output are the benchmark's own.
// bf16_indexer: bench_read's BM_sparse_decode_bf16_indexer — indexer keys stored and scored in
// bf16; the dumped keys are their bf16 values (exact in fp32), the queries stay fp32 (the peer
// rounds them as the reader does).
void dump_sparse(dump_writer& w, std::int64_t tokens, bool bf16_indexer = false) {
  sparse_workload d("peer_dump", tokens, kPageSize, bf16_indexer);
  d.fill();
  const csa_cache& cache = d.cache;
  const sequence_id seq = d.seq;
  const read_request request = d.request();
  read_trace trace;
  d.reader.read(cache, seq, request, d.out.data(), &trace);

  // What the cache holds, through its public accessors: entry j of a stream is page
  // page_table[j / page_size], slot j % page_size, converted to fp32 (read_entry does exactly that
  // lookup); window rows by token.
  const geometry& geom = cache.compressors().geom();
  const std::int64_t candidates = geom.visible_entries(request.position);
  if (cache.entries(seq, 0) < candidates || cache.entries(seq, 1) < candidates || trace.candidates != candidates)
    throw std::logic_error("peer_dump: the cache holds fewer entries than the reader's candidates");
  std::vector<float> kv_entries(static_cast<std::size_t>(candidates * kChannels));
  std::vector<float> ix_entries(static_cast<std::size_t>(candidates * kIndexerChannels));
  for (std::int64_t j = 0; j < candidates; ++j) {
    cache.read_entry(seq, 0, j, kv_entries.data() + j * kChannels);
    cache.read_entry(seq, 1, j, ix_entries.data() + j * kIndexerChannels);
  }
  const std::int64_t n_win = request.position + 1 - trace.window_first;
  std::vector<float> window(static_cast<std::size_t>(n_win * kChannels));
  for (std::int64_t i = 0; i < n_win; ++i)
    std::copy_n(cache.window_key(seq, trace.window_first + i), kChannels, window.data() + i * kChannels);

  const stream_config& kv_config = cache.compressors().config(0);
  const rope_rotation rope(kv_config.rope, kv_config.channels);
  w.begin_case(std::string(bf16_indexer ? "sparse_bf16_indexer_ctx" : "sparse_ctx") + std::to_string(tokens), "sparse");
  w.param("context", tokens);
  w.param("position", request.position);
  w.param("stride", geom.stride);
  w.param("window", geom.window);
  w.param("page_size", kPageSize);
  w.param("query_heads", kQueryHeads);
  w.param("kv_heads", kv_config.kv_heads);
  w.param("channels", kv_config.channels);
  w.param("indexer_heads", kIndexerHeads);
  w.param("indexer_channels", kIndexerChannels);
  w.param("top_k", kTopK);
  w.param("window_tokens", kWindow);
  w.param("window_first", trace.window_first);
  w.param("candidates", candidates);
  w.param("sink", true);
  w.param("derotate_output", true);
  w.param("scale", 1.0 / std::sqrt(static_cast<double>(kChannels)));  // reader_config.scale 0 = 1/sqrt(C)
  rope_params_json(w, kv_config.rope);
  w.param("indexer_precision", std::string(bf16_indexer ? "bf16" : "f32"));
  if (bf16_indexer) {
    w.param("benchmark", "BM_sparse_decode_bf16_indexer/ctx:" + std::to_string(tokens));
  } else {
    w.param("benchmark", "BM_sparse_decode/ctx:" + std::to_string(tokens) + "/page:64/cold:0");
    w.param("benchmark_threads", "BM_sparse_decode_threads/ctx:" + std::to_string(tokens) + "/threads:2");
  }
  w.array("kv_entries", kv_entries.data(), {candidates, kv_config.kv_heads * kv_config.channels});
  w.array("indexer_entries", ix_entries.data(), {candidates, kIndexerChannels});
  w.array("window_rows", window.data(), {n_win, kChannels});
  w.array("queries", d.queries.data(), {kQueryHeads, kChannels});
  w.array("indexer_queries", d.indexer_queries.data(), {kIndexerHeads, kIndexerChannels});
  w.array("indexer_weights", d.indexer_weights.data(), {kIndexerHeads});
  w.array("sinks", d.sinks.data(), {kQueryHeads});
  w.array("output", d.out.data(), {kQueryHeads, kChannels});
  w.array("selected", trace.selected.data(), {static_cast<std::int64_t>(trace.selected.size())});
  w.array("selected_scores", trace.scores.data(), {static_cast<std::int64_t>(trace.scores.size())});
  w.array("rope_inv_freq", rope.inverse_frequencies().data(), {rope.pairs()});
  w.end_case();
  std::fprintf(stderr, "peer_dump: sparse ctx=%lld: %lld entries, %zu selected\n", static_cast<long long>(tokens),
               static_cast<long long>(candidates), trace.selected.size());
}

// ---- case: dense decode (bench_read's BM_dense_decode) --------------------------------------

// bench_read's dense step: the same dense_workload (decode_workload.hpp), with the largest requested
// context's rows rather than kMaxContext — a context of N reads the first N, the same either way.
void dump_dense(dump_writer& w, const std::vector<std::int64_t>& contexts) {
  const std::int64_t max_context = *std::max_element(contexts.begin(), contexts.end());
  dense_workload d(max_context);
  bool written = false;
  for (std::int64_t tokens : contexts) {
    d.step(tokens);
    w.begin_case("dense_ctx" + std::to_string(tokens), "dense");
    w.param("context", tokens);
    w.param("query_heads", kQueryHeads);
    w.param("channels", kChannels);
    w.param("scale", 1.0 / std::sqrt(static_cast<double>(kChannels)));
    w.param("benchmark", "BM_dense_decode/ctx:" + std::to_string(tokens) + "/cold:0");
    // One file of max_context rows serves every context; the peer reads its first `context` rows.
    if (written) {
      w.shared_array("kv", "dense.kv.bin", "float32", {max_context, kChannels});
    } else {
      w.array("kv", d.kv.data(), {max_context, kChannels}, "dense.kv.bin");
      written = true;
    }
    w.array("queries", d.queries.data(), {kQueryHeads, kChannels});
    w.array("sinks", d.sinks.data(), {kQueryHeads});
    w.array("output", d.out.data(), {kQueryHeads, kChannels});
    w.end_case();
  }
}

std::vector<std::int64_t> parse_contexts(const std::string& list) {
  std::vector<std::int64_t> contexts;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    const long long n = std::stoll(item);
    // bench_read fills in blocks of 1024 and its dense cache has 131072 rows; stay inside both.
    if (n < kBlock || n % kBlock != 0 || n > kMaxContext)
      throw std::invalid_argument("--contexts: " + item + " must be a multiple of 1024 in [1024, 131072]");
    contexts.push_back(n);
  }
  if (contexts.empty()) throw std::invalid_argument("--contexts: empty list");
  return contexts;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string dir;
    std::vector<std::int64_t> contexts = {4096, 131072};
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--contexts" && i + 1 < argc) contexts = parse_contexts(argv[++i]);
      else if (arg.rfind("--contexts=", 0) == 0) contexts = parse_contexts(arg.substr(11));
      else if (dir.empty() && arg.rfind("--", 0) != 0) dir = arg;
      else throw std::invalid_argument("unknown argument " + arg);
    }
    if (dir.empty()) throw std::invalid_argument("no output directory");

    dump_writer w(dir);
    dump_write(w, "write_csa_kv", presets::deepseek_v4_csa_kv(), 101);
    dump_write(w, "write_csa_indexer", presets::deepseek_v4_csa_indexer(), 102);
    for (std::int64_t tokens : contexts) dump_sparse(w, tokens);
    for (std::int64_t tokens : contexts)
      if (tokens == kBf16IndexerContext) dump_sparse(w, tokens, true);
    dump_dense(w, contexts);
    w.write_manifest();
    std::fprintf(stderr, "peer_dump: wrote %s/manifest.json\n", dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peer_dump: %s\nusage: peer_dump OUT_DIR [--contexts 4096,131072]\n", e.what());
    return 1;
  }
}
