#!/usr/bin/python3
"""Writes the lab's report (RESULTS.md) from the runs lab/run left in its output folder.

  /usr/bin/python3 lab/report.py --runs OUT --out lab/RESULTS.md [--plots lab/results] [--title T]
                                 [--notes FILE] [--learned X]

Reads OUT/runs.json (the variants, seeds and budget lab/run ran) and, per variant and seed,
OUT/NAME/seedK/{train.json, verify.json, measure/measure.json, measure_originO/measure.json}.
Across seeds a figure is its mean with a 95% Student-t interval (n − 1 degrees of freedom; none
with one seed); p-values are listed per seed. Numbers are printed as measured; nothing is
adjusted. A run *learned* the task when its held-out accuracy on the last question is at least
--learned (default LEARNED) times its record floor; the phase tables use the runs that learned (a run at its floor has
no retrieval whose phase could matter) and say how many of the seeds that is, and the training table
lists every run. Copies the first learned seed's plots to --plots (NAME_sweep.svg, NAME_knockout.svg).
--notes appends a hand-written section (the reading of the tables) after them.
"""

import argparse
import csv
import json
import math
import os
import shutil
import statistics
import sys

import numpy as np

# Student t quantiles t_{0.975, dof} for the across-seed intervals.
# A run learned when held-out (last question) >= LEARNED x its record floor (~13%, so >= ~26%).
LEARNED = 2.0

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def finite(x):
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def across(values, scale=1.0, nd=1):
    """'mean [low, high]' over seeds (a t interval), or the single value, or —."""
    v = [scale * x for x in values if finite(x)]
    if not v:
        return "—"
    m = statistics.fmean(v)
    if len(v) == 1:
        return f"{m:.{nd}f}"
    h = T975.get(len(v) - 1, 1.96) * statistics.stdev(v) / math.sqrt(len(v))
    return f"{m:.{nd}f} [{m - h:.{nd}f}, {m + h:.{nd}f}]"


def mean(values, scale=1.0, nd=1):
    v = [scale * x for x in values if finite(x)]
    return f"{statistics.fmean(v):.{nd}f}" if v else "—"


def ps(values):
    """Per-seed p-values, e.g. '0.003 / 0.2 / 0.04'."""
    return " / ".join(f"{p:.2g}" if finite(p) else "—" for p in values) or "—"


def chi2_sf(x, dof):
    """P(X >= x) for X ~ chi-square(dof): the regularised upper incomplete gamma Q(dof/2, x/2), by its
    series below a + 1 and its continued fraction above (both converge fast there)."""
    a, z = dof / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:  # P(a, z) = e^-z z^a / Γ(a) · Σ z^n / (a (a+1) … (a+n))
        term = total = 1.0 / a
        n = 0
        while abs(term) > 1e-15 * abs(total) and n < 10000:
            n += 1
            term *= z / (a + n)
            total += term
        return max(0.0, 1.0 - math.exp(log_front) * total)
    # Q(a, z) = e^-z z^a / Γ(a) · 1 / (z + 1 − a − 1·(1 − a) / (z + 3 − a − …)), by Lentz's method
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def wilson(k, n, z=1.96):
    """The Wilson score interval of k successes in n trials."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def homogeneity(counts):
    """Pearson's chi-square test that every phase has one success rate: (statistic, dof, p)."""
    counts = [(k, n) for k, n in counts if n > 0]
    K, N = sum(k for k, _ in counts), sum(n for _, n in counts)
    if len(counts) < 2 or K in (0, N):
        return 0.0, max(0, len(counts) - 1), 1.0
    p = K / N
    x = sum((k - n * p) ** 2 / (n * p * (1 - p)) for k, n in counts)
    return x, len(counts) - 1, chi2_sf(x, len(counts) - 1)


def pooled_phases(runs_of_group, sweep_name):
    """Per within-window phase: successes and trials summed over the runs (each run plans the same
    number of trials at every residue, so run-to-run differences weigh every phase alike)."""
    per = {}
    for r in runs_of_group:
        sw = r.sweep(sweep_name)
        for x in (sw or {}).get("residues", []):
            if x["layout"] == "contained" and x["valid"]:
                k, n = per.get(x["phase"], (0, 0))
                per[x["phase"]] = (k + x["successes"], n + x["valid"])
    return dict(sorted(per.items()))


def wall_time(meta):
    """runs.json's seconds: a number for one invocation, or a sentence where the runs took several."""
    t = meta.get("seconds")
    return (f"{t} s" if finite(t) else str(t)) + ("" if meta.get("finished") else " (unfinished)")


def fit_logit(X, y):
    """Maximum-likelihood logistic regression by Newton's method: (coefficients, log-likelihood,
    covariance). No penalty: the pooled fits hold thousands of trials and no separated column."""
    b = np.zeros(X.shape[1])
    for _ in range(100):
        p = 1 / (1 + np.exp(-(X @ b)))
        H = X.T @ (X * (p * (1 - p))[:, None])
        step = np.linalg.solve(H, X.T @ (y - p))
        b += step
        if np.abs(step).max() < 1e-10:
            break
    p = np.clip(1 / (1 + np.exp(-(X @ b))), 1e-300, 1 - 1e-16)
    ll = float(np.sum(y * np.log(p) + (1 - y) * np.log1p(-p)))
    return b, ll, np.linalg.inv(X.T @ (X * (p * (1 - p))[:, None]))


def pooled_phase_logit(trials, phases):
    """Within-window trials (run, phase, crowding, distance, success) of several runs: a logistic fit
    of success on a constant per run, crowding, distance / 100 and the phases (the first the
    reference). Returns ({phase: (log-odds, 95% half-width)}, likelihood-ratio p of the phase terms)
    or None when a column is constant or the fit is singular."""
    runs = sorted({t[0] for t in trials})
    y = np.array([t[4] for t in trials], float)
    if len(trials) == 0 or y.min() == y.max() or len(phases) < 2:
        return None
    base = np.array([[1.0 if t[0] == r else 0.0 for r in runs] + [t[2], t[3] / 100] for t in trials])
    dummies = np.array([[1.0 if t[1] == ph else 0.0 for ph in phases[1:]] for t in trials])
    if np.ptp(base[:, -2]) == 0 or np.ptp(base[:, -1]) == 0 or (dummies.sum(0) == 0).any():
        return None
    try:
        with np.errstate(over="ignore"):
            b, ll1, cov = fit_logit(np.hstack([base, dummies]), y)
            _, ll0, _ = fit_logit(base, y)
    except np.linalg.LinAlgError:  # a singular information matrix: the data cannot identify a term
        return None
    if not (np.isfinite(b).all() and np.isfinite(cov).all()):
        return None
    k = base.shape[1]
    terms = {ph: (float(b[k + i]), 1.96 * math.sqrt(cov[k + i, k + i])) for i, ph in enumerate(phases[1:])}
    return terms, chi2_sf(max(0.0, 2 * (ll1 - ll0)), len(phases) - 1)


def contained_trials(d, index, sweep_name="uniform"):
    """(index, phase, crowding, distance, success) of a run's within-window trials, from its CSV."""
    out = []
    try:
        with open(os.path.join(d, "measure", f"{sweep_name}_trials.csv")) as f:
            for r in csv.DictReader(f):
                if r["straddle"] == "0":
                    out.append((index, int(r["phase"]), int(r["crowding"]), int(r["distance"]), int(r["success"])))
    except (FileNotFoundError, KeyError, ValueError):
        return []
    return out


def profile(sweep, name):
    for p in sweep.get("profiles", []):
        if p["name"] == name:
            return p
    return None


def layout_accuracy(sweep, straddle):
    """Accuracy over the trials whose record straddles a boundary (or not)."""
    ok = n = 0
    for l in sweep.get("layouts", []):
        if (l["layout"] != "contained") == straddle and l["valid"]:
            ok += l["successes"]
            n += l["valid"]
    return ok / n if n else None


class Run:
    def __init__(self, d):
        self.dir = d
        self.train = load(os.path.join(d, "train.json")) or {}
        self.verify = load(os.path.join(d, "verify.json")) or {}
        self.measure = load(os.path.join(d, "measure", "measure.json")) or {}
        self.shifted = {}
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            if name.startswith("measure_origin"):
                m = load(os.path.join(d, name, "measure.json"))
                if m:
                    self.shifted[int(name[len("measure_origin"):])] = m

    def sweep(self, name="uniform"):
        return ((self.measure.get("sweeps") or {}).get(name) or {}).get("sweep")

    def logistic(self, name="uniform"):
        return ((self.measure.get("sweeps") or {}).get(name) or {}).get("logistic") or {}

    def ok(self):
        return bool(self.train) and bool(self.measure)

    def learned(self, factor=LEARNED):
        acc, floor = self.train.get("final_heldout_last"), self.train.get("floor_record")
        return finite(acc) and finite(floor) and acc >= factor * floor


def gap_of(sweep, prof, field="debiased_gap"):
    p = profile(sweep, prof) if sweep else None
    return p[field]["points"] if p and p.get(field) else None


def phase_p(sweep, prof):
    p = profile(sweep, prof) if sweep else None
    return p["phase_test"]["p_value"] if p else None


def main():
    ap = argparse.ArgumentParser(description="the lab's report")
    ap.add_argument("--runs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--plots")
    ap.add_argument("--title", default="phasekv lab: trained models measured by phase")
    ap.add_argument("--notes")
    ap.add_argument("--learned", type=float, default=LEARNED,
                    help="a run learned at this multiple of its record floor (0: every run counts)")
    a = ap.parse_args()
    if not (a.learned >= 0 and math.isfinite(a.learned)):
        print(f"report.py: --learned: {a.learned} is not a finite number >= 0", file=sys.stderr)
        sys.exit(2)
    meta = load(os.path.join(a.runs, "runs.json"))
    if meta is None:
        print(f"report.py: --runs: no runs.json in {a.runs}", file=sys.stderr)
        sys.exit(2)
    variants = meta["variants"]
    trained, runs = {}, {}  # every finished run; the runs that learned the task
    for v in variants:
        seeds = v.get("seeds", meta["seeds"])
        got = [(s, Run(os.path.join(a.runs, v["name"], f"seed{s}"))) for s in seeds]
        got = [(s, r) for s, r in got if r.ok()]
        if got:
            trained[v["name"]] = got
            learned = [(s, r) for s, r in got if r.learned(a.learned)]
            if learned:
                runs[v["name"]] = learned
    common = meta["common"]
    L = []
    w = L.append
    w(f"# {a.title}\n")
    w("Generated by `lab/report.py` from the runs of `" + meta["command"] + "`; every figure below is as measured, "
      "nothing is tuned toward the study's. Each variant is trained and measured once per seed "
      f"(seeds {', '.join(map(str, meta['seeds']))} unless the row says otherwise; the seed also draws the "
      "sweep's content). Across the seeds that learned the task: mean [95% Student-t interval]; p-values per seed.\n")
    w(f"Budget: width {common['dim']}, {common['layers']} layers, {common['q_heads']} query heads over "
      f"{common['kv_heads']} KV heads of {common['head_dim']} channels, raw window {common['win_tokens']}, "
      f"RoPE base {common['rope_base']:g}; {common['steps']} steps of batch {common['batch']} "
      f"({common['short_steps']} of them at {common['short_tokens']} tokens), lr {common['lr']}; task: "
      f"{common['tokens']} tokens, {common['records']} records, {common['queries']} questions, "
      f"{common['decoys']} decoys, 0–{common['trail']} trailing filler tokens. Machine: {meta['machine']}. "
      f"Wall time: {wall_time(meta)}.\n")

    w("## Training: which runs learned the task\n")
    w(f"Held-out accuracy on the last question (%) per seed, at the end of training; a run learned the task when "
      f"it reaches {a.learned:g}× its record floor. The tables after this one use the runs that learned; a run that "
      "did not stayed on the plateau where the model predicts a value without finding the record (its phase "
      "profile is flat at the floor and says nothing about phase).\n")
    w("| variant | seeds learned | held-out % per seed (record floor %) | first step at ≥ 50% held-out (per seed) |")
    w("|---|---|---|---|")
    for v in variants:
        rr = trained.get(v["name"])
        if not rr:
            w(f"| {v['name']} | not run | | |")
            continue

        def first50(r):
            for e in r.train.get("log") or []:
                if finite(e.get("heldout_last")) and e["heldout_last"] >= 0.5:
                    return str(e["step"])
            return "never"
        w(f"| {v['name']} | {sum(r.learned(a.learned) for _, r in rr)} of {len(rr)} | "
          + " / ".join(f"seed {s}: {100 * r.train['final_heldout_last']:.1f} ({100 * r.train['floor_record']:.1f})"
                       + ("" if r.learned(a.learned) else " plateau") for s, r in rr)
          + f" | {' / '.join(first50(r) for _, r in rr)} |")
    w("")

    w("## Retrieval and the phase profile\n")
    w("Floors: the last question's answer by guessing among the records' values (record) and among every "
      "value in the context (any). *Within* = trials whose record lies inside one block of the analysis "
      "stride (the within-window test); *straddle* = trials whose record crosses a boundary. Debiased gap: "
      "the best and worst residue chosen on half the trials and measured on the other half (points); "
      "within-window p: the permutation test of the phase fold over within-window residues; logistic p: the "
      "likelihood-ratio test of the within-window phase terms in a Firth logistic fit with straddle, crowding "
      "and distance as covariates.\n")
    w("| variant | seeds | floor % (record / any) | held-out % | sweep % | within % | straddle % | within-window gap | "
      "within-window p | logistic phase p | all-residue gap | period | isolated within-window gap | isolated p | study gap |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for v in variants:
        if v["name"] not in runs:
            w(f"| {v['name']} | {'no seed learned' if v['name'] in trained else 'not run'} | | | | | | | | | | | | | |")
            continue
        rs = [r for _, r in runs[v["name"]]]
        sw = [r.sweep() for r in rs]
        iso = [r.sweep("isolated") for r in rs]
        periods = sorted({str(s["dominant_period"]["period"]) for s in sw if s and s["dominant_period"]["period"]})
        floors = f"{mean([r.train.get('floor_record') for r in rs], 100)} / {mean([r.train.get('floor_any') for r in rs], 100)}"
        w(f"| {v['name']} | {', '.join(str(s) for s, _ in runs[v['name']])} | {floors} | {across([r.train.get('final_heldout_last') for r in rs], 100)} | "
          f"{across([s and s['mean'] for s in sw], 100)} | {mean([layout_accuracy(s, False) for s in sw], 100)} | "
          f"{mean([layout_accuracy(s, True) for s in sw], 100)} | {across([gap_of(s, 'contained') for s in sw])} | "
          f"{ps([phase_p(s, 'contained') for s in sw])} | "
          f"{ps([(r.logistic().get('phase_test') or {}).get('p') for r in rs])} | "
          f"{across([gap_of(s, 'all') for s in sw])} | {', '.join(periods) or 'none'} | "
          f"{across([gap_of(s, 'contained') for s in iso])} | {ps([phase_p(s, 'contained') for s in iso])} | "
          f"{v.get('study', '—')} |")
    w("")

    groups = {}  # stride -> the runs that learned of its W = S variants with one grid
    for v in variants:
        m = v.get("train", {})
        plain_geometry = not any(m.get(k) for k in ("layer_stagger", "head_stagger", "random_origin", "token_shift"))
        if (v["name"] in runs and m.get("kind") != "full" and m.get("stride", 1) > 1 and m.get("window") == m.get("stride")
                and plain_geometry):
            groups.setdefault(m["stride"], []).extend(r for _, r in runs[v["name"]])
    if groups:
        w("## Within the window, pooled over runs\n")
        w("Every W = S model that learned, mitigations aside (all variants and seeds of the stride, one origin for "
          "every layer and head, as trained): the "
          "within-window trials of each phase summed over runs, with Wilson 95% intervals, and Pearson's "
          "chi-square test that all phases share one rate (each run plans as many trials at every phase, so "
          "runs weigh every phase alike; the test is conservative when runs differ). The main sweep has crowding; "
          "the isolated sweep has none. A within-window phase effect as large as an interval's half-width at one "
          "phase would show here.\n")
        w("| S | sweep | runs | trials per phase | accuracy % per phase [95%] | largest − smallest (points) | chi-square p |")
        w("|---|---|---|---|---|---|---|")
        for S, rs in sorted(groups.items()):
            for sweep_name in ("uniform", "isolated"):
                per = pooled_phases(rs, sweep_name)
                if not per:
                    continue
                _, _, p = homogeneity(list(per.values()))
                rates = [k / n for k, n in per.values()]
                cells = []
                for phase, (k, n) in per.items():
                    lo, hi = wilson(k, n)
                    cells.append(f"{phase}: {100 * k / n:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]")
                w(f"| {S} | {'main' if sweep_name == 'uniform' else 'isolated'} | {len(rs)} | "
                  f"{min(n for _, n in per.values())} | {'; '.join(cells)} | {100 * (max(rates) - min(rates)):.1f} | "
                  f"{p:.2g} |")
        w("")
        w("The same main-sweep trials in one logistic fit: a constant per run, crowding and distance / 100 held, "
          "the within-window phases as terms (phase 0 the reference; log-odds with 95% Wald half-widths) and the "
          "likelihood-ratio test of the phase terms. This is the within-window test with the confounds the lab "
          "can name taken out.\n")
        w("| S | runs | trials | phase terms, log-odds ± 95% | likelihood-ratio p |")
        w("|---|---|---|---|---|")
        for S, rs in sorted(groups.items()):
            trials = [t for i, r in enumerate(rs) for t in contained_trials(r.dir, i)]
            fit = pooled_phase_logit(trials, sorted({t[1] for t in trials}))
            if fit is None:
                w(f"| {S} | {len(rs)} | {len(trials)} | no fit (a constant column or a singular fit) | — |")
                continue
            terms, p = fit
            w(f"| {S} | {len(rs)} | {len(trials)} | "
              + "; ".join(f"{ph}: {est:+.2f} ± {half:.2f}" for ph, (est, half) in terms.items()) + f" | {p:.2g} |")
        w("")

    w("## What else explains a failure: the logistic fit\n")
    w("Coefficients (log-odds; mean over seeds, with the seeds whose Wald p < 0.05) of a Firth logistic fit of "
      "each main-sweep trial's success on: straddle (the record crosses a block boundary), crowding (other "
      "records and decoys among the tokens the target's entries pool), distance to the query (per 100 tokens) "
      "and the within-window phases (phase 0 the reference).\n")
    w("| variant | straddle | crowding | distance / 100 | phase terms (LR p per seed) |")
    w("|---|---|---|---|---|")
    for v in variants:
        if v["name"] not in runs:
            continue
        rs = [r for _, r in runs[v["name"]]]

        def coef(name):
            vals = [((r.logistic().get("coefficients") or {}).get(name) or {}) for r in rs]
            sig = sum(1 for c in vals if finite(c.get("p")) and c["p"] < 0.05)
            return f"{mean([c.get('estimate') for c in vals], 1, 2)} ({sig}/{len(vals)})"
        w(f"| {v['name']} | {coef('straddle')} | {coef('crowding')} | {coef('distance_per_100')} | "
          f"{ps([(r.logistic().get('phase_test') or {}).get('p') for r in rs])} |")
    w("")

    shifted = [(v, runs[v["name"]]) for v in variants if v["name"] in runs and len(v.get("origin_shifts", (0,))) > 1]
    if shifted:
        w("## Measured at other origins\n")
        w("The same trained model measured with every compressor origin moved by the shift (the analysis grid "
          "moves with it). Worst residue: the residue mod the analysis stride where accuracy is lowest, in "
          "absolute positions; a dip that is the block boundary follows the shift.\n")
        w("| variant | origin shift | sweep % | within % | straddle % | all-residue gap | worst residue mod S (per seed) |")
        w("|---|---|---|---|---|---|---|")
        for v, rr in shifted:
            for shift in v["origin_shifts"]:
                ms = [r.measure if shift == 0 else r.shifted.get(shift) for _, r in rr]
                sw = [((m or {}).get("sweeps") or {}).get("uniform", {}).get("sweep") for m in ms]
                S = (ms[0] or {}).get("analysis_stride", 1)
                worst = " / ".join(str(s["worst_residue"] % S) if s and s["worst_residue"] >= 0 else "—" for s in sw)
                w(f"| {v['name']} | {shift} | {across([s and s['mean'] for s in sw], 100)} | "
                  f"{mean([s and layout_accuracy(s, False) for s in sw], 100)} | "
                  f"{mean([s and layout_accuracy(s, True) for s in sw], 100)} | "
                  f"{across([gap_of(s, 'all') for s in sw])} | {worst} |")
        w("")

    w("## Heads: knockouts and the head × phase test\n")
    w("Each query head, and each KV head's query group, replaced by its mean output over calibration sequences; "
      "the knockout's cost in points (largest over units, mean over seeds) and the head × phase interaction test "
      "(likelihood ratio of phase × knockout terms in a logistic fit): the units with p below 0.05 / units "
      "(Bonferroni), per seed.\n")
    w("| variant | largest cost (points) | unit | phase-specialised units (per seed) |")
    w("|---|---|---|---|")
    for v in variants:
        if v["name"] not in runs:
            continue
        rs = [r for _, r in runs[v["name"]]]
        worst_cost, worst_unit, special = [], "—", []
        for r in rs:
            units = (r.measure.get("knockout") or {}).get("units") or []
            if not units:
                continue
            u = min(units, key=lambda x: x["delta_points"] if finite(x["delta_points"]) else 0)
            worst_cost.append(u["delta_points"])
            worst_unit = u["name"]
            alpha = 0.05 / len(units)
            special.append(str(sum(1 for x in units if finite(x["phase_interaction"]["p"]) and x["phase_interaction"]["p"] < alpha)))
        w(f"| {v['name']} | {across(worst_cost)} | {worst_unit} (seed {runs[v['name']][-1][0]}) | {' / '.join(special) or '—'} |")
    w("")

    gated = [v for v in variants if v["name"] in runs and v.get("train", {}).get("kind") in ("gated", "norope")]
    if gated:
        w("## Gates during training\n")
        w("Static concentration exp(H(E[α])) (of W; W = uniform) and the slot-bias norm ‖b − mean over slots‖ (the "
          "bias's preference for some slots), layer 0's value gates, mean over KV heads and seeds: at the first "
          "evaluation and at the end.\n")
        w("| variant | W | static concentration, first → last | slot-bias norm, first → last |")
        w("|---|---|---|---|")
        for v in gated:
            rs = [r for _, r in runs[v["name"]]]

            def at(index, field):
                vals = []
                for r in rs:
                    log = r.train.get("log") or []
                    if not log:
                        continue
                    for g in log[index].get("gates", []):
                        if g["layer"] == 0 and g["stream"] == "values":
                            x = g[field]
                            vals.append(statistics.fmean(x) if isinstance(x, list) else x)
                return mean(vals, 1, 2)
            w(f"| {v['name']} | {rs[0].train['model']['window']} | {at(0, 'static_concentration')} → "
              f"{at(-1, 'static_concentration')} | {at(0, 'bias_slot_norm')} → {at(-1, 'bias_slot_norm')} |")
        w("")

    w("## Parity of the measured path\n")
    worst_seq = worst_plan = 0.0
    n_plan = 0
    bad = []
    for name, rr in trained.items():
        for s, r in rr:
            if not r.verify:
                bad.append(f"{name} seed {s}: not verified")
                continue
            worst_seq = max(worst_seq, r.verify["relative_diff"])
            for p in r.verify.get("planned_queries", []):
                worst_plan = max(worst_plan, p["max_abs_diff"] / max(1.0, p["max_abs_logit"]))
                n_plan += p["placements"]
            if not r.verify.get("ok"):
                bad.append(f"{name} seed {s}")
    w(f"Every run's logits through phasekv against PyTorch, relative to max(1, max |logit|): held-out sequences at "
      f"every position, worst {worst_seq:.1e}; the sweeps' own query path on {n_plan} planned placements "
      f"(forced targets, jittered queries, every origin measured), worst {worst_plan:.1e}; criterion 1e-4. "
      + (f"Failed: {', '.join(bad)}." if bad else "All passed.") + "\n")

    if a.plots:
        os.makedirs(a.plots, exist_ok=True)
        w("## Plots (the first seed that learned)\n")
        for v in variants:
            rr = runs.get(v["name"])
            if not rr:
                continue
            s, r = rr[0]
            src = os.path.join(a.runs, v["name"], f"seed{s}", "measure")
            links = []
            for kind in ("sweep", "knockout"):
                f = os.path.join(src, f"{kind}.svg")
                if os.path.exists(f):
                    dst = os.path.join(a.plots, f"{v['name']}_{kind}.svg")
                    shutil.copyfile(f, dst)
                    links.append(f"[{kind}]({os.path.relpath(dst, os.path.dirname(os.path.abspath(a.out)))})")
            w(f"- {v['name']}: {', '.join(links)}")
        w("")

    if a.notes and os.path.exists(a.notes):
        with open(a.notes) as f:
            w(f.read())
    with open(a.out, "w") as f:
        f.write("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
