"""End to end over real HTTP with trained lab models: a gated S = 8 model and its full-attention
control (lab/models/, trained by lab/train.py: lab/models/README.md) run through phasekv's
compressors, paged caches and sparse reader (`lab_host serve`) behind the OpenAI completions API
on 127.0.0.1, measured by phasekv.served's client with the needle and the padding experiment, and
held to the lab's own sweep of the same model (`lab_host measure`).

Needs build/lab/lab_host (or $LAB_HOST): the lab stage of scripts/test builds it and runs this
file (lab/run --tiny); without it every test here is skipped."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOST = pathlib.Path(os.environ.get("LAB_HOST") or ROOT / "build" / "lab" / "lab_host")
MODELS = ROOT / "lab" / "models"
GATED = MODELS / "gated_S8_W8_T128_seed1"
CONTROL = MODELS / "full_control_T128_seed1"
TRIALS = 32  # per residue, 16 residues: 512 trials per model (Wilson half-width <= 17 points)
SEED = 1

pytestmark = pytest.mark.skipif(not os.access(HOST, os.X_OK),
                                reason=f"{HOST} is not built (the lab stage, lab/run --tiny, builds it and runs this file)")

sys.path.insert(0, str(ROOT / "lab"))
import served as lab_served  # noqa: E402
from phasekv.served.testserver import Faults  # noqa: E402


def options(command, model, out, *extra):
    return lab_served.parse([command, "--model", str(model), "--host", str(HOST), "--out", str(out),
                             "--trials", str(TRIALS), "--seed", str(SEED), "--quiet"] + list(extra))


def lab_measure(model, out):
    subprocess.run([str(HOST), "measure", "--model", str(model), "--out", str(out), "--trials", str(TRIALS),
                    "--seed", str(SEED), "--isolated-trials", "0", "--knockout-trials", "0", "--calibration", "1",
                    "--quiet"], check=True)
    return lab_served.lab_sweep_table(out, 16)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, model in (("gated", GATED), ("control", CONTROL)):
        d = tmp_path_factory.mktemp(name)
        lab = lab_measure(model, d / "lab")
        with lab_served.make_server(model, HOST) as server:
            needle = lab_served.measure_needle(options("run", model, d / "needle"), server.url)
            pad = lab_served.measure_padding(options("run", model, d / "padding"), server.url)
            server.lab_host.close()
        out[name] = {"lab": lab, "needle": needle, "padding": pad, "dir": d}
    return out


def http_trials(path):
    lines = [json.loads(x) for x in open(path)]
    return lines, sorted((x["target"], x["query"], x["outcome"]) for x in lines if "outcome" in x)


def test_the_gated_models_dip_over_http_is_the_labs_own(runs):
    r = runs["gated"]
    lab, http = r["lab"], r["needle"]
    assert http["errored"] == 0 and http["missing"] == 0
    # Trial for trial the answers over HTTP are the lab sweep's (same placements, same forward).
    _, got = http_trials(r["dir"] / "needle" / "outcomes.jsonl")
    assert got == sorted((t, q, s) for (t, q, _), s in lab["per_trial"].items())
    assert http["worst"] == lab["worst"]
    # The dip: the key on the last slot of a block (7 mod 8), its value in the next block.
    assert http["worst"] % 8 == 7
    worst = http["residues"][http["worst"]]
    others = [x for x in http["residues"] if x["residue"] % 8 != 7]
    assert worst["high"] < min(x["low"] for x in others)
    assert http["p"] < 1e-6


def test_fresh_trials_over_http_find_the_same_dip_and_a_flat_control(runs, tmp_path):
    # Trials the lab's sweep did not run (seed 2): the dip is the model's, not the sample's.
    tables = {}
    for name, model in (("gated", GATED), ("control", CONTROL)):
        with lab_served.make_server(model, HOST) as server:
            a = lab_served.parse(["run", "--model", str(model), "--host", str(HOST), "--out", str(tmp_path / name),
                                  "--trials", str(TRIALS), "--seed", "2", "--quiet"])
            tables[name] = lab_served.measure_needle(a, server.url)
            server.lab_host.close()
    g, c = tables["gated"], tables["control"]
    assert g["worst"] % 8 == runs["gated"]["lab"]["worst"] % 8
    dips = [x for x in g["residues"] if x["residue"] % 8 == 7]
    others = [x for x in g["residues"] if x["residue"] % 8 != 7]
    assert max(x["high"] for x in dips) < min(x["low"] for x in others)
    assert not c["p"] < 0.01
    assert max(x["low"] for x in c["residues"]) < min(x["high"] for x in c["residues"])


def test_the_full_attention_control_is_flat_over_http(runs):
    r = runs["control"]
    http = r["needle"]
    assert http["errored"] == 0 and http["missing"] == 0
    _, got = http_trials(r["dir"] / "needle" / "outcomes.jsonl")
    assert got == sorted((t, q, s) for (t, q, _), s in r["lab"]["per_trial"].items())
    assert not http["p"] < 0.01  # NaN when every trial succeeds: nothing varies
    # Flat within the intervals: every residue's Wilson interval overlaps every other's, and the
    # gated model's dip residue holds the control's mean.
    rows = http["residues"]
    assert max(x["low"] for x in rows) < min(x["high"] for x in rows)
    dip = rows[runs["gated"]["needle"]["worst"]]
    assert dip["low"] <= http["mean"] <= dip["high"]


def test_the_padding_experiment_finds_the_same_dip_and_the_control_none(runs):
    g, c = runs["gated"]["padding"], runs["control"]["padding"]
    assert g["worst_key_residue"] == runs["gated"]["lab"]["worst"] % 8
    assert g["anova_p"] < 1e-3
    means_g = [x["mean"] for x in g["by_key_residue"]]
    means_c = [x["mean"] for x in c["by_key_residue"]]
    assert max(means_c) - min(means_c) < 0.25 * (max(means_g) - min(means_g))
    assert not c["anova_p"] < 0.01


def test_faults_and_a_killed_run_end_with_the_clean_runs_outcomes(runs, tmp_path):
    clean, _ = http_trials(runs["gated"]["dir"] / "needle" / "outcomes.jsonl")
    want = {x["trial_id"]: (x["outcome"], x["answer_text"]) for x in clean}
    faults = Faults(rate_limit_every=7, retry_after=0.01, server_error_every=11, delay_every=29, delay=1.5,
                    drop_every=17)
    out = tmp_path / "faulty"
    with lab_served.make_server(GATED, HOST, faults=faults) as server:
        args = [sys.executable, str(ROOT / "lab" / "served.py"), "measure", "--endpoint", server.url,
                "--experiment", "needle", "--model", str(GATED), "--host", str(HOST), "--out", str(out),
                "--trials", str(TRIALS), "--seed", str(SEED), "--concurrency", "4", "--timeout", "0.5",
                "--backoff", "0.01", "--retries", "8", "--quiet"]
        child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        outcomes = out / "outcomes.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if outcomes.exists() and outcomes.read_bytes().count(b"\n") >= 120:
                break
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL
        before = outcomes.read_bytes().count(b"\n")
        assert 120 <= before < len(want)
        assert lab_served.main(args[2:]) == 0
        injected = dict(server.faults_injected)
        server.lab_host.close()
    for kind in ("rate_limit", "server_error", "delay", "drop"):
        assert injected.get(kind, 0) > 0, kind
    lines = [json.loads(x) for x in open(outcomes)]
    assert len(lines) == len(want)  # nothing finished was asked again, nothing errored
    assert {x["trial_id"]: (x["outcome"], x["answer_text"]) for x in lines} == want


def test_served_logprobs_equal_torch(tmp_path):
    pytest.importorskip("torch")
    with lab_served.make_server(GATED, HOST) as server:
        parity = lab_served.served_parity(GATED, server.url, prompts=8)
        server.lab_host.close()
    assert parity["relative_diff"] <= 1e-4, parity


def test_the_padding_experiment_through_faults_gives_the_clean_runs_outcomes(runs, tmp_path):
    faults = Faults(rate_limit_every=5, retry_after=0.01, server_error_every=7, drop_every=9)
    with lab_served.make_server(GATED, HOST, faults=faults) as server:
        a = options("run", GATED, tmp_path / "padding", "--concurrency", "4", "--backoff", "0.01", "--retries", "8")
        lab_served.measure_padding(a, server.url)
        injected = dict(server.faults_injected)
        server.lab_host.close()
    assert all(injected.get(k, 0) > 0 for k in ("rate_limit", "server_error", "drop")), injected
    clean_dir = runs["gated"]["dir"] / "padding"
    for path in sorted(clean_dir.glob("padding*.jsonl")):
        clean = {x["trial_id"]: x["outcome"] for x in map(json.loads, open(path))}
        faulty = [json.loads(x) for x in open(tmp_path / "padding" / path.name)]
        assert len(faulty) == len(clean) and {x["trial_id"]: x["outcome"] for x in faulty} == clean
