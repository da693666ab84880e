// The smallest real use of phasekv's engine: its umbrella header compiles (on xsimd alone: the
// engine target gives no Eigen include path) and one call links and runs.
#include <phasekv/engine.hpp>

int main() {
  phasekv::geometry g{4, 8};  // DeepSeek-V4 CSA: stride 4, window 8
  g.validate();
  return g.branches() == 2 ? 0 : 1;
}
