#pragma once
// The lab model's forward pass in C++: every attention layer runs through phasekv's model front
// door — per KV head a layer kind (a key and a value stream with that head's origin, the raw
// local window, a reader with top_k = 0 for the head's query group), all of them one model_cache
// whose step appends a forward's tokens and reads them — and Eigen does the rest (RMSNorm,
// projections, the token shift, RoPE of queries and window keys through phasekv::rope_rotation,
// SwiGLU, the tied output head). The maths is lab/model.py's; its docstring states it. One kind
// per KV head is what lets every head have an origin of its own (a geometry is per kind).
//
//   kind     key stream policy                          value stream policy      geometry  window
//   full     mean_pool, rope_after_pool (S=W=1: the     mean_pool, no_rope       S=W=1     none
//            dense control, RoPE at its own position)
//   mean     mean_pool, rope_after_pool                 mean_pool, no_rope       S, W      N_win
//   gated    vector_gated_pool, rope_after_pool         vector_gated_pool        S, W      N_win
//   norope   vector_gated_pool, no_rope                 vector_gated_pool        S, W      N_win
//
// The weights come from the export format of lab/export.py (lab/README.md): model.txt names
// the configuration and the tensors, weights.bin holds them as float32, row-major.

#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <Eigen/Core>

#include <phasekv/phasekv.hpp>

#include "lab_task.hpp"

namespace lab {

using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using vector = Eigen::VectorXf;

struct model_config {
  std::string kind;
  std::int64_t vocab = 0, dim = 0, layers = 0, q_heads = 0, kv_heads = 0, head_dim = 0, ffn = 0;
  std::int64_t stride = 1, window = 1, win_tokens = 0;
  std::int64_t origin = 0, layer_stagger = 0, head_stagger = 0, token_shift = 0;
  double rope_base = 10000.0, norm_eps = 1e-6;
  task_config task;

  bool gated() const { return kind == "gated" || kind == "norope"; }
  bool rope() const { return kind != "norope"; }
  std::int64_t branches() const { return (window + stride - 1) / stride; }
  // The compressor origin of (layer, KV head), lab/model.py's ModelConfig.origin_of, plus a
  // shift every head takes (a measurement at another origin).
  std::int64_t origin_of(std::int64_t layer, std::int64_t head, std::int64_t shift = 0) const {
    return (origin + layer * layer_stagger + head * head_stagger + shift) % stride;
  }
};

struct layer_weights {
  vector attn_norm, ffn_norm;
  matrix wq, wk, wv, wo, ck, cv, zk, zv, w_gate, w_up, w_down;  // [out][in], as torch.nn.Linear
  matrix ck_prev, cv_prev, zk_prev, zv_prev;                      // the token shift's (previous token)
  std::vector<float> bias_k, bias_v;                              // [kv_heads][window][head_dim]
};

struct model_weights {
  model_config config;
  matrix embed;  // [vocab][dim], also the output head
  vector final_norm;
  std::vector<layer_weights> layers;
};

// ---- loading ------------------------------------------------------------------------------------

inline model_weights load_model(const std::string& dir) {
  std::ifstream manifest(dir + "/model.txt");
  if (!manifest) throw std::runtime_error("cannot open " + dir + "/model.txt");
  std::ifstream blob(dir + "/weights.bin", std::ios::binary);
  if (!blob) throw std::runtime_error("cannot open " + dir + "/weights.bin");
  std::string line;
  std::getline(manifest, line);
  if (line != "phasekv-lab-model 2")
    throw std::runtime_error(dir + "/model.txt: first line is '" + line + "', expected 'phasekv-lab-model 2'");
  model_weights m;
  model_config& c = m.config;
  std::map<std::string, std::int64_t*> ints = {
      {"vocab", &c.vocab},           {"dim", &c.dim},
      {"layers", &c.layers},         {"q_heads", &c.q_heads},
      {"kv_heads", &c.kv_heads},     {"head_dim", &c.head_dim},
      {"ffn", &c.ffn},               {"stride", &c.stride},
      {"window", &c.window},         {"win_tokens", &c.win_tokens},
      {"task_filler", &c.task.filler}, {"task_keys", &c.task.keys},
      {"task_values", &c.task.values}, {"task_tokens", &c.task.tokens},
      {"task_records", &c.task.records}, {"task_queries", &c.task.queries},
      {"task_decoys", &c.task.decoys},   {"task_trail", &c.task.trail},
      {"task_gap", &c.task.gap},         {"task_block_stride", &c.task.block_stride},
      {"task_block_origin", &c.task.block_origin}, {"task_isolation", &c.task.isolation},
      {"origin", &c.origin},             {"layer_stagger", &c.layer_stagger},
      {"head_stagger", &c.head_stagger}, {"token_shift", &c.token_shift}};
  std::map<std::string, std::vector<std::int64_t>> shapes;
  std::vector<std::string> order;
  bool ended = false;
  while (std::getline(manifest, line)) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key.empty()) continue;
    if (key == "end") {
      ended = true;
      break;
    }
    if (key == "tensor") {
      std::string name;
      in >> name;
      std::vector<std::int64_t> shape;
      std::int64_t d;
      while (in >> d) shape.push_back(d);
      shapes[name] = shape;
      order.push_back(name);
    } else if (key == "kind") {
      in >> c.kind;
    } else if (key == "task_placement") {
      in >> c.task.placement;
    } else if (key == "rope_base") {
      in >> c.rope_base;
    } else if (key == "norm_eps") {
      in >> c.norm_eps;
    } else if (ints.count(key)) {
      in >> *ints[key];
    } else {
      throw std::runtime_error(dir + "/model.txt: unknown key '" + key + "'");
    }
  }
  if (!ended) throw std::runtime_error(dir + "/model.txt: no 'end' line (truncated?)");
  if (c.kind != "full" && c.kind != "mean" && c.kind != "gated" && c.kind != "norope")
    throw std::runtime_error(dir + "/model.txt: kind '" + c.kind + "' is not full, mean, gated or norope");

  std::map<std::string, std::vector<float>> data;
  for (const std::string& name : order) {
    std::int64_t n = 1;
    for (std::int64_t d : shapes[name]) n *= d;
    std::vector<float> v(static_cast<std::size_t>(n));
    blob.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
    if (!blob) throw std::runtime_error(dir + "/weights.bin: ends inside tensor " + name);
    data[name] = std::move(v);
  }
  if (blob.peek() != std::char_traits<char>::eof())
    throw std::runtime_error(dir + "/weights.bin: longer than the tensors model.txt lists");

  std::map<std::string, bool> used;
  auto take = [&](const std::string& name, std::vector<std::int64_t> expected) -> std::vector<float>& {
    auto it = data.find(name);
    if (it == data.end()) throw std::runtime_error(dir + ": tensor " + name + " is missing");
    used[name] = true;
    if (shapes[name] != expected) {
      std::string got, want;
      for (auto d : shapes[name]) got += " " + std::to_string(d);
      for (auto d : expected) want += " " + std::to_string(d);
      throw std::runtime_error(dir + ": tensor " + name + " has shape" + got + ", expected" + want);
    }
    return it->second;
  };
  auto mat = [&](const std::string& name, std::int64_t rows, std::int64_t cols) {
    return matrix(Eigen::Map<matrix>(take(name, {rows, cols}).data(), rows, cols));
  };
  auto vec = [&](const std::string& name, std::int64_t n) {
    return vector(Eigen::Map<vector>(take(name, {n}).data(), n));
  };
  const std::int64_t D = c.dim, qd = c.q_heads * c.head_dim, kd = c.kv_heads * c.head_dim;
  const std::int64_t cd = c.kv_heads * c.branches() * c.head_dim;
  m.embed = mat("embed", c.vocab, D);
  m.final_norm = vec("final_norm", D);
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    layer_weights w;
    w.attn_norm = vec(p + "attn_norm", D);
    w.wq = mat(p + "wq", qd, D);
    if (c.kind != "full") {
      w.wk = mat(p + "wk", kd, D);
      w.wv = mat(p + "wv", kd, D);
    }
    w.ck = mat(p + "ck", cd, D);
    w.cv = mat(p + "cv", cd, D);
    if (c.token_shift) {
      w.ck_prev = mat(p + "ck_prev", cd, D);
      w.cv_prev = mat(p + "cv_prev", cd, D);
    }
    if (c.gated()) {
      w.zk = mat(p + "zk", cd, D);
      w.zv = mat(p + "zv", cd, D);
      if (c.token_shift) {
        w.zk_prev = mat(p + "zk_prev", cd, D);
        w.zv_prev = mat(p + "zv_prev", cd, D);
      }
      w.bias_k = take(p + "bias_k", {c.kv_heads, c.window, c.head_dim});
      w.bias_v = take(p + "bias_v", {c.kv_heads, c.window, c.head_dim});
    }
    w.wo = mat(p + "wo", D, qd);
    w.ffn_norm = vec(p + "ffn_norm", D);
    w.w_gate = mat(p + "w_gate", c.ffn, D);
    w.w_up = mat(p + "w_up", c.ffn, D);
    w.w_down = mat(p + "w_down", D, c.ffn);
    m.layers.push_back(std::move(w));
  }
  if (order.size() != shapes.size()) throw std::runtime_error(dir + "/model.txt: a tensor is listed twice");
  // A tensor this kind does not read means the file was written for another model: refuse it.
  for (const std::string& name : order)
    if (!used.count(name)) throw std::runtime_error(dir + ": tensor " + name + " is not part of a '" + c.kind + "' model");
  return m;
}

// ---- forward ------------------------------------------------------------------------------------

// What a forward pass may do besides computing logits.
struct forward_options {
  // Knock out query heads [knock_head, knock_head + knock_count) of layer `knock_layer` (a KV
  // head's whole group when knock_count = q_heads / kv_heads): their attention outputs (before Wo)
  // are replaced by head_means[layer][head] at every position (a mean ablation).
  std::int64_t knock_layer = -1, knock_head = -1, knock_count = 1;
  const std::vector<std::vector<vector>>* head_means = nullptr;
  // Accumulate every layer's per-head attention output over every position read (calibration).
  std::vector<std::vector<vector>>* head_sums = nullptr;  // [layer][head]
  std::vector<std::int64_t>* head_counts = nullptr;      // [layer]: positions summed
  // Write profiles: one per layer, stream (key, value) and KV head — index (2·layer + stream)·kv_heads
  // + head, each of kv_heads = 1 with that head's geometry — fed the entries of this sequence
  // with their slot weights (run through a fresh compressor state, so the cache is untouched).
  std::vector<phasekv::diag::write_profile>* profiles = nullptr;
};

class engine {
 public:
  virtual ~engine() = default;
  // Logits [positions][vocab] at the given positions of `tokens` (the last layer reads only
  // there, as lab/model.py does).
  virtual matrix forward(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& positions,
                         const forward_options& options = {}) = 0;
  virtual const model_config& config() const = 0;
};

namespace detail {

inline void rms_norm_rows(const matrix& x, const vector& w, double eps, matrix& out) {
  out.resize(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const float ms = x.row(r).squaredNorm() / static_cast<float>(x.cols());
    const float inv = 1.0f / std::sqrt(ms + static_cast<float>(eps));
    out.row(r) = (x.row(r) * inv).cwiseProduct(w.transpose());
  }
}

// The model's attention as one phasekv model (models/model_cache.hpp): a layer kind per (layer,
// KV head) — each head has an origin of its own, and a geometry is per kind — with a key and a
// value stream (their poolings by id, lab_poolings) and the raw window; its reader reads the head's
// query group over every complete entry and the window (top_k = 0).
inline const phasekv::pooling_registry& lab_poolings() {
  static const phasekv::pooling_registry registry = [] {
    using namespace phasekv;
    pooling_registry r;
    r.add_compiled<compressor_policy<mean_pool, rope_after_pool>>("mean.rope_after_pool");
    r.add_compiled<compressor_policy<mean_pool>>("mean");
    r.add_compiled<compressor_policy<vector_gated_pool, rope_after_pool>>("vector_gates.rope_after_pool");
    r.add_compiled<compressor_policy<vector_gated_pool>>("vector_gates");
    return r;
  }();
  return registry;
}

class policy_engine final : public engine {
 public:
  // origin_shift: added to every head's origin (a measurement at another origin).
  policy_engine(model_weights weights, std::int64_t max_tokens, std::int64_t origin_shift)
      : w_(std::move(weights)), max_tokens_(max_tokens), model_(spec(w_, origin_shift), options(w_, max_tokens), lab_poolings()) {
    rope_.channels = w_.config.head_dim;
    rope_.base = w_.config.rope_base;
    rope_.layout = phasekv::rope_layout::half_split;
    rotation_ = phasekv::rope_rotation(rope_, w_.config.head_dim);
  }

  // The kinds' streams by the model's kind (see the table at the top).
  static phasekv::model_spec spec(const model_weights& w, std::int64_t origin_shift) {
    const model_config& c = w.config;
    const std::int64_t W = c.window, dh = c.head_dim;
    const bool gated = c.kind == "gated" || c.kind == "norope", key_rope = c.kind != "norope";
    phasekv::rope_config rope;
    rope.channels = dh;
    rope.base = c.rope_base;
    rope.layout = phasekv::rope_layout::half_split;
    phasekv::model_spec m;
    m.name = "lab." + c.kind;
    for (std::int64_t l = 0; l < c.layers; ++l) {
      const layer_weights& lw = w.layers[static_cast<std::size_t>(l)];
      for (std::int64_t h = 0; h < c.kv_heads; ++h) {
        const std::string name = "layer" + std::to_string(l) + ".head" + std::to_string(h);
        phasekv::layer_kind kind;
        kind.name = name;
        kind.geom = phasekv::geometry{c.stride, W, c.origin_of(l, h, origin_shift), phasekv::anchor_mode::block_start};
        phasekv::stream_spec keys, values;
        keys.config.name = name + ".keys";
        keys.config.role = phasekv::stream_role::key;
        keys.config.channels = dh;
        keys.config.kv_heads = 1;
        keys.config.inputs = phasekv::input_layout::per_branch;
        values.config = keys.config;
        values.config.name = name + ".values";
        values.config.role = phasekv::stream_role::value;
        if (key_rope) keys.config.rope = rope;
        keys.rope = key_rope ? phasekv::rope_placement::after_pool : phasekv::rope_placement::none;
        keys.pooling = std::string(gated ? "vector_gates" : "mean") + (key_rope ? ".rope_after_pool" : "");
        values.pooling = gated ? "vector_gates" : "mean";
        kind.streams = {keys, values};
        kind.window.tokens = c.win_tokens;
        kind.window.kv_heads = 1;
        kind.window.key_channels = dh;
        kind.window.value_channels = dh;
        kind.page_size = 64;
        kind.reader.name = name + ".reader";
        kind.reader.query_heads = c.q_heads / c.kv_heads;
        kind.reader.top_k = 0;  // every complete entry, plus the raw window, one softmax
        phasekv::model_layer layer;
        layer.kind = m.kinds.size();
        layer.params.resize(2);
        if (gated) {
          const auto head_bias = [&](const std::vector<float>& b) {
            return std::vector<float>(b.begin() + h * W * dh, b.begin() + (h + 1) * W * dh);
          };
          layer.params[0].slot_bias = head_bias(lw.bias_k);
          layer.params[1].slot_bias = head_bias(lw.bias_v);
        }
        m.kinds.push_back(std::move(kind));
        m.layers.push_back(std::move(layer));
      }
    }
    return m;
  }
  // One sequence of up to max_tokens: its entries, per kind. A forward's reads run inside its
  // step (over the step's own tokens), so no history is kept.
  static phasekv::model_options options(const model_weights& w, std::int64_t max_tokens) {
    phasekv::model_options o;
    o.pages = (max_tokens / w.config.stride + 63) / 64 + 2;
    return o;
  }

  const model_config& config() const override { return w_.config; }

  matrix forward(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& positions,
                 const forward_options& o) override {
    const model_config& c = w_.config;
    const auto T = static_cast<std::int64_t>(tokens.size());
    if (T < 1 || T > max_tokens_)
      throw std::invalid_argument("sequence of " + std::to_string(T) + " tokens; this engine takes 1 to " +
                                  std::to_string(max_tokens_));
    for (std::int64_t p : positions)
      if (p < 0 || p >= T) throw std::invalid_argument("position " + std::to_string(p) + " outside the sequence");
    const std::int64_t dh = c.head_dim, hq = c.q_heads, hkv = c.kv_heads, g = hq / hkv;
    const std::int64_t nb = c.branches(), row = nb * dh;  // one token's compressor inputs, one head
    matrix x(T, c.dim);
    for (std::int64_t t = 0; t < T; ++t) {
      if (tokens[t] < 0 || tokens[t] >= c.vocab) throw std::invalid_argument("token id outside the vocabulary");
      x.row(t) = w_.embed.row(tokens[t]);
    }
    std::vector<float> cs(static_cast<std::size_t>(dh));  // cos | sin of one position
    matrix n, q, kw, vw, a;
    std::array<matrix, 4> proj;                          // ck, cv, zk, zv outputs [T][hkv·nb·dh]
    std::array<matrix, 4> head_in;                       // one head's slice, [T][nb·dh]
    matrix win_k(T, dh), win_v(T, dh);
    std::vector<std::int64_t> positions_read;
    std::vector<phasekv::layer_read> reads;
    // One sequence for this forward: a step appends its T tokens to every layer, and each layer is
    // read inside the step (over the step's own tokens); the step is aborted and the sequence freed.
    struct sequence_guard {
      phasekv::model_cache& model;
      phasekv::sequence_id id;
      ~sequence_guard() { model.free(id); }
    } sequence{model_, model_.create()};
    phasekv::model_step step = model_.begin({sequence.id}, T);
    for (std::int64_t l = 0; l < c.layers; ++l) {
      const layer_weights& lw = w_.layers[static_cast<std::size_t>(l)];
      const bool last = l + 1 == c.layers;
      rms_norm_rows(x, lw.attn_norm, c.norm_eps, n);
      // Queries only where this layer reads: every position, or the requested ones in the last layer.
      positions_read.clear();
      if (last) positions_read = positions;
      else for (std::int64_t t = 0; t < T; ++t) positions_read.push_back(t);
      const auto R = static_cast<std::int64_t>(positions_read.size());
      q.resize(R, hq * dh);
      for (std::int64_t i = 0; i < R; ++i) q.row(i).noalias() = n.row(positions_read[static_cast<std::size_t>(i)]) * lw.wq.transpose();
      if (c.rope())
        for (std::int64_t i = 0; i < R; ++i) rotate_heads(q.row(i).data(), hq, positions_read[static_cast<std::size_t>(i)], cs);
      if (c.win_tokens > 0) {
        kw.noalias() = n * lw.wk.transpose();
        vw.noalias() = n * lw.wv.transpose();
        if (c.rope())
          for (std::int64_t t = 0; t < T; ++t) rotate_heads(kw.row(t).data(), hkv, t, cs);
      }
      // Compressor inputs [token][kv_heads][branches][head_dim]; with the token shift each row
      // adds the previous token's projection (lab/model.py: x(t) = C·n_t + C'·n_{t−1}).
      const matrix* maps[4] = {&lw.ck, &lw.cv, &lw.zk, &lw.zv};
      const matrix* prev[4] = {&lw.ck_prev, &lw.cv_prev, &lw.zk_prev, &lw.zv_prev};
      const int used = c.gated() ? 4 : 2;
      for (int k = 0; k < used; ++k) {
        proj[k].noalias() = n * maps[k]->transpose();
        if (c.token_shift && T > 1) proj[k].bottomRows(T - 1).noalias() += n.topRows(T - 1) * prev[k]->transpose();
      }
      a.resize(R, hq * dh);
      for (std::int64_t h = 0; h < hkv; ++h) {
        std::array<phasekv::token_chunk, 2> chunks;  // keys, values
        chunks[0].tokens = chunks[1].tokens = T;
        for (int k = 0; k < used; ++k) head_in[k] = proj[k].middleCols(h * row, row);
        chunks[0].payload = {head_in[0].data(), static_cast<std::size_t>(head_in[0].size())};
        chunks[1].payload = {head_in[1].data(), static_cast<std::size_t>(head_in[1].size())};
        if (c.gated()) {
          chunks[0].logits = {head_in[2].data(), static_cast<std::size_t>(head_in[2].size())};
          chunks[1].logits = {head_in[3].data(), static_cast<std::size_t>(head_in[3].size())};
        }
        const auto layer = static_cast<std::size_t>(l * hkv + h);
        phasekv::layer_append in;
        in.chunks = {chunks.data(), chunks.size()};
        if (c.win_tokens > 0) {
          win_k = kw.middleCols(h * dh, dh);
          win_v = vw.middleCols(h * dh, dh);
          in.window_keys = {win_k.data(), static_cast<std::size_t>(win_k.size())};
          in.window_values = {win_v.data(), static_cast<std::size_t>(win_v.size())};
        }
        step.append(layer, {in});
        reads.clear();
        for (std::int64_t i = 0; i < R; ++i) {
          phasekv::layer_read r;
          r.row = 0;
          r.request.position = positions_read[static_cast<std::size_t>(i)];
          r.request.queries = {q.row(i).data() + h * g * dh, static_cast<std::size_t>(g * dh)};
          r.out = a.row(i).data() + h * g * dh;
          reads.push_back(r);
        }
        step.read(layer, reads);
        if (o.profiles) profile(l, h, chunks[0], chunks[1], *o.profiles);
      }
      if (o.head_sums) {
        for (std::int64_t i = 0; i < R; ++i)
          for (std::int64_t h = 0; h < hq; ++h)
            (*o.head_sums)[l][h] += a.row(i).segment(h * dh, dh).transpose();
        if (o.head_counts) (*o.head_counts)[l] += R;
      }
      if (o.knock_layer == l)
        for (std::int64_t h = o.knock_head; h < o.knock_head + o.knock_count; ++h)
          a.middleCols(h * dh, dh).rowwise() = (*o.head_means)[l][h].transpose();
      if (last) {
        matrix kept(R, c.dim);
        for (std::int64_t i = 0; i < R; ++i) kept.row(i) = x.row(positions_read[static_cast<std::size_t>(i)]);
        x = std::move(kept);
      }
      x.noalias() += a * lw.wo.transpose();
      rms_norm_rows(x, lw.ffn_norm, c.norm_eps, n);
      matrix gate = n * lw.w_gate.transpose(), up = n * lw.w_up.transpose();
      gate = gate.array() / (1.0f + (-gate.array()).exp());  // silu
      gate.array() *= up.array();
      x.noalias() += gate * lw.w_down.transpose();
    }
    step.abort();
    rms_norm_rows(x, w_.final_norm, c.norm_eps, n);
    return n * w_.embed.transpose();
  }

 private:
  void rotate_heads(float* row, std::int64_t heads, std::int64_t position, std::vector<float>& cs) const {
    const std::int64_t half = w_.config.head_dim / 2;
    rotation_.angles(static_cast<double>(position), cs.data(), cs.data() + half);
    for (std::int64_t h = 0; h < heads; ++h) rotation_.apply(row + h * w_.config.head_dim, cs.data(), cs.data() + half);
  }

  // Entries of this sequence with their slot weights, into profiles[(2·layer + stream)·kv_heads + head].
  void profile(std::int64_t l, std::int64_t h, const phasekv::token_chunk& kc, const phasekv::token_chunk& vc,
               std::vector<phasekv::diag::write_profile>& profiles) const {
    const std::int64_t hkv = w_.config.kv_heads;
    const auto layer = static_cast<std::size_t>(l * hkv + h);
    phasekv::append_options opt;
    opt.slot_weights = true;
    const phasekv::token_chunk* chunks[2] = {&kc, &vc};
    for (std::size_t k = 0; k < 2; ++k) {
      const phasekv::stream_kernel& stream = model_.stream(layer, k);
      auto into = [&](const phasekv::entry_view& e) { profiles[(2 * l + static_cast<std::int64_t>(k)) * hkv + h](e); };
      phasekv::stream_state state = stream.make_state(0);
      stream.check(state, *chunks[k], opt);
      stream.emit(state, *chunks[k], opt, phasekv::entry_sink::of(into));
      stream.commit(state, *chunks[k]);
    }
  }

  model_weights w_;
  std::int64_t max_tokens_;
  phasekv::model_cache model_;  // layer l · kv_heads + h: layer l's KV head h
  phasekv::rope_config rope_;
  phasekv::rope_rotation rotation_;
};

}  // namespace detail

// The engine for a model's kind (see the table at the top); origin_shift moves every head's origin.
inline std::unique_ptr<engine> make_engine(model_weights w, std::int64_t max_tokens, std::int64_t origin_shift = 0) {
  return std::make_unique<detail::policy_engine>(std::move(w), max_tokens, origin_shift);
}

}  // namespace lab
