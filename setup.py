"""The one compiled part: the analyzer's line-protocol tokenizer (everything else is in pyproject.toml).

Optional: without a C compiler and Python's headers the install goes on and the analyzer uses its
numpy tokenizer (the same rows for well-formed input, about 5x slower)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("gpufleet.analyzer._lpscan", ["analyzer/_lpscan.c"], extra_compile_args=["-O2"], optional=True)
    ]
)
