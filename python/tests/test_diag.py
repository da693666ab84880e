"""Diagnostics: write profile, read attribution, the phase sweep and its reports, the statistics
and the SVG plot — checked against NumPy recomputations and the numbers the C++ tests assert."""

import csv
import io
import json
import math
import os
import pathlib
import subprocess

import numpy as np
import pytest

import phasekv as pk
from phasekv import stats

P = pk.presets


# ---- write profile --------------------------------------------------------------------------------


def entropy(p):
    p = p[p > 0]
    return -(p * np.log(p)).sum()


def test_write_profile_of_gated_entries_equals_numpy(rng):
    g = P.deepseek_geometry(4)
    config = P.deepseek_kv_stream(4)
    bias = rng.normal(0, 0.5, size=(1, 8, 512)).astype(np.float32)
    c = pk.Compressor(pk.Policy.deepseek_v4, g, config, pk.StreamParams(slot_bias=bias))
    state = c.make_state()
    profile = pk.WriteProfile(g, kv_heads=1)
    weights = []
    for tokens in (3, 50, 150):  # 203 tokens
        payload = rng.standard_normal((tokens, 1, 2, 512), dtype=np.float32)
        e = c.append(state, payload, rng.standard_normal((tokens, 1, 2, 512), dtype=np.float32), slot_weights=True)
        assert e.slot_weights.shape == (len(e), 1, 8)
        profile.add(e)
        weights.append(e.slot_weights[:, 0, :].astype(np.float64))
    w = np.concatenate(weights)  # [entries][slots]
    n = w.shape[0]
    # Token t's weight: sum over the entries covering it; counted when all of them were seen.
    per_phase = {p: [] for p in range(4)}
    for t in range(203):
        covering = g.entries_covering(t)
        if covering.last > n:
            break
        per_phase[g.phase_of(t)].append(sum(w[j, g.slot_of(t, j)] for j in range(covering.first, covering.last)))
    for row in profile.by_phase(0):
        values = np.array(per_phase[row.phase])
        assert row.tokens == len(values)
        assert row.mean_weight == pytest.approx(values.mean(), rel=1e-12)
        assert row.stddev_weight == pytest.approx(values.std(), rel=1e-9, abs=1e-12)
        assert row.coverage == 2.0
    unpadded = w[1:] / w[1:].sum(axis=1, keepdims=True)  # entry 0 holds padding (W = 2S)
    assert profile.concentration_windows(0) == n - 1
    assert profile.static_concentration(0) == pytest.approx(math.exp(entropy(unpadded.mean(axis=0))), rel=1e-9)
    assert profile.window_concentration(0) == pytest.approx(np.mean([math.exp(entropy(a)) for a in unpadded]), rel=1e-9)
    np.testing.assert_allclose(profile.slot_profile(0), w.mean(axis=0), rtol=1e-9)
    assert 1.0 <= profile.window_concentration(0) <= profile.static_concentration(0) <= 8.0


def test_write_profile_of_mean_pooling_is_flat():
    g = pk.Geometry(stride=4, window=4)
    c = pk.Compressor(pk.Policy.mean, g, pk.StreamConfig(channels=8))
    profile = pk.WriteProfile(g, 1)
    profile.add(c.append(c.make_state(), np.ones((64, 1, 1, 8), dtype=np.float32), slot_weights=True))
    assert [r.mean_weight for r in profile.by_phase()] == pytest.approx([0.25] * 4)
    assert profile.static_concentration() == pytest.approx(4.0) and profile.window_concentration() == pytest.approx(4.0)
    with pytest.raises(pk.InputError, match=r"^write_profile: entry.slot_weights = null: emit entries with"):
        profile.add(c.append(c.make_state(), np.ones((4, 1, 1, 8), dtype=np.float32)))
    with pytest.raises(pk.InputError, match=r"^write_profile: head = 1: must lie in \[0, kv_heads = 1\)$"):
        profile.by_phase(1)


def test_host_entries_feed_the_profile_without_a_copy():
    weights = np.full((3, 1, 4), 0.25, dtype=np.float32)
    e = pk.Entries(np.arange(3, dtype=np.int64), slot_weights=weights)
    assert np.shares_memory(e.slot_weights, weights) and len(e) == 3
    profile = pk.WriteProfile(pk.Geometry(stride=4, window=4), 1)
    profile.add(e)
    assert profile.concentration_windows(0) == 3
    with pytest.raises(ValueError, match=r"slot_weights = .*: must have shape \(3, kv_heads, \.\.\.\)"):
        pk.Entries(np.arange(3, dtype=np.int64), slot_weights=weights[:2])
    with pytest.raises(TypeError, match=r"^index.dtype = int32: must be int64"):
        pk.Entries(np.arange(3, dtype=np.int32), slot_weights=weights)


# ---- read attribution -------------------------------------------------------------------------


def test_attribution_of_a_read(rng):
    g = pk.Geometry(stride=4, window=8)
    stream = pk.StreamConfig(name="kv", channels=32)
    config = pk.CacheConfig(name="a", page_size=16, pages=16)
    config.window = pk.RawWindowConfig(tokens=8, kv_heads=1, key_channels=32)
    cache = pk.PagedCache(pk.Policy.mean, g, [stream], config)
    compressor = pk.Compressor(pk.Policy.mean, g, stream)
    seq, state, log = cache.create(), compressor.make_state(), pk.SlotWeightLog(window=8)
    payload = rng.standard_normal((100, 1, 2, 32), dtype=np.float32)
    cache.append(seq, [payload], rng.standard_normal((100, 1, 32), dtype=np.float32))
    log.add(compressor.append(state, payload, slot_weights=True))
    assert log.recorded == 25 and log.has(24) and not log.has(25) and log.weights(3).shape == (8,)
    reader = pk.SparseReader(cache, pk.ReaderConfig(query_heads=2))
    trace = pk.ReadTrace()
    reader.read(cache, seq, 99, rng.standard_normal((2, 32), dtype=np.float32), trace=trace)
    a = pk.attribute(g, log, trace)
    assert a.total == pytest.approx(a.entry_mass + a.window_mass) and a.sink_mass == 0.0
    assert a.entry_mass == pytest.approx(float(trace.entry_mass.sum()), rel=1e-6)
    assert np.all(np.diff(a.token) > 0) and np.array_equal(a.phase, g.phase_of(a.token))
    # Mean pooling spreads entry j's mass evenly over its real slots; the window adds its own.
    expected = {}
    for j, m in zip(trace.selected, trace.entry_mass):
        real = range(g.first_real_slot(j), 8)
        for i in real:
            expected[g.slot_token(j, i)] = expected.get(g.slot_token(j, i), 0.0) + m / len(real)
    for k, m in enumerate(trace.window_token_mass):
        expected[trace.window_first + k] = expected.get(trace.window_first + k, 0.0) + m
    assert sorted(expected) == list(a.token)
    np.testing.assert_allclose(a.mass, [expected[t] for t in a.token], rtol=1e-6)
    assert [p.phase for p in a.phases] == [0, 1, 2, 3] and sum(p.sum for p in a.phases) == pytest.approx(a.total)
    assert a.mass_of(int(a.token[5])) == a.mass[5] and a.mass_of(10_000) == 0.0
    target = pk.find_target(g, trace, 95)
    assert target.in_window and target.selected and target.phase == 3 and target.rank >= 0
    assert not pk.find_target(g, trace, 50).in_window


# ---- phase sweep --------------------------------------------------------------------------------


def test_plan_sweep_matches_its_contract():
    config = pk.SweepConfig(stride=4, trials_per_residue=20, query_position=10_000, span=4096, min_distance=64, seed=3)
    assert config.resolved_modulus() == 8 and config.first_target() == 10_000 - 64 - 4096
    plan = pk.plan_sweep(config)
    assert len(plan) == 8 * 20
    assert all(p.target_position % 8 == p.residue and p.query_position == 10_000 for p in plan)
    assert all(config.first_target() <= p.target_position <= config.last_target() for p in plan)
    assert pk.plan_sweep(config) == plan  # deterministic
    config.seed = 4
    assert pk.plan_sweep(config) != plan and set(pk.plan_sweep(config)) == set(plan)  # the order only
    rows = pk.plan_position_statistics(plan, 8)
    assert [r.count for r in rows] == [20] * 8
    assert max(r.mean for r in rows) - min(r.mean for r in rows) <= 8 / 20  # M / trials_per_residue
    with pytest.raises(pk.ConfigError, match=r"^span = 10: must be at least 3·modulus = 24"):
        pk.plan_sweep(pk.SweepConfig(stride=4, trials_per_residue=20, query_position=1000, span=10))


MASK = (1 << 64) - 1


def splitmix64(state):
    z = (state + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def toy_model_retrieves(seed, needle, query, prompt):
    """examples/host_sweep.cpp's toy_model, in Python integers."""
    state = seed ^ ((needle * 0x9E3779B97F4A7C15) & MASK) ^ ((query << 20) & MASK) ^ prompt
    luck = (splitmix64(state) >> 11) * 2.0**-53
    return luck < (0.90, 0.85, 0.80, 0.45)[needle % 4]


def host_sweep_program():
    explicit = os.environ.get("PHASEKV_HOST_SWEEP")
    if explicit:
        return pathlib.Path(explicit)
    # <build>/python/phasekv/_phasekv*.so -> <build>/examples/host_sweep
    return pathlib.Path(pk._phasekv.__file__).resolve().parents[2] / "examples" / "host_sweep"


def test_a_sweep_from_python_reports_what_the_cpp_example_reports():
    program = host_sweep_program()
    if not program.exists():
        if os.environ.get("PHASEKV_HOST_SWEEP"):  # scripts/test-python builds it: missing is a failure
            pytest.fail(f"PHASEKV_HOST_SWEEP={program} does not exist")
        pytest.skip(f"{program} not built (cmake --build <build> --target host_sweep)")
    expected = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout
    config = pk.SweepConfig(stride=4, trials_per_residue=64, query_position=32767, min_distance=256, span=32000, seed=1)
    calls = []

    def trial(p):
        calls.append(p)
        return toy_model_retrieves(1, p.target_position, p.query_position, p.trial)

    result = pk.run_sweep(config, trial)
    assert calls == pk.plan_sweep(config)  # in the plan's order, once each
    assert result.to_table() == expected
    assert result.valid and result.kind == pk.OutcomeKind.binary and result.config.modulus == 8
    assert (result.best_residue, result.worst_residue, result.period.period) == (4, 7, 4.0)
    # The summary is the statistics module's, applied to the per-residue counts.
    successes = [r.successes for r in result.residues]
    chi = stats.chi_square_homogeneity(successes, [64] * 8)
    assert (chi.statistic, chi.p_value) == (result.homogeneity.statistic, result.homogeneity.p_value)
    w = stats.wilson_interval(successes[3], 64)
    r = result.residues[3]
    assert (w.estimate, w.low, w.high) == (r.estimate, r.ci_low, r.ci_high)
    summary = stats.summarize_residues([r.estimate for r in result.residues])
    assert (summary.mean, summary.gap_points) == (result.mean, result.gap_points)


def test_sweep_reports_and_errored_trials():
    config = pk.SweepConfig(stride=2, trials_per_residue=12, query_position=500, span=100, seed=7)

    def trial(p):
        if p.trial == 0 and p.residue == 1:
            raise ValueError("the engine fell over, twice")
        return 0.25 + 0.5 * (p.target_position % 2)

    result = pk.run_sweep(config, trial, kind=pk.OutcomeKind.probability)
    assert result.errored_trials == 1 and result.residues[1].errored == 1
    assert result.first_error.endswith("threw: ValueError: the engine fell over, twice")
    assert result.homogeneity.test == "anova" and result.valid
    report = json.loads(result.to_json())
    assert report["errored_trials"] == 1 and report["residues"][1]["valid"] == 11
    table = list(csv.reader(io.StringIO(result.to_csv())))
    assert table[0][:6] == ["residue", "phase", "layout", "planned", "valid", "errored"] and len(table) == 5
    summary = dict(csv.reader(io.StringIO(result.to_summary_csv())))
    assert summary["key"] == "value" and summary["errored_trials"] == "1" and summary["test"] == "anova"
    assert summary["first_error"] == result.first_error  # a field with commas, quoted
    assert result.has_period() and summary["dominant_period"] == "2" and report["dominant_period"]["period"] == 2
    # A binary sweep takes only bools: a float is an errored trial, not "true".
    strict = pk.run_sweep(config, lambda p: 0.7)
    assert strict.errored_trials == 48 and not strict.valid and not strict.has_period()
    assert "returned 0.7, not a bool" in strict.first_error
    assert pk.run_sweep(config, lambda p: np.bool_(p.residue == 0)).residues[0].successes == 12


def test_keyboard_interrupt_stops_a_sweep():
    config = pk.SweepConfig(stride=2, trials_per_residue=12, query_position=500, span=100)
    calls = []

    def trial(p):
        calls.append(p)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return True

    with pytest.raises(KeyboardInterrupt):
        pk.run_sweep(config, trial)
    assert len(calls) == 5


# ---- statistics: the values the C++ tests assert (tests/test_diag_statistics.cpp) ----------------


def test_statistics_equal_the_cpp_tests_values():
    w = stats.wilson_interval(8, 10, 1.96)
    assert w.estimate == 0.8
    assert w.low == pytest.approx(0.49015684672072339, rel=1e-13)
    assert w.high == pytest.approx(0.94331905201930666, rel=1e-13)
    b = stats.wilson_interval(112, 256)
    assert b.low == pytest.approx(0.37809929934301558, rel=1e-13)
    assert b.high == pytest.approx(0.49874868271021834, rel=1e-13)
    assert stats.z_95 == 1.959963984540054
    t = stats.chi_square_homogeneity([30, 45, 20], [60, 70, 50])
    assert t.statistic == pytest.approx(7.1808934099955772, rel=1e-13) and t.dof == 2
    assert t.p_value == pytest.approx(0.027586004864267956, rel=1e-12)
    t = stats.chi_square_homogeneity([112, 178, 169, 76, 115, 179, 165, 84], [256] * 8)
    assert t.statistic == pytest.approx(201.36466537880382, rel=1e-12)
    assert t.p_value == pytest.approx(5.8997694265636966e-40, rel=1e-10)
    a = stats.anova_homogeneity([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    assert (a.f_statistic, a.dof_between, a.dof_within) == (pytest.approx(27.0, rel=1e-14), 2, 6)
    assert a.p_value == pytest.approx(0.001, rel=1e-12)
    a = stats.anova_homogeneity([[0.2, 0.4, 0.3, 0.5], [0.6, 0.7, 0.65], [0.3, 0.2, 0.25, 0.35, 0.4]])
    assert a.f_statistic == pytest.approx(13.910156249999992, rel=1e-12)
    assert stats.fold_fraction([1, 0, 0, 0, 1, 0, 0, 0], 2) == pytest.approx(1 / 3, rel=1e-12)
    p = stats.dominant_period([1, 0, 0, 0, 1, 0, 0, 0])
    assert (p.period, p.frequency, p.flat) == (4.0, 2, False)
    flat = stats.dominant_period([0.5] * 8, standard_errors=[0.1] * 8)
    assert flat.flat and flat.period == 0.0
    s = stats.summarize_residues([0.9, 0.4, 0.9, 0.5])
    assert (s.best_residue, s.worst_residue, s.gap_points, s.mean) == (0, 1, pytest.approx(50.0), pytest.approx(0.675))
    assert stats.chi_square_upper_tail(3.8414588206941258653, 1) == pytest.approx(0.05, rel=1e-12)
    assert stats.f_upper_tail(3.8852938346523942148, 2, 12) == pytest.approx(0.05, rel=1e-12)
    assert stats.log_gamma(5.0) == pytest.approx(math.log(24.0), rel=1e-15)
    assert stats.regularized_gamma_p(3.0, 2.0) + stats.regularized_gamma_q(3.0, 2.0) == pytest.approx(1.0, rel=1e-14)
    assert stats.regularized_beta(2, 3, 0.25) == pytest.approx(6 * 0.25**2 * 0.75**2 + 4 * 0.25**3 * 0.75 + 0.25**4)
    with pytest.raises(pk.InputError, match=r"^wilson_interval: successes = 11: must lie in \[0, trials = 10\]$"):
        stats.wilson_interval(11, 10)
    with pytest.raises(pk.InputError, match=r"^summarize_residues: accuracy\[0\] = 40: must be a fraction"):
        stats.summarize_residues([40.0, 0.5])


# ---- plot -------------------------------------------------------------------------------------


def test_svg_line_plot():
    from phasekv import plot

    points = [plot.PlotPoint(x=i, y=50 + i, low=45, high=60) for i in range(8)]
    series = plot.PlotSeries(label="mean <S=4>", points=points)
    axes = plot.PlotAxes(title="accuracy & phase", x_max=8.0, x_ticks=[(0.0, "0"), (4.0, "S")])
    svg = plot.svg_line_plot([series, plot.PlotSeries(label="control", dashed=True)], axes)
    assert svg.startswith("<svg ") and svg.rstrip().endswith("</svg>")
    assert "accuracy &amp; phase" in svg and "mean &lt;S=4&gt;" in svg and "stroke-dasharray" in svg
    assert plot.svg_escape("a<'b'>") == "a&lt;&apos;b&apos;&gt;"
    with pytest.raises(pk.ConfigError, match=r"^width = 10: must be in \[400, 10000\] pixels$"):
        plot.svg_line_plot([], plot.PlotAxes(width=10))
    assert [plot.format_p_value(p) for p in (0.042, 2e-5, 1e-63)] == ["p=0.042", "p<1e-4", "p<1e-6"]
    # An open marker is not joined, and the legend explains it.
    hollow = [plot.PlotPoint(x=i, y=50, hollow=(i == 2)) for i in range(4)]
    svg = plot.svg_line_plot([plot.PlotSeries(label="s", points=hollow)], plot.PlotAxes(x_max=4.0, dodge_px=3.0))
    assert svg.count("<polyline") == 1 and "open: " + plot.PlotAxes().open_marker_meaning in svg


def test_a_sweep_as_a_plot_series():
    from phasekv import plot

    config = pk.SweepConfig(stride=4, trials_per_residue=10, query_position=5000, span=200)
    result = pk.run_sweep(config, lambda p: p.residue % 4 != 3)
    series = plot.phase_sweep_series(result, "S=4")
    assert series.label == "S=4" and [p.x for p in series.points] == [(r + 1) / 4 for r in range(8)]
    assert [p.y for p in series.points] == [0.0 if r % 4 == 3 else 100.0 for r in range(8)]
    axes = plot.PlotAxes(x_max=2.0, x_boundaries=[0.0, 1.0, 2.0, 3.0])
    assert plot.svg_line_plot([series], axes).count('class="boundary"') == 3  # 3.0 lies outside


def test_remaining_sweep_accessors():
    config = pk.SweepConfig(stride=4, trials_per_residue=10, query_position=5000, span=200, min_distance=10)
    config.validate()
    assert pk.SweepConfig.minimum_trials == 10
    p = pk.Placement(residue=3, trial=1, target_position=4795, query_position=5000)
    assert p.distance() == 205 and p == pk.Placement(3, 1, 4795, 5000) and "residue=3" in repr(p)
    rows = pk.plan_position_statistics([p, pk.Placement(3, 2, 4803, 5000)], 8)
    assert (rows[3].count, rows[3].mean, rows[3].variance) == (2, 4799.0, 16.0) and rows[0].count == 0
    result = pk.run_sweep(config, lambda q: q.residue != 3)
    h = result.homogeneity
    # approximate: every residue's expected failures, 10 × 1/8, are below 5
    assert (h.test, h.dof, h.dof_within, h.approximate) == ("chi_square", 7, 0, True) and h.p_value < 1e-10
    assert result.invalid_reason == "" and result.first_error == "" and result.period.period == 8.0
    r = result.residues[3]
    assert (r.residue, r.planned, r.valid, r.errored, r.successes, r.estimate, r.ci_low) == (3, 10, 10, 0, 0, 0.0, 0.0)
    assert result.residues[0].ci_high == 1.0
    from phasekv import plot

    with pytest.raises(pk.ConfigError, match=r"^y_max = 1: must be finite and greater than y_min = 5$"):
        plot.PlotAxes(y_min=5.0, y_max=1.0)  # refused when built
    axes = plot.PlotAxes(y_min=0.0, y_max=1.0)
    axes.y_min = 5.0
    with pytest.raises(pk.ConfigError, match=r"^y_max = 1: must be finite and greater than y_min = 5$"):
        axes.validate()


def test_remaining_diagnostic_accessors(rng):
    g = pk.Geometry(stride=2, window=4)
    c = pk.Compressor(pk.Policy.mean, g, pk.StreamConfig(channels=4, kv_heads=2))
    e = c.append(c.make_state(), np.ones((10, 2, 2, 4), dtype=np.float32), slot_weights=True)
    profile = pk.WriteProfile(g, 2)
    profile.add(e)
    assert np.allclose(profile.unpadded_slot_profile(1), 0.25) and profile.by_phase(1)[0].phase == 0
    log = pk.SlotWeightLog(window=4, head=1)
    log.add(e)
    assert (log.window, log.head, log.recorded) == (4, 1, 5)
    log.clear()
    assert log.recorded == 0 and not log.has(0)
    log.add(e)
    trace = pk.ReadTrace()
    assert (trace.candidates, trace.selected.size, trace.window_mass, trace.sink_mass) == (0, 0, 0.0, 0.0)
    a = pk.attribute(g, log, trace)
    assert a.token.size == a.from_entries.size == a.from_window.size == 0 and a.total == 0.0
    assert [(p.phase, p.tokens, p.sum, p.mean) for p in a.phases] == [(0, 0, 0.0, 0.0), (1, 0, 0.0, 0.0)]
    t = pk.find_target(g, trace, 3)
    assert (t.token, t.phase, t.covering_candidates, t.covering_selected, t.selected, t.rank, t.entry,
            t.entry_mass, t.in_window) == (3, 1, 0, 0, False, -1, -1, 0.0, False)
