// kernels::attention (include/phasekv/kernels/attention.hpp) against the maths of
// docs/DESIGN.md §5 in double: logits scale·q·k, their max and exp-sum per head, and Σ p·v.
// Shapes cover every path of the kernel: heads that fill no, one and several head blocks
// (padding, the 4-batch block and a partial one), key counts around the 6-key tile, channel counts
// around the 4-batch output tile, the one-batch tile and the scalar tail, and rows scattered in
// memory (as selected entries lie in their pages). Runs for the compiler's best architecture and,
// when it differs, AVX2.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "phasekv/kernels/attention.hpp"

namespace test_read_attention_kernel {

namespace {

using i64 = std::int64_t;

struct shape {
  i64 heads, key_channels, value_channels, keys;
};

// "" when the kernel matches the double-precision maths for this shape, else what differs.
template <class Arch>
std::string check_shape(const shape& s, std::mt19937& rng) {
  using kernel = phasekv::kernels::attention<Arch>;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.key_channels));
  std::vector<float> q(static_cast<std::size_t>(s.heads * s.key_channels));
  for (float& x : q) x = u(rng);
  // Rows at scattered offsets of one arena, in an order unrelated to their addresses.
  const i64 stride = s.key_channels + s.value_channels + 3;
  std::vector<float> arena(static_cast<std::size_t>((s.keys * 2 + 1) * stride));
  for (float& x : arena) x = u(rng);
  std::vector<const float*> keys(static_cast<std::size_t>(s.keys)), values(keys.size());
  for (i64 k = 0; k < s.keys; ++k) {
    const i64 slot = (k * 7 + 3) % (2 * s.keys + 1);
    keys[static_cast<std::size_t>(k)] = arena.data() + slot * stride + 1;
    values[static_cast<std::size_t>(k)] = arena.data() + slot * stride + 2 + s.key_channels;
  }

  typename kernel::prepared p;
  kernel::prepare(q.data(), s.heads, s.key_channels, scale, p);
  typename kernel::aligned_floats logits(static_cast<std::size_t>(s.keys * p.padded));
  kernel::logits(p, keys.data(), s.keys, logits.data());
  const std::vector<float> raw(logits.begin(), logits.end());
  std::vector<float> m(static_cast<std::size_t>(p.padded)), d(m.size());
  kernel::softmax(logits.data(), s.keys, p.padded, m.data(), d.data());
  std::vector<float> o(static_cast<std::size_t>(s.heads * s.value_channels), -7.0f);
  kernel::output(logits.data(), p.padded, s.heads, values.data(), s.keys, s.value_channels, o.data());

  std::ostringstream why;
  auto off = [](double got, double want, double tol) { return !(std::abs(got - want) <= tol * std::max(1.0, std::abs(want))); };
  for (i64 h = 0; h < s.heads && why.str().empty(); ++h) {
    std::vector<double> l(static_cast<std::size_t>(s.keys));
    double mx = -INFINITY;
    for (i64 k = 0; k < s.keys; ++k) {
      double dot = 0.0;
      for (i64 c = 0; c < s.key_channels; ++c)
        dot += static_cast<double>(q[static_cast<std::size_t>(h * s.key_channels + c)]) * scale * keys[static_cast<std::size_t>(k)][c];
      l[static_cast<std::size_t>(k)] = dot;
      mx = std::max(mx, dot);
      if (off(raw[static_cast<std::size_t>(k * p.padded + h)], dot, 1e-5))
        why << "logit[key " << k << "][head " << h << "] = " << raw[static_cast<std::size_t>(k * p.padded + h)] << ", want " << dot;
    }
    double sum = 0.0;
    std::vector<double> acc(static_cast<std::size_t>(s.value_channels), 0.0);
    for (i64 k = 0; k < s.keys; ++k) {
      const double e = std::exp(l[static_cast<std::size_t>(k)] - mx);
      sum += e;
      for (i64 c = 0; c < s.value_channels; ++c) acc[static_cast<std::size_t>(c)] += e * values[static_cast<std::size_t>(k)][c];
    }
    if (off(m[static_cast<std::size_t>(h)], mx, 1e-5)) why << "max[head " << h << "] = " << m[static_cast<std::size_t>(h)] << ", want " << mx;
    if (off(d[static_cast<std::size_t>(h)], sum, 1e-5)) why << "sum[head " << h << "] = " << d[static_cast<std::size_t>(h)] << ", want " << sum;
    for (i64 c = 0; c < s.value_channels; ++c) {
      // Σ e·v can cancel: compare against the scale of its terms, Σ e·|v| ≤ sum.
      const double got = o[static_cast<std::size_t>(h * s.value_channels + c)], want = acc[static_cast<std::size_t>(c)];
      if (!(std::abs(got - want) <= 1e-5 * std::max(1.0, sum))) {
        why << "out[head " << h << "][channel " << c << "] = " << got << ", want " << want;
        break;
      }
    }
  }
  if (!why.str().empty())
    why << " (heads " << s.heads << ", key channels " << s.key_channels << ", value channels " << s.value_channels
        << ", keys " << s.keys << ")";
  return why.str();
}

template <class Arch>
void check_all_paths() {
  std::mt19937 rng(2026);
  for (i64 heads : {1, 5, 16, 17, 64, 70, 130})
    for (i64 keys : {1, 5, 6, 7, 13, 40})
      for (i64 channels : {1, 7, 16, 64, 100, 131}) {
        const shape s{heads, channels, (channels * 3) % 139 + 1, keys};
        INFO("heads " << heads << ", keys " << keys << ", channels " << channels);
        CHECK(check_shape<Arch>(s, rng) == "");
      }
  // The DeepSeek-V4-Flash shape of one piece: 64 heads, 512 channels, 256 keys.
  CHECK(check_shape<Arch>({64, 512, 512, 256}, rng) == "");
}

}  // namespace

TEST_CASE("attention kernel: logits, softmax and output equal the maths in double on every path",
          "[read][attention_kernel]") {
  check_all_paths<xsimd::default_arch>();
#if XSIMD_WITH_FMA3_AVX2
  check_all_paths<xsimd::fma3<xsimd::avx2>>();
#endif
}

TEST_CASE("attention kernel: a padded head's lanes never reach the output", "[read][attention_kernel]") {
  using kernel = phasekv::kernels::attention<>;
  // Three heads, so lanes 3… of the batch are padding (zero queries, logits 0, p = 1): the output
  // rows of the real heads must not change when the padding's probabilities are poisoned.
  const i64 heads = 3, channels = 40, keys = 9;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(heads * channels)), rows(static_cast<std::size_t>(keys * channels));
  for (float& x : q) x = u(rng);
  for (float& x : rows) x = u(rng);
  std::vector<const float*> ptr(static_cast<std::size_t>(keys));
  for (i64 k = 0; k < keys; ++k) ptr[static_cast<std::size_t>(k)] = rows.data() + k * channels;
  kernel::prepared p;
  kernel::prepare(q.data(), heads, channels, 0.5f, p);
  REQUIRE(p.padded >= heads);
  kernel::aligned_floats l(static_cast<std::size_t>(keys * p.padded));
  kernel::logits(p, ptr.data(), keys, l.data());
  std::vector<float> m(static_cast<std::size_t>(p.padded)), d(m.size());
  kernel::softmax(l.data(), keys, p.padded, m.data(), d.data());
  std::vector<float> clean(static_cast<std::size_t>(heads * channels)), poisoned(clean.size());
  kernel::output(l.data(), p.padded, heads, ptr.data(), keys, channels, clean.data());
  for (i64 k = 0; k < keys; ++k)
    for (i64 h = heads; h < p.padded; ++h) l[static_cast<std::size_t>(k * p.padded + h)] = NAN;
  kernel::output(l.data(), p.padded, heads, ptr.data(), keys, channels, poisoned.data());
  CHECK(clean == poisoned);
}

}  // namespace test_read_attention_kernel
