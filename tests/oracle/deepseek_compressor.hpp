#pragma once
// A scalar twin of DeepSeek-V4's reference `Compressor` (inference/model.py, prefill path),
// written from its semantics and nothing of phasekv's: the checkpoint's tensors in, the
// compressed entries out, in double precision.
//
//   kv    = x · wkvᵀ, score = x · wgateᵀ          [T][coff·D]  (coff = 2 with overlap, W = 2S)
//   block g = tokens [g·S, (g+1)·S); row r of it gets score + ape[r]
//   overlap_transform (coff = 2): entry g has 2S slots;
//       slot r     = block g−1's row r, channels [0, D)   (score −inf, kv 0 when g = 0)
//       slot S + r = block g's   row r, channels [D, 2D)
//   no overlap: slot r = block g's row r
//   entry g = Σ_slots softmax_slots(score) ⊙ kv           (per channel)
//   RMSNorm: x · 1/sqrt(mean(x²) + eps) · w;  RoPE: interleaved pairs of the last R channels,
//   rotated by the angle g·S·θ_k (precompute_freqs_cis: θ_k = base^(−2k/R), YaRN-interpolated)
//
// The projections are formed in double and rounded to fp32 (deepseek_project): that is what a
// host hands phasekv, and the twin pools the same fp32 rows.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace phasekv_test {

struct deepseek_yarn {
  bool enabled = false;
  std::int64_t original_seq_len = 0;
  double factor = 1.0, beta_fast = 32.0, beta_slow = 1.0;
};

struct deepseek_compressor_twin {
  std::int64_t ratio = 4;      // S
  std::int64_t head_dim = 0;   // D
  bool overlap = true;         // coff = 2
  std::int64_t rope_dim = 0;   // R: the last R channels rotate (0: no RoPE)
  double rope_base = 10000.0;
  deepseek_yarn yarn;
  double norm_eps = 1e-6;
  std::vector<float> ape;          // [S][coff·D]
  std::vector<float> norm_weight;  // [D]; empty: no RMSNorm

  std::int64_t coff() const { return overlap ? 2 : 1; }

  // precompute_freqs_cis' frequencies, in double.
  std::vector<double> frequencies() const {
    const std::int64_t pairs = rope_dim / 2;
    std::vector<double> f(static_cast<std::size_t>(pairs));
    const double d = static_cast<double>(rope_dim);
    for (std::int64_t k = 0; k < pairs; ++k) f[k] = 1.0 / std::pow(rope_base, 2.0 * static_cast<double>(k) / d);
    if (!yarn.enabled) return f;
    const double pi = 3.14159265358979323846;
    auto correction = [&](double rotations) {
      const double context = static_cast<double>(yarn.original_seq_len);
      return d * std::log(context / (rotations * 2 * pi)) / (2 * std::log(rope_base));
    };
    const double low = std::max(std::floor(correction(yarn.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction(yarn.beta_slow)), d - 1);
    if (low == high) high += 0.001;
    for (std::int64_t k = 0; k < pairs; ++k) {
      const double ramp = std::clamp((static_cast<double>(k) - low) / (high - low), 0.0, 1.0);
      const double smooth = 1.0 - ramp;
      f[k] = f[k] / yarn.factor * (1.0 - smooth) + f[k] * smooth;
    }
    return f;
  }

  // Entries of a prefill of T tokens: [T / S][D]. kv and score are [T][coff·D] in DeepSeek's
  // channel order.
  std::vector<std::vector<double>> compress(const std::vector<float>& kv, const std::vector<float>& score,
                                            std::int64_t tokens) const {
    const std::int64_t S = ratio, D = head_dim, width = coff() * D, slots = coff() * S;
    const std::vector<double> freqs = frequencies();
    std::vector<std::vector<double>> entries;
    for (std::int64_t g = 0; (g + 1) * S <= tokens; ++g) {
      std::vector<double> e(static_cast<std::size_t>(D), 0.0);
      for (std::int64_t c = 0; c < D; ++c) {
        std::vector<double> s(static_cast<std::size_t>(slots), -std::numeric_limits<double>::infinity());
        std::vector<double> x(static_cast<std::size_t>(slots), 0.0);
        for (std::int64_t r = 0; r < S; ++r) {
          if (overlap) {
            if (g > 0) {
              const std::int64_t t = (g - 1) * S + r;
              x[r] = kv[t * width + c];
              s[r] = static_cast<double>(score[t * width + c]) + ape[r * width + c];
            }
            const std::int64_t t = g * S + r;
            x[S + r] = kv[t * width + D + c];
            s[S + r] = static_cast<double>(score[t * width + D + c]) + ape[r * width + D + c];
          } else {
            const std::int64_t t = g * S + r;
            x[r] = kv[t * width + c];
            s[r] = static_cast<double>(score[t * width + c]) + ape[r * width + c];
          }
        }
        const double m = *std::max_element(s.begin(), s.end());
        double den = 0.0, num = 0.0;
        for (std::int64_t i = 0; i < slots; ++i) {
          const double w = std::exp(s[i] - m);  // exp(−inf) = 0 for the missing block
          den += w;
          num += w * x[i];
        }
        e[c] = num / den;
      }
      if (!norm_weight.empty()) {
        double sq = 0.0;
        for (double v : e) sq += v * v;
        const double inv = 1.0 / std::sqrt(sq / static_cast<double>(D) + norm_eps);
        for (std::int64_t c = 0; c < D; ++c) e[c] *= inv * norm_weight[c];
      }
      const double position = static_cast<double>(g * S);
      for (std::int64_t k = 0; k < rope_dim / 2; ++k) {
        double& a = e[D - rope_dim + 2 * k];
        double& b = e[D - rope_dim + 2 * k + 1];
        const double angle = position * freqs[k], c = std::cos(angle), s = std::sin(angle);
        const double a0 = a, b0 = b;
        a = a0 * c - b0 * s;
        b = a0 * s + b0 * c;
      }
      entries.push_back(std::move(e));
    }
    return entries;
  }
};

// DeepSeek's freqs_cis as precompute_freqs_cis forms it, in fp32 (torch's float32 tensors):
//   freqs = 1 / base^(arange(0, R, 2) / R)                                   fp32
//   YaRN:  low, high from find_correction_range (Python doubles, floor/ceil), ramp =
//          clamp((arange(R/2) − low) / (high − low), 0, 1) in fp32, smooth = 1 − ramp,
//          freqs = freqs / factor · (1 − smooth) + freqs · smooth              fp32
//   angle  = t · freqs (torch.outer of an int64 arange and fp32: fp32),  polar → cos, sin (fp32)
// with libm's float pow/cos/sin standing in for torch's kernels. cos/sin are [positions][R/2].
struct fp32_freqs_cis {
  std::int64_t positions = 0, pairs = 0;
  std::vector<float> cos, sin;
};

inline fp32_freqs_cis deepseek_fp32_freqs_cis(const deepseek_compressor_twin& twin, std::int64_t positions) {
  const std::int64_t pairs = twin.rope_dim / 2;
  const float d = static_cast<float>(twin.rope_dim);
  std::vector<float> freqs(static_cast<std::size_t>(pairs));
  for (std::int64_t k = 0; k < pairs; ++k)
    freqs[k] = 1.0f / std::pow(static_cast<float>(twin.rope_base), static_cast<float>(2 * k) / d);
  if (twin.yarn.enabled) {
    const double pi = 3.14159265358979323846, dd = static_cast<double>(twin.rope_dim);
    auto correction = [&](double rotations) {
      return dd * std::log(static_cast<double>(twin.yarn.original_seq_len) / (rotations * 2 * pi)) /
             (2 * std::log(twin.rope_base));
    };
    const double low = std::max(std::floor(correction(twin.yarn.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction(twin.yarn.beta_slow)), dd - 1);
    if (low == high) high += 0.001;
    const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
    const float factor = static_cast<float>(twin.yarn.factor);
    for (std::int64_t k = 0; k < pairs; ++k) {
      const float ramp = std::clamp((static_cast<float>(k) - lo) / span, 0.0f, 1.0f);
      const float smooth = 1.0f - ramp;
      const volatile float interpolated = freqs[k] / factor * (1.0f - smooth);
      const volatile float kept = freqs[k] * smooth;
      freqs[k] = interpolated + kept;
    }
  }
  fp32_freqs_cis f;
  f.positions = positions;
  f.pairs = pairs;
  f.cos.resize(static_cast<std::size_t>(positions * pairs));
  f.sin.resize(f.cos.size());
  for (std::int64_t t = 0; t < positions; ++t)
    for (std::int64_t k = 0; k < pairs; ++k) {
      const float angle = static_cast<float>(t) * freqs[k];
      f.cos[t * pairs + k] = std::cos(angle);
      f.sin[t * pairs + k] = std::sin(angle);
    }
  return f;
}

// torch's complex64 multiply x · (cos + i·sin) on the CPU: each product rounded to fp32, then one
// fp32 add (volatile keeps the compiler from fusing them). sign = −1 multiplies by the conjugate.
inline void rotate_fp32(float& a, float& b, float c, float s, float sign = 1.0f) {
  s *= sign;
  const volatile float ac = a * c, bs = b * s, as = a * s, bc = b * c;
  a = ac - bs;
  b = as + bc;
}

// x · wᵀ for x [T][dim] and w [rows][dim], summed in double and rounded to fp32.
inline std::vector<float> deepseek_project(const std::vector<float>& x, const std::vector<float>& w,
                                           std::int64_t tokens, std::int64_t dim) {
  const std::int64_t rows = static_cast<std::int64_t>(w.size()) / dim;
  std::vector<float> out(static_cast<std::size_t>(tokens * rows));
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t o = 0; o < rows; ++o) {
      double sum = 0.0;
      for (std::int64_t i = 0; i < dim; ++i) sum += static_cast<double>(x[t * dim + i]) * w[o * dim + i];
      out[t * rows + o] = static_cast<float>(sum);
    }
  return out;
}

}  // namespace phasekv_test
