"""Builds the Cython extensions in csrc/ into the fastvec package.

Every ``csrc/NAME.pyx`` becomes ``fastvec.NAME``; metadata lives in pyproject.toml.
"""
import glob
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def extensions():
    exts = []
    # FASTVEC_ONLY=name1,name2 builds a subset (handy while one module is being edited).
    only = [n for n in os.environ.get("FASTVEC_ONLY", "").split(",") if n]
    for path in sorted(glob.glob(os.path.join("csrc", "*.pyx"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if only and name not in only:
            continue
        exts.append(
            Extension(
                f"fastvec.{name}",
                [path],
                include_dirs=[np.get_include()],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                extra_compile_args=["-O3"],
            )
        )
    if not exts and not only:
        # An sdist without csrc/*.pyx would otherwise build a wheel with no extensions.
        raise RuntimeError("no csrc/*.pyx found: fastvec cannot be built without its Cython sources")
    return cythonize(
        exts,
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )


setup(ext_modules=extensions())
