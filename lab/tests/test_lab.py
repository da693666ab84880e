#!/usr/bin/python3
"""Tests of the lab: the task generator, the PyTorch model's maths, the export format and the C++
host (phasekv) against PyTorch.

  LAB_HOST=build/lab/lab_host /usr/bin/python3 -m unittest discover -s lab/tests -v

Oracles: lab/host/lab_task.hpp against lab/task.py token for token (every placement mode); the
vectorised attention of lab/model.py against a direct float64 loop over the formulas of its
docstring (origins, staggers, per-sequence offsets, the token shift); the C++ host (phasekv's
compressors, paged cache and reader) against lab/model.py — logits within 1e-4 on held-out
sequences for every kind of attention and on the measurement's own planned placements, with
weights scaled up so that gates, RoPE and the joint softmax are far from uniform (at the default
init every logit is near 0 and a wrong slot order or rotation would hide in the noise).
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from export import export  # noqa: E402
from model import LabModel, ModelConfig, rope_tables  # noqa: E402
from task import TaskConfig, floors, generate  # noqa: E402
from verify import compare, host_logits, planned_queries  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
HOST = os.environ.get("LAB_HOST", os.path.join(ROOT, "build", "lab", "lab_host"))
TOL = 1e-4

TASK = TaskConfig(filler=8, keys=24, values=24, tokens=101, records=6, queries=4, decoys=5, trail=7)

# (name, kind, stride, window, win_tokens, kv_heads, extra ModelConfig fields): every kind, W = S and
# W = 2S, a stride that is not a power of two, GQA with two KV heads, origins staggered across layers
# and heads, the token shift; 101 tokens is a multiple of none of the strides.
VARIANTS = [
    ("full", "full", 1, 1, 0, 1, {}),
    ("full_shift", "full", 1, 1, 0, 2, {"token_shift": True}),
    ("gated_S4_W4", "gated", 4, 4, 8, 1, {}),
    ("gated_S4_W8", "gated", 4, 8, 8, 1, {}),
    ("gated_S6_W12_kv2", "gated", 6, 12, 8, 2, {}),
    ("gated_S8_staggered", "gated", 8, 8, 8, 2, {"origin": 3, "layer_stagger": 4, "head_stagger": 2}),
    ("gated_S8_shift", "gated", 8, 8, 8, 2, {"token_shift": True, "head_stagger": 4}),
    ("gated_S1_W8", "gated", 1, 8, 8, 2, {}),
    ("mean_S8_W8", "mean", 8, 8, 8, 1, {}),
    ("mean_S2_W4", "mean", 2, 4, 5, 1, {"origin": 1}),
    ("norope_S8_W8", "norope", 8, 8, 8, 2, {"head_stagger": 5}),
]


def make_model(kind, S, W, N, hkv, extra=None, seed=0, scale=10.0, task=TASK):
    torch.manual_seed(seed)
    cfg = ModelConfig(kind=kind, vocab=task.vocab, dim=32, layers=2, q_heads=4, kv_heads=hkv, head_dim=8, ffn=48,
                      stride=S, window=W, win_tokens=N, rope_base=50.0, **(extra or {}))
    m = LabModel(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() >= 2 and "bias_" not in name:
                p.mul_(scale)
            elif "bias_" in name:
                p.normal_(0.0, 2.0)
            else:
                p.uniform_(0.5, 1.5)
    m.eval()
    return m


def have_host():
    return os.path.isfile(HOST) and os.access(HOST, os.X_OK)


# Task configurations whose every placement mode and option the parity test exercises.
TASKS = [
    TASK,
    TASK.with_(placement="aligned", block_stride=4, block_origin=1),
    TASK.with_(placement="isolated", isolation=8),
    TASK.with_(placement="gapped", gap=2, block_stride=8),
    TASK.with_(gap=1, decoys=0, trail=0),
]


class TaskParity(unittest.TestCase):
    @unittest.skipUnless(have_host(), f"no lab_host at {HOST}")
    def test_host_generates_the_same_sequences(self):
        for task in TASKS:
            with tempfile.TemporaryDirectory() as tmp:
                export(make_model("full", 1, 1, 0, 1, task=task), task.to_dict(), tmp)
                cases = [(0, -1, -1), (7, -1, -1), ((1 << 63) + 5, -1, -1), (3, 0, -1), (11, 40, 3),
                         (12, task.context(task.trail) - task.record_tokens, task.trail), (13, 21, 0)]
                for seed, target, trail in cases:
                    args = [HOST, "task", "--model", tmp, "--seed", str(seed), "--target", str(target), "--trail", str(trail)]
                    got = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
                    want = generate(task, seed, target, trail)
                    for field in ("tokens", "answer_positions", "answers", "record_starts", "asked", "decoys", "trail"):
                        self.assertEqual(got[field], getattr(want, field), (task.placement, seed, target, field))
                    self.assertEqual(got["floors"], list(floors(task, want)))

    def test_sequences_hold_what_the_task_promises(self):
        for task in TASKS:
            L = task.record_tokens
            for seed in range(60):
                target = -1 if seed % 2 else 3 + seed
                s = generate(task, seed, target)
                toks = s.tokens
                self.assertEqual(len(toks), task.tokens)
                C = task.context(s.trail)
                self.assertTrue(0 <= s.trail <= task.trail)
                self.assertEqual(s.query_position, task.tokens - 1 - s.trail)
                self.assertTrue(all(t < task.filler for t in toks[C + 2 * task.queries:]))  # trailing filler
                keys = [toks[p] for p in s.record_starts]
                self.assertEqual(len(set(keys)), task.records)  # distinct keys
                spans = [set(range(p, p + L)) for p in s.record_starts]
                for i, p in enumerate(s.record_starts):
                    self.assertTrue(task.filler <= toks[p] < task.filler + task.keys)
                    self.assertTrue(task.filler + task.keys <= toks[p + L - 1] < task.query_token)
                    self.assertTrue(all(toks[u] < task.filler for u in range(p + 1, p + L - 1)))  # the gap
                    self.assertLessEqual(p + L, C)
                    for j in range(i):
                        self.assertFalse(spans[i] & spans[j])
                    if task.placement == "aligned" or (task.placement == "gapped" and task.block_stride):
                        if i > 0 or target < 0:  # a forced target may sit anywhere
                            lead = (task.block_stride - task.block_origin) % task.block_stride
                            self.assertEqual((p + lead) // task.block_stride, (p + L - 1 + lead) // task.block_stride)
                self.assertEqual(len(s.decoys), task.decoys)
                for d in s.decoys:
                    self.assertTrue(task.filler + task.keys <= toks[d] < task.query_token)
                    self.assertFalse(any(d in sp for sp in spans))
                if task.placement == "isolated" and target >= 0:
                    near = set(range(target - task.isolation, target + L + task.isolation))
                    for p in s.record_starts[1:]:
                        self.assertFalse(near & set(range(p, p + L)))
                    self.assertFalse(near & set(s.decoys))
                # The questions: "Q k" pairs, no answer echoed; each answer is its record's value.
                for i, (q, a) in enumerate(zip(s.answer_positions, s.answers)):
                    self.assertEqual(q, C + 2 * i + 1)
                    self.assertEqual(toks[q - 1], task.query_token)
                    r = keys.index(toks[q])
                    self.assertEqual(toks[s.record_starts[r] + L - 1], a)
                self.assertEqual(len(set(s.asked)), task.queries)
                if target >= 0:
                    self.assertEqual(toks[s.query_position], toks[target])
                # Floors by brute force over the context's tokens.
                values = {t for t in toks[:C] if task.filler + task.keys <= t < task.query_token}
                self.assertAlmostEqual(floors(task, s)[0], 1 / len(values))
                self.assertAlmostEqual(floors(task, s)[1], 1 / len({toks[p + L - 1] for p in s.record_starts}))

    def test_bad_tasks_name_the_field(self):
        for change, field in [({"queries": 7}, "task.queries"), ({"placement": "aligned", "block_stride": 1}, "block_stride"),
                              ({"placement": "gapped"}, "task.gap"), ({"placement": "spread"}, "task.placement"),
                              ({"decoys": 80}, "context tokens"), ({"trail": -1}, "task.trail")]:
            with self.assertRaisesRegex(ValueError, field):
                TASK.with_(**change).validate()


def reference_attention(att, n_in, offset=0):
    """Direct float64 loops over lab/model.py's formulas, one query position at a time (one
    sequence whose origin offset is `offset`)."""
    cfg = att.cfg
    S, W, N, hq, hkv, dh, nb = cfg.stride, cfg.window, cfg.win_tokens, cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.branches
    x = n_in[0].double()
    T = x.shape[0]
    prev = torch.cat((torch.zeros(1, x.shape[1], dtype=torch.float64), x[:-1]))

    def lin(name):
        y = x @ getattr(att, name).weight.double().t()
        if cfg.token_shift and name[0] in "cz":
            y = y + prev @ getattr(att, name + "_prev").weight.double().t()
        return y

    q = lin("wq").view(T, hq, dh)
    ck, cv = lin("ck").view(T, hkv, nb, dh), lin("cv").view(T, hkv, nb, dh)
    if cfg.gated:
        zk, zv = lin("zk").view(T, hkv, nb, dh), lin("zv").view(T, hkv, nb, dh)

    def rot(v, pos):
        if not cfg.rope:
            return v
        out = v.clone()
        h = dh // 2
        for k in range(h):
            ang = pos * cfg.rope_base ** (-2.0 * k / dh)
            c, s = math.cos(ang), math.sin(ang)
            out[..., k] = v[..., k] * c - v[..., k + h] * s
            out[..., k + h] = v[..., k] * s + v[..., k + h] * c
        return out

    def entry(j, lead, payload, logits, bias, h):
        slots = [i for i in range(W) if (j + 1) * S - W - lead + i >= 0]
        xs = torch.stack([payload[(j + 1) * S - W - lead + i, h, (W - 1 - i) // S] for i in slots])
        if logits is None:
            return xs.mean(0)
        ss = torch.stack([logits[(j + 1) * S - W - lead + i, h, (W - 1 - i) // S] + bias[h, i].double() for i in slots])
        return (torch.softmax(ss, 0) * xs).sum(0)

    out = torch.zeros(T, hq, dh, dtype=torch.float64)
    for t in range(T):
        for hh in range(hq):
            h = hh // (hq // hkv)
            lead = (S - (cfg.origin_of(att.layer, h) + offset) % S) % S
            qv = rot(q[t, hh], t)
            ks, vs = [], []
            for j in range((t + 1 + lead) // S):
                ks.append(rot(entry(j, lead, ck, zk if cfg.gated else None, getattr(att, "bias_k", None), h), j * S - lead))
                vs.append(entry(j, lead, cv, zv if cfg.gated else None, getattr(att, "bias_v", None), h))
            if N > 0:
                kw = (x @ att.wk.weight.double().t()).view(T, hkv, dh)
                vw = (x @ att.wv.weight.double().t()).view(T, hkv, dh)
                for u in range(max(0, t - N + 1), t + 1):
                    ks.append(rot(kw[u, h], u))
                    vs.append(vw[u, h])
            logits = torch.stack([qv @ k for k in ks]) / math.sqrt(dh)
            out[t, hh] = torch.softmax(logits, 0) @ torch.stack(vs)
    return out.reshape(T, hq * dh) @ att.wo.weight.double().t()


class ModelMaths(unittest.TestCase):
    def test_attention_is_the_documented_formula(self):
        for name, kind, S, W, N, hkv, extra in VARIANTS:
            for layer in (0, 1):
                with self.subTest(name, layer=layer):
                    m = make_model(kind, S, W, N, hkv, extra, scale=5.0)
                    att = m.blocks[layer].attn
                    n_in = torch.randn(1, 29, m.cfg.dim)
                    with torch.no_grad():
                        got = att(n_in)[0].double()
                    want = reference_attention(att, n_in)
                    self.assertLess((got - want).abs().max().item(), 1e-4 * max(1.0, want.abs().max().item()))

    def test_origin_offsets_and_query_positions(self):
        # A batch whose sequences have their own origin offset and their own query positions
        # equals each sequence alone through the reference.
        for name, kind, S, W, N, hkv, extra in VARIANTS:
            if S == 1:
                continue
            with self.subTest(name):
                m = make_model(kind, S, W, N, hkv, extra, scale=5.0)
                att = m.blocks[1].attn
                n_in = torch.randn(3, 23, m.cfg.dim)
                offsets = torch.tensor([0, 1, S - 1])
                pos = torch.tensor([[22, 5], [13, 14], [0, 20]])
                with torch.no_grad():
                    got = att(n_in, query_positions=pos, origin_offsets=offsets).double()
                for b in range(3):
                    want = reference_attention(att, n_in[b:b + 1], offset=int(offsets[b]))[pos[b]]
                    self.assertLess((got[b] - want).abs().max().item(), 1e-4 * max(1.0, want.abs().max().item()))

    def test_positions_read_equal_every_position(self):
        for name, kind, S, W, N, hkv, extra in VARIANTS:
            with self.subTest(name):
                m = make_model(kind, S, W, N, hkv, extra)
                x = torch.tensor([generate(TASK, 100 + i).tokens for i in range(2)])
                with torch.no_grad():
                    every = m(x)
                    some = m(x, positions=torch.tensor([[5, 50, 100], [7, 8, 99]]))
                self.assertLess((every[0, [5, 50, 100]] - some[0]).abs().max().item(), 1e-4)
                self.assertLess((every[1, [7, 8, 99]] - some[1]).abs().max().item(), 1e-4)

    def test_rope_tables_are_the_half_split_frequencies(self):
        c, s = rope_tables(torch.tensor([3]), 8, 50.0)
        for k in range(4):
            self.assertAlmostEqual(c[0, k].item(), math.cos(3 * 50.0 ** (-2 * k / 8)), places=6)
            self.assertAlmostEqual(s[0, k].item(), math.sin(3 * 50.0 ** (-2 * k / 8)), places=6)


@unittest.skipUnless(have_host(), f"no lab_host at {HOST}")
class HostLogits(unittest.TestCase):
    def test_logits_equal_torch_for_every_kind(self):
        for name, kind, S, W, N, hkv, extra in VARIANTS:
            with self.subTest(name), tempfile.TemporaryDirectory() as tmp:
                m = make_model(kind, S, W, N, hkv, extra)
                export(m, TASK.to_dict(), tmp)
                diff, scale = compare(m, TASK.to_dict(), tmp, HOST, count=3)
                print(f"  {name}: max |torch - phasekv| = {diff:.2e} (max |logit| {scale:.1f})", file=sys.stderr)
                self.assertGreater(scale, 1.0)  # the check is not on near-zero logits
                self.assertLess(diff, TOL * max(1.0, scale))

    def test_the_measured_path_equals_torch_on_planned_placements(self):
        # The sweep's own query path (forced target, jittered query, the sweep's placement of the
        # other records), at two origin shifts: what lab/verify.py checks on every trained variant.
        for name, kind, S, W, N, hkv, extra in VARIANTS:
            if S == 1 and name != "full":
                continue
            with self.subTest(name), tempfile.TemporaryDirectory() as tmp:
                m = make_model(kind, S, W, N, hkv, extra)
                export(m, TASK.to_dict(), tmp)
                args = ["--modulus", str(2 * S if S > 1 else 8), "--analysis-stride", str(S if S > 1 else 4)]
                for sweep in ("uniform", "isolated"):
                    for shift in ((0, S - 1) if S > 1 else (0,)):
                        diff, scale = planned_queries(m, tmp, HOST, sweep, 6, shift, args)
                        self.assertGreater(scale, 1.0)
                        self.assertLess(diff, TOL * max(1.0, scale), (sweep, shift))

    def test_a_changed_weight_is_detected(self):
        # The comparison can fail: one perturbed slot bias (the tail slot of layer 1's key gates)
        # must move the host's logits away from the unperturbed torch model's.
        m = make_model("gated", 4, 4, 8, 1)
        with tempfile.TemporaryDirectory() as tmp:
            with torch.no_grad():
                m.blocks[1].attn.bias_k[0, 3] += 3.0
            export(m, TASK.to_dict(), tmp)
            with torch.no_grad():
                m.blocks[1].attn.bias_k[0, 3] -= 3.0
            diff, _ = compare(m, TASK.to_dict(), tmp, HOST, count=1)
            self.assertGreater(diff, 1e-2)

    def test_an_origin_the_host_ignored_would_be_detected(self):
        # The same check at a wrong origin: torch with an offset, the host without one.
        m = make_model("gated", 8, 8, 8, 2, {"head_stagger": 4})
        with tempfile.TemporaryDirectory() as tmp:
            export(m, TASK.to_dict(), tmp)
            seqs = [generate(TASK, 5).tokens]
            with torch.no_grad():
                shifted = m(torch.tensor(seqs), origin_offsets=torch.tensor([3])).numpy()
            self.assertGreater(float(np.abs(shifted - host_logits(HOST, tmp, seqs)).max()), 1e-2)


@unittest.skipUnless(have_host(), f"no lab_host at {HOST}")
class HostErrors(unittest.TestCase):
    def run_host(self, *args):
        return subprocess.run([HOST, *args], capture_output=True, text=True)

    def test_bad_options_exit_2_naming_the_option(self):
        with tempfile.TemporaryDirectory() as tmp:
            export(make_model("gated", 4, 4, 8, 1), TASK.to_dict(), tmp)
            for args, option in [(["measure", "--model", tmp, "--out", tmp, "--trials", "3"], "--trials"),
                                 (["measure", "--model", tmp, "--out", tmp, "--isolated-trials", "4"], "--isolated-trials"),
                                 (["measure", "--model", tmp, "--out", tmp, "--gapped-trials", "12"], "--gap"),
                                 (["plan", "--model", tmp, "--sweep", "sideways"], "--sweep"),
                                 (["measure", "--model", tmp, "--out", tmp, "--analysis-stride", "6"], "--analysis-stride"),
                                 (["measure", "--model", tmp, "--out", tmp, "--trials", "x"], "--trials"),
                                 (["measure", "--model", tmp, "--out", tmp, "--modulus", "6"], "--modulus"),
                                 (["measure", "--model", tmp, "--out", tmp, "--knockout-trials", "5"], "--knockout-trials"),
                                 (["measure", "--model", tmp], "--out"),
                                 (["task", "--model", tmp, "--frobnicate", "1"], "--frobnicate"),
                                 (["task", "--model", tmp, "--target", "100"], "--target"),
                                 (["task", "--model", tmp, "--target", "90", "--trail", "7"], "--target"),
                                 (["logits", "--model", tmp + "/nowhere", "--input", "a", "--output", "b"], "--model")]:
                r = self.run_host(*args)
                self.assertEqual(r.returncode, 2, (args, r.stderr))
                self.assertIn(option, r.stderr)

    def test_a_manifest_for_another_kind_is_refused(self):
        # A gated export relabelled as mean: the gate tensors would be silently ignored.
        with tempfile.TemporaryDirectory() as tmp:
            export(make_model("gated", 4, 4, 8, 1), TASK.to_dict(), tmp)
            path = os.path.join(tmp, "model.txt")
            with open(path) as f:
                text = f.read().replace("kind gated", "kind mean")
            with open(path, "w") as f:
                f.write(text)
            r = self.run_host("task", "--model", tmp, "--seed", "1")
            self.assertEqual(r.returncode, 2)
            self.assertIn("is not part of a 'mean' model", r.stderr)

    def test_truncated_weights_are_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            export(make_model("mean", 8, 8, 8, 1), TASK.to_dict(), tmp)
            path = os.path.join(tmp, "weights.bin")
            with open(path, "rb") as f:
                data = f.read()
            with open(path, "wb") as f:
                f.write(data[:-4])
            r = self.run_host("task", "--model", tmp, "--seed", "1")
            self.assertEqual(r.returncode, 2)
            self.assertIn("ends inside tensor final_norm", r.stderr)


class ScriptErrors(unittest.TestCase):
    """The Python entry points and lab/run refuse bad options with status 2, naming the option."""

    def check(self, args, option):
        r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
        self.assertEqual(r.returncode, 2, (args, r.stderr))
        self.assertIn(option, r.stderr)

    def test_bad_options(self):
        lab = os.path.join(ROOT, "lab")
        with tempfile.TemporaryDirectory() as tmp:
            self.check([sys.executable, os.path.join(lab, "train.py"), "--out", tmp, "--steps", "0"], "--steps")
            self.check([sys.executable, os.path.join(lab, "train.py"), "--out", tmp, "--lr", "-1"], "--lr")
            self.check([sys.executable, os.path.join(lab, "train.py"), "--out", tmp, "--records", "100"], "task.records")
            self.check([sys.executable, os.path.join(lab, "train.py"), "--out", tmp, "--stride", "8", "--window", "4"],
                       "window >= stride")
            self.check([sys.executable, os.path.join(lab, "pipeline.py"), "--mode", "full", "--out", tmp, "--host", HOST,
                        "--only", "gated_S9_W9"], "--only")
            self.check([sys.executable, os.path.join(lab, "verify.py"), "--model", os.path.join(tmp, "none.pt"),
                        "--export", tmp, "--host", HOST], "--model")
            self.check([sys.executable, os.path.join(lab, "report.py"), "--runs", tmp, "--out", os.path.join(tmp, "R.md"),
                        "--learned", "-1"], "--learned")
            self.check([os.path.join(lab, "run"), "--frobnicate"], "--frobnicate")
            self.check([os.path.join(lab, "run"), "--only"], "--only")


class Report(unittest.TestCase):
    """report.py keeps a run that stayed at its floor out of the phase tables and says so."""

    def write_run(self, root, name, seed, heldout, sweep_mean):
        d = os.path.join(root, name, f"seed{seed}")
        os.makedirs(os.path.join(d, "measure"))
        log = [{"step": 200, "heldout_last": heldout / 2}, {"step": 400, "heldout_last": heldout}]
        with open(os.path.join(d, "train.json"), "w") as f:
            json.dump({"final_heldout_last": heldout, "floor_record": 0.13, "floor_any": 0.07, "log": log,
                       "model": {"window": 8}}, f)
        sweep = {"mean": sweep_mean, "profiles": [], "layouts": [], "dominant_period": {"period": 0},
                 "worst_residue": 0}
        with open(os.path.join(d, "measure", "measure.json"), "w") as f:
            json.dump({"sweeps": {"uniform": {"sweep": sweep, "logistic": {}}}, "analysis_stride": 8}, f)

    def test_plateaued_runs_are_listed_but_not_averaged(self):
        import report  # noqa: E402 — lab/ is on the path
        with tempfile.TemporaryDirectory() as tmp:
            meta = {"command": "test", "machine": "test", "seeds": [1, 2, 3], "measure": {},
                    "common": {"dim": 1, "layers": 1, "q_heads": 1, "kv_heads": 1, "head_dim": 1, "win_tokens": 1,
                               "rope_base": 1, "steps": 1, "batch": 1, "short_steps": 0, "short_tokens": 1, "lr": 1,
                               "tokens": 1, "records": 1, "queries": 1, "decoys": 0, "trail": 0},
                    "variants": [{"name": "v", "train": {"kind": "full"}}, {"name": "w", "train": {"kind": "full"}}]}
            with open(os.path.join(tmp, "runs.json"), "w") as f:
                json.dump(meta, f)
            # v: seeds 1 and 3 learned (0.8, 0.6), seed 2 stayed at its floor; w: no seed learned.
            for seed, acc in ((1, 0.8), (2, 0.1), (3, 0.6)):
                self.write_run(tmp, "v", seed, acc, acc)
            self.write_run(tmp, "w", 1, 0.2, 0.2)
            out = os.path.join(tmp, "R.md")
            argv, sys.argv = sys.argv, ["report.py", "--runs", tmp, "--out", out]
            try:
                report.main()
            finally:
                sys.argv = argv
            with open(out) as f:
                text = f.read()
            training = [line for line in text.splitlines() if line.startswith("| v | 2 of 3")]
            self.assertEqual(len(training), 1, text)
            self.assertIn("seed 2: 10.0 (13.0) plateau", training[0])
            self.assertIn("| 400 / never / 400 |", training[0])
            # The phase table averages seeds 1 and 3 only: held-out 70.0 with its t interval over 2 seeds.
            self.assertIn("| v | 1, 3 | 13.0 / 7.0 | 70.0 [", text)
            self.assertIn("| w | no seed learned |", text)
            self.assertIn("| w | 0 of 1 |", text)

    def test_chi_square_tail_and_the_pooled_phase_test(self):
        from report import chi2_sf, homogeneity  # noqa: E402
        for x in (0.1, 2.0, 7.5, 30.0):  # closed forms of the tail at 1, 2 and 6 degrees of freedom
            self.assertAlmostEqual(chi2_sf(x, 1), math.erfc(math.sqrt(x / 2)), delta=1e-12)
            self.assertAlmostEqual(chi2_sf(x, 2), math.exp(-x / 2), delta=1e-12)
            self.assertAlmostEqual(chi2_sf(x, 6), math.exp(-x / 2) * (1 + x / 2 + x * x / 8), delta=1e-12)
        rng = np.random.default_rng(7)
        # Flat truth (80% at 7 phases, 256 trials each): about 5% of 400 simulations reject at 0.05.
        flat = [homogeneity([(rng.binomial(256, 0.8), 256) for _ in range(7)])[2] for _ in range(400)]
        self.assertLess(abs(sum(p < 0.05 for p in flat) - 20), 13)
        # One phase 12 points lower: rejected in about nine simulations of ten at this size.
        dip = [homogeneity([(rng.binomial(256, 0.8 - 0.12 * (i == 3)), 256) for i in range(7)])[2] for _ in range(200)]
        self.assertGreater(sum(p < 0.05 for p in dip), 160)

    def test_pooled_phase_logit_holds_level_and_finds_a_planted_phase(self):
        from report import pooled_phase_logit  # noqa: E402
        rng = np.random.default_rng(11)

        def simulate(dip, runs=6, per_run=900):
            # Runs differ in their rate, crowding costs 1.5 log-odds a unit and is drawn independently
            # of phase; phase 6 is `dip` log-odds weaker than the others.
            trials = []
            for run in range(runs):
                base = rng.normal(2.0, 0.5)
                for _ in range(per_run):
                    phase, crowd, dist = int(rng.integers(0, 7)), int(rng.integers(0, 4)), int(rng.integers(20, 230))
                    eta = base - 1.5 * crowd - 0.2 * dist / 100 - dip * (phase == 6)
                    trials.append((run, phase, crowd, dist, int(rng.random() < 1 / (1 + math.exp(-eta)))))
            return pooled_phase_logit(trials, list(range(7)))

        null = [simulate(0.0)[1] for _ in range(60)]
        self.assertLess(sum(p < 0.05 for p in null), 9)  # 3 expected; 9 or more has probability < 0.01
        planted = [simulate(0.5) for _ in range(20)]
        self.assertGreaterEqual(sum(p < 0.05 for _, p in planted), 16)
        self.assertAlmostEqual(float(np.mean([t[6][0] for t, _ in planted])), -0.5, delta=0.1)
        self.assertIsNone(pooled_phase_logit([(0, 0, 0, 50, 1), (0, 1, 1, 60, 1)], [0, 1]))
        # Crowding and distance moving together: a singular fit is refused, not reported.
        self.assertIsNone(pooled_phase_logit([(0, i % 2, i % 3, 100 * (i % 3), i % 5 > 1) for i in range(60)], [0, 1]))


if __name__ == "__main__":
    unittest.main()
