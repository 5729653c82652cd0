"""Builds the C speedups (runtime/transport/_speedups.c); everything else is in pyproject.toml.

Optional for an install from source: without a C compiler or Python headers the install still
succeeds and the runtime uses its pure-Python paths (slower; `ringmaster check` and the
daemon's start-up line say so, and what it costs). scripts/build sets
RINGMASTER_REQUIRE_SPEEDUPS=1: a wheel for others to install must carry them, so there a
failed compile fails the build."""

import os

from setuptools import Extension, setup

required = os.environ.get("RINGMASTER_REQUIRE_SPEEDUPS", "") not in ("", "0")
setup(ext_modules=[Extension("runtime.transport._speedups", ["runtime/transport/_speedups.c"],
                             optional=not required,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers"])])
