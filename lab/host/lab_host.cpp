// lab_host: runs an exported lab model (lab/export.py) through phasekv and measures it.
//
//   lab_host logits  --model DIR --input FILE --output FILE
//       FILE in: int32 count, int32 length, then count·length int32 token ids (little-endian);
//       FILE out: float32 logits [count][length][vocab] at every position.
//   lab_host serve   --model DIR [--max-tokens N]
//       one model, many prompts (what lab/served.py's HTTP server drives): reads from stdin
//       int32 length, then length int32 token ids (little-endian), and writes to stdout float32
//       logits [length][vocab] at every position, computed by the same forward as `logits`
//       (phasekv's caches, made anew for each prompt); a length of 0 or end of input stops it.
//       N (default 512) is the longest prompt.
//   lab_host task    --model DIR --seed K [--target P] [--trail U]
//       prints one generated sequence as JSON, for the parity test against lab/task.py.
//   lab_host plan    --model DIR [measurement options] [--sweep uniform|isolated|gapped] [--count N]
//       prints the task that sweep generates its trials from (a line "task {json}"), then the first
//       N placements of its plan, one "seed target trail" line each.
//   lab_host queries --model DIR --input FILE --output FILE [measurement options] [--sweep NAME]
//       FILE in: "seed target trail" lines; FILE out: float32 logits [count][vocab] at each
//       sequence's query, computed by the very function a sweep trial uses (the sweep's task, the
//       last layer reading only the query position) — lab/verify.py holds it to PyTorch on
//       planned placements.
//   lab_host measure --model DIR --out DIR [measurement options] [--label NAME] [--quiet]
//
// Measurement options: --trials N (per residue, the main sweep), --isolated-trials N, --gap G
// with --gapped-trials N, --knockout-trials N, --calibration N, --seed K, --analysis-stride S
// (default the model's stride, 8 for a stride-1 model), --modulus M (default 2S), --origin-shift O.
//
// What measure does (lab/README.md, "Measurement"):
//   1. the main sweep (phasekv::diag::run_sweep): the target record's key at every residue
//      t mod M, the other records placed as the model was trained, the query jittered over the
//      task's trailing filler (sweep_config::query_jitter) so the target's phase and its distance
//      to the query are not tied; per trial the covariates (straddle, crowding, distance) for a
//      Firth logistic fit (phasekv::diag::stats::fit_logistic) and the guessing floors;
//   2. the isolated sweep: contained residues only, no other record or decoy within W tokens of
//      the target (the within-window test without crowding);
//   3. optionally a gapped sweep: value at key + G + 1, contained residues only;
//   4. head knockouts per query head and per KV head (mean ablation) with a head × phase test
//      (phasekv::diag::knockout_phase_test);
//   5. write profiles and gate concentration of every compressed stream (phasekv::diag::write_profile).
// Writes DIR/measure.json, DIR/<sweep>.{csv,json}, DIR/<sweep>_trials.csv and DIR/*.svg.
//
// Trial seeds: 2^63 + 2^62 + (K << 32) + (sweep << 28) + trial, sweep 0 main, 1 isolated, 2 gapped,
// 3 knockouts; calibration 2^63 + 2^61 + (K << 32) + i. Bad options exit 2 naming the option.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <phasekv/study/svg_plot.hpp>
#include <phasekv/phasekv.hpp>

#include "lab_model.hpp"

namespace {

namespace diag = phasekv::diag;

constexpr const char* usage =
    "usage: lab_host logits  --model DIR --input FILE --output FILE\n"
    "       lab_host serve   --model DIR [--max-tokens N]\n"
    "       lab_host task    --model DIR --seed K [--target P] [--trail U]\n"
    "       lab_host plan    --model DIR [measurement options] [--sweep uniform|isolated|gapped] [--count N]\n"
    "       lab_host queries --model DIR --input FILE --output FILE [measurement options] [--sweep NAME]\n"
    "       lab_host measure --model DIR --out DIR [measurement options] [--label NAME] [--quiet]\n"
    "measurement options: --trials N --isolated-trials N --gap G --gapped-trials N --knockout-trials N\n"
    "                     --calibration N --seed K --analysis-stride S --modulus M --origin-shift O\n";

[[noreturn]] void bad_option(const std::string& option, const std::string& message) {
  std::fprintf(stderr, "lab_host: %s: %s\n%s", option.c_str(), message.c_str(), usage);
  std::exit(2);
}

struct arguments {
  std::map<std::string, std::string> values;
  std::vector<std::string> flags;

  bool has(const std::string& k) const { return values.count(k) != 0; }
  bool flag(const std::string& k) const { return std::find(flags.begin(), flags.end(), k) != flags.end(); }
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

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

std::string num(double x) { return phasekv::detail::json_number(x); }

template <class T>
std::string json_list(const std::vector<T>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
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

int run_serve(const arguments& a) {
  lab::model_weights w = load_or_exit(a.text("--model"));
  std::int64_t max_tokens = 512;
  if (a.has("--max-tokens")) {
    try {
      max_tokens = std::stoll(a.text("--max-tokens"));
    } catch (const std::exception&) {
      max_tokens = 0;
    }
    if (max_tokens < 1) bad_option("--max-tokens", "must be a positive integer");
  }
  const std::int64_t vocab = w.config.vocab;
  auto model = lab::make_engine(std::move(w), max_tokens);
  std::vector<std::int32_t> tokens;
  std::vector<std::int64_t> all;
  for (;;) {
    std::int32_t length = 0;
    if (std::fread(&length, 4, 1, stdin) != 1 || length == 0) return 0;
    if (length < 0 || length > max_tokens) {
      std::fprintf(stderr, "lab_host serve: prompt of %d tokens (at most %lld)\n", length, static_cast<long long>(max_tokens));
      return 1;
    }
    tokens.resize(static_cast<std::size_t>(length));
    if (std::fread(tokens.data(), 4, tokens.size(), stdin) != tokens.size()) {
      std::fputs("lab_host serve: input ends inside a prompt\n", stderr);
      return 1;
    }
    for (std::int32_t t : tokens)
      if (t < 0 || t >= vocab) {
        std::fprintf(stderr, "lab_host serve: token id %d outside the vocabulary of %lld\n", t, static_cast<long long>(vocab));
        return 1;
      }
    all.resize(tokens.size());
    for (std::size_t t = 0; t < all.size(); ++t) all[t] = static_cast<std::int64_t>(t);
    const lab::matrix logits = model->forward(tokens, all);
    std::fwrite(logits.data(), 4, static_cast<std::size_t>(length * vocab), stdout);
    std::fflush(stdout);
  }
}

// ---- task ------------------------------------------------------------------------------------

int run_task(const arguments& a) {
  const lab::model_weights w = load_or_exit(a.text("--model"));
  const std::uint64_t seed = a.unsigned_integer("--seed", 0);
  const std::int64_t target = a.integer("--target", -1, -1);
  const std::int64_t trail = a.integer("--trail", -1, -1);
  lab::task_sequence s;
  try {
    s = lab::generate(w.config.task, seed, target, trail);
  } catch (const std::exception& e) {
    bad_option("--target", e.what());
  }
  const lab::floors f = lab::floors_of(w.config.task, s);
  std::printf(
      "{\"tokens\":%s,\"answer_positions\":%s,\"answers\":%s,\"record_starts\":%s,\"asked\":%s,\"decoys\":%s,"
      "\"trail\":%lld,\"floors\":[%s,%s]}\n",
      json_list(s.tokens).c_str(), json_list(s.answer_positions).c_str(), json_list(s.answers).c_str(),
      json_list(s.record_starts).c_str(), json_list(s.asked).c_str(), json_list(s.decoys).c_str(),
      static_cast<long long>(s.trail), num(f.any_value).c_str(), num(f.record_value).c_str());
  return 0;
}

// ---- the measurement's design ------------------------------------------------------------------

// Everything a sweep trial needs: the model's task, the analysis geometry, the plans' configs.
struct design {
  lab::model_config model;
  std::int64_t analysis_stride = 0, analysis_window = 0, analysis_origin = 0, modulus = 0, origin_shift = 0;
  std::uint64_t seed = 1;
  std::int64_t trials = 64, isolated_trials = 32, gap = 0, gapped_trials = 0, knockout_trials = 16, calibration = 16;

  phasekv::geometry analysis() const {
    return {analysis_stride, analysis_window, analysis_origin, phasekv::anchor_mode::block_start};
  }

  // The task of a sweep: the model's, with that sweep's placement of the target's neighbours.
  lab::task_config task(const std::string& sweep) const {
    lab::task_config t = model.task;
    if (sweep == "isolated") {
      t.placement = "isolated";
      t.isolation = analysis_window;
    } else if (sweep == "gapped") {
      t.gap = gap;
      t.placement = "gapped";
      t.block_stride = 0;
    }
    return t;
  }

  phasekv::diag::sweep_config sweep(const std::string& name) const {
    const lab::task_config t = task(name);
    diag::sweep_config sc;
    sc.stride = analysis_stride;
    sc.window = analysis_window;
    sc.origin = analysis_origin;
    sc.modulus = modulus;
    sc.trials_per_residue = name == "isolated" ? isolated_trials : name == "gapped" ? gapped_trials
                                                 : name == "knockout"               ? knockout_trials
                                                                                    : trials;
    sc.record.key_tokens = 1;
    sc.record.gap = t.gap;
    sc.record.value_tokens = 1;
    sc.layout = name == "uniform" || name == "knockout" ? diag::layout_mode::any : diag::layout_mode::contained;
    // The query is the last question's key, T − 1 − u for u trailing filler tokens: jitter it
    // over every u the task draws. The target record must end before the questions and outside
    // the query's raw window (only the compressed entries can carry it).
    sc.query_position = t.tokens - 1;
    sc.query_jitter = t.trail + 1;
    const std::int64_t L = t.record_tokens();
    sc.min_distance = std::max<std::int64_t>(2 * t.queries - 1 + L, model.win_tokens + L);
    sc.span = sc.earliest_query() - sc.min_distance;
    sc.seed = seed;
    return sc;
  }

  std::uint64_t trial_seed(int sweep_index, std::int64_t trial) const {
    return (1ull << 63) + (1ull << 62) + (seed << 32) + (static_cast<std::uint64_t>(sweep_index) << 28) +
           static_cast<std::uint64_t>(trial);
  }
};

int sweep_index(const std::string& name) {
  return name == "uniform" ? 0 : name == "isolated" ? 1 : name == "gapped" ? 2 : 3;
}

design design_of(const arguments& a, const lab::model_config& cfg) {
  design d;
  d.model = cfg;
  d.trials = a.integer("--trials", 64, diag::sweep_config::minimum_trials);
  d.isolated_trials = a.integer("--isolated-trials", 32, 0);
  d.gap = a.integer("--gap", 0, 0);
  d.gapped_trials = a.integer("--gapped-trials", d.gap > 0 ? 32 : 0, 0);
  d.knockout_trials = a.integer("--knockout-trials", 16, 0);
  d.calibration = a.integer("--calibration", 16, 1);
  for (const char* k : {"--isolated-trials", "--gapped-trials", "--knockout-trials"}) {
    const std::int64_t v = a.integer(k, 0, 0);
    if (v > 0 && v < diag::sweep_config::minimum_trials)
      bad_option(k, "must be 0 (skip) or at least " + std::to_string(diag::sweep_config::minimum_trials));
  }
  if (d.gapped_trials > 0 && d.gap < 1) bad_option("--gap", "must be at least 1 for a gapped sweep");
  d.analysis_stride = a.integer("--analysis-stride", cfg.stride > 1 ? cfg.stride : 8, 1);
  if (d.analysis_stride % cfg.stride != 0 && cfg.stride != 1)
    bad_option("--analysis-stride", "must be the model's stride " + std::to_string(cfg.stride) + " (or any, for stride 1)");
  d.analysis_window = d.analysis_stride == cfg.stride ? cfg.window : d.analysis_stride;
  d.origin_shift = a.integer("--origin-shift", 0, 0);
  d.analysis_origin = cfg.stride == 1 ? 0 : cfg.origin_of(0, 0, d.origin_shift);
  d.modulus = a.integer("--modulus", 2 * d.analysis_stride, 2);
  if (d.modulus % d.analysis_stride != 0)
    bad_option("--modulus", "must be a multiple of the analysis stride " + std::to_string(d.analysis_stride));
  // Sweep seeds are 2^63 + 2^62 + (K << 32) + …: K below 2^30 keeps them in their own range.
  d.seed = static_cast<std::uint64_t>(a.integer("--seed", 1, 0));
  if (d.seed >= (1ull << 30)) bad_option("--seed", "must be below 2^30");
  for (const char* name : {"uniform", "isolated", "gapped"}) {
    try {
      if (d.sweep(name).trials_per_residue == 0) continue;
      d.sweep(name).validate();
    } catch (const std::exception& e) {
      bad_option("--modulus", std::string("the ") + name + " sweep does not fit this model's task: " + e.what());
    }
  }
  return d;
}

// One trial: the sequence of a placement, the logits at its query.
struct trial_run {
  lab::task_sequence sequence;
  lab::matrix logits;  // [1][vocab]
  bool success = false;
};

// The logits a trial reads: at the last question's key only (the last layer reads nothing else).
lab::matrix query_logits(lab::engine& m, const lab::task_sequence& s, const lab::forward_options& o = {}) {
  return m.forward(s.tokens, {s.query_position()}, o);
}

trial_run run_trial(lab::engine& m, const design& d, const std::string& sweep, const diag::placement& p,
                    const lab::forward_options& o = {}) {
  trial_run r;
  const lab::task_config t = d.task(sweep);
  const std::int64_t trail = t.tokens - 1 - p.query_position;
  r.sequence = lab::generate(t, d.trial_seed(sweep_index(sweep), p.trial), p.target_position, trail);
  if (r.sequence.query_position() != p.query_position) throw std::logic_error("the trial's query is not the plan's");
  r.logits = query_logits(m, r.sequence, o);
  Eigen::Index best = 0;
  r.logits.row(0).maxCoeff(&best);
  r.success = best == r.sequence.answers.back();
  return r;
}

// The covariates of one trial (for the logistic fit and the trial table).
struct trial_row {
  std::int64_t residue = 0, trial = 0, target = 0, query = 0, phase = 0, crowding = 0;
  bool straddle = false, success = false;
  double floor_any = 0, floor_record = 0;
};

trial_row describe(const design& d, const std::string& sweep, const diag::placement& p, const trial_run& r) {
  const lab::task_config t = d.task(sweep);
  const phasekv::geometry g = d.analysis();
  const std::int64_t L = t.record_tokens();
  trial_row row;
  row.residue = p.residue;
  row.trial = p.trial;
  row.target = p.target_position;
  row.query = p.query_position;
  row.phase = g.phase_of(p.target_position);
  row.straddle = p.layout.straddles();
  // Crowding: other records and decoys with a token among the tokens the target's entries pool.
  std::vector<std::int64_t> others(r.sequence.record_starts.begin() + 1, r.sequence.record_starts.end());
  row.crowding = diag::crowding(g, p.target_position, L, {others.data(), others.size()}, L) +
                 diag::crowding(g, p.target_position, L, {r.sequence.decoys.data(), r.sequence.decoys.size()}, 1);
  row.success = r.success;
  const lab::floors f = lab::floors_of(t, r.sequence);
  row.floor_any = f.any_value;
  row.floor_record = f.record_value;
  return row;
}

// ---- plan / queries ----------------------------------------------------------------------------

const std::vector<std::string> measurement_options = {
    "--model", "--trials", "--isolated-trials", "--gap", "--gapped-trials", "--knockout-trials", "--calibration",
    "--seed", "--analysis-stride", "--modulus", "--origin-shift"};

std::string sweep_option(const arguments& a, const design& d) {
  const std::string sweep = a.has("--sweep") ? a.values.at("--sweep") : "uniform";
  if (sweep != "uniform" && sweep != "isolated" && sweep != "gapped")
    bad_option("--sweep", "'" + sweep + "' is not uniform, isolated or gapped");
  if (sweep == "gapped" && d.gap < 1) bad_option("--gap", "must be at least 1 for the gapped sweep");
  return sweep;
}

std::string task_json(const lab::task_config& t) {
  std::ostringstream o;
  o << "{\"filler\":" << t.filler << ",\"keys\":" << t.keys << ",\"values\":" << t.values << ",\"tokens\":" << t.tokens
    << ",\"records\":" << t.records << ",\"queries\":" << t.queries << ",\"decoys\":" << t.decoys
    << ",\"trail\":" << t.trail << ",\"gap\":" << t.gap << ",\"placement\":" << phasekv::detail::json_string(t.placement)
    << ",\"block_stride\":" << t.block_stride << ",\"block_origin\":" << t.block_origin
    << ",\"isolation\":" << t.isolation << "}";
  return o.str();
}

int run_plan(const arguments& a) {
  const lab::model_weights w = load_or_exit(a.text("--model"));
  const design d = design_of(a, w.config);
  const std::string sweep = sweep_option(a, d);
  const std::int64_t count = a.integer("--count", 16, 1);
  diag::sweep_config sc = d.sweep(sweep);
  if (sc.trials_per_residue < diag::sweep_config::minimum_trials) sc.trials_per_residue = diag::sweep_config::minimum_trials;
  const auto plan = diag::plan_sweep(sc);
  const lab::task_config t = d.task(sweep);
  std::printf("task %s\n", task_json(t).c_str());
  for (std::int64_t i = 0; i < count && i < static_cast<std::int64_t>(plan.size()); ++i) {
    const auto& p = plan[static_cast<std::size_t>(i)];
    std::printf("%llu %lld %lld\n", static_cast<unsigned long long>(d.trial_seed(sweep_index(sweep), p.trial)),
                static_cast<long long>(p.target_position), static_cast<long long>(t.tokens - 1 - p.query_position));
  }
  return 0;
}

int run_queries(const arguments& a) {
  lab::model_weights w = load_or_exit(a.text("--model"));
  const design d = design_of(a, w.config);
  const lab::task_config task = d.task(sweep_option(a, d));
  const std::int64_t vocab = w.config.vocab;
  auto model = lab::make_engine(std::move(w), task.tokens, d.origin_shift);
  std::ifstream in(a.text("--input"));
  if (!in) bad_option("--input", "cannot open " + a.values.at("--input"));
  std::ofstream out(a.text("--output"), std::ios::binary);
  if (!out) bad_option("--output", "cannot write " + a.values.at("--output"));
  unsigned long long seed = 0;
  long long target = 0, trail = 0;
  std::int64_t line = 0;
  while (in >> seed >> target >> trail) {
    ++line;
    lab::task_sequence s;
    try {
      s = lab::generate(task, seed, target, trail);
    } catch (const std::exception& e) {
      bad_option("--input", "line " + std::to_string(line) + ": " + e.what());
    }
    const lab::matrix logits = query_logits(*model, s);
    out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(4 * vocab));
  }
  if (!in.eof()) bad_option("--input", "line " + std::to_string(line + 1) + " is not 'seed target trail'");
  return out ? 0 : 1;
}

// ---- measure -----------------------------------------------------------------------------------

// The per-phase weights are divided by the calibration sequences fed (write_profile indexes
// tokens by absolute position, so sequences add up at every position).
std::string profile_json(const diag::write_profile& p, std::int64_t sequences) {
  const double n = static_cast<double>(sequences);
  std::ostringstream o;
  o << "{\"static_concentration\":" << num(p.static_concentration(0)) << ",\"window_concentration\":"
    << num(p.window_concentration(0)) << ",\"windows\":" << p.concentration_windows(0) << ",\"slot_profile\":[";
  const auto slots = p.unpadded_slot_profile(0);
  for (std::size_t i = 0; i < slots.size(); ++i) o << (i ? "," : "") << num(slots[i]);
  o << "],\"by_phase\":[";
  const auto phases = p.by_phase(0);
  for (std::size_t i = 0; i < phases.size(); ++i)
    o << (i ? "," : "") << "{\"phase\":" << phases[i].phase << ",\"mean_weight\":" << num(phases[i].mean_weight / n)
      << ",\"coverage\":" << num(phases[i].coverage) << "}";
  o << "]}";
  return o.str();
}

diag::plot::plot_series series_of(const diag::sweep_result& r, const std::string& label) {
  diag::plot::plot_series s;
  s.label = label;
  for (const auto& row : r.residues)
    if (row.planned && row.valid > 0)
      s.points.push_back({double(row.residue), 100.0 * row.estimate, 100.0 * row.ci_low, 100.0 * row.ci_high,
                          row.layout != diag::layout_class::contained});
  return s;
}

// The logistic fit of a sweep's trials: success on straddle, crowding, distance (per 100 tokens)
// and the contained phases 1 … S − L (phase 0 the reference), with the likelihood-ratio tests of
// the phase columns (the within-window phase effect net of the covariates), of straddle, crowding
// and distance. A column that does not vary over the trials (no straddling trial in a contained
// sweep, no crowding in an isolated one) cannot be estimated and is left out; a sweep whose
// outcomes do not vary has nothing to fit.
std::string logistic_json(const design& d, const std::vector<trial_row>& rows, std::int64_t record_tokens) {
  const std::int64_t S = d.analysis_stride;
  struct column {
    std::string name;
    std::function<double(const trial_row&)> value;
  };
  std::vector<column> all = {
      {"intercept", [](const trial_row&) { return 1.0; }},
      {"straddle", [](const trial_row& r) { return r.straddle ? 1.0 : 0.0; }},
      {"crowding", [](const trial_row& r) { return static_cast<double>(r.crowding); }},
      {"distance_per_100", [](const trial_row& r) { return static_cast<double>(r.query - r.target) / 100.0; }}};
  for (std::int64_t phase = 1; phase <= S - record_tokens; ++phase)
    all.push_back({"phase_" + std::to_string(phase),
                   [phase](const trial_row& r) { return !r.straddle && r.phase == phase ? 1.0 : 0.0; }});
  std::vector<column> used;
  std::vector<std::string> left_out;
  for (const column& c : all) {
    bool varies = false;
    for (const trial_row& r : rows) varies = varies || c.value(r) != c.value(rows.front());
    if (c.name == "intercept" || varies) used.push_back(c);
    else left_out.push_back(c.name);
  }
  bool outcomes_vary = false;
  for (const trial_row& r : rows) outcomes_vary = outcomes_vary || r.success != rows.front().success;
  std::ostringstream o;
  o << "{\"observations\":" << rows.size() << ",\"left_out\":[";
  for (std::size_t i = 0; i < left_out.size(); ++i) o << (i ? "," : "") << phasekv::detail::json_string(left_out[i]);
  o << "]";
  if (rows.empty() || !outcomes_vary) return o.str() + ",\"note\":\"every trial had the same outcome: nothing to fit\"}";
  const std::size_t k = used.size();
  std::vector<std::string> names;
  for (const column& c : used) names.push_back(c.name);
  std::vector<double> x, y;
  for (const trial_row& r : rows) {
    for (const column& c : used) x.push_back(c.value(r));
    y.push_back(r.success);
  }
  try {
    const diag::stats::logistic_fit fit = diag::stats::fit_logistic(x, y, k, names);
    o << ",\"converged\":" << (fit.converged ? "true" : "false") << ",\"coefficients\":{";
    for (std::size_t j = 0; j < k; ++j)
      o << (j ? "," : "") << phasekv::detail::json_string(names[j]) << ":{\"estimate\":" << num(fit.coefficients[j])
        << ",\"se\":" << num(fit.standard_errors[j]) << ",\"p\":" << num(fit.p_values[j]) << "}";
    o << "}";
    auto test = [&](const char* label, const std::string& prefix) {
      diag::stats::logistic_options held;
      for (std::size_t j = 1; j < k; ++j)
        if (names[j].rfind(prefix, 0) == 0) held.zero.push_back(j);
      if (held.zero.empty()) return;
      const auto lr = diag::stats::likelihood_ratio_test(fit, diag::stats::fit_logistic(x, y, k, names, held));
      o << ",\"" << label << "\":{\"statistic\":" << num(lr.statistic) << ",\"dof\":" << lr.dof << ",\"p\":" << num(lr.p_value) << "}";
    };
    test("phase_test", "phase_");
    test("straddle_test", "straddle");
    test("crowding_test", "crowding");
    test("distance_test", "distance");
  } catch (const std::exception& e) {
    o << ",\"error\":" << phasekv::detail::json_string(e.what());
  }
  return o.str() + "}";
}

std::string trials_csv(const std::vector<trial_row>& rows) {
  std::ostringstream o;
  o << "residue,trial,target,query,distance,phase,straddle,crowding,success,floor_any,floor_record\n";
  for (const trial_row& r : rows)
    o << r.residue << ',' << r.trial << ',' << r.target << ',' << r.query << ',' << r.query - r.target << ',' << r.phase
      << ',' << r.straddle << ',' << r.crowding << ',' << r.success << ',' << num(r.floor_any) << ','
      << num(r.floor_record) << '\n';
  return o.str();
}

int run_measure(const arguments& a) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const std::string model_dir = a.text("--model");
  lab::model_weights weights = load_or_exit(model_dir);
  const lab::model_config cfg = weights.config;
  const design d = design_of(a, cfg);
  const std::string label = a.has("--label") ? a.values.at("--label") : cfg.kind;
  const bool quiet = a.flag("--quiet");
  const std::filesystem::path out = a.text("--out");
  std::filesystem::create_directories(out);
  const std::int64_t T = cfg.task.tokens;
  auto model = lab::make_engine(weights, T, d.origin_shift);
  auto progress = [&](const std::string& what) {
    if (!quiet)
      std::fprintf(stderr, "lab_host measure %s: %s (%.0f s)\n", label.c_str(), what.c_str(),
                   std::chrono::duration<double>(clock::now() - start).count());
  };

  std::ostringstream j;
  j << "{\"label\":" << phasekv::detail::json_string(label) << ",\"model\":" << phasekv::detail::json_string(model_dir)
    << ",\"kind\":\"" << cfg.kind << "\",\"stride\":" << cfg.stride << ",\"window\":" << cfg.window
    << ",\"win_tokens\":" << cfg.win_tokens << ",\"kv_heads\":" << cfg.kv_heads << ",\"q_heads\":" << cfg.q_heads
    << ",\"layers\":" << cfg.layers << ",\"origin\":" << cfg.origin << ",\"layer_stagger\":" << cfg.layer_stagger
    << ",\"head_stagger\":" << cfg.head_stagger << ",\"token_shift\":" << cfg.token_shift
    << ",\"origin_shift\":" << d.origin_shift << ",\"analysis_stride\":" << d.analysis_stride
    << ",\"analysis_window\":" << d.analysis_window << ",\"analysis_origin\":" << d.analysis_origin
    << ",\"modulus\":" << d.modulus << ",\"seed\":" << d.seed << ",\"sweeps\":{";

  // 1–3. The sweeps.
  diag::sweep_result main_sweep;
  std::vector<diag::plot::plot_series> plotted;
  bool first = true;
  for (const std::string name : {"uniform", "isolated", "gapped"}) {
    const diag::sweep_config sc = d.sweep(name);
    if (sc.trials_per_residue == 0) continue;
    std::vector<trial_row> rows;
    const auto t0 = clock::now();
    const diag::sweep_result r = diag::run_sweep(sc, [&](const diag::placement& p) {
      const trial_run run = run_trial(*model, d, name, p);
      rows.push_back(describe(d, name, p, run));
      return run.success;
    });
    const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
    double floor_any = 0, floor_record = 0;
    for (const trial_row& row : rows) {
      floor_any += row.floor_any / double(rows.size());
      floor_record += row.floor_record / double(rows.size());
    }
    write_file(out / (name + ".json"), to_json(r));
    write_file(out / (name + ".csv"), to_csv(r));
    write_file(out / (name + "_trials.csv"), trials_csv(rows));
    if (!quiet) std::fputs(to_table(r).c_str(), stderr);
    j << (first ? "" : ",") << "\"" << name << "\":{\"seconds\":" << num(seconds) << ",\"floor_any\":" << num(floor_any)
      << ",\"floor_record\":" << num(floor_record) << ",\"logistic\":"
      << logistic_json(d, rows, d.task(name).record_tokens()) << ",\"sweep\":" << to_json(r) << "}";
    first = false;
    plotted.push_back(series_of(r, name));
    if (name == "uniform") main_sweep = r;
    progress(name + " sweep done");
  }
  j << "}";

  // Calibration: per-head mean attention outputs (for the knockouts) and the write profiles.
  std::vector<std::vector<lab::vector>> head_sums(cfg.layers, std::vector<lab::vector>(cfg.q_heads, lab::vector::Zero(cfg.head_dim)));
  std::vector<std::int64_t> head_counts(cfg.layers, 0);
  std::vector<diag::write_profile> profiles;
  for (std::int64_t l = 0; l < cfg.layers; ++l)
    for (int stream = 0; stream < 2; ++stream)
      for (std::int64_t h = 0; h < cfg.kv_heads; ++h)
        profiles.emplace_back(phasekv::geometry{cfg.stride, cfg.window, cfg.origin_of(l, h, d.origin_shift),
                                                phasekv::anchor_mode::block_start},
                              1);
  {
    lab::forward_options o;
    o.head_sums = &head_sums;
    o.head_counts = &head_counts;
    o.profiles = &profiles;
    std::vector<std::int64_t> all(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) all[t] = t;
    for (std::int64_t i = 0; i < d.calibration; ++i) {
      const lab::task_sequence s = lab::generate(cfg.task, (1ull << 63) + (1ull << 61) + (d.seed << 32) + i);
      model->forward(s.tokens, all, o);
    }
  }
  std::vector<std::vector<lab::vector>> head_means = head_sums;
  for (std::int64_t l = 0; l < cfg.layers; ++l)
    for (auto& v : head_means[l]) v /= static_cast<float>(head_counts[l]);
  progress("calibration done");

  // 4. Knockouts: every query head, then every KV head's group, each a mean ablation.
  if (d.knockout_trials > 0) {
    const std::int64_t g = cfg.q_heads / cfg.kv_heads;
    struct unit { std::int64_t layer, head, count; std::string name; };
    std::vector<unit> units;
    for (std::int64_t l = 0; l < cfg.layers; ++l)
      for (std::int64_t h = 0; h < cfg.q_heads; ++h)
        units.push_back({l, h, 1, "layer " + std::to_string(l) + " query head " + std::to_string(h)});
    for (std::int64_t l = 0; l < cfg.layers; ++l)
      for (std::int64_t h = 0; h < cfg.kv_heads; ++h)
        units.push_back({l, h * g, g, "layer " + std::to_string(l) + " KV head " + std::to_string(h)});
    const diag::sweep_config kc = d.sweep("knockout");
    const diag::knockout_map ko =
        diag::head_knockout_map(kc, static_cast<std::int64_t>(units.size()), [&](const diag::placement& p, std::int64_t u) {
          lab::forward_options o;
          if (u >= 0) {
            o.knock_layer = units[static_cast<std::size_t>(u)].layer;
            o.knock_head = units[static_cast<std::size_t>(u)].head;
            o.knock_count = units[static_cast<std::size_t>(u)].count;
            o.head_means = &head_means;
          }
          return run_trial(*model, d, "knockout", p, o).success;
        });
    j << ",\"knockout\":{\"trials_per_residue\":" << kc.trials_per_residue << ",\"baseline_mean\":" << num(ko.baseline.all().mean)
      << ",\"units\":[";
    diag::plot::plot_axes kx;
    std::vector<diag::plot::plot_series> ks;
    for (std::size_t u = 0; u < units.size(); ++u) {
      const auto test = diag::knockout_phase_test(ko, static_cast<std::int64_t>(u));
      j << (u ? "," : "") << "{\"name\":" << phasekv::detail::json_string(units[u].name) << ",\"layer\":" << units[u].layer
        << ",\"first_head\":" << units[u].head << ",\"heads\":" << units[u].count << ",\"mean\":" << num(ko.knocked[u].all().mean)
        << ",\"delta_points\":" << num(100.0 * (ko.knocked[u].all().mean - ko.baseline.all().mean))
        << ",\"phase_interaction\":{\"statistic\":" << num(test.statistic) << ",\"dof\":" << test.dof
        << ",\"p\":" << num(test.p_value) << "},\"delta\":[";
      diag::plot::plot_series one;
      one.label = units[u].name;
      for (std::int64_t r = 0; r < ko.modulus; ++r) {
        j << (r ? "," : "") << num(ko.at(static_cast<std::int64_t>(u), r));
        one.points.push_back({double(r), 100.0 * ko.at(static_cast<std::int64_t>(u), r)});
      }
      j << "]}";
      if (units[u].count > 1) ks.push_back(one);
    }
    j << "]}";
    kx.title = label + ": accuracy change when a KV head's query group is knocked out";
    kx.x_label = "Residue of the target key's position (t mod " + std::to_string(d.modulus) + ")";
    kx.y_label = "Change in accuracy (points)";
    kx.x_min = 0;
    kx.x_max = double(d.modulus - 1);
    kx.y_min = -100;
    kx.y_max = 20;
    write_file(out / "knockout.svg", diag::plot::svg_line_plot(ks, kx));
    progress("knockouts done");
  }

  // 5. Write profiles (compressed kinds).
  j << ",\"write_profiles\":[";
  if (cfg.kind != "full") {
    bool any = false;
    for (std::int64_t l = 0; l < cfg.layers; ++l)
      for (int stream = 0; stream < 2; ++stream)
        for (std::int64_t h = 0; h < cfg.kv_heads; ++h) {
          j << (any ? "," : "") << "{\"layer\":" << l << ",\"stream\":\"" << (stream ? "values" : "keys")
            << "\",\"head\":" << h << ",\"profile\":"
            << profile_json(profiles[static_cast<std::size_t>((2 * l + stream) * cfg.kv_heads + h)], d.calibration) << "}";
          any = true;
        }
  }
  j << "]";

  {
    diag::plot::plot_axes ax;
    ax.title = label + ": retrieval accuracy by target residue (t mod " + std::to_string(d.modulus) + ")";
    ax.x_label = "Residue of the target key's position (t mod " + std::to_string(d.modulus) + ")";
    ax.y_label = "Retrieval accuracy (%)";
    ax.open_marker_meaning = "record straddles a block boundary (not joined)";
    ax.filled_marker_meaning = "record within one block";
    ax.x_min = 0;
    ax.x_max = double(d.modulus - 1);
    ax.y_min = 0;
    ax.y_max = 100;
    write_file(out / "sweep.svg", diag::plot::svg_line_plot(plotted, ax));
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
    if (command == "serve") return run_serve(parse(argc, argv, {"--model", "--max-tokens"}, {}));
    if (command == "task") return run_task(parse(argc, argv, {"--model", "--seed", "--target", "--trail"}, {}));
    if (command == "queries") {
      std::vector<std::string> options = measurement_options;
      options.insert(options.end(), {"--input", "--output", "--sweep"});
      return run_queries(parse(argc, argv, options, {}));
    }
    if (command == "plan") {
      std::vector<std::string> options = measurement_options;
      options.insert(options.end(), {"--sweep", "--count"});
      return run_plan(parse(argc, argv, options, {}));
    }
    if (command == "measure") {
      std::vector<std::string> options = measurement_options;
      options.insert(options.end(), {"--out", "--label"});
      return run_measure(parse(argc, argv, options, {"--quiet"}));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lab_host %s: %s\n", command.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "lab_host: '%s' is not a command\n%s", command.c_str(), usage);
  return 2;
}
