#!/usr/bin/python3
"""Writes a trained lab model in the lab's export format (lab/README.md, "Export format").

  /usr/bin/python3 lab/export.py --model DIR/model.pt --out DIR/export

DIR/export/model.txt is a line-based manifest: the magic line "phasekv-lab-model 2", then
"key value" lines for the model and task configuration, then one "tensor NAME DIM…" line per
tensor, then "end". DIR/export/weights.bin holds the tensors in the order of their lines,
float32 little-endian, row-major in the listed shape, nothing between them.
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import LabModel, ModelConfig  # noqa: E402

MAGIC = "phasekv-lab-model 2"
CONFIG_KEYS = ("kind", "vocab", "dim", "layers", "q_heads", "kv_heads", "head_dim", "ffn", "stride", "window",
               "win_tokens", "rope_base", "norm_eps", "origin", "layer_stagger", "head_stagger", "token_shift")
TASK_KEYS = ("filler", "keys", "values", "tokens", "records", "queries", "decoys", "trail", "gap", "placement",
             "block_stride", "block_origin", "isolation")


def load(path):
    ck = torch.load(path, map_location="cpu")
    model = LabModel(ModelConfig(**ck["config"]))
    model.load_state_dict(ck["state"])
    model.eval()
    return model, ck["task"]


def tensors(model):
    """(name, tensor) in export order; the names lab/host/lab_model.hpp reads."""
    cfg = model.cfg
    out = [("embed", model.embed.weight)]
    for l, b in enumerate(model.blocks):
        a = b.attn
        p = f"layers.{l}."
        out.append((p + "attn_norm", b.attn_norm))
        out.append((p + "wq", a.wq.weight))
        if cfg.kind != "full":
            out += [(p + "wk", a.wk.weight), (p + "wv", a.wv.weight)]
        out += [(p + "ck", a.ck.weight), (p + "cv", a.cv.weight)]
        if cfg.token_shift:
            out += [(p + "ck_prev", a.ck_prev.weight), (p + "cv_prev", a.cv_prev.weight)]
        if cfg.gated:
            out += [(p + "zk", a.zk.weight), (p + "zv", a.zv.weight)]
            if cfg.token_shift:
                out += [(p + "zk_prev", a.zk_prev.weight), (p + "zv_prev", a.zv_prev.weight)]
            out += [(p + "bias_k", a.bias_k), (p + "bias_v", a.bias_v)]
        out += [(p + "wo", a.wo.weight), (p + "ffn_norm", b.ffn_norm), (p + "w_gate", b.w_gate.weight),
                (p + "w_up", b.w_up.weight), (p + "w_down", b.w_down.weight)]
    out.append(("final_norm", model.final_norm))
    return out


def export(model, task, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    cfg = model.cfg.to_dict()
    lines = [MAGIC]
    for k in CONFIG_KEYS:
        v = cfg[k]
        lines.append(f"{k} {int(v)}" if isinstance(v, bool) else f"{k} {v!r}" if isinstance(v, float) else f"{k} {v}")
    for k in TASK_KEYS:
        lines.append(f"task_{k} {task[k]}")
    with open(os.path.join(out_dir, "weights.bin"), "wb") as f:
        for name, t in tensors(model):
            a = t.detach().to(torch.float32).contiguous().numpy().astype("<f4")
            lines.append("tensor " + name + " " + " ".join(str(s) for s in a.shape))
            f.write(a.tobytes())
    lines.append("end")
    with open(os.path.join(out_dir, "model.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description="export a trained lab model for the C++ host")
    ap.add_argument("--model", required=True, help="model.pt written by train.py")
    ap.add_argument("--out", required=True, help="output folder (model.txt, weights.bin)")
    a = ap.parse_args()
    if not os.path.isfile(a.model):
        ap.print_usage(sys.stderr)
        print(f"export.py: --model: no such file: {a.model}", file=sys.stderr)
        sys.exit(2)
    model, task = load(a.model)
    export(model, task, a.out)


if __name__ == "__main__":
    main()
