"""How `import phasekv` fails when it cannot work: the message names the interpreter and the fix
(scripts/test-pip checks the installed package itself)."""

import os
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1]  # python/: the package's .py files, no module


def import_error(code: str, path: str) -> str:
    env = dict(os.environ, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", code + "\nimport phasekv"], env=env, capture_output=True, text=True,
                       cwd="/")
    assert r.returncode != 0, r.stdout
    return r.stderr.strip().splitlines()[-1]


def test_a_missing_extension_module_names_the_build_to_run():
    message = import_error("", str(SOURCE))
    assert "phasekv's extension module is not built for " + sys.executable in message
    assert "pip install --no-build-isolation" in message and "partially initialized" not in message


def test_an_interpreter_without_numpy_is_told_so():
    here = os.pathsep.join(str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    message = import_error("import sys; sys.modules['numpy'] = None", here)
    assert "phasekv needs NumPy, which " + sys.executable + " (Python" in message and "cannot import" in message
    assert "python3-numpy" in message
