// Writes the inputs and phasekv's outputs of the benchmarked steps to raw files, so that the
// PyTorch peer (peer.py) can recompute the same maths from the same numbers and be timed on the
// same shapes. Not a benchmark: bench/peer/run calls it once per comparison.
//
//   peer_dump OUT_DIR [--contexts 4096,131072]
//
// Cases (shapes and generators as in bench_write.cpp and bench_read.cpp, re-created here because
// those files keep their setup private):
//   write_csa_kv, write_csa_indexer   the DeepSeek-V4 CSA preset's two streams, a prefill of 4096
//                                     tokens: payload, logits, slot bias, norm weight, entries.
//   sparse_ctx<N>                     one decode step of bench_read's BM_sparse_decode (page 64):
//                                     both streams' entries as the cache stores them, the raw
//                                     window rows, queries, indexer queries/weights, sinks, and
//                                     the reader's output and selection.
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
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

// Only the parts it uses: the preset, the write path, the cache and the reader.
#include <phasekv/cache/paged_cache.hpp>
#include <phasekv/compress/presets.hpp>
#include <phasekv/compress/stream_compressor.hpp>
#include <phasekv/core/rope.hpp>
#include <phasekv/read/sparse_reader.hpp>

namespace {

using namespace phasekv;
using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// ---- shapes: bench_read.cpp's and bench_write.cpp's ----------------------------------------

constexpr std::int64_t kQueryHeads = 64;
constexpr std::int64_t kChannels = 512;  // tied K/V
constexpr std::int64_t kIndexerHeads = 64;
constexpr std::int64_t kIndexerChannels = 128;
constexpr std::int64_t kTopK = 512;
constexpr std::int64_t kWindow = 128;
constexpr std::int64_t kBlock = 1024;      // tokens per append while filling the cache
constexpr std::int64_t kDenseBlock = 512;  // keys per block of the dense baseline
constexpr std::int64_t kPageSize = 64;     // the page size of BM_sparse_decode/.../page:64
constexpr std::int64_t kPrefill = 4096;    // bench_write's prefill

using csa_stream = stream_compressor<presets::deepseek_v4_csa_policy>;
using csa_cache = paged_cache<csa_stream, csa_stream>;

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
  w.param("rope_channels", c.rope.channels);
  w.param("rope_base", c.rope.base);
  w.param("rope_layout", std::string(to_string(c.rope.layout)));
  w.param("yarn", c.rope.yarn.enabled);
  w.param("yarn_factor", c.rope.yarn.factor);
  w.param("yarn_original_context", c.rope.yarn.original_context);
  w.param("yarn_beta_fast", c.rope.yarn.beta_fast);
  w.param("yarn_beta_slow", c.rope.yarn.beta_slow);
}

// ---- generators: bench_read.cpp's ----------------------------------------------------------

// splitmix64 with the same seeds as bench_read, so the cache holds the benchmark's numbers.
struct fast_random {
  std::uint64_t state;
  explicit fast_random(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }  // [−1, 1)
  void fill(std::vector<float>& v) {
    for (float& x : v) x = uniform();
  }
};

std::vector<float> random_vector(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  fast_random(seed).fill(v);
  return v;
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

// bench_read's sparse_setup: the cache filled with ctx tokens in blocks of kBlock, the K/V
// stream's inputs one random block appended cyclically, the indexer's fresh for every block.
void dump_sparse(dump_writer& w, std::int64_t tokens) {
  const csa_stream kv_stream{presets::deepseek_v4_csa_geometry(), presets::deepseek_v4_csa_kv()};
  const csa_stream indexer_stream{presets::deepseek_v4_csa_geometry(), presets::deepseek_v4_csa_indexer()};

  cache_config cc;
  cc.name = "peer_dump";
  cc.page_size = kPageSize;
  cc.pages = (tokens / 4 + kPageSize - 1) / kPageSize + 1;
  cc.storage = storage_type::f32;
  cc.window.tokens = kWindow;
  cc.window.kv_heads = 1;
  cc.window.key_channels = kChannels;
  cc.window.value_channels = 0;  // tied
  csa_cache cache(csa_cache::layer(kv_stream, indexer_stream), cc);
  const sequence_id seq = cache.create();

  const std::int64_t kv_payload = kv_stream.payload_floats_per_token(), kv_logits = kv_stream.logit_floats_per_token();
  const std::int64_t ix_payload = indexer_stream.payload_floats_per_token();
  const std::int64_t ix_logits = indexer_stream.logit_floats_per_token();
  const std::vector<float> kv_in = random_vector(kBlock * kv_payload, 1), kv_gates = random_vector(kBlock * kv_logits, 2);
  const std::vector<float> window_keys = random_vector(kBlock * kChannels, 3);
  std::vector<float> ix_in(static_cast<std::size_t>(kBlock * ix_payload));
  std::vector<float> ix_gates(static_cast<std::size_t>(kBlock * ix_logits));
  fast_random rng(static_cast<std::uint64_t>(tokens * 1000 + kPageSize));
  for (std::int64_t done = 0; done < tokens; done += kBlock) {
    const std::int64_t n = std::min(kBlock, tokens - done);
    rng.fill(ix_in);
    rng.fill(ix_gates);
    const csa_cache::chunks chunks = {
        token_chunk{n, span<const float>(kv_in.data(), static_cast<std::size_t>(n * kv_payload)),
                    span<const float>(kv_gates.data(), static_cast<std::size_t>(n * kv_logits))},
        token_chunk{n, span<const float>(ix_in.data(), static_cast<std::size_t>(n * ix_payload)),
                    span<const float>(ix_gates.data(), static_cast<std::size_t>(n * ix_logits))}};
    cache.append(seq, chunks, span<const float>(window_keys.data(), static_cast<std::size_t>(n * kChannels)));
  }

  // bench_read's request: seeds 21–24, indexer weights mapped to (0, 1/heads].
  std::vector<float> queries = random_vector(kQueryHeads * kChannels, 21);
  std::vector<float> indexer_queries = random_vector(kIndexerHeads * kIndexerChannels, 22);
  std::vector<float> indexer_weights = random_vector(kIndexerHeads, 23);
  std::vector<float> sinks = random_vector(kQueryHeads, 24);
  for (float& x : indexer_weights) x = 0.5f * (x + 1.0f) / static_cast<float>(kIndexerHeads);

  reader_config rc;
  rc.name = "peer_dump.reader";
  rc.query_heads = kQueryHeads;
  rc.key_stream = 0;
  rc.value_stream = 0;
  rc.indexer_stream = 1;
  rc.top_k = kTopK;
  rc.indexer_heads = kIndexerHeads;
  rc.sink = true;
  rc.derotate_output = true;
  sparse_reader<csa_cache> reader(cache, rc);

  read_request request;
  request.position = tokens - 1;
  request.queries = span<const float>(queries);
  request.indexer_queries = span<const float>(indexer_queries);
  request.indexer_weights = span<const float>(indexer_weights);
  request.sinks = span<const float>(sinks);
  std::vector<float> out(static_cast<std::size_t>(reader.output_floats()));
  read_trace trace;
  reader.read(seq, request, out.data(), &trace);

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
  w.begin_case("sparse_ctx" + std::to_string(tokens), "sparse");
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
  w.param("rope_channels", kv_config.rope.channels);
  w.param("rope_base", kv_config.rope.base);
  w.param("rope_layout", std::string(to_string(kv_config.rope.layout)));
  w.param("yarn", kv_config.rope.yarn.enabled);
  w.param("yarn_factor", kv_config.rope.yarn.factor);
  w.param("yarn_original_context", kv_config.rope.yarn.original_context);
  w.param("yarn_beta_fast", kv_config.rope.yarn.beta_fast);
  w.param("yarn_beta_slow", kv_config.rope.yarn.beta_slow);
  w.param("benchmark", "BM_sparse_decode/ctx:" + std::to_string(tokens) + "/page:64/cold:0");
  w.param("benchmark_threads", "BM_sparse_decode_threads/ctx:" + std::to_string(tokens) + "/threads:2");
  w.array("kv_entries", kv_entries.data(), {candidates, kv_config.kv_heads * kv_config.channels});
  w.array("indexer_entries", ix_entries.data(), {candidates, kIndexerChannels});
  w.array("window_rows", window.data(), {n_win, kChannels});
  w.array("queries", queries.data(), {kQueryHeads, kChannels});
  w.array("indexer_queries", indexer_queries.data(), {kIndexerHeads, kIndexerChannels});
  w.array("indexer_weights", indexer_weights.data(), {kIndexerHeads});
  w.array("sinks", sinks.data(), {kQueryHeads});
  w.array("output", out.data(), {kQueryHeads, kChannels});
  w.array("selected", trace.selected.data(), {static_cast<std::int64_t>(trace.selected.size())});
  w.array("selected_scores", trace.scores.data(), {static_cast<std::int64_t>(trace.scores.size())});
  w.array("rope_inv_freq", rope.inverse_frequencies().data(), {rope.pairs()});
  w.end_case();
  std::fprintf(stderr, "peer_dump: sparse ctx=%lld: %lld entries, %zu selected\n", static_cast<long long>(tokens),
               static_cast<long long>(candidates), trace.selected.size());
}

// ---- case: dense decode (bench_read's BM_dense_decode) --------------------------------------

// bench_read's dense_decoder: blocks of kDenseBlock keys, logits by GEMM, an online softmax per
// head, P·V by GEMM, the sink in the final denominator. Re-created verbatim in behaviour (same
// block size, same order of operations), so its output is the benchmark's output.
void dense_decode(const float* queries, const float* kv, std::int64_t tokens, const float* sinks, float* out) {
  constexpr float minus_inf = -std::numeric_limits<float>::infinity();
  const float scale = 1.0f / std::sqrt(static_cast<float>(kChannels));
  const matrix query = Eigen::Map<const matrix>(queries, kQueryHeads, kChannels) * scale;
  matrix logits_buffer(kQueryHeads, kDenseBlock), acc = matrix::Zero(kQueryHeads, kChannels);
  Eigen::VectorXf max = Eigen::VectorXf::Constant(kQueryHeads, minus_inf), sum = Eigen::VectorXf::Zero(kQueryHeads);
  Eigen::VectorXf rescale(kQueryHeads);
  for (std::int64_t first = 0; first < tokens; first += kDenseBlock) {
    const std::int64_t n = std::min(kDenseBlock, tokens - first);
    const Eigen::Map<const matrix> keys(kv + first * kChannels, n, kChannels);
    auto logits = logits_buffer.leftCols(n);
    logits.noalias() = query * keys.transpose();
    for (std::int64_t h = 0; h < kQueryHeads; ++h) {
      const float m = std::max(max[h], logits.row(h).maxCoeff());
      rescale[h] = std::exp(max[h] - m);
      logits.row(h) = (logits.row(h).array() - m).exp().matrix();
      sum[h] = sum[h] * rescale[h] + logits.row(h).sum();
      max[h] = m;
    }
    acc = rescale.asDiagonal() * acc;
    acc.noalias() += logits * keys;
  }
  for (std::int64_t h = 0; h < kQueryHeads; ++h) {
    const float m = std::max(max[h], sinks[h]);
    const float a = std::exp(max[h] - m);
    const float norm = a / (sum[h] * a + std::exp(sinks[h] - m));
    Eigen::Map<Eigen::RowVectorXf>(out + h * kChannels, kChannels) = acc.row(h) * norm;
  }
}

void dump_dense(dump_writer& w, const std::vector<std::int64_t>& contexts) {
  const std::int64_t max_context = *std::max_element(contexts.begin(), contexts.end());
  const std::vector<float> kv = random_vector(max_context * kChannels, 11);  // bench_read: seed 11, 131072 rows
  const std::vector<float> queries = random_vector(kQueryHeads * kChannels, 12);
  const std::vector<float> sinks = random_vector(kQueryHeads, 13);
  bool written = false;
  for (std::int64_t tokens : contexts) {
    std::vector<float> out(static_cast<std::size_t>(kQueryHeads * kChannels));
    dense_decode(queries.data(), kv.data(), tokens, sinks.data(), out.data());
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
      w.array("kv", kv.data(), {max_context, kChannels}, "dense.kv.bin");
      written = true;
    }
    w.array("queries", queries.data(), {kQueryHeads, kChannels});
    w.array("sinks", sinks.data(), {kQueryHeads});
    w.array("output", out.data(), {kQueryHeads, kChannels});
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
    if (n < kBlock || n % kBlock != 0 || n > 131072)
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
    dump_dense(w, contexts);
    w.write_manifest();
    std::fprintf(stderr, "peer_dump: wrote %s/manifest.json\n", dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peer_dump: %s\nusage: peer_dump OUT_DIR [--contexts 4096,131072]\n", e.what());
    return 1;
  }
}
