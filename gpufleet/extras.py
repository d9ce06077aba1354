"""Which extra of the ``gpufleet`` distribution brings a module: a command that needs a module
its installation lacks ends with one line naming the extra to install (exit 2), not a traceback."""

from __future__ import annotations

# top-level module -> the extra that installs it (pyproject.toml's [project.optional-dependencies];
# tests/test_install.py keeps the two in step)
MODULE_EXTRA = {
    "pynvml": "agent", "psutil": "agent", "opentelemetry": "agent", "influxdb_client": "agent",
    "requests": "agent", "numpy": "agent",
    "isal": "analyzer", "matplotlib": "analyzer", "jinja2": "analyzer",
}
# commands whose modules come from another extra than MODULE_EXTRA says (numpy: both have it)
COMMAND_EXTRA = {"analyze": "analyzer", "eval": "analyzer", "report": "analyzer", "sim": "analyzer",
                 "replay": "analyzer", "dashboards": "analyzer", "demo": "all"}


def command_of(argv: list[str]) -> str:
    """The subcommand named in ``argv`` (the first word that is not an option), or ""."""
    return next((a for a in argv if not a.startswith("-")), "")


def missing_extra(module: str | None, command: str = "") -> str | None:
    """The extra that installs ``module`` (a ModuleNotFoundError's ``name``), or None when the
    module is no optional dependency of gpufleet (a real bug: not to be hidden)."""
    top = (module or "").split(".")[0]
    if top not in MODULE_EXTRA:
        return None
    return COMMAND_EXTRA.get(command, MODULE_EXTRA[top])


def message(module: str | None, command: str) -> str | None:
    """One line: what is missing and the install that brings it; None when no extra does."""
    extra = missing_extra(module, command)
    if extra is None:
        return None
    what = f"'gpufleet {command}'" if command else "this command"
    return (f"{what} needs the {extra} extra (no module {(module or '').split('.')[0]!r} here): "
            f"pip install 'gpufleet[{extra}]'")
