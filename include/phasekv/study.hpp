#pragma once
// The study: per-phase measurement on top of the engine — the phase-sweep harness and its
// statistics (resampling, Firth logistic), interventions, the synthetic needle probe and the SVG
// plot. Each header also stands alone.
//
// Namespaces: the study's names are diagnostics, in phasekv::diag beside the engine's own (diag/:
// write profiles, read attribution, record layouts) — the statistics in phasekv::diag::stats, the
// SVG plot in phasekv::diag::plot, the needle probe in phasekv::diag::probe — with the internals in
// nested `detail` namespaces. The folder says the product: study/ needs Eigen, diag/ is the
// engine's and needs xsimd alone. The engine (engine.hpp) includes none of this.
//
// Keep this list complete (scripts/test checks it): every include/phasekv/study/*.hpp, sorted.

#include "phasekv/version.hpp"

// study
#include "phasekv/study/haystacks.hpp"
#include "phasekv/study/interventions.hpp"
#include "phasekv/study/logistic.hpp"
#include "phasekv/study/needle_probe.hpp"
#include "phasekv/study/phase_sweep.hpp"
#include "phasekv/study/resampling.hpp"
#include "phasekv/study/statistics.hpp"
#include "phasekv/study/svg_plot.hpp"
#include "phasekv/study/sweep_plan.hpp"
#include "phasekv/study/sweep_report.hpp"
#include "phasekv/study/sweep_result.hpp"
