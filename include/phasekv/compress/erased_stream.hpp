#pragma once
// A stream compressor whose policy is chosen at run time: a stream_kernel made by a pooling
// registry (pooling_registry.hpp) behind stream_compressor's interface, so that layer_compressor
// and paged_cache take it as they take a typed stream_compressor<P>:
//
//   const pooling_registry poolings = pooling_registry::builtins();
//   const stream_build kv_build{geom, kv_config, kv_params, rope_placement::after_pool, entry_norm::rms};
//   erased_stream kv(poolings, "vector_gates", kv_build);
//   paged_cache<erased_stream> cache(layer_compressor<erased_stream>(kv), config);
//
// Contract: every call gives exactly what the same call on the compiled stream_compressor<P> the
// kernel wraps gives — the same entries bit for bit, the same states, the same errors — since it
// is that call, made through one virtual dispatch per stream and call. Entries reach the sink
// through a function pointer (entry_sink), one indirect call per entry; the per-entry work runs
// in the compiled fused kernels.
//
// Copies share the kernel (immutable, like the compressor itself), so copying is cheap and a
// layer of erased streams is as shareable across sequences and threads as a typed one.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "phasekv/compress/entry_view.hpp"
#include "phasekv/compress/pooling_registry.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/compress/stream_state.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"

namespace phasekv {

class erased_stream {
 public:
  // The stream `kernel` computes; a null kernel is a config_error.
  explicit erased_stream(std::shared_ptr<const stream_kernel> kernel) : kernel_(std::move(kernel)) {
    detail::require(kernel_ != nullptr, "erased_stream(kernel)", "null", "must be a stream_kernel");
    views_ = views_per_token(kernel_->config().inputs, kernel_->geom());
  }
  // The stream `b` describes, pooled by the pooling `poolings` registers as `id` (config_error
  // naming "<config.name>.pooling" for an unknown id, and as stream_compressor does for a stream
  // its policy cannot take).
  erased_stream(const pooling_registry& poolings, const std::string& id, const stream_build& b)
      : erased_stream(std::shared_ptr<const stream_kernel>(poolings.make(id, b, b.config.name + ".pooling"))) {}

  const stream_kernel& kernel() const noexcept { return *kernel_; }
  const std::shared_ptr<const stream_kernel>& shared_kernel() const noexcept { return kernel_; }

  // ---- what the stream is (stream_compressor's queries) ----
  const geometry& geom() const noexcept { return kernel_->geom(); }
  const stream_config& config() const noexcept { return kernel_->config(); }
  const stream_params& params() const noexcept { return kernel_->params(); }
  const char* pooling_name() const noexcept { return kernel_->pooling_name(); }
  // The policy's codes in snapshots (compress/policy_codes.hpp), as the typed stream's are.
  std::uint32_t pooling_identity() const { return kernel_->pooling_identity(); }
  rope_placement rope() const noexcept { return kernel_->rope(); }
  entry_norm norm() const noexcept { return kernel_->norm(); }
  bool applies_rope() const noexcept { return kernel_->applies_rope(); }
  std::int64_t views() const noexcept { return views_; }
  std::int64_t gate_channels() const noexcept { return kernel_->gate_channels(); }
  std::int64_t payload_floats_per_token() const noexcept { return kernel_->payload_floats_per_token(); }
  std::int64_t logit_floats_per_token() const noexcept { return kernel_->logit_floats_per_token(); }
  std::int64_t floats_per_entry() const noexcept { return config().kv_heads * config().channels; }
  // The view slot i reads: its branch, or the slot itself for per-slot inputs.
  std::int64_t view_of_slot(std::int64_t slot) const noexcept {
    return config().inputs == input_layout::per_branch ? geom().branch_of_slot(slot) : slot;
  }

  // ---- the write path (stream_compressor's, one virtual call each) ----
  stream_state make_state(std::int64_t history = 0) const { return kernel_->make_state(history); }
  std::int64_t entries_after(const stream_state& state, std::int64_t tokens) const noexcept {
    return geom().completed_entries(state.tokens() + tokens) - state.entries();
  }
  void check(const stream_state& state, const token_chunk& chunk, const append_options& options = {}) const {
    kernel_->check(state, chunk, options);
  }
  template <class Sink>
  std::int64_t append(stream_state& state, const token_chunk& chunk, Sink&& sink,
                      const append_options& options = {}) const {
    check(state, chunk, options);
    const std::int64_t emitted = emit(state, chunk, sink, options);
    commit(state, chunk);
    return emitted;
  }
  // sink(const entry_view&) per entry, through entry_sink: one indirect call per entry.
  template <class Sink>
  std::int64_t emit(stream_state& state, const token_chunk& chunk, Sink&& sink,
                    const append_options& options = {}) const {
    auto forward = [&sink](const entry_view& e) { sink(e); };
    return kernel_->emit(state, chunk, options, entry_sink::of(forward));
  }
  void commit(stream_state& state, const token_chunk& chunk) const noexcept { kernel_->commit(state, chunk); }
  void check_skip(const stream_state& state, std::int64_t tokens) const { kernel_->check_skip(state, tokens); }
  void skip(stream_state& state, std::int64_t tokens) const noexcept { kernel_->skip(state, tokens); }
  bool can_truncate(const stream_state& state, std::int64_t tokens) const noexcept {
    return kernel_->can_truncate(state, tokens);
  }
  void truncate(stream_state& state, std::int64_t tokens) const { kernel_->truncate(state, tokens); }

 private:
  std::shared_ptr<const stream_kernel> kernel_;
  std::int64_t views_ = 0;
};

}  // namespace phasekv
