#pragma once
// A conformance case (conformance.hpp) as data, and the shrinker that makes a failing one small.
//
// A scenario is what a host does to a cache: one or more sequences, each appended as a list of
// chunks (each chunk's payload and logits as fp32 or as bf16 bits), the sequences together through
// append_batch when there are several; operations on the sequence between its chunks (fork, copy,
// remove_suffix, keep, snapshot → restore), each writing `junk` tokens somewhere they must not
// show; tokens of padding before the sequence; positions to read at. A property runs it and
// either passes or names the first difference it saw.
//
// Shrinking. From a failing scenario the shrinker tries smaller ones — fewer sequences, steps and
// read positions, less junk and padding, shorter sequences, fewer chunks (neighbours merged),
// fp32 instead of bf16 chunks — and keeps the first that still fails, until none does or its
// budget of runs is spent. Every candidate is no larger than the scenario it came from in every
// measure of scenario_size and smaller in one, so the result is never larger than the failing case
// it started from (tests/test_testing_kit.cpp checks it).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace phasekv::testing {

// What a round trip does at a chunk boundary (conformance.hpp, property "round trips"). Each
// writes `junk` tokens somewhere the sequence under test must not see them.
enum class operation {
  fork_write_fork,         // f = fork(s); junk appended to f; s continues
  fork_follow_fork,        // f = fork(s); junk appended to s; f continues in its place
  copy_over,               // d = create() with junk; copy(s, d); junk appended to s; d continues
  rollback,                // junk appended to s, then remove_suffix(s, back to where it was)
  keep_only,               // other sequences made (with junk), then keep(s)
  snapshot_other_cache,    // restore(snapshot(s)) into a second cache; junk to s; the restored one continues
  snapshot_same_cache,     // the same, restored into the same cache
};

inline const char* to_string(operation op) noexcept {
  switch (op) {
    case operation::fork_write_fork: return "fork, then write the fork";
    case operation::fork_follow_fork: return "fork, then write the parent and continue on the fork";
    case operation::copy_over: return "copy onto another sequence, then write the source";
    case operation::rollback: return "write, then remove_suffix back";
    case operation::keep_only: return "keep, dropping other sequences";
    case operation::snapshot_other_cache: return "snapshot, restore into another cache";
    case operation::snapshot_same_cache: return "snapshot, restore into the same cache";
  }
  return "unknown operation";
}
inline constexpr operation all_operations[] = {operation::fork_write_fork,      operation::fork_follow_fork,
                                               operation::copy_over,            operation::rollback,
                                               operation::keep_only,            operation::snapshot_other_cache,
                                               operation::snapshot_same_cache};

struct step {
  operation op = operation::fork_write_fork;
  std::int64_t at = 0;    // after `at` tokens of the sequence
  std::int64_t junk = 1;  // tokens written where they must not show
};

// Bits of a chunk's form: which of its inputs go over as bf16 bits.
inline constexpr std::uint8_t payload_bf16 = 1, logits_bf16 = 2;

struct scenario {
  std::vector<std::vector<std::int64_t>> chunks;  // per sequence, its chunk sizes in order
  std::vector<std::vector<std::uint8_t>> forms;   // per sequence and chunk (payload_bf16 | logits_bf16)
  std::vector<step> steps;                        // operations on sequence 0, by position
  std::int64_t pad = 0;                           // tokens before the sequence (origin and padding)
  std::vector<std::int64_t> reads;                // positions read at (oracle properties)
  // Per sequence, where its tokens come from (empty: sequence b's own, b): dropping a sequence
  // while shrinking leaves the others' tokens as they were.
  std::vector<int> tracks;

  int track(std::size_t b) const { return tracks.empty() ? static_cast<int>(b) : tracks[b]; }
  std::int64_t tokens(std::size_t b = 0) const {
    std::int64_t n = 0;
    for (std::int64_t c : chunks[b]) n += c;
    return n;
  }
};

struct scenario_size {
  std::int64_t sequences = 0, tokens = 0, chunks = 0, operations = 0, junk = 0, pad = 0, bf16_chunks = 0, reads = 0;
  std::int64_t positions = 0;  // the operations' positions, summed: an earlier operation is a smaller case

  std::int64_t total() const noexcept {
    return sequences + tokens + chunks + operations + junk + pad + bf16_chunks + reads + positions;
  }
  // Every measure at most the other's.
  bool no_larger_than(const scenario_size& o) const noexcept {
    return sequences <= o.sequences && tokens <= o.tokens && chunks <= o.chunks && operations <= o.operations &&
           junk <= o.junk && pad <= o.pad && bf16_chunks <= o.bf16_chunks && reads <= o.reads && positions <= o.positions;
  }
  bool smaller_than(const scenario_size& o) const noexcept { return no_larger_than(o) && total() < o.total(); }
  std::string to_string() const {
    std::string s = std::to_string(tokens) + " tokens in " + std::to_string(chunks) + " chunks";
    if (sequences > 1) s += ", " + std::to_string(sequences) + " sequences";
    if (operations > 0) s += ", " + std::to_string(operations) + " operations (" + std::to_string(junk) + " junk tokens)";
    if (pad > 0) s += ", " + std::to_string(pad) + " tokens of padding";
    if (bf16_chunks > 0) s += ", " + std::to_string(bf16_chunks) + " chunks in bf16";
    if (reads > 0) s += ", " + std::to_string(reads) + " reads";
    return s;
  }
};

inline scenario_size size_of(const scenario& s) {
  scenario_size z;
  z.sequences = static_cast<std::int64_t>(s.chunks.size());
  for (std::size_t b = 0; b < s.chunks.size(); ++b) {
    z.tokens += s.tokens(b);
    z.chunks += static_cast<std::int64_t>(s.chunks[b].size());
    for (std::uint8_t f : s.forms[b]) z.bf16_chunks += f != 0 ? 1 : 0;
  }
  z.operations = static_cast<std::int64_t>(s.steps.size());
  for (const step& st : s.steps) {
    z.junk += st.junk;
    z.positions += st.at;
  }
  z.pad = s.pad;
  z.reads = static_cast<std::int64_t>(s.reads.size());
  return z;
}

// A scenario in words, e.g. "sequence 0: 13 tokens in chunks [4, 1, 8 (bf16 payload)]; after 5
// tokens: fork, then write the fork (2 junk tokens)".
inline std::string describe(const scenario& s) {
  std::string out;
  for (std::size_t b = 0; b < s.chunks.size(); ++b) {
    if (b) out += "; ";
    out += (s.chunks.size() > 1 ? "sequence " + std::to_string(s.track(b)) + ": " : std::string()) +
           std::to_string(s.tokens(b)) + " tokens in chunks [";
    for (std::size_t k = 0; k < s.chunks[b].size(); ++k) {
      out += (k ? ", " : "") + std::to_string(s.chunks[b][k]);
      const std::uint8_t f = s.forms[b][k];
      if (f) out += std::string(" (bf16 ") + (f == (payload_bf16 | logits_bf16) ? "payload+logits" : f == payload_bf16 ? "payload" : "logits") + ")";
    }
    out += "]";
  }
  if (s.chunks.size() > 1) out += "; appended together by append_batch, chunk k of every sequence in step k";
  for (const step& st : s.steps)
    out += "; after " + std::to_string(st.at) + " tokens: " + to_string(st.op) + " (" + std::to_string(st.junk) +
           " junk token" + (st.junk == 1 ? "" : "s") + ")";
  if (s.pad > 0) out += "; behind " + std::to_string(s.pad) + " tokens of padding";
  if (!s.reads.empty()) {
    out += "; read at";
    for (std::size_t k = 0; k < s.reads.size(); ++k) out += (k ? ", " : " ") + std::to_string(s.reads[k]);
  }
  return out;
}

namespace scenario_detail {

// Sequence b cut to its first n tokens (chunks cut, forms kept); steps and reads beyond dropped.
inline scenario truncated(const scenario& s, std::size_t b, std::int64_t n) {
  scenario t = s;
  std::vector<std::int64_t> chunks;
  std::vector<std::uint8_t> forms;
  std::int64_t done = 0;
  for (std::size_t k = 0; k < s.chunks[b].size() && done < n; ++k) {
    const std::int64_t c = std::min(s.chunks[b][k], n - done);
    chunks.push_back(c);
    forms.push_back(s.forms[b][k]);
    done += c;
  }
  t.chunks[b] = chunks;
  t.forms[b] = forms;
  if (b == 0) {
    t.steps.erase(std::remove_if(t.steps.begin(), t.steps.end(), [&](const step& st) { return st.at > n; }), t.steps.end());
    std::vector<std::int64_t> reads;
    for (std::int64_t r : t.reads)
      if (r < n) reads.push_back(r);
    if (reads.empty() && !t.reads.empty() && n > 0) reads.push_back(n - 1);
    t.reads = reads;
  }
  return t;
}

}  // namespace scenario_detail

// Smaller scenarios to try, the boldest first. `min_tokens` keeps sequences at least that long.
inline std::vector<scenario> shrink_candidates(const scenario& s, std::int64_t min_tokens = 1) {
  std::vector<scenario> out;
  for (std::size_t b = s.chunks.size(); b-- > 0 && s.chunks.size() > 1;) {  // drop a sequence
    scenario t = s;
    t.tracks.clear();
    for (std::size_t k = 0; k < s.chunks.size(); ++k) t.tracks.push_back(s.track(k));
    t.chunks.erase(t.chunks.begin() + static_cast<std::ptrdiff_t>(b));
    t.forms.erase(t.forms.begin() + static_cast<std::ptrdiff_t>(b));
    t.tracks.erase(t.tracks.begin() + static_cast<std::ptrdiff_t>(b));
    out.push_back(std::move(t));
  }
  for (std::size_t k = 0; k < s.steps.size(); ++k) {  // drop an operation
    scenario t = s;
    t.steps.erase(t.steps.begin() + static_cast<std::ptrdiff_t>(k));
    out.push_back(std::move(t));
  }
  if (s.pad > 0)
    for (std::int64_t p : {std::int64_t{0}, s.pad / 2, s.pad - 1}) {
      scenario t = s;
      t.pad = p;
      out.push_back(std::move(t));
    }
  for (std::size_t k = 0; k < s.reads.size() && s.reads.size() > 1; ++k) {  // keep one read position
    scenario t = s;
    t.reads = {s.reads[k]};
    out.push_back(std::move(t));
  }
  for (std::size_t b = 0; b < s.chunks.size(); ++b) {  // shorter sequences
    const std::int64_t n = s.tokens(b);
    std::vector<std::int64_t> lengths = {min_tokens, n / 2, (3 * n) / 4, n - 8, n - 4, n - 2, n - 1};
    if (b == 0 && !s.reads.empty()) lengths.push_back(*std::max_element(s.reads.begin(), s.reads.end()) + 1);
    std::sort(lengths.begin(), lengths.end());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    for (std::int64_t m : lengths)
      if (m >= min_tokens && m < n) out.push_back(scenario_detail::truncated(s, b, m));
  }
  for (std::size_t k = 0; k < s.steps.size(); ++k)  // an operation earlier
    for (std::int64_t at : {std::int64_t{0}, s.steps[k].at / 2, s.steps[k].at - 1})
      if (at >= 0 && at < s.steps[k].at) {
        scenario t = s;
        t.steps[k].at = at;
        std::stable_sort(t.steps.begin(), t.steps.end(), [](const step& a, const step& b) { return a.at < b.at; });
        out.push_back(std::move(t));
      }
  for (std::size_t k = 0; k < s.steps.size(); ++k)  // less junk
    for (std::int64_t j : {std::int64_t{1}, s.steps[k].junk / 2, s.steps[k].junk - 1})
      if (j >= 1 && j < s.steps[k].junk) {
        scenario t = s;
        t.steps[k].junk = j;
        out.push_back(std::move(t));
      }
  for (std::size_t b = 0; b < s.chunks.size(); ++b) {
    if (s.chunks[b].size() > 1) {  // all of a sequence in one chunk, then neighbours merged
      scenario t = s;
      t.chunks[b] = {s.tokens(b)};
      t.forms[b] = {s.forms[b][0]};
      out.push_back(std::move(t));
    }
    for (std::size_t k = 0; k + 1 < s.chunks[b].size(); ++k) {
      scenario t = s;
      t.chunks[b][k] += t.chunks[b][k + 1];
      t.chunks[b].erase(t.chunks[b].begin() + static_cast<std::ptrdiff_t>(k + 1));
      t.forms[b].erase(t.forms[b].begin() + static_cast<std::ptrdiff_t>(k + 1));
      out.push_back(std::move(t));
    }
    for (std::size_t k = 0; k < s.chunks[b].size(); ++k)  // a shorter chunk (the tokens after it move up)
      for (std::int64_t c : {s.chunks[b][k] / 2, s.chunks[b][k] - 1})
        if (c >= 1 && c < s.chunks[b][k]) {
          scenario t = s;
          t.chunks[b][k] = c;
          out.push_back(scenario_detail::truncated(t, b, t.tokens(b)));
        }
    for (std::size_t k = 0; k < s.forms[b].size(); ++k)  // fp32 instead of bf16
      if (s.forms[b][k] != 0) {
        scenario t = s;
        t.forms[b][k] = 0;
        out.push_back(std::move(t));
      }
  }
  // Only strictly smaller candidates (a merge of an empty sequence, say, changes nothing).
  const scenario_size size = size_of(s);
  out.erase(std::remove_if(out.begin(), out.end(), [&](const scenario& t) { return !size_of(t).smaller_than(size); }),
            out.end());
  return out;
}

// The shrinker's result: the smallest failing scenario it found and what it failed with.
struct shrunk {
  scenario smallest;
  std::string failure;
  std::int64_t runs = 0;  // candidates run
};

// Greedy shrinking: from a scenario that fails (with `failure`), repeatedly moves to the first
// candidate that still fails. `run` returns the failure of a scenario, or nullopt when it passes.
inline shrunk shrink(scenario failing, std::string failure,
                     const std::function<std::optional<std::string>(const scenario&)>& run, std::int64_t budget,
                     std::int64_t min_tokens = 1) {
  shrunk r{std::move(failing), std::move(failure), 0};
  bool moved = true;
  while (moved && r.runs < budget) {
    moved = false;
    for (scenario& candidate : shrink_candidates(r.smallest, min_tokens)) {
      if (r.runs >= budget) break;
      ++r.runs;
      if (std::optional<std::string> f = run(candidate)) {
        r.smallest = std::move(candidate);
        r.failure = std::move(*f);
        moved = true;
        break;
      }
    }
  }
  return r;
}

}  // namespace phasekv::testing
