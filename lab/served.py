#!/usr/bin/python3
"""A trained lab model served over HTTP through phasekv, and measured by phasekv.served's client.

  /usr/bin/python3 lab/served.py serve   --model EXPORT [--host build/lab/lab_host] [--faults K]
  /usr/bin/python3 lab/served.py measure --endpoint URL --model EXPORT --out DIR --experiment needle|padding
                                         [--host …] [--trials N] [--seed K] [--concurrency C] …
  /usr/bin/python3 lab/served.py run     --model EXPORT --out DIR [--host …] [--trials N] [--seed K]
      (serve + both experiments + the lab's own sweep of the same model, tables side by side)

The server is phasekv.served.testserver's OpenAI-compatible ``/v1/completions`` on 127.0.0.1 with
the lab model as its ``ServedModel``: every prompt goes to one persistent ``lab_host serve``
process, which runs the exported model (lab/export.py) through phasekv's compressors, paged
caches and sparse reader — the C++ forward `lab/verify.py` holds to PyTorch — and returns the
logits at every position; the answer's logprobs are their log-softmax. Decoding is greedy.

The vocabulary is the lab task's (lab/task.py): ids [0, F) filler, then keys, values, the query
marker; ``LabTokenizer`` writes them as the words " f3", " k12", " v40", " Q" (one token per word,
so text and ids map one to one and the padding experiment's re-encoding checks hold).

**needle**: the trials of the lab's own main sweep (``lab_host plan``: same seeds, targets and
queries as ``lab_host measure`` with the same --trials and --seed), each prompt the trial's
sequence up to and including its query (the last question's key); the answer is right when the
generated token is the target's value. Analysed by residue t mod M of the target's key (M = 2S
as the lab's sweep; Wilson intervals, chi-square homogeneity).

**padding**: phasekv.served.padding's experiment on lab prompts: a prompt of the task (one
per --padding-prompts, the lab's task scaled to T − periods·S tokens so the longest padding fits
the trained length), filler words as padding units in front, candidates the target's value and
another record's value, read from the generated position's logprobs over the whole vocabulary;
P(right | candidates) per trial. Each prompt's own table (DIR/paddingI.txt) is by the answer
position's residue, as the padding analysis reports it; the prompts are pooled by the residue of
the target's key, (key + padding) mod S — the whole prompt shifts with the padding, so that is
the answer's residue moved by a constant per prompt, and the frame the lab's sweep reports in.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import struct
import subprocess
import sys
import threading
from typing import Sequence

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
from task import TaskConfig, generate  # noqa: E402

from phasekv import _phasekv as _pk  # noqa: E402
from phasekv.served import client as _client  # noqa: E402
from phasekv.served import padding as _padding  # noqa: E402
from phasekv.served.errors import EndpointError, PlacementError, ServedInputError  # noqa: E402
from phasekv.served.responses import parse_completion  # noqa: E402
from phasekv.served.testserver import CompletionServer, Faults  # noqa: E402

NEEDLE_FORMAT = "phasekv.lab.served/1"
DEFAULT_HOST = HERE.parent / "build" / "lab" / "lab_host"


# ---- the export's configuration ------------------------------------------------------------------

def read_export(model_dir: str | os.PathLike) -> tuple[dict, TaskConfig]:
    """(model configuration, task) from EXPORT/model.txt (lab/README.md, "Export format")."""
    path = pathlib.Path(model_dir) / "model.txt"
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ServedInputError(f"--model: {e}") from None
    if not lines or lines[0] != "phasekv-lab-model 2":
        raise ServedInputError(f"--model: {path} is not a lab export (first line {lines[:1]!r})")
    config, task = {}, {}
    for line in lines[1:]:
        parts = line.split()
        if not parts or parts[0] in ("tensor", "end"):
            continue
        key, value = parts[0], " ".join(parts[1:])
        (task if key.startswith("task_") else config)[key.removeprefix("task_")] = value
    fields = {f.name: f.type for f in dataclasses.fields(TaskConfig)}
    kw = {k: (v if fields[k] in ("str", str) else int(v)) for k, v in task.items() if k in fields}
    return config, TaskConfig(**kw)


# ---- the tokenizer ---------------------------------------------------------------------------------

class LabTokenizer:
    """phasekv.served's tokenizer protocol over the lab's integer vocabulary: one word per id."""

    def __init__(self, task: TaskConfig):
        self.task = task
        words = ([f"f{i}" for i in range(task.filler)] + [f"k{i}" for i in range(task.keys)]
                 + [f"v{i}" for i in range(task.values)] + ["Q"])
        self.words = words
        self.index = {w: i for i, w in enumerate(words)}
        self.name = f"lab:F{task.filler}-K{task.keys}-V{task.values}"

    bos_id = None
    eos_id = None

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        out = []
        for w in text.split():
            if w not in self.index:
                raise ServedInputError(f"{w!r} is not a word of the lab vocabulary ({self.name})")
            out.append(self.index[w])
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.piece(i) for i in ids)

    def piece(self, i: int) -> str:
        return " " + self.words[int(i)]


# ---- the model through phasekv (lab_host serve) -------------------------------------------------------

class LabHost:
    """One `lab_host serve` process: logits(ids) -> float32 [len(ids)][vocab], one prompt at a time."""

    def __init__(self, host: str | os.PathLike, model_dir: str | os.PathLike, vocab: int, max_tokens: int = 512):
        if not os.access(host, os.X_OK):
            raise ServedInputError(f"--host: {host} is not an executable lab_host (build it: lab/run, or "
                                   "cmake -S lab/host -B build/lab && cmake --build build/lab)")
        self.vocab, self.max_tokens = vocab, max_tokens
        self._proc = subprocess.Popen([str(host), "serve", "--model", str(model_dir), "--max-tokens", str(max_tokens)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lock = threading.Lock()

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        n = len(ids)
        if not 1 <= n <= self.max_tokens:
            raise ValueError(f"prompt: {n} tokens; this model takes 1 to {self.max_tokens}")
        data = struct.pack(f"<i{n}i", n, *[int(i) for i in ids])
        with self._lock:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
            raw = self._proc.stdout.read(4 * n * self.vocab)
        if len(raw) != 4 * n * self.vocab:
            raise RuntimeError(f"lab_host serve ended (exit {self._proc.poll()})")
        return np.frombuffer(raw, "<f4").reshape(n, self.vocab)

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write(struct.pack("<i", 0))
                self._proc.stdin.close()
            except OSError:
                pass
            self._proc.wait(10)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


class LabServedModel:
    """testserver's ServedModel: logprobs(ids) = the next-token log-softmax after ids, over the
    whole vocabulary. One forward gives every position's logits; the model is causal, so row k−1
    of a prompt's forward is the distribution after its first k tokens: the echo of a prompt
    (one distribution per prefix) is read from the prompt's own forward, kept for a few prompts."""

    background = math.log(1e-30)

    def __init__(self, host: LabHost, keep: int = 16):
        self.host = host
        self.keep = keep
        self._recent: list[tuple[np.ndarray, np.ndarray]] = []
        self._lock = threading.Lock()
        self.forwards = 0

    def logprobs(self, ids: Sequence[int]) -> dict[int, float]:
        a = np.asarray(ids, np.int64)
        with self._lock:
            for seq, lp in self._recent:
                if len(seq) >= len(a) and np.array_equal(seq[:len(a)], a):
                    row = lp[len(a) - 1]
                    break
            else:
                row = None
        if row is None:
            lp = log_softmax(self.host.logits(a))
            with self._lock:
                self.forwards += 1
                self._recent.append((a, lp))
                del self._recent[:-self.keep]
            row = lp[-1]
        return {i: float(v) for i, v in enumerate(row)}


def make_server(model_dir, host=DEFAULT_HOST, *, faults: Faults | None = None, name: str = "lab") -> CompletionServer:
    config, task = read_export(model_dir)
    tok = LabTokenizer(task)
    model = LabServedModel(LabHost(host, model_dir, int(config["vocab"])))
    server = CompletionServer(model, tok, faults=faults, echo_window=1 << 20, model_name=name, idle_seconds=3600)
    server.lab_host = model.host
    return server


# ---- the needle experiment: the lab's own planned trials over HTTP -----------------------------------

@dataclasses.dataclass(frozen=True)
class Trial:
    trial_id: int
    seed: int
    target: int
    trail: int


def lab_plan(host, model_dir, *, trials: int, seed: int) -> tuple[dict, list[Trial], int]:
    """(the sweep's task as lab_host states it, the main sweep's trials, modulus M): the
    placements `lab_host measure --trials N --seed K` runs, in its order."""
    config, _ = read_export(model_dir)
    stride = int(config["stride"])
    M = 2 * (stride if stride > 1 else 8)
    if not os.access(host, os.X_OK):
        raise ServedInputError(f"--host: {host} is not an executable lab_host")
    run = subprocess.run([str(host), "plan", "--model", str(model_dir), "--trials", str(trials), "--seed", str(seed),
                          "--count", str(trials * M)], capture_output=True, text=True)
    if run.returncode != 0:
        raise ServedInputError("lab_host plan refused the sweep: " + run.stderr.strip().splitlines()[0])
    out = run.stdout.splitlines()
    task = json.loads(out[0].removeprefix("task "))
    plan = [Trial(i, int(s), int(t), int(u)) for i, (s, t, u) in enumerate(line.split() for line in out[1:] if line.strip())]
    return task, plan, M


def task_of(task_json: dict) -> TaskConfig:
    fields = {f.name for f in dataclasses.fields(TaskConfig)}
    return TaskConfig(**{k: v for k, v in task_json.items() if k in fields})


def needle_id(model_dir, trials: int, seed: int) -> str:
    weights = hashlib.sha256((pathlib.Path(model_dir) / "weights.bin").read_bytes()).hexdigest()[:16]
    return hashlib.sha256(json.dumps([weights, trials, seed]).encode()).hexdigest()[:16]


def needle_jobs(task: TaskConfig, plan: Sequence[Trial], tok: LabTokenizer, M: int, sweep_id: str):
    for tr in plan:
        yield _needle_job(task, tr, tok, M, sweep_id)


def _needle_job(task: TaskConfig, tr: Trial, tok: LabTokenizer, M: int, sweep_id: str) -> _client.Job:
    def sequence():
        s = generate(task, tr.seed, tr.target, tr.trail)
        return s, s.tokens[:s.query_position + 1]

    base = {"format": NEEDLE_FORMAT, "sweep_id": sweep_id, "trial_id": tr.trial_id, "seed": tr.seed,
            "target": tr.target, "residue": tr.target % M, "query": task.tokens - 1 - tr.trail}

    def body():
        _, ids = sequence()
        return {"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 5}

    def finish(response, info):
        s, ids = sequence()
        c = parse_completion(response, prompt_ids=ids)
        if c.prompt_tokens is not None and c.prompt_tokens != len(ids):
            raise ValueError(f"the server counted {c.prompt_tokens} prompt tokens, not {len(ids)}")
        expected = tok.piece(s.answers[-1])
        line = dict(base)
        line.update({"outcome": int(c.text == expected), "answer_text": c.text, "expected": expected,
                     "prompt_sha256": hashlib.sha256(np.asarray(ids, "<i8").tobytes()).hexdigest(),
                     "logprob_answer": c.generated[0].logprob if c.generated else None,
                     "latency_s": info.get("latency_s"), "endpoint": info.get("endpoint"),
                     "attempts": info.get("attempts")})
        return line

    def fail(reason, info):
        line = dict(base)
        line.update({"error": reason, "endpoint": info.get("endpoint"), "attempts": info.get("attempts")})
        return line

    return _client.Job(key=tr.trial_id, body=body, finish=finish, fail=fail)


def read_lines(path, sweep_id: str) -> dict[int, dict]:
    out: dict[int, dict] = {}
    if not os.path.exists(path):
        return out
    for raw in open(path):
        if not raw.strip():
            continue
        line = json.loads(raw)
        if line.get("sweep_id") != sweep_id:
            raise ServedInputError(f"{path}: a line of another sweep ({line.get('sweep_id')}): use another --out")
        k = line["trial_id"]
        if k not in out or ("outcome" in line and "outcome" not in out[k]):
            out[k] = line
    return out


def residue_table(successes: Sequence[int], trials: Sequence[int]) -> dict:
    """Per residue accuracy with Wilson 95% intervals, the worst residue, Pearson's chi-square
    test that all residues share one rate."""
    rows = []
    for r, (k, n) in enumerate(zip(successes, trials)):
        w = _pk.stats.wilson_interval(int(k), int(n))
        rows.append({"residue": r, "n": int(n), "successes": int(k), "accuracy": k / n if n else math.nan,
                     "low": w.low, "high": w.high})
    chi = _pk.stats.chi_square_homogeneity([int(k) for k in successes], [int(n) for n in trials])
    acc = [row["accuracy"] for row in rows]
    worst = int(np.argmin(acc))
    return {"residues": rows, "worst": worst, "best": int(np.argmax(acc)), "chi_square": chi.statistic,
            "dof": chi.dof, "p": chi.p_value, "mean": float(sum(successes) / max(1, sum(trials)))}


def needle_table(lines: dict[int, dict], M: int) -> dict:
    k, n = [0] * M, [0] * M
    for line in lines.values():
        if "outcome" in line:
            n[line["residue"]] += 1
            k[line["residue"]] += line["outcome"]
    return residue_table(k, n)


def lab_sweep_table(measure_dir, M: int) -> dict:
    """The same table from `lab_host measure`'s own per-trial file (uniform_trials.csv)."""
    k, n = [0] * M, [0] * M
    per_trial = {}
    with open(pathlib.Path(measure_dir) / "uniform_trials.csv") as f:
        header = f.readline().strip().split(",")
        for row in f:
            d = dict(zip(header, row.strip().split(",")))
            r = int(d["residue"])
            n[r] += 1
            k[r] += int(d["success"])
            per_trial[(int(d["target"]), int(d["query"]), int(d["trial"]))] = int(d["success"])
    table = residue_table(k, n)
    table["per_trial"] = per_trial
    return table


def format_table(title: str, table: dict) -> str:
    out = [title, f"{'residue':>8} {'trials':>7} {'accuracy%':>10} {'95% CI':>18}"]
    for row in table["residues"]:
        mark = " worst" if row["residue"] == table["worst"] else ""
        out.append(f"{row['residue']:>8} {row['n']:>7} {100 * row['accuracy']:>10.2f}  "
                   f"[{100 * row['low']:6.2f}, {100 * row['high']:6.2f}]{mark}")
    out.append(f"mean {100 * table['mean']:.2f}%; homogeneity chi-square {table['chi_square']:.2f}, "
               f"dof {table['dof']}, p = {table['p']:.3g}")
    return "\n".join(out)


# ---- the padding experiment on lab prompts -------------------------------------------------------------

def padding_specs(task: TaskConfig, tok: LabTokenizer, *, prompts: int, periods: int, stride: int, seed: int):
    """(PaddingSpec, key position, answer position without padding) per prompt: a task sequence
    of T − periods·S tokens (density kept as train.py's curriculum scales it) up to its query;
    candidates the target's value and the value of another record with a different value."""
    short = task.tokens - periods * max(stride, 1)
    scale = short / task.tokens
    t = dataclasses.replace(task, tokens=short, records=max(2, round(task.records * scale)),
                            queries=max(1, round(task.queries * scale)), decoys=round(task.decoys * scale))
    out = []
    k = 0
    while len(out) < prompts:
        s = generate(t, (1 << 63) + (1 << 59) + (seed << 32) + k)
        k += 1
        target = s.asked[-1]
        right = s.answers[-1]
        others = [s.tokens[p + 1 + t.gap] for i, p in enumerate(s.record_starts) if i != target]
        others = [v for v in others if v != right]
        if not others:
            continue
        body = tok.decode(s.tokens[:s.query_position + 1])
        units = tuple(tok.piece(i) for i in range(task.filler))
        spec = _padding.PaddingSpec(prompt="{padding}" + body, candidates=(tok.piece(right), tok.piece(others[0])),
                                    answer=tok.piece(right), units=units,
                                    description=f"lab task sequence, seed {(1 << 63) + (1 << 59) + (seed << 32) + k - 1}")
        out.append((spec, s.record_starts[target], s.query_position + 1))
    return out


# ---- parity with PyTorch on the served path ---------------------------------------------------------

def torch_model(model_dir):
    """The export loaded back into lab/model.py's LabModel (tensors in export.py's order)."""
    import torch
    from export import tensors
    from model import LabModel, ModelConfig

    config, _ = read_export(model_dir)
    kw = {}
    for f in dataclasses.fields(ModelConfig):
        v = config[f.name]
        kw[f.name] = (v if f.name == "kind" else float(v) if f.name in ("rope_base", "norm_eps")
                      else bool(int(v)) if f.name == "token_shift" else int(v))
    model = LabModel(ModelConfig(**kw))
    raw = np.fromfile(pathlib.Path(model_dir) / "weights.bin", "<f4")
    at = 0
    with torch.no_grad():
        for _, t in tensors(model):
            n = t.numel()
            t.copy_(torch.from_numpy(raw[at:at + n].reshape(tuple(t.shape)).copy()))
            at += n
    if at != raw.size:
        raise ServedInputError(f"--model: weights.bin holds {raw.size} floats, the model {at}")
    model.eval()
    return model


def served_parity(model_dir, url: str, *, prompts: int = 8, seed: int = 1) -> dict:
    """max |torch − served| of the next-token log-probabilities over the whole vocabulary, read
    from HTTP responses (``logprobs: vocab``), for held-out task prefixes of every length class
    (seeds 2^63 + 2^60 + 2^40 + i: never trained on); relative to max(1, max |torch|), the lab's
    criterion (lab/verify.py)."""
    import torch

    config, task = read_export(model_dir)
    tok = LabTokenizer(task)
    model = torch_model(model_dir)
    client = _client.CompletionClient([url], "lab", progress=False, retries=6, backoff=0.05)
    worst, scale = 0.0, 0.0
    for i in range(prompts):
        s = generate(task, (1 << 63) + (1 << 60) + (1 << 40) + (seed << 20) + i)
        ids = s.tokens[:s.answer_positions[i % len(s.answer_positions)] + 1]
        response, _ = client.request({"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": tok.vocab_size})
        top = parse_completion(response).generated[0].top
        got = np.asarray([top[tok.piece(v)] for v in range(tok.vocab_size)])
        with torch.no_grad():
            ref = torch.log_softmax(model(torch.tensor([ids]))[0, -1].double(), -1).numpy()
        worst = max(worst, float(np.abs(ref - got).max()))
        scale = max(scale, float(np.abs(ref).max()))
    return {"max_abs_diff": worst, "max_abs_torch": scale, "relative_diff": worst / max(1.0, scale),
            "prompts": prompts}


# ---- command line ----------------------------------------------------------------------------------

def cmd_serve(a) -> int:
    faults = Faults(rate_limit_every=a.faults, retry_after=0.01) if a.faults else None
    with make_server(a.model, a.host, faults=faults) as server:
        print(f"serving lab model {a.model} through phasekv at {server.url}", flush=True)
        try:
            server._stopped.wait()
        except KeyboardInterrupt:
            pass
        server.lab_host.close()
    return 0


def make_client(a, endpoints):
    return _client.CompletionClient(endpoints, "lab", concurrency=a.concurrency, timeout=a.timeout,
                                    retries=a.retries, backoff=a.backoff, progress=not a.quiet, seed=a.seed)


def measure_needle(a, endpoint) -> dict:
    config, _ = read_export(a.model)
    task_json, plan, M = lab_plan(a.host, a.model, trials=a.trials, seed=a.seed)
    task = task_of(task_json)
    tok = LabTokenizer(task)
    sweep_id = needle_id(a.model, a.trials, a.seed)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "outcomes.jsonl"
    read_lines(path, sweep_id)  # refuses another sweep's file
    client = make_client(a, [endpoint])
    # Preflight: the first trial's request (with the run's retries: a resumed run meets the same
    # faults as any other request) must come back with a generated token and its logprobs,
    # before any outcome is written.
    try:
        response, _ = client.request(_needle_job(task, plan[0], tok, M, sweep_id).body())
    except _client.RequestFailed as e:
        raise EndpointError(f"endpoint {endpoint}: {e}") from None
    if not parse_completion(response).generated:
        raise EndpointError(f"endpoint {endpoint}: no logprobs in its response")
    client.run(needle_jobs(task, plan, tok, M, sweep_id), path, total=len(plan))
    lines = read_lines(path, sweep_id)
    table = needle_table(lines, M)
    table["errored"] = sum(1 for x in lines.values() if "outcome" not in x)
    table["missing"] = len(plan) - len(lines)
    (out / "needle.json").write_text(json.dumps(table, indent=1))
    return table


def measure_padding(a, endpoint) -> dict:
    config, task = read_export(a.model)
    stride = int(config["stride"])
    S = stride if stride > 1 else 8
    tok = LabTokenizer(task)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    pooled: dict[int, list[float]] = {r: [] for r in range(S)}
    aligned: dict[int, list[float]] = {r: [] for r in range(S)}  # by the target key's residue
    client = make_client(a, [endpoint])
    checked = False
    for i, (spec, key, answer) in enumerate(padding_specs(task, tok, prompts=a.padding_prompts, periods=a.periods,
                                                          stride=S, seed=a.seed)):
        # scoring "top": one request per trial, the candidates read from the generated position's
        # logprobs over the whole vocabulary (no echo needed)
        ex = _padding.PaddingExperiment(spec, tok, stride=S, periods=a.periods, reps=a.reps, scoring="top",
                                        top=tok.vocab_size)
        if not checked:  # preflight, with the run's retries: the candidates must be readable
            first = next(ex.trials())
            try:
                response, _ = client.request(ex.bodies(first)[0])
            except _client.RequestFailed as e:
                raise EndpointError(f"endpoint {endpoint}: {e}") from None
            ex.candidate_logprobs(first, [response])
            checked = True
        path = out / f"padding{i}.jsonl"
        client.run(ex.jobs(), path, total=ex.total)
        lines = _padding.read_padding_lines([path], ex.sweep_id)
        an = _padding.analyze_padding(ex, lines, label=f"prompt {i}")
        for trial in ex.trials():
            line = lines.get(trial.trial_id)
            if line and "outcome" in line:
                pooled[trial.residue].append(float(line["outcome"]))
                aligned[(key + trial.padding) % S].append(float(line["outcome"]))
        (out / f"padding{i}.txt").write_text(an.table() + "\n")
    rows = []
    for r in range(S):
        v = np.asarray(aligned[r])
        mean = float(v.mean()) if len(v) else math.nan
        half = _padding._t_quantile(len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v)) if len(v) > 1 else math.nan
        rows.append({"key_residue": r, "n": len(v), "mean": mean, "low": max(0.0, mean - half),
                     "high": min(1.0, mean + half)})
    groups = [aligned[r] for r in range(S) if aligned[r]]
    anova = _pk.stats.anova_homogeneity(groups)
    result = {"by_key_residue": rows, "worst_key_residue": int(np.nanargmin([r["mean"] for r in rows])),
              "anova_f": anova.f_statistic, "anova_p": anova.p_value, "stride": S}
    (out / "padding.json").write_text(json.dumps(result, indent=1))
    return result


def format_padding(title: str, result: dict) -> str:
    out = [title, f"{'key residue':>12} {'n':>5} {'P(right)%':>10} {'95% CI':>18}"]
    for r in result["by_key_residue"]:
        mark = " worst" if r["key_residue"] == result["worst_key_residue"] else ""
        out.append(f"{r['key_residue']:>12} {r['n']:>5} {100 * r['mean']:>10.2f}  "
                   f"[{100 * r['low']:6.2f}, {100 * r['high']:6.2f}]{mark}")
    out.append(f"one-way ANOVA across residues: F = {result['anova_f']:.2f}, p = {result['anova_p']:.3g}")
    return "\n".join(out)


def cmd_measure(a) -> int:
    if a.experiment == "needle":
        t = measure_needle(a, a.endpoint)
        print(format_table(f"needle through HTTP: {a.model}", t))
        return 0 if t["errored"] == 0 and t["missing"] == 0 else 1
    print(format_padding(f"padding through HTTP: {a.model}", measure_padding(a, a.endpoint)))
    return 0


def cmd_run(a) -> int:
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    measure_dir = out / "lab_measure"
    subprocess.run([str(a.host), "measure", "--model", str(a.model), "--out", str(measure_dir), "--trials", str(a.trials),
                    "--seed", str(a.seed), "--isolated-trials", "0", "--knockout-trials", "0", "--calibration", "1",
                    "--quiet"], check=True)
    _, _, M = lab_plan(a.host, a.model, trials=a.trials, seed=a.seed)
    lab = lab_sweep_table(measure_dir, M)
    with make_server(a.model, a.host) as server:
        try:
            parity = served_parity(a.model, server.url)
            print(f"parity with torch on the served path: max |torch - served| log-prob {parity['max_abs_diff']:.3g} "
                  f"over {parity['prompts']} prompts (relative {parity['relative_diff']:.3g})")
        except ImportError:
            print("parity with torch: torch not installed, not checked")
        a.out = str(out / "needle")
        needle = measure_needle(a, server.url)
        a.out = str(out / "padding")
        pad = measure_padding(a, server.url)
        server.lab_host.close()
    print(format_table(f"lab_host measure (the lab's own sweep): {a.model}", lab))
    lines = read_lines(out / "needle" / "outcomes.jsonl", needle_id(a.model, a.trials, a.seed))
    http = sorted((x["target"], x["query"], x["outcome"]) for x in lines.values() if "outcome" in x)
    ref = sorted((t, q, v) for (t, q, _), v in lab["per_trial"].items())
    same = sum(1 for x, y in zip(http, ref) if x == y)
    print(format_table(f"needle through HTTP: {a.model}", needle))
    print(f"trials answered alike over HTTP and in the lab's sweep: {same} of {len(ref)}")
    print(format_padding(f"padding through HTTP: {a.model}", pad))
    return 0


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="lab/served.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("serve", "measure", "run"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True, help="an export folder (lab/export.py)")
        p.add_argument("--host", default=str(DEFAULT_HOST), help="the lab_host binary (default: %(default)s)")
        if name == "serve":
            p.add_argument("--faults", type=int, default=0, help="answer every k-th request 429 (default: off)")
            continue
        if name == "measure":
            p.add_argument("--endpoint", required=True)
            p.add_argument("--experiment", choices=("needle", "padding"), required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--trials", type=int, default=32, help="needle trials per residue (default: %(default)s)")
        p.add_argument("--seed", type=int, default=1, help="the sweep's seed, as lab_host measure's (default: %(default)s)")
        p.add_argument("--padding-prompts", type=int, default=4, help="padding: base prompts (default: %(default)s)")
        p.add_argument("--periods", type=int, default=2, help="padding: periods of S (default: %(default)s)")
        p.add_argument("--reps", type=int, default=2, help="padding: repetitions per length (default: %(default)s)")
        p.add_argument("--concurrency", type=int, default=2, help="requests in flight (default: %(default)s)")
        p.add_argument("--timeout", type=float, default=60.0, help="seconds per request (default: %(default)s)")
        p.add_argument("--retries", type=int, default=6, help="(default: %(default)s)")
        p.add_argument("--backoff", type=float, default=0.05, help="seconds, doubled per retry (default: %(default)s)")
        p.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    try:
        return {"serve": cmd_serve, "measure": cmd_measure, "run": cmd_run}[a.command](a)
    except (ServedInputError, EndpointError, PlacementError) as e:
        print(f"lab/served.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
