// lab_host: runs an exported lab model (lab/export.py) through phasekv and measures it.
//
//   lab_host logits  --model DIR --input FILE --output FILE
//       FILE in: int32 count, int32 length, then count·length int32 token ids (little-endian);
//       FILE out: float32 logits [count][length][vocab] at every position.
//   lab_host task    --model DIR --seed K [--target P]
//       prints one generated sequence as JSON (tokens, answer_positions, answers, record_starts),
//       for the parity test against lab/task.py.
//   lab_host measure --model DIR --out DIR [--trials N] [--knockout-trials N] [--calibration N]
//                    [--modulus M] [--seed K] [--cycle-delta D] [--label NAME] [--quiet]
//       per-residue retrieval accuracy with phasekv::diag::run_sweep (matched target positions, Wilson
//       intervals, χ² homogeneity, gap, dominant period), the write profile and gate
//       concentration of every compressed stream (phasekv::diag::write_profile), the head knockout map
//       (phasekv::diag::head_knockout_map, mean ablation) and, for gated W = S models, the gate-cycling
//       prediction (phasekv::diag::cycle_slot_profile on every slot bias, then a sweep compared with
//       phasekv::diag::predicted_shift). Writes DIR/measure.json, DIR/sweep.{csv,summary.csv,json}, DIR/*.svg.
//
// A trial (sweep placement p): the task's sequence with seed 2^63 + 2^62 + (K << 32) + p.trial,
// its last question asking for the record whose key is at p.target_position (so trial i of every
// residue shares its haystack: a paired design), the query at the last token. Success: the
// argmax of the logits there is the record's value. Bad options exit 2 naming the option.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <phasekv/diag/svg_plot.hpp>
#include <phasekv/phasekv.hpp>

#include "lab_model.hpp"

namespace {

constexpr const char* usage =
    "usage: lab_host logits  --model DIR --input FILE --output FILE\n"
    "       lab_host task    --model DIR --seed K [--target P]\n"
    "       lab_host measure --model DIR --out DIR [--trials N] [--knockout-trials N] [--calibration N]\n"
    "                        [--modulus M] [--seed K] [--cycle-delta D] [--label NAME] [--quiet]\n";

[[noreturn]] void bad_option(const std::string& option, const std::string& message) {
  std::fprintf(stderr, "lab_host: %s: %s\n%s", option.c_str(), message.c_str(), usage);
  std::exit(2);
}

struct arguments {
  std::map<std::string, std::string> values;
  std::vector<std::string> flags;

  bool has(const std::string& k) const { return values.count(k) != 0; }
  std::string text(const std::string& k) const {
    if (!has(k)) bad_option(k, "is required");
    return values.at(k);
  }
  std::int64_t integer(const std::string& k, std::int64_t fallback, std::int64_t minimum) const {
    if (!has(k)) return fallback;
    const std::string& s = values.at(k);
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != s.size()) bad_option(k, "'" + s + "' is not an integer");
    if (v < minimum) bad_option(k, "must be at least " + std::to_string(minimum) + ", got " + s);
    return v;
  }
  std::uint64_t unsigned_integer(const std::string& k, std::uint64_t fallback) const {
    if (!has(k)) return fallback;
    const std::string& s = values.at(k);
    std::size_t used = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != s.size() || s[0] == '-') bad_option(k, "'" + s + "' is not an unsigned 64-bit integer");
    return v;
  }
};

arguments parse(int argc, char** argv, const std::vector<std::string>& options, const std::vector<std::string>& flags) {
  arguments a;
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (std::find(flags.begin(), flags.end(), k) != flags.end()) {
      a.flags.push_back(k);
      continue;
    }
    if (std::find(options.begin(), options.end(), k) == options.end()) bad_option(k, "unknown option");
    if (i + 1 >= argc) bad_option(k, "needs a value");
    a.values[k] = argv[++i];
  }
  return a;
}

lab::model_weights load_or_exit(const std::string& dir) {
  try {
    return lab::load_model(dir);
  } catch (const std::exception& e) {
    bad_option("--model", e.what());
  }
}

// ---- logits ----------------------------------------------------------------------------------

int run_logits(const arguments& a) {
  lab::model_weights w = load_or_exit(a.text("--model"));
  const std::string in_path = a.text("--input"), out_path = a.text("--output");
  std::ifstream in(in_path, std::ios::binary);
  if (!in) bad_option("--input", "cannot open " + in_path);
  std::int32_t count = 0, length = 0;
  in.read(reinterpret_cast<char*>(&count), 4);
  in.read(reinterpret_cast<char*>(&length), 4);
  if (!in || count < 1 || length < 1) bad_option("--input", "no valid header (int32 count, int32 length)");
  const std::int64_t vocab = w.config.vocab;
  auto model = lab::make_engine(std::move(w), length);
  std::ofstream out(out_path, std::ios::binary);
  if (!out) bad_option("--output", "cannot write " + out_path);
  std::vector<std::int64_t> all(static_cast<std::size_t>(length));
  for (std::int32_t t = 0; t < length; ++t) all[t] = t;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(length));
  for (std::int32_t s = 0; s < count; ++s) {
    in.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(4 * length));
    if (!in) bad_option("--input", "ends inside sequence " + std::to_string(s));
    const lab::matrix logits = model->forward(tokens, all);
    out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(4 * length * vocab));
  }
  return out ? 0 : 1;
}

// ---- task ------------------------------------------------------------------------------------

template <class T>
std::string json_list(const std::vector<T>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

int run_task(const arguments& a) {
  const lab::model_weights w = load_or_exit(a.text("--model"));
  const std::uint64_t seed = a.unsigned_integer("--seed", 0);
  const std::int64_t target = a.integer("--target", -1, -1);
  lab::task_sequence s;
  try {
    s = lab::generate(w.config.task, seed, target);
  } catch (const std::exception& e) {
    bad_option("--target", e.what());
  }
  std::printf("{\"tokens\":%s,\"answer_positions\":%s,\"answers\":%s,\"record_starts\":%s}\n", json_list(s.tokens).c_str(),
              json_list(s.answer_positions).c_str(), json_list(s.answers).c_str(), json_list(s.record_starts).c_str());
  return 0;
}

// ---- measure ---------------------------------------------------------------------------------

std::string num(double x) { return phasekv::detail::json_number(x); }

// `sequences`: how many calibration sequences fed the profile. write_profile indexes tokens by
// absolute position, so N sequences add up at every position: the per-phase weights are divided
// by N (the mean weight a token of that phase receives, and the spread of that mean over
// positions). The concentrations average over windows and need no correction.
std::string profile_json(const phasekv::diag::write_profile& p, std::int64_t heads, std::int64_t sequences) {
  const double n = static_cast<double>(sequences);
  std::ostringstream o;
  o << "[";
  for (std::int64_t h = 0; h < heads; ++h) {
    o << (h ? "," : "") << "{\"head\":" << h << ",\"static_concentration\":" << num(p.static_concentration(h))
      << ",\"window_concentration\":" << num(p.window_concentration(h))
      << ",\"windows\":" << p.concentration_windows(h) << ",\"slot_profile\":[";
    const auto slots = p.unpadded_slot_profile(h);
    for (std::size_t i = 0; i < slots.size(); ++i) o << (i ? "," : "") << num(slots[i]);
    o << "],\"by_phase\":[";
    const auto phases = p.by_phase(h);
    for (std::size_t i = 0; i < phases.size(); ++i)
      o << (i ? "," : "") << "{\"phase\":" << phases[i].phase << ",\"mean_weight\":" << num(phases[i].mean_weight / n)
        << ",\"stddev_weight\":" << num(phases[i].stddev_weight / n) << ",\"coverage\":" << num(phases[i].coverage) << "}";
    o << "]}";
  }
  o << "]";
  return o.str();
}

phasekv::diag::plot::plot_series series_of(const phasekv::diag::sweep_result& r, const std::string& label, bool dashed = false) {
  phasekv::diag::plot::plot_series s;
  s.label = label;
  s.dashed = dashed;
  for (const auto& row : r.residues) s.points.push_back({double(row.residue), 100.0 * row.estimate, 100.0 * row.ci_low, 100.0 * row.ci_high});
  return s;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

int run_measure(const arguments& a) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const std::string model_dir = a.text("--model");
  lab::model_weights weights = load_or_exit(model_dir);
  const lab::model_config cfg = weights.config;
  const std::int64_t trials = a.integer("--trials", 64, phasekv::diag::sweep_config::minimum_trials);
  const std::int64_t ko_trials = a.integer("--knockout-trials", 32, 0);
  if (ko_trials > 0 && ko_trials < phasekv::diag::sweep_config::minimum_trials)
    bad_option("--knockout-trials", "must be 0 (no knockout map) or at least " +
                                        std::to_string(phasekv::diag::sweep_config::minimum_trials));
  const std::int64_t calibration = a.integer("--calibration", 32, 1);
  const std::int64_t modulus = a.integer("--modulus", 2 * cfg.stride, 2);
  if (modulus % cfg.stride != 0) bad_option("--modulus", "must be a multiple of the model's stride " + std::to_string(cfg.stride));
  // Sweep seeds are 2^63 + 2^62 + (K << 32) + trial: K below 2^30 keeps them in their own range.
  const auto seed = static_cast<std::uint64_t>(a.integer("--seed", 1, 0));
  if (seed >= (1ull << 30)) bad_option("--seed", "must be below 2^30");
  const std::int64_t delta = a.integer("--cycle-delta", cfg.stride / 2, 0);
  const std::string label = a.has("--label") ? a.values.at("--label") : cfg.kind;
  const bool quiet = std::find(a.flags.begin(), a.flags.end(), "--quiet") != a.flags.end();
  const std::filesystem::path out = a.text("--out");
  std::filesystem::create_directories(out);

  const lab::task_config& task = cfg.task;
  const std::int64_t T = task.tokens;
  phasekv::diag::sweep_config sc;
  sc.stride = cfg.stride;
  // Layouts (contained / straddle) against the model's own compressed stream.
  sc.window = cfg.window >= cfg.stride ? cfg.window : 0;
  sc.modulus = modulus;
  sc.trials_per_residue = trials;
  sc.query_position = T - 1;
  // The target record (key at p, value at p + 1) must lie before the question block and outside
  // the query's raw window [T − N_win, T − 1], so that only the compressed entries can carry it.
  sc.min_distance = std::max<std::int64_t>(3 * task.queries, cfg.win_tokens + 1);
  sc.span = T - 1 - sc.min_distance;
  sc.seed = seed;
  try {
    sc.validate();
  } catch (const std::exception& e) {
    bad_option("--modulus", std::string("the sweep does not fit this model's context: ") + e.what());
  }

  auto model = lab::make_engine(weights, T);
  const std::uint64_t base = (1ull << 63) + (1ull << 62) + (seed << 32);
  auto trial_on = [&](lab::engine& m, const phasekv::diag::placement& p, const lab::forward_options& o) -> bool {
    const lab::task_sequence s = lab::generate(task, base + static_cast<std::uint64_t>(p.trial), p.target_position);
    const lab::matrix logits = m.forward(s.tokens, {p.query_position}, o);
    Eigen::Index best = 0;
    logits.row(0).maxCoeff(&best);
    return best == s.answers.back();
  };
  auto progress = [&](const char* what) {
    if (!quiet)
      std::fprintf(stderr, "lab_host measure %s: %s (%.0f s)\n", label.c_str(), what,
                   std::chrono::duration<double>(clock::now() - start).count());
  };

  // 1. The sweep.
  const auto t_sweep = clock::now();
  const phasekv::diag::sweep_result sweep = phasekv::diag::run_sweep(sc, [&](const phasekv::diag::placement& p) { return trial_on(*model, p, {}); });
  const double sweep_seconds = std::chrono::duration<double>(clock::now() - t_sweep).count();
  progress("sweep done");
  write_file(out / "sweep.csv", sweep.to_csv());
  write_file(out / "sweep.summary.csv", sweep.to_summary_csv());
  write_file(out / "sweep.json", sweep.to_json());
  if (!quiet) std::fputs(sweep.to_table().c_str(), stderr);

  // 2. Calibration: per-head mean attention outputs (for the knockout) and the write profiles.
  std::vector<std::vector<lab::vector>> head_sums(cfg.layers, std::vector<lab::vector>(cfg.q_heads, lab::vector::Zero(cfg.head_dim)));
  std::vector<std::int64_t> head_counts(cfg.layers, 0);
  phasekv::geometry geom{cfg.stride, cfg.window, 0, phasekv::anchor_mode::block_start};
  std::vector<phasekv::diag::write_profile> profiles;
  for (std::int64_t k = 0; k < 2 * cfg.layers; ++k) profiles.emplace_back(geom, cfg.kv_heads);
  {
    lab::forward_options o;
    o.head_sums = &head_sums;
    o.head_counts = &head_counts;
    o.profiles = &profiles;
    std::vector<std::int64_t> all(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) all[t] = t;
    for (std::int64_t i = 0; i < calibration; ++i) {
      const lab::task_sequence s = lab::generate(task, (1ull << 63) + (1ull << 61) + (seed << 32) + i);
      model->forward(s.tokens, all, o);
    }
  }
  std::vector<std::vector<lab::vector>> head_means = head_sums;
  for (std::int64_t l = 0; l < cfg.layers; ++l)
    for (auto& v : head_means[l]) v /= static_cast<float>(head_counts[l]);
  progress("calibration done");

  // 3. Head knockout map over every (layer, query head).
  const std::int64_t heads = cfg.layers * cfg.q_heads;
  phasekv::diag::knockout_map ko;
  if (ko_trials > 0) {
    phasekv::diag::sweep_config kc = sc;
    kc.trials_per_residue = ko_trials;
    ko = phasekv::diag::head_knockout_map(kc, heads, [&](const phasekv::diag::placement& p, std::int64_t h) {
      lab::forward_options o;
      if (h >= 0) {
        o.knock_layer = h / cfg.q_heads;
        o.knock_head = h % cfg.q_heads;
        o.head_means = &head_means;
      }
      return trial_on(*model, p, o);
    });
    progress("knockout map done");
  }

  // 4. Gate cycling (gated, W = S): every slot bias cycled by δ, then the same sweep.
  const bool cycle = cfg.gated() && cfg.window == cfg.stride && delta % cfg.stride != 0;
  phasekv::diag::sweep_result cycled;
  std::vector<double> predicted;
  if (cycle) {
    lab::model_weights shifted = weights;
    for (auto& lw : shifted.layers) {
      lw.bias_k = phasekv::diag::cycle_slot_profile({lw.bias_k.data(), lw.bias_k.size()}, cfg.window, cfg.stride, delta, cfg.kv_heads);
      lw.bias_v = phasekv::diag::cycle_slot_profile({lw.bias_v.data(), lw.bias_v.size()}, cfg.window, cfg.stride, delta, cfg.kv_heads);
    }
    auto cycled_model = lab::make_engine(std::move(shifted), T);
    cycled = phasekv::diag::run_sweep(sc, [&](const phasekv::diag::placement& p) { return trial_on(*cycled_model, p, {}); });
    predicted = phasekv::diag::predicted_shift(sweep, delta);
    write_file(out / "cycled_sweep.json", cycled.to_json());
    progress("gate cycling done");
  }

  // Plots.
  {
    phasekv::diag::plot::plot_axes ax;
    ax.title = label + ": retrieval accuracy by target residue (t mod " + std::to_string(modulus) + ")";
    ax.x_label = "residue of the target key position";
    ax.y_label = "accuracy (%)";
    ax.x_min = 0;
    ax.x_max = double(modulus - 1);
    if (ax.x_max <= ax.x_min) ax.x_max = ax.x_min + 1;
    for (std::int64_t r = 0; r < modulus; ++r) ax.x_ticks.push_back({double(r), std::to_string(r)});
    std::vector<phasekv::diag::plot::plot_series> s{series_of(sweep, "baseline")};
    if (cycle) {
      s.push_back(series_of(cycled, "biases cycled by " + std::to_string(delta)));
      phasekv::diag::plot::plot_series pr;
      pr.label = "predicted shift";
      pr.dashed = true;
      for (std::size_t r = 0; r < predicted.size(); ++r) pr.points.push_back({double(r), 100.0 * predicted[r]});
      s.push_back(pr);
    }
    write_file(out / "sweep.svg", phasekv::diag::plot::svg_line_plot(s, ax));
    if (ko_trials > 0) {
      phasekv::diag::plot::plot_axes kx = ax;
      kx.title = label + ": accuracy change when one head is knocked out (mean ablation)";
      kx.y_label = "change in accuracy (points)";
      kx.y_min = -100;
      kx.y_max = 20;
      std::vector<phasekv::diag::plot::plot_series> ks;
      for (std::int64_t h = 0; h < heads; ++h) {
        phasekv::diag::plot::plot_series one;
        one.label = "layer " + std::to_string(h / cfg.q_heads) + " head " + std::to_string(h % cfg.q_heads);
        for (std::int64_t r = 0; r < modulus; ++r) one.points.push_back({double(r), 100.0 * ko.at(h, r)});
        ks.push_back(one);
      }
      write_file(out / "knockout.svg", phasekv::diag::plot::svg_line_plot(ks, kx));
    }
  }

  // measure.json: everything, for lab/report.py.
  std::ostringstream j;
  j << "{\"label\":" << phasekv::detail::json_string(label) << ",\"model\":" << phasekv::detail::json_string(model_dir)
    << ",\"kind\":\"" << cfg.kind << "\",\"stride\":" << cfg.stride << ",\"window\":" << cfg.window
    << ",\"win_tokens\":" << cfg.win_tokens << ",\"kv_heads\":" << cfg.kv_heads << ",\"q_heads\":" << cfg.q_heads
    << ",\"layers\":" << cfg.layers << ",\"seed\":" << seed << ",\"trials_per_residue\":" << trials
    << ",\"sweep_seconds\":" << num(sweep_seconds) << ",\"sequence_ms\":" << num(1000.0 * sweep_seconds / double(trials * modulus))
    << ",\"sweep\":" << sweep.to_json();
  j << ",\"write_profiles\":[";
  if (cfg.kind != "full")
    for (std::int64_t l = 0; l < cfg.layers; ++l)
      for (int k = 0; k < 2; ++k)
        j << (l + k ? "," : "") << "{\"layer\":" << l << ",\"stream\":\"" << (k ? "values" : "keys")
          << "\",\"heads\":" << profile_json(profiles[2 * l + k], cfg.kv_heads, calibration) << "}";
  j << "]";
  if (ko_trials > 0) {
    j << ",\"knockout\":{\"trials_per_residue\":" << ko_trials << ",\"heads\":" << heads << ",\"baseline_mean\":"
      << num(ko.baseline.mean) << ",\"rows\":[";
    for (std::int64_t h = 0; h < heads; ++h) {
      j << (h ? "," : "") << "{\"layer\":" << h / cfg.q_heads << ",\"head\":" << h % cfg.q_heads
        << ",\"mean\":" << num(ko.knocked[h].mean) << ",\"gap_points\":" << num(ko.knocked[h].gap_points)
        << ",\"p_value\":" << num(ko.knocked[h].homogeneity.p_value) << ",\"delta\":[";
      for (std::int64_t r = 0; r < modulus; ++r) j << (r ? "," : "") << num(ko.at(h, r));
      j << "]}";
    }
    j << "]}";
  }
  if (cycle) {
    double err_pred = 0, err_null = 0;
    for (std::int64_t r = 0; r < modulus; ++r) {
      err_pred += std::abs(cycled.residues[r].estimate - predicted[r]);
      err_null += std::abs(cycled.residues[r].estimate - sweep.residues[r].estimate);
    }
    j << ",\"cycling\":{\"delta\":" << delta << ",\"mean_abs_error_predicted\":" << num(err_pred / double(modulus))
      << ",\"mean_abs_error_unshifted\":" << num(err_null / double(modulus)) << ",\"predicted\":[";
    for (std::size_t r = 0; r < predicted.size(); ++r) j << (r ? "," : "") << num(predicted[r]);
    j << "],\"cycled\":" << cycled.to_json() << "}";
  }
  j << ",\"seconds\":" << num(std::chrono::duration<double>(clock::now() - start).count()) << "}\n";
  write_file(out / "measure.json", j.str());
  progress("done");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(usage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  try {
    if (command == "logits") return run_logits(parse(argc, argv, {"--model", "--input", "--output"}, {}));
    if (command == "task") return run_task(parse(argc, argv, {"--model", "--seed", "--target"}, {}));
    if (command == "measure")
      return run_measure(parse(argc, argv,
                               {"--model", "--out", "--trials", "--knockout-trials", "--calibration", "--modulus",
                                "--seed", "--cycle-delta", "--label"},
                               {"--quiet"}));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lab_host %s: %s\n", command.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "lab_host: '%s' is not a command\n%s", command.c_str(), usage);
  return 2;
}
