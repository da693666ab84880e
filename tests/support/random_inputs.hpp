#pragma once
// Seeded random inputs for the tests: payloads, gate logits (ordinary or LARGE), slot biases,
// RMSNorm weights, slot profiles, values whose Hadamard transform is exact. Everything comes from a caller-owned
// std::mt19937, so a test is reproducible from its seed.
//
// Large logits are sign·magnitude + k/64 with |k| ≤ 512 (magnitude e.g. 80 or 1e4): a softmax
// that is not max-subtracted overflows (exp(80+) summed in fp32, exp(1e4) in anything) or
// underflows to 0/0 (all negative). Their fractional parts and the matching biases are
// multiples of 1/64 so that logit + bias and its difference with the max are exact in fp32;
// the fp32 kernel and the double oracle then see the same softmax arguments and can be held
// to a tight tolerance. (Arbitrary floats near 1e4 carry 5e-4 of rounding in the sum itself.)

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace phasekv_test {

// Uniform floats in [lo, hi).
inline std::vector<float> random_uniform(std::mt19937& rng, std::size_t count, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(count);
  for (auto& x : out) x = dist(rng);
  return out;
}

// Payload vectors x = C·h: uniform in [−scale, scale).
inline std::vector<float> random_payload(std::mt19937& rng, std::size_t count, float scale = 1.0f) {
  return random_uniform(rng, count, -scale, scale);
}

enum class logit_signs {
  mixed,     // each logit's sign at random
  positive,  // all +magnitude: exp overflows without max subtraction
  negative,  // all −magnitude: exp underflows to 0/0 without max subtraction
};

struct logit_options {
  double magnitude = 0.0;             // 0: ordinary logits uniform in [−spread, spread)
  float spread = 3.0f;                // ordinary logits' range
  logit_signs signs = logit_signs::mixed;
};

// Gate logits s = Z·h. With options.magnitude > 0 they are large (see the header comment).
inline std::vector<float> random_logits(std::mt19937& rng, std::size_t count, const logit_options& options = {}) {
  if (options.magnitude <= 0.0) return random_uniform(rng, count, -options.spread, options.spread);
  std::uniform_int_distribution<int> fraction(-512, 512);
  std::bernoulli_distribution coin(0.5);
  std::vector<float> out(count);
  for (auto& x : out) {
    double sign = 1.0;
    if (options.signs == logit_signs::negative || (options.signs == logit_signs::mixed && coin(rng))) sign = -1.0;
    x = static_cast<float>(sign * options.magnitude + fraction(rng) / 64.0);
  }
  return out;
}

// Learned per-slot bias: uniform in [−1, 1), or multiples of 1/64 in [−2, 2] for large logits.
inline std::vector<float> random_bias(std::mt19937& rng, std::size_t count, bool exact_sixty_fourths = false) {
  if (!exact_sixty_fourths) return random_uniform(rng, count, -1.0f, 1.0f);
  std::uniform_int_distribution<int> k(-128, 128);
  std::vector<float> out(count);
  for (auto& x : out) x = static_cast<float>(k(rng) / 64.0);
  return out;
}

// RMSNorm weights, positive and away from 0 (as trained norms are), uniform in [0.25, 2).
inline std::vector<float> random_norm_weight(std::mt19937& rng, std::size_t count) {
  return random_uniform(rng, count, 0.25f, 2.0f);
}

// A fixed slot profile: non-negative, some exact zeros, positive sum.
inline std::vector<float> random_profile(std::mt19937& rng, std::size_t window) {
  std::vector<float> out = random_uniform(rng, window, 0.0f, 1.0f);
  std::bernoulli_distribution zero(0.25);
  for (auto& p : out)
    if (zero(rng)) p = 0.0f;
  out[window - 1] = 0.5f;  // the last slot is never padding: every entry has a positive real sum
  return out;
}

// A whole sequence's inputs for one stream: payload[tokens][payload_per_token] and, for gated
// pooling, logits[tokens][logits_per_token].
struct stream_inputs {
  std::vector<float> payload;
  std::vector<float> logits;
};

inline stream_inputs random_stream_inputs(std::mt19937& rng, std::int64_t tokens, std::int64_t payload_per_token,
                                          std::int64_t logits_per_token, const logit_options& logits = {}) {
  stream_inputs in;
  in.payload = random_payload(rng, static_cast<std::size_t>(tokens * payload_per_token));
  if (logits_per_token > 0) in.logits = random_logits(rng, static_cast<std::size_t>(tokens * logits_per_token), logits);
  return in;
}

// n values whose Hadamard transform is exact in double (so a dense transform and a fast one
// agree bit for bit): integers of up to 20 bits times 2^scale.
inline std::vector<float> exact_sum_values(std::mt19937& rng, std::int64_t n, int scale) {
  std::uniform_int_distribution<int> integer(-(1 << 20), 1 << 20);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = std::ldexp(static_cast<float>(integer(rng)), scale);
  return x;
}

}  // namespace phasekv_test
