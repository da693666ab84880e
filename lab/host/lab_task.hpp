#pragma once
// The lab's key→value retrieval task (version 2), generated exactly as lab/task.py does: its
// docstring states the task and the order of draws. Same seed, same sequence — lab/tests check
// it token for token.

#include <algorithm>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <phasekv/core/random.hpp>

namespace lab {

struct task_config {
  std::int64_t filler = 16, keys = 64, values = 64, tokens = 256, records = 8, queries = 8, decoys = 8, trail = 15;
  std::int64_t gap = 0;
  std::string placement = "uniform";  // uniform | aligned | isolated | gapped
  std::int64_t block_stride = 0, block_origin = 0, isolation = 0;

  std::int64_t vocab() const { return filler + keys + values + 1; }
  std::int64_t query_token() const { return filler + keys + values; }
  std::int64_t first_value() const { return filler + keys; }
  std::int64_t record_tokens() const { return gap + 2; }
  std::int64_t context(std::int64_t u) const { return tokens - 2 * queries - u; }
};

// SplitMix64 draws (phasekv/core/random.hpp), the generator lab/task.py reimplements.
class splitmix64 {
 public:
  explicit splitmix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return phasekv::detail::splitmix64(state_); }
  std::int64_t uniform(std::int64_t n) { return static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n)); }

 private:
  std::uint64_t state_;
};

struct task_sequence {
  std::vector<std::int32_t> tokens;
  std::vector<std::int64_t> answer_positions;  // position of each question's key
  std::vector<std::int32_t> answers;           // the value expected there
  std::vector<std::int64_t> record_starts;     // key position of each record (0: the target when forced)
  std::vector<std::int64_t> asked;             // the record each question asks for
  std::vector<std::int64_t> decoys;            // decoy positions
  std::int64_t trail = 0;                      // u

  std::int64_t query_position() const { return answer_positions.back(); }
};

inline bool in_one_block(const task_config& c, std::int64_t p) {
  const std::int64_t S = c.block_stride, lead = (S - c.block_origin) % S;
  return (p + lead) / S == (p + c.record_tokens() - 1 + lead) / S;
}

// One sequence; with target ≥ 0 the last question asks for the record whose key is at `target`.
// With trail ≥ 0 the trailing filler is that long instead of drawn (the draw still happens, so
// the rest of the sequence is the one the seed gives).
inline task_sequence generate(const task_config& c, std::uint64_t seed, std::int64_t target = -1,
                              std::int64_t trail = -1) {
  constexpr std::int64_t max_draws = 1000000;
  splitmix64 rng(seed);
  const std::int64_t T = c.tokens, L = c.record_tokens();
  task_sequence s;
  s.trail = rng.uniform(c.trail + 1);
  if (trail >= 0) s.trail = trail;
  const std::int64_t C = c.context(s.trail);
  s.tokens.resize(static_cast<std::size_t>(T));
  for (auto& t : s.tokens) t = static_cast<std::int32_t>(rng.uniform(c.filler));
  const bool blocks = c.placement == "aligned" || (c.placement == "gapped" && c.block_stride > 0);
  const bool isolated = c.placement == "isolated" && target >= 0;
  if (target >= 0) {
    if (target > C - L)
      throw std::invalid_argument("target " + std::to_string(target) +
                                  " leaves no room for its record before the questions (context " + std::to_string(C) + ")");
    s.record_starts.push_back(target);
  }
  auto near_target = [&](std::int64_t lo, std::int64_t hi) {
    return isolated && lo < target + L + c.isolation && hi > target - c.isolation;
  };
  std::int64_t draws = 0;
  while (static_cast<std::int64_t>(s.record_starts.size()) < c.records) {
    if (++draws > max_draws)
      throw std::invalid_argument("task: could not place " + std::to_string(c.records) + " records (" + c.placement +
                                  ") in " + std::to_string(C) + " tokens");
    const std::int64_t p = rng.uniform(C - L + 1);
    bool ok = true;
    for (std::int64_t q : s.record_starts) ok = ok && (p > q ? p - q : q - p) >= L;
    if (!ok || (blocks && !in_one_block(c, p)) || near_target(p, p + L)) continue;
    s.record_starts.push_back(p);
  }
  std::vector<std::int64_t> perm(static_cast<std::size_t>(c.keys));
  for (std::int64_t i = 0; i < c.keys; ++i) perm[i] = i;
  for (std::int64_t i = 0; i < c.records; ++i) std::swap(perm[i], perm[i + rng.uniform(c.keys - i)]);
  std::vector<std::int64_t> values(static_cast<std::size_t>(c.records));
  for (auto& v : values) v = rng.uniform(c.values);
  std::set<std::int64_t> taken;
  for (std::int64_t r = 0; r < c.records; ++r) {
    const std::int64_t p = s.record_starts[r];
    for (std::int64_t t = p; t < p + L; ++t) taken.insert(t);
    s.tokens[p] = static_cast<std::int32_t>(c.filler + perm[r]);
    s.tokens[p + L - 1] = static_cast<std::int32_t>(c.first_value() + values[r]);
  }
  draws = 0;
  while (static_cast<std::int64_t>(s.decoys.size()) < c.decoys) {
    if (++draws > max_draws)
      throw std::invalid_argument("task: could not place " + std::to_string(c.decoys) + " decoys in " + std::to_string(C) + " tokens");
    const std::int64_t p = rng.uniform(C);
    if (taken.count(p) || near_target(p, p + 1)) continue;
    taken.insert(p);
    s.decoys.push_back(p);
    s.tokens[p] = static_cast<std::int32_t>(c.first_value() + rng.uniform(c.values));
  }
  std::vector<std::int64_t> order(static_cast<std::size_t>(c.records));
  for (std::int64_t i = 0; i < c.records; ++i) order[i] = i;
  for (std::int64_t i = 0; i < c.queries; ++i) std::swap(order[i], order[i + rng.uniform(c.records - i)]);
  s.asked.assign(order.begin(), order.begin() + c.queries);
  if (target >= 0) {
    auto it = std::find(s.asked.begin(), s.asked.end(), 0);
    if (it != s.asked.end()) {
      s.asked.erase(it);
      s.asked.push_back(0);
    } else {
      s.asked.back() = 0;
    }
  }
  for (std::size_t i = 0; i < s.asked.size(); ++i) {
    const std::int64_t r = s.asked[i], at = C + 2 * static_cast<std::int64_t>(i);
    s.tokens[at] = static_cast<std::int32_t>(c.query_token());
    s.tokens[at + 1] = static_cast<std::int32_t>(c.filler + perm[r]);
    s.answer_positions.push_back(at + 1);
    s.answers.push_back(static_cast<std::int32_t>(c.first_value() + values[r]));
  }
  return s;
}

// The chance of the last question's answer under the two guessing shortcuts (lab/task.py,
// `floors`): uniform over the distinct values in the context, and over the records' values.
struct floors {
  double any_value = 0, record_value = 0;
};

inline floors floors_of(const task_config& c, const task_sequence& s) {
  std::set<std::int32_t> in_context, of_records;
  const std::int64_t C = c.context(s.trail);
  for (std::int64_t t = 0; t < C; ++t)
    if (s.tokens[t] >= c.first_value() && s.tokens[t] < c.first_value() + c.values) in_context.insert(s.tokens[t]);
  for (std::int64_t p : s.record_starts) of_records.insert(s.tokens[p + c.record_tokens() - 1]);
  return {1.0 / double(in_context.size()), 1.0 / double(of_records.size())};
}

}  // namespace lab
