#pragma once
// The diagnostics: per-phase measurement on top of the engine — write profiles and gate
// concentration, read attribution by phase, the phase-sweep harness and its statistics,
// interventions, the synthetic needle probe and the SVG plot. Each header also stands alone.
//
// Namespaces: all of it is in phasekv::diag — the statistics in phasekv::diag::stats, the SVG
// plot in phasekv::diag::plot, the needle probe in phasekv::diag::probe — with the internals in
// nested `detail` namespaces. The engine (engine.hpp) stays in phasekv and includes none of this.
//
// Keep this list complete (scripts/test checks it): every include/phasekv/diag/*.hpp, sorted.

#include "phasekv/version.hpp"

// diag
#include "phasekv/diag/interventions.hpp"
#include "phasekv/diag/logistic.hpp"
#include "phasekv/diag/needle_probe.hpp"
#include "phasekv/diag/phase_sweep.hpp"
#include "phasekv/diag/read_attribution.hpp"
#include "phasekv/diag/record_layout.hpp"
#include "phasekv/diag/resampling.hpp"
#include "phasekv/diag/statistics.hpp"
#include "phasekv/diag/svg_plot.hpp"
#include "phasekv/diag/write_profile.hpp"
