#pragma once
// The conformance kit, opt-in (neither engine.hpp nor phasekv.hpp includes it): one call checks a
// layer or a model of your own configuration against every property phasekv promises, with
// double-precision oracles (testing/oracle.hpp) and a shrinker that reports a minimal
// counterexample (testing/conformance.hpp). It needs the engine alone. Each header also stands
// alone.
//
// The adapters for test frameworks are not included here: testing/catch2.hpp (Catch2 2.x) and
// testing/gtest.hpp (GoogleTest) — include the one your tests use, after the framework.
//
// Keep this list complete (scripts/test checks it): every include/phasekv/testing/*.hpp but the
// two adapters, sorted.

#include "phasekv/testing/conformance.hpp"
#include "phasekv/testing/model_subject.hpp"
#include "phasekv/testing/oracle.hpp"
#include "phasekv/testing/report.hpp"
#include "phasekv/testing/scenario.hpp"
#include "phasekv/testing/subject.hpp"
