#pragma once
// The streaming write path of one compressed stream.
//
// A stream_compressor holds what is fixed for a layer — geometry, shape, policy and learned
// parameters — and is immutable after construction, so many sequences (and threads) can share
// one. Each sequence keeps a stream_state. append() takes any number of new tokens, emits every
// entry they complete to a sink, and keeps the inputs later entries still need:
//
//   stream_compressor<compressor_policy<vector_gated_pool, rope_after_pool, rms_norm>> keys(geom, cfg, params);
//   stream_state state = keys.make_state();
//   keys.append(state, chunk, [&](const entry_view& e) { /* store e.values */ });
//
// Appending a sequence token by token, in any chunks, or as one prefill emits bit-identical
// entries: each entry is computed by the same kernel from the same rows, in the same order.
//
// Inputs may be fp32 or bf16 bits (token_chunk), per chunk and per input. A bf16 input is its
// exact fp32 widening: the kernels load bf16 rows by widening them and then run the same
// arithmetic in the same order, so entries are bit-identical to the fp32 path on the widened
// values, whatever the policy, the chunking or the mix of forms across appends. The pending ring
// stays fp32 (commit() widens bf16 rows into it). An entry whose rows all lie in a bf16 chunk
// reads them in place; one that also needs ring rows widens its chunk rows into a small scratch
// first (the first ⌈W/S⌉ entries of a chunk, and every entry of a one-token decode step).
//
// Errors: a call the configuration cannot accept throws input_error before anything changes.
// Inputs are not scanned for NaN/Inf unless append_options::check_finite is on; unchecked, they
// follow IEEE arithmetic into the entries (memory-safe, but the entries are then not finite).
// If the sink throws, the state is also left as it was before the call (the sink itself has
// then seen the entries before the one that threw).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/compress/entry_view.hpp"
#include "phasekv/compress/policies.hpp"
#include "phasekv/kernels/pooling.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/compress/stream_state.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"
#include "phasekv/core/detail/limits.hpp"
#include "phasekv/core/rope.hpp"
#include "phasekv/core/span.hpp"
#include "phasekv/detail/simd/batch.hpp"
#include "phasekv/detail/simd/bf16.hpp"
#include "phasekv/kernels/finite.hpp"
#include "phasekv/detail/simd/prefetch.hpp"

namespace phasekv {

template <class Policy, class Arch = simd::default_arch>
class stream_compressor {
  using pooling = typename Policy::pooling;
  using kernel = kernels::pool<Arch>;
  static constexpr bool gated = is_gated_v<pooling>;
  static constexpr bool vector_gates = std::is_same_v<pooling, vector_gated_pool>;
  static constexpr bool rope_before = std::is_same_v<typename Policy::rope, rope_before_pool>;
  static constexpr bool rope_after = std::is_same_v<typename Policy::rope, rope_after_pool>;
  static constexpr bool custom = is_custom_pool_v<pooling>;  // a pooling policy of the host's (policies.hpp)
  static_assert(!custom || !rope_before,
                "a pooling policy of your own composes with no_rope or rope_after_pool: rotate before "
                "appending, or rotate the pooled entry (rope_after_pool)");

 public:
  using policy = Policy;
  using arch = Arch;

  // `pool`: the pooling policy's instance — a tag for the built-ins, a policy of your own with
  // its weights (policies.hpp).
  stream_compressor(geometry geom, stream_config config, stream_params params = {}, pooling pool = {})
      : geom_(geom), config_(std::move(config)), params_(std::move(params)), pool_(std::move(pool)) {
    if constexpr (custom) check_custom_pool();
    validate_stream<Policy>(geom_, config_, params_);
    views_ = views_per_token(config_.inputs, geom_);
    gates_ = phasekv::gate_channels<pooling>(config_.channels);
    payload_per_token_ = config_.kv_heads * views_ * config_.channels;
    // gates_ ≤ 2^20 (checked for a host's pooling; at most channels for the built-ins), so the
    // product is formed only after checking it against the per-token bound.
    logits_per_token_ = detail::checked_product(config_.kv_heads * views_, gates_, limits::max_floats_per_token,
                                                config_.name + ": gate channels", gates_,
                                                "the gate logits one token hands over (kv_heads × views × gate channels)");
    if constexpr (gated) {
      if (params_.slot_bias.empty()) zero_bias_.assign(static_cast<std::size_t>(gates_), 0.0f);
    }
    if constexpr (has_rope_v<Policy>) {
      rope_entry_ = rope_rotation(config_.rope, config_.channels);
      rope_local_ = rope_rotation(config_.rope, config_.rope.channels);
    }
  }

  const geometry& geom() const noexcept { return geom_; }
  const stream_config& config() const noexcept { return config_; }
  const stream_params& params() const noexcept { return params_; }
  const pooling& pool() const noexcept { return pool_; }
  // Whether the policy rotates entries (only then does the config's `rope` mean anything): what
  // layer_compressor and paged_cache ask a stream, typed or erased (erased_stream.hpp).
  static constexpr bool applies_rope() noexcept { return has_rope_v<Policy>; }
  std::int64_t views() const noexcept { return views_; }
  std::int64_t gate_channels() const noexcept { return gates_; }
  std::int64_t payload_floats_per_token() const noexcept { return payload_per_token_; }
  std::int64_t logit_floats_per_token() const noexcept { return logits_per_token_; }
  std::int64_t floats_per_entry() const noexcept { return config_.kv_heads * config_.channels; }
  // The view slot i reads: its branch, or the slot itself for per-slot inputs.
  std::int64_t view_of_slot(std::int64_t slot) const noexcept {
    return config_.inputs == input_layout::per_branch ? geom_.branch_of_slot(slot) : slot;
  }

  // A fresh state. `history` extra tokens of inputs are kept beyond the W the write path needs,
  // so that truncate() can roll back that far (speculative decoding, beam pruning).
  // Throws input_error for a history outside [0, 2^40] or whose rings would exceed 2^48 bytes,
  // capacity_error when the rings cannot be allocated.
  stream_state make_state(std::int64_t history = 0) const {
    const std::string field = config_.name + ": history";
    detail::require<input_error>(history >= 0 && history <= limits::max_history, field, history,
                                 "must lie in [0, 2^40]");
    const std::int64_t rows = geom_.window + history;
    const std::int64_t floats = detail::checked_product<input_error>(
        rows, payload_per_token_ + logits_per_token_, limits::max_bytes / 4, field, history,
        "the state's input rings (floats)");
    stream_state s;
    s.ring_rows_ = rows;
    s.stride_ = geom_.stride;
    s.origin_ = geom_.origin;
    s.window_ = geom_.window;
    s.payload_floats_ = payload_per_token_;
    s.logit_floats_ = logits_per_token_;
    detail::allocate_or_fail(
        [&] {
          s.payload_ring_.assign(static_cast<std::size_t>(rows * payload_per_token_), 0.0f);
          s.logit_ring_.assign(static_cast<std::size_t>(rows * logits_per_token_), 0.0f);
          s.scratch_.assign(scratch_floats(), 0.0f);
          s.rows_.assign(row_pointers(), nullptr);
          s.rows_bf16_.assign(bf16_row_pointers(), nullptr);
          s.ahead_.assign(ahead_rows(), simd::prefetch_row{});
        },
        field, history, floats * 4);
    return s;
  }

  // Entries an append of `tokens` more tokens would emit.
  std::int64_t entries_after(const stream_state& state, std::int64_t tokens) const noexcept {
    return geom_.completed_entries(state.tokens_ + tokens) - state.entries_;
  }

  // Throws input_error unless append(state, chunk, …, options) would be accepted. Messages are
  // built only on failure: this runs on every decode step.
  void check(const stream_state& state, const token_chunk& chunk, const append_options& options = {}) const {
    const std::string& n = config_.name;
    if (chunk.tokens < 0 || chunk.tokens > limits::max_tokens - state.tokens_)
      detail::fail<input_error>(n + ": chunk.tokens", chunk.tokens,
                                "must lie in [0, 2^48 − " + std::to_string(state.tokens_) + " tokens already appended]");
    if (!fits(state))
      detail::fail<input_error>(n + ": state", describe(state),
                                "was not made for this compressor (S=" + std::to_string(geom_.stride) +
                                    " W=" + std::to_string(geom_.window) + " origin=" + std::to_string(geom_.origin) +
                                    ", " + std::to_string(payload_per_token_) + "+" +
                                    std::to_string(logits_per_token_) +
                                    " input floats per token): make it with this compressor's make_state()");
    // Each input in exactly one form: the bf16 one when it is given, else the fp32 one.
    check_input(chunk.payload, chunk.payload_bf16, chunk.tokens, payload_per_token_, "payload",
                "tokens × kv_heads × views × channels");
    if constexpr (gated) {
      check_input(chunk.logits, chunk.logits_bf16, chunk.tokens, logits_per_token_, "logits",
                  "tokens × kv_heads × views × gate channels");
    } else {
      if (!chunk.logits.empty())
        detail::fail<input_error>(n + ": chunk.logits.size()", chunk.logits.size(),
                                  "must be 0: this pooling policy reads no gate logits");
      if (!chunk.logits_bf16.empty())
        detail::fail<input_error>(n + ": chunk.logits_bf16.size()", chunk.logits_bf16.size(),
                                  "must be 0: this pooling policy reads no gate logits");
    }
    if (options.check_finite) {
      if (chunk.payload_is_bf16()) require_finite(chunk.payload_bf16, "payload_bf16");
      else require_finite(chunk.payload, "payload");
      if constexpr (gated) {
        if (chunk.logits_are_bf16()) require_finite(chunk.logits_bf16, "logits_bf16");
        else require_finite(chunk.logits, "logits");
      }
    }
    if constexpr (has_rope_v<Policy>)
      if (config_.rope.table) check_rope_positions(state, chunk);
    // After host-computed entries (skip()), the inputs the next entry pools may not be kept.
    if (chunk.tokens > 0 && !continues(state))
      detail::fail<input_error>(n + ": state", describe(state),
                                "does not hold the inputs of tokens [" + std::to_string(needed_from(state)) + ", " +
                                    std::to_string(state.intact_from_) +
                                    ") that its next entry pools: the entries so far were the host's "
                                    "(skip), so continue with host-computed entries");
  }

  // Whether append() can continue the state: the inputs its next entry pools are kept (always,
  // unless skip() advanced it past tokens whose entries the host computed).
  bool continues(const stream_state& s) const noexcept {
    const std::int64_t from = needed_from(s);
    return from >= s.intact_from_ || from >= s.tokens_;
  }

  // Advances the state by `tokens` tokens whose entries the host computed itself (appended to the
  // cache as they are, not pooled here): counts move on, no inputs are kept for them. append()
  // then continues only where the next entry pools no token before the skipped ones' end (W = S
  // at an entry boundary); otherwise the sequence goes on with host entries. Cannot fail once
  // check_skip() accepted it.
  void check_skip(const stream_state& state, std::int64_t tokens) const {
    if (tokens < 0 || tokens > limits::max_tokens - state.tokens_)
      detail::fail<input_error>(config_.name + ": tokens", tokens,
                                "must lie in [0, 2^48 − " + std::to_string(state.tokens_) + " tokens already appended]");
    if (!fits(state))
      detail::fail<input_error>(config_.name + ": state", describe(state),
                                "was not made for this compressor: make it with this compressor's make_state()");
  }
  void skip(stream_state& s, std::int64_t tokens) const noexcept {
    if (tokens == 0) return;
    s.tokens_ += tokens;
    s.entries_ = geom_.completed_entries(s.tokens_);
    s.intact_from_ = s.tokens_;
    s.host_fed_ = true;
  }

  // Appends the chunk and calls sink(const entry_view&) for each entry it completes, in order.
  // Returns the number of entries emitted.
  template <class Sink>
  std::int64_t append(stream_state& state, const token_chunk& chunk, Sink&& sink,
                      const append_options& options = {}) const {
    check(state, chunk, options);
    const std::int64_t emitted = emit(state, chunk, sink, options);
    commit(state, chunk);
    return emitted;
  }

  // append() in two phases, for callers that must keep several streams in step (a layer):
  // emit() computes and hands out the entries the chunk completes without advancing the state;
  // commit() then advances it and cannot fail. Call check() first; emit() assumes a valid chunk.
  template <class Sink>
  std::int64_t emit(stream_state& state, const token_chunk& chunk, Sink&& sink, const append_options& options = {}) const {
    if (state.scratch_.size() != scratch_floats()) state.scratch_.assign(scratch_floats(), 0.0f);
    if (state.rows_.size() != row_pointers()) state.rows_.assign(row_pointers(), nullptr);
    if (state.rows_bf16_.size() != bf16_row_pointers()) state.rows_bf16_.assign(bf16_row_pointers(), nullptr);
    if (state.ahead_.size() != ahead_rows()) state.ahead_.assign(ahead_rows(), simd::prefetch_row{});
    const std::int64_t last_entry = geom_.completed_entries(state.tokens_ + chunk.tokens);
    // Before any entry, so a failure changes nothing observable: capacity_error, like make_state.
    if ((chunk.payload_is_bf16() || chunk.logits_are_bf16()) && last_entry > state.entries_ &&
        state.widened_.size() != widened_floats())
      detail::allocate_or_fail([&] { state.widened_.assign(widened_floats(), 0.0f); },
                               config_.name + ": bf16 rows widened per entry (floats)",
                               static_cast<std::int64_t>(widened_floats()),
                               static_cast<std::int64_t>(widened_floats() * sizeof(float)));
    const std::size_t input_bytes = (chunk.payload.size() + chunk.logits.size()) * sizeof(float) +
                                    (chunk.payload_bf16.size() + chunk.logits_bf16.size()) * sizeof(std::uint16_t);
    const bool prefetch = static_cast<std::int64_t>(input_bytes) >= kernels::prefetch_min_bytes;
    for (std::int64_t j = state.entries_; j < last_entry; ++j) {
      const entry_view e = compute_entry(state, chunk, j, options.slot_weights, prefetch && j + 1 < last_entry);
      if (options.check_finite) require_finite_entry(e);
      sink(e);
    }
    return last_entry - state.entries_;
  }

  // Keeps the last W + history tokens' inputs (future entries need at most W − 1 of them), in
  // fp32: bf16 rows are widened (exactly) into the ring.
  void commit(stream_state& s, const token_chunk& chunk) const noexcept {
    const std::int64_t t0 = s.tokens_, t_end = t0 + chunk.tokens;
    for (std::int64_t t = std::max(t0, t_end - s.ring_rows_); t < t_end; ++t) {
      const std::int64_t row = floor_mod(t, s.ring_rows_);
      float* payload = s.payload_ring_.data() + row * payload_per_token_;
      if (chunk.payload_is_bf16())
        simd::widen<Arch>(chunk.payload_bf16.data() + (t - t0) * payload_per_token_, payload, payload_per_token_);
      else
        simd::widen(chunk.payload.data() + (t - t0) * payload_per_token_, payload, payload_per_token_);
      if constexpr (gated) {
        float* logits = s.logit_ring_.data() + row * logits_per_token_;
        if (chunk.logits_are_bf16())
          simd::widen<Arch>(chunk.logits_bf16.data() + (t - t0) * logits_per_token_, logits, logits_per_token_);
        else
          simd::widen(chunk.logits.data() + (t - t0) * logits_per_token_, logits, logits_per_token_);
      }
    }
    s.tokens_ = t_end;
    s.entries_ = geom_.completed_entries(t_end);
    s.intact_from_ = std::max(s.intact_from_, t_end - s.ring_rows_);
    if (chunk.tokens > 0) s.host_fed_ = false;
  }

  // The first token whose inputs the state's next entry pools.
  std::int64_t needed_from(const stream_state& s) const noexcept {
    return std::max<std::int64_t>(0, geom_.window_start(s.entries_));
  }

  // Whether truncate(state, tokens) is possible: the pending inputs of the state rolled back to
  // `tokens` must still be in the ring (the state keeps the last W + history tokens).
  // A host-fed state (its last tokens came through skip(): it keeps no token's inputs) rolls back
  // to any length: it had no inputs to lose, and goes on as skip() left it — with host entries, or
  // with append() where continues() allows.
  bool can_truncate(const stream_state& s, std::int64_t tokens) const noexcept {
    if (tokens < 0 || tokens > s.tokens_) return false;
    const std::int64_t needed_from = std::max<std::int64_t>(0, geom_.window_start(geom_.completed_entries(tokens)));
    return needed_from >= s.intact_from_ || needed_from >= tokens || host_fed(s);
  }
  static bool host_fed(const stream_state& s) noexcept { return s.host_fed_; }

  // Rolls the state back to its first `tokens` tokens: later tokens and the entries they
  // completed are forgotten (the caller drops those entries from wherever it stored them).
  void truncate(stream_state& s, std::int64_t tokens) const {
    if (!can_truncate(s, tokens))
      detail::fail<input_error>(config_.name + ": truncate to tokens", tokens,
                                tokens < 0 || tokens > s.tokens_
                                    ? "must lie in [0, " + std::to_string(s.tokens_) + "]"
                                    : "needs the inputs of tokens from " +
                                          std::to_string(std::max<std::int64_t>(
                                              0, geom_.window_start(geom_.completed_entries(tokens)))) +
                                          ", but the state keeps only tokens from " +
                                          std::to_string(s.tokens_ - s.ring_rows_) +
                                          " (make_state(history) keeps more)");
    s.tokens_ = tokens;
    s.entries_ = geom_.completed_entries(tokens);
    s.intact_from_ = std::min(s.intact_from_, tokens);  // rows from `tokens` on are rewritten before they are read
    s.host_fed_ = s.host_fed_ && tokens > 0;             // rolled back to 0 it is a fresh state
  }

 private:
  // --- scratch layout: [values H·C][slot weights H·W][weights W][alpha W·lanes]
  //                     [entry cos/sin R/2 each][slot cos/sin W·R/2 each][rotated rows W·R]
  std::size_t scratch_floats() const noexcept {
    const std::int64_t w = geom_.window, half = has_rope_v<Policy> ? config_.rope.channels / 2 : 0;
    return static_cast<std::size_t>(config_.kv_heads * config_.channels + config_.kv_heads * w + w +
                                    w * kernel::lanes + 2 * half + 2 * w * half + w * 2 * half);
  }

  // Row pointers of compute_entry: x, logit, bias and their RoPE-before twins (W each); the bf16
  // payload and logit rows read in place and the logits' RoPE-before twins (W each); the next
  // entry's payload and logit rows (2·W).
  std::size_t row_pointers() const noexcept { return static_cast<std::size_t>(6 * geom_.window); }
  std::size_t bf16_row_pointers() const noexcept { return static_cast<std::size_t>(3 * geom_.window); }
  std::size_t ahead_rows() const noexcept { return static_cast<std::size_t>(2 * geom_.window); }
  // One head's W payload rows and W logit rows widened from a bf16 chunk.
  std::size_t widened_floats() const noexcept {
    return static_cast<std::size_t>(geom_.window * (config_.channels + gates_));
  }

  // A state fits when it was made by a compressor of this geometry and per-token shape: it holds
  // only the host's inputs and counters, so any such compressor may continue it (e.g. one with
  // other gate parameters, for an intervention).
  bool fits(const stream_state& s) const noexcept {
    return s.stride_ == geom_.stride && s.origin_ == geom_.origin && s.window_ == geom_.window &&
           s.payload_floats_ == payload_per_token_ && s.logit_floats_ == logits_per_token_ &&
           s.ring_rows_ >= geom_.window &&
           s.payload_ring_.size() == static_cast<std::size_t>(s.ring_rows_ * payload_per_token_) &&
           s.logit_ring_.size() == static_cast<std::size_t>(s.ring_rows_ * logits_per_token_);
  }
  static std::string describe(const stream_state& s) {
    return "S=" + std::to_string(s.stride_) + " W=" + std::to_string(s.window_) + " origin=" +
           std::to_string(s.origin_) + ", " + std::to_string(s.payload_floats_) + "+" +
           std::to_string(s.logit_floats_) + " input floats per token";
  }

  // One input (payload or logits) of a chunk: given in one form at most, bf16 or fp32, of
  // tokens × per_token elements.
  void check_input(span<const float> fp32, span<const std::uint16_t> bf16, std::int64_t tokens, std::int64_t per_token,
                   const std::string& name, const char* shape) const {
    if (!fp32.empty() && !bf16.empty())
      detail::fail<input_error>(config_.name + ": chunk." + name + "_bf16.size()", bf16.size(),
                                "must be 0 when chunk." + name + " (fp32) is given (size " +
                                    std::to_string(fp32.size()) + "): give the " + name + " in one form");
    if (!bf16.empty())
      check_span(bf16, tokens, per_token, (name + "_bf16").c_str(), shape);
    else
      check_span(fp32, tokens, per_token, name.c_str(), shape);
  }

  // `tokens` × `per_token` must equal the span's size; the product is formed only when it cannot
  // overflow (a huge token count with a small span is an error, not a wrapped-around match).
  template <class T>
  void check_span(span<const T> s, std::int64_t tokens, std::int64_t per_token, const char* what,
                  const char* shape) const {
    if (s.data() == nullptr && s.size() != 0)
      detail::fail<input_error>(config_.name + ": chunk." + what + ".data()", "null",
                                "must not be null when the size is " + std::to_string(s.size()));
    std::int64_t expected = 0;
    const bool representable = detail::product_within(tokens, per_token, limits::max_bytes, expected);
    if (!representable || s.size() != static_cast<std::size_t>(expected))
      detail::fail<input_error>(config_.name + ": chunk." + what + ".size()", s.size(),
                                "must be " + (representable ? std::to_string(expected) : std::string("chunk.tokens × ") +
                                                                                             std::to_string(per_token)) +
                                    " (" + shape + ")");
  }

  void require_finite(span<const float> s, const char* what) const {
    for (std::size_t k = 0; k < s.size(); ++k)
      if (!std::isfinite(s[k])) not_finite(k, s[k], what);
  }
  // bf16 is not finite when its exponent bits are all ones (±Inf, NaN), as for fp32.
  void require_finite(span<const std::uint16_t> s, const char* what) const {
    for (std::size_t k = 0; k < s.size(); ++k)
      if (!simd::bf16_is_finite(s[k])) not_finite(k, simd::bf16_to_float(s[k]), what);
  }
  // Finite inputs can still pool to a non-finite entry: a sum that overflows fp32 (inputs near
  // 3.4e38), or a host's pooling that returns NaN. Under check_finite that entry is refused
  // before the sink sees it, so nothing is stored.
  void require_finite_entry(const entry_view& e) const {
    const std::int64_t n = e.kv_heads * e.channels;
    if (kernels::all_finite(e.values, n)) return;
    for (std::int64_t i = 0; i < n; ++i)
      if (!std::isfinite(e.values[i]))
        detail::fail<input_error>(config_.name + ": entry " + std::to_string(e.index) + " value[" + std::to_string(i) + "]",
                                  e.values[i],
                                  std::string("is not finite although its inputs are: the ") + pooling_name() +
                                      " pooling overflowed fp32 or returned it (append_options.check_finite is on)");
  }
  static const char* pooling_name() noexcept {
    if constexpr (custom) return pooling::name;
    else return "built-in";
  }
  [[noreturn]] void not_finite(std::size_t k, float value, const char* what) const {
    const std::int64_t per_token = what[0] == 'p' ? payload_per_token_ : logits_per_token_;
    detail::fail<input_error>(config_.name + ": chunk." + what + "[token " +
                                  std::to_string(static_cast<std::int64_t>(k) / per_token) + ", element " +
                                  std::to_string(static_cast<std::int64_t>(k) % per_token) + "]",
                              value, "must be finite (append_options.check_finite is on)");
  }

  // With a host RoPE table, every position the entries this chunk completes rotate at must be
  // one of its rows: the anchors (RoPE after pooling; they grow with the entry index) or the
  // slots' tokens (before pooling; the latest is the last entry's last slot).
  void check_rope_positions(const stream_state& s, const token_chunk& chunk) const {
    const std::int64_t first = s.entries_, last = geom_.completed_entries(s.tokens_ + chunk.tokens);
    if (last <= first) return;
    const rope_table& table = *config_.rope.table;
    auto beyond = [&](const std::string& what, std::int64_t position) {
      detail::fail<input_error>(config_.name + ": " + what, position,
                                "must lie in rope.table's positions [0, " + std::to_string(table.positions) +
                                    "): the host's RoPE table is too short for this append");
    };
    if constexpr (rope_after) {
      for (const std::int64_t j : {first, last - 1}) {
        const std::int64_t p = geom_.anchor_position(j);
        if (!table.covers(p)) beyond("RoPE position (anchor) of entry " + std::to_string(j), p);
      }
    } else {
      const std::int64_t p = geom_.slot_token(last - 1, geom_.window - 1);
      if (!table.covers(p)) beyond("RoPE position of token", p);
    }
  }

  // Token t's input rows: from the chunk if it arrived in this call, else from the ring (fp32).
  // The fp32 forms serve ring rows and fp32 chunks; the bf16 ones rows of a bf16 chunk.
  const float* payload_row(const stream_state& s, const token_chunk& chunk, std::int64_t t) const noexcept {
    return t >= s.tokens_ ? chunk.payload.data() + (t - s.tokens_) * payload_per_token_
                          : s.payload_ring_.data() + floor_mod(t, s.ring_rows_) * payload_per_token_;
  }
  const float* logit_row(const stream_state& s, const token_chunk& chunk, std::int64_t t) const noexcept {
    return t >= s.tokens_ ? chunk.logits.data() + (t - s.tokens_) * logits_per_token_
                          : s.logit_ring_.data() + floor_mod(t, s.ring_rows_) * logits_per_token_;
  }
  const std::uint16_t* payload_row_bf16(const stream_state& s, const token_chunk& chunk, std::int64_t t) const noexcept {
    return chunk.payload_bf16.data() + (t - s.tokens_) * payload_per_token_;
  }
  const std::uint16_t* logit_row_bf16(const stream_state& s, const token_chunk& chunk, std::int64_t t) const noexcept {
    return chunk.logits_bf16.data() + (t - s.tokens_) * logits_per_token_;
  }
  // Elements [offset, …) of token t's payload or logit row, wherever and in whatever form it is.
  simd::prefetch_row payload_prefetch(const stream_state& s, const token_chunk& chunk, std::int64_t t,
                                      std::int64_t offset) const noexcept {
    if (t >= s.tokens_ && chunk.payload_is_bf16())
      return {reinterpret_cast<const unsigned char*>(payload_row_bf16(s, chunk, t) + offset), 2};
    return {reinterpret_cast<const unsigned char*>(payload_row(s, chunk, t) + offset), 4};
  }
  simd::prefetch_row logit_prefetch(const stream_state& s, const token_chunk& chunk, std::int64_t t,
                                    std::int64_t offset) const noexcept {
    if (t >= s.tokens_ && chunk.logits_are_bf16())
      return {reinterpret_cast<const unsigned char*>(logit_row_bf16(s, chunk, t) + offset), 2};
    return {reinterpret_cast<const unsigned char*>(logit_row(s, chunk, t) + offset), 4};
  }

  // `next_follows`: entry j + 1 is computed next in the same call and its rows are to be
  // prefetched (see kernels/pooling.hpp).
  entry_view compute_entry(stream_state& s, const token_chunk& chunk, std::int64_t j, bool want_weights,
                           bool next_follows) const {
    const std::int64_t W = geom_.window, C = config_.channels, H = config_.kv_heads;
    const std::int64_t R = has_rope_v<Policy> ? config_.rope.channels : 0, half = R / 2;
    const std::int64_t first = geom_.first_real_slot(j), n = W - first;

    float* values = s.scratch_.data();
    float* slot_weights = values + H * C;
    float* weights = slot_weights + H * W;
    float* alpha = weights + W;
    float* entry_cos = alpha + W * kernel::lanes;
    float* entry_sin = entry_cos + half;
    float* slot_cos = entry_sin + half;
    float* slot_sin = slot_cos + W * half;
    float* rotated = slot_sin + W * half;
    const float** x = s.rows_.data();
    const float** logit = x + W;
    const float** bias = logit + W;
    const float** x_rot = bias + W;
    const float** logit_rot = x_rot + W;
    const float** bias_rot = logit_rot + W;
    const std::uint16_t** x16 = s.rows_bf16_.data();
    const std::uint16_t** logit16 = x16 + W;
    const std::uint16_t** logit16_rot = logit16 + W;
    simd::prefetch_row* ahead = s.ahead_.data();  // 2·W rows

    // How this entry reads a bf16 input: in place when every one of its rows lies in the chunk;
    // otherwise some come from the (fp32) ring, and the chunk's rows are widened into `widened`
    // so that the kernel sees one row type. Either way the kernel pools the same fp32 values.
    bool all_in_chunk = true;
    for (std::int64_t k = 0; k < n; ++k) all_in_chunk = all_in_chunk && geom_.slot_token(j, first + k) >= s.tokens_;
    // A pooling of the host's reads fp32 rows unless it declares reads_bf16_rows (policies.hpp).
    constexpr bool reads_bf16 = !custom || pool_reads_bf16_rows_v<pooling>;
    const bool payload_in_place = reads_bf16 && chunk.payload_is_bf16() && all_in_chunk;
    const bool payload_widen = chunk.payload_is_bf16() && !payload_in_place;
    const bool logits_in_place = reads_bf16 && gated && chunk.logits_are_bf16() && all_in_chunk;
    const bool logits_widen = gated && chunk.logits_are_bf16() && !logits_in_place;
    float* widened_x = payload_widen || logits_widen ? s.widened_.data() : nullptr;  // [W][C]
    float* widened_logit = widened_x ? widened_x + W * C : nullptr;                   // [W][gates]

    if (want_weights) std::fill(slot_weights, slot_weights + H * W, 0.0f);
    if constexpr (rope_before)
      for (std::int64_t k = 0; k < n; ++k)
        rope_local_.angles(static_cast<double>(geom_.slot_token(j, first + k)), slot_cos + k * half, slot_sin + k * half);

    for (std::int64_t h = 0; h < H; ++h) {
      float* out = values + h * C;
      for (std::int64_t k = 0; k < n; ++k) {
        const std::int64_t slot = first + k, t = geom_.slot_token(j, slot);
        const std::int64_t view = h * views_ + view_of_slot(slot);
        if (payload_in_place) {
          x16[k] = payload_row_bf16(s, chunk, t) + view * C;
        } else if (payload_widen && t >= s.tokens_) {
          simd::widen<Arch>(payload_row_bf16(s, chunk, t) + view * C, widened_x + k * C, C);
          x[k] = widened_x + k * C;
        } else {
          x[k] = payload_row(s, chunk, t) + view * C;
        }
        if constexpr (gated) {
          if (logits_in_place) {
            logit16[k] = logit_row_bf16(s, chunk, t) + view * gates_;
          } else if (logits_widen && t >= s.tokens_) {
            simd::widen<Arch>(logit_row_bf16(s, chunk, t) + view * gates_, widened_logit + k * gates_, gates_);
            logit[k] = widened_logit + k * gates_;
          } else {
            logit[k] = logit_row(s, chunk, t) + view * gates_;
          }
          if constexpr (!custom)
            bias[k] = params_.slot_bias.empty() ? zero_bias_.data()
                                                : params_.slot_bias.data() + (h * W + slot) * gates_;
        }
      }

      // The rows the next entry of this call will read, for the kernels to prefetch (see
      // kernels/pooling.hpp). Its scalar-gate logits are one element per token: fetched here.
      std::int64_t ahead_count = 0;
      if (next_follows) {
        for (std::int64_t slot = geom_.first_real_slot(j + 1); slot < W; ++slot) {
          const std::int64_t t = geom_.slot_token(j + 1, slot);
          const std::int64_t view = h * views_ + view_of_slot(slot);
          ahead[ahead_count++] = payload_prefetch(s, chunk, t, view * C);
          if constexpr (vector_gates) ahead[ahead_count++] = logit_prefetch(s, chunk, t, view * gates_);
          else if constexpr (gated) simd::prefetch_bytes(logit_prefetch(s, chunk, t, view * gates_).data, 1);
        }
      }

      const auto pool_head = [&](const auto* const* xs, const auto* const* logits) {
        // Weights shared by all channels (everything but vector gates).
        if constexpr (!vector_gates) shared_weights(logits, bias, first, n, weights);

        const std::int64_t plain = C - (rope_before ? R : 0);  // channels pooled straight from the rows
        float* sums = want_weights ? slot_weights + h * W + first : nullptr;
        if constexpr (vector_gates) {
          kernel::vector_gated(xs, logits, bias, n, plain, out, sums, alpha, ahead, ahead_count);
        } else {
          kernel::weighted_sum(xs, weights, n, plain, out, ahead, ahead_count);
          if (sums) std::copy(weights, weights + n, sums);
        }

        if constexpr (rope_before) {
          // Rotate each slot's RoPE channels at its own position (widened to fp32 if bf16), then
          // pool those channels.
          for (std::int64_t k = 0; k < n; ++k) {
            float* r = rotated + k * R;
            simd::widen(xs[k] + plain, r, R);
            rope_local_.apply(r, slot_cos + k * half, slot_sin + k * half);
            x_rot[k] = r;
            if constexpr (vector_gates) bias_rot[k] = bias[k] + plain;
          }
          if constexpr (vector_gates) {
            const auto logits_rot = rows_like(logits, logit_rot, logit16_rot);
            for (std::int64_t k = 0; k < n; ++k) logits_rot[k] = logits[k] + plain;
            kernel::vector_gated(x_rot, logits_rot, bias_rot, n, R, out + plain, sums, alpha);
          } else {
            kernel::weighted_sum(x_rot, weights, n, R, out + plain);
          }
        }
      };
      if constexpr (custom) {
        window_rows rows;
        rows.entry = j;
        rows.head = h;
        rows.channels = C;
        rows.window = W;
        rows.first_slot = first;
        rows.first_position = geom_.slot_token(j, first);
        rows.payload = payload_in_place ? nullptr : x;
        rows.payload_bf16 = payload_in_place ? x16 : nullptr;
        rows.logits = gated && !logits_in_place ? logit : nullptr;
        rows.logits_bf16 = logits_in_place ? logit16 : nullptr;
        rows.slot_weights = want_weights ? slot_weights + h * W + first : nullptr;
        pool_.pool(rows, out);
      } else if constexpr (gated) {
        if (payload_in_place && logits_in_place) pool_head(x16, logit16);
        else if (payload_in_place) pool_head(x16, logit);
        else if (logits_in_place) pool_head(x, logit16);
        else pool_head(x, logit);
      } else {
        if (payload_in_place) pool_head(x16, logit);
        else pool_head(x, logit);
      }

      if constexpr (vector_gates)
        if (want_weights)
          for (std::int64_t k = 0; k < n; ++k) slot_weights[h * W + first + k] /= static_cast<float>(C);

      if constexpr (has_norm_v<Policy>) {
        const float* norm_w = params_.norm_weight.empty() ? nullptr : params_.norm_weight.data();
        const float sum_squares = kernel::sum_of_squares(out, C);
        if (std::isfinite(sum_squares) || !rms_norm_scaled(out, C, norm_w)) {
          const float mean_square = sum_squares / static_cast<float>(C);
          const float inv_rms = 1.0f / std::sqrt(mean_square + static_cast<float>(config_.norm_eps));
          kernel::scale(out, inv_rms, norm_w, C);
        }
      }
    }

    const std::int64_t anchor = geom_.anchor_position(j);
    if constexpr (rope_after) {
      rope_entry_.angles(static_cast<double>(anchor), entry_cos, entry_sin);
      for (std::int64_t h = 0; h < H; ++h) rope_entry_.apply(values + h * C, entry_cos, entry_sin);
    }

    entry_view e;
    e.index = j;
    e.anchor = anchor;
    e.kv_heads = H;
    e.channels = C;
    e.window = W;
    e.values = values;
    e.slot_weights = want_weights ? slot_weights : nullptr;
    return e;
  }

  // RMSNorm of a finite entry whose Σ x² overflows fp32 (|x| beyond ~1.8e19): with m = max |x|,
  // x · rsqrt(mean(x²) + eps) = (x / m) · rsqrt(mean((x / m)²) + eps / m²), and every (x / m)² ≤ 1,
  // so nothing overflows (in double, eps / m² stays representable). Without it the inf sum gave
  // rsqrt → 0 and an entry of zeros. Only this rare path pays for the extra passes, so an entry
  // whose sum is finite keeps its bit-exact result. False, with `out` untouched, when some x is
  // not finite (check_finite off): the plain formula then gives its IEEE result as before.
  bool rms_norm_scaled(float* out, std::int64_t C, const float* norm_w) const noexcept {
    float m = 0.0f;
    for (std::int64_t c = 0; c < C; ++c) {
      if (!std::isfinite(out[c])) return false;
      m = std::max(m, std::fabs(out[c]));
    }
    double sum = 0.0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double r = static_cast<double>(out[c]) / m;
      sum += r * r;
    }
    const double scaled_eps = config_.norm_eps / (static_cast<double>(m) * m);
    const double inv = 1.0 / std::sqrt(sum / static_cast<double>(C) + scaled_eps);
    for (std::int64_t c = 0; c < C; ++c) {
      const double y = static_cast<double>(out[c]) / m * inv;
      out[c] = static_cast<float>(norm_w ? y * norm_w[c] : y);
    }
    return true;
  }

  // The row-pointer array of the same element type as `like` (fp32 or bf16 rows).
  static const float** rows_like(const float* const*, const float** f, const std::uint16_t**) noexcept { return f; }
  static const std::uint16_t** rows_like(const std::uint16_t* const*, const float**, const std::uint16_t** b) noexcept {
    return b;
  }

  // α_k for the n real slots when one weight serves every channel.
  template <class L>
  void shared_weights(const L* const* logit, const float* const* bias, std::int64_t first, std::int64_t n,
                      float* w) const noexcept {
    if constexpr (std::is_same_v<pooling, mean_pool>) {
      std::fill(w, w + n, 1.0f / static_cast<float>(n));
    } else if constexpr (std::is_same_v<pooling, fixed_weight_pool>) {
      double sum = 0.0;
      for (std::int64_t k = 0; k < n; ++k) sum += params_.slot_profile[first + k];
      // Every real slot weighted 0 (a one-hot profile on a padding slot): the entry is zero.
      const double inv = sum > 0.0 ? 1.0 / sum : 0.0;
      for (std::int64_t k = 0; k < n; ++k) w[k] = static_cast<float>(params_.slot_profile[first + k] * inv);
    } else {  // scalar gates: one softmax over slots, max-subtracted
      float m = simd::to_float(logit[0][0]) + bias[0][0];
      for (std::int64_t k = 1; k < n; ++k) m = std::max(m, simd::to_float(logit[k][0]) + bias[k][0]);
      float den = 0.0f;
      for (std::int64_t k = 0; k < n; ++k) den += (w[k] = std::exp(simd::to_float(logit[k][0]) + bias[k][0] - m));
      for (std::int64_t k = 0; k < n; ++k) w[k] /= den;
    }
  }

  // A pooling policy of the host's: what the constructor can check of it.
  void check_custom_pool() const {
    static_assert(std::is_convertible_v<decltype(pooling::name), const char*>,
                  "a pooling policy of your own needs `static constexpr const char* name` (its snapshot identity)");
    static_assert(std::is_convertible_v<decltype(pooling::version), std::uint32_t>,
                  "a pooling policy of your own needs `static constexpr std::uint32_t version`");
    static_assert(std::is_convertible_v<decltype(pooling::gate_channels(std::int64_t{1})), std::int64_t>,
                  "a pooling policy of your own needs `static constexpr std::int64_t gate_channels(std::int64_t)`");
    detail::require(pooling::name != nullptr, config_.name + ": pooling::name", "null",
                    "must name the pooling policy (its snapshot identity)");
    const std::int64_t g = pooling::gate_channels(config_.channels);
    detail::require(gated ? g > 0 : g == 0, config_.name + ": " + pooling::name + "::gate_channels(" +
                                                std::to_string(config_.channels) + ")",
                    g, "must be positive for every channel count, or 0 for every one");
    detail::require(g <= limits::max_channels, config_.name + ": " + pooling::name + "::gate_channels(" +
                                                   std::to_string(config_.channels) + ")",
                    g, "must be at most 2^20 (gate logits per KV head and view)");
    if constexpr (has_pool_parameters<pooling>::value) {
      const auto w = pool_.parameters();
      detail::require(w.data() != nullptr || w.size() == 0, config_.name + ": " + pooling::name + "::parameters().data()",
                      "null", "must not be null when the size is " + std::to_string(w.size()));
      detail::require(w.size() <= static_cast<std::size_t>(limits::max_bytes / 4),
                      config_.name + ": " + pooling::name + "::parameters().size()", w.size(), "must be at most 2^46 floats");
    }
  }

  geometry geom_;
  stream_config config_;
  stream_params params_;
  pooling pool_;
  std::int64_t views_ = 0, gates_ = 0, payload_per_token_ = 0, logits_per_token_ = 0;
  std::vector<float> zero_bias_;
  rope_rotation rope_entry_;  // on the entry's last R channels
  rope_rotation rope_local_;  // on an R-channel buffer (RoPE before pooling)
};

}  // namespace phasekv
