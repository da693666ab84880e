"""python -m phasekv plan|analyze|probe|measure: the sweep protocol from the command line (phasekv.sweep).

    plan      writes a sweep's trials as JSONL (optionally in shards) for an engine to run
    analyze   reads the plan and the outcome files and reports by residue (table, CSV, JSON, SVG)
    probe     answers a plan with phasekv's synthetic needle probe (a reference engine), serially
              or on a Dask cluster
    measure   measures a model behind an OpenAI-compatible completions server (needle sweep or
              padding experiment; phasekv.served, docs/SERVED.md)

Exit status: 0 done (analyze: a valid sweep), 1 analyze of an invalid sweep (too few valid
trials in some residue; the report says why) or of more than --max-missing of its trials without
an outcome line, 2 bad arguments or files.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import _phasekv as pk
from . import sweep


_INT64_MAX = 2**63 - 1


def _integer(text: str, low: int, what: str) -> int:
    """An integer flag in [low, 2^63 - 1]: the C++ core takes 64-bit integers, so a larger one is a
    bad argument (exit 2) here, not a TypeError from the binding."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not an integer") from None
    if not low <= value <= _INT64_MAX:
        raise argparse.ArgumentTypeError(f"{text}: must be a {what} integer below 2^63")
    return value


def _positive(text: str) -> int:
    return _integer(text, 1, "positive")


def _non_negative(text: str) -> int:
    return _integer(text, 0, "non-negative")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: must be a fraction in [0, 1]")
    return value


def _grid(text: str) -> dict:
    parts = text.split(":")
    if not 2 <= len(parts) <= 4 or not parts[0]:
        raise argparse.ArgumentTypeError(f"{text!r}: must be NAME:STRIDE[:WINDOW[:ORIGIN]]")
    grid: dict = {"name": parts[0]}
    for field, value in zip(("stride", "window", "origin"), parts[1:]):
        try:
            grid[field] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {field} {value!r} is not an integer") from None
    return grid


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


class _Defaults(argparse.HelpFormatter):
    """--help shows each option's default, unless it has none or its help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        shown = not any(action.default is nothing for nothing in (None, argparse.SUPPRESS, False))
        if shown and "default" not in text and not action.required:
            text += " (default: %(default)s)"
        return text


def _parser() -> argparse.ArgumentParser:
    defaults = _Defaults
    top = argparse.ArgumentParser(prog="python -m phasekv", description=__doc__.split("\n\n")[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog=__doc__.split("\n\n")[2] + "\n\nEach command's --help lists its options.")
    commands = top.add_subparsers(dest="command", required=True, metavar="plan|analyze|probe|measure")

    p = commands.add_parser("plan", formatter_class=defaults, help="write a sweep's trials as JSONL",
                            description="Writes every trial of a phase sweep (residue, target, query, haystack "
                                        "layout, seed) as one JSON line, in --shards files.")
    p.add_argument("--stride", type=_positive, required=True, help="compression stride S")
    p.add_argument("--modulus", type=_non_negative, default=0, help="residues t mod M; 0 means 2S")
    p.add_argument("--trials", type=_positive, default=32, help="trials per residue (at least 10)")
    p.add_argument("--query-position", type=_non_negative, required=True, help="the query's position")
    p.add_argument("--span", type=_positive, required=True, help="width of the target range (at least 3M)")
    p.add_argument("--min-distance", type=_positive, default=1, help="targets at least this far before the query")
    p.add_argument("--query-jitter", type=_positive, default=1,
                   help="J: trial i queries at query_position - o_i, o_i in [0, J), the same o_i at every residue; "
                        "J = 1 moves phase and distance mod S together (confounded); a multiple of S separates them")
    p.add_argument("--seed", type=_non_negative, default=0, help="run order and haystack seeds")
    p.add_argument("--window", type=_non_negative, default=0,
                   help="W of the stream the records' layouts are classified against; 0 means S")
    p.add_argument("--origin", type=_non_negative, default=0, help="the stream's chunk origin")
    p.add_argument("--key-tokens", type=_positive, help="tokens of a record's key (default: 1)")
    p.add_argument("--value-tokens", type=_positive, help="tokens of a record's value (default: 1)")
    p.add_argument("--gap", type=_non_negative, help="tokens between a record's key and value (default: 0)")
    p.add_argument("--layout", choices=("any", "contained", "straddle"), default="any",
                   help="plan every residue, only those whose record fits in one block (the within-window "
                        "test), or only those whose record crosses a block boundary")
    p.add_argument("--needle-tokens", type=_positive,
                   help="tokens of a needle: must equal the record's length (key + gap + value); with only this "
                        "given, the record is --needle-tokens - 1 key tokens and 1 value token (default: the "
                        "record's length)")
    p.add_argument("--needle-spacing", type=_positive,
                   help="positions reserved per needle when more than the record (the probe's --isolate: record "
                        "length + 2W); default: the needle's length")
    p.add_argument("--design", choices=sweep.DESIGNS, default="haystacks",
                   help="haystacks: several needles share each haystack; single: one needle per prompt, one shared "
                        "haystack content (prefix caching); paired: each content shifted by padding to every residue "
                        "(analyze: Cochran's Q)")
    p.add_argument("--grid", type=_grid, action="append", default=[], metavar="NAME:S[:W[:ORIGIN]]",
                   help="another compression grid of the model (e.g. hca:128 beside a CSA sweep at --stride 4); "
                        "every trial carries its residue and layout on it, and analyze reports by its phases; "
                        "repeatable (default: none)")
    p.add_argument("--configuration", type=_json_object, default={},
                   help="JSON object describing what the host runs (goes into every line)")
    p.add_argument("--shards", type=_positive, default=1, help="number of shard files")
    p.add_argument("--out", required=True, help="the plan file (shards: <stem>.shard-K-of-N<suffix>)")

    a = commands.add_parser("analyze", formatter_class=defaults, help="report a sweep from its outcome files",
                            description="Reads the plan's shard files and the outcome files (any order, any "
                                        "split), reports missing, duplicated and conflicting trials, and prints the "
                                        "per-residue table with the gap, homogeneity test and period.")
    a.add_argument("--plan", nargs="+", required=True, help="every shard file of the plan")
    a.add_argument("--outcomes", nargs="+", required=True, help="the outcome files")
    a.add_argument("--out-dir", help="also write <stem>.txt/.csv/.summary.csv/.json/.svg/.protocol.json here")
    a.add_argument("--stem", default="sweep", help="file name stem in --out-dir")
    a.add_argument("--label", help="the plot's series label (default: configuration's 'label', else S)")
    a.add_argument("--kind", choices=("auto", "binary", "probability"), default="auto",
                   help="auto: binary when every outcome is true/false")
    a.add_argument("--grid", action="append", default=[], metavar="NAME",
                   help="also print the outcomes by this grid's phases and residues as CSV (the plan's grids: "
                        "'sweep' and those of plan --grid); repeatable (default: none)")
    a.add_argument("--max-missing", type=_fraction, default=0.05,
                   help="refuse (exit 1) a sweep with more than this fraction of its trials without an outcome "
                        "line; 1 analyzes whatever arrived")

    r = commands.add_parser("probe", formatter_class=defaults, help="answer a plan with the synthetic needle probe",
                            description="Runs phasekv's needle probe (a haystack of key->value records read through "
                                        "phasekv's cache and reader) on every trial of the plan files and writes the "
                                        "outcome lines. The record is the plan's; plan with --needle-tokens the record's "
                                        "length (plus 2W with --isolate).")
    r.add_argument("--plan", nargs="+", required=True, help="plan shard file(s) to answer")
    r.add_argument("--out", required=True, help="outcome file to write")
    r.add_argument("--policy", choices=list(sweep.POLICY_NAMES) + list(pk.probe.NeedlePolicy.__members__),
                   default="mean", help="the probe's write path (the short names are examples/phase_sweep's)")
    r.add_argument("--stride", type=_positive, help="S of the probe's own geometry (default: the plan's stride)")
    r.add_argument("--window", type=_positive, help="W (default: the plan's window, else S)")
    r.add_argument("--tokens", type=_positive, help="context length (default: the plan's query position + 1)")
    r.add_argument("--records", type=_positive,
                   help="key->value records (default: a quarter of the tokens, 16000 two-token records per 131072)")
    r.add_argument("--channels", type=_positive, default=512,
                   help="embedding dimension (examples/phase_sweep's default: at 128K, 128 leave S = 8 near chance)")
    r.add_argument("--kappa", type=float, default=0.2, help="shared component of token embeddings")
    r.add_argument("--heads", type=_positive, default=1, help="concentrated_gates: KV heads")
    r.add_argument("--gate-offset", type=_non_negative, default=0, help="concentrated_gates: peaked slot")
    r.add_argument("--seed", type=_non_negative, default=1, help="the probe's embeddings")
    r.add_argument("--slot-profile", type=float, nargs="+", default=[],
                   help="fixed_weight: W slot weights; positional_gates: W slot biases (default: uniform / N(0, 1))")
    r.add_argument("--gate-content", type=float, default=1.0, help="positional_gates: scale of the content logits")
    r.add_argument("--top-k", type=_non_negative, default=0, help="entries the key stream selects (0: every entry)")
    r.add_argument("--isolate", action="store_true",
                   help="keep the other records out of the targets' entries (the control for crowding)")
    r.add_argument("--outcome", choices=("success", "probability", "attributed"), default="success",
                   help="success: retrieved or not; probability: of the right value; attributed: success and "
                        "each failure's cause")
    cluster = r.add_mutually_exclusive_group()
    cluster.add_argument("--scheduler", help="a Dask scheduler address (tcp://host:port) to run on")
    cluster.add_argument("--workers", type=_positive, help="run on a local Dask cluster of this many processes")
    r.add_argument("--quiet", action="store_true", help="no progress on stderr")

    from .served import measure  # pure Python; imported here so plan/analyze/probe need nothing more

    measure.add_parser(commands, defaults, _positive, _non_negative)
    return top


def _progress(what: str, quiet: bool):
    if quiet:
        return None
    shown = {"tenth": -1}

    def report(done: int, total: int) -> None:
        tenth = 10 * done // max(total, 1)
        if sys.stderr.isatty():
            print(f"\r{what}: {done}/{total} trials", end="\n" if done == total else "", file=sys.stderr, flush=True)
        elif tenth != shown["tenth"]:
            shown["tenth"] = tenth
            print(f"{what}: {done}/{total} trials", file=sys.stderr, flush=True)

    return report


def _record(args) -> "pk.RecordShape":
    """The record from --key-tokens/--gap/--value-tokens, or from --needle-tokens alone (key = n − 1,
    value = 1): the record's layout is classified on the needle's real length, and a needle length
    that disagrees with a stated record is a bad argument naming both."""
    given = {f: getattr(args, f) for f in ("key_tokens", "gap", "value_tokens") if getattr(args, f) is not None}
    n = args.needle_tokens
    if n is not None and not given:
        if n < 2:
            raise pk.ConfigError(f"--needle-tokens {n}: a record needs a key and a value token (at least 2)")
        return pk.RecordShape(key_tokens=n - 1, gap=0, value_tokens=1)
    record = pk.RecordShape(key_tokens=given.get("key_tokens", 1), gap=given.get("gap", 0),
                            value_tokens=given.get("value_tokens", 1))
    if n is not None and n != record.length():
        raise pk.ConfigError(
            f"--needle-tokens {n} disagrees with the record's length {record.length()} (--key-tokens "
            f"{record.key_tokens} + --gap {record.gap} + --value-tokens {record.value_tokens}): give a record that "
            f"sums to {n}, or drop --needle-tokens (--needle-spacing reserves room beyond the record)")
    return record


def _plan(args) -> int:
    record = _record(args)
    config = pk.SweepConfig(stride=args.stride, modulus=args.modulus, trials_per_residue=args.trials,
                            query_position=args.query_position, span=args.span, min_distance=args.min_distance,
                            query_jitter=args.query_jitter, seed=args.seed, window=args.window, origin=args.origin,
                            record=record, layout=pk.LayoutMode.__members__[args.layout])
    if args.needle_spacing is not None and args.needle_spacing < record.length():
        raise pk.ConfigError(f"--needle-spacing {args.needle_spacing}: less than the record's length {record.length()}")
    p = sweep.plan(config, configuration=args.configuration, needle_tokens=args.needle_spacing or record.length(),
                   design=args.design, grids=args.grid)
    files = p.write(args.out, shards=args.shards)
    print(f"sweep {p.sweep_id}: {len(p.trials)} trials ({len(config.planned_residues())} residues x {args.trials}) in "
          f"{len(p.haystacks())} haystacks, {len(files)} file(s):")
    for f in files:
        print(f"  {f}")
    return 0


def _analyze(args) -> int:
    p = sweep.read_plan(args.plan)
    kind = None if args.kind == "auto" else pk.OutcomeKind.__members__[args.kind]
    analysis = sweep.analyze(p, args.outcomes, kind=kind)
    if analysis.missing_fraction > args.max_missing:
        print(f"python -m phasekv analyze: refused: {len(analysis.missing)} of {len(p.trials)} trials "
              f"({100 * analysis.missing_fraction:.1f}%) have no outcome line, more than --max-missing "
              f"{args.max_missing:g}; run the missing trials (first: trial_id {analysis.missing[0]}), or pass "
              f"--max-missing {analysis.missing_fraction:.3f} to analyze what arrived", file=sys.stderr)
        return 1
    for name in args.grid:
        analysis.by_grid(name)  # an unknown grid: exit 2 before any output
    print(analysis.report(), end="")
    for name in args.grid:
        print(f"grid {name}:")
        print(analysis.grid_table(name), end="")
    if args.out_dir:
        for f in analysis.write(args.out_dir, stem=args.stem, label=args.label):
            print(f"wrote {f}")
    return 0 if analysis.result.valid else 1


def _probe(args) -> int:
    part = sweep.read_shards(args.plan)
    tokens = args.tokens or part.trials[0]["layout"]["context_tokens"]
    record = part.trials[0]["sweep"].get("record", {})
    shape = pk.RecordShape(**record) if record else pk.RecordShape()
    # The study's density, as examples/phase_sweep: 16000 two-token records per 131072 tokens.
    records = args.records or max(1, tokens * 16000 // 131072 * 2 // shape.length())
    planned = part.trials[0]["sweep"]
    stride = args.stride or planned["stride"]
    if args.window:
        window = args.window
    elif args.stride:
        window = stride
    else:
        window = planned.get("window") or stride
    evaluate = sweep.NeedleEvaluate(policy=args.policy, stride=stride, window=window, tokens=tokens,
                                    records=records,
                                    channels=args.channels, kappa=args.kappa, heads=args.heads,
                                    gate_offset=args.gate_offset, seed=args.seed, record=shape,
                                    slot_profile=args.slot_profile, gate_content=args.gate_content, top_k=args.top_k,
                                    isolate_targets=args.isolate, outcome=args.outcome)
    evaluate.check(part.trials[0])  # a plan made for other settings: exit 2 before any trial
    client = None
    if args.scheduler or args.workers:
        from distributed import Client, LocalCluster

        client = (Client(args.scheduler) if args.scheduler else
                  Client(LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True)))
    try:
        records = sweep.evaluate_trials(part, evaluate, client, progress=_progress("probe", args.quiet))
    finally:
        if client is not None:
            client.close()
    sweep.write_outcomes(args.out, records)
    print(f"wrote {len(records)} outcome lines to {args.out}")
    return 0


def _measure(args) -> int:
    from .served import measure

    try:
        return measure.run(args)
    except KeyboardInterrupt:
        print("python -m phasekv measure: interrupted; the finished trials are on disk: run the same command to "
              "resume", file=sys.stderr)
        return 130


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"plan": _plan, "analyze": _analyze, "probe": _probe, "measure": _measure}[args.command](args)
    except (pk.Error, OSError) as e:
        print(f"python -m phasekv {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
