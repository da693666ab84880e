// Record layouts (diag/record_layout.hpp) against a brute-force oracle that knows nothing of the
// geometry's formulas: block boundaries are enumerated token by token (a boundary at every
// s ≥ 1 with s ≡ origin mod S), and entry j's window is the W tokens ending with the last token
// of block j, so "covers the record whole" is checked entry by entry.

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "phasekv/diag/record_layout.hpp"
#include "phasekv/study/phase_sweep.hpp"

namespace test_diag_record_layout {

namespace {

using namespace phasekv;
using namespace phasekv::diag;

struct oracle {
  std::int64_t S, W, origin;
  std::vector<std::int64_t> block_of;  // per token
  std::vector<std::int64_t> block_end; // per block: its last token

  oracle(std::int64_t s, std::int64_t w, std::int64_t o, std::int64_t tokens) : S(s), W(w), origin(o) {
    std::int64_t block = 0;
    for (std::int64_t t = 0; t < tokens; ++t) {
      if (t >= 1 && (t - origin) % S == 0) {
        block_end.push_back(t - 1);
        ++block;
      }
      block_of.push_back(block);
    }
  }
  // Entries 0 … whose window [end − W + 1, end] holds [first, last].
  std::int64_t covering(std::int64_t first, std::int64_t last, std::int64_t& first_entry) const {
    std::int64_t n = 0;
    first_entry = -1;
    for (std::size_t j = 0; j < block_end.size(); ++j) {
      const std::int64_t end = block_end[j];
      if (end - W + 1 <= first && last <= end) {
        if (n == 0) first_entry = static_cast<std::int64_t>(j);
        ++n;
      }
    }
    return n;
  }
};

}  // namespace

TEST_CASE("record layout equals a brute-force enumeration of every entry's window", "[diag][layout]") {
  std::mt19937_64 rng(29);
  std::int64_t checked = 0, contained = 0, covered = 0, split = 0;
  for (std::int64_t S = 1; S <= 16; ++S) {
    for (std::int64_t k : {1, 2, 3}) {
      const std::int64_t W = k * S;
      for (std::int64_t origin = 0; origin < S; origin += (S > 4 ? 3 : 1)) {
        const std::int64_t tokens = 40 * W + 64;
        const oracle o(S, W, origin, tokens);
        const geometry g{S, W, origin, anchor_mode::block_start};
        for (std::int64_t length = 2; length <= 12; ++length) {
          std::vector<std::int64_t> firsts;
          for (std::int64_t t = 0; t < 3 * W + 2; ++t) firsts.push_back(t);  // near the start
          std::uniform_int_distribution<std::int64_t> pick(0, tokens - 3 * W - 13);
          for (int i = 0; i < 20; ++i) firsts.push_back(pick(rng));
          for (std::int64_t first : firsts) {
            const std::int64_t last = first + length - 1;
            if (last >= static_cast<std::int64_t>(o.block_end.back())) continue;  // needs a complete entry after it
            const record_layout l = classify_record(g, first, length);
            INFO("S " << S << " W " << W << " origin " << origin << " first " << first << " length " << length);
            REQUIRE(l.first == first);
            REQUIRE(l.last == last);
            const std::int64_t boundaries = o.block_of[static_cast<std::size_t>(last)] - o.block_of[static_cast<std::size_t>(first)];
            REQUIRE(l.boundaries == boundaries);
            std::int64_t first_entry = -1;
            REQUIRE(l.covering_entries == o.covering(first, last, first_entry));
            REQUIRE(l.first_covering == first_entry);
            if (first_entry >= 0) REQUIRE(l.first_slot == first - (o.block_end[static_cast<std::size_t>(first_entry)] - W + 1));
            // In-block offsets: tokens since the block's first token.
            const auto offset = [&](std::int64_t t) {
              std::int64_t u = t;
              while (u > 0 && o.block_of[static_cast<std::size_t>(u - 1)] == o.block_of[static_cast<std::size_t>(t)]) --u;
              // block 0 is short when origin > 0: its offsets count from the virtual block start
              return o.block_of[static_cast<std::size_t>(t)] == 0 && origin > 0 ? t + (S - origin) : t - u;
            };
            REQUIRE(l.first_offset == offset(first));
            REQUIRE(l.last_offset == offset(last));
            const layout_class expected = boundaries == 0        ? layout_class::contained
                                          : l.covering_entries > 0 ? layout_class::straddle_covered
                                                                   : layout_class::straddle_split;
            REQUIRE(l.kind == expected);
            if (W == S && boundaries > 0) REQUIRE(l.kind == layout_class::straddle_split);
            contained += l.kind == layout_class::contained;
            covered += l.kind == layout_class::straddle_covered;
            split += l.kind == layout_class::straddle_split;
            ++checked;
          }
        }
      }
    }
  }
  CHECK(checked > 20000);
  CHECK(contained > 1000);
  CHECK(covered > 1000);
  CHECK(split > 1000);
}

TEST_CASE("crowding counts the other records in the tokens the record's entries pool", "[diag][layout]") {
  std::mt19937_64 rng(3);
  for (std::int64_t S : {2, 4, 8}) {
    for (std::int64_t W : {S, 2 * S}) {
      const geometry g{S, W, 1 % S, anchor_mode::block_start};
      const std::int64_t tokens = 2000;
      const oracle o(S, W, g.origin, tokens);
      for (int trial = 0; trial < 200; ++trial) {
        const std::int64_t L = 2 + static_cast<std::int64_t>(rng() % 4);
        const std::int64_t first = 100 + static_cast<std::int64_t>(rng() % 1700);
        std::vector<std::int64_t> others;
        for (int i = 0; i < 30; ++i) others.push_back(first - 40 + static_cast<std::int64_t>(rng() % 80));
        // Oracle: the union of the windows of every entry that holds a token of the record.
        std::vector<char> pooled(static_cast<std::size_t>(tokens), 0);
        for (std::size_t j = 0; j < o.block_end.size(); ++j) {
          const std::int64_t end = o.block_end[j], start = end - W + 1;
          if (end < first || start > first + L - 1) continue;
          for (std::int64_t t = std::max<std::int64_t>(0, start); t <= end; ++t) pooled[static_cast<std::size_t>(t)] = 1;
        }
        std::int64_t expected = 0;
        for (std::int64_t other : others) {
          if (other == first) continue;
          bool hit = false;
          for (std::int64_t t = other; t < other + L; ++t) hit = hit || pooled[static_cast<std::size_t>(t)];
          expected += hit;
        }
        CHECK(crowding(g, first, L, span<const std::int64_t>(others.data(), others.size()), L) == expected);
      }
    }
  }
}

TEST_CASE("record layout: bad arguments name the field", "[diag][layout]") {
  const geometry g{4, 8, 0, anchor_mode::block_start};
  CHECK_THROWS_WITH(classify_record(g, -1, 2), Catch::Contains("first"));
  CHECK_THROWS_WITH(classify_record(g, 0, 0), Catch::Contains("length"));
  record_shape r;
  r.value_tokens = 0;
  CHECK_THROWS_WITH(r.validate(), Catch::Contains("record_shape.value_tokens"));
}

}  // namespace test_diag_record_layout
