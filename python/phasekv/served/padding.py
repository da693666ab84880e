"""The padding experiment: one prompt, moved against the compression grid a token at a time.

A prompt has one padding slot (``{padding}``); the candidates are its possible continuations
(the study: " 8" vs " 32" after a code prompt). Trial (p, r) puts p padding units in the slot for
p in [0, periods·S): rep 0 the first unit p times, rep r > 0 units drawn from the list with seed r
(repetitions must differ: identical prompts would be one observation counted r times; units that
are not one token where they stand are dropped, none left is an error): the answer's position
a = len(prompt) moves by one per unit, through every residue a mod S, `periods` times. Every unit
is checked to be exactly one token where it stands (``check_units``: k units re-encode to k tokens
between the prompt's head and body, for k = 1, 2, 3 and the longest padding), and the answer is
read at the planned position. Per trial the log-probability of every candidate:

    score           prompt + candidate with ``echo`` and ``logprobs``: the candidate's tokens' logprobs
                    summed (OpenAI legacy, vLLM, SGLang)
    prompt_logprobs the same through vLLM's ``prompt_logprobs`` field
    top             one generated token with ``logprobs`` = k: each candidate's first token among the
                    top k (candidates must be one token each; a candidate not among them errors)

The outcome is P(answer | candidates) = softmax of the candidates' logprobs at the answer. The
analysis (``analyze_padding``): by residue (a − origin) mod S, the mean with a t interval
(Student t via phasekv.stats' F tail), a one-way ANOVA across residues (homogeneity), and the
period of the per-length profile: phasekv.stats' dominant period, and the fold fraction at S
against a permutation null (lengths shuffled). Lines (format ``phasekv.served.padding/1``) are
appended by the client as they arrive, so a padding run resumes like a needle sweep.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from .. import _phasekv as _pk
from .client import Job
from .errors import EndpointError, PlacementError, ServedInputError
from .responses import parse_completion
from .tokenizers import Tokenizer

PADDING_FORMAT = "phasekv.served.padding/1"
SCORING = ("score", "prompt_logprobs", "top")
EXAMPLES = pathlib.Path(__file__).parent / "examples"


@dataclasses.dataclass(frozen=True)
class PaddingSpec:
    """A prompt with one ``{padding}`` slot, its candidates and the right one, and the padding
    units to try (from a JSON file: load_spec)."""

    prompt: str
    candidates: tuple
    answer: str
    units: tuple = (" the",)
    description: str = ""

    def __post_init__(self) -> None:
        if self.prompt.count("{padding}") != 1:
            raise ServedInputError(f"prompt: must hold exactly one {{padding}} slot (holds {self.prompt.count('{padding}')})")
        if len(self.candidates) < 2 or len(set(self.candidates)) != len(self.candidates):
            raise ServedInputError(f"candidates = {list(self.candidates)!r}: need at least two distinct continuations")
        if self.answer not in self.candidates:
            raise ServedInputError(f"answer = {self.answer!r}: must be one of the candidates {list(self.candidates)!r}")
        if not self.units or any(not isinstance(u, str) or not u for u in self.units):
            raise ServedInputError(f"units = {list(self.units)!r}: need at least one non-empty padding unit")

    @property
    def head(self) -> str:
        return self.prompt.split("{padding}")[0]

    @property
    def body(self) -> str:
        return self.prompt.split("{padding}")[1]


def load_spec(path: str | pathlib.Path) -> PaddingSpec:
    """A PaddingSpec from JSON: {"prompt", "candidates", "answer", "units"?, "description"?}."""
    try:
        data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ServedInputError(f"padding prompt file {str(path)!r}: {e}") from None
    if not isinstance(data, dict):
        raise ServedInputError(f"padding prompt file {str(path)!r}: must be a JSON object")
    unknown = set(data) - {"prompt", "candidates", "answer", "units", "description"}
    if unknown:
        raise ServedInputError(f"padding prompt file {str(path)!r}: unknown field(s) {sorted(unknown)}")
    try:
        return PaddingSpec(prompt=data["prompt"], candidates=tuple(data["candidates"]), answer=data["answer"],
                           units=tuple(data.get("units", (" the",))), description=data.get("description", ""))
    except KeyError as e:
        raise ServedInputError(f"padding prompt file {str(path)!r}: missing field {e.args[0]!r}") from None


@dataclasses.dataclass(frozen=True)
class PaddingTrial:
    trial_id: int
    padding: int
    rep: int
    unit: str
    ids: tuple  # prompt ids (prefix included), without any candidate
    answer_position: int  # = len(ids): where the candidate's first token goes
    residue: int


class PaddingExperiment:
    """The trials of a padding experiment on a tokenizer (``trials()``), their requests (``jobs``)
    and the id of the experiment (a hash of everything that defines it)."""

    def __init__(self, spec: PaddingSpec, tokenizer: Tokenizer, *, stride: int, periods: int = 4, reps: int = 1,
                 origin: int = 0, prefix: Sequence[int] | None = None, scoring: str = "score", top: int = 20):
        for name, value, low in (("stride", stride, 1), ("periods", periods, 1), ("reps", reps, 1), ("top", top, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ServedInputError(f"{name} = {value!r}: must be an integer >= {low}")
        if scoring not in SCORING:
            raise ServedInputError(f"scoring = {scoring!r}: must be one of {SCORING}")
        self.spec, self.tokenizer = spec, tokenizer
        self.stride, self.periods, self.reps, self.origin = stride, periods, reps, origin % stride
        self.scoring, self.top = scoring, top
        bos = tokenizer.bos_id
        self.prefix = list(prefix) if prefix is not None else ([] if bos is None else [int(bos)])
        self.head = tokenizer.encode(spec.head) if spec.head else []
        self.body = tokenizer.encode(spec.body)
        self.unit_ids = self.check_units()
        self._check_reps()
        self.candidate_ids = self._check_candidates()
        ident = {"spec": dataclasses.asdict(spec), "tokenizer": getattr(tokenizer, "name", "?"), "stride": stride,
                 "periods": periods, "reps": reps, "origin": self.origin, "prefix": self.prefix, "scoring": scoring}
        self.sweep_id = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]

    def _text_ids(self, head: str, middle: str, body: str) -> list[int]:
        return self.tokenizer.encode(head + middle + body)

    def check_units(self) -> list[int]:
        """The ids of the units that are exactly one token where they stand: k units between the
        prompt's head and body re-encode to k tokens of the unit's id (k = 1, 2, 3 and the
        longest padding). Units that are not are dropped (``rejected_units`` says why); none left
        is a PlacementError with every reason."""
        longest = self.periods * self.stride - 1
        name = getattr(self.tokenizer, "name", "the tokenizer")
        kept, ids, reasons = [], [], []
        for unit in self.spec.units:
            alone = self.tokenizer.encode(unit)
            if len(alone) != 1:
                reasons.append(f"padding unit {unit!r} is {len(alone)} tokens with {name} ({alone}), not one")
                continue
            for k in sorted({1, 2, 3, max(1, longest)}):
                got = self._text_ids(self.spec.head, unit * k, self.spec.body)
                want = self.head + alone * k + self.body
                if got != want:
                    reasons.append(f"padding unit {unit!r}: {k} units in the prompt re-encode to "
                                   f"{len(got) - len(self.head) - len(self.body)} tokens with {name}, not {k} of id "
                                   f"{alone[0]} (it merges with its neighbours)")
                    break
            else:
                kept.append(unit)
                ids.append(alone[0])
        self.rejected_units = reasons
        if not ids:
            raise PlacementError("no padding unit is one token per unit: " + "; ".join(reasons))
        self.units = tuple(kept)
        return ids

    def _check_candidates(self) -> list[list[int]]:
        out = []
        name = getattr(self.tokenizer, "name", "the tokenizer")
        for c in self.spec.candidates:
            ids = self.tokenizer.encode(c)
            whole = self.tokenizer.encode(self.spec.prompt.replace("{padding}", "") + c)
            if whole != self.head + self.body + ids:
                raise PlacementError(f"candidate {c!r}: after the prompt it re-encodes to {whole[len(self.head) + len(self.body):]} "
                                     f"not {ids} with {name} (it merges with the prompt's last token)")
            if self.scoring == "top" and len(ids) != 1:
                raise PlacementError(f"candidate {c!r} is {len(ids)} tokens with {name}: scoring 'top' reads only "
                                     "the first generated token; use scoring 'score' (echo) for multi-token candidates")
            out.append(ids)
        return out

    def _padding(self, rep: int, length: int) -> tuple[list[int], str]:
        """Rep 0: the first unit `length` times; rep r > 0: units drawn with seed r, one per slot
        (a prefix of the same draw for every length, so lengths differ by one unit)."""
        if rep == 0:
            return [self.unit_ids[0]] * length, self.units[0] * length
        picks = np.random.default_rng([rep, 0xBAD]).integers(0, len(self.unit_ids), size=length)
        return [self.unit_ids[k] for k in picks], "".join(self.units[k] for k in picks)

    def _check_reps(self) -> None:
        """Repetitions must differ (identical prompts are one observation counted many times), and
        the mixed paddings must stay one token per unit."""
        if self.reps > 1 and len(self.unit_ids) < 2:
            raise PlacementError(f"reps = {self.reps} needs at least two padding units that are one token each "
                                 f"(usable: {list(self.units)!r}): identical prompts are not repetitions")
        longest = self.periods * self.stride - 1
        for r in range(1, self.reps):
            ids, text = self._padding(r, longest)
            got = self._text_ids(self.spec.head, text, self.spec.body)
            if got != self.head + ids + self.body:
                raise PlacementError(f"rep {r}: its mixed padding of {longest} units re-encodes to "
                                     f"{len(got) - len(self.head) - len(self.body)} tokens (units merge with each other)")

    def trials(self) -> Iterator[PaddingTrial]:
        """(padding, rep) in padding-major order: trial_id = padding · reps + rep."""
        for p in range(self.periods * self.stride):
            for r in range(self.reps):
                padding, _ = self._padding(r, p)
                ids = tuple(self.prefix + self.head + padding + self.body)
                yield PaddingTrial(p * self.reps + r, p, r, self.units[0] if r == 0 else "mixed", ids, len(ids),
                                   (len(ids) - self.origin) % self.stride)

    @property
    def total(self) -> int:
        return self.periods * self.stride * self.reps

    def bodies(self, trial: PaddingTrial) -> list[dict]:
        ids = list(trial.ids)
        if self.scoring == "top":
            return [{"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": self.top}]
        if self.scoring == "score":
            return [{"prompt": ids + c, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}
                    for c in self.candidate_ids]
        return [{"prompt": ids + c, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1}
                for c in self.candidate_ids]

    def candidate_logprobs(self, trial: PaddingTrial, responses: Sequence[Any]) -> dict[str, float]:
        """Candidate text -> its logprob at the answer position, from the trial's responses."""
        out = {}
        if self.scoring == "top":
            completion = parse_completion(responses[0])
            if not completion.generated:
                raise EndpointError("the response has no logprobs (does the server return logprobs?)")
            top = completion.generated[0].top
            for text in self.spec.candidates:
                exact = [lp for tok, lp in top.items() if tok == text]
                loose = [lp for tok, lp in top.items() if tok.strip() == text.strip()]
                values = exact or loose
                if not values:
                    raise EndpointError(f"candidate {text!r} is not among the top {self.top} logprobs: raise --top")
                out[text] = max(values)
            return out
        for text, cand, response in zip(self.spec.candidates, self.candidate_ids, responses):
            sent = list(trial.ids) + cand
            completion = parse_completion(response, echo=self.scoring == "score", prompt_ids=sent)
            prompt = completion.prompt
            if not prompt or len(prompt) != len(sent):
                raise EndpointError(f"the response gives {len(prompt) if prompt else 0} prompt logprobs for {len(sent)} "
                                    "prompt tokens (does the server support "
                                    + ("echo with logprobs?)" if self.scoring == "score" else "prompt_logprobs?)"))
            values = [t.logprob for t in prompt[len(trial.ids):]]
            if any(v is None for v in values):
                raise EndpointError("a candidate token without a logprob in the response")
            out[text] = float(sum(values))
        return out

    def jobs(self) -> Iterator[Job]:
        for trial in self.trials():
            yield self._job(trial)

    def _job(self, trial: PaddingTrial) -> Job:
        base = {"format": PADDING_FORMAT, "sweep_id": self.sweep_id, "trial_id": trial.trial_id,
                "padding": trial.padding, "rep": trial.rep, "unit": trial.unit,
                "answer_position": trial.answer_position, "residue": trial.residue,
                "prompt_sha256": hashlib.sha256(np.asarray(trial.ids, "<i8").tobytes()).hexdigest()}

        def finish(responses: Any, info: dict) -> dict:
            logprobs = self.candidate_logprobs(trial, responses)
            values = np.asarray([logprobs[c] for c in self.spec.candidates])
            shifted = np.exp(values - values.max())
            p = float(shifted[self.spec.candidates.index(self.spec.answer)] / shifted.sum())
            line = dict(base)
            line.update({"outcome": p, "logprobs": logprobs, "latency_s": info.get("latency_s"),
                         "endpoint": info.get("endpoint"), "attempts": info.get("attempts")})
            return line

        def fail(reason: str, info: dict) -> dict:
            line = dict(base)
            line.update({"error": reason, "endpoint": info.get("endpoint"), "attempts": info.get("attempts")})
            return line

        return Job(key=trial.trial_id, body=lambda: self.bodies(trial), finish=finish, fail=fail)

    def preflight(self, client) -> None:
        """The first trial's first request to every endpoint: EndpointError unless its response
        gives what the scoring reads (the top logprobs holding every candidate; or one prompt
        logprob per prompt token, the candidate's included)."""
        trial = next(self.trials())
        body = self.bodies(trial)[0]

        def needs(response: Any) -> str | None:
            if self.scoring == "top":
                try:
                    self.candidate_logprobs(trial, [response])
                except (EndpointError, ValueError) as e:
                    return f"cannot score candidates ({e})"
                return None
            sent = list(trial.ids) + self.candidate_ids[0]
            try:
                completion = parse_completion(response, echo=self.scoring == "score", prompt_ids=sent)
            except ValueError as e:
                return f"an unreadable completion response ({e})"
            if not completion.prompt or len(completion.prompt) != len(sent):
                what = "echo with logprobs" if self.scoring == "score" else "prompt_logprobs"
                return f"no prompt logprobs in its response: the {self.scoring!r} scoring needs {what}"
            return None

        client.check(body, needs)


# ---- analysis --------------------------------------------------------------------------------------


def _t_quantile(dof: int, alpha: float = 0.05) -> float:
    """t with P(|T_dof| > t) = alpha: t^2 is F(1, dof), so bisect phasekv.stats.f_upper_tail."""
    if dof < 1:
        return math.nan
    lo, hi = 0.0, 1000.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if _pk.stats.f_upper_tail(mid * mid, 1.0, float(dof)) > alpha:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclasses.dataclass
class PaddingAnalysis:
    stride: int
    residues: list  # per residue: dict(residue, n, mean, low, high, logodds)
    anova_f: float
    anova_p: float
    period: float
    period_power: float
    fold_fraction: float
    fold_p: float
    permutations: int
    trials: int
    errored: int
    missing: int
    repeated: int  # trials whose prompt equals an earlier trial's (counted once)
    label: str = ""

    @property
    def worst_residue(self) -> int:
        return min(self.residues, key=lambda r: r["mean"] if r["n"] else math.inf)["residue"]

    def table(self) -> str:
        lines = [f"padding experiment: stride {self.stride}, {self.trials} trials ({self.errored} errored, "
                 f"{self.missing} missing, {self.repeated} repeating an earlier prompt and counted once)",
                 " residue      n   P(answer)%         95% CI     log-odds"]
        for r in self.residues:
            lines.append(f"{r['residue']:8d} {r['n']:6d} {100 * r['mean']:11.2f}  [{100 * r['low']:6.2f}, "
                         f"{100 * r['high']:6.2f}] {r['logodds']:12.3f}" + ("  worst" if r["residue"] == self.worst_residue else ""))
        lines.append(f"homogeneity across residues: one-way ANOVA F = {self.anova_f:.3f}, p = {self.anova_p:.3g}")
        lines.append(f"period of the per-length profile: dominant {self.period:g} ({100 * self.period_power:.1f}% of the "
                     f"variation); fold fraction at S = {self.stride}: {self.fold_fraction:.3f}, permutation p = "
                     f"{self.fold_p:.3g} ({self.permutations} permutations)")
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        rows = ["residue,n,mean,low,high,logodds"]
        rows += [f"{r['residue']},{r['n']},{r['mean']:.6f},{r['low']:.6f},{r['high']:.6f},{r['logodds']:.6f}"
                 for r in self.residues]
        return "\n".join(rows) + "\n"

    def svg(self) -> str:
        plot = _pk.plot
        points = [plot.PlotPoint(x=float(r["residue"]), y=100 * r["mean"], low=100 * r["low"], high=100 * r["high"])
                  for r in self.residues if r["n"]]
        label = (self.label or f"S = {self.stride}") + f"  ANOVA p={self.anova_p:.2g}, fold p={self.fold_p:.2g}"
        axes = plot.PlotAxes(title=f"P(answer) by the answer's residue mod {self.stride} (95% t intervals)",
                             x_label="(answer position - origin) mod S", y_label="P(answer | candidates) (%)",
                             x_min=-0.5, x_max=self.stride - 0.5, y_min=0.0, y_max=100.0,
                             x_ticks=[(float(k), str(k)) for k in range(self.stride)], width=900, height=480)
        return plot.svg_line_plot([plot.PlotSeries(label=label, points=points)], axes)

    def write(self, out_dir: str | pathlib.Path, stem: str = "padding") -> list[pathlib.Path]:
        out = pathlib.Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {".txt": self.table(), ".csv": self.csv(), ".svg": self.svg(),
                 ".json": json.dumps(dataclasses.asdict(self), indent=1) + "\n"}
        written = []
        for suffix, text in files.items():
            path = out / (stem + suffix)
            path.write_text(text, encoding="utf-8")
            written.append(path)
        return written


def read_padding_lines(paths: Sequence[str | pathlib.Path], sweep_id: str) -> dict[int, dict]:
    """trial_id -> its line (an outcome over an error; the first outcome of duplicates)."""
    out: dict[int, dict] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, text in enumerate(f, 1):
                if not text.strip():
                    continue
                try:
                    line = json.loads(text)
                except json.JSONDecodeError as e:
                    raise ServedInputError(f"{path}:{number}: not a JSON line ({e.msg})") from None
                if line.get("format") != PADDING_FORMAT or line.get("sweep_id") != sweep_id:
                    raise ServedInputError(f"{path}:{number}: not a line of padding experiment {sweep_id}")
                k = line["trial_id"]
                if k not in out or ("outcome" in line and "outcome" not in out[k]):
                    out[k] = line
    return out


def analyze_padding(experiment: PaddingExperiment, lines: Mapping[int, Mapping[str, Any]], *,
                    permutations: int = 999, seed: int = 0, label: str = "") -> PaddingAnalysis:
    S = experiment.stride
    values: dict[int, list[float]] = {r: [] for r in range(S)}
    logodds: dict[int, list[float]] = {r: [] for r in range(S)}
    by_length: dict[int, list[float]] = {}
    errored = missing = repeated = 0
    answer = experiment.spec.answer
    seen: set = set()
    for trial in experiment.trials():
        line = lines.get(trial.trial_id)
        if line is None:
            missing += 1
            continue
        if "outcome" not in line:
            errored += 1
            continue
        # A prompt met again (short paddings drawn alike) is the same observation: counted once.
        if line.get("prompt_sha256") in seen:
            repeated += 1
            continue
        seen.add(line.get("prompt_sha256"))
        p = float(line["outcome"])
        values[trial.residue].append(p)
        lps = line["logprobs"]
        others = [lps[c] for c in experiment.spec.candidates if c != answer]
        logodds[trial.residue].append(lps[answer] - max(others))
        by_length.setdefault(trial.padding, []).append(p)
    residues = []
    for r in range(S):
        v = np.asarray(values[r])
        n = len(v)
        mean = float(v.mean()) if n else math.nan
        half = _t_quantile(n - 1) * float(v.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan
        residues.append({"residue": r, "n": n, "mean": mean, "low": max(0.0, mean - half), "high": min(1.0, mean + half),
                         "logodds": float(np.mean(logodds[r])) if n else math.nan})
    groups = [values[r] for r in range(S) if values[r]]
    if len(groups) >= 2 and sum(len(g) for g in groups) > len(groups):
        anova = _pk.stats.anova_homogeneity(groups)
        f_stat, f_p = anova.f_statistic, anova.p_value
    else:
        f_stat, f_p = math.nan, math.nan
    profile = np.asarray([np.mean(by_length[p]) for p in sorted(by_length)])
    period, power, fold, fold_p = math.nan, math.nan, math.nan, math.nan
    if len(profile) == experiment.periods * S and len(profile) >= 2 * S and np.ptp(profile) > 0:
        dominant = _pk.stats.dominant_period(profile.tolist())
        period, power = dominant.period, dominant.power_fraction
        # Folding by padding mod S is folding by the answer's residue (a relabelling of classes).
        fold = _pk.stats.fold_fraction(profile.tolist(), S)
        rng = np.random.default_rng(seed)
        hits = 0
        for _ in range(permutations):
            if _pk.stats.fold_fraction(rng.permutation(profile).tolist(), S) >= fold - 1e-12:
                hits += 1
        fold_p = (1 + hits) / (1 + permutations)
    return PaddingAnalysis(S, residues, f_stat, f_p, period, power, fold, fold_p, permutations, experiment.total,
                           errored, missing, repeated, label)
