#pragma once
// What one conformance check (conformance.hpp) found: per property whether it held, and for the
// first that did not, a minimal counterexample (scenario.hpp) and the first difference it shows.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "phasekv/detail/enum_name.hpp"
#include "phasekv/testing/scenario.hpp"

namespace phasekv::testing {

// The properties, in the order a check runs them.
enum class property {
  streaming,       // streaming ≡ prefill under every chunking and micro-batch split, bit for bit
  round_trips,     // fork / copy / remove_suffix / keep / snapshot → restore change nothing later
  origin_padding,  // a staggered origin or padding shifts phases and nothing else
  entries,         // entries against the double-precision oracle
  reads,           // reads against double-precision attention over the selected entries
  dense_control,   // S = W = 1, mean pooling, no selection: causal attention
  storage,         // each storage's round trip within its documented error
};
inline constexpr property all_properties[] = {property::streaming,     property::round_trips, property::origin_padding,
                                              property::entries,       property::reads,       property::dense_control,
                                              property::storage};

inline const char* to_string(property p) noexcept {
  switch (p) {
    case property::streaming: return "streaming == prefill under every chunking and micro-batch split";
    case property::round_trips: return "fork / copy / remove_suffix / keep / snapshot -> restore round trips";
    case property::origin_padding: return "origin and padding invariance";
    case property::entries: return "entries against the double-precision oracle";
    case property::reads: return "reads against double-precision attention over the selected entries";
    case property::dense_control: return "the dense control (S = W = 1) against causal attention";
    case property::storage: return "storage round trip within its documented error";
  }
  return "unknown property";
}
// A short name, for test names and JSON.
inline const char* short_name(property p) noexcept {
  switch (p) {
    case property::streaming: return "streaming";
    case property::round_trips: return "round_trips";
    case property::origin_padding: return "origin_padding";
    case property::entries: return "entries";
    case property::reads: return "reads";
    case property::dense_control: return "dense_control";
    case property::storage: return "storage";
  }
  return "unknown";
}

enum class outcome { passed, failed, skipped, not_run };
inline const char* to_string(outcome o) noexcept {
  return phasekv::detail::enum_name(o, {"passed", "FAILED", "skipped", "not run"});
}

// What a property's cases exercised, so that a pass says what it covers: a selection that never
// dropped an entry, a raw window ring that never wrapped or a fork that never shared a page
// leaves that part of the layer unchecked by the property.
struct coverage {
  std::int64_t top_k = 0;                // the reader's (0: no selection)
  std::int64_t reads = 0;                // reads checked
  std::int64_t selecting_reads = 0;      // of them, reads whose selection left a visible entry out
  std::int64_t most_candidates = 0;      // the most entries one read could select from
  std::int64_t sequences = 0;            // sequences appended under the host's history, with a raw window
  std::int64_t wrapped_windows = 0;      // of them, sequences longer than their raw window ring
  std::int64_t forks = 0;                // forks of a sequence holding entries
  std::int64_t sharing_forks = 0;        // of them, forks that shared the parent's pages (no page taken)
  std::int64_t shared_page_writes = 0;   // entries written into a page a fork shared (copy on write)

  // Reads were checked with a selecting reader, and none of them dropped an entry.
  bool selection_unexercised() const noexcept { return top_k > 0 && reads > 0 && selecting_reads == 0; }

  std::string to_string() const {
    std::string out;
    auto add = [&](const std::string& s) { out += (out.empty() ? "" : "; ") + s; };
    if (reads > 0) {
      std::string r = std::to_string(reads) + (reads == 1 ? " read" : " reads");
      if (top_k > 0)
        r += ", " + std::to_string(selecting_reads) + " of them selecting top_k " + std::to_string(top_k) + " of up to " +
             std::to_string(most_candidates) + " candidates";
      add(r);
    }
    if (sequences > 0)
      add("raw window ring wrapped in " + std::to_string(wrapped_windows) + " of " + std::to_string(sequences) +
          (sequences == 1 ? " sequence" : " sequences"));
    if (forks > 0)
      add(std::to_string(forks) + (forks == 1 ? " fork, " : " forks, ") + std::to_string(sharing_forks) + " sharing pages, " +
          std::to_string(shared_page_writes) + " copy-on-write of a shared page");
    return out;
  }
};

struct property_result {
  testing::property property = property::streaming;
  testing::outcome outcome = outcome::not_run;
  std::int64_t cases = 0;  // cases run (the failing one included)
  std::string note;        // why it was skipped, or what it could not check
  coverage exercised;      // what its cases exercised (up to the failing one)
};

struct failure {
  testing::property property = property::streaming;
  std::string message;           // the first difference, in the counterexample
  scenario counterexample;       // shrunk
  scenario original;             // the generated case that failed first
  std::string original_message;  // its first difference
  std::uint64_t seed = 0;        // options::seed, and the case's index: a rerun with them fails again
  std::int64_t case_index = 0;
  std::int64_t shrink_runs = 0;  // candidates the shrinker ran
};

struct report {
  std::string configuration;  // the layer under test, in words
  std::vector<property_result> properties;
  std::optional<testing::failure> failure;

  bool passed() const noexcept { return !failure.has_value(); }
  // A property that passed with a selecting reader whose selection never dropped an entry: the
  // selection was not exercised (the property's note says what sizes would).
  bool selection_unexercised() const noexcept {
    for (const property_result& r : properties)
      if (r.outcome == outcome::passed && r.exercised.selection_unexercised()) return true;
    return false;
  }
  // The result of one property (outcome::not_run when the check stopped before it).
  property_result result(property p) const {
    for (const property_result& r : properties)
      if (r.property == p) return r;
    return {p, outcome::not_run, 0, "", {}};
  }

  std::string to_string() const {
    std::string out = std::string("phasekv conformance: ") + (passed() ? "passed" : "FAILED") + "\n  configuration: " +
                      configuration + "\n";
    for (const property_result& r : properties) {
      out += "  [" + std::string(testing::to_string(r.outcome)) + "] " + testing::to_string(r.property) + " (" +
             std::to_string(r.cases) + (r.cases == 1 ? " case" : " cases") + ")";
      if (!r.note.empty()) out += ": " + r.note;
      out += "\n";
      if (const std::string e = r.exercised.to_string(); !e.empty()) out += "      exercised: " + e + "\n";
    }
    if (failure) {
      const testing::failure& f = *failure;
      out += "  first failing property: " + std::string(testing::to_string(f.property)) + "\n";
      out += "  counterexample (shrunk from " + size_of(f.original).to_string() + " to " +
             size_of(f.counterexample).to_string() + " in " + std::to_string(f.shrink_runs) + " runs):\n    " +
             describe(f.counterexample) + "\n";
      out += "  first difference: " + f.message + "\n";
      out += "  reproduce: options.seed = " + std::to_string(f.seed) + ", case " + std::to_string(f.case_index) +
             " of the property\n";
    }
    return out;
  }
};

}  // namespace phasekv::testing
