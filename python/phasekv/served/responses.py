"""Log-probabilities out of the completion responses servers give, in one shape.

Formats read (each documented by its server):

- OpenAI legacy ``/v1/completions`` (vLLM, SGLang, the OpenAI reference): ``choices[0].logprobs``
  = {tokens, token_logprobs, top_logprobs (a dict token -> logprob per position, or null),
  text_offset}. With ``echo`` the prompt's tokens come first (the first one's logprob null); the
  prompt's length is ``usage.prompt_tokens``.
- vLLM's ``prompt_logprobs`` (a request field): ``choices[0].prompt_logprobs`` = one entry per
  prompt token, null for the first, else {token_id: {logprob, rank, decoded_token}} holding the
  actual token and the top ones.
- llama.cpp server ``/completion``: ``completion_probabilities`` = per generated token either
  {id, token, logprob, bytes, top_logprobs: [{id, token, logprob, bytes}]} (current) or
  {content, probs: [{tok_str, prob}]} (older; probabilities, not logs), or with
  post_sampling_probs {token, prob, top_probs: [{token, prob}]}.
- llama.cpp's ``/v1/completions`` and chat-style logprobs: ``choices[0].logprobs.content`` =
  [{token, logprob, top_logprobs: [{token, logprob}]}].

``parse_completion(body)`` gives a ``Completion``: the text, the generated tokens' logprobs and
alternatives, the prompt's (when echoed or asked for), token counts. A format it cannot read is a
ValueError naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    token: str  # the token's text (or "id:N" when only an id is given)
    logprob: float | None  # None: not given (e.g. the first prompt token)
    top: Mapping[str, float]  # alternatives at this position: token text -> logprob (may be empty)
    token_id: int | None = None


@dataclasses.dataclass(frozen=True)
class Completion:
    text: str
    generated: tuple  # TokenLogprob per generated token (empty if the server gave no logprobs)
    prompt: tuple | None  # TokenLogprob per prompt token (echo / prompt_logprobs), else None
    prompt_tokens: int | None
    completion_tokens: int | None
    has_logprobs: bool  # whether the server returned any logprobs at all
    format: str  # which format was read


def _log(p: Any) -> float:
    p = float(p)
    return math.log(p) if p > 0 else -math.inf


def _number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} = {value!r}: not a number")
    return float(value)


def _legacy(logprobs: Mapping[str, Any], where: str) -> list[TokenLogprob]:
    tokens = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    if len(values) != len(tokens):
        raise ValueError(f"{where}.token_logprobs: {len(values)} values for {len(tokens)} tokens")
    out = []
    for k, (tok, lp) in enumerate(zip(tokens, values)):
        top = tops[k] if k < len(tops) else None
        out.append(TokenLogprob(str(tok), _number(lp, f"{where}.token_logprobs[{k}]"),
                                {str(t): float(v) for t, v in (top or {}).items() if v is not None}))
    return out


def _content_list(items: Sequence[Mapping[str, Any]], where: str) -> list[TokenLogprob]:
    """llama.cpp's completion_probabilities and chat-style logprobs.content, any of their variants."""
    out = []
    for k, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ValueError(f"{where}[{k}] = {item!r}: not an object")
        token = item.get("token", item.get("content", ""))
        if "logprob" in item:
            lp = _number(item["logprob"], f"{where}[{k}].logprob")
        elif "prob" in item:
            lp = _log(item["prob"])
        else:
            lp = None
        top: dict[str, float] = {}
        for alt in item.get("top_logprobs") or []:
            top[str(alt.get("token", ""))] = float(alt["logprob"])
        for alt in item.get("top_probs") or item.get("probs") or []:
            top[str(alt.get("token", alt.get("tok_str", "")))] = _log(alt["prob"])
        if lp is None and token in top:  # the older format gives the chosen token among `probs`
            lp = top[token]
        out.append(TokenLogprob(str(token), lp, top, item.get("id") if isinstance(item.get("id"), int) else None))
    return out


def _vllm_prompt_logprobs(entries: Sequence[Any], prompt_ids: Sequence[int] | None, where: str) -> list[TokenLogprob]:
    out = []
    for k, entry in enumerate(entries):
        if entry is None:
            out.append(TokenLogprob("", None, {}, None if prompt_ids is None else int(prompt_ids[k])))
            continue
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}[{k}] = {entry!r}: not an object")
        actual = None if prompt_ids is None else str(int(prompt_ids[k]))
        top = {}
        chosen = None
        for token_id, info in entry.items():
            text = str(info.get("decoded_token", token_id)) if isinstance(info, Mapping) else str(token_id)
            value = float(info["logprob"]) if isinstance(info, Mapping) else float(info)
            top[text] = value
            if actual is not None and str(token_id) == actual:
                chosen = (text, value)
        if chosen is None:  # without ids: the entry with the worst rank is the prompt's own token when not in top
            token_id, info = next(iter(entry.items()))
            chosen = (str(info.get("decoded_token", token_id)) if isinstance(info, Mapping) else str(token_id),
                      float(info["logprob"]) if isinstance(info, Mapping) else float(info))
        out.append(TokenLogprob(chosen[0], chosen[1], top, int(actual) if actual is not None else None))
    return out


def parse_completion(body: Mapping[str, Any], *, echo: bool = False,
                     prompt_ids: Sequence[int] | None = None) -> Completion:
    """One completion response (the first choice) in one shape. `echo`: the request echoed the
    prompt (its tokens lead the logprobs); `prompt_ids`: the ids sent (to pick each prompt
    token's own entry out of vLLM's prompt_logprobs)."""
    if not isinstance(body, Mapping):
        raise ValueError(f"response = {body!r}: not a JSON object")
    usage = body.get("usage") or {}
    prompt_tokens = usage.get("prompt_tokens")
    completion_tokens = usage.get("completion_tokens")
    if "completion_probabilities" in body or ("content" in body and "choices" not in body):
        # llama.cpp /completion
        # Its tokens_evaluated / timings.prompt_n can leave out a reused cached prefix, so they
        # are not the prompt's length: no prompt_tokens (the count check then does not apply).
        gen = _content_list(body.get("completion_probabilities") or [], "completion_probabilities")
        return Completion(str(body.get("content", "")), tuple(gen), None, None, body.get("tokens_predicted"),
                          bool(body.get("completion_probabilities")), "llama.cpp /completion")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise ValueError(f"response: no choices[0] (keys: {sorted(body)})")
    choice = choices[0]
    text = str(choice.get("text", ""))
    logprobs = choice.get("logprobs")
    prompt = None
    fmt = "openai completions"
    generated: list[TokenLogprob] = []
    if isinstance(logprobs, Mapping) and "content" in logprobs:
        generated = _content_list(logprobs.get("content") or [], "choices[0].logprobs.content")
        fmt = "logprobs.content"
    elif isinstance(logprobs, Mapping):
        tokens = _legacy(logprobs, "choices[0].logprobs")
        if echo:
            if prompt_tokens is None:
                if prompt_ids is None:
                    raise ValueError("echo: the response has no usage.prompt_tokens to split prompt and answer at")
                prompt_tokens = len(prompt_ids)
            prompt, generated = tokens[:prompt_tokens], tokens[prompt_tokens:]
        else:
            generated = tokens
    elif logprobs is not None:
        raise ValueError(f"choices[0].logprobs = {logprobs!r}: not an object")
    if choice.get("prompt_logprobs") is not None:
        prompt = _vllm_prompt_logprobs(choice["prompt_logprobs"], prompt_ids, "choices[0].prompt_logprobs")
        fmt += " + vLLM prompt_logprobs"
    has = bool(generated) or bool(prompt)
    return Completion(text, tuple(generated), tuple(prompt) if prompt is not None else None, prompt_tokens,
                      completion_tokens, has, fmt)
