"""python -m phasekv measure and the padding experiment, end to end over loopback HTTP: the dip of
a model with a known per-residue profile comes out at its residue, a flat model measures flat,
the three scoring routes agree, and bad input fails before the sweep with exit status 2."""

import json

import numpy as np
import pytest

pytest.importorskip("sentencepiece")

import phasekv as pk  # noqa: E402
from phasekv import served, sweep  # noqa: E402
from phasekv.__main__ import main  # noqa: E402
from phasekv.served import padding as pd  # noqa: E402
from phasekv.served.testserver import (CompletionServer, Faults, PaddingModel, RetrievalModel, _hash_unit,  # noqa: E402
                                      probe_p)

import served_models  # noqa: E402

S = 8


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sp") / "bpe.model"
    path.write_bytes(served_models.model_proto("bpe", True))
    return path


@pytest.fixture(scope="module")
def tok(model_file):
    return served.SentencePieceTokenizer(model_file)


def padding_model(tok, dip_residues):
    spec = pd.load_spec(pd.EXAMPLES / "code_8_vs_32.json")
    body = tok.encode(spec.body)
    eight, thirty_two = tok.encode(" 8"), tok.encode(" 32")
    return PaddingModel(body[-2:], eight[0], [thirty_two[0]], S, dip_residues=dip_residues, base=0.8, dip=0.3)


def true_profile(tok, dip_residues):
    model = padding_model(tok, dip_residues)
    spec = pd.load_spec(pd.EXAMPLES / "code_8_vs_32.json")
    experiment = pd.PaddingExperiment(spec, tok, stride=S, periods=4, reps=3)
    by_residue, seen = {}, set()
    for trial in experiment.trials():
        if trial.ids in seen:  # the same prompt is one observation
            continue
        seen.add(trial.ids)
        d = model.logprobs(list(trial.ids))
        p, q = np.exp(d[model.correct]), np.exp(d[model.wrong[0]])
        by_residue.setdefault(trial.residue, []).append(p / (p + q))
    return [float(np.mean(by_residue[r])) for r in range(S)]


def measure_padding(model_file, url, out, *extra):
    return main(["measure", "--endpoint", url, "--model", "m", "--tokenizer", str(model_file), "--stride", str(S),
                 "--experiment", "padding", "--out", str(out), "--periods", "4", "--reps", "3", "--quiet",
                 "--backoff", "0.02"] + list(extra))


def test_the_padding_experiment_finds_the_dip_at_its_residue(tok, model_file, tmp_path, capsys):
    with CompletionServer(padding_model(tok, dip_residues=[5]), tok, faults=Faults(rate_limit_every=9, retry_after=0.01)) as server:
        assert measure_padding(model_file, server.url, tmp_path / "score") == 0
    report = (tmp_path / "score" / "padding.txt").read_text()
    data = json.loads((tmp_path / "score" / "padding.json").read_text())
    worst = min(data["residues"], key=lambda r: r["mean"])
    assert worst["residue"] == 5
    # The truth: the model's own P(" 8" | " 8" or " 32") for every planned prompt, by residue.
    truth = true_profile(tok, dip_residues=[5])
    assert np.allclose([r["mean"] for r in data["residues"]], truth)
    assert sum(r["n"] for r in data["residues"]) + data["repeated"] == 96 and data["repeated"] > 0
    for r in data["residues"]:
        assert r["n"] >= 10 and r["low"] <= r["mean"] <= r["high"]
    assert data["anova_p"] < 1e-6 and data["fold_p"] < 0.01 and data["period"] == S
    assert "worst" in report and (tmp_path / "score" / "padding.svg").read_text().startswith("<svg")
    lines = [json.loads(x) for x in open(tmp_path / "score" / "padding.jsonl")]
    assert len(lines) == 96 and all(set(line["logprobs"]) == {" 8", " 32"} for line in lines)
    # The answer's position is the prompt's length: residue = position mod S, one per padding unit.
    assert all(line["residue"] == line["answer_position"] % S for line in lines)
    assert sorted({line["answer_position"] - line["padding"] for line in lines}) == [lines[0]["answer_position"] - lines[0]["padding"]]


def test_the_three_scoring_routes_agree(tok, model_file, tmp_path):
    with CompletionServer(padding_model(tok, dip_residues=[2]), tok) as server:
        for scoring in ("score", "prompt_logprobs", "top"):
            assert measure_padding(model_file, server.url, tmp_path / scoring, "--scoring", scoring) == 0
    means = {s: [r["mean"] for r in json.loads((tmp_path / s / "padding.json").read_text())["residues"]]
             for s in ("score", "prompt_logprobs", "top")}
    assert np.allclose(means["score"], means["prompt_logprobs"]) and np.allclose(means["score"], means["top"])


def test_a_flat_model_pads_flat(tok, model_file, tmp_path):
    with CompletionServer(padding_model(tok, dip_residues=[]), tok) as server:
        assert measure_padding(model_file, server.url, tmp_path / "flat") == 0
    data = json.loads((tmp_path / "flat" / "padding.json").read_text())
    # No residue effect: a flat model falls below these thresholds by chance 0.1% of the time.
    assert data["anova_p"] > 0.001 and data["fold_p"] > 0.001


def test_bad_padding_input_is_refused_before_the_sweep(tok, model_file, tmp_path, capsys):
    spec = json.loads((pd.EXAMPLES / "code_8_vs_32.json").read_text())
    spec["units"] = ["\n", " zqxj"]
    (tmp_path / "bad.json").write_text(json.dumps(spec))
    with CompletionServer(padding_model(tok, [1]), tok) as server:
        assert measure_padding(model_file, server.url, tmp_path / "o", "--prompt", str(tmp_path / "bad.json")) == 2
        assert "no padding unit is one token per unit" in capsys.readouterr().err
        assert server.requests == 0
    with CompletionServer(padding_model(tok, [1]), tok, logprobs=False) as server:
        assert measure_padding(model_file, server.url, tmp_path / "o") == 2
        err = capsys.readouterr().err
        assert "no prompt logprobs" in err and server.url in err
        assert server.requests == 1  # the preflight only


def test_measure_needle_through_phasekv_probe_matches_the_probe(tok, model_file, tmp_path, capsys):
    """The served model's retrieval is phasekv's needle probe (compressors, paged cache, sparse
    reader; concentrated gates at S = 8) at the record's position: the client's per-residue
    accuracy must match the probe's own probabilities for the same placements."""
    config = pk.probe.NeedleConfig(tokens=2048, records=200, channels=64, stride=S, window=S,
                                   policy=pk.probe.NeedlePolicy.concentrated_gates, gate_offset=3, seed=1)
    p = probe_p(config)
    args = ["--model", "m", "--tokenizer", str(model_file), "--stride", str(S), "--experiment", "needle",
            "--trials", "12", "--query-position", "2000", "--span", "1700", "--min-distance", "64", "--seed", "3",
            "--key-tokens", "2", "--value-tokens", "2", "--density", "0.02", "--quiet", "--backoff", "0.02"]
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.02))
    plan = sweep.plan(pk.SweepConfig(stride=S, trials_per_residue=12, query_position=2000, span=1700, min_distance=64,
                                     seed=3, record=pk.RecordShape(key_tokens=2, value_tokens=2)))
    builder.check_plan(plan.trials)
    with CompletionServer(RetrievalModel(builder, p), tok) as server:
        code = main(["measure", "--endpoint", server.url, "--out", str(tmp_path)] + args)
    assert code == 0
    written = sweep.read_plan([tmp_path / "plan.jsonl"])
    analysis = sweep.analyze(written, [tmp_path / "outcomes.jsonl"])
    # Trial by trial: right iff hash(prompt) / 2^64 < the probe's probability at the record's start.
    outcomes = {json.loads(x)["trial_id"]: json.loads(x)["outcome"] for x in open(tmp_path / "outcomes.jsonl")}
    expected = {pr.trial_id: _hash_unit(pr.ids, 0) < p(pr.needle[0], len(pr.ids) - 1) for pr in builder.prompts(written.trials)}
    assert outcomes == expected
    # By residue: the measured profile follows the probe's (mean probability per residue).
    truth = {}
    for t in written.trials:
        truth.setdefault(t["residue"], []).append(p(t["target_position"], t["query_position"]))
    measured = [x.estimate for x in analysis.result.residues]
    probe_profile = [float(np.mean(truth[x.residue])) for x in analysis.result.residues]
    assert np.corrcoef(measured, probe_profile)[0, 1] > 0.9
    assert int(np.argmax(measured)) % S == int(np.argmax(probe_profile)) % S
    # The probe's gates peak at one slot: the served profile is far from flat, like the probe's.
    assert analysis.result.homogeneity.p_value < 1e-4
    # analyze from the command line gives the same report from the same files
    capsys.readouterr()
    assert main(["analyze", "--plan", str(tmp_path / "plan.jsonl"), "--outcomes", str(tmp_path / "outcomes.jsonl")]) in (0, 1)
    assert capsys.readouterr().out.split("outcomes:")[0] == analysis.report().split("outcomes:")[0]


def test_measure_refuses_bad_arguments(tok, model_file, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["measure", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--tokenizer", str(model_file),
              "--stride", "4", "--experiment", "needle", "--out", str(tmp_path), "--no-such-flag"])
    assert e.value.code == 2
    help_text = main.__module__ and __import__("phasekv.__main__", fromlist=["_parser"])._parser()
    text = help_text._subparsers._group_actions[0].choices["measure"].format_help()
    for default in ("default: 4)", "default: 600.0)", "default: 8191)", "default: ids)", "default: score)"):
        assert default in text
    # A tokenizer file that does not exist, and a plan made for another stride.
    common = ["measure", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--stride", "4", "--experiment", "needle"]
    assert main(common + ["--tokenizer", str(tmp_path / "nope.model"), "--out", str(tmp_path / "a")]) == 2
    assert "no such" in capsys.readouterr().err
    plan = sweep.plan(pk.SweepConfig(stride=8, trials_per_residue=10, query_position=900, span=700, min_distance=64,
                                     record=pk.RecordShape(key_tokens=2, value_tokens=2)))
    plan.write(tmp_path / "plan8.jsonl")
    assert main(common + ["--tokenizer", str(model_file), "--out", str(tmp_path / "b"),
                          "--plan", str(tmp_path / "plan8.jsonl")]) == 2
    assert "stride = 8" in capsys.readouterr().err
    # A chat template the tokenizer does not have.
    assert main(common + ["--tokenizer", str(model_file), "--out", str(tmp_path / "d"), "--chat-template",
                          "--query-position", "900", "--span", "700", "--min-distance", "64", "--trials", "10",
                          "--key-tokens", "2", "--value-tokens", "2"]) == 2
    assert "no chat template" in capsys.readouterr().err
    # An unreachable endpoint: exit 2 before any trial, no outcome written.
    assert main(common + ["--tokenizer", str(model_file), "--out", str(tmp_path / "c"), "--query-position", "900",
                          "--span", "700", "--min-distance", "64", "--key-tokens", "2", "--value-tokens", "2",
                          "--retries", "1", "--backoff", "0.01", "--trials", "10"]) == 2
    assert "connection" in capsys.readouterr().err
    assert not (tmp_path / "c" / "outcomes.jsonl").exists()


def test_needle_endpoints_without_logprobs_or_with_a_second_bos_are_refused(tok, model_file, tmp_path, capsys):
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.02))
    builder.prepare(key_tokens=2, value_tokens=2)
    args = ["measure", "--model", "m", "--tokenizer", str(model_file), "--stride", "4", "--experiment", "needle",
            "--trials", "10", "--query-position", "900", "--span", "700", "--min-distance", "64",
            "--key-tokens", "2", "--value-tokens", "2", "--density", "0.02", "--quiet"]
    with CompletionServer(RetrievalModel(builder, lambda t, q: 0.5), tok, logprobs=False) as server:
        assert main(args + ["--endpoint", server.url, "--out", str(tmp_path / "a")]) == 2
        assert "no logprobs" in capsys.readouterr().err and server.requests == 1
        # Measuring without logprobs is allowed when asked for.
        assert main(args + ["--endpoint", server.url, "--out", str(tmp_path / "b"), "--logprobs", "0"]) in (0, 1)
        assert len(open(tmp_path / "b" / "outcomes.jsonl").readlines()) == 80

    class DoubleBos(CompletionServer):
        def complete(self, request):
            body = super().complete(request)
            body["usage"]["prompt_tokens"] += 1  # as a server that puts its own BOS before the ids
            return body

    with DoubleBos(RetrievalModel(builder, lambda t, q: 0.5), tok) as server:
        assert main(args + ["--endpoint", server.url, "--out", str(tmp_path / "c")]) == 2
        assert "adds or drops tokens" in capsys.readouterr().err


def test_llama_cpp_native_endpoint_runs_the_padding_experiment_with_top_scoring(tok, model_file, tmp_path, capsys):
    with CompletionServer(padding_model(tok, dip_residues=[5]), tok) as server:
        native = server.url + "/completion"
        assert measure_padding(model_file, native, tmp_path / "top", "--scoring", "top") == 0
        data = json.loads((tmp_path / "top" / "padding.json").read_text())
        assert np.allclose([r["mean"] for r in data["residues"]], true_profile(tok, dip_residues=[5]))
        # Echo scoring cannot work there: refused before the sweep, naming the way out.
        assert measure_padding(model_file, native, tmp_path / "score") == 2
        assert "use scoring 'top'" in capsys.readouterr().err


def test_too_many_errored_trials_exit_1_and_a_rerun_retries_them(tok, model_file, tmp_path, capsys):
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.02))
    builder.prepare(key_tokens=2, value_tokens=2)
    args = ["measure", "--model", "m", "--tokenizer", str(model_file), "--stride", "4", "--experiment", "needle",
            "--trials", "10", "--query-position", "900", "--span", "700", "--min-distance", "64", "--key-tokens", "2",
            "--value-tokens", "2", "--density", "0.02", "--quiet", "--retries", "1", "--backoff", "0.01",
            "--out", str(tmp_path)]
    # Every 4th request fails for good (503 twice in a row: the retry lands on the next failure).
    with CompletionServer(RetrievalModel(builder, lambda t, q: 0.6), tok, faults=Faults(server_error_every=2, first=2)) as server:
        assert main(args + ["--endpoint", server.url]) == 1
    err = capsys.readouterr().err
    assert "errored or are missing" in err
    lines = [json.loads(x) for x in open(tmp_path / "outcomes.jsonl")]
    errors = [line for line in lines if "error" in line]
    assert errors and all("503" in line["error"] for line in errors)
    with CompletionServer(RetrievalModel(builder, lambda t, q: 0.6), tok) as server:
        assert main(args + ["--endpoint", server.url]) == 0
        assert server.requests == 1 + len(errors)  # the preflight, then only the errored trials
        # The same DIR with other settings would mix two measurements: refused.
        assert main(args + ["--endpoint", server.url, "--density", "0.01"]) == 2
        assert "other settings (template" in capsys.readouterr().err
    settings = json.loads((tmp_path / "measure.json").read_text())
    assert settings["prefix_ids"] == [tok.bos_id] and settings["grid_origin"] == 0


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_text_prompts_to_a_text_only_server_measure_what_ids_do(kind, tmp_path):
    """--send text: every prompt is decoded and re-encoded here first; the server re-tokenizes the
    text itself. The outcomes must equal the run that sends ids (the needles landed where planned)."""
    model_file = tmp_path / f"{kind}.model"
    model_file.write_bytes(served_models.model_proto(kind, False))
    tok = served.SentencePieceTokenizer(model_file)
    builder = served.NeedleBuilder(tok, served.RecordTemplate(connective=" is", density=0.0, decoys=0.0))
    builder.prepare(key_tokens=2, gap=1, value_tokens=2)
    args = ["measure", "--model", "m", "--tokenizer", str(model_file), "--stride", "4", "--experiment", "needle",
            "--trials", "10", "--query-position", "700", "--span", "500", "--min-distance", "64", "--key-tokens", "2",
            "--gap", "1", "--connective", " is", "--value-tokens", "2", "--density", "0", "--decoys", "0", "--quiet"]
    model = RetrievalModel(builder, lambda t, q: 0.9 if t % 4 == 0 else 0.3)
    with CompletionServer(model, tok) as server:
        assert main(args + ["--endpoint", server.url, "--out", str(tmp_path / "ids")]) == 0
    with CompletionServer(model, tok, accepts_ids=False) as server:
        assert main(args + ["--endpoint", server.url, "--out", str(tmp_path / "text"), "--send", "text"]) == 0
    a = {json.loads(x)["trial_id"]: json.loads(x)["outcome"] for x in open(tmp_path / "ids" / "outcomes.jsonl")}
    b = {json.loads(x)["trial_id"]: json.loads(x)["outcome"] for x in open(tmp_path / "text" / "outcomes.jsonl")}
    assert a == b and len(a) == 80 and model.not_found == 0


def test_the_padding_experiment_through_phasekv_cache_finds_the_split_record(tok, tmp_path):
    """The padding experiment on a model whose retrieval runs through phasekv's compressor, paged
    cache and reader (S = 8): padding moves a 2 + 2 token record against the chunk grid, and
    P(right value | two candidates) collapses exactly when a boundary falls between its key and its
    value (record start ≡ 6 mod 8) — one residue of the answer's position. Its full-attention
    control is flat."""
    from phasekv.served.testserver import CacheRetrievalModel

    builder = served.NeedleBuilder(tok, served.RecordTemplate())
    v = builder.prepare(key_tokens=2, value_tokens=2)
    key_ids, key_text = v.key(5)
    right = 3
    wrong = next(k for k in range(len(v.values)) if v.values[k][0] != v.values[right][0])
    head = " the world of"
    prompt = ("{padding}" + head + key_text + v.value_texts[right] + " made for people" * 3
              + " Question: the value of" + key_text + " is")
    spec = pd.PaddingSpec(prompt=prompt, candidates=(v.value_texts[right], v.value_texts[wrong]),
                          answer=v.value_texts[right], units=(" the", " of", " and"))
    experiment = pd.PaddingExperiment(spec, tok, stride=S, periods=4, reps=3)
    # Where the record starts relative to the answer position (fixed: padding moves both).
    first = next(experiment.trials())
    record = len(experiment.prefix) + len(tok.encode(head))
    assert list(first.ids[record:record + 2]) == list(key_ids)
    split_residue = (6 + first.answer_position - record) % S
    profiles = {}
    for name, options in (("S=8", dict(stride=S)), ("control", dict(stride=1, own=0.0, shift=1.0))):
        with CompletionServer(CacheRetrievalModel(builder, **options), tok) as server:
            client = served.CompletionClient([server.url], "m", concurrency=2, progress=False)
            experiment.preflight(client)
            summary = client.run(experiment.jobs(), tmp_path / f"{name}.jsonl", total=experiment.total)
        assert summary.done == experiment.total
        lines = pd.read_padding_lines([tmp_path / f"{name}.jsonl"], experiment.sweep_id)
        profiles[name] = pd.analyze_padding(experiment, lines)
    dip = profiles["S=8"]
    means = {r["residue"]: r["mean"] for r in dip.residues}
    assert dip.worst_residue == split_residue
    assert means[split_residue] < 0.6 and min(m for r, m in means.items() if r != split_residue) > 0.8
    assert dip.anova_p < 1e-6 and dip.fold_p < 0.01 and dip.period == S
    control = profiles["control"]
    assert min(r["mean"] for r in control.residues) > 0.9 and not control.anova_p < 0.001


def test_measure_a_paired_needle_design_reports_cochran_q(tok, model_file, tmp_path, capsys):
    """The paired design over HTTP: every content is sent at every residue (shifted by padding after
    the BOS), and the report's paired test finds the probe's gate-slot profile."""
    config = pk.probe.NeedleConfig(tokens=2048, records=200, channels=64, stride=S, window=S,
                                   policy=pk.probe.NeedlePolicy.concentrated_gates, gate_offset=3, seed=1)
    p = probe_p(config)
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.02))
    builder.prepare(key_tokens=2, value_tokens=2)
    with CompletionServer(RetrievalModel(builder, p), tok) as server:
        code = main(["measure", "--endpoint", server.url, "--out", str(tmp_path), "--model", "m", "--tokenizer",
                     str(model_file), "--stride", str(S), "--experiment", "needle", "--trials", "12",
                     "--query-position", "2000", "--span", "1700", "--min-distance", "64", "--seed", "3",
                     "--key-tokens", "2", "--value-tokens", "2", "--density", "0.02", "--quiet", "--backoff", "0.02",
                     "--design", "paired", "--query-jitter", "8"])
    out = capsys.readouterr().out
    assert code == 0
    written = sweep.read_plan([tmp_path / "plan.jsonl"])
    assert written.design == "paired" and written.config.query_jitter == 8
    analysis = sweep.analyze(written, [tmp_path / "outcomes.jsonl"])
    paired = analysis.paired()
    assert paired["complete_contents"] == 12 and paired["cochran_q"]["p_value"] < 1e-3
    assert "Cochran's Q" in out
