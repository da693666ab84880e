"""phasekv from Python: chunked KV-cache compression with per-phase diagnostics.

The classes and functions are the C++ library's (see include/phasekv/ and the README), bound by
the extension module ``phasekv._phasekv``:

* geometry and phase helpers: ``Geometry``, ``floor_div``, ``floor_mod``;
* write path: ``StreamConfig``, ``StreamParams``, ``RopeConfig``, ``Compressor`` (one stream,
  its ``CompressorState``, the ``Entries`` it emits) for the policies in ``Policy``;
* cache and reads: ``PagedCache`` (one stream, or two of one policy), ``SparseReader``
  (``read``, ``read_batch``), ``ReadTrace``;
* diagnostics: ``WriteProfile``, ``SlotWeightLog``/``attribute``/``find_target``,
  ``plan_sweep``/``run_sweep``/``SweepResult``, and the submodules ``phasekv.stats``,
  ``phasekv.plot``, ``phasekv.presets`` and ``phasekv.probe`` (the synthetic needle probe);
* the sweep protocol, ``phasekv.sweep``: ``plan`` a sweep into JSONL shards any engine can run,
  ``analyze`` the outcome files, or ``run`` a plan serially or on a Dask cluster; the same as a
  command line, ``python -m phasekv plan|analyze|probe``.

Errors are ``phasekv.Error`` and its subclasses ``InputError``, ``ConfigError`` (both also
``ValueError``) and ``CapacityError``, carrying the C++ message. Arrays go in and out without
copies: inputs must be float32 (indices int64), C-contiguous; outputs are written into ``out=``
arrays or into new ones.
"""

# The module is built into <build>/python/phasekv while these files stay in python/phasekv: with
# PYTHONPATH=<build>/python:<repo>/python both directories are portions of this package.
from pkgutil import extend_path as _extend_path

__path__ = _extend_path(__path__, __name__)

import sys as _sys

from . import _phasekv
from ._phasekv import *  # noqa: F401,F403 (the C++ API, under its own names)
from ._phasekv import CapacityError, ConfigError, Error, InputError, __version__, plot, presets, probe, stats

# `import phasekv.stats` and `from phasekv.presets import ...` work like real submodules.
for _name in ("plot", "presets", "probe", "stats"):
    _sys.modules[__name__ + "." + _name] = getattr(_phasekv, _name)
del _name, _sys, _extend_path

from . import sweep  # noqa: E402 (pure Python, after the extension it builds on)
