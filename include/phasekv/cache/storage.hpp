#pragma once
// Moved to phasekv/format/storage.hpp (the number formats have a folder of their own). This path
// keeps working for one version and will then be removed: include the new one.
#include "phasekv/format/storage.hpp"
