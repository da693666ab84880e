// The smallest real use of phasekv's engine: its umbrella header compiles (on xsimd alone:
// phasekv::phasekv gives no Eigen include path) and one call links and runs. Built by CMake
// (find_package, which passes PHASEKV_EXPECTED_VERSION) and by plain g++ with pkg-config's flags
// (scripts/test).
#include <phasekv/engine.hpp>
#include <phasekv/version.hpp>

#include <cstring>

int main() {
  phasekv::geometry g{4, 8};  // DeepSeek-V4 CSA: stride 4, window 8
  g.validate();
#ifdef PHASEKV_EXPECTED_VERSION
  if (std::strcmp(PHASEKV_VERSION_STRING, PHASEKV_EXPECTED_VERSION) != 0) return 2;
#endif
  static_assert(PHASEKV_VERSION == PHASEKV_VERSION_MAJOR * 10000 + PHASEKV_VERSION_MINOR * 100 + PHASEKV_VERSION_PATCH);
  return g.branches() == 2 ? 0 : 1;
}
