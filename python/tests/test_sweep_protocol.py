"""The sweep protocol (phasekv.sweep, python -m phasekv): plan -> shards -> outcomes -> analyze equals
the in-process sweep on the same trials; the needle probe through the protocol equals the C++
needle_sweep; a Dask run equals the serial run; every malformed file is named."""

import json
import math
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
        ["sweep.txt", "sweep.csv", "sweep.summary.csv", "sweep.json", "sweep.svg", "sweep.protocol.json",
         "sweep.trials.csv"])
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
    trial = sweep.plan(probe_sweep_config(), needle_tokens=3).trials[0]
    with pytest.raises(pk.InputError, match=r"needle_tokens = 3: this needle probe's haystacks need 2"):
        evaluate(trial)
    other = sweep.plan(probe_sweep_config(record=pk.RecordShape(key_tokens=1, value_tokens=1, gap=1)),
                       needle_tokens=3).trials[0]
    three = sweep.NeedleEvaluate(**dict(PROBE, record=(2, 0, 1)))  # a 3-token record of another shape
    with pytest.raises(pk.InputError, match=r"sweep.record = .*must be the probe's record"):
        three(other)
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
    half = cli("analyze", "--plan", *shards, "--outcomes", tmp_path / "o0.jsonl", "--max-missing", 1, check=False)
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
        "--needle-spacing", 3, "--out", tmp_path / "other.jsonl")
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


# ---- designs, paired statistics, the per-trial table, --max-missing ---------------------------------


def _cochran_by_formula(rows):
    """Cochran's Q from its definition, in plain Python floats (rows: lists of 0/1)."""
    k = len(rows[0])
    columns = [sum(r[j] for r in rows) for j in range(k)]
    row_totals = [sum(r) for r in rows]
    n = float(sum(row_totals))
    denominator = k * n - sum(float(r) ** 2 for r in row_totals)
    if denominator == 0:
        return 0.0
    return (k - 1) * (k * sum(float(c) ** 2 for c in columns) - n * n) / denominator


def _chi2_tail_even(x, dof):
    """P(χ²_dof > x) for even dof: e^{−x/2} Σ_{j < dof/2} (x/2)^j / j! (closed form)."""
    return math.exp(-x / 2) * sum((x / 2) ** j / math.factorial(j) for j in range(dof // 2))


def test_cochran_q_is_its_formula_and_mcnemar_at_two_residues():
    rng = random.Random(7)
    for _ in range(200):
        k = rng.choice((3, 5, 9))  # even dof: the tail has a closed form
        rows = [[int(rng.random() < 0.3 + 0.4 * (j == 1)) for j in range(k)] for _ in range(rng.randint(2, 40))]
        got = sweep.cochran_q(rows)
        want = _cochran_by_formula(rows)
        assert got["statistic"] == pytest.approx(want, rel=1e-12, abs=1e-12) and got["dof"] == k - 1
        want_p = _chi2_tail_even(want, k - 1) if want > 0 else 1.0
        assert got["p_value"] == pytest.approx(want_p, rel=1e-9, abs=1e-12)
        assert got["discordant_blocks"] == sum(0 < sum(r) < k for r in rows)
    for _ in range(100):
        n = rng.randint(1, 60)
        a = [rng.random() < 0.5 for _ in range(n)]
        b = [rng.random() < 0.7 for _ in range(n)]
        m = sweep.mcnemar(a, b)
        n10 = sum(x and not y for x, y in zip(a, b))
        n01 = sum(y and not x for x, y in zip(a, b))
        assert (m["a_only"], m["b_only"]) == (n10, n01)
        # Q at k = 2 is McNemar's statistic without continuity correction.
        assert sweep.cochran_q([[int(x), int(y)] for x, y in zip(a, b)])["statistic"] == pytest.approx(m["statistic"])
        # The exact p by enumerating every sign assignment of the discordant pairs (small n).
        d = n10 + n01
        if d <= 14:
            import itertools
            observed = abs(n10 - n01)
            extreme = sum(1 for signs in itertools.product((0, 1), repeat=d) if abs(2 * sum(signs) - d) >= observed)
            assert m["p_value"] == pytest.approx(min(1.0, extreme / 2**d), rel=1e-12)
    with pytest.raises(pk.InputError, match="cochran_q"):
        sweep.cochran_q([[0, 2], [1, 0]])


def _simulated_paired(rng, contents, k, effect, spread=2.0):
    """Binary outcomes of `contents` contents at k residues: a content's log-odds ~ N(0.8, spread²)
    (contents differ a lot: the situation pairing is for), residue 1 shifted by `effect`."""
    rows = []
    for _ in range(contents):
        base = rng.gauss(0.8, spread)
        rows.append([int(rng.random() < 1 / (1 + math.exp(-(base + (effect if j == 1 else 0.0))))) for j in range(k)])
    return rows


def test_cochran_q_holds_its_level_under_the_null_and_finds_an_effect():
    rng = random.Random(11)
    sims = 600
    null = sum(sweep.cochran_q(_simulated_paired(rng, 48, 8, 0.0))["p_value"] < 0.05 for _ in range(sims)) / sims
    # Binomial se at 5% over 600 simulations is 0.9%: the level lies within ~3 se of nominal.
    assert 0.025 <= null <= 0.075, null
    power = sum(sweep.cochran_q(_simulated_paired(rng, 48, 8, -2.0))["p_value"] < 0.05 for _ in range(200)) / 200
    assert power >= 0.8, power


def paired_config(**changes):
    fields = dict(stride=4, trials_per_residue=24, query_position=4095, min_distance=64, span=3000, seed=5)
    fields.update(changes)
    return pk.SweepConfig(**fields)


def test_a_paired_plan_shifts_one_content_to_every_residue(tmp_path):
    config = paired_config()
    p = sweep.plan(config, design="paired", needle_tokens=3, configuration={"model": "m"})
    assert p.design == "paired" and p.complete and len(p.trials) == 8 * 24
    assert p.sweep_id != sweep.plan(config, needle_tokens=3, configuration={"model": "m"}).sweep_id
    by_content = {}
    for t in p.trials:
        assert t["format"] == sweep.TRIAL_FORMAT_2 and t["sweep"]["design"] == "paired"
        c = t["content"]
        assert t["target_position"] == c["needle"][0] + c["padding"] and t["query_position"] == c["query"] + c["padding"]
        assert 0 <= c["padding"] < 8 and t["target_position"] % 8 == t["residue"]
        assert t["layout"]["haystack_needles"] == [t["target_position"]] and t["haystack"] == t["trial"]
        assert t["query_position"] <= 4095 and t["distance"] >= 64 and c["needle"][0] >= 0
        by_content.setdefault(t["trial"], []).append(t)
    for trials in by_content.values():
        # One content: one seed, one unpadded needle and query, the same distance at every residue.
        assert len({t["seed"] for t in trials}) == 1 and len({tuple(t["content"]["needle"]) for t in trials}) == 1
        assert len({t["distance"] for t in trials}) == 1 and sorted(t["residue"] for t in trials) == list(range(8))
    # Padding is not the residue itself across contents.
    assert len({(t["residue"], t["content"]["padding"]) for t in p.trials}) > 8
    assert len(p.prompts()) == len(p.trials)
    files = p.write(tmp_path / "paired.jsonl", shards=3)
    assert sweep.read_plan(files) == p and sweep.read_plan(files).design == "paired"
    with pytest.raises(pk.ConfigError, match="2\\(M − 1\\)"):
        sweep.plan(paired_config(query_position=3073, span=3000, min_distance=64), design="paired")


def _content_outcomes(p, effect, seed):
    """Outcomes of a paired plan from a model whose success depends on the content (strongly) and on
    residue 1 by `effect` (log-odds)."""
    rng = random.Random(seed)
    base = {i: rng.gauss(0.8, 2.0) for i in {t["trial"] for t in p.trials}}
    records = []
    for t in p.trials:
        logit = base[t["trial"]] + (effect if t["residue"] == 1 else 0.0)
        records.append(sweep.outcome_record(t, rng.random() < 1 / (1 + math.exp(-logit))))
    return records


def test_analyze_of_a_paired_plan_reports_cochran_q_with_its_level_and_power():
    p = sweep.plan(paired_config(trials_per_residue=32), design="paired")
    null_p = [sweep.analyze(p, _content_outcomes(p, 0.0, s)).paired()["cochran_q"]["p_value"] for s in range(120)]
    assert 0.0 <= sum(x < 0.05 for x in null_p) / len(null_p) <= 0.10
    hit = [sweep.analyze(p, _content_outcomes(p, -2.5, 1000 + s)).paired()["cochran_q"]["p_value"] for s in range(40)]
    assert sum(x < 0.05 for x in hit) / len(hit) >= 0.8
    records = _content_outcomes(p, -2.5, 3)
    a = sweep.analyze(p, records)
    paired = a.paired()
    # The Q of analyze is Cochran's Q of the content × residue table built here by hand.
    table = {}
    for t, r in zip(p.trials, records):
        table.setdefault(t["trial"], {})[t["residue"]] = int(r["outcome"])
    rows = [[table[i][r] for r in range(8)] for i in sorted(table)]
    assert paired["cochran_q"]["statistic"] == pytest.approx(_cochran_by_formula(rows), rel=1e-12)
    assert paired["complete_contents"] == 32 and "Cochran's Q" in a.report()
    # A content with a missing residue is dropped from the paired test (complete blocks only).
    dropped = sweep.analyze(p, [r for r in records if r["trial_id"] != p.trials[0]["trial_id"]])
    assert dropped.paired()["complete_contents"] == 31
    assert dropped.protocol()["paired"]["complete_contents"] == 31
    # Other designs have no paired section.
    assert sweep.analyze(sweep.plan(toy_config()), [sweep.outcome_record(t, toy_evaluate(t))
                                                    for t in sweep.plan(toy_config()).trials]).paired() is None


def test_mcnemar_is_reported_for_a_paired_plan_of_two_residues():
    config = pk.SweepConfig(stride=2, modulus=2, trials_per_residue=30, query_position=2047, min_distance=16, span=1000,
                            seed=2)
    p = sweep.plan(config, design="paired")
    a = sweep.analyze(p, _content_outcomes(p, -3.0, 9))
    paired = a.paired()
    assert paired["residues"] == [0, 1] and "mcnemar" in paired and "McNemar" in a.report()
    assert paired["mcnemar"]["b_only"] < paired["mcnemar"]["a_only"]


def test_a_single_needle_plan_puts_one_needle_in_one_shared_haystack(tmp_path):
    p = sweep.plan(probe_sweep_config(), design="single", needle_tokens=2)
    assert {t["seed"] for t in p.trials} == {sweep.haystack_seed(9, 0)} and {t["haystack"] for t in p.trials} == {0}
    assert all(t["layout"]["haystack_needles"] == [t["target_position"]] for t in p.trials)
    assert all(t["record_layout"]["crowding"] == 0 for t in p.trials)
    assert len(p.prompts()) == len(p.trials) and p.trials[0]["format"] == sweep.TRIAL_FORMAT_2
    # Positions are the C++ plan's (only the sharing of haystacks differs).
    same = sweep.plan(probe_sweep_config(), needle_tokens=2)
    assert [(t["target_position"], t["query_position"]) for t in p.trials] == [
        (t["target_position"], t["query_position"]) for t in same.trials]
    assert sweep.read_plan(p.write(tmp_path / "single.jsonl")) == p
    # The probe answers it prompt by prompt: one needle each, so nothing crowds a target.
    analysis = sweep.run(p, sweep.NeedleEvaluate(**PROBE))
    assert analysis.result.valid and not analysis.missing


def test_a_trial_line_of_an_unknown_version_is_refused_by_name(tmp_path):
    p = sweep.plan(toy_config())
    line = dict(p.trials[0], format="phasekv.sweep.trial/9", shard=0, shards=1)
    (tmp_path / "p.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(sweep.ProtocolError, match=r"trial/9.*newer phasekv"):
        sweep.read_plan(tmp_path / "p.jsonl")


def test_the_per_trial_table_keeps_the_hosts_extra_fields(tmp_path):
    p = sweep.plan(toy_config())
    records = []
    for t in p.trials:
        r = sweep.outcome_record(t, toy_evaluate(t))
        r.update(answer=f"value {t['trial_id']}", logprobs={"8": -0.5, "32": -1.25}, prompt_hash="ab" * 4,
                 latency=0.25, residue="host's own")
        records.append(r)
    records[7] = sweep.outcome_record(p.trials[7], error="timeout")
    a = sweep.analyze(p, records)
    import csv
    import io
    rows = list(csv.DictReader(io.StringIO(a.trial_table())))
    assert len(rows) == len(p.trials) and [int(r["trial_id"]) for r in rows] == list(range(len(p.trials)))
    r0 = rows[0]
    assert r0["answer"] == "value 0" and json.loads(r0["logprobs"]) == {"8": -0.5, "32": -1.25}
    assert r0["prompt_hash"] == "abababab" and r0["latency"] == "0.25" and r0["host_residue"] == "host's own"
    assert int(r0["residue"]) == p.trials[0]["residue"] and r0["status"] == "ok"
    assert r0["outcome"] == str(toy_evaluate(p.trials[0])).lower()
    assert int(r0["crowding"]) == p.trials[0]["record_layout"]["crowding"]
    assert rows[7]["status"] == "errored" and rows[7]["error"] == "timeout" and rows[7]["outcome"] == ""
    written = a.write(tmp_path / "out")
    assert (tmp_path / "out" / "sweep.trials.csv") in written
    assert (tmp_path / "out" / "sweep.trials.csv").read_text() == a.trial_table()


def _plan_and_outcomes(tmp_path, keep):
    cli("plan", "--stride", 4, "--trials", 16, "--query-position", 8191, "--min-distance", 64, "--span", 6000,
        "--seed", 3, "--out", tmp_path / "plan.jsonl")
    p = sweep.read_plan(tmp_path / "plan.jsonl")
    sweep.write_outcomes(tmp_path / "o.jsonl", [sweep.outcome_record(t, toy_evaluate(t)) for t in p.trials
                                                if keep(t)])
    return p


def test_analyze_refuses_a_sweep_with_too_many_missing_trials(tmp_path):
    # A quarter of each residue's trials missing: still a valid sweep (12 of 16 per residue).
    _plan_and_outcomes(tmp_path, lambda t: t["trial"] % 4 != 0)
    args = ("analyze", "--plan", tmp_path / "plan.jsonl", "--outcomes", tmp_path / "o.jsonl")
    refused = cli(*args, check=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "32 of 128 trials (25.0%) have no outcome line, more than --max-missing 0.05" in refused.stderr
    assert "Traceback" not in refused.stderr
    allowed = cli(*args, "--max-missing", 0.25, check=False)
    assert allowed.returncode == 0 and "missing: 32 trials" in allowed.stdout
    assert cli(*args, "--max-missing", 1.5, check=False).returncode == 2
    # At or below the default fraction: analysed.
    _plan_and_outcomes(tmp_path, lambda t: t["trial_id"] not in (1, 2, 3, 4, 5, 6))
    assert cli(*args, check=False).returncode == 0


def test_needle_tokens_and_the_record_cannot_disagree(tmp_path):
    base = ("plan", "--stride", 4, "--trials", 12, "--query-position", 4095, "--min-distance", 16, "--span", 3000)
    cli(*base, "--needle-tokens", 12, "--out", tmp_path / "twelve.jsonl")
    t = sweep.read_plan(tmp_path / "twelve.jsonl").trials[0]
    assert t["sweep"]["record"] == {"key_tokens": 11, "gap": 0, "value_tokens": 1} and t["sweep"]["needle_tokens"] == 12
    layout = pk.classify_record(pk.Geometry(stride=4, window=4), t["target_position"], 12)
    assert t["record_layout"]["last"] == layout.last and t["record_layout"]["class"] == layout.kind.name
    assert t["record_layout"]["class"] != "contained"  # 12 tokens never fit a 4-token block
    done = cli(*base, "--needle-tokens", 12, "--key-tokens", 1, "--out", tmp_path / "bad.jsonl", check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--needle-tokens 12 disagrees with the record's length 2 (--key-tokens 1 + --gap 0 + --value-tokens 1)" in (
        done.stderr)
    cli(*base, "--needle-tokens", 12, "--key-tokens", 9, "--gap", 1, "--value-tokens", 2, "--out", tmp_path / "ok.jsonl")
    with pytest.raises(pk.ConfigError, match="shorter than the record it holds"):
        sweep.plan(probe_sweep_config(record=pk.RecordShape(key_tokens=3, value_tokens=2)), needle_tokens=4)


def test_the_query_jitter_is_a_plan_option_that_separates_phase_from_distance(tmp_path):
    base = ("plan", "--stride", 4, "--trials", 16, "--query-position", 8191, "--min-distance", 64, "--span", 6000)
    cli(*base, "--query-jitter", 8, "--out", tmp_path / "j.jsonl")
    p = sweep.read_plan(tmp_path / "j.jsonl")
    assert p.sweep["query_jitter"] == 8 and p.config.query_jitter == 8
    # Each residue meets every distance phase (distance mod S), so phase and distance are not one variable.
    for r in range(8):
        assert {t["distance"] % 4 for t in p.trials if t["residue"] == r} == {0, 1, 2, 3}
    cli(*base, "--out", tmp_path / "fixed.jsonl")
    fixed = sweep.read_plan(tmp_path / "fixed.jsonl")
    for r in range(8):  # without jitter: one distance phase per residue (the confounded design)
        assert len({t["distance"] % 4 for t in fixed.trials if t["residue"] == r}) == 1


def _newton_logistic(x, y, iterations=60):
    """Plain maximum-likelihood logistic regression by Newton's method in NumPy float64: an
    independent computation for fit_logistic(firth=False)."""
    beta = np.zeros(x.shape[1])
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-x @ beta))
        beta += np.linalg.solve(x.T @ (x * (p * (1 - p))[:, None]), x.T @ (y - p))
    return beta


def test_the_logistic_fit_of_analyze_recovers_known_covariate_effects():
    # Outcomes from a known logistic model of the plan's own covariates: distance / 100 at −0.4,
    # crowding at −0.5 per token, straddle at −1, no phase effect.
    config = toy_config(trials_per_residue=48, span=7000, query_position=8191, min_distance=64,
                        record=pk.RecordShape(key_tokens=1, value_tokens=1))
    p = sweep.plan(config, needle_tokens=2)
    truth = {"intercept": 3.0, "straddle": -1.0, "crowding": -0.5, "distance_per_100": -0.04}
    rng = np.random.default_rng(4)
    records = []
    for t in p.trials:
        z = (truth["intercept"] + truth["straddle"] * (t["record_layout"]["class"] != "contained")
             + truth["crowding"] * t["record_layout"]["crowding"] + truth["distance_per_100"] * t["distance"] / 100)
        records.append(sweep.outcome_record(t, bool(rng.random() < 1 / (1 + math.exp(-z)))))
    a = sweep.analyze(p, records)
    fit = a.logistic()
    assert fit["converged"] and fit["observations"] == len(p.trials)
    for name, value in truth.items():
        c = fit["coefficients"][name]
        assert abs(c["estimate"] - value) < 3.5 * c["se"], (name, c, value)
    assert {"phase_1", "phase_2", "distance_per_100", "crowding"} <= set(fit["coefficients"])
    assert fit["distance_test"]["p"] < 0.01 and fit["phase_test"]["dof"] == 2
    assert "logistic fit (Firth)" in a.report() and a.protocol()["logistic"]["observations"] == len(p.trials)
    # The binding against an independent Newton fit without Firth's penalty, on the same columns.
    names = list(fit["coefficients"])
    used = [t for t in p.trials]
    cols = {"intercept": lambda t: 1.0, "straddle": lambda t: float(t["record_layout"]["class"] != "contained"),
            "crowding": lambda t: float(t["record_layout"]["crowding"]), "distance_per_100": lambda t: t["distance"] / 100,
            "phase_1": lambda t: float(t["record_layout"]["class"] == "contained" and t["phase"] == 1),
            "phase_2": lambda t: float(t["record_layout"]["class"] == "contained" and t["phase"] == 2)}
    x = np.array([[cols[n](t) for n in names] for t in used])
    y = np.array([1.0 if r["outcome"] else 0.0 for r in records])
    plain = pk.stats.fit_logistic(x.ravel().tolist(), y.tolist(), len(names), names, firth=False)
    assert plain.coefficients == pytest.approx(_newton_logistic(x, y).tolist(), rel=1e-7, abs=1e-9)
    # Every outcome the same: nothing to fit, said so.
    same = sweep.analyze(p, [sweep.outcome_record(t, True) for t in p.trials]).logistic()
    assert "nothing to fit" in same["note"]


def test_a_plan_states_its_grids_and_analyze_reports_by_each(tmp_path):
    base = ("plan", "--stride", 4, "--trials", 64, "--query-position", 32767, "--min-distance", 256, "--span", 30000,
            "--seed", 4, "--grid", "hca:128", "--grid", "odd:8:16:3")
    cli(*base, "--out", tmp_path / "plan.jsonl")
    p = sweep.read_plan(tmp_path / "plan.jsonl")
    assert [g["name"] for g in p.grids] == ["sweep", "hca", "odd"]
    assert p.grids[1] == {"name": "hca", "stride": 128, "window": 128, "origin": 0, "modulus": 256}
    assert p.grids[2] == {"name": "odd", "stride": 8, "window": 16, "origin": 3, "modulus": 16}
    for t in p.trials:
        assert t["format"] == sweep.TRIAL_FORMAT_2
        h = t["grids"]["hca"]
        assert h["residue"] == t["target_position"] % 256 and h["phase"] == t["target_position"] % 128
        assert h["class"] == ("contained" if t["target_position"] % 128 < 127 else "straddle_split")
        o = t["grids"]["odd"]
        assert o["residue"] == (t["target_position"] - 3) % 16 and o["phase"] == (t["target_position"] - 3) % 8
    # A model that fails where the record crosses an HCA block boundary or sits in the last 8 slots of
    # an HCA block, and nowhere else: the S = 4 sweep sees noise, the hca grid the dip.
    rng = random.Random(2)
    records = [sweep.outcome_record(t, rng.random() < (0.1 if t["grids"]["hca"]["phase"] >= 120 else 0.9))
               for t in p.trials]
    sweep.write_outcomes(tmp_path / "o.jsonl", records)
    a = sweep.analyze(p, records)
    hca = a.by_grid("hca")
    assert hca["phase_homogeneity"]["p_value"] < 1e-6
    low = [r for r in hca["phases"] if r["phase"] >= 120]
    assert low and all(r["high"] < 0.9 or r["trials"] < 3 for r in low)
    assert sum(r["trials"] for r in hca["phases"]) == len(p.trials) == sum(r["trials"] for r in hca["residues"])
    own = a.by_grid("sweep")
    assert [r["trials"] for r in own["residues"]] == [64] * 8
    assert [r["successes"] for r in own["residues"]] == [x.successes for x in a.result.residues]
    assert "grid hca (S = 128, W = 128, origin 0, M = 256)" in a.report()
    with pytest.raises(pk.InputError, match="the plan's grids are"):
        a.by_grid("csa")
    done = cli("analyze", "--plan", tmp_path / "plan.jsonl", "--outcomes", tmp_path / "o.jsonl", "--grid", "hca",
               "--out-dir", tmp_path / "out", check=False)
    assert "grid hca:\nlevel,index,trials,accuracy,successes,low,high\nphase,0," in done.stdout
    assert (tmp_path / "out" / "sweep.grid-hca.csv").read_text() == a.grid_table("hca")
    assert cli("analyze", "--plan", tmp_path / "plan.jsonl", "--outcomes", tmp_path / "o.jsonl", "--grid", "x",
               check=False).returncode == 2
    for bad, message in (("hca", "NAME:STRIDE"), ("hca:x", "stride 'x'"), ("hca:0", "stride = 0")):
        done = cli(*base[:-4], "--grid", bad, "--out", tmp_path / "bad.jsonl", check=False)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    # Plans without grids keep format /1 and their ids.
    assert sweep.plan(toy_config()).trials[0]["format"] == sweep.TRIAL_FORMAT


def test_plans_of_the_first_format_keep_their_ids_and_fields():
    # Sweep ids computed by the protocol before designs and grids existed: a plan file written then
    # is read back (read_shards compares every line with what its sweep section plans).
    config = toy_config()
    assert sweep.plan(config, configuration={"model": "old"}, needle_tokens=3).sweep_id == "aea51ff5565c6eb6"
    config.query_jitter = 4
    p = sweep.plan(config, configuration={"model": "old"}, needle_tokens=3)
    assert p.sweep_id == "bf936006459994e7"
    assert set(p.trials[0]) == {"format", "sweep_id", "trial_id", "residue", "phase", "trial", "target_position",
                                "query_position", "distance", "haystack", "seed", "layout", "record_layout", "sweep",
                                "configuration"}
    assert p.trials[0]["format"] == sweep.TRIAL_FORMAT and "design" not in p.sweep and "grids" not in p.sweep


def _friedman_by_formula(rows):
    """Friedman's statistic without ties: 12/(n k (k+1)) ΣR_j² − 3n(k+1), ranks by sorting."""
    n, k = len(rows), len(rows[0])
    totals = [0.0] * k
    for row in rows:
        for rank, j in enumerate(sorted(range(k), key=lambda j: row[j]), 1):
            totals[j] += rank
    return 12.0 / (n * k * (k + 1)) * sum(r * r for r in totals) - 3.0 * n * (k + 1)


def test_friedman_is_its_formula_and_holds_its_level_on_paired_probabilities():
    rng = random.Random(5)
    for _ in range(100):
        k = rng.choice((3, 5))
        rows = [[rng.random() for _ in range(k)] for _ in range(rng.randint(2, 30))]
        got = sweep.friedman(rows)
        want = _friedman_by_formula(rows)
        assert got["statistic"] == pytest.approx(want, rel=1e-10, abs=1e-10)
        assert got["p_value"] == pytest.approx(_chi2_tail_even(want, k - 1), rel=1e-9, abs=1e-12)
    # Ties take mean ranks: a row of equal values adds nothing; all tied: T = 0, p = 1.
    assert sweep.friedman([[0.5, 0.5, 0.5]] * 4) == {"statistic": 0.0, "dof": 2, "p_value": 1.0, "blocks": 4}
    tied = sweep.friedman([[0.1, 0.2, 0.3], [0.1, 0.2, 0.3], [0.7, 0.7, 0.7]])
    assert tied["statistic"] == pytest.approx(sweep.friedman([[0.1, 0.2, 0.3], [0.1, 0.2, 0.3]])["statistic"])
    # Level and power on a paired plan of probabilities: a content's log-odds ~ N(0.8, 2²), residue 1
    # shifted by `effect`, the outcome the probability plus noise.
    p = sweep.plan(paired_config(trials_per_residue=32), design="paired")

    def outcomes(effect, seed):
        r = random.Random(seed)
        base = {i: r.gauss(0.8, 2.0) for i in {t["trial"] for t in p.trials}}
        return [sweep.outcome_record(t, min(1.0, max(0.0, 1 / (1 + math.exp(-(base[t["trial"]] + (
            effect if t["residue"] == 1 else 0.0)))) + r.gauss(0, 0.05)))) for t in p.trials]

    null = [sweep.analyze(p, outcomes(0.0, s), kind=pk.OutcomeKind.probability).paired()["friedman"]["p_value"]
            for s in range(100)]
    assert sum(x < 0.05 for x in null) / len(null) <= 0.10
    hit = [sweep.analyze(p, outcomes(-1.0, 500 + s), kind=pk.OutcomeKind.probability) for s in range(20)]
    assert sum(a.paired()["friedman"]["p_value"] < 0.05 for a in hit) / len(hit) >= 0.8
    assert "Friedman's test" in hit[0].report()


def test_the_conditional_logistic_fit_is_mcnemars_odds_ratio_at_two_and_recovers_a_known_effect():
    rng = random.Random(3)
    for _ in range(50):
        rows = [[int(rng.random() < 0.6), int(rng.random() < 0.4)] for _ in range(rng.randint(10, 60))]
        n10 = sum(a and not b for a, b in rows)
        n01 = sum(b and not a for a, b in rows)
        if not n10 or not n01:
            continue
        fit = sweep.conditional_logistic(rows)
        assert fit["converged"] and fit["coefficients"][1] == pytest.approx(math.log(n01 / n10), abs=1e-8)
        # Its standard error is the familiar sqrt(1/n01 + 1/n10).
        assert fit["standard_errors"][1] == pytest.approx(math.sqrt(1 / n01 + 1 / n10), rel=1e-6)
    # Known truth: contents differ (log-odds sd 2), residue 1 is 2 log-odds harder, others equal.
    estimates, covered, rejected = [], 0, 0
    for s in range(60):
        rows = _simulated_paired(random.Random(100 + s), 64, 4, -2.0)
        fit = sweep.conditional_logistic(rows)
        b, se = fit["coefficients"][1], fit["standard_errors"][1]
        estimates.append(b)
        covered += abs(b + 2.0) < 1.96 * se
        rejected += fit["p_value"] < 0.05
    assert abs(float(np.median(estimates)) + 2.0) < 0.3 and covered >= 50 and rejected >= 55
    null = sum(sweep.conditional_logistic(_simulated_paired(random.Random(900 + s), 48, 4, 0.0))["p_value"] < 0.05
               for s in range(200)) / 200
    assert 0.01 <= null <= 0.10, null
    # Separation (a residue that never succeeds where others do) is flagged, not hidden.
    sep = sweep.conditional_logistic([[1, 0, 1], [1, 0, 0], [0, 0, 1], [1, 0, 1]])
    assert not sep["converged"] and sep["coefficients"][1] < -5
    p = sweep.plan(paired_config(trials_per_residue=32), design="paired")
    a = sweep.analyze(p, _content_outcomes(p, -2.5, 3))
    assert "conditional logistic fit" in a.report() and a.paired()["conditional_logistic"]["p_value"] < 1e-3


def test_the_logistic_fit_separates_another_grids_boundary():
    # A 12-token record at S = 4 always straddles the CSA grid; on an HCA grid of S = 128 it straddles
    # 11 of 128 phases. A model that loses 2.5 log-odds at an HCA boundary, and nothing else.
    config = pk.SweepConfig(stride=4, trials_per_residue=96, query_position=32767, min_distance=256, span=30000, seed=8,
                            record=pk.RecordShape(key_tokens=10, value_tokens=2))
    p = sweep.plan(config, grids=[{"name": "hca", "stride": 128}], design="single")
    rng = np.random.default_rng(6)
    records = [sweep.outcome_record(t, bool(rng.random() < 1 / (1 + math.exp(
        -(2.0 - 2.5 * (t["grids"]["hca"]["class"] != "contained")))))) for t in p.trials]
    fit = sweep.analyze(p, records).logistic()
    assert "straddle" in fit["left_out"]  # every record straddles the sweep's own grid
    c = fit["coefficients"]["straddle_hca"]
    assert abs(c["estimate"] + 2.5) < 3.5 * c["se"] and fit["straddle_hca_test"]["p"] < 1e-6
    assert fit["distance_test"]["p"] > 1e-3


def test_the_protocol_file_is_strict_json_even_when_a_fit_has_no_finite_value(tmp_path, monkeypatch):
    p = sweep.plan(paired_config(trials_per_residue=12), design="paired")
    records = [sweep.outcome_record(t, t["residue"] != 1 and (t["trial"] + t["residue"]) % 3 != 0) for t in p.trials]
    a = sweep.analyze(p, records)
    # A fit whose standard error is not finite (an information matrix that does not invert).
    monkeypatch.setattr(sweep.Analysis, "logistic", lambda self: {
        "observations": 96, "coefficients": {"x": {"estimate": 0.5, "se": float("nan"), "p": float("inf")}}})
    a.write(tmp_path)

    def refuse(name):
        raise AssertionError(f"{name} in a JSON file")

    data = json.loads((tmp_path / "sweep.protocol.json").read_text(), parse_constant=refuse)
    assert data["logistic"]["coefficients"] == {"x": {"estimate": 0.5, "se": None, "p": None}}
    assert data["design"] == "paired" and data["paired"]["cochran_q"]["p_value"] < 0.05
