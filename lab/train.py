#!/usr/bin/python3
"""Trains one lab model on the key→value task (lab/task.py) and saves it (model.pt, train.json).

  /usr/bin/python3 lab/train.py --out DIR --kind gated --stride 8 --window 8 [options]

Data: every training sequence is generated on the fly from its own seed,
  seed = (run seed << 32) + step · batch + i        (< 2^63; held-out and sweep seeds use 2^63 +),
so a run is reproducible from (options, seed) alone; train.json records both, the loss and
accuracy curve, and the wall time. Curriculum: the first --short-steps steps use --short-tokens
tokens with records, queries and decoys scaled to that length (density kept), the rest the full
task. Loss: cross entropy on every question's answer. AdamW with linear warm-up and cosine decay to
10% of --lr.

--random-origin draws each sequence's compressor origin offset uniformly from [0, S) (lab/model.py,
origin_offsets): the model never sees one block grid. --warm-start PATH initialises every tensor
this model shares with the checkpoint at PATH (a mean-pooling model from a gated one: everything
but the gates, i.e. the gates replaced by uniform weights).

Logged at every evaluation (train.json "log"): held-out accuracy of the last question and of all,
the guessing floors of the held-out sequences (task.floors), and for gated models the gates'
concentration — static exp(H(E[α])) and per-window E[exp(H(α))], α averaged over channels, per
layer and stream, over complete windows — and the slot-bias norms ‖b‖ and ‖b − mean over slots‖
(the part of the bias that prefers some slots: the positional signal the study says training
puts into the gates).
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import KINDS, LabModel, ModelConfig  # noqa: E402
from task import PLACEMENTS, TaskConfig, floors, generate  # noqa: E402

HELD_OUT = 1 << 63


def batch_tensors(task, seeds):
    """tokens [B, T], answer positions [B, Q], answers [B, Q], floors [B, 2]."""
    toks, pos, ans, fl = [], [], [], []
    for s in seeds:
        q = generate(task, s)
        toks.append(q.tokens)
        pos.append(q.answer_positions)
        ans.append(q.answers)
        fl.append(floors(task, q))
    return torch.tensor(toks), torch.tensor(pos), torch.tensor(ans), torch.tensor(fl)


def task_at(task, tokens):
    """The task scaled to `tokens` tokens at the same density of records, questions and decoys."""
    if tokens == task.tokens:
        return task
    f = tokens / task.tokens
    records = max(1, round(task.records * f))
    return task.with_(tokens=tokens, records=records, queries=min(records, max(1, round(task.queries * f))),
                      decoys=round(task.decoys * f), trail=min(task.trail, tokens // 8))


def evaluate(model, task, seeds, batch=32):
    """Accuracy of the last question (the sweep's) and of all questions; the mean floors."""
    model.eval()
    last = every = n = 0
    fl = torch.zeros(2)
    with torch.no_grad():
        for k in range(0, len(seeds), batch):
            toks, pos, ans, f = batch_tensors(task, seeds[k:k + batch])
            hit = model(toks, positions=pos).argmax(-1) == ans
            last += hit[:, -1].sum().item()
            every += hit.float().mean(1).sum().item()
            fl += f.sum(0)
            n += len(toks)
    model.train()
    return last / n, every / n, (fl / n).tolist()


def gate_statistics(model, task, seeds):
    """Gate concentration and slot-bias norms per layer and stream (gated kinds; see the top)."""
    cfg = model.cfg
    if not cfg.gated:
        return []
    toks, _, _, _ = batch_tensors(task, seeds)
    parts = []
    with torch.no_grad():
        model(toks, parts=parts)
    out = []
    first_full = (cfg.window + cfg.stride - 1) // cfg.stride  # entries whose window reaches no padding at any lead
    for l, (p, block) in enumerate(zip(parts, model.blocks)):
        for stream, alpha_name, bias in (("keys", "alpha_k", block.attn.bias_k), ("values", "alpha_v", block.attn.bias_v)):
            a = p[alpha_name].mean(-1)[:, :, first_full:-1]          # [B, Hkv, n, W]: channel mean, complete windows
            a = a / a.sum(-1, keepdim=True)
            mean = a.mean(dim=(0, 2))                                 # [Hkv, W]
            static = torch.exp(-(mean * mean.clamp_min(1e-30).log()).sum(-1))
            window = torch.exp(-(a * a.clamp_min(1e-30).log()).sum(-1)).mean(dim=(0, 2))
            b = bias.detach()
            out.append({"layer": l, "stream": stream,
                        "static_concentration": [round(x, 4) for x in static.tolist()],
                        "window_concentration": [round(x, 4) for x in window.tolist()],
                        "bias_norm": round(b.norm().item(), 4),
                        "bias_slot_norm": round((b - b.mean(dim=1, keepdim=True)).norm().item(), 4)})
    return out


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--kind", choices=KINDS, default="gated")
    ap.add_argument("--stride", type=int, default=8)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--win-tokens", type=int, default=16)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--q-heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=192)
    ap.add_argument("--rope-base", type=float, default=1e6)
    ap.add_argument("--origin", type=int, default=0)
    ap.add_argument("--layer-stagger", type=int, default=0)
    ap.add_argument("--head-stagger", type=int, default=0)
    ap.add_argument("--token-shift", type=int, choices=(0, 1), default=0)
    ap.add_argument("--random-origin", type=int, choices=(0, 1), default=0)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--short-tokens", type=int, default=128)
    ap.add_argument("--short-steps", type=int, default=300)
    ap.add_argument("--records", type=int, default=8)
    ap.add_argument("--queries", type=int, default=8)
    ap.add_argument("--decoys", type=int, default=8)
    ap.add_argument("--trail", type=int, default=15)
    ap.add_argument("--gap", type=int, default=0)
    ap.add_argument("--placement", choices=PLACEMENTS, default="uniform")
    ap.add_argument("--block-stride", type=int, default=0)
    ap.add_argument("--block-origin", type=int, default=0)
    ap.add_argument("--filler", type=int, default=16)
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--values", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-sequences", type=int, default=128)
    ap.add_argument("--warm-start", default="")
    a = ap.parse_args(argv)

    def bad(option, message):
        ap.print_usage(sys.stderr)
        print(f"train.py: {option}: {message}", file=sys.stderr)
        sys.exit(2)

    for name in ("steps", "batch", "tokens", "short_tokens", "threads", "eval_every", "eval_sequences"):
        if getattr(a, name) < 1:
            bad("--" + name.replace("_", "-"), "must be at least 1")
    if a.short_steps < 0:
        bad("--short-steps", "must be at least 0")
    if not (a.lr > 0 and math.isfinite(a.lr)):
        bad("--lr", "must be positive")
    if not 0 <= a.seed < (1 << 31):
        bad("--seed", "must lie in [0, 2^31)")
    if a.warm_start and not os.path.isfile(a.warm_start):
        bad("--warm-start", f"no such file: {a.warm_start}")
    if a.kind == "full":
        a.stride, a.window, a.win_tokens = 1, 1, 0
    try:
        task = TaskConfig(filler=a.filler, keys=a.keys, values=a.values, tokens=a.tokens, records=a.records,
                          queries=a.queries, decoys=a.decoys, trail=a.trail, gap=a.gap, placement=a.placement,
                          block_stride=a.block_stride, block_origin=a.block_origin)
        task.validate()
        if a.short_steps:
            task_at(task, min(a.short_tokens, a.tokens)).validate()
        cfg = ModelConfig(kind=a.kind, vocab=task.vocab, dim=a.dim, layers=a.layers, q_heads=a.q_heads,
                          kv_heads=a.kv_heads, head_dim=a.head_dim, ffn=a.ffn, stride=a.stride, window=a.window,
                          win_tokens=a.win_tokens, rope_base=a.rope_base, origin=a.origin,
                          layer_stagger=a.layer_stagger, head_stagger=a.head_stagger, token_shift=bool(a.token_shift))
        cfg.validate()
    except ValueError as e:
        bad("options", str(e))
    return a, task, cfg


def warm_start(model, path):
    """Copies every tensor of the checkpoint whose name and shape this model has; returns the names."""
    ck = torch.load(path, map_location="cpu")
    own = model.state_dict()
    taken = {k: v for k, v in ck["state"].items() if k in own and own[k].shape == v.shape}
    own.update(taken)
    model.load_state_dict(own)
    return sorted(taken)


def main(argv=None):
    a, task, cfg = parse(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    model = LabModel(cfg)
    warmed = warm_start(model, a.warm_start) if a.warm_start else []
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "bias_" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "bias_" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        frac = (step - a.warmup) / max(1, a.steps - a.warmup)
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    short = task_at(task, min(a.short_tokens, a.tokens))
    held = [HELD_OUT + (a.seed << 32) + i for i in range(a.eval_sequences)]
    gate_seeds = held[:16]
    log = []
    t0 = time.time()
    step_time = {}
    ema = None
    offsets_rng = np.random.default_rng(a.seed)
    for step in range(a.steps):
        tk = short if step < a.short_steps else task
        seeds = [(a.seed << 32) + step * a.batch + i for i in range(a.batch)]
        toks, pos, ans, _ = batch_tensors(tk, seeds)
        offsets = torch.from_numpy(offsets_rng.integers(0, cfg.stride, a.batch)) if a.random_origin else None
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        ts = time.time()
        logits = model(toks, positions=pos, origin_offsets=offsets)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ans.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step_time.setdefault(tk.tokens, []).append(time.time() - ts)
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            acc_last, acc_all, fl = evaluate(model, task, held)
            row = {"step": step + 1, "tokens": tk.tokens, "loss_ema": round(ema, 4), "heldout_last": acc_last,
                   "heldout_all": acc_all, "floor_any": round(fl[0], 4), "floor_record": round(fl[1], 4),
                   "gates": gate_statistics(model, task, gate_seeds), "seconds": round(time.time() - t0, 1)}
            log.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "gates"}), flush=True)
    seconds = time.time() - t0
    torch.save({"config": cfg.to_dict(), "task": task.to_dict(), "state": model.state_dict()},
               os.path.join(a.out, "model.pt"))
    info = {"options": vars(a), "model": cfg.to_dict(), "task": task.to_dict(), "seed": a.seed,
            "parameters": sum(p.numel() for p in model.parameters()), "seconds": round(seconds, 1),
            "torch": torch.__version__, "threads": a.threads, "warm_started": warmed,
            "seconds_per_step": {str(k): round(float(np.median(v)), 4) for k, v in step_time.items()},
            "log": log, "final_heldout_last": log[-1]["heldout_last"], "final_heldout_all": log[-1]["heldout_all"],
            "floor_any": log[-1]["floor_any"], "floor_record": log[-1]["floor_record"]}
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


if __name__ == "__main__":
    main()
