#!/usr/bin/python3
"""Trains one lab model on the key→value task and saves it (model.pt, train.json).

  /usr/bin/python3 lab/train.py --out DIR --kind gated --stride 8 --window 8 [options]

Data: every training sequence is generated on the fly from its own seed,
  seed = (run seed << 32) + step · batch + i        (< 2^63; held-out and sweep seeds use 2^63 +),
so a run is reproducible from (options, seed) alone; train.json records both, the loss and
accuracy curve, and the wall time. Curriculum: the context doubles from --start-tokens up to
--tokens over the first --grow fraction of the steps (records at a fixed density, --records per
--tokens), so the retrieval mechanism is learned on short, cheap sequences first. Loss: cross
entropy on the answer tokens only (the value predicted at each question's key). AdamW with
linear warm-up and cosine decay to 10% of --lr.
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
from task import TaskConfig, generate  # noqa: E402

HELD_OUT = 1 << 63


def batch_tensors(task, seeds):
    toks, pos, ans = [], None, []
    for s in seeds:
        t, p, a, _, _ = generate(task, s)
        toks.append(t)
        ans.append(a)
        pos = p  # the question block sits at the same positions in every sequence of a config
    return torch.tensor(toks), torch.tensor(pos), torch.tensor(ans)


def task_at(task, final_tokens, tokens):
    """The task scaled to `tokens` tokens at the final record density."""
    records = max(task.queries, round(task.records * tokens / final_tokens))
    return task.with_(tokens=tokens, records=min(records, task.keys))


def evaluate(model, task, seeds, batch=32):
    """Accuracy of the last question (the sweep's question) and of all questions."""
    model.eval()
    last = every = n = 0
    with torch.no_grad():
        for k in range(0, len(seeds), batch):
            toks, pos, ans = batch_tensors(task, seeds[k:k + batch])
            pred = model(toks, positions=pos).argmax(-1)
            hit = pred == ans
            last += hit[:, -1].sum().item()
            every += hit.float().mean(1).sum().item()
            n += len(toks)
    model.train()
    return last / n, every / n


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
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=192)
    ap.add_argument("--rope-base", type=float, default=10000.0)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--start-tokens", type=int, default=128)
    ap.add_argument("--grow", type=float, default=0.5)
    ap.add_argument("--records", type=int, default=16)
    ap.add_argument("--queries", type=int, default=4)
    ap.add_argument("--filler", type=int, default=16)
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--values", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-sequences", type=int, default=128)
    a = ap.parse_args(argv)

    def bad(option, message):
        ap.print_usage(sys.stderr)
        print(f"train.py: {option}: {message}", file=sys.stderr)
        sys.exit(2)

    for name in ("steps", "batch", "tokens", "start_tokens", "threads", "eval_every", "eval_sequences"):
        if getattr(a, name) < 1:
            bad("--" + name.replace("_", "-"), "must be at least 1")
    if not (a.lr > 0 and math.isfinite(a.lr)):
        bad("--lr", "must be positive")
    if not 0 <= a.grow <= 1:
        bad("--grow", "must lie in [0, 1]")
    if not 0 <= a.seed < (1 << 31):
        bad("--seed", "must lie in [0, 2^31)")
    if a.kind == "full":
        a.stride, a.window, a.win_tokens = 1, 1, 0
    try:
        task = TaskConfig(filler=a.filler, keys=a.keys, values=a.values, tokens=a.tokens,
                          records=a.records, queries=a.queries)
        task.validate()
        task_at(task, a.tokens, min(a.start_tokens, a.tokens)).validate()
        cfg = ModelConfig(kind=a.kind, vocab=task.vocab, dim=a.dim, layers=a.layers, q_heads=a.q_heads,
                          kv_heads=a.kv_heads, head_dim=a.head_dim, ffn=a.ffn, stride=a.stride,
                          window=a.window, win_tokens=a.win_tokens, rope_base=a.rope_base)
        cfg.validate()
    except ValueError as e:
        bad("options", str(e))
    return a, task, cfg


def main(argv=None):
    a, task, cfg = parse(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    model = LabModel(cfg)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "bias_" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "bias_" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        frac = (step - a.warmup) / max(1, a.steps - a.warmup)
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    # Curriculum stages: start, 2·start, … up to the final length, over the first `grow` of the steps.
    lengths = [min(a.start_tokens, a.tokens)]
    while lengths[-1] < a.tokens:
        lengths.append(min(2 * lengths[-1], a.tokens))
    grow_steps = int(a.grow * a.steps)

    def length_at(step):
        if len(lengths) == 1 or step >= grow_steps:
            return lengths[-1]
        return lengths[min(len(lengths) - 1, step * len(lengths) // max(1, grow_steps))]

    held = [HELD_OUT + (a.seed << 32) + i for i in range(a.eval_sequences)]
    log = []
    t0 = time.time()
    step_time = {}
    ema = None
    for step in range(a.steps):
        T = length_at(step)
        tk = task_at(task, a.tokens, T)
        seeds = [(a.seed << 32) + step * a.batch + i for i in range(a.batch)]
        toks, pos, ans = batch_tensors(tk, seeds)
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        ts = time.time()
        logits = model(toks, positions=pos)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ans.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step_time.setdefault(T, []).append(time.time() - ts)
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            acc_last, acc_all = evaluate(model, task, held)
            row = {"step": step + 1, "tokens": T, "loss_ema": round(ema, 4), "heldout_last": acc_last,
                   "heldout_all": acc_all, "seconds": round(time.time() - t0, 1)}
            log.append(row)
            print(json.dumps(row), flush=True)
    seconds = time.time() - t0
    torch.save({"config": cfg.to_dict(), "task": task.__dict__, "state": model.state_dict()},
               os.path.join(a.out, "model.pt"))
    info = {"options": vars(a), "model": cfg.to_dict(), "task": task.__dict__, "seed": a.seed,
            "parameters": sum(p.numel() for p in model.parameters()), "seconds": round(seconds, 1),
            "torch": torch.__version__, "threads": a.threads,
            "seconds_per_step": {str(k): round(float(np.median(v)), 4) for k, v in step_time.items()},
            "curriculum": lengths, "log": log,
            "final_heldout_last": log[-1]["heldout_last"], "final_heldout_all": log[-1]["heldout_all"]}
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


if __name__ == "__main__":
    main()
