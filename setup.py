"""Builds the optional C speedups (runtime/transport/_speedups.c); everything else is in pyproject.toml.

optional=True: without a C compiler or Python headers the install still succeeds and the
runtime uses its pure-Python paths (slower; `ringmaster check` says which is in use)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("runtime.transport._speedups", ["runtime/transport/_speedups.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers"])])
