"""The conformance kit from Python (phasekv.testing): check() on the package's policies and layer
forms, check_preset() on the DeepSeek-V4 presets, the report of a failure, and the arguments'
checks (shape-checked parameter arrays, errors naming the field)."""

import re

import numpy as np
import pytest

import phasekv as pk

T = pk.testing
P = pk.presets


def small_layer(policy, streams=1):
    g = pk.Geometry(stride=2, window=4)
    kv = pk.StreamConfig(name="kv", channels=16, kv_heads=1)
    if policy == pk.Policy.deepseek_v4:
        kv.rope = pk.RopeConfig(channels=4, base=10000.0)
    configs = [kv]
    cache = pk.CacheConfig(name="small", page_size=3, window=pk.RawWindowConfig(tokens=4, kv_heads=1, key_channels=16))
    reader = pk.ReaderConfig(name="small.reader", query_heads=2, sink=True,
                             derotate_output=policy == pk.Policy.deepseek_v4)
    if streams == 2:
        ix = pk.StreamConfig(name="indexer", channels=8, kv_heads=1, role=pk.StreamRole.indexer)
        if policy == pk.Policy.deepseek_v4:
            ix.rope = pk.RopeConfig(channels=4, base=10000.0)
        configs.append(ix)
        reader.indexer_stream, reader.indexer_heads, reader.top_k = 1, 2, 2
    return g, configs, cache, reader


def test_a_mean_layer_conforms_and_the_report_lists_every_property():
    g, streams, cache, reader = small_layer(pk.Policy.mean)
    report = T.check(pk.Policy.mean, g, streams, cache, reader)
    assert report.passed and bool(report) and report.failure is None
    assert [r.property for r in report.properties] == list(T.Property.__members__.values())
    assert all(r.outcome == T.Outcome.passed and r.cases == 6 for r in report.properties)
    assert str(report).startswith("phasekv conformance: passed")


def test_gated_layers_with_an_indexer_and_learned_parameters_conform(rng):
    g, streams, cache, reader = small_layer(pk.Policy.deepseek_v4, streams=2)
    params = [{"slot_bias": rng.standard_normal((1, 4, 16), dtype=np.float32),
               "norm_weight": rng.uniform(0.5, 1.5, 16).astype(np.float32)},
              pk.StreamParams(norm_weight=np.ones(8, np.float32))]
    report = T.check(pk.Policy.deepseek_v4, g, streams, cache, reader, params, options=T.Options(seed=3))
    assert report.passed, str(report)


def test_the_deepseek_v4_presets_conform_in_both_precisions():
    for preset in ("deepseek_v4_csa", "deepseek_v4_hca", "deepseek_v4_1_csa"):
        for precision in (False, True):
            report = T.check_preset(preset, precision)
            assert report.passed, str(report)


def test_a_report_says_what_each_property_exercised():
    report = T.check_preset("deepseek_v4_csa")
    assert report.passed and not report.selection_unexercised()
    reads = report.result(T.Property.reads).exercised
    assert reads.top_k == 512 and 0 < reads.selecting_reads <= reads.reads and reads.most_candidates > 512
    trips = report.result(T.Property.round_trips).exercised
    assert trips.forks > 0 and trips.sharing_forks == trips.forks and trips.shared_page_writes > 0
    assert 0 < trips.wrapped_windows <= trips.sequences
    assert "selecting top_k 512 of up to" in str(reads) and "exercised: " in str(report)
    # A small layer's top-2 selection is exercised by its ordinary cases; without selection nothing
    # is flagged.
    g, streams, cache, reader = small_layer(pk.Policy.mean, streams=2)
    small = T.check(pk.Policy.mean, g, streams, cache, reader)
    assert small.result(T.Property.reads).exercised.selecting_reads > 0
    g, streams, cache, reader = small_layer(pk.Policy.mean)
    plain = T.check(pk.Policy.mean, g, streams, cache, reader)
    assert plain.result(T.Property.reads).exercised.top_k == 0 and not plain.selection_unexercised()


def test_a_failure_is_named_with_a_shrunk_counterexample():
    # Tolerance 0 against double precision: fp32 pooling cannot meet it, the entries' oracle fails.
    g, streams, cache, reader = small_layer(pk.Policy.deepseek_v4)
    options = T.Options(seed=5, tolerance=T.Tolerances(entries=0.0))
    report = T.check(pk.Policy.deepseek_v4, g, streams, cache, reader, options=options)
    assert not report.passed and not bool(report)
    f = report.failure
    assert f.property == T.Property.entries and report.result(T.Property.entries).outcome == T.Outcome.failed
    assert report.result(T.Property.reads).outcome == T.Outcome.not_run
    assert "entry" in f.message and f.seed == 5
    small, big = f.counterexample.size(), f.original.size()
    assert all(small[k] <= big[k] for k in big) and small["tokens"] <= 4
    assert f.counterexample.chunks[0].dtype == np.int64 and f.counterexample.chunks[0].sum() == f.counterexample.tokens
    assert "first failing property: entries against the double-precision oracle" in str(report)
    again = T.check(pk.Policy.deepseek_v4, g, streams, cache, reader, options=options)
    assert str(again) == str(report)  # seeded: the same cases, failure and counterexample


def test_parameter_arrays_are_checked_by_shape_and_errors_name_the_field(rng):
    g, streams, cache, reader = small_layer(pk.Policy.deepseek_v4)
    check = lambda params: T.check(pk.Policy.deepseek_v4, g, streams, cache, reader, params)
    bias = rng.standard_normal((1, 4, 16), dtype=np.float32)
    with pytest.raises(pk.InputError, match=re.escape(
            "params[0]['slot_bias']: shape (4, 16), expected (kv_heads=1, window=4, gate_channels=16)")):
        check([{"slot_bias": bias[0]}])
    with pytest.raises(TypeError, match=re.escape("params[0]['norm_weight'].dtype = float64")):
        check([{"norm_weight": np.ones(16)}])
    with pytest.raises(pk.InputError, match="params\\[0\\]\\['bias'\\] = 'bias': is not a parameter"):
        check([{"bias": bias}])
    with pytest.raises(pk.InputError, match=re.escape("len(params) = 2: must be the number of streams, 1")):
        check([{}, {}])
    with pytest.raises(TypeError, match=re.escape("params[0]: must be a StreamParams or a dict of arrays")):
        check([bias])
    with pytest.raises(pk.ConfigError, match="kv.norm_weight.size"):
        check([pk.StreamParams(norm_weight=np.ones(3, np.float32))])


def test_bad_configurations_and_options_are_errors_naming_the_field():
    g, streams, cache, reader = small_layer(pk.Policy.mean)
    with pytest.raises(pk.ConfigError, match=re.escape("options.cases = -1")):
        T.check(pk.Policy.mean, g, streams, cache, reader, options=T.Options(cases=-1))
    with pytest.raises(pk.ConfigError, match="streams.size"):
        T.check(pk.Policy.mean, g, streams * 3, cache, reader)
    with pytest.raises(pk.ConfigError, match="geometry.window"):
        T.check(pk.Policy.mean, pk.Geometry(stride=4, window=2), streams, cache, reader)
    with pytest.raises(pk.InputError, match="preset = 'deepseek_v5'"):
        T.check_preset("deepseek_v5")


def test_options_from_the_environment(monkeypatch):
    monkeypatch.setenv("PHASEKV_CONFORMANCE", "long")
    monkeypatch.setenv("PHASEKV_CONFORMANCE_SEED", "17")
    o = T.Options.from_environment(T.Options(cases=3))
    assert o.effort == T.Effort.thorough and o.seed == 17 and o.cases == 3
    monkeypatch.setenv("PHASEKV_CONFORMANCE", "sometimes")
    with pytest.raises(pk.ConfigError, match="PHASEKV_CONFORMANCE = sometimes"):
        T.Options.from_environment()


def test_the_readmes_snippet_runs_as_printed(capsys):
    import pathlib

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Test your configuration", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    exec(compile(snippet, "README.md", "exec"), {})
    assert capsys.readouterr().out == "True ['passed', 'passed']\n"
