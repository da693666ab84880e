#!/usr/bin/python3
"""Tests of the lab: the task generator, the PyTorch model's maths, the export format and the C++
host (phasekv) against PyTorch.

  LAB_HOST=build/lab/lab_host /usr/bin/python3 -m unittest discover -s lab/tests -v

Oracles: lab/host/task.hpp against lab/task.py token for token; the vectorised attention of
lab/model.py against a direct float64 loop over the formulas of its docstring; the C++ host
(phasekv's compressors, paged cache and reader) against lab/model.py — logits within 1e-4 on
held-out sequences for every kind of attention, with weights scaled up so that gates, RoPE and
the joint softmax are far from uniform (at the default init every logit is near 0 and a wrong
slot order or rotation would hide in the noise).
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
from model import Attention, LabModel, ModelConfig, rope_tables  # noqa: E402
from task import TaskConfig, generate  # noqa: E402
from verify import compare  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
HOST = os.environ.get("LAB_HOST", os.path.join(ROOT, "build", "lab", "lab_host"))
TOL = 1e-4

TASK = TaskConfig(filler=8, keys=24, values=24, tokens=101, records=10, queries=3)

# (name, kind, stride, window, win_tokens, kv_heads): every kind, W = S and W = 2S, a stride that
# is not a power of two, GQA with two KV heads; 101 tokens is a multiple of none of the strides.
VARIANTS = [
    ("full", "full", 1, 1, 0, 1),
    ("gated_S4_W4", "gated", 4, 4, 8, 1),
    ("gated_S4_W8", "gated", 4, 8, 8, 1),
    ("gated_S6_W12_kv2", "gated", 6, 12, 8, 2),
    ("mean_S8_W8", "mean", 8, 8, 8, 1),
    ("mean_S2_W4", "mean", 2, 4, 5, 1),
    ("norope_S8_W8", "norope", 8, 8, 8, 1),
]


def make_model(kind, S, W, N, hkv, seed=0, scale=10.0):
    torch.manual_seed(seed)
    cfg = ModelConfig(kind=kind, vocab=TASK.vocab, dim=32, layers=2, q_heads=4, kv_heads=hkv, head_dim=8, ffn=48,
                      stride=S, window=W, win_tokens=N, rope_base=50.0)
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


class TaskParity(unittest.TestCase):
    @unittest.skipUnless(have_host(), f"no lab_host at {HOST}")
    def test_host_generates_the_same_sequences(self):
        with tempfile.TemporaryDirectory() as tmp:
            export(make_model("full", 1, 1, 0, 1), TASK.__dict__, tmp)
            for seed, target in [(0, -1), (7, -1), ((1 << 63) + 5, -1), (3, 0), (11, 40), (12, TASK.context - 2)]:
                args = [HOST, "task", "--model", tmp, "--seed", str(seed)]
                if target >= 0:
                    args += ["--target", str(target)]
                got = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
                toks, pos, ans, starts, _ = generate(TASK, seed, target)
                self.assertEqual(got["tokens"], toks, (seed, target))
                self.assertEqual(got["answer_positions"], pos)
                self.assertEqual(got["answers"], ans)
                self.assertEqual(got["record_starts"], starts)

    def test_sequences_hold_what_the_task_promises(self):
        for seed in range(50):
            target = -1 if seed % 2 else 3 + seed
            toks, pos, ans, starts, asked = generate(TASK, seed, target)
            self.assertEqual(len(toks), TASK.tokens)
            self.assertEqual(pos[-1], TASK.tokens - 1)
            keys = [toks[p] for p in starts]
            self.assertEqual(len(set(keys)), TASK.records)  # distinct keys
            for p in starts:
                self.assertTrue(TASK.filler <= toks[p] < TASK.filler + TASK.keys)
                self.assertTrue(TASK.filler + TASK.keys <= toks[p + 1] < TASK.query_token)
                self.assertLess(p + 1, TASK.context)
            for q, a in zip(pos, ans):
                self.assertEqual(toks[q - 1], TASK.query_token)
                k = starts[keys.index(toks[q])]
                self.assertEqual(toks[k + 1], a)  # the answer is the value after the asked key
            if target >= 0:
                self.assertEqual(toks[pos[-1]], toks[target])


def reference_attention(att, n_in):
    """Direct float64 loops over lab/model.py's formulas, one query position at a time."""
    cfg = att.cfg
    S, W, N, hq, hkv, dh, nb = cfg.stride, cfg.window, cfg.win_tokens, cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.branches
    x = n_in[0].double()
    T = x.shape[0]
    lin = lambda layer: x @ layer.weight.double().t()  # noqa: E731
    q = lin(att.wq).view(T, hq, dh)
    ck, cv = lin(att.ck).view(T, hkv, nb, dh), lin(att.cv).view(T, hkv, nb, dh)
    if cfg.gated:
        zk, zv = lin(att.zk).view(T, hkv, nb, dh), lin(att.zv).view(T, hkv, nb, dh)

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

    def entry(j, payload, logits, bias, h):
        slots = [i for i in range(W) if (j + 1) * S - W + i >= 0]
        xs = torch.stack([payload[(j + 1) * S - W + i, h, (W - 1 - i) // S] for i in slots])
        if logits is None:
            return xs.mean(0)
        ss = torch.stack([logits[(j + 1) * S - W + i, h, (W - 1 - i) // S] + bias[h, i].double() for i in slots])
        return (torch.softmax(ss, 0) * xs).sum(0)

    out = torch.zeros(T, hq, dh, dtype=torch.float64)
    for t in range(T):
        for hh in range(hq):
            h = hh // (hq // hkv)
            qv = rot(q[t, hh], t)
            ks, vs = [], []
            for j in range((t + 1) // S):
                ks.append(rot(entry(j, ck, zk if cfg.gated else None, att.bias_k if cfg.gated else None, h), j * S))
                vs.append(entry(j, cv, zv if cfg.gated else None, att.bias_v if cfg.gated else None, h))
            if N > 0:
                kw = lin(att.wk).view(T, hkv, dh)
                vw = lin(att.wv).view(T, hkv, dh)
                for u in range(max(0, t - N + 1), t + 1):
                    ks.append(rot(kw[u, h], u))
                    vs.append(vw[u, h])
            logits = torch.stack([qv @ k for k in ks]) / math.sqrt(dh)
            out[t, hh] = torch.softmax(logits, 0) @ torch.stack(vs)
    return out.reshape(T, hq * dh) @ att.wo.weight.double().t()


class ModelMaths(unittest.TestCase):
    def test_attention_is_the_documented_formula(self):
        for name, kind, S, W, N, hkv in VARIANTS:
            with self.subTest(name):
                m = make_model(kind, S, W, N, hkv, scale=5.0)
                att = m.blocks[0].attn
                n_in = torch.randn(1, 29, m.cfg.dim)
                with torch.no_grad():
                    got = att(n_in)[0].double()
                want = reference_attention(att, n_in)
                self.assertLess((got - want).abs().max().item(), 1e-4 * max(1.0, want.abs().max().item()))

    def test_gather_and_block_paths_agree(self):
        for name, kind, S, W, N, hkv in VARIANTS:
            with self.subTest(name):
                m = make_model(kind, S, W, N, hkv)
                x = torch.tensor([generate(TASK, 100 + i)[0] for i in range(2)])
                with torch.no_grad():
                    every = m(x)
                    some = m(x, positions=torch.tensor([5, 50, 100]))
                    for b in m.blocks:
                        b.attn.force_gather = True
                    gathered = m(x)
                self.assertLess((every[:, [5, 50, 100]] - some).abs().max().item(), 1e-4)
                self.assertLess((every - gathered).abs().max().item(), 1e-4)

    def test_rope_tables_are_the_half_split_frequencies(self):
        c, s = rope_tables(torch.tensor([3]), 8, 50.0)
        for k in range(4):
            self.assertAlmostEqual(c[0, k].item(), math.cos(3 * 50.0 ** (-2 * k / 8)), places=6)
            self.assertAlmostEqual(s[0, k].item(), math.sin(3 * 50.0 ** (-2 * k / 8)), places=6)


@unittest.skipUnless(have_host(), f"no lab_host at {HOST}")
class HostLogits(unittest.TestCase):
    def test_logits_equal_torch_for_every_kind(self):
        for name, kind, S, W, N, hkv in VARIANTS:
            with self.subTest(name), tempfile.TemporaryDirectory() as tmp:
                m = make_model(kind, S, W, N, hkv)
                export(m, TASK.__dict__, tmp)
                diff, scale = compare(m, TASK.__dict__, tmp, HOST, count=3)
                print(f"  {name}: max |torch - phasekv| = {diff:.2e} (max |logit| {scale:.1f})", file=sys.stderr)
                self.assertGreater(scale, 1.0)  # the check is not on near-zero logits
                self.assertLess(diff, TOL)

    def test_a_changed_weight_is_detected(self):
        # The comparison can fail: one perturbed slot bias (the tail slot of layer 1's key gates)
        # must move the host's logits away from the unperturbed torch model's.
        m = make_model("gated", 4, 4, 8, 1)
        with tempfile.TemporaryDirectory() as tmp:
            with torch.no_grad():
                m.blocks[1].attn.bias_k[0, 3] += 3.0
            export(m, TASK.__dict__, tmp)
            with torch.no_grad():
                m.blocks[1].attn.bias_k[0, 3] -= 3.0
            diff, _ = compare(m, TASK.__dict__, tmp, HOST, count=1)
            self.assertGreater(diff, 1e-2)


@unittest.skipUnless(have_host(), f"no lab_host at {HOST}")
class HostErrors(unittest.TestCase):
    def run_host(self, *args):
        return subprocess.run([HOST, *args], capture_output=True, text=True)

    def test_bad_options_exit_2_naming_the_option(self):
        with tempfile.TemporaryDirectory() as tmp:
            export(make_model("gated", 4, 4, 8, 1), TASK.__dict__, tmp)
            for args, option in [(["measure", "--model", tmp, "--out", tmp, "--trials", "3"], "--trials"),
                                 (["measure", "--model", tmp, "--out", tmp, "--trials", "x"], "--trials"),
                                 (["measure", "--model", tmp, "--out", tmp, "--modulus", "6"], "--modulus"),
                                 (["measure", "--model", tmp, "--out", tmp, "--knockout-trials", "5"], "--knockout-trials"),
                                 (["measure", "--model", tmp], "--out"),
                                 (["task", "--model", tmp, "--frobnicate", "1"], "--frobnicate"),
                                 (["task", "--model", tmp, "--target", "100"], "--target"),
                                 (["logits", "--model", tmp + "/nowhere", "--input", "a", "--output", "b"], "--model")]:
                r = self.run_host(*args)
                self.assertEqual(r.returncode, 2, (args, r.stderr))
                self.assertIn(option, r.stderr)

    def test_a_manifest_for_another_kind_is_refused(self):
        # A gated export relabelled as mean: the gate tensors would be silently ignored.
        with tempfile.TemporaryDirectory() as tmp:
            export(make_model("gated", 4, 4, 8, 1), TASK.__dict__, tmp)
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
            export(make_model("mean", 8, 8, 8, 1), TASK.__dict__, tmp)
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
            self.check([os.path.join(lab, "run"), "--frobnicate"], "--frobnicate")
            self.check([os.path.join(lab, "run"), "--only"], "--only")


if __name__ == "__main__":
    unittest.main()
