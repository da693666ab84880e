#pragma once
// The tools, opt-in (neither engine.hpp nor phasekv.hpp includes them): the microbenchmark
// (tools/bench.hpp: phasekv::bench::run of a layer kind or a model, what the phasekv-bench tool
// runs) timed against this machine's limits measured in the same run (tools/machine_limits.hpp:
// read bandwidth, fp32 FMA, bf16 and int8 dot-product peaks). It needs the engine alone. Each
// header also stands alone.
//
// Keep this list complete (scripts/test checks it): every include/phasekv/tools/*.hpp, sorted.

#include "phasekv/tools/bench.hpp"
#include "phasekv/tools/machine_limits.hpp"
