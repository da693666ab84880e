// kernels::indexer_bf16 (include/phasekv/kernels/indexer_bf16.hpp) against the indexer's
// maths in double over the bf16-rounded queries and keys: I_j = Σ_h w_h · ReLU(q̃_h · k̃_j).
// Shapes cover its paths: heads filling part of a block, one block and several; channel pairs
// from 1 to 65; entry counts below, at and past the 6-entry tile; rows spaced wider than the
// channels (a page of several KV heads' worth of stride). Only in builds with AVX512-BF16; the
// reader's fallback for other builds is covered by the bf16-precision reads in test_read.cpp.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "phasekv/kernels/indexer_bf16.hpp"

namespace test_read_indexer_bf16 {

namespace {

using i64 = std::int64_t;

}  // namespace

TEST_CASE("round_to_bf16 rounds to nearest even and keeps exact values", "[read][indexer][bf16]") {
  const float in[] = {1.0f, 1.00390625f /* 1 + 2^-8: a tie, to even */, 1.01171875f /* 1 + 3·2^-8: tie, up */,
                      -2.5f, 3.0e38f};
  float out[5];
  phasekv::kernels::round_to_bf16(in, 5, out);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == 1.0f);
  CHECK(out[2] == 1.015625f);
  CHECK(out[3] == -2.5f);
  CHECK(out[4] == phasekv::bf16_to_float(phasekv::float_to_bf16(3.0e38f)));
}

#if PHASEKV_HAS_BF16_DOT

TEST_CASE("indexer_bf16: scores equal the maths in double on bf16-rounded inputs", "[read][indexer][bf16]") {
  using kernel = phasekv::kernels::indexer_bf16;
  std::mt19937 rng(2027);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (i64 heads : {1, 17, 64, 100})
    for (i64 channels : {2, 16, 128, 130})
      for (i64 count : {1, 4, 5, 6, 7, 13, 64}) {
        const i64 stride = channels + 6;  // rows spaced wider than their channels
        std::vector<float> q(static_cast<std::size_t>(heads * channels)), w(static_cast<std::size_t>(heads));
        for (float& x : q) x = u(rng) * 3.0f;
        for (float& x : w) x = u(rng) + 0.2f;  // some negative weights too
        std::vector<std::uint16_t> keys(static_cast<std::size_t>(count * stride));
        for (auto& k : keys) k = phasekv::float_to_bf16(u(rng));
        kernel::prepared p;
        kernel::prepare(q.data(), w.data(), heads, channels, p);
        std::vector<float> out(static_cast<std::size_t>(count), -9.0f);
        kernel::score(p, keys.data(), stride, count, out.data());

        std::ostringstream why;
        for (i64 j = 0; j < count; ++j) {
          double want = 0.0, scale = 0.0;
          for (i64 h = 0; h < heads; ++h) {
            double dot = 0.0, size = 0.0;
            for (i64 c = 0; c < channels; ++c) {
              const double qc = phasekv::bf16_to_float(phasekv::float_to_bf16(q[static_cast<std::size_t>(h * channels + c)]));
              const double kc = phasekv::bf16_to_float(keys[static_cast<std::size_t>(j * stride + c)]);
              dot += qc * kc;
              size += std::abs(qc * kc);
            }
            want += w[static_cast<std::size_t>(h)] * std::max(0.0, dot);
            scale += std::abs(w[static_cast<std::size_t>(h)]) * size;
          }
          const double got = out[static_cast<std::size_t>(j)];
          if (!(std::abs(got - want) <= 1e-6 * std::max(1.0, scale)))
            why << "entry " << j << ": " << got << ", want " << want << " (scale " << scale << "); ";
        }
        INFO("heads " << heads << ", channels " << channels << ", count " << count);
        CHECK(why.str() == "");
      }
}

#endif

}  // namespace test_read_indexer_bf16
