#pragma once
// A synthetic needle-in-a-haystack probe: a fixed-seed retrieval task that runs
// through the real write path (layer_compressor → paged_cache) and the real reader
// (sparse_reader), so a phase sweep of it shows what chunked compression does to retrieval by
// phase — the study's effect without a model.
//
// The task. A context of positions [0, query_position) holds `records` key→value records among
// filler tokens; the query token sits at query_position. A record (config.record, a
// record_shape) is K key tokens, g filler tokens of gap, then V value tokens — by default one
// key token directly followed by its value token. Key, value and filler tokens come from
// disjoint vocabularies: record i has key tokens i·K + j and value tokens R·K + i·V + j; the
// filler vocabulary has filler_vocabulary tokens plus one dedicated query token. Embeddings are
// random and nearly equiangular:
//     e(tok) = normalize(√κ·u0 + √(1−κ)·u_tok),  u0, u_tok i.i.d. N(0, I/C)
// so distinct tokens have cosine ≈ κ. A record's key summary s_i and value answer a_i are the
// normalised sums of its key and of its value token embeddings (the embedding itself for one token).
//
// The mechanism (a previous-token feature, as induction heads use, carried through the record):
//     key-stream payload at t   = e(tok_t) + s_i            (t a gap or value token of record i)
//                               = e(tok_t)                  (t a key token after the first)
//                               = e(tok_t) + e(tok_{t−1})   (otherwise; e(tok_0) at t = 0)
//     value-stream payload at t = e(tok_t)
//     query                      = s_target                 (RoPE'd at the query position when
//                                                             the key stream has RoPE)
// A query therefore matches its record's gap and value tokens through s, best, and its key tokens
// through their own embeddings, less (a key token after the first carries no previous-token
// feature: the key before it would double its match, and attention would settle on the key
// rather than the value). For the default record that is exactly the previous-token feature: the
// value token's key payload carries the key. Read-out = the reader's attention over
// all complete entries (no raw window; every entry, or the top_k the key stream itself selects)
// of the value stream, summed over heads (one query head per KV head; trials() reads many
// targets at once, as GQA members of each KV head — one at a time with selection). Answer =
// argmax over the records of read-out · a_r; trial() succeeds when that is the target's own.
//
// What follows (and what the tests demonstrate):
//   * full attention (S = W = 1): both matching positions are entries of their own; the value
//     position's entry holds e(value) → phase plays no role (flat).
//   * mean pool, W = S: a key at the boundary phase S − 1 has its value in the next block, so the
//     match splits over two entries, each with half the margin, and only one holds the value
//     → weak at phase S − 1. W = 2S: every window spans two blocks, so some entry holds both
//     positions at every phase → most of the weakness goes.
//   * concentrated gates (scalar gates with a per-slot bias of `gate_sharpness` on one slot,
//     zero logits): head h's key stream sees only slot r_h = (gate_offset + h) mod W and its
//     value stream only slot (r_h + 1) mod W → a record is read correctly only when its key
//     sits at offset r_h: strong phase r, period S.
//   * rope_after_pool: mean pool whose key entries are rotated at the block start on their last
//     channels/4 channels (even); the query is rotated at its own position.
//   * deepseek_v4_csa: the preset's policy and geometry (S = 4, W = 8, vector gates, RMSNorm,
//     RoPE after pooling on the last channels/4 channels with the preset's YaRN settings, tied
//     K/V read as both keys and values with the output de-rotated) with random weights: gate
//     logits Z_b·e(tok) with Z_b ~ N(0, 1/C) per branch, slot biases ~ N(0, 0.5²), norm weights 1.
//     The tied payload is the key payload (it contains e(value) at the value position).
//   * fixed_weight: a static per-slot profile p (fixed_weight_pool) on both streams. One-hot on
//     offset o, every entry is the token at o: a record is retrieved exactly when a value token of
//     it sits at o (a key token there addresses the record but returns the key).
//   * positional_gates: scalar gates with logits λ·(z·e(tok)) + b_slot, one bias profile b on both
//     streams (DeepSeek-V4's `ape` is such a per-slot term): the entry weighs slot i by about
//     exp(b_i), so the contained profile follows b. λ = 0 is fixed_weight with p = exp(b).
//
// Why a trial failed: explain(target) reads the target alone with a trace and classifies it
// against the value stream's slot weights (read_attribution.hpp's classify_failure, on the
// record's value tokens): the entries holding them not selected, selected but outweighed, or
// weighed little inside their entry. needle_sweep(…, needle_outcome::attributed) does it for
// every failed trial.
//
// Crowding. Other records placed at random share the target's entries, more often at some
// offsets than others (a record just before the target in its block brings a competing value, one
// just after brings only keys), which makes even a mean pool's contained profile uneven.
// isolate_targets keeps every other record out of the tokens the targets' entries pool, and
// needle_sweep keeps the targets of one haystack as far apart: the control under which the maths'
// flat profiles are flat. crowding(target) counts the records that share its entries.
//
// Logit scale β (attention logits β·q·k). 0 chooses
//     β = (ln(n) + 6) / margin,   n = tokens / S (about the entries a query at the end sees),
// where margin is the expected logit gap, per unit β, of the best single entry of a record whose
// key and value share an entry: 1−κ for full attention and concentrated gates, (1−κ)·share for
// pools, share = the largest weight min(L, W) consecutive slots get (min(L, W)/W for a mean pool;
// 2/W for the default record), the rotated channels excluded for RoPE and times the RMSNorm gain
// for DeepSeek-V4.
// So a whole match outweighs the n-entry background by about e⁶, while half a match (the
// boundary phase) does not — some competition remains, so the control is near but not at 100%.
//
// probability(): softmax over the value vocabulary of β_answer · (r̂ · e_v), r̂ the read-out
// scaled to unit length and β_answer = answer_scale = 30 — the probability of the right value.
//
// Targets of one prepare() must not overlap (a record takes L positions), and plan_sweep places
// targets at consecutive positions and repeats positions, so a phase sweep needs several
// haystacks: needle_sweep() (below) does that grouping, one build per haystack.
//
// Sizing (why the channel count matters). A mean-pooled key entry of W tokens carries the match
// with margin 2(1−κ)/W against random noise of about 2(1−κ)/√(W·C), so the key SNR is about
// √(C/W); the pooled value is 1/W of the read-out against √(W−1)/W of noise, SNR √(C/(W−1)).
// The argmax over n entries and over `records` values needs both well above √(2 ln n): with
// C = 64 only S = W ≤ 2 retrieves at 128K; C = 128–256 is needed for W = 4–8. Records that share
// a block with the target also dilute its value (realistic competition): at the study's density
// (16000 records in 128K tokens, a quarter of all tokens) W = 8 loses about half its accuracy
// to that alone.
//
// Everything is a deterministic function of the config (seed) and the prepare() arguments.

#include <algorithm>
#include <utility>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "phasekv/detail/simd/intrinsics.hpp"  // before Eigen, which includes the intrinsics too
#include <Eigen/Core>

#include "phasekv/cache/paged_cache.hpp"
#include "phasekv/compress/layer_compressor.hpp"
#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/detail/enum_name.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/random.hpp"
#include "phasekv/core/rope.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/study/haystacks.hpp"
#include "phasekv/study/phase_sweep.hpp"
#include "phasekv/diag/read_attribution.hpp"
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/models/model_cache.hpp"
#include "phasekv/read/sparse_reader.hpp"

namespace phasekv::diag::probe {

enum class needle_policy {
  full_attention,
  mean_pool,
  concentrated_gates,
  rope_after_pool,
  deepseek_v4_csa,
  fixed_weight,      // a static per-slot profile (fixed_weight_pool) on both streams
  positional_gates,  // scalar gates: content logits plus a per-slot bias, like DeepSeek-V4's ape
};

inline const char* to_string(needle_policy p) noexcept {
  return phasekv::detail::enum_name(p, {"full_attention", "mean_pool", "concentrated_gates", "rope_after_pool",
                                        "deepseek_v4_csa", "fixed_weight", "positional_gates"});
}

struct needle_config {
  std::int64_t tokens = 131072;   // context length N (the query position must lie below it)
  std::int64_t records = 16000;   // key→value records (the targets are some of them)
  std::int64_t channels = 64;     // embedding dimension
  double kappa = 0.2;             // shared component of distinct token embeddings
  float logit_scale = 0.0f;       // attention logit scale; 0 = automatic (see top)
  needle_policy policy = needle_policy::mean_pool;
  std::int64_t stride = 4, window = 4;  // ignored by full_attention (S=W=1) and deepseek_v4_csa (4/8)
  std::int64_t gate_offset = 0;   // concentrated_gates: key gates peak at offset r, value gates at r+1
  std::int64_t heads = 1;         // concentrated_gates: several KV heads at offsets r, r+1, …
  std::uint64_t seed = 1;
  // Interventions (study/interventions.hpp) on the probe's own write path; the defaults leave it
  // as described above.
  //   origin: chunk origin of the geometry (blocks start at t ≡ origin mod S), as
  //     staggered_origins sets it; mean_pool, concentrated_gates and rope_after_pool only.
  //   key_slot_bias, value_slot_bias: concentrated_gates only, the per-slot gate biases laid out
  //     [heads][W] (G = 1 scalar gate channel), e.g. concentrated_slot_bias() cycled by
  //     cycle_slot_profile; empty = concentrated_slot_bias().
  std::int64_t origin = 0;
  std::vector<float> key_slot_bias, value_slot_bias;
  // The records (diag/record_layout.hpp): key_tokens key tokens, `gap` filler tokens, then
  // value_tokens value tokens; {1, 1, 0} is the two-token record described at the top.
  record_shape record;
  // fixed_weight: the per-slot weights [W] of both streams (finite, ≥ 0, positive sum); empty =
  //   uniform, which is mean_pool. positional_gates: the per-slot biases [W] added to every
  //   token's gate logit (log-weights, like DeepSeek-V4's ape); empty = N(0, 1) per slot (a fixed
  //   draw, the same for every seed: the seed changes the haystack, not the model).
  std::vector<float> slot_profile;
  // positional_gates: scale λ of the gate logit's content part λ·(z·e(tok)), z ~ N(0, I) (0 = the
  // bias alone, which is fixed_weight with weights exp(bias)).
  float gate_content = 1.0f;
  // Entries the reader selects, by an indexer that is the key stream itself (one indexer head,
  // weight 1, f32); 0 reads every entry. A selection serves one query, so reads go target by target.
  std::int64_t top_k = 0;
  // Keep the other records out of the tokens the targets' entries pool (diag::crowding = 0 for
  // every target): the control for crowding, which otherwise varies with the in-block offset (a
  // record before the target in its block puts a competing value into the target's entries, a
  // record after it only keys).
  bool isolate_targets = false;

  static constexpr std::int64_t filler_vocabulary = 1024;
  static constexpr float gate_sharpness = 12.0f;  // bias of the peaked slot (others 0)
  static constexpr float answer_scale = 30.0f;    // β_answer of probability()

  // Effective geometry of the policy.
  std::int64_t effective_stride() const {
    return policy == needle_policy::full_attention ? 1 : policy == needle_policy::deepseek_v4_csa ? 4 : stride;
  }
  std::int64_t effective_window() const {
    return policy == needle_policy::full_attention ? 1 : policy == needle_policy::deepseek_v4_csa ? 8 : window;
  }
  std::int64_t effective_heads() const { return policy == needle_policy::concentrated_gates ? heads : 1; }
  // Whether the policy takes a slot_profile.
  bool takes_slot_profile() const {
    return policy == needle_policy::fixed_weight || policy == needle_policy::positional_gates;
  }
  // How far apart needle_sweep places the targets of one haystack: a record's length, and for
  // isolated targets 2W more, which puts each outside the other's pooled tokens.
  std::int64_t haystack_spacing() const {
    return record.length() + (isolate_targets ? 2 * effective_window() : 0);
  }
  // Whether the policy takes stride, window and origin from this config.
  bool own_geometry() const {
    return policy == needle_policy::mean_pool || policy == needle_policy::concentrated_gates ||
           policy == needle_policy::rope_after_pool || policy == needle_policy::fixed_weight ||
           policy == needle_policy::positional_gates;
  }

  // The default concentrated-gate biases [heads][W] of the key (false) or value (true) stream:
  // gate_sharpness on slot (gate_offset + h) mod W of head h's key stream and on the slot after it
  // in the value stream, 0 elsewhere.
  std::vector<float> concentrated_slot_bias(bool value_stream) const {
    std::vector<float> bias(static_cast<std::size_t>(heads * window), 0.0f);
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t r = (gate_offset + h + (value_stream ? 1 : 0)) % window;
      bias[static_cast<std::size_t>(h * window + r)] = gate_sharpness;
    }
    return bias;
  }

  void validate() const {
    using phasekv::detail::require;
    require(policy == needle_policy::full_attention || policy == needle_policy::mean_pool ||
                policy == needle_policy::concentrated_gates || policy == needle_policy::rope_after_pool ||
                policy == needle_policy::deepseek_v4_csa || policy == needle_policy::fixed_weight ||
                policy == needle_policy::positional_gates,
            "needle_config.policy", static_cast<int>(policy), "is not a needle_policy");
    require(tokens >= 8 && tokens <= (std::int64_t{1} << 31), "needle_config.tokens", tokens, "must lie in [8, 2^31]");
    require(records >= 1, "needle_config.records", records, "must be at least 1");
    record.validate();
    const std::int64_t L = record.length();
    require(L <= 256, "needle_config.record length", L, "must be at most 256 tokens");
    require(2 * L * records <= tokens, "needle_config.records", records,
            "must be at most tokens / (2 × record length) = " + std::to_string(tokens / (2 * L)) +
                " (records take " + std::to_string(L) + " positions each and fill at most half the context)");
    require(channels >= 4 && channels % 4 == 0, "needle_config.channels", channels, "must be a multiple of 4, at least 4");
    require(std::isfinite(kappa) && kappa >= 0.0 && kappa < 1.0, "needle_config.kappa", kappa, "must lie in [0, 1)");
    require(std::isfinite(logit_scale) && logit_scale >= 0.0f, "needle_config.logit_scale", logit_scale,
            "must be finite and non-negative (0 = automatic)");
    if (own_geometry()) {
      require(stride >= 1 && stride <= 4096, "needle_config.stride", stride, "must lie in [1, 4096]");
      require(window >= stride && window <= 4096, "needle_config.window", window,
              "must lie in [stride = " + std::to_string(stride) + ", 4096]");
    }
    require(heads >= 1, "needle_config.heads", heads, "must be at least 1");
    if (policy == needle_policy::concentrated_gates) {
      require(gate_offset >= 0 && gate_offset < window, "needle_config.gate_offset", gate_offset,
              "must lie in [0, window = " + std::to_string(window) + ")");
      require(heads <= window, "needle_config.heads", heads,
              "must be at most window = " + std::to_string(window) + " (one distinct offset per head)");
    }
    if (own_geometry())
      require(origin >= 0 && origin < stride, "needle_config.origin", origin,
              "must lie in [0, stride = " + std::to_string(stride) + ")");
    else
      require(origin == 0, "needle_config.origin", origin,
              std::string("must be 0 for the ") + to_string(policy) + " policy (it has no geometry of its own)");
    const std::pair<const char*, const std::vector<float>*> biases[] = {
        {"needle_config.key_slot_bias", &key_slot_bias}, {"needle_config.value_slot_bias", &value_slot_bias}};
    for (const auto& [field, bias] : biases) {
      if (bias->empty()) continue;
      require(policy == needle_policy::concentrated_gates, std::string(field) + ".size()", bias->size(),
              "must be 0 (only the concentrated_gates policy has per-slot gate biases)");
      require(static_cast<std::int64_t>(bias->size()) == heads * window, std::string(field) + ".size()", bias->size(),
              "must be heads × window = " + std::to_string(heads * window) + " (or 0 for the default)");
      for (std::size_t i = 0; i < bias->size(); ++i)
        require(std::isfinite((*bias)[i]), std::string(field) + "[" + std::to_string(i) + "]", (*bias)[i],
                "must be finite");
    }
    if (!slot_profile.empty()) {
      require(takes_slot_profile(), "needle_config.slot_profile.size()", slot_profile.size(),
              "must be 0 (only the fixed_weight and positional_gates policies take a slot profile)");
      require(static_cast<std::int64_t>(slot_profile.size()) == window, "needle_config.slot_profile.size()",
              slot_profile.size(), "must be window = " + std::to_string(window) + " (or 0 for the default)");
      double sum = 0.0;
      for (std::size_t i = 0; i < slot_profile.size(); ++i) {
        const float p = slot_profile[i];
        const bool ok = policy == needle_policy::fixed_weight ? std::isfinite(p) && p >= 0.0f : std::isfinite(p);
        require(ok, "needle_config.slot_profile[" + std::to_string(i) + "]", p,
                policy == needle_policy::fixed_weight ? "must be finite and non-negative (a weight)"
                                                      : "must be finite (a logit bias)");
        sum += p;
      }
      if (policy == needle_policy::fixed_weight)
        require(sum > 0.0, "needle_config.slot_profile (sum)", sum, "must be positive");
    }
    require(std::isfinite(gate_content), "needle_config.gate_content", gate_content, "must be finite");
    require(top_k >= 0, "needle_config.top_k", top_k, "must be non-negative (0 reads every entry)");
    if (top_k > 0)
      require(effective_heads() == 1, "needle_config.top_k", top_k,
              "needs a single KV head (the indexer is the key stream; heads = " + std::to_string(heads) + ")");
  }

  // The per-slot profile in use: slot_profile, or its default (see above).
  std::vector<float> resolved_slot_profile() const {
    if (!slot_profile.empty() || !takes_slot_profile()) return slot_profile;
    std::vector<float> p(static_cast<std::size_t>(window), 1.0f);
    if (policy == needle_policy::positional_gates) {  // one profile for every seed: the model, not the haystack
      std::mt19937_64 rng(0xA9E5ull + static_cast<std::uint64_t>(window));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (auto& x : p) x = normal(rng);
    }
    return p;
  }
};

namespace detail {

// The probe's five policies, each compiled once under its own id (pooling_registry::add_compiled),
// so a TU that includes the probe compiles these and not every built-in combination.
inline const pooling_registry& probe_poolings() {
  static const pooling_registry registry = [] {
    pooling_registry r;
    r.add_compiled<compressor_policy<mean_pool>>("mean");
    r.add_compiled<compressor_policy<mean_pool, rope_after_pool>>("mean.rope_after_pool");
    r.add_compiled<compressor_policy<fixed_weight_pool>>("fixed_weights");
    r.add_compiled<compressor_policy<scalar_gated_pool>>("scalar_gates");
    r.add_compiled<presets::deepseek_v4_csa_policy>("deepseek_v4_csa");
    return r;
  }();
  return registry;
}

// One configuration as a one-layer model (models/model_cache.hpp) and its readers, one per query
// head count: the queries of B targets, grouped per KV head (GQA groups of B), read the layer's
// view. The kind has no reader of its own (query_heads 0); these readers name their streams.
class probe_engine {
 public:
  probe_engine(layer_kind kind, std::vector<stream_params> params, std::int64_t pages, reader_config rc)
      : model_(spec(std::move(kind), std::move(params)), options(pages), probe_poolings()), reader_cfg_(std::move(rc)) {}

  void reset() {
    if (seq_ >= 0) model_.free(seq_);
    seq_ = model_.create();
  }
  void append(std::int64_t tokens, const std::vector<std::vector<float>>& payload, const std::vector<std::vector<float>>& logits) {
    std::vector<token_chunk> in(static_cast<std::size_t>(streams()));
    for (std::size_t k = 0; k < in.size(); ++k) {
      in[k].tokens = tokens;
      in[k].payload = span<const float>(payload[k].data(), payload[k].size());
      in[k].logits = span<const float>(logits[k].data(), logits[k].size());
    }
    model_step step = model_.begin({seq_}, tokens);
    step.append(0, {layer_append{in, {}, {}}});
    step.commit();
  }
  // With selection (top_k > 0) B = 1 and the query is also the indexer's.
  void read(std::int64_t position, const float* queries, std::int64_t query_heads, float* out, read_trace* trace = nullptr) {
    auto& reader = readers_[query_heads];
    if (!reader) {
      reader_config rc = reader_cfg_;
      rc.query_heads = query_heads;
      reader = std::make_unique<sparse_reader>(model_.shape(0), rc);
    }
    const auto channels = static_cast<std::size_t>(model_.shape(0).streams[reader_cfg_.key_stream].channels);
    read_request r;
    r.position = position;
    r.queries = span<const float>(queries, static_cast<std::size_t>(query_heads) * channels);
    if (reader_cfg_.top_k > 0) {
      r.indexer_queries = span<const float>(queries, channels);
      r.indexer_weights = span<const float>(&unit_weight, 1);
    }
    reader->read(model_.view(0, seq_), r, out, trace);
  }
  std::int64_t streams() const { return static_cast<std::int64_t>(model_.shape(0).streams.size()); }

  // The write path of stream k once more, outside the cache, with its slot weights into `log`:
  // begin_log, then log_chunk for every chunk append() was given.
  void begin_log(std::size_t k) {
    log_stream_ = k;
    log_state_ = model_.stream(0, k).make_state(0);
  }
  void log_chunk(std::int64_t tokens, const std::vector<float>& payload, const std::vector<float>& logits, slot_weight_log& log) {
    const stream_kernel& stream = model_.stream(0, log_stream_);
    token_chunk in;
    in.tokens = tokens;
    in.payload = span<const float>(payload.data(), payload.size());
    in.logits = span<const float>(logits.data(), logits.size());
    append_options options;
    options.slot_weights = true;
    stream.check(log_state_, in, options);
    stream.emit(log_state_, in, options, entry_sink::of(log));
    stream.commit(log_state_, in);
  }

 private:
  static model_spec spec(layer_kind kind, std::vector<stream_params> params) {
    model_spec m;
    m.name = "needle";
    kind.reader.query_heads = 0;
    m.kinds.push_back(std::move(kind));
    m.layers.push_back({0, std::move(params)});
    return m;
  }
  static model_options options(std::int64_t pages) {
    model_options o;
    o.pages = pages;
    return o;
  }

  static constexpr float unit_weight = 1.0f;
  model_cache model_;
  reader_config reader_cfg_;
  std::unordered_map<std::int64_t, std::unique_ptr<sparse_reader>> readers_;
  sequence_id seq_ = -1;
  std::size_t log_stream_ = 0;
  stream_state log_state_;
};

}  // namespace detail

class needle_probe {
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

 public:
  explicit needle_probe(needle_config config) : config_(config) {
    config_.validate();
    build_embeddings();
    build_engine();
  }

  const needle_config& config() const noexcept { return config_; }

  // The same probe with another seed (new embeddings, and new random weights for the DeepSeek-V4
  // policy), keeping its cache: cheaper than constructing a probe, whose page pool for a long
  // context takes most of the construction time. Unprepares the probe.
  void reseed(std::uint64_t seed) {
    config_.seed = seed;
    prepared_ = false;
    build_embeddings();
    if (config_.policy == needle_policy::deepseek_v4_csa) build_engine();  // its random weights come from the seed too
  }
  // The attention logit scale in use (the automatic choice when config().logit_scale is 0).
  double logit_scale() const noexcept { return logit_scale_; }
  std::int64_t query_position() const noexcept { return query_position_; }

  // `context` salts the haystack (filler tokens, record placement and ids; the embeddings stay
  // those of the seed): the same targets in independent haystacks, e.g. for repeated placements.
  void prepare(span<const std::int64_t> target_positions, std::int64_t query_position, std::uint64_t context = 0) {
    using phasekv::detail::fail;
    using phasekv::detail::require;
    const std::int64_t L = config_.record.length();
    require<input_error>(query_position >= L && query_position < config_.tokens, "needle_probe: query_position",
                         query_position,
                         "must lie in [record length = " + std::to_string(L) + ", tokens = " +
                             std::to_string(config_.tokens) + ")");
    const std::int64_t n_targets = static_cast<std::int64_t>(target_positions.size());
    require<input_error>(n_targets <= config_.records, "needle_probe: target_positions.size()", n_targets,
                         "must be at most records = " + std::to_string(config_.records));
    std::vector<std::int64_t> sorted(target_positions.begin(), target_positions.end());
    for (std::int64_t t : sorted)
      require<input_error>(t >= 0 && t + L <= query_position, "needle_probe: target position", t,
                           "must lie in [0, query_position − record length = " + std::to_string(query_position - L) +
                               "] (the record's " + std::to_string(L) + " tokens come before the query)");
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 1; i < sorted.size(); ++i)
      if (sorted[i] - sorted[i - 1] < L)
        fail<input_error>("needle_probe: target position", sorted[i],
                          "overlaps the target at " + std::to_string(sorted[i - 1]) + " (a record takes " +
                              std::to_string(L) + " positions from its first)");
    require<input_error>(L * config_.records <= query_position / 2, "needle_probe: query_position", query_position,
                         "leaves too little room: records = " + std::to_string(config_.records) + " of " +
                             std::to_string(L) + " tokens need query_position ≥ 2 × " +
                             std::to_string(L * config_.records));

    // Every check is done: build the token sequence, then the cache. (A throw from here on — out
    // of memory — leaves the probe unprepared rather than half-prepared.)
    const std::int64_t R = config_.records, K = config_.record.key_tokens, V = config_.record.value_tokens;
    const std::int64_t value_at = config_.record.value_offset();
    const auto filler_base = static_cast<std::int32_t>(R * (K + V));
    std::mt19937_64 rng(phasekv::detail::mix64(phasekv::detail::mix64(config_.seed, 0x7043ull + static_cast<std::uint64_t>(query_position)), context));
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(query_position + 1));
    std::uniform_int_distribution<std::int32_t> filler(0, static_cast<std::int32_t>(needle_config::filler_vocabulary - 1));
    for (auto& tok : tokens) tok = filler_base + filler(rng);
    tokens.back() = filler_base + static_cast<std::int32_t>(needle_config::filler_vocabulary);  // the query token
    std::vector<char> used(tokens.size(), 0);
    used[static_cast<std::size_t>(query_position)] = 1;  // the query token
    std::vector<char> blocked;  // isolate_targets: no other record may touch these
    if (config_.isolate_targets) {
      blocked.assign(tokens.size(), 0);
      for (std::int64_t t : sorted) {
        const auto [lo, hi] = pooled_neighbourhood(geom_, t, L);
        for (std::int64_t u = std::max<std::int64_t>(lo, 0); u <= std::min(hi, query_position); ++u)
          blocked[static_cast<std::size_t>(u)] = 1;
      }
    }
    std::vector<std::int32_t> feature(tokens.size(), previous_token);  // see for_each_chunk()
    // Record ids in random order, so targets do not always get the low ids.
    std::vector<std::int32_t> ids(static_cast<std::size_t>(R));
    for (std::int64_t i = 0; i < R; ++i) ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::unordered_map<std::int64_t, std::int32_t> record_at;
    std::vector<std::int64_t> starts;
    std::int64_t next = 0;
    auto place = [&](std::int64_t t) {
      const std::int32_t id = ids[static_cast<std::size_t>(next++)];
      const auto at = [&](std::int64_t i) { return static_cast<std::size_t>(t + i); };
      for (std::int64_t j = 0; j < K; ++j) tokens[at(j)] = static_cast<std::int32_t>(id * K + j);
      for (std::int64_t j = 0; j < V; ++j) tokens[at(value_at + j)] = static_cast<std::int32_t>(R * K + id * V + j);
      for (std::int64_t i = 0; i < L; ++i) {
        used[at(i)] = 1;
        if (i > 0) feature[at(i)] = i < K ? no_feature : id;
      }
      record_at[t] = id;
      starts.push_back(t);
    };
    for (std::int64_t t : sorted) place(t);
    std::uniform_int_distribution<std::int64_t> where(0, query_position - L);
    // Rejection sampling; isolation can leave too little room, so give up after a bound.
    std::int64_t attempts = 0;
    while (next < R) {
      if (++attempts > 1000 * R)
        fail<input_error>("needle_probe: target_positions.size()", n_targets,
                          "leaves too little room to place the other records (of " + std::to_string(L) +
                              " free tokens each" + (config_.isolate_targets ? ", outside the targets' entries" : "") +
                              "): use fewer targets per prepare, fewer records or a longer context");
      const std::int64_t t = where(rng);
      bool free = true;
      for (std::int64_t i = 0; i < L && free; ++i) {
        const auto u = static_cast<std::size_t>(t + i);
        free = !used[u] && (blocked.empty() || !blocked[u]);
      }
      if (free) place(t);
    }
    std::unordered_map<std::int64_t, std::int32_t> targets;
    for (std::int64_t t : sorted) targets[t] = record_at[t];
    std::sort(starts.begin(), starts.end());

    prepared_ = false;
    log_.reset();
    tokens_ = std::move(tokens);
    feature_ = std::move(feature);
    compress();
    targets_ = std::move(targets);
    record_starts_ = std::move(starts);
    query_position_ = query_position;
    prepared_ = true;
  }

  bool trial(std::int64_t target_position) {
    const std::int64_t one[] = {target_position};
    return trials(span<const std::int64_t>(one, 1))[0] != 0;
  }

  double probability(std::int64_t target_position) {
    const std::int64_t one[] = {target_position};
    return probabilities(span<const std::int64_t>(one, 1))[0];
  }

  // Several prepared targets at once, in the order given: their queries share the query
  // position and the cache, so one read serves them all (each target a GQA group member of every
  // KV head) — the cache is streamed once per batch instead of once per target. The answers are
  // those of one-at-a-time trials up to the rounding of a wider matrix product.
  std::vector<char> trials(span<const std::int64_t> target_positions) {
    std::vector<char> out(target_positions.size());
    for_each_readout(target_positions, [&](std::size_t i, std::int32_t id, const Eigen::VectorXf& readout) {
      scores_.noalias() = value_embeddings_ * readout;
      Eigen::Index best = 0;
      scores_.maxCoeff(&best);
      out[i] = best == id ? 1 : 0;
    });
    return out;
  }

  std::vector<double> probabilities(span<const std::int64_t> target_positions) {
    std::vector<double> out(target_positions.size());
    for_each_readout(target_positions, [&](std::size_t i, std::int32_t id, const Eigen::VectorXf& readout) {
      const float norm = readout.norm();
      scores_.noalias() = value_embeddings_ * readout;
      if (norm > 0.0f) scores_ *= needle_config::answer_scale / norm;
      else scores_.setZero();
      const float m = scores_.maxCoeff();
      double den = 0.0;
      for (Eigen::Index v = 0; v < scores_.size(); ++v) den += std::exp(static_cast<double>(scores_(v) - m));
      out[i] = std::exp(static_cast<double>(scores_(id) - m)) / den;
    });
    return out;
  }

  // Why a prepared target's read fails (or would): the target read alone with a trace, against
  // the slot weights its value stream gave every entry (that stream's write path run once more,
  // outside the cache, on this preparation's tokens; kept until the next prepare), for the
  // record's value tokens (classify_failure: selection miss, read or write dilution, readout).
  failure_attribution explain(std::int64_t target_position, double read_threshold = 0.5,
                              double write_threshold = 0.5) {
    const std::int32_t id = lookup(target_position);
    if (!log_) {
      auto log = std::make_unique<slot_weight_log>(geom_.window);
      engine_->begin_log(value_stream_);
      for_each_chunk([&](std::int64_t n, const auto& payload, const auto& logits) {
        engine_->log_chunk(n, payload[value_stream_], logits[value_stream_], *log);
      });
      log_ = std::move(log);
    }
    const std::int64_t C = config_.channels, H = config_.effective_heads();
    prepare_query_rotation();
    queries_.resize(static_cast<std::size_t>(H * C));
    write_query(id, queries_.data());
    for (std::int64_t g = 1; g < H; ++g) std::copy_n(queries_.data(), C, queries_.data() + g * C);
    out_.resize(static_cast<std::size_t>(H * C));
    read_trace trace;
    engine_->read(query_position_, queries_.data(), H, out_.data(), &trace);
    // Judged on the value's tokens, where the answer is read from: an entry holding only the key
    // addresses the record but cannot return it.
    return classify_failure(geom_, *log_, trace, target_position + config_.record.value_offset(),
                            config_.record.value_tokens, read_threshold, write_threshold);
  }

  // Other records with a token in the tokens the target's entries pool (diag::crowding).
  std::int64_t crowding(std::int64_t target_position) const {
    lookup(target_position);
    const std::int64_t L = config_.record.length();
    return diag::crowding(geom_, target_position, L,
                          span<const std::int64_t>(record_starts_.data(), record_starts_.size()), L);
  }

  // The geometry of the probe's streams (the policy's own for full attention and DeepSeek-V4).
  const geometry& stream_geometry() const noexcept { return geom_; }

 private:
  std::int32_t lookup(std::int64_t target_position) const {
    if (!prepared_)
      phasekv::detail::fail<input_error>("needle_probe: target_position", target_position,
                                         "cannot be tried before prepare()");
    const auto it = targets_.find(target_position);
    if (it == targets_.end())
      phasekv::detail::fail<input_error>("needle_probe: target_position", target_position,
                                         "was not among the prepared targets");
    return it->second;
  }

  // Vocabulary: key tokens [0, R·K) (record i: i·K + j), value tokens [R·K, R·(K + V)) (record
  // i: R·K + i·V + j), the filler tokens, then the query token.
  void build_embeddings() {
    const std::int64_t C = config_.channels, R = config_.records;
    const std::int64_t K = config_.record.key_tokens, V = config_.record.value_tokens;
    const std::int64_t vocab = R * (K + V) + needle_config::filler_vocabulary + 1;
    std::mt19937_64 rng(phasekv::detail::mix64(config_.seed, 0xE3B));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> common(static_cast<std::size_t>(C));
    for (auto& x : common) x = normal(rng);
    embeddings_.resize(vocab, C);
    const float a = static_cast<float>(std::sqrt(config_.kappa)), b = static_cast<float>(std::sqrt(1.0 - config_.kappa));
    // u0 and u_tok normalised first, so the shared cosine is κ up to the random overlap.
    const float inv_common = 1.0f / Eigen::Map<Eigen::VectorXf>(common.data(), C).norm();
    Eigen::VectorXf u(C);
    for (std::int64_t v = 0; v < vocab; ++v) {
      for (std::int64_t c = 0; c < C; ++c) u(c) = normal(rng);
      u /= u.norm();
      for (std::int64_t c = 0; c < C; ++c) embeddings_(v, c) = a * common[static_cast<std::size_t>(c)] * inv_common + b * u(c);
      embeddings_.row(v).normalize();
    }
    // A record's key summary (its query, and the feature its later tokens carry) and its value's
    // answer embedding: the normalised sums of its key and of its value token embeddings (the
    // embedding itself for one token).
    auto sums = [&](std::int64_t base, std::int64_t n) {
      matrix out(R, C);
      for (std::int64_t i = 0; i < R; ++i) {
        out.row(i) = embeddings_.middleRows(base + i * n, n).colwise().sum();
        out.row(i).normalize();
      }
      return out;
    };
    key_summaries_ = K == 1 ? matrix() : sums(0, K);
    value_embeddings_ = V == 1 ? matrix(embeddings_.middleRows(R * K, R)) : sums(R * K, V);
    gate_vector_.resize(0);
    if (config_.policy == needle_policy::positional_gates) {  // λ·z, z ~ N(0, I): the gates' content part
      gate_vector_.resize(C);
      for (std::int64_t c = 0; c < C; ++c) gate_vector_(c) = config_.gate_content * normal(rng);
    }
  }
  const float* key_summary(std::int32_t id) const {
    return config_.record.key_tokens == 1 ? embeddings_.row(id).data() : key_summaries_.row(id).data();
  }

  // The fraction of an entry's weight that the best-placed record gets: the largest sum of
  // min(L, W) consecutive slot weights over the total (min(L, W)/W for a mean pool).
  double record_share(const std::vector<float>& weights) const {
    const std::int64_t W = config_.effective_window();
    const std::int64_t n = std::min(config_.record.length(), W);
    if (weights.empty()) return static_cast<double>(n) / static_cast<double>(W);
    double total = 0.0, best = 0.0;
    for (float w : weights) total += w;
    for (std::int64_t i = 0; i + n <= W; ++i) {
      double run = 0.0;
      for (std::int64_t k = 0; k < n; ++k) run += weights[static_cast<std::size_t>(i + k)];
      best = std::max(best, run);
    }
    return total > 0.0 ? best / total : 0.0;
  }

  // Expected logit gap per unit β of a whole match (see top).
  double margin() const {
    const double k = 1.0 - config_.kappa;
    const double W = static_cast<double>(config_.effective_window());
    switch (config_.policy) {
      case needle_policy::full_attention:
      case needle_policy::concentrated_gates: return k;
      case needle_policy::mean_pool: return k * record_share({});
      case needle_policy::rope_after_pool: return k * record_share({}) * 0.75;
      case needle_policy::fixed_weight: return k * record_share(config_.resolved_slot_profile());
      case needle_policy::positional_gates: {
        std::vector<float> weights = config_.resolved_slot_profile();
        const float top = *std::max_element(weights.begin(), weights.end());
        for (float& w : weights) w = std::exp(w - top);
        return k * record_share(weights);
      }
      case needle_policy::deepseek_v4_csa: {
        const double entry_norm = std::sqrt(4.0 * config_.kappa + 2.0 * k / W);
        return k * record_share({}) * std::sqrt(static_cast<double>(config_.channels)) / entry_norm * 0.75;
      }
    }
    return k;
  }

  void build_engine() {
    const std::int64_t S = config_.effective_stride(), W = config_.effective_window(), H = config_.effective_heads();
    const std::int64_t C = config_.channels;
    const geometry geom{S, W, config_.origin, anchor_mode::block_start};
    const std::int64_t entries = geom.completed_entries(config_.tokens) + 1;
    constexpr std::int64_t page_size = 256;
    const std::int64_t pages = (entries + page_size - 1) / page_size + 2;
    reader_config rc;
    rc.name = "needle.reader";
    rc.query_heads = H;
    rc.key_stream = 0;
    rc.value_stream = 1;
    if (config_.top_k > 0) {
      rc.indexer_stream = 0;
      rc.indexer_heads = 1;
      rc.top_k = config_.top_k;
    }
    stream_config keys;
    keys.name = "needle.keys";
    keys.role = stream_role::key;
    keys.channels = C;
    keys.kv_heads = H;
    stream_config values = keys;
    values.name = "needle.values";
    values.role = stream_role::value;

    const double n_visible = std::max(1.0, static_cast<double>(config_.tokens) / static_cast<double>(S));
    logit_scale_ = config_.logit_scale > 0.0f ? config_.logit_scale
                                              : static_cast<float>((std::log(n_visible) + 6.0) / margin());
    rc.scale = logit_scale_;
    rope_channels_ = 0;
    gated_logits_ = 0;
    gate_matrices_.clear();
    geom_ = geom;

    // The layer: its streams by pooling id (probe_poolings) and their learned parameters.
    layer_kind kind;
    kind.name = "needle";
    kind.geom = geom;
    kind.page_size = page_size;
    std::vector<stream_params> params(2);
    const auto stream = [](stream_config c, const char* pooling, rope_placement rope = rope_placement::none,
                           entry_norm norm = entry_norm::none) {
      stream_spec st;
      st.config = std::move(c);
      st.pooling = pooling;
      st.rope = rope;
      st.norm = norm;
      return st;
    };
    switch (config_.policy) {
      case needle_policy::full_attention:
      case needle_policy::mean_pool:
        kind.streams = {stream(keys, "mean"), stream(values, "mean")};
        break;
      case needle_policy::fixed_weight:
        kind.streams = {stream(keys, "fixed_weights"), stream(values, "fixed_weights")};
        params[0].slot_profile = params[1].slot_profile = config_.resolved_slot_profile();
        break;
      case needle_policy::concentrated_gates:
      case needle_policy::positional_gates:
        kind.streams = {stream(keys, "scalar_gates"), stream(values, "scalar_gates")};
        if (config_.policy == needle_policy::concentrated_gates) {
          params[0].slot_bias = config_.key_slot_bias.empty() ? config_.concentrated_slot_bias(false) : config_.key_slot_bias;
          params[1].slot_bias =
              config_.value_slot_bias.empty() ? config_.concentrated_slot_bias(true) : config_.value_slot_bias;
        } else {  // one bias profile on both streams, content logits λ·(z·e(tok)) (z: build_embeddings)
          params[0].slot_bias = params[1].slot_bias = config_.resolved_slot_profile();
        }
        gated_logits_ = 1;
        break;
      case needle_policy::rope_after_pool:
        keys.rope.channels = (C / 4) & ~std::int64_t{1};
        rope_channels_ = keys.rope.channels;
        rope_ = rope_rotation(keys.rope, C);
        kind.streams = {stream(keys, "mean.rope_after_pool", rope_placement::after_pool), stream(values, "mean")};
        break;
      case needle_policy::deepseek_v4_csa: {
        stream_config kv = presets::deepseek_kv_stream(presets::deepseek_v4_csa_layer);
        kv.name = "needle.kv";
        kv.channels = C;
        kv.rope.channels = (C / 4) & ~std::int64_t{1};
        rope_channels_ = kv.rope.channels;
        rope_ = rope_rotation(kv.rope, C);
        params.resize(1);
        std::mt19937_64 rng(phasekv::detail::mix64(config_.seed, 0xD5));
        std::normal_distribution<float> bias(0.0f, 0.5f), z(0.0f, 1.0f / std::sqrt(static_cast<float>(C)));
        params[0].slot_bias.resize(static_cast<std::size_t>(W * C));
        for (auto& x : params[0].slot_bias) x = bias(rng);
        gate_matrices_.resize(static_cast<std::size_t>(geom.branches()));
        for (auto& m : gate_matrices_) {
          m.resize(C, C);
          for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = z(rng);
        }
        gated_logits_ = C;
        rc.value_stream = 0;
        rc.derotate_output = true;
        geom_ = presets::deepseek_v4_csa_layer.geom;
        kind.geom = geom_;
        kind.streams = {stream(kv, "deepseek_v4_csa", rope_placement::after_pool, entry_norm::rms)};
        break;
      }
    }
    engine_ = std::make_unique<detail::probe_engine>(std::move(kind), std::move(params), pages, rc);
    value_stream_ = rc.value_stream;
    views_ = geom.branches();
    prepared_ = false;
    log_.reset();
  }

  // The prepared tokens through the cache's write path.
  void compress() {
    engine_->reset();
    for_each_chunk([&](std::int64_t n, const auto& payload, const auto& logits) { engine_->append(n, payload, logits); });
  }

  // f(tokens, payload per stream, logits per stream) for the prepared tokens in chunks, built on
  // the fly. Key payload at t = e(tok_t) + f_t (see the top): f_t = the record's key summary at its
  // gap and value tokens, nothing at its key tokens after the first (the previous key token
  // there would double the key's match, and attention would settle on the key instead of the
  // value), and the previous token's embedding everywhere else.
  static constexpr std::int32_t previous_token = -1, no_feature = -2;
  template <class F>
  void for_each_chunk(F&& f) {
    const std::int64_t C = config_.channels, H = config_.effective_heads(), V = views_;
    const std::int64_t n_streams = engine_->streams();
    const std::int64_t total = static_cast<std::int64_t>(tokens_.size());
    const std::int64_t chunk = 512;  // small chunks: the buffers stay in cache and are reused
    auto& payload = payload_buffers_;
    auto& logits = logit_buffers_;
    payload.resize(static_cast<std::size_t>(n_streams));
    logits.resize(static_cast<std::size_t>(n_streams));
    for (std::int64_t t0 = 0; t0 < total; t0 += chunk) {
      const std::int64_t n = std::min(chunk, total - t0);
      for (std::int64_t k = 0; k < n_streams; ++k) {
        auto& p = payload[static_cast<std::size_t>(k)];
        p.resize(static_cast<std::size_t>(n * H * V * C));
        const bool key_payload = k == 0;  // stream 0 is the key (or tied) stream
        for (std::int64_t i = 0; i < n; ++i) {
          const auto t = static_cast<std::size_t>(t0 + i);
          float* row = p.data() + i * H * V * C;
          const float* cur = embeddings_.row(tokens_[t]).data();
          const float* extra = feature_[t] >= 0                            ? key_summary(feature_[t])
                               : feature_[t] == previous_token && t > 0 ? embeddings_.row(tokens_[t - 1]).data()
                                                                        : nullptr;
          for (std::int64_t c = 0; c < C; ++c) row[c] = cur[c] + (key_payload && extra ? extra[c] : 0.0f);
          for (std::int64_t hv = 1; hv < H * V; ++hv) std::copy_n(row, C, row + hv * C);
        }
        auto& l = logits[static_cast<std::size_t>(k)];
        l.assign(static_cast<std::size_t>(n * H * V * gated_logits_), 0.0f);
        if (!gate_matrices_.empty()) {  // DeepSeek-V4: logits Z_b · e(tok) per branch
          for (std::int64_t i = 0; i < n; ++i) {
            const auto e = embeddings_.row(tokens_[static_cast<std::size_t>(t0 + i)]);
            for (std::int64_t b = 0; b < V; ++b) {
              Eigen::Map<Eigen::RowVectorXf> out(l.data() + (i * V + b) * C, C);
              out.noalias() = e * gate_matrices_[static_cast<std::size_t>(b)].transpose();
            }
          }
        } else if (gate_vector_.size() > 0) {  // positional gates: λ·(z · e(tok)), one per token
          for (std::int64_t i = 0; i < n; ++i)
            std::fill_n(l.data() + i * H * V, H * V,
                        embeddings_.row(tokens_[static_cast<std::size_t>(t0 + i)]).dot(gate_vector_));
        }
      }
      f(n, payload, logits);
    }
  }

  void prepare_query_rotation() {
    if (rope_channels_ == 0) return;
    rope_cos_.resize(static_cast<std::size_t>(rope_.pairs() * 2));
    rope_.angles(static_cast<double>(query_position_), rope_cos_.data(), rope_cos_.data() + rope_.pairs());
  }
  // The query of record `id`: its key summary, RoPE'd at the query position when the keys are.
  void write_query(std::int32_t id, float* q) const {
    std::copy_n(key_summary(id), config_.channels, q);
    if (rope_channels_ > 0) rope_.apply(q, rope_cos_.data(), rope_cos_.data() + rope_.pairs());
  }

  // f(i, record id, read-out) for every target, read in batches of up to max_batch targets (one
  // at a time with selection, whose top-k serves a single query).
  // Read-out of a target = Σ over KV heads of its query's attention output.
  static constexpr std::int64_t max_batch = 256;
  template <class F>
  void for_each_readout(span<const std::int64_t> targets, F&& f) {
    std::vector<std::int32_t> ids;
    for (std::int64_t t : targets) ids.push_back(lookup(t));  // all checked before any read
    const std::int64_t C = config_.channels, H = config_.effective_heads();
    const std::int64_t n = static_cast<std::int64_t>(ids.size());
    const std::int64_t batch = config_.top_k > 0 ? 1 : max_batch;
    prepare_query_rotation();
    Eigen::VectorXf readout(C);
    for (std::int64_t first = 0; first < n; first += batch) {
      const std::int64_t B = std::min(batch, n - first);
      queries_.resize(static_cast<std::size_t>(H * B * C));
      for (std::int64_t b = 0; b < B; ++b) {
        float* q = queries_.data() + b * C;
        write_query(ids[static_cast<std::size_t>(first + b)], q);
        for (std::int64_t g = 1; g < H; ++g) std::copy_n(q, C, queries_.data() + (g * B + b) * C);
      }
      out_.resize(static_cast<std::size_t>(H * B * C));
      engine_->read(query_position_, queries_.data(), H * B, out_.data());
      for (std::int64_t b = 0; b < B; ++b) {
        readout = Eigen::Map<const Eigen::VectorXf>(out_.data() + b * C, C);
        for (std::int64_t g = 1; g < H; ++g) readout += Eigen::Map<const Eigen::VectorXf>(out_.data() + (g * B + b) * C, C);
        f(static_cast<std::size_t>(first + b), ids[static_cast<std::size_t>(first + b)], readout);
      }
    }
  }

  needle_config config_;
  matrix embeddings_, value_embeddings_, key_summaries_;
  std::vector<matrix> gate_matrices_;
  Eigen::RowVectorXf gate_vector_;
  std::unique_ptr<detail::probe_engine> engine_;
  geometry geom_;
  std::size_t value_stream_ = 1;
  std::int64_t views_ = 1, gated_logits_ = 0, rope_channels_ = 0;
  rope_rotation rope_;
  float logit_scale_ = 1.0f;
  bool prepared_ = false;
  std::int64_t query_position_ = 0;
  std::unordered_map<std::int64_t, std::int32_t> targets_;
  std::vector<std::int32_t> tokens_, feature_;  // the prepared tokens; feature_[t]: record id or a code (for_each_chunk)
  std::vector<std::int64_t> record_starts_;     // every record's first token, increasing
  std::unique_ptr<slot_weight_log> log_;        // explain()'s, built on demand
  std::vector<float> queries_, out_, rope_cos_;
  std::vector<std::vector<float>> payload_buffers_, logit_buffers_;
  Eigen::VectorXf scores_;
};

// What needle_sweep reports per trial: success, the probability of the right value, or success
// with the cause of each failure (needle_probe::explain: one more read per failed trial).
enum class needle_outcome { success, probability, attributed };

// A phase sweep of the probe with one build per context rather than per trial: the placements
// go into haystacks by assign_haystacks (a record takes record.length() positions; isolated
// targets further apart, see below), and context c
// is prepared with salt c holding exactly the targets of haystack c, in plan order. Costs about
// M builds (haystacks) plus one read per haystack (per target with selection). The sweep's
// record must be the probe's.
inline sweep_result needle_sweep(needle_probe& probe, const sweep_config& sweep,
                                 needle_outcome kind = needle_outcome::success) {
  const record_shape& mine = probe.config().record;
  phasekv::detail::require<config_error>(
      sweep.record == mine, "needle_sweep: sweep.record length", sweep.record.length(),
      "must be the probe's record (key_tokens " + std::to_string(mine.key_tokens) + ", gap " +
          std::to_string(mine.gap) + ", value_tokens " + std::to_string(mine.value_tokens) + ")");
  const std::vector<placement> plan = plan_sweep(sweep);
  const std::vector<std::int64_t> context_of = assign_haystacks(plan, probe.config().haystack_spacing());
  std::vector<std::vector<std::int64_t>> contexts;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const auto c = static_cast<std::size_t>(context_of[i]);
    if (c >= contexts.size()) contexts.resize(c + 1);
    contexts[c].push_back(plan[i].target_position);
  }
  std::vector<std::unordered_map<std::int64_t, attributed_outcome>> found(contexts.size());
  std::vector<std::unordered_map<std::int64_t, double>> probability(contexts.size());
  for (std::size_t c = 0; c < contexts.size(); ++c) {
    if (contexts[c].empty()) continue;
    probe.prepare(contexts[c], sweep.query_position, static_cast<std::uint64_t>(c));
    const span<const std::int64_t> targets(contexts[c].data(), contexts[c].size());
    if (kind == needle_outcome::probability) {
      const std::vector<double> p = probe.probabilities(targets);
      for (std::size_t i = 0; i < p.size(); ++i) probability[c][contexts[c][i]] = p[i];
      continue;
    }
    const std::vector<char> ok = probe.trials(targets);
    for (std::size_t i = 0; i < ok.size(); ++i) {
      attributed_outcome o;
      o.success = ok[i] != 0;
      if (!o.success && kind == needle_outcome::attributed) o.cause = probe.explain(contexts[c][i]).cause;
      found[c][contexts[c][i]] = o;
    }
  }
  // run_sweep visits the same plan in the same order.
  std::size_t visit = 0;
  auto context = [&]() { return static_cast<std::size_t>(context_of[visit++]); };
  switch (kind) {
    case needle_outcome::success:
      return run_sweep(sweep, [&](const placement& p) { return found[context()].at(p.target_position).success; });
    case needle_outcome::probability:
      return run_sweep(sweep, [&](const placement& p) { return probability[context()].at(p.target_position); });
    case needle_outcome::attributed: break;
  }
  return run_sweep(sweep, [&](const placement& p) { return found[context()].at(p.target_position); });
}

}  // namespace phasekv::diag::probe
