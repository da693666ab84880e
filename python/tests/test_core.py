"""Geometry and phase helpers, RoPE configs, and how config structs behave from Python."""

import copy

import numpy as np
import pytest

import phasekv as pk


def test_geometry_fields_and_derived_values():
    g = pk.Geometry(stride=4, window=8, origin=1, anchor=pk.AnchorMode.block_end)
    assert (g.stride, g.window, g.origin, g.anchor) == (4, 8, 1, pk.AnchorMode.block_end)
    assert g.lead == 3 and g.branches == 2 and g.boundary_phase == 3
    g.validate()
    assert pk.Geometry() == pk.Geometry(stride=1, window=1)
    assert g != pk.Geometry(stride=4, window=8)


def test_geometry_formulas_match_the_header():
    # core/geometry.hpp: u = t + lead, block = floor(u / S), window of entry j = [(j+1)S - W - lead, (j+1)S - lead).
    for origin in range(3):
        g = pk.Geometry(stride=3, window=7, origin=origin)
        lead = (3 - origin) % 3
        for t in range(0, 40):
            assert g.phase_of(t) == (t - origin) % 3
            assert g.block_of(t) == (t + lead) // 3
            covering = g.entries_covering(t)
            assert list(covering) == [(t + lead) // 3, (t + lead + 7) // 3]
            assert g.coverage(t) == len(covering)
            for j in range(covering.first, covering.last):
                assert j in covering
                assert g.window_start(j) <= t < g.window_start(j) + 7
        for j in range(10):
            assert g.window_start(j) == (j + 1) * 3 - 7 - lead
            assert g.block_start(j) == j * 3 - lead and g.block_end(j) == (j + 1) * 3 - 1 - lead
            assert g.slot_token(j, 2) == g.window_start(j) + 2 and g.slot_of(g.slot_token(j, 5), j) == 5
            assert g.first_real_slot(j) == max(0, -g.window_start(j))
            assert g.is_padding(j, 0) == (g.window_start(j) < 0)
            assert g.completion_token(j) == g.block_end(j)
            assert g.anchor_position(j) == g.block_start(j)
        assert [g.branch_of_slot(i) for i in range(7)] == [(7 - 1 - i) // 3 for i in range(7)]
        assert g.completed_entries(10) == (10 + lead) // 3
        assert g.visible_entries(9) == g.completed_entries(10)


def test_phase_helpers_take_arrays():
    g = pk.Geometry(stride=4, window=8, origin=2)
    t = np.arange(-8, 40, dtype=np.int64)
    assert np.array_equal(g.phase_of(t), (t - 2) % 4)
    assert np.array_equal(g.block_of(t), (t + 2) // 4)
    assert np.array_equal(g.coverage(t), [g.coverage(int(x)) for x in t])
    assert np.array_equal(pk.Geometry.residue_of(t, 8), t % 8)
    assert np.array_equal(pk.floor_div(t, 3), t // 3) and np.array_equal(pk.floor_mod(t, 3), t % 3)
    assert pk.floor_div(-7, 2) == -4 and pk.floor_mod(-7, 2) == 1


def test_config_structs_take_keywords_repr_and_copy():
    c = pk.StreamConfig(name="k", channels=64, kv_heads=2, role=pk.StreamRole.key)
    assert (c.name, c.channels, c.kv_heads, c.role) == ("k", 64, 2, pk.StreamRole.key)
    assert c.inputs == pk.InputLayout.per_branch and c.norm_eps == 1e-6  # C++ defaults
    assert repr(c).startswith("StreamConfig(name='k', role=StreamRole.key, channels=64")
    # help() shows the fields with their types and defaults, not **kwargs.
    assert pk.StreamConfig.__init__.__doc__.startswith(
        "__init__(self, *, name: str = 'stream', role: StreamRole = StreamRole.key_value, channels: int = 0, ")
    assert "geometry: Geometry = Geometry(stride=1, window=1, origin=0, anchor=AnchorMode.block_start)" in \
        pk.LayerShape.__init__.__doc__
    assert f"indexer_stream: int = {pk.FROM_ROLES}," in pk.ReaderConfig.__init__.__doc__  # streams follow the roles
    with pytest.raises(TypeError, match="unexpected keyword argument 'chanels'"):
        pk.StreamConfig(chanels=3)
    with pytest.raises(AttributeError):
        c.chanels = 3
    # Nested structs come back by reference: this changes c.
    c.rope.channels = 16
    c.rope.yarn.enabled = True
    assert c.rope.channels == 16 and c.rope.yarn.enabled
    d = copy.deepcopy(c)
    d.rope.channels = 8
    assert c.rope.channels == 16 and d.rope.channels == 8
    assert copy.copy(pk.Geometry(stride=2, window=4)) == pk.Geometry(stride=2, window=4)


def test_rope_config_and_yarn_frequencies():
    r = pk.presets.deepseek_v4_compressed_rope()
    assert (r.channels, r.base, r.layout) == (64, 160000.0, pk.RopeLayout.interleaved)
    assert (r.yarn.enabled, r.yarn.factor, r.yarn.original_context) == (True, 16.0, 65536)
    r.validate("rope", 512)
    theta = r.inverse_frequencies(512)
    assert theta.dtype == np.float64 and theta.shape == (32,)
    # core/rope.hpp's YaRN, written out again here from its formula.
    k = np.arange(32)
    base = 160000.0 ** (-2.0 * k / 64)
    dim = lambda rotations: 64 * np.log(65536 / (rotations * 2 * np.pi)) / (2 * np.log(160000.0))
    low, high = max(np.floor(dim(32.0)), 0.0), min(np.ceil(dim(1.0)), 63.0)
    ramp = np.clip((k - low) / (high - low), 0, 1)
    assert np.allclose(theta, base / 16 * ramp + base * (1 - ramp), rtol=1e-15, atol=0)


def test_version():
    assert pk.__version__ == "0.1.0" and pk._phasekv.version == 100


def test_entry_range_and_config_validation():
    r = pk.EntryRange(2, 5)
    assert len(r) == 3 and 4 in r and 5 not in r and r == pk.EntryRange(2, 5) and repr(r) == "EntryRange(2, 5)"
    with pytest.raises(pk.ConfigError, match=r"^cache.page_size = 0: must be at least 1$"):
        pk.CacheConfig(page_size=0)  # refused when built
    config = pk.CacheConfig(page_size=4)
    config.page_size = 0  # made invalid afterwards: validate() (and every use) names it
    with pytest.raises(pk.ConfigError, match=r"^cache.page_size = 0: must be at least 1$"):
        config.validate()
    shape = pk.LayerShape(geometry=pk.Geometry(stride=2, window=2),
                          streams=[pk.StreamShape(name="kv", channels=8, storage=pk.StorageType.f16)],
                          window=pk.RawWindowConfig(tokens=4, key_channels=8))
    assert shape.streams[0].storage == pk.StorageType.f16 and not shape.streams[0].applies_rope
    reader = pk.SparseReader(shape, pk.ReaderConfig(query_heads=2))
    assert reader.output_floats == 16
