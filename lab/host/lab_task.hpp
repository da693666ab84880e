#pragma once
// The lab's key→value retrieval task, generated exactly as lab/task.py does (the draw order is
// documented there): a haystack of filler tokens with `records` key→value records at random,
// non-overlapping positions, then `queries` questions "Q k" whose answers follow all but the
// last. Same seed, same tokens — lab/tests/test_host.py checks it token for token.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <phasekv/core/random.hpp>

namespace lab {

struct task_config {
  std::int64_t filler = 16, keys = 64, values = 64, tokens = 512, records = 16, queries = 4;

  std::int64_t vocab() const { return filler + keys + values + 1; }
  std::int64_t query_token() const { return filler + keys + values; }
  std::int64_t context() const { return tokens - 3 * queries + 1; }  // records live in [0, context)
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
  std::vector<std::int64_t> record_starts;     // key position of each record
};

// One sequence; with target ≥ 0 the last question asks for the record whose key is at `target`.
inline task_sequence generate(const task_config& c, std::uint64_t seed, std::int64_t target = -1) {
  splitmix64 rng(seed);
  const std::int64_t T = c.tokens, C = c.context();
  task_sequence s;
  s.tokens.resize(static_cast<std::size_t>(T));
  for (auto& t : s.tokens) t = static_cast<std::int32_t>(rng.uniform(c.filler));
  if (target >= 0) {
    if (target > C - 2)
      throw std::invalid_argument("target " + std::to_string(target) +
                                  " leaves no room for its value before the questions (context " +
                                  std::to_string(C) + ")");
    s.record_starts.push_back(target);
  }
  while (static_cast<std::int64_t>(s.record_starts.size()) < c.records) {
    const std::int64_t p = rng.uniform(C - 1);
    bool free = true;
    for (std::int64_t q : s.record_starts) free = free && std::llabs(p - q) >= 2;
    if (free) s.record_starts.push_back(p);
  }
  std::vector<std::int64_t> perm(static_cast<std::size_t>(c.keys));
  for (std::int64_t i = 0; i < c.keys; ++i) perm[i] = i;
  for (std::int64_t i = 0; i < c.records; ++i) std::swap(perm[i], perm[i + rng.uniform(c.keys - i)]);
  std::vector<std::int64_t> values(static_cast<std::size_t>(c.records));
  for (auto& v : values) v = rng.uniform(c.values);
  for (std::int64_t r = 0; r < c.records; ++r) {
    const std::int64_t p = s.record_starts[r];
    s.tokens[p] = static_cast<std::int32_t>(c.filler + perm[r]);
    s.tokens[p + 1] = static_cast<std::int32_t>(c.filler + c.keys + values[r]);
  }
  std::vector<std::int64_t> order(static_cast<std::size_t>(c.records));
  for (std::int64_t i = 0; i < c.records; ++i) order[i] = i;
  for (std::int64_t i = 0; i < c.queries; ++i) std::swap(order[i], order[i + rng.uniform(c.records - i)]);
  std::vector<std::int64_t> asked(order.begin(), order.begin() + c.queries);
  if (target >= 0) {
    auto it = std::find(asked.begin(), asked.end(), 0);
    if (it != asked.end()) {
      asked.erase(it);
      asked.push_back(0);
    } else {
      asked.back() = 0;
    }
  }
  std::int64_t at = C;
  for (std::size_t i = 0; i < asked.size(); ++i) {
    const std::int64_t r = asked[i];
    const auto answer = static_cast<std::int32_t>(c.filler + c.keys + values[r]);
    s.tokens[at] = static_cast<std::int32_t>(c.query_token());
    s.tokens[at + 1] = static_cast<std::int32_t>(c.filler + perm[r]);
    s.answer_positions.push_back(at + 1);
    s.answers.push_back(answer);
    if (i + 1 < asked.size()) s.tokens[at + 2] = answer;
    at += 3;
  }
  return s;
}

}  // namespace lab
