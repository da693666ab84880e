// libFuzzer target for the diagnostics a host feeds: entries a host builds from its
// own arrays (Python's Entries, an engine's compressor) given to diag::write_profile and
// diag::slot_weight_log. The input chooses the sinks' geometry and heads and a run of entries —
// index (small, near a power of two, at the type's edges, negative), the kv_heads and window the
// entry claims, weights (ordinary, zero, negative, NaN, ±inf, huge), a null weight pointer.
// Each entry's weights live in a heap buffer of exactly the size it claims, so a read past it is
// an ASan report. tests/fuzz/README.md says how to run it; scripts/fuzz --target diag.
//
// Checks, each a "phasekv fuzz: FAILED" and an abort when it does not hold:
//   (i)   each call throws input_error or returns — nothing else, no sanitizer report (no table
//         sized by a wrapped product, no write before a buffer);
//   (ii)  a refused entry leaves the sink exactly as it was (everything it reports: per-phase
//         weights, slot profiles, concentrations, which entries the log holds and their weights);
//   (iii) an accepted entry is in the log afterwards with the weights it was given (one head) or
//         their mean over heads (head = −1), and the profile counts one more window when the
//         entry has no padding and weights that sum above 0.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "harness.hpp"
#include "phasekv/diag/read_attribution.hpp"
#include "phasekv/diag/write_profile.hpp"

namespace {

using namespace phasekv;
using namespace phasekv::diag;
using i64 = std::int64_t;
using phasekv_fuzz::fail;

i64 pick_index(std::uint8_t how, std::uint8_t small) {
  switch (how % 6) {
    case 0:
    case 1: return small;  // the common case twice as often
    case 2: return (i64{1} << (small % 63)) - 1 + (how >> 7);
    case 3: return std::numeric_limits<i64>::max() - small;
    case 4: return -1 - static_cast<i64>(small);
    default: return (i64{1} << 48) - 1 - small;  // at the token limit
  }
}

float pick_weight(std::uint8_t b) {
  switch (b % 10) {
    case 0: return 0.0f;
    case 1: return -0.25f;
    case 2: return std::numeric_limits<float>::quiet_NaN();
    case 3: return std::numeric_limits<float>::infinity();
    case 4: return 3e38f;
    default: return static_cast<float>(b) / 255.0f;
  }
}

// Everything the sinks report, to compare before and after a refused call.
std::string report(const write_profile& p, i64 heads) {
  std::string out;
  for (i64 h = 0; h < heads; ++h) {
    for (const phase_weight& w : p.by_phase(h))
      out += std::to_string(w.phase) + ":" + std::to_string(w.tokens) + ":" + std::to_string(w.mean_weight) + ":" +
             std::to_string(w.stddev_weight) + ":" + std::to_string(w.coverage) + " ";
    for (double x : p.slot_profile(h)) out += std::to_string(x) + " ";
    for (double x : p.unpadded_slot_profile(h)) out += std::to_string(x) + " ";
    out += std::to_string(p.static_concentration(h)) + " " + std::to_string(p.window_concentration(h)) + " " +
           std::to_string(p.concentration_windows(h)) + "|";
  }
  return out;
}
std::string report(const slot_weight_log& log, const std::vector<i64>& indices) {
  std::string out = std::to_string(log.recorded()) + ":";
  for (i64 j : indices) {
    if (!log.has(j)) continue;
    out += std::to_string(j) + "=";
    for (float w : log.weights(j)) out += std::to_string(w) + ",";
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  phasekv_fuzz::input_bytes in{data, size};
  const i64 stride = 1 + in.byte() % 6;
  const i64 window = stride + in.byte() % (stride + 2);
  const i64 heads = 1 + in.byte() % 3;
  const i64 log_head = static_cast<i64>(in.byte() % (heads + 1)) - 1;  // −1: the mean over heads
  const geometry geom{stride, window, static_cast<i64>(in.byte()) % stride, anchor_mode::block_start};
  phasekv_fuzz::setup() = "S=" + std::to_string(stride) + " W=" + std::to_string(window) + " heads=" + std::to_string(heads) +
            " log_head=" + std::to_string(log_head) + " origin=" + std::to_string(geom.origin);

  write_profile profile(geom, heads);
  slot_weight_log log(window, log_head);
  std::vector<i64> indices;  // every index fed, to report what the log holds
  const int entries = 1 + in.byte() % 12;
  for (int n = 0; n < entries; ++n) {
    const std::uint8_t how = in.byte(), small = in.byte(), shape = in.byte();
    entry_view e;
    e.index = pick_index(how, small);
    e.kv_heads = (shape & 3) == 3 ? static_cast<i64>(shape >> 2) % 5 : heads;  // usually the truth
    e.window = (shape & 12) == 12 ? static_cast<i64>(shape >> 4) % (2 * window + 1) : window;
    const bool null_weights = (shape & 0xF0) == 0xF0;
    std::vector<float> weights(static_cast<std::size_t>(std::max<i64>(0, e.kv_heads) * std::max<i64>(0, e.window)));
    for (float& w : weights) w = pick_weight(in.byte());
    // An exact-size heap copy, so ASan sees a read one past it.
    std::vector<float> exact(weights);
    e.slot_weights = null_weights || exact.empty() ? nullptr : exact.data();
    indices.push_back(e.index);
    phasekv_fuzz::setup() += " [" + std::to_string(e.index) + " h" + std::to_string(e.kv_heads) + " w" + std::to_string(e.window) +
               (null_weights ? " null" : "") + "]";

    // An index the sinks accept but whose tables would not fit in memory (both keep one row per
    // entry or token up to the highest index seen) is the allocator's matter, not validation's:
    // not fed. Indices past the token limit and negative ones are.
    if (e.index >= (i64{1} << 12) && e.index < (i64{1} << 48)) continue;
    const std::string profile_before = report(profile, heads), log_before = report(log, indices);
    const i64 windows_before = profile.concentration_windows(0);
    bool profile_ok = true, log_ok = true;
    try {
      profile(e);
    } catch (const input_error&) {
      profile_ok = false;
    } catch (const std::exception& x) {
      fail(std::string("write_profile threw something other than input_error: ") + x.what());
    }
    try {
      log(e);
    } catch (const input_error&) {
      log_ok = false;
    } catch (const std::exception& x) {
      fail(std::string("slot_weight_log threw something other than input_error: ") + x.what());
    }
    if (!profile_ok && report(profile, heads) != profile_before) fail("a refused entry changed the write profile");
    if (!log_ok && report(log, indices) != log_before) fail("a refused entry changed the slot-weight log");
    // A window without padding whose weights sum above 0 counts once in head 0's concentration.
    double head0 = 0.0;
    for (i64 i = 0; profile_ok && i < window; ++i) head0 += weights[static_cast<std::size_t>(i)];
    const i64 counted = profile_ok && geom.first_real_slot(e.index) == 0 && head0 > 0.0 ? 1 : 0;
    if (profile_ok && profile.concentration_windows(0) != windows_before + counted)
      fail("head 0 counts " + std::to_string(profile.concentration_windows(0) - windows_before) +
           " windows for an accepted entry, expected " + std::to_string(counted));
    if (log_ok) {
      if (!log.has(e.index)) fail("an accepted entry is not in the log");
      const span<const float> got = log.weights(e.index);
      if (static_cast<i64>(got.size()) != window) fail("the log holds a window of another size");
      for (i64 i = 0; i < window; ++i) {
        float want = 0.0f;
        if (log_head >= 0) {
          want = weights[static_cast<std::size_t>(log_head * window + i)];
        } else {
          double sum = 0.0;
          for (i64 h = 0; h < e.kv_heads; ++h) sum += weights[static_cast<std::size_t>(h * window + i)];
          want = static_cast<float>(sum / static_cast<double>(e.kv_heads));
        }
        if (std::fabs(got[static_cast<std::size_t>(i)] - want) > 1e-6f * std::max(1.0f, std::fabs(want)))
          fail("the log holds weight " + std::to_string(got[static_cast<std::size_t>(i)]) + " for slot " +
               std::to_string(i) + ", given " + std::to_string(want));
      }
    }
  }
  return 0;
}
