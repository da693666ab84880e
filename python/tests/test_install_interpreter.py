"""`pip install .` from a fresh venv of an interpreter phasekv cannot be built for (e.g. pyenv's
python3 first on PATH, without NumPy or wheel): setup.py must stop before pip's bdist_wheel or
CMake runs, naming the interpreter, what it lacks and the fix (Debian's /usr/bin/python3).

The second interpreter is PHASEKV_SECOND_PYTHON, or the first python3 / python3.X on PATH (or in
~/.pyenv/versions) that is not the one running the tests. The test skips where there is none, and
where that interpreter has everything (then there is no message to show)."""

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def real_interpreter(candidate: str):
    """The interpreter a command runs (a pyenv shim names another), or None when it does not run."""
    try:
        r = subprocess.run([candidate, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return os.path.realpath(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip() else None


def second_interpreter():
    ours = {os.path.realpath(sys.executable), os.path.realpath("/usr/bin/python3")}
    candidates = [os.environ["PHASEKV_SECOND_PYTHON"]] if os.environ.get("PHASEKV_SECOND_PYTHON") else []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidates += sorted(glob.glob(os.path.join(folder, "python3"))) + sorted(
            glob.glob(os.path.join(folder, "python3.[0-9]*")))
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python3")))
    for candidate in candidates:
        if candidate.endswith("-config") or not os.access(candidate, os.X_OK):
            continue
        real = real_interpreter(candidate)
        if real and real not in ours:
            return real
    return None


def test_a_fresh_venv_of_an_interpreter_without_the_build_dependencies_is_told_the_fix(tmp_path):
    python = second_interpreter()
    if python is None:
        pytest.skip("no second Python interpreter on this machine")
    # The check alone first: an interpreter that can build phasekv has nothing to be told.
    check = subprocess.run([python, str(ROOT / "setup.py"), "--phasekv-preflight"], capture_output=True, text=True,
                           cwd=ROOT, timeout=60)
    if check.returncode == 0:
        pytest.skip(f"{python} can build phasekv: {check.stdout.strip()}")
    assert f"cannot build for the interpreter {python}" in check.stderr, check.stderr

    venv = tmp_path / "venv"
    made = subprocess.run([python, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True,
                          text=True, timeout=300)
    if made.returncode != 0:
        pytest.skip(f"{python} cannot make a venv: {made.stderr.strip()[-200:]}")
    # What the README's install runs, on a copy of the project's packaging files: pip stops in
    # setup.py, so no header or source is needed, and nothing is written into the source tree.
    project = tmp_path / "project"
    (project / "include" / "phasekv").mkdir(parents=True)
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, project / name)
    shutil.copy2(ROOT / "include" / "phasekv" / "version.hpp", project / "include" / "phasekv" / "version.hpp")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PHASEKV_CMAKE_BUILD_DIR")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-build-isolation", "--no-deps", "--no-index",
                        str(project)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    output = r.stdout + r.stderr
    assert r.returncode != 0, output
    assert "phasekv: cannot build for the interpreter" in output, output
    assert "/usr/bin/python3 -m venv --system-site-packages venv" in output, output
    assert "error: invalid command 'bdist_wheel'" not in output and "-- Configuring" not in output, output
