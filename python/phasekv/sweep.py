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

Trial line (a JSON object, format ``phasekv.sweep.trial/1``; ``/2`` when the plan's design is not
"haystacks" or it states other grids: the same fields plus ``content`` and ``grids``, so a /1
reader refuses what it would misread)::

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
                                    min_distance, seed, needle_tokens, query_jitter when it is not 1,
                                    design when it is not "haystacks", grids when given (the plan is
                                    a function of these)
    configuration                   the host's own description of what it runs (model, preset, ...)
    content                         (paired design) the unpadded content: needle [start, end), query,
                                    and padding p, the tokens put before it (target = needle start + p)
    grids                           (plans with other grids) per grid name: residue, phase, class,
                                    covering_entries and crowding of the record on that grid

Designs (``plan(..., design=)``, ``plan --design``): "haystacks" (below); "single": one needle per
prompt, every prompt built from the same haystack content (one seed) so a prefix cache serves them;
"paired": trial index i is one content shifted by padding to each residue (the study's padding
design), so a content's residues are paired outcomes: ``analyze`` adds Cochran's Q across residues
over the contents measured at every residue (McNemar's exact test for two residues), the test for
this design where the χ² of the table treats residues as independent samples.

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
``ProtocolError`` naming the file and line. Any other field of an outcome line (answer text,
candidate logprobs, prompt hash, latency, ...) is the host's: kept, and written to the per-trial
table (``Analysis.trial_table``, <stem>.trials.csv) beside the trial's plan fields. A binary sweep's
report adds the lab's logistic fit (``Analysis.logistic``: Firth, with straddle, crowding, distance
and the contained phases as covariates).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import re
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np

from . import _phasekv as _pk

TRIAL_FORMAT = "phasekv.sweep.trial/1"
# Lines of a plan with a design other than "haystacks" carry fields a /1 reader would ignore and so
# misplace needles (padding, one needle per prompt): they are written as /2, which a /1 reader refuses.
TRIAL_FORMAT_2 = "phasekv.sweep.trial/2"
TRIAL_FORMATS = (TRIAL_FORMAT, TRIAL_FORMAT_2)
OUTCOME_FORMAT = "phasekv.sweep.outcome/1"
# How trials share content: "haystacks" (several needles per haystack, assign_haystacks), "single"
# (one needle per prompt, every prompt the same haystack content: one seed, prefix caching), or
# "paired" (each content is one prompt shifted by p padding tokens to every residue).
DESIGNS = ("haystacks", "single", "paired")

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
    design: str = "haystacks"  # DESIGNS

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

    @property
    def grids(self) -> list[dict]:
        """The plan's grids: its own (name "sweep") first, then those given to plan(grids=)."""
        c = self.config
        own = {"name": "sweep", "stride": c.stride, "window": c.resolved_window(), "origin": c.origin,
               "modulus": c.modulus}
        return [own] + list(self.sweep.get("grids", []))

    def haystacks(self) -> list[list[dict]]:
        """The trials of each haystack (in haystack order; trials in trial_id order)."""
        groups: list[list[dict]] = []
        for t in self.trials:
            while len(groups) <= t["haystack"]:
                groups.append([])
            groups[t["haystack"]].append(t)
        return groups

    def prompts(self) -> list[list[dict]]:
        """The trials of each prompt (one haystack with its needles and query), in haystack order: a
        host's prefill. In the "haystacks" design a haystack's trials share one prompt; in "single"
        and "paired" each trial is its own prompt."""
        groups: dict[tuple, list[dict]] = {}
        for group in self.haystacks():
            for t in group:
                key = (t["haystack"], tuple(t["layout"]["haystack_needles"]), t["query_position"])
                groups.setdefault(key, []).append(t)
        return list(groups.values())

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


_GRID_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")


def _grids(grids: Any) -> list[dict]:
    """The resolved list of extra grids: name, stride, window (0: the stride), origin, modulus (0: 2S)."""
    out, names = [], set()
    for g in grids or ():
        if not isinstance(g, Mapping):
            raise _pk.ConfigError(f"grid {g!r}: must be a mapping of name, stride, window, origin, modulus")
        unknown = set(g) - {"name", "stride", "window", "origin", "modulus"}
        if unknown:
            raise _pk.ConfigError(f"grid {g!r}: unknown field(s) {sorted(unknown)}")
        name = g.get("name")
        if not isinstance(name, str) or not _GRID_NAME.match(name) or name in names:
            raise _pk.ConfigError(f"grid name = {name!r}: must be a unique name of letters, digits, '_', '.', '-'")
        names.add(name)
        values = {}
        for field, low, default in (("stride", 1, None), ("window", 0, 0), ("origin", 0, 0), ("modulus", 0, 0)):
            v = g.get(field, default)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise _pk.ConfigError(f"grid {name}: {field} = {v!r}: must be an integer >= {low}")
            values[field] = v
        stride = values["stride"]
        window = values["window"] or stride
        modulus = values["modulus"] or 2 * stride
        if modulus % stride:
            raise _pk.ConfigError(f"grid {name}: modulus = {modulus}: must be a multiple of stride = {stride}")
        geometry = _pk.Geometry(stride=stride, window=window, origin=values["origin"])
        geometry.validate()
        out.append({"name": name, "stride": stride, "window": window, "origin": values["origin"] % stride,
                    "modulus": modulus})
    return out


def plan(
    config: Any, *, configuration: Mapping[str, Any] | None = None, needle_tokens: int | None = None,
    design: str = "haystacks", grids: Sequence[Mapping[str, Any]] | None = None,
) -> Plan:
    """Every trial of the sweep `config` (a phasekv.SweepConfig) with its haystack layout.

    `needle_tokens`: how many positions a needle takes from its target position on (by default the
    config's record length: key, gap and value; never fewer, since the needle holds the record, and
    more only as spacing, e.g. the probe's isolated targets); needles of one haystack never overlap,
    and every needle ends before the query (so min_distance >= needle_tokens). `configuration`: any
    JSON object describing what the host runs; it goes into every line and into the sweep id.

    `design` (DESIGNS): "haystacks" puts several needles in each haystack; "single" one needle per
    prompt, all prompts built from one haystack content (one seed: a prefix cache serves them);
    "paired" makes trial index i one content — a prompt with its needle at c_i and its query at Q_i —
    shifted by p = (r − c_i) mod M padding tokens to put the needle at each residue r, so the
    residues of one content are paired outcomes (analyze: Cochran's Q) and the distance is the same
    at every residue of a content. c_i = t_i − (M − 1) − s_i and Q_i = q_i − (M − 1), from the
    C++ plan's trial i at the first planned residue (t_i, q_i) and s_i ∈ [0, M) from the content's
    seed (so padding and residue are not the same numbers across contents); every padded query is at
    most query_position and every distance at least min_distance.

    `grids`: the other compression grids the model has (e.g. DeepSeek-V4's HCA at S = 128 beside a
    CSA sweep at S = 4), each {name, stride, window = stride, origin = 0, modulus = 2·stride}: the
    plan states them, every trial carries its residue, phase, layout class and crowding on each
    (``grids``), and analyze reports the outcomes by each grid's residues and phases too. The trials
    are placed to balance the sweep's own grid (config); on another grid they fall where they fall."""
    config.validate()
    if design not in DESIGNS:
        raise _pk.ConfigError(f"design = {design!r}: must be one of {', '.join(DESIGNS)}")
    if needle_tokens is None:
        needle_tokens = config.record.length()
    if not isinstance(needle_tokens, int) or isinstance(needle_tokens, bool) or needle_tokens < 1:
        raise _pk.ConfigError(f"needle_tokens = {needle_tokens!r}: must be a positive integer")
    if needle_tokens < config.record.length():
        r = config.record
        raise _pk.ConfigError(
            f"needle_tokens = {needle_tokens}: shorter than the record it holds (key_tokens {r.key_tokens} + gap "
            f"{r.gap} + value_tokens {r.value_tokens} = {r.length()}); give the record's shape or omit needle_tokens"
        )
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
    if design != "haystacks":  # absent for the original design: its plans keep their ids
        sweep["design"] = design
    extra_grids = _grids(grids)
    if extra_grids:
        sweep["grids"] = extra_grids
    sweep_id = hashlib.sha256(_canonical({"sweep": sweep, "configuration": configuration}).encode()).hexdigest()[:16]
    line_format = TRIAL_FORMAT if design == "haystacks" and not extra_grids else TRIAL_FORMAT_2

    placements = _pk.plan_sweep(resolved)
    modulus = resolved.modulus
    if design == "haystacks":
        haystack_of = _pk.assign_haystacks(placements, needle_tokens)
    else:  # single: one content for every prompt; paired: content i is trial index i
        haystack_of = [0 if design == "single" else p.trial for p in placements]
    positions: list[tuple[int, int, dict | None]] = []  # (target, query, content) per placement
    if design == "paired":
        first = resolved.planned_residues()[0]
        base = {p.trial: (p.target_position, p.query_position) for p in placements if p.residue == first}
        if resolved.first_target() < 2 * (modulus - 1):
            raise _pk.ConfigError(
                f"design = 'paired': the first target position {resolved.first_target()} must be at least 2(M − 1) = "
                f"{2 * (modulus - 1)} (a content is shifted by up to M − 1 tokens each way); raise query_position")
        for p in placements:
            t0, q0 = base[p.trial]
            shift = haystack_seed(resolved.seed, p.trial) % modulus
            c, cq = t0 - (modulus - 1) - shift, q0 - (modulus - 1)
            pad = (p.residue - c) % modulus
            positions.append((c + pad, cq + pad, {"needle": [c, c + needle_tokens], "query": cq, "padding": pad}))
    else:
        positions = [(p.target_position, p.query_position, None) for p in placements]
    needles: dict[int, list[int]] = {}
    if design == "haystacks":
        for p, h in zip(placements, haystack_of):
            needles.setdefault(h, []).append(p.target_position)
    stream = _pk.Geometry(stride=resolved.stride, window=resolved.resolved_window(), origin=resolved.origin)
    length = resolved.record.length()
    trials = []
    for trial_id, (p, h, (t, q, content)) in enumerate(zip(placements, haystack_of, positions)):
        lay = p.layout if design != "paired" else _pk.classify_record(stream, t, length)
        others = needles[h] if design == "haystacks" else [t]
        line = {
            "format": line_format,
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
                "haystack_needles": others,
            },
            "record_layout": {
                "class": lay.kind.name,
                "first": lay.first,
                "last": lay.last,
                "first_offset": lay.first_offset,
                "last_offset": lay.last_offset,
                "boundaries": lay.boundaries,
                "covering_entries": lay.covering_entries,
                "crowding": _pk.crowding(stream, t, length, others, length),
            },
            "sweep": sweep,
            "configuration": configuration,
        }
        if content is not None:
            line["content"] = content
        if extra_grids:
            line["grids"] = {}
            for g in extra_grids:
                geometry = _pk.Geometry(stride=g["stride"], window=g["window"], origin=g["origin"])
                gl = _pk.classify_record(geometry, t, length)
                line["grids"][g["name"]] = {
                    "residue": (t - g["origin"]) % g["modulus"], "phase": gl.first_offset, "class": gl.kind.name,
                    "covering_entries": gl.covering_entries,
                    "crowding": _pk.crowding(geometry, t, length, others, length)}
        trials.append(line)
    return Plan(resolved, configuration, needle_tokens, sweep_id, tuple(trials), design)


def _lines(paths: Iterable[PathLike] | PathLike):
    """(file, line number, parsed object) of every non-blank line of the files."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    for path in paths:
        # Bytes, decoded line by line: a byte that is not UTF-8 names its line, like bad JSON does.
        with open(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ProtocolError(f"{path}:{number}: not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                                        f"{e.start + 1})") from None
                if not text.strip():
                    continue
                try:
                    yield str(path), number, json.loads(text)
                except json.JSONDecodeError as e:
                    raise ProtocolError(f"{path}:{number}: not a JSON line ({e.msg})") from None
                except RecursionError:
                    raise ProtocolError(f"{path}:{number}: nested too deeply to be a protocol line") from None


def _plan_described_by(where: str, line: dict) -> Plan:
    """The whole plan a trial line's `sweep` and `configuration` sections describe (checked against
    its sweep_id)."""
    try:
        section = dict(line["sweep"])
        needle_tokens = section.pop("needle_tokens")
        design = section.pop("design", "haystacks")
        grids = section.pop("grids", None)
        whole = plan(_sweep_config(section), configuration=line["configuration"], needle_tokens=needle_tokens,
                     design=design, grids=grids)
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
        if not isinstance(line, dict) or line.get("format") not in TRIAL_FORMATS:
            known = " or ".join(map(repr, TRIAL_FORMATS))
            if isinstance(line, dict) and str(line.get("format", "")).startswith("phasekv.sweep.trial/"):
                raise ProtocolError(f"{where}: format = {line['format']!r}: this phasekv reads {known} "
                                    "(a plan from a newer phasekv?)")
            raise ProtocolError(f"{where}: not a trial line (format must be {known})")
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


# ---- paired statistics ---------------------------------------------------------------------------


def cochran_q(table: Any) -> dict:
    """Cochran's Q test that k paired binary outcomes have one success probability: `table` is
    blocks × k of 0/1 (a block: one content, measured at each of k residues). With column totals
    C_j, row totals R_i and N = ΣC_j,

        Q = (k − 1) (k ΣC_j² − N²) / (k N − ΣR_i²),

    referred to χ² with k − 1 degrees of freedom (large-sample; blocks whose outcomes are all equal
    add nothing to either sum but k N − ΣR_i²'s zero). No discordant block: Q = 0, p = 1.
    For k = 2, Q is McNemar's (b − c)² / (b + c)."""
    x = np.asarray(table, dtype=np.int64)
    if x.ndim != 2 or x.shape[1] < 2 or not np.isin(x, (0, 1)).all():
        raise _pk.InputError(f"cochran_q: table of shape {x.shape}: must be blocks × k (k >= 2) of 0/1")
    k = x.shape[1]
    columns, rows = x.sum(axis=0), x.sum(axis=1)
    n = int(columns.sum())
    denominator = k * n - int((rows * rows).sum())
    discordant = int(((rows > 0) & (rows < k)).sum())
    if denominator == 0:
        statistic, p_value = 0.0, 1.0
    else:
        statistic = (k - 1) * (k * int((columns * columns).sum()) - n * n) / denominator
        p_value = _pk.stats.chi_square_upper_tail(statistic, k - 1)
    return {"statistic": float(statistic), "dof": k - 1, "p_value": float(p_value), "blocks": int(x.shape[0]),
            "discordant_blocks": discordant}


def _average_ranks(row: np.ndarray) -> np.ndarray:
    """Ranks 1 … k of one row, tied values sharing the mean of their ranks."""
    order = np.argsort(row, kind="stable")
    ranks = np.empty(len(row))
    sorted_row = row[order]
    i = 0
    while i < len(row):
        j = i
        while j + 1 < len(row) and sorted_row[j + 1] == sorted_row[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def friedman(table: Any) -> dict:
    """Friedman's test that k paired continuous outcomes (probabilities) have one distribution:
    `table` is blocks × k. Ranks r_ij within each block (ties: mean ranks), R_j = Σ_i r_ij,
    A = Σ r_ij², C = n k (k + 1)² / 4:

        T = (k − 1) (ΣR_j² − n C) / (A − C),

    referred to χ² with k − 1 degrees of freedom; without ties T is 12/(n k (k+1)) ΣR_j² − 3n(k+1).
    Every block tied throughout: T = 0, p = 1."""
    x = np.asarray(table, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 2 or x.shape[0] < 1 or not np.isfinite(x).all():
        raise _pk.InputError(f"friedman: table of shape {x.shape}: must be blocks × k (k >= 2) of finite numbers")
    n, k = x.shape
    ranks = np.array([_average_ranks(row) for row in x])
    column = ranks.sum(axis=0)
    c = n * k * (k + 1) ** 2 / 4.0
    denominator = float((ranks * ranks).sum()) - c
    if denominator <= 1e-12 * c:
        statistic, p_value = 0.0, 1.0
    else:
        statistic = (k - 1) * (float((column * column).sum()) - n * c) / denominator
        p_value = _pk.stats.chi_square_upper_tail(statistic, k - 1)
    return {"statistic": float(statistic), "dof": k - 1, "p_value": float(p_value), "blocks": n}


def conditional_logistic(table: Any, *, max_subsets: int = 100_000, max_iterations: int = 100) -> dict:
    """The conditional logistic fit of paired binary outcomes, stratified by block (content):
    P(y_ij = 1) = σ(α_i + β_j) with a free α_i per content, conditioned away: given a block's total
    m_i, the chance of its observed set of successes is exp(Σ_{j∈set} β_j) / Σ_{|T| = m_i}
    exp(Σ_{j∈T} β_j) (every m_i-subset T of the k columns enumerated). β_0 = 0 (the first column
    is the reference), β_j the log odds ratio of column j against it within a content. Newton–Raphson
    on the exact score and information; blocks with m = 0 or k carry no information. The
    likelihood-ratio test of β = 0 is referred to χ² with k − 1 degrees of freedom. A column whose
    every informative outcome is a success (or a failure) makes β run off (separation):
    converged = False and that β large. For k = 2, β_1 = log(n01 / n10), McNemar's odds ratio."""
    x = np.asarray(table, dtype=np.int64)
    if x.ndim != 2 or x.shape[1] < 2 or not np.isin(x, (0, 1)).all():
        raise _pk.InputError(f"conditional_logistic: table of shape {x.shape}: must be blocks × k (k >= 2) of 0/1")
    k = x.shape[1]
    totals = x.sum(axis=1)
    informative = (totals > 0) & (totals < k)
    groups = {}
    for m in sorted(set(totals[informative].tolist())):
        if math.comb(k, m) > max_subsets:
            raise _pk.InputError(f"conditional_logistic: {math.comb(k, m)} subsets of {m} of {k} columns: more than "
                                 f"max_subsets = {max_subsets} (use Cochran's Q)")
        import itertools

        subsets = np.zeros((math.comb(k, m), k))
        for row, chosen in enumerate(itertools.combinations(range(k), m)):
            subsets[row, list(chosen)] = 1.0
        rows = x[informative & (totals == m)]
        groups[m] = (subsets, float(rows.shape[0]), rows.sum(axis=0).astype(np.float64))

    def evaluate(beta):
        loglik, score, info = 0.0, np.zeros(k), np.zeros((k, k))
        for subsets, count, observed in groups.values():
            eta = subsets @ beta
            top = eta.max()
            w = np.exp(eta - top)
            total = w.sum()
            p = w / total
            expected = p @ subsets
            loglik += float(observed @ beta) - count * (top + math.log(total))
            score += observed - count * expected
            info += count * ((subsets * p[:, None]).T @ subsets - np.outer(expected, expected))
        return loglik, score[1:], info[1:, 1:]

    beta = np.zeros(k)
    null_loglik = evaluate(beta)[0]
    loglik, score, info = null_loglik, *evaluate(beta)[1:]
    converged = not groups
    iterations = 0
    for iterations in range(1, max_iterations + 1):
        if not groups:
            break
        try:
            step = np.linalg.solve(info, score)
        except np.linalg.LinAlgError:
            step = np.linalg.lstsq(info, score, rcond=None)[0]
        scale = 1.0
        while True:
            trial = beta.copy()
            trial[1:] += scale * step
            new = evaluate(trial)
            if new[0] >= loglik - 1e-12 or scale < 1e-6:
                break
            scale /= 2
        beta, (loglik, score, info) = trial, new
        if np.max(np.abs(scale * step)) < 1e-10:
            converged = True
            break
    try:
        se = np.sqrt(np.diag(np.linalg.inv(info))) if groups else np.full(k - 1, np.nan)
    except np.linalg.LinAlgError:
        se = np.full(k - 1, np.nan)
    converged = converged and bool(np.all(np.abs(beta) < 20))
    statistic = max(0.0, 2.0 * (loglik - null_loglik))
    return {"coefficients": [0.0] + beta[1:].tolist(), "standard_errors": [0.0] + se.tolist(),
            "log_likelihood": float(loglik), "statistic": float(statistic), "dof": k - 1,
            "p_value": float(_pk.stats.chi_square_upper_tail(statistic, k - 1)) if groups else 1.0,
            "informative_blocks": int(informative.sum()), "converged": bool(converged), "iterations": iterations}


def mcnemar(a: Sequence[Any], b: Sequence[Any]) -> dict:
    """McNemar's exact test of two paired binary outcomes (a[i], b[i] of one content): under the null
    each discordant pair is a (1, 0) or a (0, 1) with probability 1/2; p is the two-sided binomial
    tail, min(1, 2 P(X <= min(n10, n01))) with X ~ Bin(n10 + n01, 1/2)."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape or a.ndim != 1:
        raise _pk.InputError(f"mcnemar: a and b must be equal-length vectors (shapes {a.shape}, {b.shape})")
    n10, n01 = int((a & ~b).sum()), int((~a & b).sum())
    n = n10 + n01
    tail = sum(math.comb(n, i) for i in range(min(n10, n01) + 1)) / 2.0**n if n else 1.0
    statistic = (n10 - n01) ** 2 / n if n else 0.0
    return {"a_only": n10, "b_only": n01, "statistic": float(statistic), "p_value": float(min(1.0, 2 * tail))}


def _json_safe(value: Any) -> Any:
    """value with every non-finite float as None (null): the files are strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


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
    lines_of: dict = dataclasses.field(default_factory=dict)  # trial_id -> its outcome records, in order

    @property
    def missing_fraction(self) -> float:
        """The fraction of planned trials with no outcome line at all."""
        return len(self.missing) / max(1, len(self.plan.trials))

    def paired(self) -> dict | None:
        """Paired statistics of a "paired" plan (None for other designs): across the planned residues,
        over the contents measured validly at every residue (a content with any errored or missing
        residue is dropped: the tests need complete blocks), Cochran's Q of binary outcomes (and
        McNemar's exact test when the plan has two residues, and the conditional logistic fit
        stratified by content: each residue's log odds ratio against the first), Friedman's test of
        probabilities."""
        if self.plan.design != "paired":
            return None
        binary = self.result.kind == _pk.OutcomeKind.binary
        residues = list(self.plan.config.planned_residues())
        column = {r: j for j, r in enumerate(residues)}
        blocks: dict[int, list] = {}
        for t in self.plan.trials:
            blocks.setdefault(t["trial"], [None] * len(residues))[column[t["residue"]]] = self.outcomes[t["trial_id"]]
        def valid(v):  # as run_sweep counts it: a bool, or a probability in [0, 1]
            return isinstance(v, bool) if binary else (v is not None and 0.0 <= v <= 1.0)

        complete = [row for _, row in sorted(blocks.items()) if all(valid(v) for v in row)]
        out = {"residues": residues, "contents": len(blocks), "complete_contents": len(complete)}
        test = "cochran_q" if binary else "friedman"
        if len(complete) < 2:
            out[test] = None
            return out
        table = np.array(complete, dtype=np.int64 if binary else np.float64)
        out[test] = cochran_q(table) if binary else friedman(table)
        out["accuracy"] = [float(v) for v in table.mean(axis=0)]
        if binary and len(residues) == 2:
            out["mcnemar"] = mcnemar(table[:, 0], table[:, 1])
        if binary:
            try:
                out["conditional_logistic"] = conditional_logistic(table)
            except _pk.InputError as e:  # too many residues to enumerate: Cochran's Q alone
                out["conditional_logistic"] = {"error": str(e)}
        return out

    def logistic(self) -> dict | None:
        """The logistic fit the lab uses (lab/host/lab_host.cpp), of a binary sweep's valid trials:
        success on an intercept, straddle (the record crosses a block boundary), crowding (other
        needles' tokens in the target's entries), distance / 100 and the contained phases 1 … S − L
        (phase 0 the reference), and for each other grid of the plan whether the record straddles
        one of its blocks (straddle_<name>), by phasekv.stats.fit_logistic (Firth-penalised), with
        the penalised likelihood-ratio test of each group of columns held at 0. A column that does not
        vary over the trials is left out (named in left_out). None for a probability sweep."""
        if self.result.kind != _pk.OutcomeKind.binary:
            return None
        stride = self.plan.config.stride
        length = self.plan.config.record.length()
        rows = [(t, self.outcomes[t["trial_id"]]) for t in self.plan.trials
                if isinstance(self.outcomes.get(t["trial_id"]), bool)]
        columns: list[tuple[str, Callable[[dict], float]]] = [
            ("intercept", lambda t: 1.0),
            ("straddle", lambda t: float(t["record_layout"]["class"] != "contained")),
            ("crowding", lambda t: float(t["record_layout"]["crowding"])),
            ("distance_per_100", lambda t: t["distance"] / 100.0),
        ]
        for phase in range(1, stride - length + 1):
            columns.append((f"phase_{phase}", lambda t, phase=phase: float(t["record_layout"]["class"] == "contained"
                                                                            and t["phase"] == phase)))
        # Each other grid's boundary: whether the record straddles a block of that grid too (a model
        # with several grids can lose a record at either).
        for grid in self.plan.grids[1:]:
            columns.append((f"straddle_{grid['name']}",
                            lambda t, name=grid["name"]: float(t["grids"][name]["class"] != "contained")))
        used, left_out = [], []
        for name, value in columns:
            values = {value(t) for t, _ in rows}
            (used if name == "intercept" or len(values) > 1 else left_out).append((name, value))
        out: dict = {"observations": len(rows), "left_out": [name for name, _ in left_out]}
        if len({y for _, y in rows}) < 2:
            out["note"] = "every valid trial had the same outcome: nothing to fit"
            return out
        names = [name for name, _ in used]
        x = [value(t) for t, _ in rows for _, value in used]
        y = [1.0 if ok else 0.0 for _, ok in rows]
        k = len(names)
        try:
            fit = _pk.stats.fit_logistic(x, y, k, names)
        except _pk.Error as e:
            out["error"] = str(e)
            return out
        out["converged"] = bool(fit.converged)
        out["coefficients"] = {n: {"estimate": b, "se": se, "p": p}
                               for n, b, se, p in zip(names, fit.coefficients, fit.standard_errors, fit.p_values)}
        tests = [("phase_test", "phase_"), ("straddle_test", "straddle"), ("crowding_test", "crowding"),
                 ("distance_test", "distance")]
        tests += [(f"straddle_{g['name']}_test", f"straddle_{g['name']}") for g in self.plan.grids[1:]]
        for label, prefix in tests:
            # "straddle" is the sweep's own grid's column alone; a grid's is its own column.
            held = [j for j in range(1, k) if (names[j] == prefix if prefix.startswith("straddle") else
                                               names[j].startswith(prefix))]
            if held:
                lr = _pk.stats.likelihood_ratio_test(fit, _pk.stats.fit_logistic(x, y, k, names, zero=held))
                out[label] = {"statistic": lr.statistic, "dof": lr.dof, "p": lr.p_value}
        return out

    def by_grid(self, name: str) -> dict:
        """The outcomes by the residues and by the phases (residue mod S) of one of the plan's grids
        (Plan.grids; "sweep" is the sweep's own): per residue and per phase the valid trials, the
        accuracy (binary: successes and a Wilson 95% interval; probabilities: the mean), and the
        homogeneity across phases (binary: Pearson χ² over the phases with trials; probabilities:
        one-way ANOVA). The phases pool residues, which is what a grid of large S needs: at S = 128
        a sweep balanced on S = 4 gives each of its 256 residues a trial or two."""
        grid = next((g for g in self.plan.grids if g["name"] == name), None)
        if grid is None:
            raise _pk.InputError(f"grid = {name!r}: the plan's grids are {[g['name'] for g in self.plan.grids]}")
        binary = self.result.kind == _pk.OutcomeKind.binary

        def place(t):
            if name == "sweep":
                return t["residue"], t["phase"], t["record_layout"]["class"]
            g = t["grids"][name]
            return g["residue"], g["phase"], g["class"]

        residues: dict[int, list] = {}
        phases: dict[int, list] = {}
        for t in self.plan.trials:
            v = self.outcomes.get(t["trial_id"])
            if v is None:
                continue
            r, ph, _ = place(t)
            residues.setdefault(r, []).append(float(v))
            phases.setdefault(ph, []).append(float(v))

        def rows(groups):
            out = []
            for key in sorted(groups):
                values = groups[key]
                row = {"trials": len(values), "accuracy": sum(values) / len(values)}
                if binary:
                    ok = int(sum(values))
                    w = _pk.stats.wilson_interval(ok, len(values))
                    row.update(successes=ok, low=w.low, high=w.high)
                out.append((key, row))
            return out

        phase_rows = rows(phases)
        test = None
        if len(phase_rows) >= 2:
            if binary:
                chi = _pk.stats.chi_square_homogeneity([r["successes"] for _, r in phase_rows],
                                                       [r["trials"] for _, r in phase_rows])
                test = {"test": "chi_square", "statistic": chi.statistic, "dof": chi.dof, "p_value": chi.p_value,
                        "approximate": chi.min_expected < 5}
            elif all(r["trials"] >= 2 for _, r in phase_rows):
                anova = _pk.stats.anova_homogeneity([phases[k] for k, _ in phase_rows])
                test = {"test": "anova", "statistic": anova.f_statistic, "dof": anova.dof_between,
                        "p_value": anova.p_value}
        return {"grid": grid, "residues": [dict(r, residue=k) for k, r in rows(residues)],
                "phases": [dict(r, phase=k) for k, r in phase_rows], "phase_homogeneity": test}

    def grid_table(self, name: str) -> str:
        """by_grid(name) as CSV: one row per phase, then one per residue."""
        g = self.by_grid(name)
        lines = ["level,index,trials,accuracy,successes,low,high"]
        for level, key in (("phase", "phases"), ("residue", "residues")):
            for r in g[key]:
                lines.append(",".join(str(x) for x in (level, r[level], r["trials"], f"{r['accuracy']:.6g}",
                                                       r.get("successes", ""),
                                                       f"{r['low']:.6g}" if "low" in r else "",
                                                       f"{r['high']:.6g}" if "high" in r else "")))
        return "\n".join(lines) + "\n"

    def trial_table(self) -> str:
        """Every planned trial as a CSV row, in trial_id order: the plan's fields (residue, phase,
        trial index, haystack, positions, padding in the paired design, record class and crowding),
        the status (ok, missing, errored, conflicting) and outcome, then every extra field the host
        wrote in the trial's outcome line (answer text, logprobs, prompt hash, latency, ...; objects
        and lists as JSON), under their own names, columns sorted."""
        import csv
        import io

        own = {"format", "sweep_id", "trial_id", "outcome", "error", "failure"}
        extra = sorted({k for rs in self.lines_of.values() for r in rs for k in r if k not in own})
        head = ["trial_id", "residue", "phase", "trial", "haystack", "target_position", "query_position", "distance",
                "padding", "record_class", "crowding", "status", "outcome", "failure", "error"]
        clash = [k for k in extra if k in head]
        extra_names = [("host_" + k if k in clash else k) for k in extra]
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(head + extra_names)
        conflicts, missing = set(self.conflicts), set(self.missing)
        for t in self.plan.trials:
            i = t["trial_id"]
            rs = self.lines_of.get(i, [])
            value = self.outcomes.get(i)
            status = ("missing" if i in missing else "conflicting" if i in conflicts else
                      "errored" if value is None else "ok")
            # The line whose outcome counted (the last such), else the last line: its extra fields.
            used = next((r for r in reversed(rs) if "outcome" in r), rs[-1] if rs else {})
            error = next((r["error"] for r in reversed(rs) if "error" in r), "") if status != "ok" else ""
            row = [i, t["residue"], t["phase"], t["trial"], t["haystack"], t["target_position"], t["query_position"],
                   t["distance"], (t.get("content") or {}).get("padding", ""), t["record_layout"]["class"],
                   t["record_layout"]["crowding"], status,
                   "" if value is None else (str(value).lower() if isinstance(value, bool) else repr(value)),
                   used.get("failure", ""), error]
            for k in extra:
                v = used.get(k, "")
                row.append(v if isinstance(v, str) else _canonical(v))
            writer.writerow(row)
        return buffer.getvalue()

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
            "missing_fraction": self.missing_fraction,
            "design": self.plan.design,
            "paired": self.paired(),
            "logistic": self.logistic(),
            "grids": {g["name"]: self.by_grid(g["name"]) for g in self.plan.grids[1:]},
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
        fit = self.logistic()
        if fit and "coefficients" in fit:
            text += f"logistic fit (Firth) of {fit['observations']} valid trials, log-odds:"
            text += "".join(f" {n} {c['estimate']:+.3g} (se {c['se']:.2g})" for n, c in fit["coefficients"].items())
            tests = [f"{label[:-5]} p = {fit[label]['p']:.3g}" for label in fit if label.endswith("_test")]
            text += ("; likelihood-ratio " + ", ".join(tests) if tests else "") + "\n"
        for grid in self.plan.grids[1:]:
            g = self.by_grid(grid["name"])
            h = g["phase_homogeneity"]
            text += (f"grid {grid['name']} (S = {grid['stride']}, W = {grid['window']}, origin {grid['origin']}, M = "
                     f"{grid['modulus']}): {len(g['phases'])} phases with trials, {len(g['residues'])} residues")
            if g["phases"]:
                worst = min(g["phases"], key=lambda r: r["accuracy"])
                best = max(g["phases"], key=lambda r: r["accuracy"])
                text += (f"; phase {worst['phase']} lowest ({100 * worst['accuracy']:.1f}%), phase {best['phase']} "
                         f"highest ({100 * best['accuracy']:.1f}%)")
            if h:
                text += f"; across phases {h['test']} p = {h['p_value']:.3g}" + (" (approximate)" if h.get("approximate") else "")
            text += "\n"
        paired = self.paired()
        if paired is not None:
            name = "Cochran's Q" if "cochran_q" in paired else "Friedman's test"
            q = paired.get("cochran_q", paired.get("friedman"))
            text += (f"paired design: {paired['complete_contents']} of {paired['contents']} contents measured at every "
                     f"residue")
            if q is None:
                text += f"; too few for {name}\n"
            else:
                detail = (f", {q['discordant_blocks']} discordant contents" if "discordant_blocks" in q else "")
                text += (f"; {name} = {q['statistic']:.2f} (dof {q['dof']}{detail}), p = {q['p_value']:.3g} — the "
                         "paired test of this design (the homogeneity test above treats the residues as independent "
                         "samples)\n")
                fit = paired.get("conditional_logistic") or {}
                if "coefficients" in fit:
                    worst = int(np.argmin(fit["coefficients"]))
                    text += (f"conditional logistic fit (stratified by content; residue {paired['residues'][0]} the "
                             f"reference): likelihood-ratio p = {fit['p_value']:.3g}; lowest residue "
                             f"{paired['residues'][worst]} at log odds ratio {fit['coefficients'][worst]:+.2f}"
                             + (f" (se {fit['standard_errors'][worst]:.2f})" if worst else "")
                             + ("" if fit["converged"] else " (not converged: separation)") + "\n")
                if "mcnemar" in paired:
                    m = paired["mcnemar"]
                    text += (f"McNemar (exact): residue {paired['residues'][0]} only {m['a_only']}, residue "
                             f"{paired['residues'][1]} only {m['b_only']}, p = {m['p_value']:.3g}\n")
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
        """<stem>.txt (report), .csv, .summary.csv, .json, .svg, .protocol.json and .trials.csv (the
        per-trial table, with the host's extra fields) in out_dir."""
        out = pathlib.Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {
            ".txt": self.report(),
            ".csv": self.result.to_csv(),
            ".summary.csv": self.result.to_summary_csv(),
            ".json": self.result.to_json() + "\n",
            ".svg": self.svg(label),
            ".protocol.json": json.dumps(_json_safe(self.protocol()), indent=1, allow_nan=False) + "\n",
            ".trials.csv": self.trial_table(),
        }
        for grid in self.plan.grids[1:]:
            files[f".grid-{grid['name']}.csv"] = self.grid_table(grid["name"])
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
    return Analysis(plan, result, resolved, [r for _, r in located], missing, duplicates, conflicts, host_errors,
                    by_trial)


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
    tasks = plan.prompts()
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
    the configuration travels; each process builds its probe on first use. A trial of a "single" or
    "paired" plan is its own prompt (its one needle, its query); the probe has no padding, so a
    paired plan's residues of one content are answered as separate haystacks of the same salt, not
    as one content shifted (phasekv.served's NeedleBuilder builds the shifted prompts)."""

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
            # A prompt is its haystack, needles and query (one haystack content holds many prompts
            # in the single and paired designs).
            haystack = (trial["sweep_id"], trial["haystack"], tuple(trial["layout"]["haystack_needles"]),
                        trial["query_position"])
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
    "Analysis", "NeedleEvaluate", "Plan", "ProtocolError", "OUTCOME_FORMAT", "TRIAL_FORMAT", "TRIAL_FORMAT_2",
    "DESIGNS", "analyze", "cochran_q", "conditional_logistic", "friedman", "mcnemar",
    "evaluate_trials", "haystack_seed", "outcome_record", "plan", "read_outcomes", "read_plan", "read_shards",
    "run", "write_outcomes",
]
