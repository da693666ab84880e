#!/usr/bin/python3
"""Checks that the C++ host (phasekv) computes the same logits as PyTorch for an exported model.

  /usr/bin/python3 lab/verify.py --model DIR/model.pt --export DIR/export --host build/lab/lab_host
                                 [--sequences N] [--placements N] [--origin-shifts 0,4]
                                 [--measure-args "..."] [--tolerance 1e-4] [--json FILE]

Two checks, each failing (exit 1) if max |torch − phasekv| > tolerance · max(1, max |torch|) — the
project's convention (bench/peer compares to 1e-4 relative to the largest output):
  1. N held-out sequences of the model's own task (seeds 2^63 + 2^60 + i, never used in
     training), the logits at every position (`lab_host logits`);
  2. the measurement's own path: the first --placements placements of each sweep's plan
     (`lab_host plan`: forced target, jittered query, the sweep's placement of the other records),
     read at the query alone by the function a sweep trial calls (`lab_host queries`), against
     the model in torch at the same positions — at every origin shift given (the head origins
     moved as a measurement at another origin moves them; torch's origin_offsets). A trained model's logits reach ~10 and its
attention is sharp, so fp32 rounding differences of the two implementations grow with them;
the report gives the absolute figure too, and the distance of each fp32 implementation from the
same model evaluated in float64 (both are rounding, if they are about equally far).
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export import load  # noqa: E402
from task import TaskConfig, generate  # noqa: E402

VERIFY_SEEDS = (1 << 63) + (1 << 60)


def host_logits(host, export_dir, sequences):
    """Logits [count, length, vocab] from `lab_host logits` for int sequences of equal length."""
    seqs = np.asarray(sequences, dtype="<i4")
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
        with open(src, "wb") as f:
            f.write(np.array(seqs.shape, dtype="<i4").tobytes())
            f.write(seqs.tobytes())
        subprocess.run([host, "logits", "--model", export_dir, "--input", src, "--output", dst], check=True)
        out = np.fromfile(dst, dtype="<f4")
    return out.reshape(seqs.shape[0], seqs.shape[1], -1)


def compare(model, task, export_dir, host, count=4, float64=False):
    """max |torch − phasekv| and max |torch| over `count` held-out sequences, every position
    (with float64: also max |torch − torch64| and max |phasekv − torch64|)."""
    tk = TaskConfig(**task)
    seqs = [generate(tk, VERIFY_SEEDS + i).tokens for i in range(count)]
    with torch.no_grad():
        ref = model(torch.tensor(seqs)).numpy()
    got = host_logits(host, export_dir, seqs)
    if not float64:
        return float(np.abs(ref - got).max()), float(np.abs(ref).max())
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(torch.tensor(seqs)).numpy()
    return (float(np.abs(ref - got).max()), float(np.abs(ref).max()), float(np.abs(ref - exact).max()),
            float(np.abs(got - exact).max()))


def planned_queries(model, export_dir, host, sweep, count, origin_shift=0, measure_args=()):
    """max |torch − phasekv| and max |torch| at the queries of the first `count` placements of a sweep."""
    common = ["--model", export_dir, "--sweep", sweep, "--origin-shift", str(origin_shift), *measure_args]
    lines = subprocess.run([host, "plan", *common, "--count", str(count)], check=True, capture_output=True,
                           text=True).stdout.splitlines()
    if not lines or not lines[0].startswith("task "):
        raise RuntimeError(f"lab_host plan printed no task line: {lines[:1]}")
    task = TaskConfig(**json.loads(lines[0][len("task "):]))
    trials = [tuple(int(v) for v in line.split()) for line in lines[1:]]
    seqs = [generate(task, seed, target, trail) for seed, target, trail in trials]
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.txt"), os.path.join(tmp, "out.bin")
        with open(src, "w") as f:
            f.write("".join(f"{seed} {target} {trail}\n" for seed, target, trail in trials))
        subprocess.run([host, "queries", *common, "--input", src, "--output", dst], check=True)
        got = np.fromfile(dst, dtype="<f4").reshape(len(trials), -1)
    with torch.no_grad():
        toks = torch.tensor([s.tokens for s in seqs])
        pos = torch.tensor([[s.query_position] for s in seqs])
        offsets = torch.full((len(seqs),), origin_shift, dtype=torch.long)
        ref = model(toks, positions=pos, origin_offsets=offsets)[:, 0].numpy()
    return float(np.abs(ref - got).max()), float(np.abs(ref).max())


def main():
    ap = argparse.ArgumentParser(description="C++ (phasekv) logits against PyTorch")
    ap.add_argument("--model", required=True)
    ap.add_argument("--export", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--placements", type=int, default=16)
    ap.add_argument("--sweeps", default="uniform,isolated")
    ap.add_argument("--origin-shifts", default="0")
    ap.add_argument("--measure-args", default="")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--json")
    a = ap.parse_args()

    def bad(option, message):
        ap.print_usage(sys.stderr)
        print(f"verify.py: {option}: {message}", file=sys.stderr)
        sys.exit(2)

    if a.sequences < 1:
        bad("--sequences", "must be at least 1")
    if a.placements < 0:
        bad("--placements", "must be at least 0")
    try:
        shifts = [int(x) for x in a.origin_shifts.split(",") if x]
    except ValueError:
        bad("--origin-shifts", f"'{a.origin_shifts}' is not a comma-separated list of integers")
    for opt, path in (("--model", a.model), ("--host", a.host)):
        if not os.path.isfile(path):
            ap.print_usage(sys.stderr)
            print(f"verify.py: {opt}: no such file: {path}", file=sys.stderr)
            sys.exit(2)
    torch.set_num_threads(1)
    model, task = load(a.model)
    diff, scale, torch_err, host_err = compare(model, task, a.export, a.host, a.sequences, float64=True)
    ok = diff <= a.tolerance * max(1.0, scale)
    placements = []
    if a.placements:
        for sweep in [x for x in a.sweeps.split(",") if x]:
            for shift in shifts:
                d, sc = planned_queries(model, a.export, a.host, sweep, a.placements, shift, a.measure_args.split())
                good = d <= a.tolerance * max(1.0, sc)
                ok = ok and good
                placements.append({"sweep": sweep, "origin_shift": shift, "placements": a.placements,
                                   "max_abs_diff": d, "max_abs_logit": sc, "ok": good})
    result = {"sequences": a.sequences, "tokens": task["tokens"], "max_abs_diff": diff, "max_abs_logit": scale,
              "relative_diff": diff / max(1.0, scale), "torch_fp32_vs_fp64": torch_err,
              "phasekv_fp32_vs_fp64": host_err, "tolerance": a.tolerance, "criterion": "max_abs_diff <= tolerance * max(1, max_abs_logit)",
              "planned_queries": placements, "ok": ok}
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
