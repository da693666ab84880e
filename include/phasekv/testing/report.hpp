#pragma once
// What one conformance check (conformance.hpp) found: per property whether it held, and for the
// first that did not, a minimal counterexample (scenario.hpp) and the first difference it shows.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
  switch (o) {
    case outcome::passed: return "passed";
    case outcome::failed: return "FAILED";
    case outcome::skipped: return "skipped";
    case outcome::not_run: return "not run";
  }
  return "unknown";
}

struct property_result {
  testing::property property = property::streaming;
  testing::outcome outcome = outcome::not_run;
  std::int64_t cases = 0;  // cases run (the failing one included)
  std::string note;        // why it was skipped, or what it could not check
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
  // The result of one property (outcome::not_run when the check stopped before it).
  property_result result(property p) const {
    for (const property_result& r : properties)
      if (r.property == p) return r;
    return {p, outcome::not_run, 0, ""};
  }

  std::string to_string() const {
    std::string out = std::string("phasekv conformance: ") + (passed() ? "passed" : "FAILED") + "\n  configuration: " +
                      configuration + "\n";
    for (const property_result& r : properties) {
      out += "  [" + std::string(testing::to_string(r.outcome)) + "] " + testing::to_string(r.property) + " (" +
             std::to_string(r.cases) + (r.cases == 1 ? " case" : " cases") + ")";
      if (!r.note.empty()) out += ": " + r.note;
      out += "\n";
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
