#pragma once
// Everything phasekv offers, in one include: the engine (engine.hpp) and the diagnostics
// (diagnostics.hpp). Each header also stands alone; include just the ones you use if compile
// time matters.

#include "phasekv/diagnostics.hpp"
#include "phasekv/engine.hpp"
#include "phasekv/version.hpp"
