"""The extension module of `pip install .`: python/CMakeLists.txt's `_phasekv`, built by CMake.

pyproject.toml holds the package's metadata; this file only tells setuptools how to make
phasekv/_phasekv*.so — configure the project for the interpreter that runs pip, build the one
target, copy the module where setuptools wants it (the wheel's tree, or python/phasekv for an
editable install).

Before anything is configured, the interpreter running this file is checked for what the build
and the package need — its Python.h, pybind11, NumPy, and setuptools' bdist_wheel — and a missing
piece stops the install with the interpreter's path and the fix (typically: make the venv with
Debian's /usr/bin/python3 after scripts/setup-python), not with a failure deep inside pip.
`python3 setup.py --phasekv-preflight` runs only that check (scripts/setup-python uses it).

The module is 11 translation units, a few minutes on 2 cores. pip hides a build's output unless
run with -v; so that a long build is not silent, a line per compiled file also goes to the
terminal (/dev/tty) when there is one.

Environment:
  PHASEKV_CMAKE_BUILD_DIR  an existing CMake build of the module to reuse (configured with
                           -DPHASEKV_BUILD_PYTHON=ON for this interpreter, e.g. build/python of
                           scripts/test-python): only `cmake --build` runs, so nothing compiles twice
  PHASEKV_NATIVE=0         a module for any x86-64 CPU, not only this machine's (-march=native)
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: the machine's cores, os.cpu_count(); each job
                           needs about 1.5 GB of memory at its peak)
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
DEBIAN_PYTHON = "/usr/bin/python3"
PYBIND11_CMAKE_DIRS = ("/usr/lib/cmake/pybind11", "/usr/share/cmake/pybind11", "/usr/local/lib/cmake/pybind11")


def preflight_problems() -> list:
    """What this interpreter lacks to build and run phasekv, each with its fix; empty when nothing."""
    problems = []
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():
        problems.append(f"no Python.h for it (looked in {header.parent}): install its development headers "
                        "(Debian: apt-get install python3-dev)")
    try:
        import pybind11  # noqa: F401  (its CMake directory)
    except ImportError:
        if not any((Path(d) / "pybind11Config.cmake").is_file() for d in PYBIND11_CMAKE_DIRS):
            problems.append("no pybind11 (neither its Python package nor its CMake package): "
                            "apt-get install pybind11-dev python3-pybind11, or pip install pybind11")
    try:
        import numpy  # noqa: F401
    except ImportError:
        problems.append("no NumPy, which the package needs at run time: apt-get install python3-numpy "
                        "(and a venv made with --system-site-packages), or pip install numpy")
    try:
        import setuptools.command.bdist_wheel  # noqa: F401  (setuptools >= 70.1 carries it)
    except ImportError:
        try:
            import wheel  # noqa: F401
        except ImportError:
            problems.append("no `wheel` package, so pip fails with \"invalid command 'bdist_wheel'\": "
                            "apt-get install python3-wheel, or pip install wheel")
    if shutil.which("cmake") is None:
        problems.append("no cmake on PATH: apt-get install cmake (scripts/setup-python)")
    return problems


def preflight() -> None:
    """Stops with the interpreter's problems and their fix before pip or CMake runs."""
    problems = preflight_problems()
    if not problems:
        return
    lines = [f"phasekv: cannot build for the interpreter {sys.executable} (Python {sys.version.split()[0]}):"]
    lines += [f"  - {p}" for p in problems]
    if os.path.realpath(sys.executable) != os.path.realpath(DEBIAN_PYTHON) and Path(DEBIAN_PYTHON).is_file():
        lines += ["Fix: build with Debian's interpreter, which scripts/setup-python equips:",
                  f"  scripts/setup-python && {DEBIAN_PYTHON} -m venv --system-site-packages venv && "
                  "venv/bin/pip install --no-build-isolation .",
                  "(a `python3` first on PATH may be pyenv's or another interpreter without these packages)"]
    else:
        lines += ["Fix: install what is listed above for this interpreter (scripts/setup-python does on Debian)."]
    sys.exit("\n".join(lines))


class _progress:
    """Relays CMake's "[ 40%] Building CXX object …/probe.cpp.o" lines to the terminal, which pip's
    captured output hides; silent where there is no terminal."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.tty = None
        if not sys.stderr.isatty():
            try:
                self.tty = open("/dev/tty", "w")
            except OSError:
                self.tty = None

    def say(self, text: str) -> None:
        line = f"phasekv: {text} ({time.monotonic() - self.start:.0f} s)"
        print(line, file=sys.stderr, flush=True)
        if self.tty is not None:
            try:
                print(line, file=self.tty, flush=True)
            except OSError:
                self.tty = None


def version() -> str:
    text = (ROOT / "include" / "phasekv" / "version.hpp").read_text(encoding="utf-8")
    return re.search(r'#define PHASEKV_VERSION_STRING "([^"]+)"', text).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        reuse = os.environ.get("PHASEKV_CMAKE_BUILD_DIR")
        build_dir = Path(reuse).resolve() if reuse else Path(self.build_temp).resolve() / "cmake"
        if shutil.which("cmake") is None:
            sys.exit("phasekv: building the module needs cmake (Debian: apt-get install cmake, or scripts/setup-python)")
        if reuse:
            if not (build_dir / "CMakeCache.txt").is_file():
                sys.exit(f"phasekv: PHASEKV_CMAKE_BUILD_DIR = {reuse}: not a configured CMake build directory")
        else:
            native = os.environ.get("PHASEKV_NATIVE", "1") not in ("0", "OFF", "off", "false")
            subprocess.run(
                ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                 "-DPHASEKV_BUILD_PYTHON=ON", "-DPHASEKV_BUILD_TESTS=OFF", "-DPHASEKV_BUILD_BENCHMARKS=OFF",
                 "-DPHASEKV_BUILD_EXAMPLES=OFF", "-DPHASEKV_BUILD_TOOLS=OFF", "-DPHASEKV_INSTALL=OFF",
                 f"-DPHASEKV_NATIVE={'ON' if native else 'OFF'}", f"-DPython3_EXECUTABLE={sys.executable}"],
                check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        progress = _progress()
        progress.say(f"compiling the module with {jobs} jobs (CMAKE_BUILD_PARALLEL_LEVEL; "
                     "10 files, a few minutes on 2 cores)")
        build = subprocess.Popen(["cmake", "--build", str(build_dir), "--target", "_phasekv", "-j", jobs],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        for line in build.stdout:
            sys.stdout.write(line)
            step = re.match(r"\[\s*(\d+)%\] (Building CXX object|Linking CXX shared module)\s+(\S+)", line)
            if step:
                what = ("compiling " + re.sub(r"\.o$", "", Path(step.group(3)).name)) if step.group(2).startswith("Building") \
                    else "linking"
                progress.say(f"[{step.group(1):>3}%] {what}")
        if build.wait() != 0:
            sys.exit(f"phasekv: the module's build failed (cmake --build {build_dir}); its output is above "
                     "(pip shows it with -v)")
        progress.say("module built")
        built = sorted((build_dir / "python" / "phasekv").glob("_phasekv*"))
        built = [p for p in built if p.name.endswith(suffix)]
        if not built:
            sys.exit(f"phasekv: no _phasekv{suffix} in {build_dir / 'python' / 'phasekv'}: the build directory was "
                     f"configured for another interpreter than {sys.executable}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)


if __name__ == "__main__" and sys.argv[1:] == ["--phasekv-preflight"]:
    preflight()
    print(f"phasekv: {sys.executable} can build and run phasekv")
    sys.exit(0)
# Every pip route (get_requires, egg_info, bdist_wheel, editable) runs this file first; an sdist
# compiles nothing and needs none of it.
if "sdist" not in sys.argv:
    preflight()

setup(
    version=version(),
    packages=["phasekv", "phasekv.served"],  # served: pure Python, with its example prompts
    package_dir={"": "python"},
    package_data={"phasekv": ["*.pyi", "py.typed"], "phasekv.served": ["examples/*.json"]},
    ext_modules=[Extension("phasekv._phasekv", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
