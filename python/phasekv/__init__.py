"""phasekv from Python: chunked KV-cache compression with per-phase diagnostics.

The classes and functions are the C++ library's (see include/phasekv/ and the README), bound by
the extension module ``phasekv._phasekv``:

* geometry and phase helpers: ``Geometry``, ``floor_div``, ``floor_mod``;
* write path: ``StreamConfig``, ``StreamParams``, ``RopeConfig``, ``Compressor`` (one stream,
  its ``CompressorState``, the ``Entries`` it emits) of any ``Pooling`` (or a ``Policy``);
* cache and reads: ``PagedCache`` (one, two or three streams, each of its own pooling), ``SparseReader``
  (``read``, ``read_batch``), ``ReadTrace``;
* diagnostics: ``WriteProfile``, ``SlotWeightLog``/``attribute``/``find_target``,
  ``plan_sweep``/``run_sweep``/``SweepResult``, and the submodules ``phasekv.stats``,
  ``phasekv.plot``, ``phasekv.presets`` and ``phasekv.probe`` (the synthetic needle probe);
* the conformance kit, ``phasekv.testing``: ``check`` a layer (or ``check_preset``) against every
  property phasekv promises, a ``Report`` naming the first that fails with a shrunk counterexample;
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


def _import_failure(error: ImportError) -> ImportError:
    """What to do when the extension does not load: say which interpreter, and the fix."""
    import glob
    import importlib.util
    import os

    here = f"{_sys.executable} (Python {_sys.version_info[0]}.{_sys.version_info[1]})"
    try:
        numpy_missing = importlib.util.find_spec("numpy") is None
    except (ImportError, ValueError):  # a broken or blocked NumPy
        numpy_missing = True
    if numpy_missing:
        return ImportError(f"phasekv needs NumPy, which {here} cannot import: install it (Debian: "
                           "apt-get install python3-numpy, or scripts/setup-python) or run Debian's /usr/bin/python3")
    built = [f for d in __path__ for f in glob.glob(os.path.join(d, "_phasekv*")) if not f.endswith(".pyi")]
    if not built:
        return ImportError(f"phasekv's extension module is not built for {here}: pip install --no-build-isolation "
                           "<the phasekv repository> (README, 'From Python'), or build it with scripts/test-python "
                           "and put build/python/python before python/ on PYTHONPATH")
    return ImportError(f"phasekv's extension module ({', '.join(built)}) does not load in {here}: {error} — was it "
                       "built for another interpreter? Rebuild it for this one (pip install --no-build-isolation .)")


try:
    from . import _phasekv
except ImportError as _error:
    raise _import_failure(_error) from _error
from ._phasekv import *  # noqa: F401,F403 (the C++ API, under its own names)
from ._phasekv import CapacityError, ConfigError, Error, InputError, __version__, plot, presets, probe, stats, testing

from . import _reprs  # noqa: E402

_reprs.install(_phasekv, plot, presets, probe, stats, testing)

# `import phasekv.stats` and `from phasekv.presets import ...` work like real submodules.
for _name in ("plot", "presets", "probe", "stats", "testing"):
    _sys.modules[__name__ + "." + _name] = getattr(_phasekv, _name)
del _name, _sys, _extend_path

from . import sweep  # noqa: E402 (pure Python, after the extension it builds on)
