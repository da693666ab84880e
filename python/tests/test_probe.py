"""phasekv.probe: the synthetic needle probe bound from study/needle_probe.hpp."""

import numpy as np
import pytest

import phasekv as pk

probe_module = pk.probe


def small_config(**changes):
    fields = dict(tokens=4096, records=256, channels=64, policy=probe_module.NeedlePolicy.mean_pool, stride=4,
                  window=4, seed=5)
    fields.update(changes)
    return probe_module.NeedleConfig(**fields)


def test_the_config_checks_name_the_field():
    config = small_config()
    config.validate()
    assert (config.effective_stride(), config.effective_window()) == (4, 4)
    assert small_config(policy=probe_module.NeedlePolicy.deepseek_v4_csa).effective_window() == 8
    assert small_config(policy=probe_module.NeedlePolicy.full_attention).effective_stride() == 1
    with pytest.raises(pk.ConfigError, match=r"^needle_config.channels = 6: must be a multiple of 4"):
        small_config(channels=6).validate()
    with pytest.raises(pk.ConfigError, match=r"^needle_config.records = 2000: must be at most tokens / \(2 × record length\) = 1024"):
        probe_module.NeedleProbe(small_config(records=2000))
    with pytest.raises(pk.ConfigError, match=r"^needle_config.key_slot_bias.size\(\) = 3"):
        probe_module.NeedleProbe(small_config(policy=probe_module.NeedlePolicy.concentrated_gates,
                                              key_slot_bias=[0.0, 1.0, 2.0]))


def test_trials_read_the_prepared_needles_in_one_batch_as_one_at_a_time():
    probe = probe_module.NeedleProbe(small_config())
    assert probe.config.records == 256 and probe.logit_scale > 0
    targets = np.array([100, 1003, 2050, 3001], dtype=np.int64)
    probe.prepare(targets, 4000, context=3)
    assert probe.query_position == 4000
    found, p = probe.trials(targets), probe.probabilities(list(targets))
    assert found.dtype == np.bool_ and found.shape == (4,) and p.dtype == np.float64
    assert np.all((p >= 0) & (p <= 1))
    assert [bool(probe.trials([t])[0]) for t in targets] == found.tolist()
    # Deterministic in (seed, targets, query, context); another context is another haystack.
    again = probe_module.NeedleProbe(small_config())
    again.prepare(targets, 4000, context=3)
    assert np.array_equal(again.probabilities(targets), p)
    again.prepare(targets, 4000, context=4)
    assert not np.array_equal(again.probabilities(targets), p)
    # reseed equals a probe built with that seed.
    again.reseed(6)
    again.prepare(targets, 4000, context=3)
    fresh = probe_module.NeedleProbe(small_config(seed=6))
    fresh.prepare(targets, 4000, context=3)
    assert np.array_equal(again.probabilities(targets), fresh.probabilities(targets))


def test_bad_targets_are_input_errors():
    probe = probe_module.NeedleProbe(small_config())
    with pytest.raises(pk.InputError, match=r"cannot be tried before prepare"):
        probe.trials([100])
    with pytest.raises(pk.InputError, match=r"needle_probe: target position = 101: overlaps the target at 100"):
        probe.prepare([100, 101], 4000)
    probe.prepare([100], 4000)
    with pytest.raises(pk.InputError, match=r"target_position = 102: was not among the prepared targets"):
        probe.trials([102])
    with pytest.raises(TypeError, match=r"target_positions.dtype = float64: must be int64"):
        probe.trials(np.array([100.0]))


def test_needle_sweep_finds_the_boundary_phase_of_a_mean_pool():
    config = pk.SweepConfig(stride=4, trials_per_residue=12, query_position=4095, min_distance=16, span=3000, seed=9)
    result = probe_module.needle_sweep(probe_module.NeedleProbe(small_config()), config)
    assert result.valid and result.kind == pk.OutcomeKind.binary and result.config.modulus == 8
    assert result.worst_residue % 4 == 3  # a key at phase S-1 has its value in the next block
    p = probe_module.needle_sweep(probe_module.NeedleProbe(small_config()), config, probe_module.NeedleOutcome.probability)
    assert p.kind == pk.OutcomeKind.probability
