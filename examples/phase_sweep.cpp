// phase_sweep: the study's needle test in miniature. For each configuration (a pooling policy at a
// stride S, plus a full-attention control) it places a needle record at every residue
// t mod 2S of a long context with matched position statistics (plan_sweep), asks for it from the
// last position, and reports accuracy by residue: the table with gap, homogeneity p-value and
// dominant period, CSV and JSON per configuration, and one SVG plot of accuracy against residue.
//
//   phase_sweep [--tokens N] [--records N] [--channels C] [--stride S[,S…]] [--window W|double]
//               [--policy mean|gates|rope|dsv4|fixed|ape|control[,…]] [--slot-profile P,P,…]
//               [--key-tokens K] [--value-tokens V] [--gap G] [--isolate] [--top-k K] [--attribute]
//               [--trials N] [--seed K] [--layout any|contained|straddle] [--out DIR]
//               [--plot-width PX] [--plot-height PX] [--quiet]
//
// Defaults (close to the study's 128K-token, 16,000-record needle test): --tokens 131072
// --records 16000 (that density, 16000 per 131072 tokens, for another --tokens) --channels 512
// (embedding size: retrieval through a W-token mean needs about √(C/W) ≫ √(2 ln n); at 128K,
// 128 channels leave S = 8 near chance, 512 show its weak phase clearly) --stride 2,4,8
// --window = stride --policy mean,control --trials 64 --seed 1 --out phase_sweep_out.
// --stride and --policy take comma lists and may repeat; every non-control policy runs at every
// stride ("dsv4" only at its own S=4, W=8), "control" adds one full-attention run. "fixed" pools
// with the static per-slot weights of --slot-profile (W of them; default uniform), "ape" with
// scalar gates whose per-slot biases are --slot-profile (default N(0, 1) per slot from the seed).
// The record is --key-tokens key tokens, --gap filler, --value-tokens value tokens (1, 0, 1).
// --isolate keeps other records out of the targets' entries (the control for crowding); --top-k
// reads only the entries the key stream selects; --attribute explains every failed trial
// (selection miss, read or write dilution, readout: the table's and CSV's failure columns).
// --quiet drops the progress line. Bad options exit with status 2 and say which option was wrong.
//
// Outputs in DIR, per configuration (name e.g. mean_S4_W4, control): <name>.csv (one row per
// residue), <name>.summary.csv (key,value: gap, p-value, period, the probe's settings) and
// <name>.json (all of it); and phase_sweep.svg (plot::phase_sweep_figure, --plot-width ×
// --plot-height pixels). The plot's x axis is (residue + 1) / S, the target's place within two
// chunks in strides: chunk boundaries at 0, 1 and 2 (drawn as lines), and every stride's boundary
// phase S − 1 on 1 and 2, so strides 2, 4 and 8 share one axis and line up at the boundary; the
// control uses the largest stride. Filled markers are records within one chunk, open ones records
// across a boundary (not joined by the line); the legend states each configuration's accuracy
// within and across, its gap and p-value. For a PNG: rsvg-convert phase_sweep.svg > phase_sweep.png
// (Debian's librsvg2-bin), or any browser.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <phasekv/study/needle_probe.hpp>
#include <phasekv/study/svg_plot.hpp>
#include <phasekv/phasekv.hpp>

#include "cli.hpp"

namespace {

using phasekv::diag::probe::needle_policy;

struct options {
  std::int64_t tokens = 131072;
  std::int64_t records = 0;                  // 0 → the study's density (a quarter of the tokens)
  std::int64_t channels = 512;               // embedding size: S = 8 needs about 512 at 128K
  std::vector<std::int64_t> strides;         // empty → {2, 4, 8}
  std::int64_t window = 0;                   // 0 → stride; −1 → 2·stride
  std::vector<std::string> policies;         // empty → {mean, control}
  std::int64_t trials = 64;
  std::uint64_t seed = 1;
  std::string out = "phase_sweep_out";
  phasekv::diag::layout_mode layout = phasekv::diag::layout_mode::any;
  phasekv::diag::record_shape record;
  std::vector<float> slot_profile;           // fixed and ape only
  bool isolate = false, attribute = false;
  std::int64_t top_k = 0;
  bool quiet = false;
  std::int64_t plot_width = 1100, plot_height = 640;
};

const std::vector<std::pair<std::string, needle_policy>> policy_names = {
    {"mean", needle_policy::mean_pool},
    {"gates", needle_policy::concentrated_gates},
    {"rope", needle_policy::rope_after_pool},
    {"dsv4", needle_policy::deepseek_v4_csa},
    {"fixed", needle_policy::fixed_weight},
    {"ape", needle_policy::positional_gates},
    {"control", needle_policy::full_attention}};

needle_policy policy_of(const std::string& name) {
  for (const auto& [known, policy] : policy_names)
    if (name == known || name == phasekv::diag::probe::to_string(policy)) return policy;
  throw cli::bad_value("must be one of mean, gates, rope, dsv4, fixed, ape, control (or the library's names: "
                       "mean_pool, concentrated_gates, …)");
}

// The short name of a policy given by either name (the probe of python -m phasekv takes both).
std::string short_name(const std::string& name) {
  const needle_policy policy = policy_of(name);
  for (const auto& [known, p] : policy_names)
    if (p == policy) return known;
  return name;
}

options parse(int argc, char** argv) {
  options o;
  cli::parser args("phase_sweep",
                   "The needle test by residue t mod 2S for each pooling policy and stride: a table per\n"
                   "configuration, <name>.csv, .summary.csv and .json, and phase_sweep.svg in --out.");
  args.integer("--tokens", "N", "context length; the query is at N - 1", o.tokens, 64);
  args.option("--records", "N", "key-value records in the context, at least 1",
              "a quarter of the tokens (16000 two-token records per 131072)",
              [&o](const std::string& text) { o.records = cli::integer(text, std::int64_t{1}); });
  args.integer("--channels", "C", "embedding size of the synthetic tokens", o.channels, 2);
  args.option("--stride", "S[,S...]", "strides to sweep, each at least 1; may repeat", "2,4,8",
              [&o](const std::string& text) {
                cli::each_item(text,
                               [&o](const std::string& s) { o.strides.push_back(cli::integer(s, std::int64_t{1})); });
              });
  args.option("--window", "W|double", "pooling window: at least 1, or double for 2S", "the stride",
              [&o](const std::string& text) {
                o.window = text == "double" ? -1 : cli::integer(text, std::int64_t{1});
              });
  args.option("--policy", "P[,P...]", "mean, gates, rope, dsv4 (S=4, W=8), fixed, ape or control; may repeat",
              "mean,control",
              [&o](const std::string& text) {
                cli::each_item(text, [&o](const std::string& p) {
                  o.policies.push_back(short_name(p));  // validates the name
                });
              });
  args.option("--slot-profile", "P[,P...]", "fixed: the W slot weights; ape: the W slot biases",
              "uniform; N(0, 1) per slot", [&o](const std::string& text) {
                cli::each_item(text, [&o](const std::string& item) {
                  char* end = nullptr;
                  const float value = std::strtof(item.c_str(), &end);
                  if (item.empty() || end != item.c_str() + item.size() || !std::isfinite(value))
                    throw cli::bad_value("is not a finite number");
                  o.slot_profile.push_back(value);
                });
              });
  args.integer("--key-tokens", "K", "key tokens of each record", o.record.key_tokens, 1, 4096);
  args.integer("--value-tokens", "V", "value tokens of each record", o.record.value_tokens, 1, 4096);
  args.integer("--gap", "G", "filler tokens between a record's key and its value", o.record.gap, 0, 4096);
  args.flag("--isolate", "keep the other records out of the targets' entries (the control for crowding)", o.isolate);
  args.integer("--top-k", "K", "entries the key stream selects for each read; 0 reads every entry", o.top_k, 0);
  args.flag("--attribute", "explain each failed trial: selection miss, read or write dilution, readout", o.attribute);
  args.integer("--trials", "N", "trials per residue", o.trials, phasekv::diag::sweep_config::minimum_trials);
  args.integer("--seed", "K", "seed of the contexts and of the run order", o.seed, 0);
  args.choice("--layout",
              "residues to plan: all, those whose record fits in one block (the within-window test), or those "
              "whose record crosses a block boundary",
              o.layout,
              {{"any", phasekv::diag::layout_mode::any},
               {"contained", phasekv::diag::layout_mode::contained},
               {"straddle", phasekv::diag::layout_mode::straddle}});
  args.option("--out", "DIR", "output folder", o.out, [&o](const std::string& text) { o.out = text; });
  args.integer("--plot-width", "PX", "width of phase_sweep.svg in pixels", o.plot_width, 400, 10000);
  args.integer("--plot-height", "PX", "height of phase_sweep.svg in pixels", o.plot_height, 250, 10000);
  args.flag("--quiet", "no progress line on stderr", o.quiet);
  args.parse(argc, argv);
  if (o.strides.empty()) o.strides = {2, 4, 8};
  // The study's density: 16000 two-token records per 131072 tokens, a quarter of the tokens.
  if (o.records == 0) o.records = std::max<std::int64_t>(1, o.tokens * 16000 / 131072 * 2 / o.record.length());
  if (o.policies.empty()) o.policies = {"mean", "control"};
  return o;
}

// One row of the job: what to sweep and how to name it.
struct job {
  std::string name;     // file stem
  std::string label;    // legend
  phasekv::diag::probe::needle_config probe;
  phasekv::diag::sweep_config sweep;
};

std::vector<job> plan_jobs(const options& o) {
  std::vector<job> jobs;
  const std::int64_t largest = *std::max_element(o.strides.begin(), o.strides.end());
  for (const std::string& policy : o.policies) {
    const bool control = policy == "control", preset = policy == "dsv4";
    // The control has no chunks: sweep it on the largest stride's residues so it shares the axis.
    // The DeepSeek-V4 preset has its own geometry (S=4, W=8) whatever --stride/--window say.
    const std::vector<std::int64_t> strides = control ? std::vector<std::int64_t>{largest}
                                              : preset ? std::vector<std::int64_t>{4}
                                                       : o.strides;
    for (std::int64_t stride : strides) {
      job j;
      j.probe.tokens = o.tokens;
      j.probe.records = o.records;
      j.probe.channels = o.channels;
      j.probe.policy = policy_of(policy);
      j.probe.stride = stride;
      j.probe.window = o.window == 0 ? stride : o.window < 0 ? 2 * stride : o.window;
      j.probe.seed = o.seed;
      j.probe.record = o.record;
      j.probe.isolate_targets = o.isolate;
      j.probe.top_k = o.top_k;
      if (j.probe.takes_slot_profile()) j.probe.slot_profile = o.slot_profile;
      if (!o.slot_profile.empty() && !j.probe.takes_slot_profile())
        throw phasekv::input_error("--slot-profile: only the fixed and ape policies take one, not " + policy);
      if (control || preset) {
        j.probe.stride = j.probe.effective_stride();
        j.probe.window = j.probe.effective_window();
      }
      const std::int64_t window = j.probe.window;
      j.sweep.stride = stride;
      // Layouts (contained / straddle) are classified against the probe's stream; the control's
      // against the blocks of the stride it is plotted with (it has none of its own).
      j.sweep.window = control ? 0 : window;
      j.sweep.layout = o.layout;
      j.sweep.record = o.record;
      j.sweep.modulus = 2 * stride;
      j.sweep.trials_per_residue = o.trials;
      j.sweep.query_position = o.tokens - 1;
      // Targets from just after the first full window to a short distance before the query, so
      // the needle is read through compressed entries rather than a raw local window.
      j.sweep.min_distance = std::min<std::int64_t>(128, std::max<std::int64_t>(1, o.tokens / 8));
      j.sweep.span = j.sweep.query_position - j.sweep.min_distance - std::max(window, stride);
      j.sweep.seed = o.seed;
      j.name = control ? "control" : policy + "_S" + std::to_string(stride) + "_W" + std::to_string(window);
      j.label = control ? "full attention (control)" : policy + " S=" + std::to_string(stride) + " W=" + std::to_string(window);
      try {  // before any work, and naming the configuration the options produced
        j.probe.validate();
        j.sweep.validate();
      } catch (const phasekv::error& e) {
        throw phasekv::input_error("configuration " + j.label + ": " + e.what());
      }
      jobs.push_back(j);
    }
  }
  return jobs;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
  if (!file) throw phasekv::input_error("--out: cannot write " + path.string());
}

// Progress on stderr: one line rewritten in place on a terminal, a line per 10% otherwise.
class progress {
 public:
  progress(std::string what, std::int64_t total, bool enabled)
      : what_(std::move(what)), total_(total), enabled_(enabled), terminal_(isatty(fileno(stderr)) != 0) {}
  void step() {
    ++done_;
    if (!enabled_) return;
    const std::int64_t percent = 100 * done_ / total_;
    if (terminal_ ? percent != shown_ : percent / 10 != shown_ / 10 || done_ == total_) {
      shown_ = percent;
      std::fprintf(stderr, "%s%s: %lld/%lld trials (%lld%%)%s", terminal_ ? "\r" : "", what_.c_str(),
                   static_cast<long long>(done_), static_cast<long long>(total_), static_cast<long long>(percent),
                   terminal_ ? (done_ == total_ ? "\n" : "") : "\n");
      std::fflush(stderr);
    }
  }

 private:
  std::string what_;
  std::int64_t total_, done_ = 0, shown_ = -1;
  bool enabled_, terminal_;
};

std::string sweep_plot(const std::vector<job>& jobs, const std::vector<phasekv::diag::sweep_result>& results,
                       const options& o) {
  namespace plot = phasekv::diag::plot;
  std::vector<plot::sweep_figure_entry> entries;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    entries.push_back({jobs[i].label, &results[i], jobs[i].probe.policy != needle_policy::full_attention});
  plot::sweep_figure_options figure;
  figure.title = "Needle retrieval accuracy by the target's position in its chunk (" + std::to_string(o.tokens) +
                 " tokens, " + std::to_string(o.records) + " records, " + std::to_string(o.trials) +
                 " trials per position, 95% Wilson intervals)";
  figure.width = static_cast<int>(o.plot_width);
  figure.height = static_cast<int>(o.plot_height);
  return plot::phase_sweep_figure(entries, figure);
}

int run(const options& o) {
  const std::vector<job> jobs = plan_jobs(o);  // validates every configuration before any work
  const std::filesystem::path out_dir(o.out);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw phasekv::input_error("--out: cannot create directory " + o.out + ": " + ec.message());

  const auto start = std::chrono::steady_clock::now();
  std::vector<phasekv::diag::sweep_result> results;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const job& j = jobs[i];
    const auto job_start = std::chrono::steady_clock::now();
    const std::vector<phasekv::diag::placement> plan = phasekv::diag::plan_sweep(j.sweep);

    // The probe is deterministic: one context (seed + target set) gives one outcome per target.
    // The plan is a paired design — trial i of every residue shares an anchor — which a host realises by building each trial index's prompt
    // from its own content (see examples/host_sweep.cpp). Here the content is the probe's seed:
    // trial i uses seed group i mod M, within which every position occurs once per anchor. Each
    // group's targets are packed into contexts (first fit, sorted by position) at least
    // window + L apart, so no compressed entry holds two targets (a record takes L positions from
    // its first), L + 2W with --isolate (neither in the other's pooled tokens), and at most
    // `records` each. Every target is read once; run_sweep then replays the outcomes in the
    // plan's order.
    using phasekv::diag::probe::needle_probe;
    const std::int64_t modulus = j.sweep.resolved_modulus();
    const std::int64_t length = j.probe.record.length();
    const std::int64_t gap = j.probe.isolate_targets ? j.probe.haystack_spacing() : j.probe.window + length;
    std::vector<std::vector<phasekv::diag::placement>> groups(static_cast<std::size_t>(modulus));
    for (const auto& p : plan) groups[static_cast<std::size_t>(p.trial % modulus)].push_back(p);
    std::vector<std::vector<std::vector<phasekv::diag::placement>>> contexts(groups.size());
    for (std::size_t g = 0; g < groups.size(); ++g) {
      std::sort(groups[g].begin(), groups[g].end(),
                [](const auto& a, const auto& b) { return a.target_position < b.target_position; });
      for (const auto& p : groups[g]) {
        auto fits = [&](const std::vector<phasekv::diag::placement>& c) {
          return c.back().target_position <= p.target_position - gap &&
                 static_cast<std::int64_t>(c.size()) < j.probe.records;
        };
        auto it = std::find_if(contexts[g].begin(), contexts[g].end(), fits);
        if (it == contexts[g].end()) contexts[g].push_back({p});
        else it->push_back(p);
      }
    }

    progress bar("[" + std::to_string(i + 1) + "/" + std::to_string(jobs.size()) + "] " + j.label,
                 static_cast<std::int64_t>(plan.size()), !o.quiet);
    std::vector<std::vector<phasekv::diag::attributed_outcome>> found(
        static_cast<std::size_t>(modulus),
        std::vector<phasekv::diag::attributed_outcome>(static_cast<std::size_t>(j.sweep.trials_per_residue)));
    needle_probe probe(j.probe);
    for (std::size_t g = 0; g < contexts.size(); ++g) {
      if (contexts[g].empty()) continue;
      std::uint64_t state = o.seed * 0x100000001B3ull + g;
      probe.reseed(phasekv::detail::splitmix64(state));
      for (const auto& context : contexts[g]) {
        std::vector<std::int64_t> targets;
        for (const auto& p : context) targets.push_back(p.target_position);
        probe.prepare(targets, j.sweep.query_position);
        const std::vector<char> answers = probe.trials(targets);  // one read serves the whole context
        for (std::size_t k = 0; k < context.size(); ++k) {
          auto& outcome = found[static_cast<std::size_t>(context[k].residue)][static_cast<std::size_t>(context[k].trial)];
          outcome.success = answers[k] != 0;
          if (!outcome.success && o.attribute) outcome.cause = probe.explain(targets[k]).cause;
          bar.step();
        }
      }
    }
    const phasekv::diag::sweep_result result =
        phasekv::diag::run_sweep(j.sweep, [&](const phasekv::diag::placement& p) {
      return found[static_cast<std::size_t>(p.residue)][static_cast<std::size_t>(p.trial)];
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start).count();

    std::printf("== %s (policy %s, stride %lld, window %lld) — %.1f s\n%s\n", j.label.c_str(),
                phasekv::diag::probe::to_string(j.probe.policy), static_cast<long long>(j.probe.stride),
                static_cast<long long>(j.probe.window), seconds, to_table(result).c_str());
    std::fflush(stdout);

    // The harness's summary and JSON describe the sweep; add what the probe was, so a file stands
    // alone. The per-residue CSV stays one plain table.
    char extra[512];
    std::snprintf(extra, sizeof extra, "policy,%s\nwindow,%lld\ntokens,%lld\nrecords,%lld\nseed,%llu\n",
                  phasekv::diag::probe::to_string(j.probe.policy), static_cast<long long>(j.probe.window),
                  static_cast<long long>(o.tokens), static_cast<long long>(o.records),
                  static_cast<unsigned long long>(o.seed));
    write_file(out_dir / (j.name + ".csv"), to_csv(result));
    write_file(out_dir / (j.name + ".summary.csv"), to_summary_csv(result) + extra);
    std::snprintf(extra, sizeof extra,
                  "{\"name\":\"%s\",\"policy\":\"%s\",\"window\":%lld,\"tokens\":%lld,\"records\":%lld,\"seed\":%llu,"
                  "\"sweep\":",
                  j.name.c_str(), phasekv::diag::probe::to_string(j.probe.policy), static_cast<long long>(j.probe.window),
                  static_cast<long long>(o.tokens), static_cast<long long>(o.records),
                  static_cast<unsigned long long>(o.seed));
    write_file(out_dir / (j.name + ".json"), extra + to_json(result) + "}\n");
    results.push_back(result);
  }

  write_file(out_dir / "phase_sweep.svg", sweep_plot(jobs, results, o));

  // The period only means something where the residues differ (sweep_result::has_period, the
  // rule the JSON follows too): "-" where homogeneity holds at 5%. All trials, then the
  // within-window (contained) profile: a period of all trials that the contained profile does not
  // share is the record cut in two, not a bad offset.
  std::printf("%-34s %8s %8s %10s %7s | %-24s %10s %9s | %9s\n", "configuration", "mean%", "gap", "p-value", "period",
              "contained: debiased gap", "p-value", "phase p", "straddle%");
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const auto& r = results[i];
    const std::string period = r.all().period.flat      ? "flat"
                               : !r.has_period() ? "-"
                                                 : phasekv::detail::format_number(r.all().period.period, 4);
    const auto* within = r.profile("contained");
    const auto* across = r.profile("straddle");
    std::string gap = "n/a", p = "n/a", phase = "n/a", straddle = "n/a";
    if (within && within->valid) {
      char text[64];
      std::snprintf(text, sizeof text, "%.1f [%.1f, %.1f]", 100.0 * within->debiased_gap.estimate,
                    100.0 * within->debiased_gap.low, 100.0 * within->debiased_gap.high);
      gap = text;
      p = phasekv::detail::format_number(within->homogeneity.p_value, 3);
      if (std::isfinite(within->phase_test.p_value)) phase = phasekv::detail::format_number(within->phase_test.p_value, 3);
    }
    if (across && !across->residues.empty() && std::isfinite(across->mean))
      straddle = phasekv::detail::fixed(100.0 * across->mean, 2);
    std::printf("%-34s %8.2f %8.2f %10.3g %7s | %-24s %10s %9s | %9s\n", jobs[i].label.c_str(), 100.0 * r.all().mean,
                r.all().gap_points, r.all().homogeneity.p_value, period.c_str(), gap.c_str(), p.c_str(), phase.c_str(),
                straddle.c_str());
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s/{<configuration>.csv,.summary.csv,.json,phase_sweep.svg} in %.1f s\n", o.out.c_str(), total);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const phasekv::error& e) {  // a configuration the options produced, or --out
    std::fprintf(stderr, "phase_sweep: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phase_sweep: %s\n", e.what());
    return 1;
  }
}
