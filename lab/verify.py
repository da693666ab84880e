#!/usr/bin/python3
"""Checks that the C++ host (phasekv) computes the same logits as PyTorch for an exported model.

  /usr/bin/python3 lab/verify.py --model DIR/model.pt --export DIR/export --host build/lab/lab_host
                                 [--sequences N] [--tolerance 1e-4] [--json FILE]

Runs N held-out sequences of the model's own task (seeds 2^63 + 2^60 + i, never used in
training) through both, compares the logits at every position and exits 1 if
max |torch − phasekv| > tolerance · max(1, max |torch|) — the project's convention (bench/peer
compares to 1e-4 relative to the largest output). A trained model's logits reach ~10 and its
attention is sharp, so fp32 rounding differences of the two implementations grow with them;
the report gives the absolute figure too, and the distance of each fp32 implementation from the
same model evaluated in float64 (both are rounding, if they are about equally far).
"""
import copy

import argparse
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


def compare(model, task, export_dir, host, count=4, tokens=None, float64=False):
    """max |torch − phasekv| and max |torch| over `count` held-out sequences, every position
    (with float64: also max |torch − torch64| and max |phasekv − torch64|)."""
    tk = TaskConfig(**task)
    if tokens is not None:
        tk = tk.with_(tokens=tokens, records=min(tk.records, max(tk.queries, tokens // 16)))
    seqs = [generate(tk, VERIFY_SEEDS + i)[0] for i in range(count)]
    with torch.no_grad():
        ref = model(torch.tensor(seqs)).numpy()
    got = host_logits(host, export_dir, seqs)
    if not float64:
        return float(np.abs(ref - got).max()), float(np.abs(ref).max())
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(torch.tensor(seqs)).numpy()
    return (float(np.abs(ref - got).max()), float(np.abs(ref).max()), float(np.abs(ref - exact).max()),
            float(np.abs(got - exact).max()))


def main():
    ap = argparse.ArgumentParser(description="C++ (phasekv) logits against PyTorch")
    ap.add_argument("--model", required=True)
    ap.add_argument("--export", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.sequences < 1:
        ap.print_usage(sys.stderr)
        print("verify.py: --sequences: must be at least 1", file=sys.stderr)
        sys.exit(2)
    for opt, path in (("--model", a.model), ("--host", a.host)):
        if not os.path.isfile(path):
            ap.print_usage(sys.stderr)
            print(f"verify.py: {opt}: no such file: {path}", file=sys.stderr)
            sys.exit(2)
    torch.set_num_threads(1)
    model, task = load(a.model)
    diff, scale, torch_err, host_err = compare(model, task, a.export, a.host, a.sequences, float64=True)
    ok = diff <= a.tolerance * max(1.0, scale)
    result = {"sequences": a.sequences, "tokens": task["tokens"], "max_abs_diff": diff, "max_abs_logit": scale,
              "relative_diff": diff / max(1.0, scale), "torch_fp32_vs_fp64": torch_err,
              "phasekv_fp32_vs_fp64": host_err, "tolerance": a.tolerance, "criterion": "max_abs_diff <= tolerance * max(1, max_abs_logit)",
              "ok": ok}
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
