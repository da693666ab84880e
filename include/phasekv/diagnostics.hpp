#pragma once
// The diagnostics: per-phase measurement on top of the engine — write profiles and gate
// concentration, read attribution by phase, the phase-sweep harness and its statistics,
// interventions, the synthetic needle probe and the SVG plot. Each header also stands alone.
//
// Keep this list complete (scripts/test checks it): every include/phasekv/diag/*.hpp, sorted.

#include "phasekv/version.hpp"

// diag
#include "phasekv/diag/interventions.hpp"
#include "phasekv/diag/needle_probe.hpp"
#include "phasekv/diag/phase_sweep.hpp"
#include "phasekv/diag/read_attribution.hpp"
#include "phasekv/diag/statistics.hpp"
#include "phasekv/diag/svg_plot.hpp"
#include "phasekv/diag/write_profile.hpp"
