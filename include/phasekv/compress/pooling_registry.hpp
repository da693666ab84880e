#pragma once
// Poolings chosen at run time. A compressor policy is a compile-time type (policies.hpp), so a
// model described as data (models/layer_kind.hpp) names its streams' poolings by id, and this
// registry maps each id to compiled stream_compressor<compressor_policy<P, Rope, Norm>>
// instantiations behind one virtual interface, stream_kernel. Dispatch happens once per stream
// and layer call (check, emit, commit); the per-entry work runs in the fused kernels as before.
//
//   pooling_registry poolings = pooling_registry::builtins();   // mean, vector_gates, …
//   poolings.add<nsa_mlp_pool>("nsa_mlp", [&](std::size_t layer) { return nsa_mlp_pool(weights[layer]); });
//
// Built-in ids: "mean", "vector_gates", "scalar_gates", "fixed_weights", each with every RoPE
// placement and norm. A host's pooling (policies.hpp, "Your own pooling") composes with no RoPE
// or RoPE after pooling, with or without RMSNorm; its instance comes from the factory per layer
// (a model's layers differ in weights), or is default-constructed.

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/compress/entry_view.hpp"
#include "phasekv/compress/policies.hpp"
#include "phasekv/compress/policy_codes.hpp"
#include "phasekv/compress/stream_compressor.hpp"
#include "phasekv/compress/stream_config.hpp"
#include "phasekv/compress/stream_state.hpp"
#include "phasekv/detail/enum_name.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"

namespace phasekv {

// Where a stream applies RoPE, and whether its entries are RMS-normalised: the policy's other two
// axes (policies.hpp) as values.
enum class rope_placement { none, after_pool, before_pool };
enum class entry_norm { none, rms };

inline const char* to_string(rope_placement p) noexcept {
  return phasekv::detail::enum_name(p, {"none", "after_pool", "before_pool"});
}
inline const char* to_string(entry_norm n) noexcept { return phasekv::detail::enum_name(n, {"none", "rms"}); }

// Where an erased stream hands its entries: fn(context, entry) for each, in order.
struct entry_sink {
  void* context = nullptr;
  void (*fn)(void* context, const entry_view& entry) = nullptr;

  template <class F>
  static entry_sink of(F& f) noexcept {
    return {&f, [](void* c, const entry_view& e) { (*static_cast<F*>(c))(e); }};
  }
};

// One compressed stream of any policy: stream_compressor's interface, virtual. Immutable after
// construction, shared by every sequence (each keeps a stream_state), like the compressor itself.
class stream_kernel {
 public:
  virtual ~stream_kernel() = default;

  virtual const geometry& geom() const noexcept = 0;
  virtual const stream_config& config() const noexcept = 0;
  virtual const stream_params& params() const noexcept = 0;
  virtual const char* pooling_name() const noexcept = 0;
  // The pooling's code in snapshots (compress/policy_codes.hpp): a built-in's position, or the
  // CRC-32C identity of a host's pooling with its weights.
  virtual std::uint32_t pooling_identity() const = 0;
  virtual rope_placement rope() const noexcept = 0;
  virtual entry_norm norm() const noexcept = 0;
  bool applies_rope() const noexcept { return rope() != rope_placement::none; }
  virtual std::int64_t payload_floats_per_token() const noexcept = 0;
  virtual std::int64_t logit_floats_per_token() const noexcept = 0;
  virtual std::int64_t gate_channels() const noexcept = 0;
  // The FLOPs (a multiply-add counting 2) of pooling one entry of one KV head, beyond moving its
  // bytes: 0 for a built-in pooling (its write is bandwidth-bound); for a host's, what it states
  // (a member `double flops_per_entry(std::int64_t window, std::int64_t channels) const`), or NaN
  // when it states nothing (its arithmetic may outweigh its bytes by any factor).
  virtual double pooling_flops_per_entry() const = 0;

  virtual stream_state make_state(std::int64_t history) const = 0;
  virtual void check(const stream_state& state, const token_chunk& chunk, const append_options& options) const = 0;
  virtual std::int64_t emit(stream_state& state, const token_chunk& chunk, const append_options& options,
                            entry_sink sink) const = 0;
  virtual void commit(stream_state& state, const token_chunk& chunk) const noexcept = 0;
  virtual void check_skip(const stream_state& state, std::int64_t tokens) const = 0;
  virtual void skip(stream_state& state, std::int64_t tokens) const noexcept = 0;
  virtual bool can_truncate(const stream_state& state, std::int64_t tokens) const noexcept = 0;
  virtual void truncate(stream_state& state, std::int64_t tokens) const = 0;
};

template <class Policy>
class compiled_stream final : public stream_kernel {
 public:
  using compressor = stream_compressor<Policy>;
  explicit compiled_stream(compressor c) : c_(std::move(c)) {}

  const compressor& get() const noexcept { return c_; }
  const geometry& geom() const noexcept override { return c_.geom(); }
  const stream_config& config() const noexcept override { return c_.config(); }
  const stream_params& params() const noexcept override { return c_.params(); }
  const char* pooling_name() const noexcept override { return name_of<typename Policy::pooling>(); }
  std::uint32_t pooling_identity() const override { return detail::snapshot_format::pooling_identity(c_.pool()); }
  rope_placement rope() const noexcept override {
    using R = typename Policy::rope;
    return std::is_same_v<R, rope_after_pool> ? rope_placement::after_pool
           : std::is_same_v<R, rope_before_pool> ? rope_placement::before_pool
                                                 : rope_placement::none;
  }
  entry_norm norm() const noexcept override { return has_norm_v<Policy> ? entry_norm::rms : entry_norm::none; }
  std::int64_t payload_floats_per_token() const noexcept override { return c_.payload_floats_per_token(); }
  std::int64_t logit_floats_per_token() const noexcept override { return c_.logit_floats_per_token(); }
  std::int64_t gate_channels() const noexcept override { return c_.gate_channels(); }
  double pooling_flops_per_entry() const override {
    using P = typename Policy::pooling;
    if constexpr (!is_custom_pool_v<P>) return 0.0;
    else if constexpr (states_flops<P>::value) return c_.pool().flops_per_entry(c_.geom().window, c_.config().channels);
    else return std::numeric_limits<double>::quiet_NaN();
  }

  stream_state make_state(std::int64_t history) const override { return c_.make_state(history); }
  void check(const stream_state& s, const token_chunk& chunk, const append_options& options) const override {
    c_.check(s, chunk, options);
  }
  std::int64_t emit(stream_state& s, const token_chunk& chunk, const append_options& options, entry_sink sink) const override {
    return c_.emit(s, chunk, [&](const entry_view& e) { sink.fn(sink.context, e); }, options);
  }
  void commit(stream_state& s, const token_chunk& chunk) const noexcept override { c_.commit(s, chunk); }
  void check_skip(const stream_state& s, std::int64_t tokens) const override { c_.check_skip(s, tokens); }
  void skip(stream_state& s, std::int64_t tokens) const noexcept override { c_.skip(s, tokens); }
  bool can_truncate(const stream_state& s, std::int64_t tokens) const noexcept override { return c_.can_truncate(s, tokens); }
  void truncate(stream_state& s, std::int64_t tokens) const override { c_.truncate(s, tokens); }

 private:
  template <class P, class = void>
  struct states_flops : std::false_type {};
  template <class P>
  struct states_flops<P, std::void_t<decltype(std::declval<const P&>().flops_per_entry(std::int64_t{}, std::int64_t{}))>>
      : std::true_type {};

  template <class P>
  static const char* name_of() noexcept {
    if constexpr (is_custom_pool_v<P>) return P::name;
    else if constexpr (std::is_same_v<P, mean_pool>) return "mean";
    else if constexpr (std::is_same_v<P, vector_gated_pool>) return "vector_gates";
    else if constexpr (std::is_same_v<P, scalar_gated_pool>) return "scalar_gates";
    else return "fixed_weights";
  }
  compressor c_;
};

// What one stream of one layer is built from.
struct stream_build {
  geometry geom;
  stream_config config;
  stream_params params;
  rope_placement rope = rope_placement::none;
  entry_norm norm = entry_norm::none;
  std::size_t layer = 0;  // the model layer, for a host factory's per-layer weights
};

class pooling_registry {
 public:
  using factory = std::function<std::unique_ptr<stream_kernel>(const stream_build&)>;

  // An empty registry; builtins() has the four built-in poolings.
  pooling_registry() = default;

  static pooling_registry builtins() {
    pooling_registry r;
    r.add_builtin<mean_pool>("mean");
    r.add_builtin<vector_gated_pool>("vector_gates");
    r.add_builtin<scalar_gated_pool>("scalar_gates");
    r.add_builtin<fixed_weight_pool>("fixed_weights");
    return r;
  }

  // A pooling policy of the host's (policies.hpp) under `id`: make(layer) gives the instance a
  // layer's stream uses (its weights), or a default-constructed one without `make`. An id already
  // registered is a config_error.
  template <class Pooling>
  void add(const std::string& id, std::function<Pooling(std::size_t layer)> make = {}) {
    std::function<Pooling(const stream_build&)> per_stream;
    if (make) per_stream = [make = std::move(make)](const stream_build& b) { return make(b.layer); };
    add<Pooling>(id, std::move(per_stream));
  }

  // The same with the instance made per stream: make(b) sees the layer, the stream's shape and
  // role (an MLP pooling's weights depend on the channels, a K stream's on the role).
  template <class Pooling>
  void add(const std::string& id, std::function<Pooling(const stream_build& b)> make) {
    static_assert(is_custom_pool_v<Pooling>, "add<P>() takes a pooling policy of your own (policies.hpp); the built-ins are "
                                             "in builtins()");
    insert(id, [make = std::move(make)](const stream_build& b) -> std::unique_ptr<stream_kernel> {
      if (b.rope == rope_placement::before_pool)
        detail::fail(b.config.name + ".rope", to_string(b.rope),
                     std::string("is not available for the pooling '") + Pooling::name +
                         "' of the host (RoPE before pooling is the built-ins' only): rotate before appending, or "
                         "rotate the pooled entry (after_pool)");
      Pooling pool = make ? make(b) : Pooling{};
      return with_norm<Pooling>(b, std::move(pool));
    });
  }

  // One compiled policy (compressor_policy<Pooling, Rope, Norm>, its pooling default-constructed)
  // under `id`, for a host that runs a few known policies and wants only their code compiled
  // (builtins() compiles every built-in pooling under every placement and norm). A stream that asks
  // `id` for another RoPE placement or norm is a config_error naming the field.
  template <class Policy>
  void add_compiled(const std::string& id) {
    insert(id, [id](const stream_build& b) -> std::unique_ptr<stream_kernel> {
      using R = typename Policy::rope;
      const rope_placement rope = std::is_same_v<R, rope_after_pool>    ? rope_placement::after_pool
                                  : std::is_same_v<R, rope_before_pool> ? rope_placement::before_pool
                                                                        : rope_placement::none;
      const entry_norm norm = has_norm_v<Policy> ? entry_norm::rms : entry_norm::none;
      if (b.rope != rope)
        detail::fail(b.config.name + ".rope", to_string(b.rope), "is not the placement the pooling '" + id + "' was compiled with (" + to_string(rope) + ")");
      if (b.norm != norm)
        detail::fail(b.config.name + ".norm", to_string(b.norm), "is not the norm the pooling '" + id + "' was compiled with (" + to_string(norm) + ")");
      return build<Policy>(b, typename Policy::pooling{});
    });
  }

  bool contains(const std::string& id) const { return factories_.count(id) != 0; }
  std::vector<std::string> ids() const {
    std::vector<std::string> out;
    for (const auto& entry : factories_) out.push_back(entry.first);
    return out;
  }

  // The stream `b` describes, with the pooling registered as `id`. Throws config_error naming
  // `field` for an unknown id, and as stream_compressor does for a stream its policy cannot take.
  std::unique_ptr<stream_kernel> make(const std::string& id, const stream_build& b, const std::string& field) const {
    const auto it = factories_.find(id);
    if (it == factories_.end()) {
      std::string known;
      for (const auto& entry : factories_) known += (known.empty() ? "" : ", ") + entry.first;
      detail::fail(field, "'" + id + "'", "is not a registered pooling (registered: " + (known.empty() ? "none" : known) + ")");
    }
    return it->second(b);
  }

 private:
  void insert(const std::string& id, factory f) {
    if (id.empty()) detail::fail("pooling_registry.add(id)", "''", "must not be empty");
    if (contains(id)) detail::fail("pooling_registry.add(id)", "'" + id + "'", "is already registered");
    factories_.emplace(id, std::move(f));
  }

  template <class Pooling>
  void add_builtin(const std::string& id) {
    insert(id, [](const stream_build& b) -> std::unique_ptr<stream_kernel> {
      switch (b.rope) {
        case rope_placement::none: return with_norm_rope<Pooling, no_rope>(b, Pooling{});
        case rope_placement::after_pool: return with_norm_rope<Pooling, rope_after_pool>(b, Pooling{});
        case rope_placement::before_pool: return with_norm_rope<Pooling, rope_before_pool>(b, Pooling{});
      }
      detail::fail(b.config.name + ".rope", static_cast<int>(b.rope), "is not a rope_placement");
    });
  }

  template <class Pooling>
  static std::unique_ptr<stream_kernel> with_norm(const stream_build& b, Pooling pool) {
    if (b.rope == rope_placement::after_pool) return with_norm_rope<Pooling, rope_after_pool>(b, std::move(pool));
    if (b.rope == rope_placement::none) return with_norm_rope<Pooling, no_rope>(b, std::move(pool));
    detail::fail(b.config.name + ".rope", static_cast<int>(b.rope), "is not a rope_placement");
  }

  template <class Pooling, class Rope>
  static std::unique_ptr<stream_kernel> with_norm_rope(const stream_build& b, Pooling pool) {
    switch (b.norm) {
      case entry_norm::none: return build<compressor_policy<Pooling, Rope, no_norm>>(b, std::move(pool));
      case entry_norm::rms: return build<compressor_policy<Pooling, Rope, rms_norm>>(b, std::move(pool));
    }
    detail::fail(b.config.name + ".norm", static_cast<int>(b.norm), "is not an entry_norm");
  }

  template <class Policy>
  static std::unique_ptr<stream_kernel> build(const stream_build& b, typename Policy::pooling pool) {
    return std::make_unique<compiled_stream<Policy>>(stream_compressor<Policy>(b.geom, b.config, b.params, std::move(pool)));
  }

  std::map<std::string, factory> factories_;
};

}  // namespace phasekv
