#!/usr/bin/python3
"""The lab's pipeline, run by lab/run: for every variant, train → export → check the C++ logits
against PyTorch → measure through phasekv; then the report.

  /usr/bin/python3 lab/pipeline.py --mode full|tiny --out DIR --host build/lab/lab_host
                                   [--only NAME[,NAME…]] [--results lab/RESULTS.md --plots lab/results]

A variant whose train.json already holds the same options is not retrained (delete its folder
to retrain); export, verification and measurement always rerun (they are cheap and
deterministic). Every seed is in the variant table below and in each run's train.json.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"

# ---- the variants ------------------------------------------------------------------------------
# Full lab: the study's family at a size that trains on 2 CPU cores. One width, depth, task and
# optimiser for every variant; only the attention differs. Seeds: training seed 1 for every
# variant (model init and data stream), sweep seed 1.
FULL_COMMON = dict(dim=64, layers=2, q_heads=4, kv_heads=1, head_dim=16, ffn=192, win_tokens=16,
                   tokens=512, start_tokens=128, grow=0.5, records=16, queries=4, filler=16, keys=64, values=64,
                   steps=1500, batch=32, lr=3e-3, warmup=100, seed=1, eval_every=100, eval_sequences=128)
FULL_MEASURE = dict(trials=64, knockout_trials=32, calibration=16, seed=1)
FULL = [  # in priority order: the study's W=8/S=8 comparison first, then the stride series
    dict(name="gated_S8_W8", kind="gated", stride=8, window=8),
    dict(name="mean_S8_W8", kind="mean", stride=8, window=8),
    dict(name="norope_S8_W8", kind="norope", stride=8, window=8),
    dict(name="full_control", kind="full", stride=1, window=1, modulus=16),
    dict(name="gated_S4_W4", kind="gated", stride=4, window=4),
    dict(name="gated_S8_W16", kind="gated", stride=8, window=16),
    dict(name="gated_S4_W8", kind="gated", stride=4, window=8),
    dict(name="gated_S6_W6", kind="gated", stride=6, window=6),
    dict(name="gated_S2_W2", kind="gated", stride=2, window=2),
]

# Tiny (CI): proves the pipeline end to end in about a minute; it does not assert the science.
TINY_COMMON = dict(dim=32, layers=2, q_heads=4, kv_heads=1, head_dim=8, ffn=64, win_tokens=8,
                   tokens=64, start_tokens=64, grow=0.0, records=4, queries=2, filler=8, keys=16, values=16,
                   steps=60, batch=16, lr=3e-3, warmup=10, seed=1, eval_every=30, eval_sequences=32)
TINY_MEASURE = dict(trials=10, knockout_trials=10, calibration=2, seed=1)
TINY = [
    dict(name="full_control", kind="full", stride=1, window=1, modulus=8),
    dict(name="gated_S4_W4", kind="gated", stride=4, window=4),
]


def train_args(v, common):
    opts = dict(common)
    opts.update({k: v[k] for k in ("kind", "stride", "window") if k in v})
    opts.update(v.get("train", {}))
    args = []
    for k, x in opts.items():
        args += ["--" + k.replace("_", "-"), str(x)]
    return opts, args


def same_options(path, opts):
    try:
        with open(path) as f:
            old = json.load(f)["options"]
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return False
    return all(str(old.get(k)) == str(x) for k, x in opts.items() if k != "kind" or old.get(k) is not None)


def run(cmd, log=None):
    print("+ " + " ".join(cmd), flush=True)
    if log is None:
        subprocess.run(cmd, check=True)
    else:
        with open(log, "w") as f:
            subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT)


def main():
    ap = argparse.ArgumentParser(description="lab pipeline")
    ap.add_argument("--mode", choices=("full", "tiny"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--results")
    ap.add_argument("--plots")
    ap.add_argument("--notes")
    ap.add_argument("--command", default="lab/run")
    a = ap.parse_args()
    variants, common, measure = (FULL, FULL_COMMON, FULL_MEASURE) if a.mode == "full" else (TINY, TINY_COMMON, TINY_MEASURE)
    names = [v["name"] for v in variants]
    only = [x for x in a.only.split(",") if x]
    for x in only:
        if x not in names:
            print(f"pipeline.py: --only: no variant '{x}' (have: {', '.join(names)})", file=sys.stderr)
            sys.exit(2)
    chosen = [v for v in variants if not only or v["name"] in only]
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    budget = (f"{common['steps']} steps of batch {common['batch']} per model (context {common['start_tokens']}→"
              f"{common['tokens']} tokens), {measure['trials']} sweep trials per residue, "
              f"{measure['knockout_trials']} per residue for each knocked-out head; 1 torch thread, nice 10")
    record = {"command": a.command, "mode": a.mode, "date": datetime.date.today().isoformat(),
              "machine": f"{os.cpu_count()} cores, {platform.machine()}, torch threads 1",
              "budget": budget, "common": common, "measure": measure, "variants": variants}
    for v in chosen:
        d = os.path.join(a.out, v["name"])
        os.makedirs(d, exist_ok=True)
        opts, targs = train_args(v, common)
        t = time.time()
        if same_options(os.path.join(d, "train.json"), opts) and os.path.exists(os.path.join(d, "model.pt")):
            print(f"== {v['name']}: trained already (same options), not retraining", flush=True)
        else:
            print(f"== {v['name']}: training", flush=True)
            run([PY, os.path.join(HERE, "train.py"), "--out", d] + targs, log=os.path.join(d, "train.log"))
        with open(os.path.join(d, "train.json")) as f:
            tr = json.load(f)
        print(f"   held-out accuracy {100 * tr['final_heldout_last']:.1f}% after {tr['seconds']} s", flush=True)
        run([PY, os.path.join(HERE, "export.py"), "--model", os.path.join(d, "model.pt"), "--out", os.path.join(d, "export")])
        run([PY, os.path.join(HERE, "verify.py"), "--model", os.path.join(d, "model.pt"), "--export",
             os.path.join(d, "export"), "--host", a.host, "--sequences", "4", "--json", os.path.join(d, "verify.json")])
        margs = [a.host, "measure", "--model", os.path.join(d, "export"), "--out", os.path.join(d, "measure"),
                 "--label", v["name"], "--trials", str(measure["trials"]), "--knockout-trials",
                 str(measure["knockout_trials"]), "--calibration", str(measure["calibration"]), "--seed",
                 str(measure["seed"]), "--quiet"]
        if "modulus" in v:
            margs += ["--modulus", str(v["modulus"])]
        run(margs)
        with open(os.path.join(d, "measure", "measure.json")) as f:
            me = json.load(f)
        sw = me["sweep"]
        print(f"   sweep: mean {100 * sw['mean']:.1f}%, gap {sw['gap_points']:.1f} points, "
              f"p = {sw['homogeneity']['p_value']:.2g}; {time.time() - t:.0f} s for this variant", flush=True)
        report(a, record, t0, only, done=False)  # a partial run still leaves an honest report
    report(a, record, t0, only, done=True)


def report(a, record, t0, only, done):
    record["seconds"] = round(time.time() - t0)
    record["finished"] = done
    if only:
        record["seconds"] = f"{record['seconds']} (this invocation: {','.join(only)})"
    with open(os.path.join(a.out, "runs.json"), "w") as f:
        json.dump(record, f, indent=1)
    results = a.results or os.path.join(a.out, "RESULTS.md")
    rargs = [PY, os.path.join(HERE, "report.py"), "--runs", a.out, "--out", results,
             "--plots", a.plots or os.path.join(a.out, "plots")]
    if a.notes:
        rargs += ["--notes", a.notes]
    if a.mode == "tiny":
        rargs += ["--title", "phasekv lab, tiny CI run (proves the pipeline; not a scientific result)"]
    run(rargs)
    print(f"lab: report in {results} ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
