"""Builds the shardfeed Python package with the project's CMake (`pip install .`).

The C++ dependencies come from Debian (scripts/install-deps.sh); this only drives CMake to build
the `_native` extension for the interpreter running pip and places it in the package.
"""
import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        out_dir = os.path.abspath(os.path.dirname(self.get_ext_fullpath(ext.name)))
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        subprocess.run(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                        "-DSHARDFEED_TESTS=OFF", "-DPython_EXECUTABLE=" + sys.executable,
                        "-DSHARDFEED_PY_DIR=" + out_dir], check=True)
        subprocess.run(["cmake", "--build", build_dir, "--target", "_native", "shardfeed_py",
                        "-j", str(os.cpu_count() or 1)], check=True)


setup(
    packages=["shardfeed"],
    package_dir={"": "python"},
    ext_modules=[Extension("shardfeed._native", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
