#pragma once
// The engine (engine.hpp) and the study (study.hpp) in one include. The conformance kit
// (testing.hpp) and the tools (tools.hpp) are opt-in. Each header also stands alone; include just
// the ones you use if compile time matters.

#include "phasekv/engine.hpp"
#include "phasekv/study.hpp"
#include "phasekv/version.hpp"
