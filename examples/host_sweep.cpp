// host_sweep: how an inference engine measures its own model by phase. The engine supplies one
// callable — "run one needle trial for this placement, did the model answer correctly?" — and
// phasekv plans where the needles go (every residue t mod 2S, matched position statistics, one
// fixed query position), runs the trials in a shuffled order and reports accuracy by residue,
// the gap, a homogeneity test and the dominant period.
//
//   host_sweep [--stride S] [--trials N] [--seed K]
//
// The "model" below is a stand-in whose accuracy depends on the needle's position mod 4 (and a
// seeded hash for luck), so the sweep has something to find. Replace toy_model with your engine.

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include <phasekv/study/phase_sweep.hpp>

#include "cli.hpp"

namespace {

// A stand-in for a host's model: retrieval succeeds with a probability that dips at the last
// phase of every 4-token chunk, like a chunked-compression model (docs/DESIGN.md §1).
class toy_model {
 public:
  explicit toy_model(std::uint64_t seed) : seed_(seed) {}

  // "Ask for the needle at `query_position`; is it found at `needle_position`?" A real engine
  // answers this by generating; here a seeded hash of the prompt decides.
  bool retrieves(std::int64_t needle_position, std::int64_t query_position, std::int64_t prompt_id) const {
    static const double accuracy_by_phase[4] = {0.90, 0.85, 0.80, 0.45};
    std::uint64_t state = seed_ ^ (static_cast<std::uint64_t>(needle_position) * 0x9E3779B97F4A7C15ull) ^
                          (static_cast<std::uint64_t>(query_position) << 20) ^ static_cast<std::uint64_t>(prompt_id);
    const double luck = static_cast<double>(phasekv::detail::splitmix64(state) >> 11) * 0x1.0p-53;
    return luck < accuracy_by_phase[needle_position % 4];
  }

 private:
  std::uint64_t seed_;
};

}  // namespace

int main(int argc, char** argv) {
  std::int64_t stride = 4, trials = 64;
  std::uint64_t seed = 1;
  cli::parser args("host_sweep", "A phase sweep of a stand-in model whose accuracy dips at the last phase of every\n"
                                 "4-token chunk: how a host measures its own model by phase.");
  // The sweep itself checks what depends on the prompt (e.g. 6·S must fit its 32000-token span).
  args.integer("--stride", "S", "compression stride; residues are t mod 2S", stride, 1, 4096);
  args.integer("--trials", "N", "trials per residue", trials, phasekv::diag::sweep_config::minimum_trials, 1 << 16);
  args.integer("--seed", "K", "seed of the model's luck and of the run order", seed, 0);
  args.parse(argc, argv);

  toy_model model(seed);

  phasekv::diag::sweep_config config;
  config.stride = stride;               // the model's compression stride S; residues are t mod 2S
  config.trials_per_residue = trials;
  config.query_position = 32767;        // the question goes at the end of a 32K-token prompt
  config.min_distance = 256;            // needles at least this far before the question
  config.span = 32000;                  // ... and at most min_distance + span
  config.seed = seed;                   // shuffles the run order only

  // One trial. A real host would:
  //   1. build a prompt of query_position + 1 tokens: filler (or distractor records) everywhere,
  //      the needle record ("the key for X is 4711") starting at token p.target_position, and the
  //      question ("what is the key for X?") ending at token p.query_position — pad the filler
  //      so the token positions are exact after tokenisation;
  //   2. vary the content with p.trial (needle key, filler text): trial i of every residue then
  //      shares its content and its anchor block — a paired comparison across residues;
  //   3. run prefill + decode with the chunked-compression KV cache;
  //   4. return whether the answer matches (bool), or the probability of the right answer
  //      (double in [0, 1]). Throwing marks the trial failed; it is counted, not scored.
  auto trial = [&](const phasekv::diag::placement& p) -> bool {
    return model.retrieves(p.target_position, p.query_position, p.trial);
  };

  try {
    const phasekv::diag::sweep_result result = phasekv::diag::run_sweep(config, trial);
    std::fputs(to_table(result).c_str(), stdout);
    // to_csv(result) (per residue), to_summary_csv(result) and to_json(result) give the same numbers as files.
    return 0;
  } catch (const phasekv::error& e) {  // a bad config: the message names the field
    std::fprintf(stderr, "host_sweep: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {  // e.g. std::bad_alloc for a huge plan: a message, not an abort
    std::fprintf(stderr, "host_sweep: %s\n", e.what());
    return 1;
  }
}
