#pragma once
// The conformance kit (conformance.hpp) in a Catch2 2.x test: a report prints as its full text, and
// the matcher `conforms()` passes for a report whose every property held.
//
//   #include <catch2/catch.hpp>
//   #include <phasekv/testing/catch2.hpp>
//   TEST_CASE("my layer") { REQUIRE_THAT(phasekv::testing::check(layer), phasekv::testing::conforms()); }
//
// On failure Catch2 shows the report: the first failing property, the shrunk counterexample and
// its first difference. Include Catch2 first; this header needs nothing else of it.

#include <catch2/catch.hpp>

#include <string>

#include "phasekv/testing/report.hpp"

namespace Catch {
template <>
struct StringMaker<phasekv::testing::report> {
  static std::string convert(const phasekv::testing::report& r) { return "\n" + r.to_string(); }
};
}  // namespace Catch

namespace phasekv::testing {

class conformance_matcher : public Catch::MatcherBase<report> {
 public:
  bool match(const report& r) const override { return r.passed(); }
  std::string describe() const override { return "conforms (every property held)"; }
};

inline conformance_matcher conforms() { return {}; }

}  // namespace phasekv::testing
