"""The phase-sweep protocol: plan a sweep into trials any engine can run, analyze the outcomes it
writes back, or run a plan from here, serially or on a Dask cluster.

The C++ harness (``phasekv.run_sweep``) calls a trial function in-process. An engine that serves a
model elsewhere (vLLM, SGLang, a cluster) instead gets the plan as data and answers with data:

    plan(config, ...)               -> Plan: every trial with its haystack layout (deterministic)
    Plan.write(path, shards=N)      JSONL, one trial per line, in N shard files
    read_plan(paths)                the Plan back from its shard files (checked: complete, unedited)
    read_shards(paths)              the trials of some shards (what one engine instance is given)
    the host runs each trial        writes one outcome line per trial (outcome_record)
    analyze(plan, outcome files)    -> Analysis: the C++ sweep's table, CSV, JSON and plot, plus which
                                    trials were missing, duplicated or conflicting
    run(plan, evaluate, client)     evaluate(trial) for every trial, serially or on Dask -> Analysis
    evaluate_trials(part, ...)      the same for a part of a plan -> outcome records

The command line does the same: ``python -m phasekv plan|analyze|probe`` (``--help`` on each).

Trial line (a JSON object, format ``phasekv.sweep.trial/1``)::

    format, sweep_id, trial_id      trial_id = the trial's place in the plan's shuffled run order
    shard, shards                   which shard file holds it
    residue, phase, trial           residue = target_position mod M, phase = residue mod S; trials
                                    with equal `trial` index share an anchor (the paired design)
    target_position, query_position, distance
    haystack, seed                  the context the needle goes into; its content should be a
                                    function of `seed` (one seed per haystack, < 2^53)
    layout                          token positions: context_tokens (= query_position + 1), needle
                                    [start, end) (end = start + needle_tokens), query, and
                                    haystack_needles (every needle of this haystack, in plan order)
    sweep                           stride, modulus, trials_per_residue, query_position, span,
                                    min_distance, seed, needle_tokens, query_jitter when it is not 1
                                    (the plan is a function of these)
    configuration                   the host's own description of what it runs (model, preset, ...)

Haystacks (``assign_haystacks``): one context can hold many needles, none overlapping, so a host
can serve many trials with one prefill; repeated placements go to different haystacks. A host that
builds one prompt per trial may ignore them, but should still derive the content from ``seed``.

Outcome line (format ``phasekv.sweep.outcome/1``)::

    {"format": ..., "sweep_id": ..., "trial_id": ..., "outcome": true | false | p}
    {"format": ..., "sweep_id": ..., "trial_id": ..., "error": "what went wrong"}

A binary sweep's outcome is whether the needle was retrieved; a probability sweep's is a number in
[0, 1] (any non-bool number makes the sweep a probability sweep). ``error`` marks an errored trial:
no outcome, excluded from the statistics, never counted as a wrong answer (as in C++).
Outcome files may come in any order and split any way. A trial reported twice with the same
outcome is a duplicate (reported, counted once); with an error and an outcome, the outcome counts
(a retry); with different outcomes it is a conflict (errored). A trial with no line is missing
(errored). A line of another sweep, of an unknown trial, or that is not an outcome line is a
``ProtocolError`` naming the file and line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np

from . import _phasekv as _pk

TRIAL_FORMAT = "phasekv.sweep.trial/1"
OUTCOME_FORMAT = "phasekv.sweep.outcome/1"

PathLike = Union[str, "os.PathLike[str]"]


class ProtocolError(_pk.InputError):
    """A plan or outcome file that does not follow the protocol (the message names file and line)."""


# ---- plan ----------------------------------------------------------------------------------------

_SWEEP_FIELDS = ("stride", "modulus", "trials_per_residue", "query_position", "query_jitter", "span", "min_distance", "seed",
                 "window", "origin", "permutations")
_RECORD_FIELDS = ("key_tokens", "gap", "value_tokens")
_FAILURES = {c.name: c for c in (_pk.FailureCause.selection_miss, _pk.FailureCause.read_dilution,
                                 _pk.FailureCause.write_dilution, _pk.FailureCause.readout)}


def _record_shape(value: Any) -> Any:
    """A RecordShape from one, a dict of its fields or a (key_tokens, gap, value_tokens) tuple."""
    if isinstance(value, Mapping):
        return _pk.RecordShape(**value)
    if isinstance(value, (tuple, list)):
        if len(value) != len(_RECORD_FIELDS):
            raise _pk.InputError(f"record = {value!r}: must be ({', '.join(_RECORD_FIELDS)})")
        return _pk.RecordShape(**dict(zip(_RECORD_FIELDS, value)))
    return value


def _sweep_config(section: Mapping[str, Any]) -> Any:
    """A SweepConfig from a trial line's `sweep` section (without needle_tokens)."""
    section = dict(section)
    record = section.pop("record", None)
    layout = section.pop("layout_mode", "any")
    config = _pk.SweepConfig(**section)
    if record is not None:
        config.record = _record_shape(record)
    if layout not in _pk.LayoutMode.__members__:
        raise _pk.ConfigError(f"layout_mode = {layout!r}: must be one of {sorted(_pk.LayoutMode.__members__)}")
    config.layout = _pk.LayoutMode.__members__[layout]
    return config


def _splitmix64(state: int) -> int:
    z = (state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def haystack_seed(sweep_seed: int, haystack: int) -> int:
    """The content seed of one haystack: SplitMix64 of (seed, haystack), 53 bits (exact in any JSON)."""
    return _splitmix64(_splitmix64(sweep_seed) ^ haystack) >> 11


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A sweep's trials (one dict per trial, in trial_id order) and what they were planned from."""

    config: Any = dataclasses.field(compare=False)  # phasekv.SweepConfig, modulus resolved (in every trial too)
    configuration: Mapping[str, Any]
    needle_tokens: int
    sweep_id: str
    trials: tuple  # of dicts, without the shard fields, in trial_id order (all, or a shard's)

    @property
    def total(self) -> int:
        """The number of trials the sweep plans (planned residues × trials_per_residue; every residue
        unless the config's layout leaves some out)."""
        return len(self.config.planned_residues()) * self.config.trials_per_residue

    @property
    def complete(self) -> bool:
        """Whether this Plan holds every trial (a plan read from some shards holds only theirs)."""
        return len(self.trials) == self.total

    @property
    def sweep(self) -> dict:
        """The plan's parameters as they appear in every trial line."""
        return dict(self.trials[0]["sweep"]) if self.trials else {}

    def haystacks(self) -> list[list[dict]]:
        """The trials of each haystack (in haystack order; trials in trial_id order)."""
        groups: list[list[dict]] = []
        for t in self.trials:
            while len(groups) <= t["haystack"]:
                groups.append([])
            groups[t["haystack"]].append(t)
        return groups

    def shards(self, count: int) -> list[list[dict]]:
        """The trials cut into `count` shards of equal size (±1), whole haystacks wherever the count
        allows: trials ordered by (haystack, trial_id) and cut into contiguous pieces, so at most
        count − 1 haystacks are split (each trial line describes its whole haystack anyway)."""
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= max(1, len(self.trials)):
            raise _pk.InputError(f"shards = {count!r}: must be an integer in [1, trials = {len(self.trials)}]")
        ordered = [t for group in self.haystacks() for t in group]
        cuts = [len(ordered) * k // count for k in range(count + 1)]
        return [ordered[cuts[k] : cuts[k + 1]] for k in range(count)]

    def write(self, path: PathLike, shards: int = 1) -> list[pathlib.Path]:
        """Writes the plan as JSONL: to `path` itself for one shard, else to
        <stem>.shard-<k>-of-<n><suffix> next to it. Returns the files written."""
        path = pathlib.Path(path)
        pieces = self.shards(shards)
        if shards == 1:
            files = [path]
        else:
            suffix = path.suffix or ".jsonl"
            stem = path.name[: -len(path.suffix)] if path.suffix else path.name
            files = [path.with_name(f"{stem}.shard-{k}-of-{shards}{suffix}") for k in range(shards)]
        for k, (file, piece) in enumerate(zip(files, pieces)):
            with open(file, "w", encoding="utf-8", newline="\n") as out:
                for t in piece:
                    out.write(_canonical(_with_shard(t, k, shards)) + "\n")
        return files


def _with_shard(trial: dict, shard: int, shards: int) -> dict:
    line = dict(trial)
    line["shard"], line["shards"] = shard, shards
    return line


def plan(
    config: Any, *, configuration: Mapping[str, Any] | None = None, needle_tokens: int | None = None
) -> Plan:
    """Every trial of the sweep `config` (a phasekv.SweepConfig) with its haystack layout.

    `needle_tokens`: how many positions a needle takes from its target position on (by default the
    config's record length: key, gap and value); needles of one haystack never overlap, and every
    needle ends before the query (so min_distance >= needle_tokens). `configuration`: any JSON object
    describing what the host runs; it goes into every line and into the sweep id."""
    config.validate()
    if needle_tokens is None:
        needle_tokens = config.record.length()
    if not isinstance(needle_tokens, int) or isinstance(needle_tokens, bool) or needle_tokens < 1:
        raise _pk.ConfigError(f"needle_tokens = {needle_tokens!r}: must be a positive integer")
    if needle_tokens > config.min_distance:
        raise _pk.ConfigError(
            f"needle_tokens = {needle_tokens}: must be at most min_distance = {config.min_distance} "
            "(every needle ends before the query)"
        )
    configuration = dict(configuration or {})
    try:
        json.loads(_canonical(configuration))
    except (TypeError, ValueError) as e:
        raise _pk.ConfigError(f"configuration: must be a JSON object ({e})") from None
    resolved = _pk.SweepConfig(**{f: getattr(config, f) for f in _SWEEP_FIELDS})
    resolved.modulus = config.resolved_modulus()
    resolved.record = config.record
    resolved.layout = config.layout
    # query_jitter enters the section (and so the sweep id) only when it moves the query: plans
    # written before it existed keep their ids.
    sweep = {f: getattr(resolved, f) for f in _SWEEP_FIELDS if f != "query_jitter" or resolved.query_jitter != 1}
    sweep["record"] = {f: getattr(resolved.record, f) for f in _RECORD_FIELDS}
    sweep["layout_mode"] = resolved.layout.name
    sweep["needle_tokens"] = needle_tokens
    sweep_id = hashlib.sha256(_canonical({"sweep": sweep, "configuration": configuration}).encode()).hexdigest()[:16]

    placements = _pk.plan_sweep(resolved)
    haystack_of = _pk.assign_haystacks(placements, needle_tokens)
    needles: dict[int, list[int]] = {}
    for p, h in zip(placements, haystack_of):
        needles.setdefault(h, []).append(p.target_position)
    stream = _pk.Geometry(stride=resolved.stride, window=resolved.resolved_window(), origin=resolved.origin)
    length = resolved.record.length()
    trials = []
    for trial_id, (p, h) in enumerate(zip(placements, haystack_of)):
        t, q = p.target_position, p.query_position
        lay = p.layout
        trials.append(
            {
                "format": TRIAL_FORMAT,
                "sweep_id": sweep_id,
                "trial_id": trial_id,
                "residue": p.residue,
                "phase": lay.first_offset,
                "trial": p.trial,
                "target_position": t,
                "query_position": q,
                "distance": q - t,
                "haystack": h,
                "seed": haystack_seed(resolved.seed, h),
                "layout": {
                    "context_tokens": q + 1,
                    "needle": [t, t + needle_tokens],
                    "query": q,
                    "haystack_needles": needles[h],
                },
                "record_layout": {
                    "class": lay.kind.name,
                    "first": lay.first,
                    "last": lay.last,
                    "first_offset": lay.first_offset,
                    "last_offset": lay.last_offset,
                    "boundaries": lay.boundaries,
                    "covering_entries": lay.covering_entries,
                    "crowding": _pk.crowding(stream, t, length, needles[h], length),
                },
                "sweep": sweep,
                "configuration": configuration,
            }
        )
    return Plan(resolved, configuration, needle_tokens, sweep_id, tuple(trials))


def _lines(paths: Iterable[PathLike] | PathLike):
    """(file, line number, parsed object) of every non-blank line of the files."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, text in enumerate(f, 1):
                if not text.strip():
                    continue
                try:
                    yield str(path), number, json.loads(text)
                except json.JSONDecodeError as e:
                    raise ProtocolError(f"{path}:{number}: not a JSON line ({e.msg})") from None


def _plan_described_by(where: str, line: dict) -> Plan:
    """The whole plan a trial line's `sweep` and `configuration` sections describe (checked against
    its sweep_id)."""
    try:
        section = dict(line["sweep"])
        needle_tokens = section.pop("needle_tokens")
        whole = plan(_sweep_config(section), configuration=line["configuration"], needle_tokens=needle_tokens)
    except (KeyError, TypeError, _pk.Error) as e:
        raise ProtocolError(f"{where}: its sweep section does not describe a plan ({e})") from None
    if whole.sweep_id != line.get("sweep_id"):
        raise ProtocolError(f"{where}: sweep_id = {line.get('sweep_id')!r} does not match its sweep section")
    return whole


def read_shards(paths: Iterable[PathLike] | PathLike) -> Plan:
    """The trials of some of a plan's shard files (what one engine instance is given): a Plan of
    just those trials (``complete`` is False unless they are all). Every line is checked: one
    sweep, no trial twice, and equal to what its `sweep` section plans (no edited or foreign line)."""
    whole, shards, mine, where_of = None, None, [], {}
    for path, number, line in _lines(paths):
        where = f"{path}:{number}"
        if not isinstance(line, dict) or line.get("format") != TRIAL_FORMAT:
            raise ProtocolError(f"{where}: not a trial line (format must be {TRIAL_FORMAT!r})")
        if whole is None:
            whole, shards = _plan_described_by(where, line), line.get("shards")
            shard_of = ({t["trial_id"]: k for k, piece in enumerate(whole.shards(shards)) for t in piece}
                        if isinstance(shards, int) and not isinstance(shards, bool) and 1 <= shards <= len(whole.trials)
                        else {})
        elif line.get("sweep_id") != whole.sweep_id:
            raise ProtocolError(f"{where}: sweep_id = {line.get('sweep_id')!r}: the plan files mix sweeps "
                                f"({next(iter(where_of.values()))} has {whole.sweep_id!r})")
        trial_id = line.get("trial_id")
        if not isinstance(trial_id, int) or isinstance(trial_id, bool) or not 0 <= trial_id < len(whole.trials):
            raise ProtocolError(f"{where}: trial_id = {trial_id!r}: must be an integer in [0, {len(whole.trials)})")
        if trial_id in where_of:
            raise ProtocolError(f"{where}: trial_id = {trial_id} is also at {where_of[trial_id]} (a shard given twice?)")
        where_of[trial_id] = where
        expected = _with_shard(whole.trials[trial_id], shard_of.get(trial_id, -1), shards)
        if line != expected:
            field = next((k for k in expected if line.get(k) != expected[k]), next(iter(set(line) - set(expected)), "?"))
            raise ProtocolError(f"{where}: trial_id = {trial_id}: field {field!r} differs from the plan its sweep "
                                "section describes (an edited or foreign line)")
        mine.append(trial_id)
    if whole is None:
        raise ProtocolError("the plan files hold no trial")
    return dataclasses.replace(whole, trials=tuple(whole.trials[i] for i in sorted(mine)))


def read_plan(paths: Iterable[PathLike] | PathLike) -> Plan:
    """The whole plan from all of its shard files, any order: read_shards, and complete."""
    part = read_shards(paths)
    if not part.complete:
        shards = _lines_shards(paths)
        held = sorted(shards)
        total = part.total
        missing = sorted(set(range(total)) - {t["trial_id"] for t in part.trials})
        count = next(iter(shards.values()))
        absent = [k for k in range(count) if k not in shards]
        raise ProtocolError(f"the plan files hold {len(part.trials)} of {total} trials (first missing: trial_id "
                            f"{missing[0]}); shards given: {held} of {count}"
                            + (f", missing shards: {absent}" if absent else ""))
    return part


def _lines_shards(paths) -> dict:
    """shard -> shard count of the (already checked) plan files."""
    return {line["shard"]: line["shards"] for _, _, line in _lines(paths)}


# ---- outcomes ------------------------------------------------------------------------------------


def _outcome_value(value: Any) -> bool | float:
    """An evaluate() result as a JSON-able outcome: bool, or a float (NumPy scalars accepted)."""
    if isinstance(value, _pk.AttributedOutcome):
        return bool(value.success)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    raise TypeError(f"returned {value!r}: not a bool or a number")


def outcome_record(trial: Mapping[str, Any], outcome: Any = None, *, error: str | None = None,
                   failure: str | None = None) -> dict:
    """The outcome line of one trial: its outcome (bool, a probability, or a phasekv.AttributedOutcome),
    or an error message. `failure` names why a false outcome failed (selection_miss, read_dilution,
    write_dilution, readout: phasekv.classify_failure); an AttributedOutcome carries its own."""
    record = {"format": OUTCOME_FORMAT, "sweep_id": trial["sweep_id"], "trial_id": trial["trial_id"]}
    if error is not None:
        record["error"] = str(error)
        return record
    record["outcome"] = _outcome_value(outcome)
    if isinstance(outcome, _pk.AttributedOutcome) and outcome.cause != _pk.FailureCause.unattributed:
        failure = outcome.cause.name
    if failure is not None:
        if failure not in _FAILURES or record["outcome"] is not False:
            raise _pk.InputError(f"failure = {failure!r}: must be one of {sorted(_FAILURES)}, on a false outcome")
        record["failure"] = failure
    return record


def write_outcomes(path: PathLike, records: Iterable[Mapping[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        for r in records:
            out.write(_canonical(dict(r)) + "\n")


def read_outcomes(paths: Iterable[PathLike] | PathLike) -> list[tuple[str, dict]]:
    """(where, record) of every line of the outcome files; `where` is "file:line"."""
    return [(f"{path}:{number}", line) for path, number, line in _lines(paths)]


class _TrialFailed(Exception):
    """What the lookup trial raises for a trial without a usable outcome; run_sweep records the
    message alone as the trial's error (phasekv_message_only: no class name in reports)."""

    phasekv_message_only = True


@dataclasses.dataclass
class Analysis:
    """A sweep's result (``result``: phasekv.SweepResult, the same as the C++ harness gives) and what
    the outcome files held."""

    plan: Plan
    result: Any
    outcomes: dict  # trial_id -> bool | float | None (None: errored, missing or conflicting)
    records: list  # the outcome records read (or produced by run), in order
    missing: list  # trial ids with no line at all
    duplicates: list  # trial ids with more than one line
    conflicts: list  # trial ids with different outcomes
    host_errors: list  # trial ids whose only lines are errors

    def protocol(self) -> dict:
        """What the files held, as a JSON-able dict (the .protocol.json of write())."""
        return {
            "sweep_id": self.plan.sweep_id,
            "planned": len(self.plan.trials),
            "lines": len(self.records),
            "missing": self.missing,
            "duplicates": self.duplicates,
            "conflicts": self.conflicts,
            "host_errors": self.host_errors,
        }

    def report(self) -> str:
        """The C++ table, then one line on what the outcome files held."""
        def listed(ids):
            return ", ".join(map(str, ids[:10])) + (" ..." if len(ids) > 10 else "")

        text = self.result.to_table()
        text += f"outcomes: {len(self.records)} lines for {len(self.plan.trials)} planned trials (sweep {self.plan.sweep_id})\n"
        for name, ids in (("missing", self.missing), ("duplicated", self.duplicates),
                          ("conflicting", self.conflicts), ("errored by the host", self.host_errors)):
            if ids:
                text += f"{name}: {len(ids)} trials (trial_id {listed(ids)})\n"
        return text

    def svg(self, label: str | None = None) -> str:
        """The per-residue accuracy with 95% bars, x = (residue + 1) / S (chunk ends at 1 and 2)."""
        plot = _pk.plot
        r = self.result
        label = label or self.plan.configuration.get("label") or f"S = {r.config.stride}"
        summary = (f": gap {r.gap_points:.1f} pts, {plot.format_p_value(r.homogeneity.p_value)}" if r.valid
                   else ": invalid sweep")
        axes = plot.PlotAxes(
            title=f"Accuracy by the target's position in its chunk ({r.config.trials_per_residue} trials per "
                  f"position, 95% Wilson intervals; sweep {self.plan.sweep_id})",
            x_label="Target's position across consecutive chunks, in chunk lengths (a chunk ends at each whole number)",
            y_label="Retrieval accuracy (%)" if r.kind == _pk.OutcomeKind.binary else "Mean probability (%)",
            x_min=-0.05, x_max=r.config.modulus / r.config.stride + 0.05,
            x_boundaries=[float(b) for b in range(0, r.config.modulus // r.config.stride + 1)],
            width=1100, height=600,
        )
        return plot.svg_line_plot([plot.phase_sweep_series(r, label + summary)], axes)

    def write(self, out_dir: PathLike, stem: str = "sweep", label: str | None = None) -> list[pathlib.Path]:
        """<stem>.txt (report), .csv, .summary.csv, .json, .svg and .protocol.json in out_dir."""
        out = pathlib.Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {
            ".txt": self.report(),
            ".csv": self.result.to_csv(),
            ".summary.csv": self.result.to_summary_csv(),
            ".json": self.result.to_json() + "\n",
            ".svg": self.svg(label),
            ".protocol.json": json.dumps(self.protocol(), indent=1) + "\n",
        }
        written = []
        for suffix, text in files.items():
            path = out / (stem + suffix)
            path.write_text(text, encoding="utf-8", newline="\n")
            written.append(path)
        return written


def analyze(
    plan: Plan,
    outcomes: Iterable[PathLike] | PathLike | Iterable[Mapping[str, Any]],
    *,
    kind: Any = None,
) -> Analysis:
    """The sweep's statistics from outcome files (paths) or outcome records (dicts), any order.
    `kind`: phasekv.OutcomeKind, or None to take binary when every outcome is a bool."""
    if isinstance(outcomes, (str, os.PathLike)):
        outcomes = [outcomes]
    outcomes = list(outcomes)
    if all(isinstance(o, Mapping) for o in outcomes):
        located = [(f"record {i}", dict(o)) for i, o in enumerate(outcomes)]
    elif all(isinstance(o, (str, os.PathLike)) for o in outcomes):
        located = read_outcomes(outcomes)
    else:
        raise TypeError("outcomes: give outcome file paths or outcome records (dicts), not a mix")

    if not plan.complete:
        raise _pk.InputError(f"plan: holds {len(plan.trials)} of {plan.total} trials: analyze needs the whole "
                             "plan (read_plan with every shard)")
    total = plan.total
    by_trial: dict[int, list] = {}
    for where, r in located:
        if not isinstance(r, dict) or r.get("format", OUTCOME_FORMAT) != OUTCOME_FORMAT:
            raise ProtocolError(f"{where}: not an outcome line (format must be {OUTCOME_FORMAT!r})")
        if r.get("sweep_id") != plan.sweep_id:
            raise ProtocolError(f"{where}: sweep_id = {r.get('sweep_id')!r}: not this plan's ({plan.sweep_id!r})")
        trial_id = r.get("trial_id")
        if not isinstance(trial_id, int) or isinstance(trial_id, bool) or not 0 <= trial_id < total:
            raise ProtocolError(f"{where}: trial_id = {trial_id!r}: must be an integer in [0, {total})")
        has_outcome, has_error = "outcome" in r, "error" in r
        if has_outcome == has_error:
            raise ProtocolError(f"{where}: trial_id = {trial_id}: must have exactly one of 'outcome' and 'error'")
        if has_outcome:
            value = r["outcome"]
            if not isinstance(value, (bool, int, float)):
                raise ProtocolError(f"{where}: trial_id = {trial_id}: outcome = {value!r}: must be true, false or a number")
            if "failure" in r and (value is not False or r["failure"] not in _FAILURES):
                raise ProtocolError(f"{where}: trial_id = {trial_id}: failure = {r['failure']!r}: must be one of "
                                    f"{sorted(_FAILURES)}, on a false outcome")
        by_trial.setdefault(trial_id, []).append(r)

    if kind is None:
        numbers = [r["outcome"] for rs in by_trial.values() for r in rs if "outcome" in r]
        kind = (_pk.OutcomeKind.binary if all(isinstance(v, bool) for v in numbers)
                else _pk.OutcomeKind.probability)
    binary = kind == _pk.OutcomeKind.binary

    resolved: dict[int, Any] = {}
    reason: dict[int, str] = {}
    failure_of: dict[int, str] = {}
    missing, duplicates, conflicts, host_errors = [], [], [], []
    for trial_id in range(total):
        rs = by_trial.get(trial_id)
        if not rs:
            missing.append(trial_id)
            resolved[trial_id], reason[trial_id] = None, "missing: no outcome line"
            continue
        if len(rs) > 1:
            duplicates.append(trial_id)
        values = []
        for r in rs:
            if "outcome" in r:
                v = r["outcome"] if binary else float(r["outcome"])  # probability: true/false are 1/0
                if binary and "failure" in r:
                    failure_of[trial_id] = r["failure"]
                if v not in values:
                    values.append(v)
        if len(values) == 1:
            resolved[trial_id] = values[0]
        elif len(values) > 1:
            conflicts.append(trial_id)
            resolved[trial_id], reason[trial_id] = None, "conflicting outcomes " + ", ".join(map(repr, values))
        else:
            host_errors.append(trial_id)
            resolved[trial_id], reason[trial_id] = None, "error from the host: " + str(rs[0]["error"])

    trial_of = {(t["residue"], t["trial"]): t["trial_id"] for t in plan.trials}

    def lookup(p):
        trial_id = trial_of[(p.residue, p.trial)]
        value = resolved[trial_id]
        if value is None:
            raise _TrialFailed(f"trial_id {trial_id}: {reason[trial_id]}")
        if binary and not isinstance(value, bool):
            raise _TrialFailed(f"trial_id {trial_id}: outcome {value!r} is not a bool in a binary sweep")
        if binary:
            cause = _FAILURES.get(failure_of.get(trial_id), _pk.FailureCause.unattributed)
            return _pk.AttributedOutcome(value, cause if not value else _pk.FailureCause.unattributed)
        return value

    result = _pk.run_sweep(plan.config, lookup, kind)
    return Analysis(plan, result, resolved, [r for _, r in located], missing, duplicates, conflicts, host_errors)


# ---- run -----------------------------------------------------------------------------------------


def _evaluate_task(evaluate: Callable[[dict], Any], trials: Sequence[dict]) -> list[dict]:
    """evaluate() on each trial of one task: its outcome records, errors caught as error records."""
    records = []
    for trial in trials:
        try:
            records.append(outcome_record(trial, evaluate(trial)))
        except Exception as e:  # an errored trial, not a failed run (KeyboardInterrupt passes)
            records.append(outcome_record(trial, error=f"{type(e).__name__}: {e}"))
    return records


def run(
    plan: Plan,
    evaluate: Callable[[dict], Any],
    client: Any = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    kind: Any = None,
) -> Analysis:
    """Runs evaluate(trial) -> bool | probability on every trial of `plan` and analyzes the outcomes.

    Tasks are the plan's haystacks (a host that prefills one context for all of its needles gets
    them together). With `client` (a dask.distributed Client: a LocalCluster, or any scheduler
    address) the tasks run on the cluster; `evaluate` is pickled to the workers (cloudpickle), so it
    should build heavy state lazily, once per worker process (as NeedleEvaluate does). The outcome
    records are collected in task order, so the analysis is the same as the serial run's whatever
    order the workers finish in. `progress(done, total)` is called after every task, in trials.
    An exception from evaluate is that trial's error (an errored trial); KeyboardInterrupt stops the
    run (on a cluster: cancels what is still queued)."""
    return analyze(plan, evaluate_trials(plan, evaluate, client, progress=progress), kind=kind)


def evaluate_trials(
    plan: Plan,
    evaluate: Callable[[dict], Any],
    client: Any = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict]:
    """run() without the analysis: the outcome records of the plan's trials (which may be a part of
    a plan, e.g. read_shards of one shard), in task order. What an engine instance given one shard
    runs; write them with write_outcomes."""
    tasks = [group for group in plan.haystacks() if group]
    total = len(plan.trials)
    done = 0
    if client is None:
        results = []
        for task in tasks:
            results.append(_evaluate_task(evaluate, task))
            done += len(task)
            if progress:
                progress(done, total)
    else:
        from distributed import as_completed  # only a cluster run needs Dask

        futures = client.map(_evaluate_task, [evaluate] * len(tasks), tasks, pure=False)
        size = {f.key: len(t) for f, t in zip(futures, tasks)}
        try:
            for future in as_completed(futures):
                future.result()  # re-raises what the task itself raised (not an evaluate error)
                done += size[future.key]
                if progress:
                    progress(done, total)
            results = client.gather(futures)
        except BaseException:
            client.cancel(futures)
            raise
    return [r for task_records in results for r in task_records]


# ---- the synthetic probe as an evaluate -----------------------------------------------------------

_NEEDLE_FIELDS = ("tokens", "records", "channels", "kappa", "logit_scale", "policy", "stride", "window",
                  "gate_offset", "heads", "seed", "origin", "key_slot_bias", "value_slot_bias", "record",
                  "slot_profile", "gate_content", "top_k", "isolate_targets")
_LIST_FIELDS = ("key_slot_bias", "value_slot_bias", "slot_profile")
_OUTCOMES = ("success", "probability", "attributed")
# The probe's policies by the short names of examples/phase_sweep too (either name works in both).
POLICY_NAMES = {"mean": "mean_pool", "gates": "concentrated_gates", "rope": "rope_after_pool", "dsv4": "deepseek_v4_csa",
                "fixed": "fixed_weight", "ape": "positional_gates", "control": "full_attention"}

# Per process: one probe per configuration (a long context's page pool is most of its cost) and
# the outcomes of the haystack it last prepared. A lock per probe: a probe is not thread-safe.
_probes: dict = {}
_probes_lock = threading.Lock()


class NeedleEvaluate:
    """The synthetic needle probe (``phasekv.probe``) as an `evaluate` of the protocol.

    A trial's haystack is built once with all of its needles (``prepare`` with the haystack's
    needles and the haystack index as salt) and read in one batch; the outcomes of its needles are
    kept until another haystack is asked for. This is what ``phasekv.probe.needle_sweep`` does, so
    a plan's analysis equals that sweep's result for the same configuration and sweep (plan with
    ``needle_tokens=evaluate.needle_tokens()``: the record's length, plus 2W for isolated targets,
    and the sweep's ``record`` the probe's). ``outcome``: ``success``, ``probability``, or
    ``attributed`` (success, and the cause of each failure: ``NeedleProbe.explain``). Picklable: only
    the configuration travels; each process builds its probe on first use."""

    def __init__(self, config: Any = None, *, outcome: str = "success", **fields: Any):
        if outcome not in _OUTCOMES:
            raise _pk.InputError(f"outcome = {outcome!r}: must be one of {', '.join(map(repr, _OUTCOMES))}")
        values = {f: getattr(config, f) for f in _NEEDLE_FIELDS} if config is not None else {}
        values.update(fields)
        if isinstance(values.get("policy"), str):
            name = POLICY_NAMES.get(values["policy"], values["policy"])
            if name not in _pk.probe.NeedlePolicy.__members__:
                known = sorted(set(POLICY_NAMES) | set(_pk.probe.NeedlePolicy.__members__))
                raise _pk.InputError(f"policy = {values['policy']!r}: must be one of {', '.join(known)}")
            values["policy"] = _pk.probe.NeedlePolicy.__members__[name]
        if isinstance(values.get("record"), (tuple, list, dict)):
            values["record"] = _record_shape(values["record"])
        probe_config = _pk.probe.NeedleConfig(**values)
        probe_config.validate()
        # Only plain values are kept (enums by name, lists and records as tuples): picklable, hashable.
        def plain(f: str) -> Any:
            v = getattr(probe_config, f)
            if f == "policy":
                return v.name
            if f == "record":
                return (v.key_tokens, v.gap, v.value_tokens)
            return tuple(v) if f in _LIST_FIELDS else v
        self.fields = tuple((f, plain(f)) for f in _NEEDLE_FIELDS)
        self.outcome = outcome

    def config(self) -> Any:
        values = dict(self.fields)
        values["policy"] = _pk.probe.NeedlePolicy.__members__[values["policy"]]
        values["record"] = _record_shape(values["record"])
        for f in _LIST_FIELDS:
            values[f] = list(values[f])
        return _pk.probe.NeedleConfig(**values)

    def needle_tokens(self) -> int:
        """The spacing a plan for this probe needs: the record's length (+ 2W for isolated targets)."""
        return self.config().haystack_spacing()

    def _entry(self) -> dict:
        key = (self.fields, self.outcome)
        with _probes_lock:
            entry = _probes.get(key)
            if entry is None:
                entry = _probes[key] = {"lock": threading.Lock(), "probe": None, "haystack": None, "outcomes": {}}
        return entry

    def check(self, trial: Mapping[str, Any]) -> None:
        """Raises InputError if this probe cannot answer the plan `trial` belongs to."""
        needed = self.needle_tokens()
        if trial["sweep"]["needle_tokens"] != needed:
            raise _pk.InputError(
                f"needle_tokens = {trial['sweep']['needle_tokens']}: this needle probe's haystacks need {needed} "
                f"(plan with needle_tokens=evaluate.needle_tokens())"
            )
        record = dict(self.fields)["record"]
        planned = trial["sweep"].get("record", {})
        if (planned.get("key_tokens", 1), planned.get("gap", 0), planned.get("value_tokens", 1)) != record:
            raise _pk.InputError(
                f"sweep.record = {planned}: must be the probe's record (key_tokens {record[0]}, gap {record[1]}, "
                f"value_tokens {record[2]})"
            )
        tokens = dict(self.fields)["tokens"]
        if trial["query_position"] >= tokens:
            raise _pk.InputError(f"query_position = {trial['query_position']}: must lie below the probe's tokens = "
                                 f"{tokens}")

    def __call__(self, trial: Mapping[str, Any]) -> Any:
        self.check(trial)
        entry = self._entry()
        with entry["lock"]:
            if entry["probe"] is None:
                entry["probe"] = _pk.probe.NeedleProbe(self.config())
            haystack = (trial["sweep_id"], trial["haystack"])
            if entry["haystack"] != haystack:
                needles = np.asarray(trial["layout"]["haystack_needles"], dtype=np.int64)
                entry["haystack"] = None  # a failed prepare leaves no stale outcomes behind
                probe = entry["probe"]
                probe.prepare(needles, trial["query_position"], context=trial["haystack"])
                if self.outcome == "probability":
                    values = probe.probabilities(needles).tolist()
                else:
                    values = probe.trials(needles).tolist()
                    if self.outcome == "attributed":
                        values = [_pk.AttributedOutcome(success=True) if ok else
                                  _pk.AttributedOutcome(success=False, cause=probe.explain(int(t)).cause)
                                  for t, ok in zip(needles.tolist(), values)]
                entry["outcomes"] = dict(zip(needles.tolist(), values))
                entry["haystack"] = haystack
            value = entry["outcomes"][trial["target_position"]]
        if self.outcome == "attributed":
            return value
        return bool(value) if self.outcome == "success" else float(value)

    def __repr__(self) -> str:
        default_record = (1, 0, 1)
        changed = ", ".join(f"{k}={v!r}" for k, v in self.fields
                            if (v not in ((), 0, False) and v != default_record) or k == "policy")
        return f"NeedleEvaluate({changed}, outcome={self.outcome!r})"


__all__ = [
    "Analysis", "NeedleEvaluate", "Plan", "ProtocolError", "OUTCOME_FORMAT", "TRIAL_FORMAT", "analyze",
    "evaluate_trials", "haystack_seed", "outcome_record", "plan", "read_outcomes", "read_plan", "read_shards",
    "run", "write_outcomes",
]
