#pragma once
// Moved to phasekv/models/deepseek_v4.hpp and phasekv/models/nsa.hpp (one file per model family:
// its compressor, cache and reader presets together). This path keeps working for one version and
// will then be removed: include the new ones.
#include "phasekv/models/deepseek_v4.hpp"
#include "phasekv/models/nsa.hpp"
