"""A real OpenAI-compatible completions server on 127.0.0.1, running a model whose truth is known,
with fault injection: what phasekv.served's tests (and a researcher trying the client) run against.

    with CompletionServer(model, tokenizer, faults=Faults(rate_limit_every=7)) as server:
        server.url  # http://127.0.0.1:PORT

``POST /v1/completions`` takes ``prompt`` (a list of token ids, a string, or a one-element list of
either), ``max_tokens`` (default 16), ``logprobs`` (top alternatives per token, as OpenAI legacy
completions), ``echo`` (prompt tokens and their logprobs first), vLLM's ``prompt_logprobs`` and
``temperature`` (ignored: decoding is greedy). The answer is OpenAI's legacy format with
``usage``. ``POST /completion`` is llama.cpp's native dialect (``n_predict``, ``n_probs``,
``completion_probabilities``). ``GET /v1/models`` lists the model. Options make it behave like servers that lack
something: ``accepts_ids=False`` (text prompts only), ``logprobs=False`` (logprobs always null).

Models (``ServedModel``): ``logprobs(ids) -> {token_id: logprob}``, the next-token distribution
over a few ids (the rest share what is left). Echoed prompt logprobs are computed for the last
``echo_window`` prompt tokens; earlier ones get the model's ``background`` logprob.

- ``RetrievalModel``: answers "the value of KEY is" by finding KEY's record in the prompt and
  emitting its value with probability p(record start, query) (else another value): a per-prompt
  draw u = hash(prompt) / 2^64 decides, so the per-residue accuracy is the mean of p. ``straddle_p``
  gives p by whether the record crosses a chunk boundary of stride S (the known dip);
  ``probe_p`` gives p from phasekv's own needle probe (its cache and reader) at the record's
  position and the query.
- ``PaddingModel``: after a cue, the candidates' probabilities depend on the answer position's
  residue mod S (a dip at given residues, or flat).

Faults (``Faults``), by the order requests arrive (1-based): every k-th answered 429 with
Retry-After, every k-th answered 503, every k-th delayed by ``delay`` seconds (a client timeout),
every k-th connection dropped without an answer. The server stops by itself after
``max_requests`` requests or ``idle_seconds`` without one, and binds only to 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import math
import socket
import threading
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from .placement import NeedleBuilder


class ServedModel(Protocol):
    background: float

    def logprobs(self, ids: Sequence[int]) -> dict[int, float]: ...


def _hash_unit(ids: Sequence[int], salt: int = 0) -> float:
    digest = hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes() + salt.to_bytes(8, "little")).digest()
    return int.from_bytes(digest[:8], "little") / 2.0 ** 64


def straddle_p(stride: int, *, origin: int = 0, contained: float = 0.9, straddle: float = 0.2,
               length: int = 2) -> Callable[[int, int], float]:
    """p(t, q): `straddle` when the record [t, t + length) crosses a boundary of the chunk grid
    (origin + kS), else `contained`. With length 2 the dip is at residue (origin − 1) mod S."""
    def p(t: int, q: int) -> float:
        return straddle if (t - origin) // stride != (t + length - 1 - origin) // stride else contained
    return p


def flat_p(value: float = 0.8) -> Callable[[int, int], float]:
    return lambda t, q: value


def probe_p(config: Any) -> Callable[[int, int], float]:
    """p(t, q) from phasekv's synthetic needle probe (phasekv.probe.NeedleProbe with `config`):
    the probability it retrieves a record at t read at query q, through phasekv's compressors,
    paged cache and sparse reader. Deterministic; one probe, serialized by a lock."""
    from .. import probe as _probe

    instance = _probe.NeedleProbe(config)
    lock = threading.Lock()
    cache: dict = {}

    def p(t: int, q: int) -> float:
        with lock:
            if (t, q) not in cache:
                targets = np.asarray([t], np.int64)
                instance.prepare(targets, q, context=(t * 1_000_003 + q) % (1 << 31))
                cache[(t, q)] = float(instance.probabilities(targets)[0])
            return cache[(t, q)]
    return p


class RetrievalModel:
    """A retrieval model that reads the prompt's records (the format a NeedleBuilder writes) and
    answers the question with probability p(record start, query position)."""

    def __init__(self, builder: NeedleBuilder, p: Callable[[int, int], float], *, salt: int = 0):
        self.vocab = builder.vocabulary
        self.key_tokens, self.gap, self.value_tokens = builder.shape
        self.tail = np.asarray(self.vocab.question_tail + builder.prefix.tail, np.int64)
        self.head = np.asarray(self.vocab.question_head, np.int64)
        self.p = p
        self.salt = salt
        self.background = math.log(1e-4)
        self.answers = 0
        self.not_found = 0

    def logprobs(self, ids: Sequence[int]) -> dict[int, float]:
        ids = np.asarray(ids, np.int64)
        kt, gap, vt = self.key_tokens, self.gap, self.value_tokens
        L = len(self.tail)
        for j in range(vt):  # j value tokens already generated
            end = len(ids) - j
            if end - L - kt < 0 or not np.array_equal(ids[end - L:end], self.tail):
                continue
            key = ids[end - L - kt:end - L]
            if len(self.head) and not np.array_equal(ids[end - L - kt - len(self.head):end - L - kt], self.head):
                continue
            question_start = end - L - kt - len(self.head)
            n = kt + gap + vt
            starts = np.nonzero(ids[:max(0, question_start - n + 1)] == key[0])[0]
            found = [int(s) for s in starts if np.array_equal(ids[s:s + kt], key)
                     and np.array_equal(ids[s + kt:s + kt + gap], self.vocab.connective)]
            prompt = ids[:end]
            if len(found) != 1:
                self.not_found += 1
                wrong = self.vocab.values[int(_hash_unit(prompt, 7) * len(self.vocab.values))]
                return {int(wrong[j]): math.log(0.5)}
            t = found[0]
            value = ids[t + kt + gap:t + n]
            ok = _hash_unit(prompt, self.salt) < self.p(t, end - 1)
            others = [v for v in self.vocab.values if not np.array_equal(v, value)]
            wrong = others[int(_hash_unit(prompt, self.salt + 1) * len(others))]
            if j > 0:  # continue whichever value was begun
                begun = ids[end:end + j]
                chosen = value if np.array_equal(value[:j], begun) else wrong
                return {int(chosen[j]): math.log(0.9)}
            self.answers += 1
            right, other = (0.7, 0.2) if ok else (0.2, 0.7)
            return {int(value[0]): math.log(right), int(wrong[0]): math.log(other)}
        return {}


class CacheRetrievalModel:
    """A one-layer retrieval model whose attention is phasekv's: the prompt's token vectors are
    written through phasekv's mean-pooling compressor into a paged cache (stride S, window W) and
    read by phasekv's sparse reader; the answer is read off the output. Its phase dip is the
    mechanism's, not a table: a record whose key and first value token fall into one entry is
    retrieved, one that a chunk boundary splits is not (unless `shift` carries the previous token).

    Token vector h_t = [own·k(x_t) + shift·Σ_{i=1..K} k(x_{t−i}), v(x_t)] in R^{2m} (K = key_tokens):
    k(x) a random unit vector for key-word tokens (0 otherwise), v(x) one for value tokens. The query
    at the question is β·[Σ k(key tokens), 0]; the reader's output o = Σ_j softmax(q·e_j) e_j over the
    entries (each the mean of its W token vectors); the first answer token is softmax over the
    values' first tokens c of γ·(o_v · v(c)). With own = 1, shift = 0 a record is found through the
    entry holding its key, and read only if that entry holds its value: the boundary dip. With
    S = W = 1, own = 0, shift = 1 it is full attention through a previous-tokens feature (what an
    induction head gives a real model): the value token's own key-side carries the key, so nothing
    depends on boundaries (the control, flat). Deterministic; one cache, serialized by a lock."""

    def __init__(self, builder: NeedleBuilder, *, stride: int, window: int | None = None, channels: int = 128,
                 own: float = 1.0, shift: float = 0.0, beta: float = 30.0, gamma: float = 40.0, seed: int = 0):
        from .. import _phasekv as pk

        self.vocab = builder.vocabulary
        self.key_tokens, self.gap, self.value_tokens = builder.shape
        self.tail = np.asarray(self.vocab.question_tail + builder.prefix.tail, np.int64)
        self.head = np.asarray(self.vocab.question_head, np.int64)
        self.own, self.shift, self.beta, self.gamma = own, shift, beta, gamma
        self.background = math.log(1e-4)
        rng = np.random.default_rng(seed)
        size = builder.tokenizer.vocab_size
        self.m = channels // 2
        self.K = np.zeros((size, self.m), np.float32)
        self.V = np.zeros((size, self.m), np.float32)
        key_ids = sorted({int(i) for atoms in self.vocab.key_atoms.values() for i in atoms.ravel()})
        value_ids = sorted({int(i) for i in self.vocab.values.ravel()})
        for table, ids in ((self.K, key_ids), (self.V, value_ids)):
            vectors = rng.standard_normal((len(ids), self.m)).astype(np.float32)
            table[ids] = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        self.geometry = pk.Geometry(stride=stride, window=window or stride)
        stream = pk.StreamConfig(name="kv", channels=2 * self.m)
        self.cache = pk.PagedCache(pk.Policy.mean, self.geometry, [stream],
                                   pk.CacheConfig(name="served-test", page_size=64, pages=4096))
        self.reader = pk.SparseReader(self.cache, pk.ReaderConfig(name="served-test", query_heads=1, scale=1.0))
        self.lock = threading.Lock()
        self.answers = 0

    def _read(self, prompt: np.ndarray, key: np.ndarray) -> np.ndarray:
        """The value half of the reader's output at the prompt's last position."""
        h = np.zeros((len(prompt), 1, 1, 2 * self.m), np.float32)
        h[:, 0, 0, :self.m] = self.own * self.K[prompt]
        for i in range(1, self.key_tokens + 1):
            h[i:, 0, 0, :self.m] += self.shift * self.K[prompt[:-i]]
        h[:, 0, 0, self.m:] = self.V[prompt]
        query = np.zeros((1, 2 * self.m), np.float32)
        query[0, :self.m] = self.beta * self.K[key].sum(axis=0)
        with self.lock:
            seq = self.cache.create()
            try:
                self.cache.append(seq, [h])
                out = self.reader.read(self.cache, seq, len(prompt) - 1, query)
            finally:
                self.cache.free(seq)
        return out[0, self.m:]

    def _choose(self, read: np.ndarray, candidates: np.ndarray) -> dict[int, float]:
        scores = self.gamma * (self.V[candidates] @ read)
        logp = scores - scores.max()
        logp -= math.log(float(np.exp(logp).sum()))
        return {int(c): float(lp) for c, lp in zip(candidates, logp)}  # every candidate: echo scoring reads any

    def logprobs(self, ids: Sequence[int]) -> dict[int, float]:
        """Token j of the answer: among the values that begin with the j tokens given, their token
        j scored against the same read (the entries hold the value's later tokens too)."""
        ids = np.asarray(ids, np.int64)
        kt, L = self.key_tokens, len(self.tail)
        for j in range(self.value_tokens):
            end = len(ids) - j
            if end - L - kt < 0 or not np.array_equal(ids[end - L:end], self.tail):
                continue
            if len(self.head) and not np.array_equal(ids[end - L - kt - len(self.head):end - L - kt], self.head):
                continue
            begun = ids[end:]
            matching = self.vocab.values[np.all(self.vocab.values[:, :j] == begun, axis=1)] if j else self.vocab.values
            if not len(matching):
                return {}
            if j == 0:
                self.answers += 1
            return self._choose(self._read(ids[:end], ids[end - L - kt:end - L]), np.unique(matching[:, j]))
        return {}


class PaddingModel:
    """After `cue` (token ids), the candidates' first tokens get probabilities that depend on the
    answer position a = len(prompt) mod S: P(correct) = `dip` at the residues in `dip_residues`,
    else `base`, plus a per-prompt offset in [-noise, noise] (a hash of the prompt); the rest goes
    to the other candidates. Elsewhere, the background."""

    def __init__(self, cue: Sequence[int], correct: int, wrong: Sequence[int], stride: int, *,
                 dip_residues: Sequence[int] = (), base: float = 0.8, dip: float = 0.4, noise: float = 0.05):
        self.noise = noise
        self.cue = np.asarray(cue, np.int64)
        self.correct, self.wrong = int(correct), [int(w) for w in wrong]
        self.stride = stride
        self.dip_residues = set(dip_residues)
        self.base, self.dip = base, dip
        self.background = math.log(1e-3)

    def logprobs(self, ids: Sequence[int]) -> dict[int, float]:
        ids = np.asarray(ids, np.int64)
        if len(ids) < len(self.cue) or not np.array_equal(ids[len(ids) - len(self.cue):], self.cue):
            return {}
        p = self.dip if (len(ids) % self.stride) in self.dip_residues else self.base
        p += self.noise * (2.0 * _hash_unit(ids, 11) - 1.0)  # per-prompt variation: the reps differ
        out = {self.correct: math.log(p)}
        for w in self.wrong:
            out[w] = math.log((1.0 - p) * 0.9 / len(self.wrong))
        return out


@dataclasses.dataclass
class Faults:
    rate_limit_every: int = 0  # every k-th request: 429 with Retry-After
    retry_after: float = 0.05
    server_error_every: int = 0  # every k-th: 503
    delay_every: int = 0  # every k-th: wait `delay` s before answering
    delay: float = 0.0
    drop_every: int = 0  # every k-th: close the connection without an answer
    first: int = 1  # faults start at this request number (earlier ones are answered)

    def action(self, n: int) -> str | None:
        if n < self.first:
            return None
        for name, every in (("drop", self.drop_every), ("rate_limit", self.rate_limit_every),
                            ("server_error", self.server_error_every), ("delay", self.delay_every)):
            if every and n % every == 0:
                return name
        return None


class _QuietServer(http.server.ThreadingHTTPServer):
    """A client that timed out and closed its end is not an error of the server."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class CompletionServer:
    def __init__(self, model: ServedModel, tokenizer: Any, *, faults: Faults | None = None, accepts_ids: bool = True,
                 logprobs: bool = True, max_requests: int = 100_000, idle_seconds: float = 120.0,
                 echo_window: int = 256, model_name: str = "phasekv-test"):
        self.model, self.tokenizer = model, tokenizer
        self.faults = faults or Faults()
        self.accepts_ids, self.logprobs_supported = accepts_ids, logprobs
        self.max_requests, self.idle_seconds = max_requests, idle_seconds
        self.echo_window = echo_window
        self.model_name = model_name
        self.requests = 0
        self.authorization: set = set()  # the Authorization headers seen (None: none sent)
        self.faults_injected: dict[str, int] = {}
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._stopped = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms delayed-ACK stall

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, body: Mapping[str, Any], headers: Mapping[str, str] = {}) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": outer.model_name, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with outer._lock:
                    outer.authorization.add(self.headers.get("Authorization"))
                    outer.requests += 1
                    n = outer.requests
                    outer._last = time.monotonic()
                if n > outer.max_requests:
                    self._send(503, {"error": {"message": "request budget of the test server spent"}})
                    outer.stop_soon()
                    return
                action = outer.faults.action(n)
                if action:
                    with outer._lock:
                        outer.faults_injected[action] = outer.faults_injected.get(action, 0) + 1
                if action == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if action == "rate_limit":
                    self._send(429, {"error": {"message": "rate limited"}},
                               {"Retry-After": f"{outer.faults.retry_after:g}"})
                    return
                if action == "server_error":
                    self._send(503, {"error": {"message": "overloaded"}})
                    return
                if action == "delay":
                    time.sleep(outer.faults.delay)
                route = self.path.rstrip("/")
                if route not in ("/v1/completions", "/completion"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    request = json.loads(raw)
                    body = outer.complete(request) if route == "/v1/completions" else outer.complete_native(request)
                except (ValueError, TypeError, KeyError) as e:
                    self._send(400, {"error": {"message": f"{type(e).__name__}: {e}", "type": "invalid_request_error"}})
                    return
                self._send(200, body)

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._watchdog = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stopped.wait(0.2):
            if time.monotonic() - self._last > self.idle_seconds:
                self.stop_soon()

    def stop_soon(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            threading.Thread(target=self._httpd.shutdown, daemon=True).start()

    def start(self) -> "CompletionServer":
        self._thread.start()
        self._watchdog.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "CompletionServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- the completion ----

    def _token_text(self, token_id: int) -> str:
        piece = getattr(self.tokenizer, "piece", None)
        if piece is not None:
            return piece(token_id).replace("\u2581", " ")
        return self.tokenizer.decode([token_id])

    def _distribution(self, ids: Sequence[int]) -> dict[int, float]:
        return self.model.logprobs(ids)

    def _logprob_of(self, dist: Mapping[int, float], token: int) -> float:
        return float(dist.get(token, self.model.background))

    def complete(self, request: Mapping[str, Any]) -> dict:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = ([self.tokenizer.bos_id] if self.tokenizer.bos_id is not None else []) + self.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            if not self.accepts_ids:
                raise ValueError("prompt: this server takes text prompts only")
            ids = list(prompt)
            for i in ids:
                if not 0 <= i < self.tokenizer.vocab_size:
                    raise ValueError(f"prompt: token id {i} outside the vocabulary")
        else:
            raise ValueError("prompt: must be a string or a list of token ids")
        if not ids:
            raise ValueError("prompt: empty")
        max_tokens = int(request.get("max_tokens", 16))
        top = request.get("logprobs")
        top = None if top is None or not self.logprobs_supported else int(top)
        echo = bool(request.get("echo", False))
        prompt_top = request.get("prompt_logprobs")
        sequence = list(ids)
        generated: list[tuple[int, float, dict]] = []
        eos = self.tokenizer.eos_id
        for _ in range(max_tokens):
            dist = self._distribution(sequence)
            if not dist:  # nothing to say: end the sequence (EOS, else token 0), as a model would
                dist = {eos if eos is not None else 0: 0.0}
            token = max(dist, key=lambda k: (dist[k], -k))
            generated.append((token, dist[token], dist))
            sequence.append(token)
            if token == eos or (eos is None and token == 0 and dist[token] == 0.0):
                break
        text = "".join(self._token_text(t) for t, _, _ in generated if t != eos)  # special tokens skipped
        logprobs = None
        if top is not None:
            tokens, values, tops = [], [], []
            if echo:
                start = max(1, len(ids) - self.echo_window)
                tokens.append(self._token_text(ids[0]))
                values.append(None)
                tops.append(None)
                for k in range(1, len(ids)):
                    if k < start:
                        lp, alt = self.model.background, {}
                    else:
                        d = self._distribution(ids[:k])
                        lp, alt = self._logprob_of(d, ids[k]), d
                    tokens.append(self._token_text(ids[k]))
                    values.append(lp)
                    tops.append(self._top(alt, top))
            for t, lp, d in generated:
                tokens.append(self._token_text(t))
                values.append(lp)
                tops.append(self._top(d, top))
            logprobs = {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                        "text_offset": [0] * len(tokens)}
        choice = {"index": 0, "text": ("".join(self._token_text(i) for i in ids) if echo else "") + text,
                  "logprobs": logprobs, "finish_reason": "length" if len(generated) == max_tokens else "stop"}
        if prompt_top is not None and self.logprobs_supported:
            entries: list = [None]
            for k in range(1, len(ids)):
                d = self._distribution(ids[:k]) if k >= len(ids) - self.echo_window else {}
                entry = {str(ids[k]): {"logprob": self._logprob_of(d, ids[k]), "rank": 1,
                                       "decoded_token": self._token_text(ids[k])}}
                for alt, lp in sorted(d.items(), key=lambda kv: -kv[1])[: int(prompt_top)]:
                    entry.setdefault(str(alt), {"logprob": lp, "rank": 1, "decoded_token": self._token_text(alt)})
                entries.append(entry)
            choice["prompt_logprobs"] = entries
        return {"id": f"cmpl-{self.requests}", "object": "text_completion", "model": self.model_name,
                "choices": [choice],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(generated),
                          "total_tokens": len(ids) + len(generated)}}

    def complete_native(self, request: Mapping[str, Any]) -> dict:
        """llama.cpp's /completion: n_predict, n_probs; completion_probabilities per generated
        token as {id, token, logprob, top_logprobs: [{id, token, logprob}]}."""
        if request.get("echo") or "max_tokens" in request or "logprobs" in request:
            raise ValueError("/completion takes n_predict and n_probs (not max_tokens, logprobs or echo)")
        n_probs = int(request.get("n_probs", 0))
        body = self.complete({"prompt": request.get("prompt"), "max_tokens": int(request.get("n_predict", 16)),
                              "logprobs": max(n_probs, 1)})
        choice = body["choices"][0]
        probs = []
        lp = choice["logprobs"] or {"tokens": [], "token_logprobs": [], "top_logprobs": []}
        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            probs.append({"token": token, "logprob": value,
                          "top_logprobs": [{"token": t, "logprob": v} for t, v in (top or {}).items()][:n_probs]})
        return {"content": choice["text"], "tokens_predicted": body["usage"]["completion_tokens"],
                "tokens_evaluated": body["usage"]["prompt_tokens"],
                "completion_probabilities": probs if n_probs and self.logprobs_supported else []}

    def _top(self, dist: Mapping[int, float], k: int) -> dict | None:
        if not k:
            return None
        best = sorted(dist.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        return {self._token_text(t): lp for t, lp in best}


def main(argv: Sequence[str] | None = None) -> int:
    """python -m phasekv.served.testserver: serve a model of known truth on 127.0.0.1 until
    interrupted (or idle), to try `phasekv measure` without a GPU."""
    import argparse

    from . import padding as _padding
    from .placement import RecordTemplate, model_prefix
    from .tokenizers import load_tokenizer

    parser = argparse.ArgumentParser(prog="python -m phasekv.served.testserver", description=main.__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="the tokenizer `measure` is given")
    parser.add_argument("--experiment", choices=("needle", "padding"), required=True)
    parser.add_argument("--stride", type=int, required=True)
    parser.add_argument("--model", choices=("cache", "cache-control", "straddle", "flat", "probe"), default="cache",
                        help="needle: retrieval through phasekv's mean-pool cache and reader at --stride "
                             "(CacheRetrievalModel), its full-attention control (S = 1, previous-token feature), "
                             "p by chunk straddle, flat p, or phasekv's needle probe (concentrated gates)")
    parser.add_argument("--key-tokens", type=int, default=1)
    parser.add_argument("--value-tokens", type=int, default=1)
    parser.add_argument("--density", type=float, default=16000 / 131072)
    parser.add_argument("--dip", type=int, nargs="*", default=[], help="padding: residues with the dip")
    parser.add_argument("--prompt", default=str(_padding.EXAMPLES / "code_8_vs_32.json"))
    parser.add_argument("--idle-seconds", type=float, default=600.0)
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer)
    if args.experiment == "needle":
        builder = NeedleBuilder(tokenizer, RecordTemplate(density=args.density), model_prefix(tokenizer))
        builder.prepare(key_tokens=args.key_tokens, value_tokens=args.value_tokens)
        length = args.key_tokens + args.value_tokens
        if args.model in ("cache", "cache-control"):
            control = args.model == "cache-control"
            model: Any = CacheRetrievalModel(builder, stride=1 if control else args.stride, own=0.0 if control else 1.0,
                                             shift=1.0 if control else 0.0)
        elif args.model == "probe":
            from .. import probe as _probe

            p = probe_p(_probe.NeedleConfig(tokens=1 << 17, records=2000, channels=64, stride=args.stride,
                                            window=args.stride, policy=_probe.NeedlePolicy.concentrated_gates,
                                            gate_offset=args.stride // 2, seed=1))
        else:
            p = straddle_p(args.stride, length=length) if args.model == "straddle" else flat_p(0.8)
        if args.model not in ("cache", "cache-control"):
            model = RetrievalModel(builder, p)
    else:
        spec = _padding.load_spec(args.prompt)
        body = tokenizer.encode(spec.body)
        right = tokenizer.encode(spec.answer)[0]
        wrong = [tokenizer.encode(c)[0] for c in spec.candidates if c != spec.answer]
        model = PaddingModel(body[-2:], right, wrong, args.stride, dip_residues=args.dip)
    server = CompletionServer(model, tokenizer, idle_seconds=args.idle_seconds)
    server.start()
    print(f"serving {args.experiment} model '{args.model}' at {server.url}", flush=True)
    try:
        while not server._stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
