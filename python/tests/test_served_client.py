"""phasekv.served's client and response parsing, end to end over real HTTP on 127.0.0.1: a needle
sweep against a model whose per-residue truth is known, through concurrency, 429s, timeouts,
dropped connections, replicas, and a killed run resumed to exactly the uninterrupted outcomes."""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("sentencepiece")

import phasekv as pk  # noqa: E402
from phasekv import served, sweep  # noqa: E402
from phasekv.served.testserver import (CacheRetrievalModel, CompletionServer, Faults, RetrievalModel,  # noqa: E402
                                      _hash_unit, flat_p, straddle_p)

import served_models  # noqa: E402

STRIDE = 4


@pytest.fixture(scope="module")
def tok():
    return served_models.tokenizer("bpe", True)


def needle_plan(seed=1, trials=12, query=900):
    config = pk.SweepConfig(stride=STRIDE, trials_per_residue=trials, query_position=query, span=700,
                            min_distance=64, seed=seed, record=pk.RecordShape(key_tokens=2, value_tokens=2))
    return sweep.plan(config, configuration={"test": "served"})


def outcomes_of(path):
    lines = [json.loads(x) for x in open(path, encoding="utf-8") if x.strip()]
    return {r["trial_id"]: r["outcome"] for r in lines if "outcome" in r}, lines


# ---- response formats ---------------------------------------------------------------------------


def test_openai_legacy_and_echo():
    body = {"choices": [{"text": " 42", "logprobs": {"tokens": [" 4", "2"], "token_logprobs": [-0.1, -0.2],
                                                     "top_logprobs": [{" 4": -0.1, " 7": -2.5}, {"2": -0.2}]}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2}}
    c = served.parse_completion(body)
    assert c.text == " 42" and [t.logprob for t in c.generated] == [-0.1, -0.2] and c.generated[0].top[" 7"] == -2.5
    assert c.prompt is None and c.prompt_tokens == 9 and c.has_logprobs
    echoed = {"choices": [{"text": "a b c", "logprobs": {"tokens": ["a", " b", " c"], "token_logprobs": [None, -1.0, -3.0],
                                                         "top_logprobs": [None, {" b": -1.0}, {" c": -3.0}]}}],
              "usage": {"prompt_tokens": 2, "completion_tokens": 1}}
    c = served.parse_completion(echoed, echo=True)
    assert [t.logprob for t in c.prompt] == [None, -1.0] and [t.token for t in c.generated] == [" c"]


def test_vllm_prompt_logprobs():
    body = {"choices": [{"text": "x", "logprobs": None,
                         "prompt_logprobs": [None, {"17": {"logprob": -1.5, "rank": 3, "decoded_token": " b"},
                                                    "5": {"logprob": -0.2, "rank": 1, "decoded_token": " a"}}]}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1}}
    c = served.parse_completion(body, prompt_ids=[1, 17])
    assert c.prompt[1].logprob == -1.5 and c.prompt[1].token == " b" and c.prompt[1].top[" a"] == -0.2


def test_llama_cpp_formats():
    current = {"content": " 8", "tokens_evaluated": 12, "tokens_predicted": 1,
               "completion_probabilities": [{"id": 23, "token": " 8", "logprob": -0.3, "bytes": [32, 56],
                                             "top_logprobs": [{"id": 23, "token": " 8", "logprob": -0.3},
                                                              {"id": 99, "token": " 32", "logprob": -1.4}]}]}
    c = served.parse_completion(current)
    assert c.generated[0].logprob == -0.3 and c.generated[0].top[" 32"] == -1.4
    assert c.prompt_tokens is None  # tokens_evaluated may leave out a reused cached prefix
    older = {"content": " 8", "completion_probabilities": [{"content": " 8", "probs": [{"tok_str": " 8", "prob": 0.5},
                                                                                      {"tok_str": " 32", "prob": 0.25}]}]}
    c = served.parse_completion(older)
    assert math.isclose(c.generated[0].logprob, math.log(0.5)) and math.isclose(c.generated[0].top[" 32"], math.log(0.25))
    openai_style = {"choices": [{"text": " 8", "logprobs": {"content": [
        {"token": " 8", "logprob": -0.1, "top_logprobs": [{"token": " 8", "logprob": -0.1}, {"token": " 32", "logprob": -2.0}]}]}}]}
    c = served.parse_completion(openai_style)
    assert c.generated[0].top[" 32"] == -2.0 and c.format == "logprobs.content"


def test_unreadable_responses_are_errors_naming_the_field():
    with pytest.raises(ValueError, match="choices"):
        served.parse_completion({"object": "error"})
    with pytest.raises(ValueError, match="token_logprobs"):
        served.parse_completion({"choices": [{"text": "", "logprobs": {"tokens": ["a"], "token_logprobs": ["x"]}}]})
    no_logprobs = served.parse_completion({"choices": [{"text": "a", "logprobs": None}]})
    assert not no_logprobs.has_logprobs


# ---- the client over HTTP ------------------------------------------------------------------------


def run_sweep(tok, plan, path, faults=None, *, concurrency=4, timeout=5.0, endpoints=1, p=None, model=None):
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.03), stride=STRIDE)
    builder.check_plan(plan.trials)
    model = model or RetrievalModel(builder, p or straddle_p(STRIDE, length=4))
    servers = [CompletionServer(model, tok, faults=faults if k == 0 else None).start() for k in range(endpoints)]
    try:
        client = served.CompletionClient([s.url for s in servers], "phasekv-test", concurrency=concurrency,
                                         timeout=timeout, backoff=0.02, backoff_cap=0.5, retries=8, progress=False,
                                         seed=1)
        summary = client.run(served.needle_jobs(plan.trials, builder), path, total=len(plan.trials))
    finally:
        for s in servers:
            s.stop()
    return summary, servers, model


def test_a_needle_sweep_recovers_the_known_dip_through_faults(tok, tmp_path):
    plan = needle_plan()
    clean, _, model = run_sweep(tok, plan, tmp_path / "clean.jsonl")
    assert clean.done == len(plan.trials) and clean.errors == 0 and model.not_found == 0
    # A delayed answer comes after 2.5 s, the client gives up after 1 s: a timeout. (On a loaded
    # machine an ordinary answer may time out too: it is retried like any other.)
    faults = Faults(rate_limit_every=5, retry_after=0.01, delay_every=17, delay=2.5, drop_every=13, server_error_every=19)
    faulty, servers, _ = run_sweep(tok, plan, tmp_path / "faulty.jsonl", faults, timeout=1.0)
    injected = servers[0].faults_injected
    assert all(injected.get(k, 0) > 0 for k in ("rate_limit", "delay", "drop", "server_error")), injected
    assert faulty.done == len(plan.trials) and faulty.errors == 0 and faulty.retries >= sum(injected.values())
    a, lines = outcomes_of(tmp_path / "faulty.jsonl")
    b, _ = outcomes_of(tmp_path / "clean.jsonl")
    assert a == b  # the faults change nothing measured
    for line in lines:  # every line keeps what the issue asks for
        assert {"prompt_sha256", "answer_text", "expected", "candidates", "latency_s", "prompt_tokens",
                "completion_tokens"} <= set(line)
        assert line["prompt_tokens"] == line["question"][1]  # the server saw q + 1 tokens
    # The truth, trial by trial: the model answers right iff hash(prompt) / 2^64 < p(record start),
    # p = 0.9 when the 4-token record fits one chunk of S = 4 (it starts at a multiple of 4), else
    # 0.2. The model finds the record where the prompt holds it, so a misplaced needle would show.
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.03), stride=STRIDE)
    p = straddle_p(STRIDE, length=4)
    expected = {}
    for prompt in builder.prompts(plan.trials):
        t = prompt.needle[0]
        expected[prompt.trial_id] = _hash_unit(prompt.ids, 0) < p(t, len(prompt.ids) - 1)
    assert a == expected
    # ... and by residue: the dip where records straddle (residues 1, 2, 3 mod 4), the peak at 0.
    r = sweep.analyze(plan, [tmp_path / "faulty.jsonl"]).result
    by_residue = {x.residue: x for x in r.residues}
    contained = [x for k, x in by_residue.items() if k % STRIDE == 0]
    straddling = [x for k, x in by_residue.items() if k % STRIDE]
    rate = lambda xs: sum(x.successes for x in xs) / sum(x.valid for x in xs)  # noqa: E731
    assert abs(rate(contained) - 0.9) < 0.15 and abs(rate(straddling) - 0.2) < 0.12
    assert r.homogeneity.p_value < 1e-4 and r.worst_residue % STRIDE != 0


def test_a_flat_model_measures_flat(tok, tmp_path):
    plan = needle_plan(seed=2, trials=24)
    summary, _, _ = run_sweep(tok, plan, tmp_path / "flat.jsonl", p=flat_p(0.7))
    r = sweep.analyze(plan, [tmp_path / "flat.jsonl"]).result
    assert summary.done == len(plan.trials)
    assert r.homogeneity.p_value > 0.001
    outcomes, _ = outcomes_of(tmp_path / "flat.jsonl")
    assert abs(np.mean(list(outcomes.values())) - 0.7) < 0.12  # 192 trials: 3.6 standard errors


def test_replicas_share_the_work_and_a_dead_one_is_routed_around(tok, tmp_path):
    plan = needle_plan(seed=3, trials=10)
    summary, servers, _ = run_sweep(tok, plan, tmp_path / "two.jsonl", Faults(drop_every=2), endpoints=2)
    assert summary.done == len(plan.trials)
    _, lines = outcomes_of(tmp_path / "two.jsonl")
    assert {line["endpoint"] for line in lines} == {s.url for s in servers}
    assert servers[0].faults_injected["drop"] > 0


def test_a_request_the_server_refuses_is_an_errored_trial_not_retried(tok, tmp_path):
    plan = needle_plan(seed=4, trials=10)
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.03))
    builder.check_plan(plan.trials)
    model = RetrievalModel(builder, flat_p())
    with CompletionServer(model, tok, accepts_ids=False) as server:
        client = served.CompletionClient([server.url], "m", progress=False, backoff=0.01)
        summary = client.run(served.needle_jobs(plan.trials[:5], builder, send="ids"), tmp_path / "o.jsonl")
        assert summary.errors == 5 and summary.done == 0 and server.requests == 5  # 400: no retries
        _, lines = outcomes_of(tmp_path / "o.jsonl")
        assert all("HTTP 400" in line["error"] and "text prompts only" in line["error"] for line in lines)
        # The same server takes text, checked by re-encoding: every trial answers.
        summary = client.run(served.needle_jobs(plan.trials[:5], builder, send="text"), tmp_path / "o.jsonl")
        assert summary.done == 5
    # analyze counts the later outcomes over the earlier errors
    outcomes, _ = outcomes_of(tmp_path / "o.jsonl")
    assert set(outcomes) == {t["trial_id"] for t in plan.trials[:5]}


def test_an_unreachable_endpoint_fails_before_the_sweep(tok):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    builder = served.NeedleBuilder(tok)
    plan = needle_plan(seed=5, trials=10)
    builder.check_plan(plan.trials)
    client = served.CompletionClient([f"http://127.0.0.1:{port}"], "m", progress=False, backoff=0.01, retries=1)
    with pytest.raises(served.EndpointError, match=f"127.0.0.1:{port}.*connection"):
        served.preflight_needle(client, builder, plan.trials[0], send="ids", logprobs=5)


def test_a_partial_last_line_is_cut_and_foreign_files_refused(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_text('{"trial_id": 1, "outcome": true}\n{"trial_id": 2, "outc', encoding="utf-8")
    finished, lines = served.read_finished(path)
    assert finished == {1} and lines == 1
    assert path.read_text(encoding="utf-8") == '{"trial_id": 1, "outcome": true}\n'
    (tmp_path / "bad.jsonl").write_text("not json\n", encoding="utf-8")
    with pytest.raises(served.ServedInputError, match="bad.jsonl:1"):
        served.read_finished(tmp_path / "bad.jsonl")


def test_a_killed_run_resumes_to_exactly_the_uninterrupted_outcomes(tok, tmp_path):
    model_file = tmp_path / "sp.model"
    model_file.write_bytes(served_models.model_proto("bpe", True))
    spm_tok = served.SentencePieceTokenizer(model_file)
    args = ["--model", "m", "--tokenizer", str(model_file), "--stride", str(STRIDE), "--experiment", "needle",
            "--trials", "12", "--query-position", "900", "--span", "700", "--min-distance", "64", "--seed", "7",
            "--key-tokens", "2", "--value-tokens", "2", "--density", "0.03", "--concurrency", "2", "--quiet",
            "--backoff", "0.02"]
    plan_dir = tmp_path / "uninterrupted"
    # The server's model reads the prompts the CLI builds (same template): plan once to make it.
    from phasekv.__main__ import main

    builder = served.NeedleBuilder(spm_tok, served.RecordTemplate(density=0.03))
    config = pk.SweepConfig(stride=STRIDE, trials_per_residue=12, query_position=900, span=700, min_distance=64, seed=7,
                            record=pk.RecordShape(key_tokens=2, value_tokens=2))
    builder.check_plan(sweep.plan(config).trials)
    model = RetrievalModel(builder, straddle_p(STRIDE, length=4))
    with CompletionServer(model, spm_tok, faults=Faults(delay_every=1, delay=0.02)) as server:
        assert main(["measure", "--endpoint", server.url, "--out", str(plan_dir)] + args) == 0
        killed_dir = tmp_path / "killed"
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        child = subprocess.Popen([sys.executable, "-m", "phasekv", "measure", "--endpoint", server.url,
                                  "--out", str(killed_dir)] + args, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        outcomes = killed_dir / "outcomes.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if outcomes.exists() and outcomes.read_bytes().count(b"\n") >= 20:
                break
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL
        done_before = outcomes.read_bytes().count(b"\n")
        assert 20 <= done_before < 96
        assert main(["measure", "--endpoint", server.url, "--out", str(killed_dir)] + args) == 0
    a, lines_a = outcomes_of(plan_dir / "outcomes.jsonl")
    b, lines_b = outcomes_of(killed_dir / "outcomes.jsonl")
    assert a == b and len(a) == 96
    assert len(lines_b) == 96  # nothing finished was asked again
    assert (plan_dir / "sweep.txt").read_text().split("outcomes:")[0] == (killed_dir / "sweep.txt").read_text().split("outcomes:")[0]


def test_trials_of_a_haystack_go_together_and_the_api_key_is_sent(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEKV_TEST_KEY", "sk-test-123")
    plan = needle_plan(seed=6, trials=10)
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.03))
    builder.check_plan(plan.trials)
    with CompletionServer(RetrievalModel(builder, flat_p()), tok) as server:
        client = served.CompletionClient([server.url], "m", concurrency=1, progress=False, api_key_env="PHASEKV_TEST_KEY")
        client.run(served.needle_jobs(plan.trials, builder), tmp_path / "o.jsonl")
        assert server.authorization == {"Bearer sk-test-123"}
    haystack = {t["trial_id"]: t["haystack"] for t in plan.trials}
    order = [haystack[line["trial_id"]] for line in outcomes_of(tmp_path / "o.jsonl")[1]]
    assert order == sorted(order) and len(set(order)) > 1  # one haystack after another: its prefix is reused


def test_a_model_read_through_phasekv_cache_shows_its_boundary_dip_and_its_control_none(tok, tmp_path):
    """CacheRetrievalModel runs the prompt through phasekv's mean-pool compressor, paged cache and
    sparse reader (S = W = 8). A 2 + 2 token record is answered only when its key and first value
    token share an entry: a record starting at 6 mod 8 never is. The full-attention control
    (S = 1 with a previous-token feature) has no boundaries and no dip."""
    config = pk.SweepConfig(stride=8, trials_per_residue=16, query_position=1500, span=1200, min_distance=64, seed=1,
                            record=pk.RecordShape(key_tokens=2, value_tokens=2))
    plan = sweep.plan(config)
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.03))
    builder.check_plan(plan.trials)
    results = {}
    for name, options in (("S=8", dict(stride=8)), ("control", dict(stride=1, own=0.0, shift=1.0))):
        model = CacheRetrievalModel(builder, **options)
        with CompletionServer(model, tok, faults=Faults(rate_limit_every=11, retry_after=0.01)) as server:
            client = served.CompletionClient([server.url], "m", concurrency=4, progress=False, backoff=0.01)
            client.run(served.needle_jobs(plan.trials, builder), tmp_path / f"{name}.jsonl")
        outcomes, _ = outcomes_of(tmp_path / f"{name}.jsonl")
        # Trial by trial: the client's outcome is the model's own answer to the prompt planned.
        for prompt in builder.prompts(plan.trials):
            ids = list(prompt.ids)
            for _ in range(2):  # the model's greedy answer, as the server decodes it
                dist = model.logprobs(ids)
                ids.append(max(dist, key=lambda k: (dist[k], -k)))
            assert outcomes[prompt.trial_id] == (tuple(ids[-2:]) == prompt.answer_ids)
        results[name] = sweep.analyze(plan, [tmp_path / f"{name}.jsonl"]).result
    dip = results["S=8"]
    by_residue = {x.residue: x for x in dip.residues}
    split = [by_residue[r] for r in (6, 14)]  # the boundary falls between key and value
    whole = [by_residue[r] for r in range(16) if r % 8 <= 5]  # key and first value token in one entry
    rate = lambda xs: sum(x.successes for x in xs) / sum(x.valid for x in xs)  # noqa: E731
    assert rate(split) < 0.1 < 0.5 < rate(whole)
    assert dip.worst_residue % 8 == 6 and dip.homogeneity.p_value < 1e-4
    control = results["control"]
    assert control.homogeneity.p_value > 0.001 and control.mean > 0.6


def test_a_second_run_on_the_same_outcome_file_is_refused(tmp_path):
    from phasekv.served.client import _Appender

    held = _Appender(tmp_path / "o.jsonl")  # a run in progress
    try:
        client = served.CompletionClient(["http://127.0.0.1:9"], "m", progress=False)
        with pytest.raises(served.ServedInputError, match="another run is writing"):
            client.run(iter(()), tmp_path / "o.jsonl")
    finally:
        held.close()
    assert served.CompletionClient(["http://127.0.0.1:9"], "m", progress=False).run(iter(()), tmp_path / "o.jsonl").done == 0
