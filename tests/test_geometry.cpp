// Tests of phasekv::geometry (docs/DESIGN.md §2).
//
// Oracle: an explicit, enumerated model built from the WORDS of the definitions, not from the
// header's closed forms. Blocks come from walking the token axis and opening a new block at every
// token t ≡ origin (mod S) (block 0 is the one holding token 0, so with origin > 0 it is short);
// windows are the W consecutive positions ending with the last token of block j; coverage,
// completion and visibility are counted by enumerating entries. For origin = 0 a second model
// transcribes docs/DESIGN.md §2 literally ([(j+1)S − W, (j+1)S), j < floor((t+1)/S), …) and both
// models must agree with each other and with the header, for every S in 1..12, W in S..12 and
// origin.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/core/geometry.hpp"

namespace test_geometry {

namespace {

using i64 = std::int64_t;

constexpr i64 max_stride = 12;
constexpr i64 max_window = 12;
constexpr i64 last_token = 300;  // tokens 0 … last_token are checked
constexpr i64 last_entry = 80;   // entries 0 … last_entry are checked

// Mathematical floor of a/2 and a mod m for any sign, by stepping (no closed form shared with
// the header).
i64 floor_half(i64 a) {
  i64 q = 0;
  while (2 * q > a) --q;
  while (2 * (q + 1) <= a) ++q;
  return q;
}
i64 mod_by_stepping(i64 a, i64 m) {
  while (a < 0) a += m;
  while (a >= m) a -= m;
  return a;
}

// The explicit model of one (S, W, origin): a block index for every position in
// [lowest, highest], obtained by walking; windows as explicit token lists.
struct explicit_model {
  i64 stride, window, origin;
  i64 lowest, highest;           // positions covered by the block table
  std::vector<i64> block_table;  // block index of position lowest + k
  std::map<i64, i64> first_position, last_position;  // of each block in the table

  explicit_model(i64 s, i64 w, i64 o) : stride(s), window(w), origin(o) {
    // Enough room for every window of every entry whose block ends by last_token + W + 2S.
    lowest = -(window + 3 * stride);
    highest = std::max(last_token + 2 * window + 4 * stride, (last_entry + 3) * stride + window);
    block_table.assign(static_cast<std::size_t>(highest - lowest + 1), 0);
    // "Blocks start at tokens t ≡ origin (mod S)"; block 0 holds token 0.
    auto starts_block = [&](i64 t) { return mod_by_stepping(t - origin, stride) == 0; };
    for (i64 t = 1; t <= highest; ++t) at(t) = at(t - 1) + (starts_block(t) ? 1 : 0);
    for (i64 t = -1; t >= lowest; --t) at(t) = at(t + 1) - (starts_block(t + 1) ? 1 : 0);
    for (i64 t = highest; t >= lowest; --t) first_position[block_of(t)] = t;
    for (i64 t = lowest; t <= highest; ++t) last_position[block_of(t)] = t;
  }

  i64& at(i64 t) { return block_table[static_cast<std::size_t>(t - lowest)]; }
  i64 block_of(i64 t) const { return block_table[static_cast<std::size_t>(t - lowest)]; }

  // First and last position of block j (virtual positions below 0 included).
  i64 first_of_block(i64 j) const {
    const auto found = first_position.find(j);
    if (found == first_position.end() || found->second == lowest) FAIL("block " << j << " is outside the model");
    return found->second;
  }
  i64 last_of_block(i64 j) const {
    const auto found = last_position.find(j);
    if (found == last_position.end() || found->second == highest) FAIL("block " << j << " is outside the model");
    return found->second;
  }
  // Entry j pools "the W positions ending with block j's end"; slot i is the i-th of them.
  std::vector<i64> window_of(i64 j) const {
    std::vector<i64> tokens;
    const i64 end = last_of_block(j);
    for (i64 t = end - window + 1; t <= end; ++t) tokens.push_back(t);
    return tokens;
  }
  // Position within its block, counted from the block's (possibly virtual) first position.
  i64 phase_of(i64 t) const { return t - first_of_block(block_of(t)); }
};

// Every geometry of the grid: S in 1..12, W in S..12, origin in 0..S−1.
std::vector<phasekv::geometry> all_geometries() {
  std::vector<phasekv::geometry> out;
  for (i64 s = 1; s <= max_stride; ++s)
    for (i64 w = s; w <= max_window; ++w)
      for (i64 o = 0; o < s; ++o) out.push_back(phasekv::geometry{s, w, o, phasekv::anchor_mode::block_start});
  return out;
}

std::string describe(const phasekv::geometry& g) {
  return "S=" + std::to_string(g.stride) + " W=" + std::to_string(g.window) + " origin=" + std::to_string(g.origin);
}

// Entries whose window (real tokens only) contains each token 0 … last_token, by enumerating
// every entry whose window can reach that far.
std::vector<std::vector<i64>> covering_entries(const explicit_model& m) {
  std::vector<std::vector<i64>> covering(static_cast<std::size_t>(last_token + 1));
  for (i64 j = 0; m.last_of_block(j) - m.window + 1 <= last_token; ++j)
    for (i64 t : m.window_of(j))
      if (t >= 0 && t <= last_token) covering[static_cast<std::size_t>(t)].push_back(j);
  return covering;
}

// f(g, m) for every geometry under test and its explicit model, the geometry named on failure.
template <class F>
void for_each_geometry(F&& f) {
  for (const auto& g : all_geometries()) {
    INFO(describe(g));
    const explicit_model m(g.stride, g.window, g.origin);
    f(g, m);
  }
}

// f(g, m, t, the entries covering t) for every geometry and every token 0 … last_token.
template <class F>
void for_each_covered_token(F&& f) {
  for_each_geometry([&](const phasekv::geometry& g, const explicit_model& m) {
    const auto covering = covering_entries(m);
    for (i64 t = 0; t <= last_token; ++t) {
      INFO("t=" << t);
      f(g, m, t, covering[static_cast<std::size_t>(t)]);
    }
  });
}

}  // namespace

TEST_CASE("geometry: the grid of test geometries is valid", "[geometry]") {
  const auto geometries = all_geometries();
  CHECK(geometries.size() == 364);  // Σ_S (13 − S)·S
  for (const auto& g : geometries) {
    INFO(describe(g));
    CHECK_NOTHROW(g.validate());
  }
}

TEST_CASE("geometry: with origin 0 the walked model is docs/DESIGN.md §2 verbatim", "[geometry]") {
  // Guards the oracle itself: for origin 0 the walked blocks and windows must be exactly the
  // ranges docs/DESIGN.md §2 writes down.
  for (const auto& g : all_geometries()) {
    if (g.origin != 0) continue;
    INFO(describe(g));
    const explicit_model m(g.stride, g.window, 0);
    for (i64 j = 0; j <= last_entry; ++j) {
      // Block j is [j·S, (j+1)·S).
      REQUIRE(m.first_of_block(j) == j * g.stride);
      REQUIRE(m.last_of_block(j) == (j + 1) * g.stride - 1);
      // Entry j is [(j+1)·S − W, (j+1)·S).
      std::vector<i64> design_window;
      for (i64 t = (j + 1) * g.stride - g.window; t < (j + 1) * g.stride; ++t) design_window.push_back(t);
      REQUIRE(m.window_of(j) == design_window);
    }
  }
}

TEST_CASE("geometry: blocks, block bounds and lead match the walked blocks", "[geometry]") {
  for_each_geometry([](const phasekv::geometry& g, const explicit_model& m) {
    for (i64 t = 0; t <= last_token; ++t) {
      INFO("t=" << t);
      REQUIRE(g.block_of(t) == m.block_of(t));
    }
    for (i64 j = 0; j <= last_entry; ++j) {
      INFO("j=" << j);
      REQUIRE(g.block_start(j) == m.first_of_block(j));
      REQUIRE(g.block_end(j) == m.last_of_block(j));
    }
    // Block 0 holds tokens 0 … origin−1 when origin > 0, and S tokens otherwise; lead() is the
    // number of virtual positions it has before token 0.
    const i64 real_in_block0 = m.last_of_block(0) + 1;
    CHECK(real_in_block0 == (g.origin == 0 ? g.stride : g.origin));
    CHECK(g.lead() == -m.first_of_block(0));
    // Every later block is full.
    for (i64 j = 1; j <= last_entry; ++j) REQUIRE(m.last_of_block(j) - m.first_of_block(j) + 1 == g.stride);
  });
}

TEST_CASE("geometry: slots, padding and first real slot match the explicit windows", "[geometry]") {
  for_each_geometry([](const phasekv::geometry& g, const explicit_model& m) {
    for (i64 j = 0; j <= last_entry; ++j) {
      INFO("j=" << j);
      const auto window = m.window_of(j);
      REQUIRE(g.window_start(j) == window.front());
      i64 padding = 0;
      for (i64 i = 0; i < g.window; ++i) {
        INFO("slot=" << i);
        const i64 t = window[static_cast<std::size_t>(i)];
        REQUIRE(g.slot_token(j, i) == t);
        REQUIRE(g.slot_of(t, j) == i);
        REQUIRE(g.is_padding(j, i) == (t < 0));
        if (t < 0) ++padding;
      }
      // Padding slots come first, so the count of padding slots is the first real slot.
      REQUIRE(g.first_real_slot(j) == padding);
      REQUIRE(padding < g.window);  // every entry holds at least one real token
    }
  });
}

TEST_CASE("geometry: coverage and covering entries match enumeration of every window", "[geometry]") {
  for_each_covered_token([](const phasekv::geometry& g, const explicit_model& m, i64 t,
                            const std::vector<i64>& list) {
    REQUIRE(!list.empty());
    // The covering entries are consecutive, so a half-open range describes them.
    for (std::size_t k = 1; k < list.size(); ++k) REQUIRE(list[k] == list[k - 1] + 1);
    const auto range = g.entries_covering(t);
    REQUIRE(range.first == list.front());
    REQUIRE(range.last == list.back() + 1);
    REQUIRE(g.coverage(t) == static_cast<i64>(list.size()));
    // The first entry covering a token is the entry of its own block.
    REQUIRE(list.front() == m.block_of(t));
  });
}

TEST_CASE("geometry: coverage is W/S when S divides W and varies with phase otherwise", "[geometry]") {
  for_each_geometry([](const phasekv::geometry& g, const explicit_model& m) {
    const auto covering = covering_entries(m);
    std::map<i64, std::set<i64>> coverage_by_phase;
    for (i64 t = 0; t <= last_token; ++t)
      coverage_by_phase[m.phase_of(t)].insert(static_cast<i64>(covering[static_cast<std::size_t>(t)].size()));
    REQUIRE(static_cast<i64>(coverage_by_phase.size()) == g.stride);
    // Coverage is a function of phase alone …
    std::set<i64> values;
    i64 sum_over_one_period = 0;
    for (const auto& [phase, set] : coverage_by_phase) {
      INFO("phase=" << phase);
      REQUIRE(set.size() == 1);
      values.insert(*set.begin());
      sum_over_one_period += *set.begin();
    }
    // … every token of one period together fills W slots of each entry …
    CHECK(sum_over_one_period == g.window);
    if (g.window % g.stride == 0) {
      // … it is W/S everywhere when S divides W …
      CHECK(values == std::set<i64>{g.window / g.stride});
    } else {
      // … and otherwise takes two values, floor(W/S) and ceil(W/S): itself a phase effect.
      CHECK(values == std::set<i64>{g.window / g.stride, g.window / g.stride + 1});
    }
  });
}

TEST_CASE("geometry: phase, boundary phase and residue", "[geometry]") {
  for_each_geometry([](const phasekv::geometry& g, const explicit_model& m) {
    CHECK(g.boundary_phase() == g.stride - 1);
    for (i64 t = 0; t <= last_token; ++t) {
      INFO("t=" << t);
      // docs/DESIGN.md §2: φ(t) = (t − origin) mod S …
      REQUIRE(g.phase_of(t) == mod_by_stepping(t - g.origin, g.stride));
      // … which is the token's place in its block counted from the block's first position.
      REQUIRE(g.phase_of(t) == m.phase_of(t));
      // Boundary phase S − 1: exactly the tokens whose successor lands in the next block.
      REQUIRE((g.phase_of(t) == g.boundary_phase()) == (m.block_of(t + 1) == m.block_of(t) + 1));
    }
    // Phase is defined for virtual (negative) positions too.
    for (i64 t = -3 * g.stride; t < 0; ++t) REQUIRE(g.phase_of(t) == mod_by_stepping(t - g.origin, g.stride));
  });
  // Residue t mod M, for several multiples M of S, including negative t.
  for (i64 s = 1; s <= max_stride; ++s)
    for (i64 multiple = 1; multiple <= 4; ++multiple) {
      const i64 modulus = s * multiple;
      for (i64 t = -50; t <= last_token; ++t) {
        INFO("M=" << modulus << " t=" << t);
        REQUIRE(phasekv::geometry::residue_of(t, modulus) == mod_by_stepping(t, modulus));
        // With origin 0, phase is the residue reduced mod S.
        const phasekv::geometry g{s, s, 0, phasekv::anchor_mode::block_start};
        REQUIRE(g.phase_of(t) == mod_by_stepping(phasekv::geometry::residue_of(t, modulus), s));
      }
    }
}

TEST_CASE("geometry: offsets and phase", "[geometry]") {
  for_each_covered_token([](const phasekv::geometry& g, const explicit_model& m, i64 t,
                            const std::vector<i64>& covering) {
    std::set<i64> offsets;
    for (i64 j : covering) {
      const auto window = m.window_of(j);
      const i64 offset = std::find(window.begin(), window.end(), t) - window.begin();
      offsets.insert(offset);
      // Every offset of a token is ≡ φ + W (mod S): so with S | W a token's offset in every
      // window is its phase mod S (why DeepSeek-V4's ape can index slot biases by i mod S),
      // but not when S ∤ W.
      REQUIRE(mod_by_stepping(offset, g.stride) == mod_by_stepping(g.phase_of(t) + g.window, g.stride));
      if (g.window % g.stride == 0) REQUIRE(mod_by_stepping(offset, g.stride) == g.phase_of(t));
    }
    // One offset per covering window, one phase.
    REQUIRE(static_cast<i64>(offsets.size()) == g.coverage(t));
    // With W = S offset and phase coincide.
    if (g.window == g.stride) REQUIRE(*offsets.begin() == g.phase_of(t));
  });
}

TEST_CASE("geometry: branch of a slot counts whole blocks back to the entry's own block", "[geometry]") {
  for_each_geometry([](const phasekv::geometry& g, const explicit_model& m) {
    std::set<i64> branches_seen;
    for (i64 j = 0; j <= last_entry; ++j) {
      const auto window = m.window_of(j);
      std::set<i64> blocks_touched;
      for (i64 i = 0; i < g.window; ++i) {
        INFO("j=" << j << " slot=" << i);
        // docs/DESIGN.md §2: floor((W−1−i)/S), W−1−i ≥ 0
        const i64 design_branch = (g.window - 1 - i) / g.stride;
        const i64 t = window[static_cast<std::size_t>(i)];
        // docs/DESIGN.md §2's claim: the number of whole blocks between the slot's token and
        // block j (virtual blocks for padding positions).
        REQUIRE(j - m.block_of(t) == design_branch);
        REQUIRE(g.branch_of_slot(i) == design_branch);
        branches_seen.insert(design_branch);
        blocks_touched.insert(m.block_of(t));
      }
      // branches() is the number of blocks a window touches (the last possibly partial).
      REQUIRE(g.branches() == static_cast<i64>(blocks_touched.size()));
    }
    CHECK(g.branches() == static_cast<i64>(branches_seen.size()));
    CHECK(*branches_seen.begin() == 0);
  });
}

TEST_CASE("geometry: anchor positions (block start, block end, window centre)", "[geometry]") {
  for (auto g : all_geometries()) {
    INFO(describe(g));
    const explicit_model m(g.stride, g.window, g.origin);
    for (i64 j = 0; j <= last_entry; ++j) {
      INFO("j=" << j);
      const auto window = m.window_of(j);
      g.anchor = phasekv::anchor_mode::block_start;
      REQUIRE(g.anchor_position(j) == m.first_of_block(j));
      if (g.origin == 0) REQUIRE(g.anchor_position(j) == j * g.stride);  // DeepSeek-V4's default
      g.anchor = phasekv::anchor_mode::block_end;
      REQUIRE(g.anchor_position(j) == m.last_of_block(j));
      g.anchor = phasekv::anchor_mode::window_centre;
      REQUIRE(g.anchor_position(j) == floor_half(window.front() + window.back()));
    }
  }
  // A default geometry anchors at the block start.
  CHECK(phasekv::geometry{}.anchor == phasekv::anchor_mode::block_start);
}

TEST_CASE("geometry: completion and visibility", "[geometry]") {
  for_each_geometry([](const phasekv::geometry& g, const explicit_model& m) {
    // Entry j is complete once the last token of its block has been appended.
    std::vector<i64> completion;
    for (i64 j = 0; m.last_of_block(j) <= last_token + 1; ++j) completion.push_back(m.last_of_block(j));
    for (i64 j = 0; j <= last_entry; ++j) {
      INFO("j=" << j);
      REQUIRE(g.completion_token(j) == m.last_of_block(j));
      if (g.origin == 0) REQUIRE(g.completion_token(j) == (j + 1) * g.stride - 1);  // docs/DESIGN.md §2
      // The completing token is the last slot of the entry's window: nothing later is pooled.
      REQUIRE(g.completion_token(j) == m.window_of(j).back());
    }
    for (i64 n = 0; n <= last_token + 1; ++n) {
      INFO("appended=" << n);
      const i64 complete = std::count_if(completion.begin(), completion.end(), [&](i64 c) { return c <= n - 1; });
      REQUIRE(g.completed_entries(n) == complete);
    }
    std::set<i64> reachable;  // real tokens pooled by the entries visible so far
    i64 entries_added = 0;
    for (i64 t = 0; t <= last_token; ++t) {
      INFO("query t=" << t);
      // A query at t sees the entries already complete when token t is in the sequence.
      const i64 visible = std::count_if(completion.begin(), completion.end(), [&](i64 c) { return c <= t; });
      REQUIRE(g.visible_entries(t) == visible);
      if (g.origin == 0) {
        // docs/DESIGN.md §2: exactly j < floor((t+1)/S).
        i64 design_visible = 0;
        while ((design_visible + 1) * g.stride <= t + 1) ++design_visible;
        REQUIRE(g.visible_entries(t) == design_visible);
      }
      for (; entries_added < visible; ++entries_added)
        for (i64 u : m.window_of(entries_added)) {
          // Causality: no visible entry pools a token after t.
          REQUIRE(u <= t);
          if (u >= 0) reachable.insert(u);
        }
      // Every token before the current block is in some visible entry; the tokens of the
      // current, incomplete block are in none (they are reachable only through the raw window).
      const bool block_complete = m.block_of(t + 1) != m.block_of(t);
      i64 first_wrong = -1;
      for (i64 u = 0; u <= t && first_wrong < 0; ++u) {
        const bool in_incomplete_block = !block_complete && m.block_of(u) == m.block_of(t);
        if ((reachable.count(u) != 0) == in_incomplete_block) first_wrong = u;
      }
      INFO("first token reachable when it should not be, or not when it should: " << first_wrong);
      REQUIRE(first_wrong == -1);
    }
  });
}

TEST_CASE("geometry: DeepSeek-V4 (W=8, S=4) entry 0 pools only tokens 0-3", "[geometry]") {
  const phasekv::geometry g{4, 8, 0, phasekv::anchor_mode::block_start};
  REQUIRE_NOTHROW(g.validate());
  CHECK(g.branches() == 2);
  CHECK(g.first_real_slot(0) == 4);
  std::vector<i64> real_tokens;
  for (i64 i = 0; i < g.window; ++i)
    if (!g.is_padding(0, i)) real_tokens.push_back(g.slot_token(0, i));
  CHECK(real_tokens == std::vector<i64>{0, 1, 2, 3});
  // Entry 1 pools tokens 0–7: slots 0–3 (branch 1, previous block) and 4–7 (branch 0).
  CHECK(g.first_real_slot(1) == 0);
  CHECK(g.slot_token(1, 0) == 0);
  CHECK(g.slot_token(1, 7) == 7);
  CHECK(g.branch_of_slot(3) == 1);
  CHECK(g.branch_of_slot(4) == 0);
  // Every token is pooled by two entries; token 3 (boundary phase) completes entry 0.
  CHECK(g.coverage(5) == 2);
  CHECK(g.completion_token(0) == 3);
  CHECK(g.phase_of(3) == g.boundary_phase());
  CHECK(g.visible_entries(2) == 0);
  CHECK(g.visible_entries(3) == 1);
  // HCA (S = W = 128): one entry per block, no padding.
  const phasekv::geometry hca{128, 128, 0, phasekv::anchor_mode::block_start};
  CHECK(hca.branches() == 1);
  CHECK(hca.first_real_slot(0) == 0);
  CHECK(hca.coverage(1000) == 1);
}

TEST_CASE("geometry: validate names the field and the value", "[geometry][errors]") {
  using Catch::Contains;
  const auto make = [](i64 s, i64 w, i64 o) { return phasekv::geometry{s, w, o, phasekv::anchor_mode::block_start}; };

  REQUIRE_THROWS_AS(make(0, 4, 0).validate(), phasekv::config_error);
  REQUIRE_THROWS_WITH(make(0, 4, 0).validate(), Contains("stride") && Contains("0"));
  REQUIRE_THROWS_WITH(make(-3, 4, 0).validate(), Contains("stride") && Contains("-3"));

  REQUIRE_THROWS_AS(make(4, 3, 0).validate(), phasekv::config_error);
  REQUIRE_THROWS_WITH(make(4, 3, 0).validate(), Contains("window") && Contains("3"));
  REQUIRE_THROWS_WITH(make(5, 2, 0).validate(), Contains("window = 2"));

  REQUIRE_THROWS_AS(make(4, 8, 4).validate(), phasekv::config_error);
  REQUIRE_THROWS_WITH(make(4, 8, 4).validate(), Contains("origin") && Contains("4"));
  REQUIRE_THROWS_WITH(make(4, 8, 7).validate(), Contains("origin = 7"));
  REQUIRE_THROWS_WITH(make(4, 8, -1).validate(), Contains("origin = -1"));

  // An anchor value outside the enum.
  auto bad_anchor = make(4, 8, 0);
  bad_anchor.anchor = static_cast<phasekv::anchor_mode>(17);
  REQUIRE_THROWS_WITH(bad_anchor.validate(), Contains("anchor") && Contains("17"));

  // config_error is a phasekv::error and a std::runtime_error.
  try {
    make(0, 1, 0).validate();
    FAIL("stride 0 did not throw");
  } catch (const phasekv::error& e) {
    CHECK_THAT(e.what(), Contains("geometry.stride = 0"));
  }

  // The smallest valid geometries.
  CHECK_NOTHROW(make(1, 1, 0).validate());
  CHECK_NOTHROW(make(4, 4, 3).validate());
}

}  // namespace test_geometry
