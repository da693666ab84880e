"""A client for OpenAI-compatible completion servers that runs a sweep of requests and keeps
every outcome on disk as it arrives.

    client = CompletionClient(["http://127.0.0.1:8000", "http://127.0.0.1:8001"], model="m")
    summary = client.run(jobs, "outcomes.jsonl")

- **Requests** are POSTs of JSON to each endpoint's completions path (``/v1/completions`` unless
  the URL names a path), with ``model`` added and the API key from the environment variable
  ``api_key_env`` as a bearer token (none if unset). A URL ending in llama.cpp's native
  ``/completion`` gets its dialect (n_predict, n_probs; no echo).
- **Concurrency**: ``concurrency`` worker threads per endpoint (replicas), all pulling from one
  job iterator in its order, so at most that many prompts are in memory and trials that share a
  haystack prefix (the builder yields them together) are sent together.
- **Retries**: a 429, a 5xx, a timeout, a refused/reset/dropped connection or an unreadable body
  is retried up to ``retries`` times, waiting min(cap, base·2^k)·U(0.5, 1.5) (jitter), and at least
  the server's Retry-After (seconds or an HTTP date, capped at ``retry_after_cap``); retry k goes to
  endpoint (home + k) mod n, so a dead replica's trials move to the others. Any other 4xx is not
  retried: the trial errors with the server's message.
- **Resume**: every finished job appends one JSON line to ``out`` (one write of the whole line on
  an O_APPEND descriptor, then fsync) from a single lock. On start the file is read: jobs with an
  outcome line are skipped; a trailing partial line (a kill mid-write) is cut off first; jobs that
  only errored are run again (analyze counts a later outcome over an earlier error). So a killed
  run loses at most the requests in flight, and a rerun ends with the same outcome per trial as an
  uninterrupted run (for a deterministic server).
- **Progress**: a line on stderr about every ``progress_seconds`` (done/total, rate, retries, errors).
"""

from __future__ import annotations

import dataclasses
import email.utils
import fcntl
import http.client
import json
import os
import random
import socket
import sys
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable, Mapping, Sequence

from .errors import EndpointError, ServedInputError

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class RequestFailed(Exception):
    """A request that failed for good (not retryable, or retries exhausted)."""


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


@dataclasses.dataclass
class Job:
    """One request of a sweep. ``key``: the trial's identity in the outcome file (its trial_id);
    ``body()``: the request body without ``model`` (built when a worker takes the job), or a list
    of bodies sent one after another (``finish`` then gets the list of responses);
    ``finish(response, info)``: the outcome line (a dict) from the parsed JSON response and
    ``info`` (endpoint, attempts, latency_s); ``fail(reason, info)``: the error line."""

    key: Any
    body: Callable[[], dict]
    finish: Callable[[Any, dict], dict]
    fail: Callable[[str, dict], dict]


@dataclasses.dataclass
class RunSummary:
    planned: int
    skipped: int  # finished in an earlier run
    done: int  # outcome lines written now
    errors: int  # error lines written now
    retries: int
    seconds: float
    requests_per_second: float
    latency_mean_s: float


def _endpoint(url: str) -> tuple[str, str, int, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServedInputError(f"endpoint = {url!r}: must be an http:// or https:// URL with a host")
    path = parts.path.rstrip("/")
    if not path.endswith(("/completions", "/completion")):
        path = (path if path.endswith("/v1") else path + "/v1") + "/completions"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname, port, path


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def read_finished(path: str | os.PathLike) -> tuple[set, int]:
    """(keys with an outcome line, lines) of an outcome file; a trailing partial line (a run
    killed mid-write) is cut off the file first. A missing file is empty."""
    try:
        with open(path, "rb+") as f:
            data = f.read()
            end = data.rfind(b"\n") + 1
            if end != len(data):
                f.truncate(end)
                data = data[:end]
    except FileNotFoundError:
        return set(), 0
    finished, lines = set(), 0
    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ServedInputError(f"{path}:{number}: not a JSON line ({e.msg}): not an outcome file") from None
        lines += 1
        if isinstance(line, dict) and "outcome" in line:
            finished.add(line.get("trial_id"))
    return finished, lines


class _Appender:
    """Whole lines appended with one write each, fsynced, under one lock."""

    def __init__(self, path: str | os.PathLike):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:  # one writer per file: a second run on the same directory would interleave and redo trials
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise ServedInputError(f"{path}: another run is writing this outcome file (wait for it, or use "
                                   "another --out)") from None
        self._lock = threading.Lock()

    def write(self, record: Mapping[str, Any]) -> None:
        data = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
        with self._lock:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


def _llama_native(body: dict, url: str) -> dict:
    """An OpenAI completions body in llama.cpp's native /completion dialect: n_predict for
    max_tokens, n_probs for logprobs; it has no echo and no prompt logprobs (RequestFailed)."""
    if body.get("echo") or body.get("prompt_logprobs") is not None:
        raise RequestFailed(f"{url}: llama.cpp's /completion returns no prompt logprobs (echo, prompt_logprobs); "
                            "use scoring 'top'")
    out = {k: v for k, v in body.items() if k not in ("max_tokens", "logprobs", "echo", "model")}
    out["n_predict"] = body.get("max_tokens", 16)
    if body.get("logprobs"):
        out["n_probs"] = int(body["logprobs"])
    return out


class CompletionClient:
    def __init__(self, endpoints: Sequence[str], model: str, *, concurrency: int = 4, timeout: float = 120.0,
                 retries: int = 6, backoff: float = 0.5, backoff_cap: float = 30.0, retry_after_cap: float = 300.0,
                 api_key_env: str = "OPENAI_API_KEY", progress: bool = True, progress_seconds: float = 10.0,
                 seed: int | None = None):
        if isinstance(endpoints, str) or not endpoints:
            raise ServedInputError(f"endpoints = {endpoints!r}: give a list of at least one URL")
        self.endpoints = [_endpoint(e) for e in endpoints]
        self.urls = list(endpoints)
        for name, value, low in (("concurrency", concurrency, 1), ("retries", retries, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ServedInputError(f"{name} = {value!r}: must be an integer >= {low}")
        for name, value in (("timeout", timeout), ("backoff", backoff), ("backoff_cap", backoff_cap)):
            if not (isinstance(value, (int, float)) and value > 0):
                raise ServedInputError(f"{name} = {value!r}: must be a positive number of seconds")
        self.model = model
        self.concurrency = concurrency
        self.timeout = float(timeout)
        self.retries = retries
        self.backoff = float(backoff)
        self.backoff_cap = float(backoff_cap)
        self.retry_after_cap = float(retry_after_cap)
        self.api_key = os.environ.get(api_key_env) if api_key_env else None
        self.progress = progress
        self.progress_seconds = progress_seconds
        self._random = random.Random(seed)
        self._local = threading.local()
        self._stats_lock = threading.Lock()
        self._stats: dict = {"retries": 0}

    # ---- one request ----

    def _connection(self, index: int) -> http.client.HTTPConnection:
        pool = getattr(self._local, "connections", None)
        if pool is None:
            pool = self._local.connections = {}
        conn = pool.get(index)
        if conn is None:
            scheme, host, port, _ = self.endpoints[index]
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = pool[index] = cls(host, port, timeout=self.timeout)
        return conn

    def _drop(self, index: int) -> None:
        conn = getattr(self._local, "connections", {}).pop(index, None)
        if conn is not None:
            conn.close()

    def post_once(self, index: int, body: Mapping[str, Any]) -> Any:
        """One POST to endpoint `index`: the parsed JSON, or _Retryable / RequestFailed."""
        payload = dict(body)
        payload.setdefault("model", self.model)
        if self.endpoints[index][3].endswith("/completion"):
            payload = _llama_native(payload, self.urls[index])
        data = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        path = self.endpoints[index][3]
        try:
            conn = self._connection(index)
            conn.request("POST", path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
            status = response.status
            retry_after = _retry_after(response.getheader("Retry-After"))
            if response.getheader("Connection", "").lower() == "close":
                self._drop(index)
        except (socket.timeout, TimeoutError) as e:
            self._drop(index)
            raise _Retryable(f"timed out after {self.timeout:g} s ({e})") from None
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            self._drop(index)
            raise _Retryable(f"connection failed: {type(e).__name__}: {e}") from None
        if status in RETRYABLE_STATUS:
            raise _Retryable(f"HTTP {status}: {raw[:200].decode(errors='replace')}", retry_after)
        if status != 200:
            raise RequestFailed(f"HTTP {status} from {self.urls[index]}: {raw[:500].decode(errors='replace')}")
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise _Retryable(f"HTTP 200 with a body that is not JSON ({raw[:80]!r})") from None

    def request(self, body: Mapping[str, Any], home: int = 0) -> tuple[Any, dict]:
        """(parsed response, info) with retries; RequestFailed when it fails for good."""
        started = time.monotonic()
        last = ""
        for attempt in range(self.retries + 1):
            index = (home + attempt) % len(self.endpoints)
            try:
                response = self.post_once(index, body)
                return response, {"endpoint": self.urls[index], "attempts": attempt + 1,
                                  "latency_s": round(time.monotonic() - started, 6)}
            except _Retryable as e:
                last = f"{self.urls[index]}: {e}"
                with self._stats_lock:
                    self._stats["retries"] += 1 if attempt < self.retries else 0
                if attempt == self.retries:
                    break
                wait = min(self.backoff_cap, self.backoff * 2 ** attempt) * (0.5 + self._random.random())
                if e.retry_after is not None:
                    wait = max(wait, min(e.retry_after, self.retry_after_cap))
                time.sleep(wait)
        raise RequestFailed(f"gave up after {self.retries + 1} attempts; last: {last}")

    def check(self, body: Mapping[str, Any], needs: Callable[[Any], str | None] | None = None) -> Any:
        """A preflight request to every endpoint (no retries beyond 2): EndpointError naming the
        endpoint if one is unreachable, refuses the request, or (``needs(response)`` returns a
        reason) lacks what the measurement needs, e.g. logprobs."""
        self._stats = {"retries": 0}
        saved = self.retries
        self.retries = min(self.retries, 2)
        try:
            last = None
            for index, url in enumerate(self.urls):
                try:
                    response, _ = self.request(body, home=index) if len(self.urls) == 1 else self._only(index, body)
                except RequestFailed as e:
                    raise EndpointError(f"endpoint {url}: {e}") from None
                reason = needs(response) if needs else None
                if reason:
                    raise EndpointError(f"endpoint {url}: {reason}")
                last = response
            return last
        finally:
            self.retries = saved

    def _only(self, index: int, body: Mapping[str, Any]) -> tuple[Any, dict]:
        last = ""
        for attempt in range(self.retries + 1):
            try:
                return self.post_once(index, body), {}
            except _Retryable as e:
                last = str(e)
                time.sleep(min(self.backoff_cap, self.backoff * 2 ** attempt))
        raise RequestFailed(f"gave up after {self.retries + 1} attempts; last: {last}")

    def _request_all(self, body: Any, home: int) -> tuple[Any, dict]:
        """One body, or a list of bodies (a trial that needs several requests, e.g. one per
        candidate): their responses (a list for a list) and the summed attempts and latency."""
        if isinstance(body, Mapping):
            return self.request(body, home)
        responses, info = [], {"endpoint": None, "attempts": 0, "latency_s": 0.0}
        for one in body:
            response, part = self.request(one, home)
            responses.append(response)
            info = {"endpoint": part["endpoint"], "attempts": info["attempts"] + part["attempts"],
                    "latency_s": round(info["latency_s"] + part["latency_s"], 6)}
        return responses, info

    # ---- a sweep ----

    def run(self, jobs: Iterable[Job], out: str | os.PathLike, *, total: int | None = None) -> RunSummary:
        """Runs every job not already finished in `out` and appends its line there."""
        appender = _Appender(out)  # locks the file first: the finished set cannot change under us
        try:
            finished, _ = read_finished(out)
        except BaseException:
            appender.close()
            raise
        self._stats = {"retries": 0, "done": 0, "errors": 0, "skipped": 0, "latency": 0.0}
        source = iter(jobs)
        source_lock = threading.Lock()
        stop = threading.Event()
        failure: list[BaseException] = []
        started = time.monotonic()
        last_report = [started]

        def next_job() -> Job | None:
            with source_lock:
                for job in source:
                    if job.key in finished:
                        self._stats["skipped"] += 1
                        continue
                    return job
                return None

        def report(final: bool = False) -> None:
            if not self.progress:
                return
            now = time.monotonic()
            if not final and now - last_report[0] < self.progress_seconds:
                return
            last_report[0] = now
            s = self._stats
            done = s["done"] + s["errors"]
            rate = done / max(now - started, 1e-9)
            of = f"/{total - s['skipped']}" if total is not None else ""
            print(f"phasekv measure: {done}{of} requests ({s['skipped']} already done), {rate:.1f}/s, "
                  f"{s['retries']} retries, {s['errors']} errors", file=sys.stderr, flush=True)

        def worker(home: int) -> None:
            try:
                while not stop.is_set():
                    job = next_job()
                    if job is None:
                        return
                    try:
                        body = job.body()
                    except Exception as e:  # a prompt that cannot be built: that trial's error
                        record = job.fail(f"{type(e).__name__}: {e}", {"endpoint": None, "attempts": 0})
                    else:
                        try:
                            response, info = self._request_all(body, home)
                            try:
                                record = job.finish(response, info)
                            except Exception as e:  # a response the measurement cannot use
                                record = job.fail(f"{type(e).__name__}: {e}", info)
                        except RequestFailed as e:
                            record = job.fail(str(e), {"endpoint": self.urls[home], "attempts": self.retries + 1})
                    appender.write(record)
                    with self._stats_lock:
                        if "outcome" in record:
                            self._stats["done"] += 1
                            self._stats["latency"] += float(record.get("latency_s") or 0.0)
                        else:
                            self._stats["errors"] += 1
                    report()
            except BaseException as e:  # noqa: BLE001 (handed to the caller's thread)
                failure.append(e)
                stop.set()

        threads = [threading.Thread(target=worker, args=(k,), daemon=True, name=f"phasekv-served-{k}")
                   for k in range(len(self.endpoints)) for _ in range(self.concurrency)]
        try:
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(0.2)
        except KeyboardInterrupt:
            # Finished lines are on disk; requests in flight are abandoned (their trials run again
            # on resume). Workers are daemons: they take no new job and die with the process.
            stop.set()
            raise
        finally:
            appender.close()
        if failure:
            raise failure[0]
        report(final=True)
        seconds = time.monotonic() - started
        s = self._stats
        return RunSummary(planned=(total if total is not None else s["done"] + s["errors"] + s["skipped"]),
                          skipped=s["skipped"], done=s["done"], errors=s["errors"], retries=s["retries"],
                          seconds=seconds, requests_per_second=(s["done"] + s["errors"]) / max(seconds, 1e-9),
                          latency_mean_s=s["latency"] / max(s["done"], 1))
