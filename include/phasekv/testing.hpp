#pragma once
// Tools to test and measure a configuration of your own, opt-in (neither engine.hpp nor phasekv.hpp
// includes them): the conformance kit (testing/conformance.hpp: one call checks a layer against
// every property phasekv promises, with double-precision oracles and a shrinker) and the
// microbenchmark (testing/bench.hpp: phasekv::bench::run of a layer kind, what phasekv-bench runs, timed
// against this machine's roofline measured in the same run). Each header also stands alone.
//
// The adapters for test frameworks are not included here: testing/catch2.hpp (Catch2 2.x) and
// testing/gtest.hpp (GoogleTest) — include the one your tests use, after the framework.
//
// Keep this list complete (scripts/test checks it): every include/phasekv/testing/*.hpp but the
// two adapters, sorted.

#include "phasekv/testing/bench.hpp"
#include "phasekv/testing/conformance.hpp"
#include "phasekv/testing/machine_limits.hpp"
#include "phasekv/testing/model_subject.hpp"
#include "phasekv/testing/oracle.hpp"
#include "phasekv/testing/report.hpp"
#include "phasekv/testing/scenario.hpp"
#include "phasekv/testing/subject.hpp"
