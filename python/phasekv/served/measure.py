"""``python -m phasekv measure``: a served model's phase profile in one command.

    python -m phasekv measure --endpoint http://127.0.0.1:8000 --model NAME --tokenizer PATH \\
        --stride 4 --experiment needle --out DIR

needle   plans a sweep (or reads --plan), builds every trial's prompt on the tokenizer, sends it,
         writes DIR/outcomes.jsonl as answers arrive, then analyzes it as `analyze` does
         (DIR/sweep.txt/.csv/.json/.svg). DIR/plan.jsonl is the plan: `python -m phasekv analyze
         --plan DIR/plan.jsonl --outcomes DIR/outcomes.jsonl` gives the same report.
padding  the padding experiment on --prompt (default: the shipped code prompt, 8 vs 32): lines in
         DIR/padding.jsonl, the analysis in DIR/padding.txt/.csv/.json/.svg.

The same command again resumes: finished trials are skipped (a plan of other settings in DIR is
refused). Before the first trial every endpoint gets one request that must be answered in the
form the experiment needs (an unreachable server, ids refused, no logprobs: exit 2).

Exit status as `analyze`: 0 a valid result, 1 an invalid one (too few valid trials in some residue),
2 bad arguments, files, tokenizer or endpoints.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Any

from .. import _phasekv as _pk
from .. import sweep
from .client import CompletionClient
from .errors import ServedInputError
from .needle import SEND_MODES, needle_jobs, preflight_needle
from .padding import EXAMPLES, SCORING, PaddingExperiment, analyze_padding, load_spec, read_padding_lines
from .placement import VALUE_KINDS, NeedleBuilder, RecordTemplate, chat_template, model_prefix
from .tokenizers import load_tokenizer

PRESETS = {
    # The study's 128K needle sweep: 16 residues x 64 trials, ~16,000 records, query at 131071.
    "study-128k": dict(stride=4, modulus=16, trials=64, query_position=131071, span=120000, min_distance=4096),
}


def add_parser(commands: Any, formatter: Any, positive: Any, non_negative: Any) -> None:
    m = commands.add_parser("measure", formatter_class=formatter, help="measure a served model (needle or padding)",
                            description="Measures a model behind an OpenAI-compatible completions endpoint: the needle "
                            "sweep or the padding experiment, resumable (docs/SERVED.md).")
    m.add_argument("--endpoint", action="append", required=True,
                   help="completions URL (http://host:port[/v1/completions]); repeat for replicas")
    m.add_argument("--model", required=True, help="the model name the server serves")
    m.add_argument("--tokenizer", required=True,
                   help="the model's tokenizer: a sentencepiece .model, a tokenizer.json, a transformers directory, "
                        "or kind:NAME (tiktoken:cl100k_base)")
    m.add_argument("--stride", type=positive, required=True, help="compression stride S the profile is read against")
    m.add_argument("--experiment", choices=("needle", "padding"), required=True, help="which experiment")
    m.add_argument("--out", required=True, help="directory of the plan, the outcome lines and the report")
    m.add_argument("--origin", type=non_negative, default=0,
                   help="the compression grid's origin, in the model's positions (position 0 = its first token)")
    m.add_argument("--no-bos", action="store_true", help="the server puts no BOS before the prompt")
    m.add_argument("--system", help="system prompt text after the BOS, counted in the positions (default: none)")
    m.add_argument("--chat-template", action="store_true",
                   help="apply the tokenizer's chat template here (transformers tokenizers): its head before the "
                        "prompt, its tail after the question, every token counted; send to /v1/completions")
    m.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    m.add_argument("--concurrency", type=positive, default=4, help="requests in flight per endpoint")
    m.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    m.add_argument("--retries", type=non_negative, default=6, help="retries of a request (429, 5xx, timeouts, resets)")
    m.add_argument("--backoff", type=float, default=1.0, help="first retry's wait in seconds (doubles, with jitter)")
    m.add_argument("--quiet", action="store_true", help="no progress on stderr")
    m.add_argument("--max-errored", type=float, default=0.05,
                   help="exit 1 when more than this fraction of the trials errored or is missing (the table "
                        "is still written)")
    n = m.add_argument_group("needle")
    n.add_argument("--plan", nargs="+", help="an existing plan's shard files (default: plan here from the options below)")
    n.add_argument("--preset", choices=sorted(PRESETS), help="plan options of a named study (overrides the plan options)")
    n.add_argument("--modulus", type=non_negative, default=0, help="residues t mod M; 0 means 2S")
    n.add_argument("--trials", type=positive, default=32, help="trials per residue")
    n.add_argument("--query-position", type=positive, default=8191, help="the question's last token's position")
    n.add_argument("--span", type=positive, default=6144, help="width of the target range")
    n.add_argument("--min-distance", type=positive, default=512, help="targets at least this far before the query")
    n.add_argument("--seed", type=non_negative, default=0, help="run order and haystack content")
    n.add_argument("--query-jitter", type=positive, default=1,
                   help="J: trial i asks at query_position - o_i, o_i in [0, J); a multiple of S separates phase "
                        "from distance (1: one query position, phase and distance confounded)")
    n.add_argument("--design", choices=sweep.DESIGNS, default="haystacks",
                   help="haystacks: several needles per haystack; single: one needle per prompt, one shared "
                        "haystack content; paired: one content shifted by padding to every residue (Cochran's Q)")
    n.add_argument("--key-tokens", type=positive, default=1, help="tokens of a record's key")
    n.add_argument("--gap", type=non_negative, default=0, help="tokens of the connective between key and value")
    n.add_argument("--value-tokens", type=positive, default=1, help="tokens of a record's value")
    n.add_argument("--connective", default="", help="the text between key and value (--gap tokens)")
    n.add_argument("--values", choices=VALUE_KINDS, default="numbers", help="what the values are")
    n.add_argument("--density", type=float, default=16000 / 131072, help="distractor records per token")
    n.add_argument("--decoys", type=float, default=0.5, help="lone values per distractor record")
    n.add_argument("--send", choices=SEND_MODES, default="ids",
                   help="ids: prompts as token ids; text: as text re-encoded and checked here first")
    n.add_argument("--logprobs", type=non_negative, default=5, help="top logprobs kept per answer token (0: none)")
    p = m.add_argument_group("padding")
    p.add_argument("--prompt", default=str(EXAMPLES / "code_8_vs_32.json"),
                   help="the padding prompt file (JSON: prompt with {padding}, candidates, answer, units)")
    p.add_argument("--periods", type=positive, default=4, help="padding lengths 0 .. periods*S-1")
    p.add_argument("--reps", type=positive, default=1, help="repetitions per length (cycling through the units)")
    p.add_argument("--scoring", choices=SCORING, default="score",
                   help="score: echo+logprobs; prompt_logprobs: vLLM's; top: first generated token's top logprobs")
    p.add_argument("--top", type=positive, default=20, help="top logprobs asked for with --scoring top")


def _prefix(args: Any, tokenizer: Any):
    if args.chat_template:
        return model_prefix(tokenizer, bos=not args.no_bos, template=chat_template(tokenizer, system=args.system))
    return model_prefix(tokenizer, bos=not args.no_bos, system=args.system or None)


def _client(args: Any) -> CompletionClient:
    if not args.timeout > 0 or not args.backoff > 0:
        raise ServedInputError(f"--timeout {args.timeout} / --backoff {args.backoff}: must be positive")
    return CompletionClient(args.endpoint, args.model, concurrency=args.concurrency, timeout=args.timeout,
                            retries=args.retries, backoff=args.backoff, api_key_env=args.api_key_env,
                            progress=not args.quiet)


def _needle(args: Any, tokenizer: Any, out: pathlib.Path) -> int:
    plan_path = out / "plan.jsonl"
    if args.plan:
        plan = sweep.read_plan(args.plan)
    else:
        options = dict(stride=args.stride, modulus=args.modulus, trials=args.trials,
                       query_position=args.query_position, span=args.span, min_distance=args.min_distance)
        if args.preset:
            options.update(PRESETS[args.preset])
        if options["stride"] != args.stride:
            raise ServedInputError(f"--preset {args.preset} is for stride {options['stride']}, not --stride {args.stride}")
        config = _pk.SweepConfig(stride=options["stride"], modulus=options["modulus"],
                                 trials_per_residue=options["trials"], query_position=options["query_position"],
                                 span=options["span"], min_distance=options["min_distance"], seed=args.seed,
                                 query_jitter=args.query_jitter,
                                 origin=args.origin % args.stride,
                                 record=_pk.RecordShape(key_tokens=args.key_tokens, gap=args.gap,
                                                        value_tokens=args.value_tokens))
        configuration = {"model": args.model, "tokenizer": getattr(tokenizer, "name", args.tokenizer),
                         "experiment": "served needle", "label": f"{args.model} S={args.stride}"}
        plan = sweep.plan(config, configuration=configuration, design=args.design)
    if plan_path.exists():
        held = sweep.read_plan([plan_path])
        if held.sweep_id != plan.sweep_id:
            raise ServedInputError(f"{plan_path} holds sweep {held.sweep_id}, not this command's {plan.sweep_id}: use "
                                   "another --out, or the same options to resume")
    else:
        plan.write(plan_path)
    template = RecordTemplate(connective=args.connective, values=args.values, density=args.density, decoys=args.decoys)
    prefix = _prefix(args, tokenizer)
    builder = NeedleBuilder(tokenizer, template, prefix, stride=args.stride)
    builder.check_plan(plan.trials)
    _same_settings(out, {"experiment": "needle", "sweep_id": plan.sweep_id, "model": args.model,
                         "tokenizer": getattr(tokenizer, "name", args.tokenizer), "prefix_ids": list(prefix.ids),
                         "prefix_tail_ids": list(prefix.tail), "prefix": prefix.description,
                         "grid_origin": plan.sweep["origin"], "positions": "0 = the first token the model sees",
                         "template": {"connective": args.connective, "values": args.values, "density": args.density,
                                      "decoys": args.decoys},
                         "send": args.send, "logprobs": args.logprobs})
    client = _client(args)
    preflight_needle(client, builder, plan.trials[0], send=args.send, logprobs=args.logprobs)
    outcomes = out / "outcomes.jsonl"
    started = time.monotonic()
    summary = client.run(needle_jobs(plan.trials, builder, send=args.send, logprobs=args.logprobs), outcomes,
                         total=len(plan.trials))
    print(f"measure: {summary.done} outcomes, {summary.errors} errors, {summary.skipped} already done, "
          f"{summary.retries} retries in {time.monotonic() - started:.1f} s -> {outcomes}")
    analysis = sweep.analyze(plan, [outcomes])
    print(analysis.report(), end="")
    for f in analysis.write(out, stem="sweep"):
        print(f"wrote {f}")
    failed = len(set(analysis.missing) | set(analysis.host_errors) | set(analysis.conflicts))
    few = _few_errors(failed, len(plan.trials), args.max_errored)  # says so on stderr when not
    return 0 if analysis.result.valid and few else 1


def _same_settings(out: pathlib.Path, settings: dict) -> None:
    """DIR/measure.json records what the outcome lines were measured with (the plan's id, the model,
    the tokenizer, the prefix ids, the grid origin, the template, how prompts are sent); a rerun
    into the same DIR with anything else is refused, so lines of two settings never mix."""
    path = out / "measure.json"
    settings = json.loads(json.dumps(settings))
    if path.exists():
        try:
            held = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ServedInputError(f"{path}: not JSON ({e.msg})") from None
        differs = sorted(k for k in set(held) | set(settings) if held.get(k) != settings.get(k))
        if differs:
            k = differs[0]
            raise ServedInputError(f"{out} was measured with other settings ({k}: {held.get(k)!r} there, "
                                   f"{settings.get(k)!r} now): use another --out, or the same options to resume")
    else:
        path.write_text(json.dumps(settings, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _few_errors(failed: int, planned: int, limit: float) -> bool:
    """Whether the errored or missing trials are within --max-errored (else say so on stderr)."""
    if failed <= limit * planned:
        return True
    print(f"measure: {failed} of {planned} trials errored or are missing (more than --max-errored {limit:g}): the "
          "table is not to be trusted; run the same command again to retry them", file=sys.stderr)
    return False


def _padding(args: Any, tokenizer: Any, out: pathlib.Path) -> int:
    spec = load_spec(args.prompt)
    prefix = _prefix(args, tokenizer)
    if prefix.tail:
        raise ServedInputError("--chat-template: the padding experiment's prompt is completed as it stands (its "
                               "answer follows the prompt text); apply no chat template to it")
    experiment = PaddingExperiment(spec, tokenizer, stride=args.stride, periods=args.periods, reps=args.reps,
                                   origin=args.origin, prefix=list(prefix.ids), scoring=args.scoring, top=args.top)
    for reason in experiment.rejected_units:
        print(f"measure: {reason}: not used", file=sys.stderr)
    _same_settings(out, {"experiment": "padding", "sweep_id": experiment.sweep_id, "model": args.model,
                         "tokenizer": getattr(tokenizer, "name", args.tokenizer), "prefix_ids": list(prefix.ids),
                         "prefix": prefix.description, "grid_origin": experiment.origin,
                         "positions": "0 = the first token the model sees", "units": list(experiment.units),
                         "scoring": args.scoring})
    lines_path = out / "padding.jsonl"
    if lines_path.exists():
        read_padding_lines([lines_path], experiment.sweep_id)  # refuses another experiment's lines
    client = _client(args)
    experiment.preflight(client)
    summary = client.run(experiment.jobs(), lines_path, total=experiment.total)
    print(f"measure: {summary.done} outcomes, {summary.errors} errors, {summary.skipped} already done, "
          f"{summary.retries} retries -> {lines_path}")
    analysis = analyze_padding(experiment, read_padding_lines([lines_path], experiment.sweep_id),
                               label=f"{args.model}")
    print(analysis.table(), end="")
    for f in analysis.write(out, stem="padding"):
        print(f"wrote {f}")
    valid = all(r["n"] >= 2 for r in analysis.residues)
    few = _few_errors(analysis.errored + analysis.missing, analysis.trials, args.max_errored)
    return 0 if valid and few else 1


def run(args: Any) -> int:
    tokenizer = load_tokenizer(args.tokenizer)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.experiment == "needle":
        return _needle(args, tokenizer, out)
    return _padding(args, tokenizer, out)
