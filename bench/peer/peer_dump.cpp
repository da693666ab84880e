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
//   sparse_v4_precision_ctx<N>        the same step of BM_sparse_decode_v4_precision, DeepSeek-V4's
//                                     precision: the K/V entries' stored bytes (fp8_e4m3_block,
//                                     584 per entry: e4m3fn codes, bf16 RoPE channels, UE8M0
//                                     scales) and the indexer keys' (fp4_e2m1_hadamard, 68 per
//                                     entry: e2m1 codes, UE8M0 scales), as a host would hand its
//                                     pages to PyTorch; the window rows (fp32 rows holding FP8
//                                     values, raw_window_config::precision), the queries and the
//                                     reader's output, selection and every candidate's FP4 score.
//   dense_ctx<N>                      bench_read's dense baseline over the first N raw tokens.
//
// Files: OUT_DIR/<case>.<array>.bin, raw little-endian float32 / int64 / float64 / uint8, row-major, and
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
#include <phasekv/compress/stream_compressor.hpp>
#include <phasekv/core/rope.hpp>
#include <phasekv/models/deepseek_v4.hpp>
#include <phasekv/kernels/indexer_fp4.hpp>
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
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t> ||
                      std::is_same_v<T, std::uint8_t>,
                  "the manifest knows float32, float64, int64 and uint8");
    if constexpr (std::is_same_v<T, float>) return "float32";
    else if constexpr (std::is_same_v<T, double>) return "float64";
    else if constexpr (std::is_same_v<T, std::uint8_t>) return "uint8";
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
  const geometry geom = presets::deepseek_v4_csa_layer.geom;
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
enum class sparse_variant {
  fp32,          // BM_sparse_decode: everything in fp32
  bf16_indexer,  // BM_sparse_decode_bf16_indexer: indexer keys stored and scored in bf16; the dumped
                 // keys are their bf16 values (exact in fp32), the queries stay fp32 (the peer
                 // rounds them as the reader does)
  v4_precision,  // BM_sparse_decode_v4_precision: FP8 K/V entries, FP4 indexer keys and queries;
                 // the entries are dumped as their stored bytes (the peer dequantizes them)
};

// The stored bytes of entries [0, n) of `stream`, entry after entry: entry j is page
// page_table[j / page_size], slot j % page_size — the lookup a host makes to hand its pages to
// another framework (paged_cache.hpp's interop addresses).
std::vector<std::uint8_t> stored_entries(const csa_cache& cache, sequence_id seq, std::size_t stream, std::int64_t n) {
  const page_pool& pool = cache.pool(stream);
  const page_layout& layout = pool.layout();
  const auto& table = cache.page_table(seq, stream);
  const std::int64_t entry_bytes = layout.entry_stride_bytes, page_size = layout.page_size;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n * entry_bytes));
  for (std::int64_t j = 0; j < n; ++j) {
    const std::byte* at = pool.base() + table[static_cast<std::size_t>(j / page_size)] * layout.page_stride_bytes +
                          (j % page_size) * entry_bytes;
    std::memcpy(bytes.data() + j * entry_bytes, at, static_cast<std::size_t>(entry_bytes));
  }
  return bytes;
}

void dump_sparse(dump_writer& w, std::int64_t tokens, sparse_variant variant = sparse_variant::fp32) {
  const bool bf16_indexer = variant == sparse_variant::bf16_indexer, v4 = variant == sparse_variant::v4_precision;
  sparse_workload d("peer_dump", tokens, kPageSize, bf16_indexer, v4 ? storage_type::fp8_e4m3_block : storage_type::f32,
                    v4);
  d.fill();
  const csa_cache& cache = d.cache;
  const sequence_id seq = d.seq;
  const read_request request = d.request();
  read_trace trace;
  d.reader.read(cache, seq, request, d.out.data(), &trace);

  // What the cache holds, through its public accessors: entry j of a stream is page
  // page_table[j / page_size], slot j % page_size, converted to fp32 (read_entry does exactly that
  // lookup) — or, at V4 precision, its stored bytes; window rows by token (an fp32 ring in every
  // variant; at V4 precision its rows hold FP8 values).
  const geometry& geom = cache.compressors().geom();
  const std::int64_t candidates = geom.visible_entries(request.position);
  if (cache.entries(seq, 0) < candidates || cache.entries(seq, 1) < candidates || trace.candidates != candidates)
    throw std::logic_error("peer_dump: the cache holds fewer entries than the reader's candidates");
  std::vector<float> kv_entries, ix_entries;
  std::vector<std::uint8_t> kv_bytes, ix_bytes;
  if (v4) {
    kv_bytes = stored_entries(cache, seq, 0, candidates);
    ix_bytes = stored_entries(cache, seq, 1, candidates);
  } else {
    kv_entries.resize(static_cast<std::size_t>(candidates * kChannels));
    ix_entries.resize(static_cast<std::size_t>(candidates * kIndexerChannels));
    for (std::int64_t j = 0; j < candidates; ++j) {
      cache.read_entry(seq, 0, j, kv_entries.data() + j * kChannels);
      cache.read_entry(seq, 1, j, ix_entries.data() + j * kIndexerChannels);
    }
  }
  const std::int64_t n_win = request.position + 1 - trace.window_first;
  std::vector<float> window(static_cast<std::size_t>(n_win * kChannels));
  for (std::int64_t i = 0; i < n_win; ++i)
    cache.copy_window_key(seq, trace.window_first + i, span<float>(window.data() + i * kChannels, static_cast<std::size_t>(kChannels)));

  // At V4 precision, every candidate's indexer score as the reader's FP4 kernel gives it (the
  // trace holds the selected ones only): the queries prepared and the pages scored as
  // sparse_reader does, checked against the trace's scores of the selected entries, bit for bit.
  std::vector<float> ix_scores;
  if (v4) {
    const page_pool& pool = cache.pool(1);
    const auto& table = cache.page_table(seq, 1);
    kernels::indexer_fp4_queries prepared;
    kernels::indexer_fp4::prepare(d.indexer_queries.data(), d.indexer_weights.data(), kIndexerHeads, kIndexerChannels,
                                  prepared);
    ix_scores.resize(static_cast<std::size_t>(candidates));
    for (std::int64_t first = 0; first < candidates; first += kPageSize)
      kernels::indexer_fp4::score(prepared, pool.base() + table[static_cast<std::size_t>(first / kPageSize)] * pool.layout().page_stride_bytes,
                                  pool.layout().entry_stride_bytes, std::min(kPageSize, candidates - first),
                                  ix_scores.data() + first);
    for (std::size_t r = 0; r < trace.selected.size(); ++r)
      if (std::memcmp(&ix_scores[static_cast<std::size_t>(trace.selected[r])], &trace.scores[r], sizeof(float)) != 0)
        throw std::logic_error("peer_dump: the FP4 kernel's score of a selected entry differs from the reader's");
  }

  const stream_config& kv_config = cache.compressors().config(0);
  const rope_rotation rope(kv_config.rope, kv_config.channels);
  const char* prefix = v4 ? "sparse_v4_precision_ctx" : bf16_indexer ? "sparse_bf16_indexer_ctx" : "sparse_ctx";
  w.begin_case(prefix + std::to_string(tokens), "sparse");
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
  w.param("indexer_precision", std::string(v4 ? "fp4" : bf16_indexer ? "bf16" : "f32"));
  if (v4) {
    // The two block layouts (format/fp8.hpp, format/fp4.hpp), so the peer slices the bytes by what
    // the format says rather than by numbers of its own.
    const fp8_head_layout kv = cache.pool(0).layout().fp8();
    const fp4_head_layout ix = cache.pool(1).layout().fp4();
    w.param("kv_storage", std::string("fp8_e4m3_block"));
    w.param("fp8_quantized_channels", kv.quantized);
    w.param("fp8_rope_offset", kv.rope_offset);
    w.param("fp8_scale_offset", kv.scale_offset);
    w.param("fp8_block_channels", fp8_head_layout::block_channels);
    w.param("fp8_blocks", kv.blocks);
    w.param("indexer_storage", std::string("fp4_e2m1_hadamard"));
    w.param("fp4_scale_offset", ix.scale_offset);
    w.param("fp4_block_channels", fp4_head_layout::block_channels);
    w.param("benchmark", "BM_sparse_decode_v4_precision/ctx:" + std::to_string(tokens) + "/cold:0");
  } else if (bf16_indexer) {
    w.param("benchmark", "BM_sparse_decode_bf16_indexer/ctx:" + std::to_string(tokens));
  } else {
    w.param("benchmark", "BM_sparse_decode/ctx:" + std::to_string(tokens) + "/page:64/cold:0");
    w.param("benchmark_threads", "BM_sparse_decode_threads/ctx:" + std::to_string(tokens) + "/threads:2");
  }
  if (v4) {
    const std::int64_t kv_entry = cache.pool(0).layout().entry_stride_bytes, ix_entry = cache.pool(1).layout().entry_stride_bytes;
    w.array("kv_entry_bytes", kv_bytes.data(), {candidates, kv_entry});
    w.array("indexer_entry_bytes", ix_bytes.data(), {candidates, ix_entry});
    w.array("indexer_scores", ix_scores.data(), {candidates});
  } else {
    w.array("kv_entries", kv_entries.data(), {candidates, kv_config.kv_heads * kv_config.channels});
    w.array("indexer_entries", ix_entries.data(), {candidates, kIndexerChannels});
  }
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
  std::fprintf(stderr, "peer_dump: %s%lld: %lld entries, %zu selected\n", prefix, static_cast<long long>(tokens),
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
    dump_write(w, "write_csa_kv", presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer), 101);
    dump_write(w, "write_csa_indexer", *presets::deepseek_indexer_stream(presets::deepseek_v4_csa_layer), 102);
    for (std::int64_t tokens : contexts) dump_sparse(w, tokens);
    for (std::int64_t tokens : contexts)
      if (tokens == kBf16IndexerContext) dump_sparse(w, tokens, sparse_variant::bf16_indexer);
    for (std::int64_t tokens : contexts) dump_sparse(w, tokens, sparse_variant::v4_precision);
    dump_dense(w, contexts);
    w.write_manifest();
    std::fprintf(stderr, "peer_dump: wrote %s/manifest.json\n", dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peer_dump: %s\nusage: peer_dump OUT_DIR [--contexts 4096,131072]\n", e.what());
    return 1;
  }
}
