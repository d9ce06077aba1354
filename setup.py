"""Packages and the one compiled part (everything else is in pyproject.toml).

The folders the project is known by, ``agent/``, ``analyzer/`` and ``dashboards/``, are installed
as ``gpufleet.agent``, ``gpufleet.analyzer`` and ``gpufleet.dashboards`` (setuptools
``package_dir``): nothing of gpufleet lands in site-packages under a generic top-level name. In a
checkout the links ``gpufleet/agent -> ../agent`` (and the other two) show the installed layout
to tools that read files rather than import them (mypy, editors); the packages are built from
the folders, never through the links.

The analyzer's line-protocol tokenizer is C and optional: without a C compiler and Python's
headers the install goes on and the analyzer uses its numpy tokenizer (the same rows, slower)."""

from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """Also carry docs/runbooks/ in the package (gpufleet/analyzer/alerting/runbooks/): alerts and
    incident pages from a pip install link runbooks that exist."""

    def run(self):
        super().run()
        src = Path(__file__).resolve().parent / "docs" / "runbooks"
        dst = Path(self.build_lib) / "gpufleet" / "analyzer" / "alerting" / "runbooks"
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.glob("*.md")):
            self.copy_file(str(f), str(dst / f.name))

FOLDERS = {"gpufleet.agent": "agent", "gpufleet.analyzer": "analyzer", "gpufleet.dashboards": "dashboards"}

packages = find_packages(include=["gpufleet", "gpufleet.*"],
                         exclude=[p for name in FOLDERS for p in (name, f"{name}.*")])
for name, folder in FOLDERS.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(
    cmdclass={"build_py": BuildPy},
    packages=packages,
    package_dir=FOLDERS,
    ext_modules=[
        Extension("gpufleet.analyzer._lpscan", ["analyzer/_lpscan.c"], extra_compile_args=["-O2"],
                  optional=True)
    ],
)
