"""Builds the Cython extensions in csrc/ into the fastvec package.

``csrc/`` mirrors the package: ``csrc/fastvec/_core/channel.pyx`` becomes
``fastvec._core.channel``, and ``.pxd`` files beside the sources are what other modules
``cimport``. Metadata lives in pyproject.toml.

``FASTVEC_DEBUG_BUILD=1`` compiles with bounds and negative-index checks on (an
``IndexError`` instead of a wild read), for debugging; release builds have them off.
"""

import glob
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

SRC = "csrc"


def extensions():
    exts = []
    # FASTVEC_ONLY=channel,stepper builds a subset (handy while one module is being edited).
    only = [n for n in os.environ.get("FASTVEC_ONLY", "").split(",") if n]
    for path in sorted(glob.glob(os.path.join(SRC, "**", "*.pyx"), recursive=True)):
        name = os.path.splitext(os.path.relpath(path, SRC))[0].replace(os.sep, ".")
        if only and name.rsplit(".", 1)[-1] not in only:
            continue
        exts.append(
            Extension(
                name,
                [path],
                include_dirs=[np.get_include()],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                extra_compile_args=["-O3"],
            )
        )
    if not exts and not only:
        # An sdist without csrc/**/*.pyx would otherwise build a wheel with no extensions.
        raise RuntimeError("no csrc/**/*.pyx found: fastvec cannot be built without its Cython sources")
    debug = os.environ.get("FASTVEC_DEBUG_BUILD", "") not in ("", "0")
    return cythonize(
        exts,
        include_path=[SRC],
        # Generated C per build kind, so switching kinds never reuses the other's C.
        build_dir=os.path.join("build", "cython-debug" if debug else "cython"),
        compiler_directives={
            "language_level": 3,
            "boundscheck": debug,
            "wraparound": debug,
            "initializedcheck": debug,
            "cdivision": True,
        },
    )


setup(ext_modules=extensions())
