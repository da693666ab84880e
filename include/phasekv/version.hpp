#pragma once
// phasekv's version (semantic versioning; before 1.0 a minor release may change the API).
// CMakeLists.txt reads the numbers from here, so the package version and the macros agree.

#define PHASEKV_VERSION_MAJOR 0
#define PHASEKV_VERSION_MINOR 1
#define PHASEKV_VERSION_PATCH 0

// One comparable number, major · 10000 + minor · 100 + patch: #if PHASEKV_VERSION >= 100 …
#define PHASEKV_VERSION (PHASEKV_VERSION_MAJOR * 10000 + PHASEKV_VERSION_MINOR * 100 + PHASEKV_VERSION_PATCH)
#define PHASEKV_VERSION_STRING "0.1.0"
