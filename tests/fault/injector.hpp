#pragma once
// The allocation-failure injector of phasekv_fault_tests — tests/fault/test_fault_injection.cpp
// replaces the global operator new with one that can be told to fail — and the loop every fault
// test runs: a call made with the n-th allocation failing, once or from then on, for n = 1, 2, …
// until the call makes fewer than n allocations.

#include <catch2/catch.hpp>

#include <cstddef>
#include <new>
#include <string>

#include "oracle/cache_dump.hpp"
#include "phasekv/core/error.hpp"

namespace fault {

// The n-th allocation from now fails; with keep_failing every later one too.
void arm(long n, bool keep_failing);
// Counts without failing: largest_since() then says how large the largest allocation was.
void arm_tracking();
std::size_t largest_since();
// Stops failing; true when an allocation failed since arm().
bool disarm();

// What a call did with allocation n failing.
struct outcome {
  bool fired = false;  // an allocation failed
  bool threw = false;  // the call threw std::bad_alloc or capacity_error
  std::string what;    // and what it said
};

template <class Call>
outcome failing(long n, bool keep_failing, Call&& call) {
  outcome o;
  arm(n, keep_failing);
  try {
    call();
  } catch (const std::bad_alloc&) {
    o.threw = true;
    o.what = "std::bad_alloc";
  } catch (const phasekv::capacity_error& e) {
    o.threw = true;
    o.what = e.what();
  }
  o.fired = disarm();
  return o;
}

// The strong guarantee of op on a World (made from `args`; w.dump() a cache_dump of all it holds)
// for n = 1, 2, …: with allocation n failing (once, or from then on) op throws std::bad_alloc or
// capacity_error and leaves the dump as it was — or absorbs the failure and does its whole job —
// and then, with memory back, gives exactly what it gives in a world that never saw a failure.
// Returns how many failures were injected.
template <class World, class Op, class... Args>
long check_strong_guarantee(const std::string& name, const Op& op, bool keep_failing, const Args&... args) {
  World reference(args...);
  op(reference);
  const phasekv_test::cache_dump expected = reference.dump();
  long failures = 0;
  for (long n = 1;; ++n) {
    World w(args...);
    const phasekv_test::cache_dump before = w.dump();
    const outcome o = failing(n, keep_failing, [&] { op(w); });
    INFO(name << ": allocation " << n << (keep_failing ? " and every later one" : "") << " failed; threw " << o.what);
    if (!o.fired) {
      REQUIRE_FALSE(o.threw);
      REQUIRE(phasekv_test::first_difference(w.dump(), expected) == "");
      return failures;
    }
    ++failures;
    if (!o.threw) {  // absorbed (none of phasekv's calls does today): the whole job is done
      REQUIRE(phasekv_test::first_difference(w.dump(), expected) == "");
      continue;
    }
    REQUIRE(phasekv_test::first_difference(w.dump(), before) == "");
    op(w);  // the same call with memory back
    REQUIRE(phasekv_test::first_difference(w.dump(), expected) == "");
  }
}

}  // namespace fault
