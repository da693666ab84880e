"""The needle experiment on a served model: a plan's trials as requests, the answers as the
protocol's outcome lines (so ``python -m phasekv analyze`` reads them unchanged).

Per trial: the prompt (NeedleBuilder), sent as token ids (``send="ids"``) or as text re-encoded
and checked (``send="text"``); greedy generation of the value's tokens with top logprobs. The
outcome is whether the answer's first word is the value's (``answer_matches``). The line keeps,
besides the protocol's fields: ``prompt_sha256`` (of the ids), ``answer_text``, ``expected``,
``candidates`` (logprob of the expected first token and of the one generated, where the server
gave them), ``latency_s``, ``prompt_tokens`` / ``completion_tokens`` (the server's count),
``endpoint``, ``attempts``, ``placement_attempt``. A server whose prompt token count differs from
the ids sent (a BOS added twice, a template applied) makes the trial an error, not an outcome:
its positions would not be the plan's.
"""

from __future__ import annotations

import re
from typing import Any, Iterator, Mapping, Sequence

from ..sweep import OUTCOME_FORMAT, outcome_record
from .client import Job
from .errors import EndpointError
from .placement import NeedleBuilder, NeedlePrompt
from .responses import parse_completion

SEND_MODES = ("ids", "text")
_WORD = re.compile(r"[^\s.,;:!?\"')\]]+")


def answer_matches(generated: str, expected: str) -> bool:
    """Whether the first word of `generated` is `expected`'s (whitespace and trailing
    punctuation aside): " 4821." matches " 4821", " 48210" does not."""
    got = _WORD.search(generated)
    want = _WORD.search(expected)
    return bool(got and want and got.group(0) == want.group(0))


def _candidate_logprobs(completion, prompt: NeedlePrompt) -> dict:
    out: dict[str, float | None] = {}
    if completion.generated:
        first = completion.generated[0]
        expected = prompt.answer.strip()
        hit = None
        for token, lp in first.top.items():
            if token.strip() and expected.startswith(token.strip()):
                hit = lp if hit is None else max(hit, lp)
        out["expected_first_token"] = hit
        out["generated_first_token"] = first.logprob
    return out


def needle_jobs(trials: Sequence[Mapping[str, Any]], builder: NeedleBuilder, *, send: str = "ids",
                logprobs: int = 5, extra_tokens: int = 2, text_attempts: int = 8) -> Iterator[Job]:
    """One Job per trial, in (haystack, trial_id) order; prompts are built when a worker takes
    the job (bounded memory)."""
    if send not in SEND_MODES:
        raise EndpointError(f"send = {send!r}: must be one of {SEND_MODES}")
    builder.check_plan(trials)
    value_tokens = builder.shape[2]
    ordered = sorted(trials, key=lambda t: (t.get("haystack", 0), t["trial_id"]))
    for trial in ordered:
        yield _job(trial, builder, send, logprobs, value_tokens + extra_tokens, text_attempts)


def _job(trial: Mapping[str, Any], builder: NeedleBuilder, send: str, logprobs: int, max_tokens: int,
         text_attempts: int) -> Job:
    state: dict = {}

    def body() -> dict:
        if send == "ids":
            prompt = builder.build(trial)
            payload: Any = prompt.id_list()
        else:
            prompt, text = builder.build_text(trial, attempts=text_attempts)
            payload = text
        state["prompt"] = prompt
        request = {"prompt": payload, "max_tokens": max_tokens, "temperature": 0}
        if logprobs:
            request["logprobs"] = logprobs
        return request

    def finish(response: Any, info: dict) -> dict:
        prompt: NeedlePrompt = state["prompt"]
        completion = parse_completion(response, prompt_ids=prompt.id_list())
        if completion.prompt_tokens is not None and completion.prompt_tokens != len(prompt.ids):
            raise EndpointError(f"the server counted {completion.prompt_tokens} prompt tokens for the {len(prompt.ids)} "
                                "planned: it added or dropped tokens (a second BOS? a chat template?), so the "
                                "positions are not the plan's")
        ok = answer_matches(completion.text, prompt.answer)
        record = outcome_record(trial, ok)
        record.update(_extras(prompt, info))
        record.update({"answer_text": completion.text, "expected": prompt.answer,
                       "candidates": _candidate_logprobs(completion, prompt),
                       "prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens})
        return record

    def fail(reason: str, info: dict) -> dict:
        record = outcome_record(trial, error=reason)
        if "prompt" in state:
            record.update(_extras(state["prompt"], info))
        return record

    return Job(key=trial["trial_id"], body=body, finish=finish, fail=fail)


def _extras(prompt: NeedlePrompt, info: Mapping[str, Any]) -> dict:
    return {"prompt_sha256": prompt.sha256, "latency_s": info.get("latency_s"), "endpoint": info.get("endpoint"),
            "attempts": info.get("attempts"), "placement_attempt": prompt.attempt,
            "needle": list(prompt.needle), "question": list(prompt.question)}


def preflight_needle(client, builder: NeedleBuilder, trial: Mapping[str, Any], *, send: str, logprobs: int) -> None:
    """One short request per endpoint before the sweep: reachable, takes this kind of prompt,
    counts its tokens as sent, returns logprobs when asked for. EndpointError otherwise."""
    prefix = list(builder.prefix.ids) or [int(builder.vocabulary.filler[0])]
    ids = prefix + [int(builder.vocabulary.filler[0])] * 4
    if send == "ids":
        body: dict = {"prompt": ids, "max_tokens": 1, "temperature": 0}
    else:
        body = {"prompt": builder.tokenizer.decode(ids[1:] if builder.tokenizer.bos_id is not None
                                                   and ids[0] == builder.tokenizer.bos_id else ids),
                "max_tokens": 1, "temperature": 0}
    if logprobs:
        body["logprobs"] = logprobs

    def needs(response: Any) -> str | None:
        try:
            completion = parse_completion(response, prompt_ids=ids)
        except ValueError as e:
            return f"an unreadable completion response ({e})"
        if completion.prompt_tokens is not None and completion.prompt_tokens != len(ids):
            sent = "ids sent" if send == "ids" else "tokens planned (the text sent, with its BOS)"
            return (f"counted {completion.prompt_tokens} prompt tokens for {len(ids)} {sent}: it adds or drops "
                    "tokens, so planned positions would move")
        if logprobs and not completion.has_logprobs:
            return "no logprobs in its response (start the server with logprobs enabled, or pass --logprobs 0)"
        return None

    client.check(body, needs)


__all__ = ["SEND_MODES", "answer_matches", "needle_jobs", "preflight_needle", "OUTCOME_FORMAT"]
