"""The sweep protocol (phasekv.sweep, python -m phasekv): plan -> shards -> outcomes -> analyze equals
the in-process sweep on the same trials; the needle probe through the protocol equals the C++
needle_sweep; a Dask run equals the serial run; every malformed file is named."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import phasekv as pk
from phasekv import sweep

from test_diag import toy_model_retrieves


def toy_config(**changes):
    fields = dict(stride=4, trials_per_residue=16, query_position=8191, min_distance=64, span=6000, seed=3)
    fields.update(changes)
    return pk.SweepConfig(**fields)


def toy_evaluate(trial):
    """examples/host_sweep.cpp's stand-in model, keyed by the trial index (the paired design)."""
    return toy_model_retrieves(1, trial["target_position"], trial["query_position"], trial["trial"])


# A small haystack for the needle probe: 4096 tokens, 256 records, mean pool S = W = 4.
PROBE = dict(policy="mean_pool", stride=4, window=4, tokens=4096, records=256, channels=64, seed=5)


def probe_sweep_config(**changes):
    fields = dict(stride=4, trials_per_residue=12, query_position=4095, min_distance=16, span=3000, seed=9)
    fields.update(changes)
    return pk.SweepConfig(**fields)


def probe_config():
    fields = dict(PROBE)
    fields["policy"] = pk.probe.NeedlePolicy.__members__[fields["policy"]]
    return pk.probe.NeedleConfig(**fields)


# ---- plan ----------------------------------------------------------------------------------------


def test_a_plan_is_every_placement_with_its_haystack_layout():
    config = toy_config()
    p = sweep.plan(config, configuration={"model": "toy", "label": "toy S=4"}, needle_tokens=3)
    placements = pk.plan_sweep(config)
    assert p.complete and p.total == len(p.trials) == len(placements) == 8 * 16
    haystacks = pk.assign_haystacks(placements, 3)
    for k, (t, pl, h) in enumerate(zip(p.trials, placements, haystacks)):
        assert t["format"] == sweep.TRIAL_FORMAT and t["trial_id"] == k and t["sweep_id"] == p.sweep_id
        assert (t["residue"], t["trial"], t["target_position"], t["query_position"]) == (
            pl.residue, pl.trial, pl.target_position, pl.query_position)
        assert t["phase"] == pl.residue % 4 and t["distance"] == pl.query_position - pl.target_position
        assert t["haystack"] == h and t["seed"] == sweep.haystack_seed(3, h) < 2**53
        assert t["layout"]["needle"] == [pl.target_position, pl.target_position + 3]
        assert t["layout"]["query"] == 8191 and t["layout"]["context_tokens"] == 8192
        assert t["sweep"] == dict(stride=4, modulus=8, trials_per_residue=16, query_position=8191, span=6000,
                                  min_distance=64, seed=3, needle_tokens=3, window=0, origin=0, permutations=999,
                                  record=dict(key_tokens=1, gap=0, value_tokens=1), layout_mode="any")
        assert t["configuration"] == {"model": "toy", "label": "toy S=4"}
    # Each haystack's needles: those of its trials, in plan order, never overlapping.
    for group in p.haystacks():
        needles = [t["target_position"] for t in group]
        assert all(t["layout"]["haystack_needles"] == needles for t in group)
        ordered = sorted(needles)
        assert all(b - a >= 3 for a, b in zip(ordered, ordered[1:]))
    assert len({t["seed"] for t in p.trials}) == len(p.haystacks())


def test_a_plan_is_deterministic_and_its_id_names_what_it_plans():
    a = sweep.plan(toy_config(), configuration={"model": "a"})
    assert sweep.plan(toy_config(), configuration={"model": "a"}) == a
    assert sweep.plan(toy_config(), configuration={"model": "b"}).sweep_id != a.sweep_id
    assert sweep.plan(toy_config(seed=4), configuration={"model": "a"}).sweep_id != a.sweep_id
    assert sweep.plan(toy_config(), configuration={"model": "a"}, needle_tokens=3).sweep_id != a.sweep_id
    assert sweep.plan(toy_config(), configuration={"model": "a"}, needle_tokens=2) == a  # the record's length
    contained = toy_config()
    contained.layout = pk.LayoutMode.contained
    assert sweep.plan(contained, configuration={"model": "a"}).sweep_id != a.sweep_id


def test_plan_errors_name_the_field():
    with pytest.raises(pk.ConfigError, match=r"^needle_tokens = 65: must be at most min_distance = 64"):
        sweep.plan(toy_config(), needle_tokens=65)
    with pytest.raises(pk.ConfigError, match=r"^needle_tokens = 0"):
        sweep.plan(toy_config(), needle_tokens=0)
    with pytest.raises(pk.ConfigError, match=r"^configuration: must be a JSON object"):
        sweep.plan(toy_config(), configuration={"f": object()})
    with pytest.raises(pk.ConfigError, match=r"^trials_per_residue = 9"):
        sweep.plan(toy_config(trials_per_residue=9))
    with pytest.raises(pk.InputError, match=r"^shards = 0"):
        sweep.plan(toy_config()).shards(0)


def test_shards_are_balanced_and_keep_haystacks_whole_where_they_can(tmp_path):
    p = sweep.plan(toy_config(), needle_tokens=2)
    for count in (1, 3, 7, len(p.haystacks()) + 5):
        pieces = p.shards(count)
        sizes = [len(piece) for piece in pieces]
        assert sum(sizes) == p.total and max(sizes) - min(sizes) <= 1
        split = {h for h in range(len(p.haystacks())) if sum(any(t["haystack"] == h for t in x) for x in pieces) > 1}
        assert len(split) <= count - 1
    files = p.write(tmp_path / "plan.jsonl", shards=3)
    assert [f.name for f in files] == [f"plan.shard-{k}-of-3.jsonl" for k in range(3)]
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert sorted(line["trial_id"] for line in lines) == list(range(p.total))
    assert {(line["shard"], line["shards"]) for line in lines} == {(0, 3), (1, 3), (2, 3)}


def test_read_plan_takes_the_shards_in_any_order_and_names_what_is_wrong(tmp_path):
    p = sweep.plan(toy_config(), configuration={"model": "toy"})
    files = p.write(tmp_path / "plan.jsonl", shards=4)
    assert sweep.read_plan(reversed(files)) == p
    part = sweep.read_shards(files[1])
    ids = {t["trial_id"] for t in p.shards(4)[1]}
    assert not part.complete and part.trials == tuple(t for t in p.trials if t["trial_id"] in ids)
    with pytest.raises(sweep.ProtocolError, match=r"hold \d+ of 128 trials .*missing shards: \[2\]"):
        sweep.read_plan([files[0], files[1], files[3]])
    with pytest.raises(sweep.ProtocolError, match=r"plan.shard-1-of-4.jsonl:1: trial_id = \d+ is also at .*shard given twice"):
        sweep.read_plan([files[1], files[1]])
    # An edited line: the target moved.
    lines = files[0].read_text().splitlines()
    edited = json.loads(lines[2])
    edited["target_position"] += 1
    lines[2] = json.dumps(edited)
    files[0].write_text("\n".join(lines) + "\n")
    with pytest.raises(sweep.ProtocolError, match=r"plan.shard-0-of-4.jsonl:3: trial_id = \d+: field 'target_position' differs"):
        sweep.read_plan(files)
    # Another sweep's shard, and a line that is not a trial.
    other = sweep.plan(toy_config(seed=11)).write(tmp_path / "other.jsonl", shards=4)
    with pytest.raises(sweep.ProtocolError, match=r"other.shard-0-of-4.jsonl:1: sweep_id = .*mix sweeps"):
        sweep.read_shards([files[1], other[0]])
    (tmp_path / "junk.jsonl").write_text('{"format": "phasekv.sweep.trial/1"\n')
    with pytest.raises(sweep.ProtocolError, match=r"junk.jsonl:1: not a JSON line"):
        sweep.read_plan(tmp_path / "junk.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(sweep.ProtocolError, match=r"hold no trial"):
        sweep.read_plan(tmp_path / "empty.jsonl")


# ---- analyze -------------------------------------------------------------------------------------


def outcome_files(tmp_path, records, pieces, seed=0):
    """The records shuffled and split over `pieces` files."""
    records = list(records)
    random.Random(seed).shuffle(records)
    files = []
    for k in range(pieces):
        files.append(tmp_path / f"outcomes-{k}.jsonl")
        sweep.write_outcomes(files[-1], records[k::pieces])
    return files


def test_plan_shards_outcomes_analyze_equals_the_in_process_sweep(tmp_path):
    config = toy_config()
    p = sweep.plan(config)
    p.write(tmp_path / "plan.jsonl", shards=3)
    plan_files = sorted(tmp_path.glob("plan.shard-*.jsonl"))
    # Each "engine instance" answers its own shard; the outcome files come back shuffled and re-split.
    records = []
    for f in plan_files:
        records += sweep.evaluate_trials(sweep.read_shards(f), toy_evaluate)
    analysis = sweep.analyze(sweep.read_plan(plan_files), outcome_files(tmp_path, records, 5))
    expected = pk.run_sweep(config, lambda pl: toy_model_retrieves(1, pl.target_position, pl.query_position, pl.trial))
    assert analysis.result.to_json() == expected.to_json()
    assert analysis.result.to_table() == expected.to_table()
    assert (analysis.missing, analysis.duplicates, analysis.conflicts, analysis.host_errors) == ([], [], [], [])
    assert analysis.report().startswith(expected.to_table())
    written = analysis.write(tmp_path / "out", label="toy")
    assert sorted(f.name for f in written) == sorted(
        ["sweep.txt", "sweep.csv", "sweep.summary.csv", "sweep.json", "sweep.svg", "sweep.protocol.json"])
    assert (tmp_path / "out" / "sweep.csv").read_text() == expected.to_csv()
    assert json.loads((tmp_path / "out" / "sweep.json").read_text()) == json.loads(expected.to_json())
    assert "<svg" in (tmp_path / "out" / "sweep.svg").read_text()
    assert json.loads((tmp_path / "out" / "sweep.protocol.json").read_text())["planned"] == 128


def layout_host(trial_or_placement):
    """A host that fails straddling records (attributing it to the write) and, inside a block, the
    records that start at offset 1 (attributed to the read)."""
    get = (lambda k: trial_or_placement[k]) if isinstance(trial_or_placement, dict) else (
        lambda k: getattr(trial_or_placement, k))
    target, trial = get("target_position"), get("trial")
    offset = target % 4
    if offset + 2 >= 4:  # a 3-token record from offset 2 or 3 crosses the block boundary
        return pk.AttributedOutcome(False, pk.FailureCause.write_dilution)
    if offset == 1 and trial % 3 != 0:
        return pk.AttributedOutcome(False, pk.FailureCause.read_dilution)
    return toy_model_retrieves(2, target, get("query_position"), trial)


@pytest.mark.parametrize("mode", ["any", "contained", "straddle"])
def test_layouts_and_failure_causes_go_through_plan_shards_and_analyze(tmp_path, mode):
    config = toy_config(window=4, layout=pk.LayoutMode.__members__[mode])
    config.record = pk.RecordShape(key_tokens=2, value_tokens=1)
    p = sweep.plan(config)
    geometry = pk.Geometry(stride=4, window=4, origin=0)
    for t in p.trials:  # every trial line carries its record's layout, as classify_record gives it
        lay = pk.classify_record(geometry, t["target_position"], 3)
        assert t["record_layout"]["class"] == lay.kind.name and t["phase"] == lay.first_offset
        assert (t["record_layout"]["first"], t["record_layout"]["last"]) == (lay.first, lay.last)
        assert t["record_layout"]["boundaries"] == lay.boundaries
        assert t["layout"]["needle"] == [t["target_position"], t["target_position"] + 3]
        assert mode == "any" or (lay.kind == pk.LayoutClass.contained) == (mode == "contained")
    p.write(tmp_path / "plan.jsonl", shards=3)
    plan_files = sorted(tmp_path.glob("plan.shard-*.jsonl"))
    records = []
    for f in plan_files:
        records += sweep.evaluate_trials(sweep.read_shards(f), layout_host)
    assert any(r.get("failure") == "write_dilution" for r in records) == (mode != "contained")
    analysis = sweep.analyze(sweep.read_plan(plan_files), outcome_files(tmp_path, records, 4))
    expected = pk.run_sweep(config, layout_host)
    assert analysis.result.to_json() == expected.to_json()
    assert analysis.result.to_csv() == expected.to_csv()
    report = json.loads(analysis.result.to_json())
    assert [x["name"] for x in report["profiles"]] == ["all", "contained", "straddle"]
    if mode != "straddle":
        within = analysis.result.profile("contained")
        assert within.valid and within.phase_test.p_value < 0.05  # offset 1 is weak inside the block
        assert sum(r.failures["read_dilution"] for r in analysis.result.residues) > 0


def test_an_outcome_line_may_name_its_failure_only_on_a_false_outcome(tmp_path):
    p = sweep.plan(toy_config())
    t = p.trials[0]
    assert sweep.outcome_record(t, False, failure="selection_miss")["failure"] == "selection_miss"
    with pytest.raises(pk.InputError, match=r"failure = 'readout'"):
        sweep.outcome_record(t, True, failure="readout")
    with pytest.raises(pk.InputError, match=r"failure = 'lost'"):
        sweep.outcome_record(t, False, failure="lost")
    bad = dict(sweep.outcome_record(t, False), failure="nowhere")
    with pytest.raises(sweep.ProtocolError, match=r"record 0: trial_id = 0: failure = 'nowhere'"):
        sweep.analyze(p, [bad])


def test_duplicates_missing_conflicts_and_host_errors_are_reported_and_never_outcomes():
    p = sweep.plan(toy_config())
    by_id = {t["trial_id"]: t for t in p.trials}
    lines = {t["trial_id"]: sweep.outcome_record(t, toy_evaluate(t)) for t in p.trials}
    del lines[10]                                                          # missing
    lines[20] = sweep.outcome_record(by_id[20], error="CUDA out of memory")  # the host's error
    records = list(lines.values())
    records += [lines[5], lines[6]]                                        # duplicates, same outcome
    records.append(sweep.outcome_record(by_id[30], not lines[30]["outcome"]))  # a conflict
    records.insert(0, sweep.outcome_record(by_id[40], error="timeout"))    # an error, then a retry's outcome
    analysis = sweep.analyze(p, records)
    assert analysis.missing == [10] and analysis.duplicates == [5, 6, 30, 40]
    assert analysis.conflicts == [30] and analysis.host_errors == [20]
    assert analysis.outcomes[40] == toy_evaluate(by_id[40]) and analysis.outcomes[10] is None
    r = analysis.result
    assert r.errored_trials == 3 and sum(x.errored for x in r.residues) == 3
    assert sum(x.valid for x in r.residues) == p.total - 3
    # The lookups follow run order: trial 10 comes first among the three.
    assert "trial_id 10: missing: no outcome line" in r.first_error
    report = analysis.report()
    assert "missing: 1 trials (trial_id 10)" in report and "conflicting: 1 trials (trial_id 30)" in report
    assert "errored by the host: 1 trials (trial_id 20)" in report and "duplicated: 4 trials" in report
    # The same trials with those three removed from an in-process sweep give the same statistics.
    dropped = {by_id[i]["residue"]: [] for i in (10, 20, 30)}
    for i in (10, 20, 30):
        dropped[by_id[i]["residue"]].append(by_id[i]["trial"])

    def trial(pl):
        if pl.trial in dropped.get(pl.residue, []):
            raise RuntimeError("dropped")
        return toy_model_retrieves(1, pl.target_position, pl.query_position, pl.trial)

    expected = pk.run_sweep(toy_config(), trial)
    assert [(x.valid, x.successes) for x in r.residues] == [(x.valid, x.successes) for x in expected.residues]
    assert r.homogeneity.p_value == expected.homogeneity.p_value and r.gap_points == expected.gap_points


def test_too_many_missing_trials_make_an_invalid_sweep_not_an_error():
    p = sweep.plan(toy_config())
    records = [sweep.outcome_record(t, toy_evaluate(t)) for t in p.trials if t["residue"] != 3 or t["trial"] < 5]
    analysis = sweep.analyze(p, records)
    assert not analysis.result.valid and "residue 3 has 5 valid trials" in analysis.result.invalid_reason
    assert len(analysis.missing) == 11


def test_probability_outcomes_make_a_probability_sweep():
    p = sweep.plan(toy_config())
    records = [sweep.outcome_record(t, np.float32(0.25 + 0.5 * toy_evaluate(t))) for t in p.trials]
    records[3]["outcome"] = True  # a bool in a probability sweep counts as 1
    analysis = sweep.analyze(p, records)
    assert analysis.result.kind == pk.OutcomeKind.probability and analysis.result.homogeneity.test == "anova"
    assert analysis.outcomes[3] == 1.0
    records[4]["outcome"] = 1.5  # outside [0, 1]: errored, as in C++
    assert sweep.analyze(p, records).result.errored_trials == 1
    forced = sweep.analyze(p, [sweep.outcome_record(t, True) for t in p.trials], kind=pk.OutcomeKind.probability)
    assert forced.result.kind == pk.OutcomeKind.probability


def test_outcome_lines_that_break_the_protocol_are_named(tmp_path):
    p = sweep.plan(toy_config())
    good = [sweep.outcome_record(t, True) for t in p.trials]
    cases = [
        (dict(good[0], sweep_id="0123456789abcdef"), r"sweep_id = '0123456789abcdef': not this plan's"),
        (dict(good[0], trial_id=128), r"trial_id = 128: must be an integer in \[0, 128\)"),
        (dict(good[0], trial_id="7"), r"trial_id = '7'"),
        ({k: v for k, v in good[0].items() if k != "outcome"}, r"trial_id = 0: must have exactly one of 'outcome' and 'error'"),
        (dict(good[0], error="x"), r"trial_id = 0: must have exactly one of 'outcome' and 'error'"),
        (dict(good[0], outcome="yes"), r"trial_id = 0: outcome = 'yes': must be true, false or a number"),
        (dict(good[0], format="something/1"), r"not an outcome line"),
    ]
    for bad, message in cases:
        sweep.write_outcomes(tmp_path / "o.jsonl", good[1:50] + [bad])
        with pytest.raises(sweep.ProtocolError, match=r"o.jsonl:50: " + message):
            sweep.analyze(p, [tmp_path / "o.jsonl"])
    with pytest.raises(pk.InputError, match=r"^plan: holds 32 of 128 trials"):
        sweep.analyze(sweep.read_shards(p.write(tmp_path / "p.jsonl", shards=4)[0]), good)


# ---- the needle probe through the protocol ----------------------------------------------------------


@pytest.mark.parametrize("outcome", ["success", "probability"])
def test_the_needle_probe_through_plan_shards_and_analyze_equals_the_cpp_needle_sweep(tmp_path, outcome):
    config = probe_sweep_config()
    kind = pk.probe.NeedleOutcome.__members__[outcome]
    expected = pk.probe.needle_sweep(pk.probe.NeedleProbe(probe_config()), config, kind)
    assert expected.valid
    p = sweep.plan(config, configuration={"probe": PROBE}, needle_tokens=2)
    files = p.write(tmp_path / "plan.jsonl", shards=3)
    evaluate = sweep.NeedleEvaluate(outcome=outcome, **PROBE)
    out = []
    for k, f in enumerate(files):  # each shard on its own, as separate engine instances would
        out.append(tmp_path / f"outcomes-{k}.jsonl")
        sweep.write_outcomes(out[-1], sweep.evaluate_trials(sweep.read_shards(f), evaluate))
    analysis = sweep.analyze(sweep.read_plan(files), reversed(out))
    assert analysis.result.to_json() == expected.to_json()


def test_records_of_several_tokens_with_failure_causes_through_the_protocol_equal_the_cpp_sweep(tmp_path):
    # Isolated two-key/one-gap/two-value records, top-1 selection (some failures are selection
    # misses), layout = any: the layout and failure columns must come out as the C++ sweep's.
    fields = dict(PROBE, channels=96, records=150, stride=8, window=8, top_k=1, isolate_targets=True,
                  record=(2, 1, 2))
    evaluate = sweep.NeedleEvaluate(outcome="attributed", **fields)
    probe_cfg = evaluate.config()
    assert probe_cfg.record.length() == 5 and evaluate.needle_tokens() == 5 + 16
    config = probe_sweep_config(stride=8, modulus=8, window=8, min_distance=32, record=probe_cfg.record)
    expected = pk.probe.needle_sweep(pk.probe.NeedleProbe(probe_cfg), config, pk.probe.NeedleOutcome.attributed)
    assert expected.valid
    causes = {c: sum(row.failures[c] for row in expected.residues) for c in ("selection_miss", "read_dilution")}
    assert causes["selection_miss"] > 0, causes
    p = sweep.plan(config, configuration={"probe": "records"}, needle_tokens=evaluate.needle_tokens())
    files = p.write(tmp_path / "plan.jsonl", shards=2)
    out = []
    for k, f in enumerate(files):
        out.append(tmp_path / f"outcomes-{k}.jsonl")
        records = sweep.evaluate_trials(sweep.read_shards(f), evaluate)
        assert all(("failure" in r) == (r["outcome"] is False) for r in records)
        sweep.write_outcomes(out[-1], records)
    for t in p.trials:
        assert t["record_layout"]["class"] == pk.classify_record(config.stream(), t["target_position"], 5).kind.name
    analysis = sweep.analyze(sweep.read_plan(files), out)
    assert analysis.result.to_json() == expected.to_json()
    csv = analysis.result.to_csv()
    assert "selection_miss" in csv.splitlines()[0]


def test_needle_evaluate_is_picklable_and_refuses_a_plan_it_cannot_answer():
    import pickle

    evaluate = sweep.NeedleEvaluate(probe_config())
    clone = pickle.loads(pickle.dumps(evaluate))
    assert clone.fields == evaluate.fields and repr(clone) == repr(evaluate)
    assert "policy='mean_pool'" in repr(evaluate)
    trial = sweep.plan(probe_sweep_config(), needle_tokens=1).trials[0]
    with pytest.raises(pk.InputError, match=r"needle_tokens = 1: this needle probe's haystacks need 2"):
        evaluate(trial)
    other = sweep.plan(probe_sweep_config(record=pk.RecordShape(key_tokens=1, value_tokens=1, gap=1)),
                       needle_tokens=2).trials[0]
    with pytest.raises(pk.InputError, match=r"sweep.record = .*must be the probe's record"):
        evaluate(other)
    with pytest.raises(pk.ConfigError, match=r"needle_config.records = 5000"):
        sweep.NeedleEvaluate(tokens=4096, records=5000)
    with pytest.raises(pk.InputError, match=r"outcome = 'maybe'"):
        sweep.NeedleEvaluate(outcome="maybe")


# ---- Dask ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


def test_a_dask_run_equals_the_serial_run(dask_client):
    p = sweep.plan(probe_sweep_config(), needle_tokens=2)
    evaluate = sweep.NeedleEvaluate(**PROBE)
    seen = []
    on_dask = sweep.run(p, evaluate, dask_client, progress=lambda done, total: seen.append((done, total)))
    serial = sweep.run(p, evaluate)
    assert on_dask.result.to_json() == serial.result.to_json()
    assert on_dask.records == serial.records  # the same lines in the same (task) order
    assert seen[-1] == (p.total, p.total) and all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
    assert len(seen) == len([g for g in p.haystacks() if g])
    # Both workers took part (the tasks are spread, each worker built its own probe).
    assert len(dask_client.scheduler_info()["workers"]) == 2


def test_a_dask_run_keeps_evaluate_errors_as_errored_trials(dask_client):
    p = sweep.plan(toy_config())

    def flaky(trial):  # a closure: shipped with cloudpickle
        if trial["trial_id"] % 50 == 7:
            raise RuntimeError(f"engine lost trial {trial['trial_id']}")
        return toy_evaluate(trial)

    on_dask = sweep.run(p, flaky, dask_client)
    assert on_dask.host_errors == [7, 57, 107] and on_dask.result.errored_trials == 3
    assert on_dask.result.to_json() == sweep.run(p, flaky).result.to_json()
    assert "engine lost trial" in on_dask.result.first_error


# ---- python -m phasekv ---------------------------------------------------------------------------


def cli(*args, check=True):
    done = subprocess.run([sys.executable, "-m", "phasekv", *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ))
    if check and done.returncode != 0:
        raise AssertionError(f"exit {done.returncode}: {done.stderr}")
    return done


def test_the_command_line_plans_probes_and_analyzes(tmp_path):
    config = probe_sweep_config()
    planned = cli("plan", "--stride", 4, "--trials", 12, "--query-position", 4095, "--min-distance", 16, "--span", 3000,
                  "--seed", 9, "--needle-tokens", 2, "--configuration", json.dumps({"probe": PROBE}), "--shards", 2,
                  "--out", tmp_path / "plan.jsonl")
    assert "96 trials (8 residues x 12)" in planned.stdout
    shards = sorted(tmp_path.glob("plan.shard-*-of-2.jsonl"))
    assert len(shards) == 2
    for k, shard in enumerate(shards):
        policy = ("mean_pool", "mean")[k]  # either name of the policy: the same probe
        cli("probe", "--plan", shard, "--out", tmp_path / f"o{k}.jsonl", "--policy", policy, "--channels", 64,
            "--records", 256, "--seed", 5, "--quiet")
    report = cli("analyze", "--plan", *shards, "--outcomes", tmp_path / "o1.jsonl", tmp_path / "o0.jsonl",
                 "--out-dir", tmp_path / "out")
    expected = pk.probe.needle_sweep(pk.probe.NeedleProbe(probe_config()), config)
    assert report.stdout.startswith(expected.to_table())
    assert (tmp_path / "out" / "sweep.json").read_text() == expected.to_json() + "\n"
    # A missing shard is an error naming it (exit 2); an invalid sweep exits 1.
    missing = cli("analyze", "--plan", shards[0], "--outcomes", tmp_path / "o0.jsonl", check=False)
    assert missing.returncode == 2 and "missing shards: [1]" in missing.stderr
    half = cli("analyze", "--plan", *shards, "--outcomes", tmp_path / "o0.jsonl", check=False)
    assert half.returncode == 1 and half.stdout.startswith("INVALID SWEEP") and "missing:" in half.stdout


def test_the_command_line_rejects_bad_arguments(tmp_path):
    for args, message in [
        (("plan", "--stride", 4, "--query-position", 100, "--out", tmp_path / "p"), "--span"),
        (("plan", "--stride", 0, "--query-position", 100, "--span", 50, "--out", tmp_path / "p"), "must be a positive"),
        (("plan", "--stride", 4, "--query-position", 100, "--span", 50, "--configuration", "[1]", "--out", tmp_path / "p"),
         "must be a JSON object"),
        (("probe", "--plan", tmp_path / "p", "--out", tmp_path / "o", "--policy", "nope"), "invalid choice"),
        (("frobnicate",), "invalid choice"),
    ]:
        done = cli(*args, check=False)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
    # The library's own checks come back as one line naming the field, exit 2.
    done = cli("plan", "--stride", 4, "--query-position", 100, "--span", 20, "--out", tmp_path / "p", check=False)
    assert done.returncode == 2 and "span = 20" in done.stderr and "Traceback" not in done.stderr
    done = cli("analyze", "--plan", tmp_path / "absent.jsonl", "--outcomes", tmp_path / "o", check=False)
    assert done.returncode == 2 and "absent.jsonl" in done.stderr and "Traceback" not in done.stderr
    help_text = cli("probe", "--help").stdout
    assert "--scheduler" in help_text and "(default: mean)" in help_text
    # A plan the probe cannot answer (needles of 3 tokens for its 2-token records): exit 2 before any
    # trial, no outcome file.
    cli("plan", "--stride", 4, "--trials", 12, "--query-position", 4095, "--min-distance", 16, "--span", 3000,
        "--needle-tokens", 3, "--out", tmp_path / "other.jsonl")
    done = cli("probe", "--plan", tmp_path / "other.jsonl", "--out", tmp_path / "never.jsonl", "--quiet", check=False)
    assert done.returncode == 2 and "needle_tokens = 3" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "never.jsonl").exists()


def test_a_trial_without_an_outcome_is_reported_without_internal_names():
    p = sweep.plan(toy_config())
    outcomes = [sweep.outcome_record(t, True) for t in p.trials[1:]]
    analysis = sweep.analyze(p, outcomes)
    assert analysis.missing == [0]
    assert "trial_id 0" in analysis.result.first_error and "_TrialFailed" not in analysis.result.first_error


def test_a_jittered_query_is_planned_and_its_lines_describe_the_plan():
    config = toy_config()
    config.query_jitter = 4
    p = sweep.plan(config, configuration={"model": "toy"}, needle_tokens=3)
    placements = pk.plan_sweep(config)
    assert [t["query_position"] for t in p.trials] == [pl.query_position for pl in placements]
    assert {t["query_position"] for t in p.trials} == {8191 - config.query_offset(i) for i in range(16)}
    assert all(t["layout"]["query"] == t["query_position"] == t["layout"]["context_tokens"] - 1 for t in p.trials)
    assert all(t["sweep"]["query_jitter"] == 4 for t in p.trials)
    # Every needle of a haystack lies before every query that haystack serves.
    for group in p.haystacks():
        assert max(t["target_position"] for t in group) + 3 <= min(t["query_position"] for t in group)
    assert p.sweep_id != sweep.plan(toy_config(), configuration={"model": "toy"}, needle_tokens=3).sweep_id


def test_the_command_line_reports_unreadable_files_and_huge_integers_as_bad_input(tmp_path):
    cli("plan", "--stride", 4, "--trials", 12, "--query-position", 4095, "--min-distance", 16, "--span", 3000,
        "--out", tmp_path / "plan.jsonl")
    # A byte that is not UTF-8, and a line nested past the JSON parser's recursion limit: exit 2
    # ("bad files") naming the line, not a traceback and exit 1 ("invalid sweep").
    (tmp_path / "latin1.jsonl").write_bytes(b'{"trial_id": 0}\n{"answer": "caf\xe9"}\n')
    (tmp_path / "nested.jsonl").write_text("[" * 200_000 + "]" * 200_000 + "\n")
    for name, message in (("latin1.jsonl", "latin1.jsonl:2: not UTF-8 (byte 0xe9"),
                          ("nested.jsonl", "nested.jsonl:1: nested too deeply")):
        done = cli("analyze", "--plan", tmp_path / "plan.jsonl", "--outcomes", tmp_path / name, check=False)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    for value in (2**70, 2**63):
        done = cli("plan", "--stride", 4, "--query-position", value, "--span", 50, "--out", tmp_path / "p", check=False)
        assert done.returncode == 2 and "must be a non-negative integer below 2^63" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    done = cli("plan", "--stride", "four", "--query-position", 1, "--span", 50, "--out", tmp_path / "p", check=False)
    assert done.returncode == 2 and "'four': not an integer" in done.stderr
