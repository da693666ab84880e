"""The extension module of `pip install .`: python/CMakeLists.txt's `_phasekv`, built by CMake.

pyproject.toml holds the package's metadata; this file only tells setuptools how to make
phasekv/_phasekv*.so — configure the project for the interpreter that runs pip, build the one
target, copy the module where setuptools wants it (the wheel's tree, or python/phasekv for an
editable install).

Environment:
  PHASEKV_CMAKE_BUILD_DIR  an existing CMake build of the module to reuse (configured with
                           -DPHASEKV_BUILD_PYTHON=ON for this interpreter, e.g. build/python of
                           scripts/test-python): only `cmake --build` runs, so nothing compiles twice
  PHASEKV_NATIVE=0         a module for any x86-64 CPU, not only this machine's (-march=native)
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: the machine's cores)
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


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
                 "-DPHASEKV_BUILD_EXAMPLES=OFF", "-DPHASEKV_INSTALL=OFF",
                 f"-DPHASEKV_NATIVE={'ON' if native else 'OFF'}", f"-DPython3_EXECUTABLE={sys.executable}"],
                check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "_phasekv", "-j", jobs], check=True)
        built = sorted((build_dir / "python" / "phasekv").glob("_phasekv*"))
        built = [p for p in built if p.name.endswith(suffix)]
        if not built:
            sys.exit(f"phasekv: no _phasekv{suffix} in {build_dir / 'python' / 'phasekv'}: the build directory was "
                     f"configured for another interpreter than {sys.executable}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)


setup(
    version=version(),
    packages=["phasekv", "phasekv.served"],  # served: pure Python, with its example prompts
    package_dir={"": "python"},
    package_data={"phasekv": ["*.pyi", "py.typed"], "phasekv.served": ["examples/*.json"]},
    ext_modules=[Extension("phasekv._phasekv", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
