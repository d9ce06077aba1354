"""Regenerate every generated file of a checkout, or check that each is current.

    python -m gpufleet.regen            # rewrite the stale ones, print their paths
    python -m gpufleet.regen --check    # exit 1 naming each stale file, write nothing

The generated files and their sources:

- ``docs/schema.md``: the InfluxDB schema, from the metric catalogue (:mod:`gpufleet.schema_doc`);
- ``docs/scale.md``, the block between its ``BEGIN``/``END`` markers: series, rows and bytes for a
  fleet, from the catalogue (``docs/scale_arithmetic.py``);
- ``docs/dcgm.md``: the dcgm-exporter names the agent serves, from the catalogue
  (:mod:`gpufleet.dcgm_doc`);
- ``docs/agent.md`` and ``docs/alerting.md``, the blocks between their ``BEGIN``/``END`` comment
  lines: the config key tables, from the options the agent's sections, its collectors and the
  alert sinks declare (:mod:`gpufleet.options`);
- ``packaging/config/agent.toml``, the blocks between their ``BEGIN``/``END`` comment lines: the
  agent's own sections (``[agent]``, ``[labels]``, ``[spool]``), each exporter's and each
  collector's section, every key at its default (or its packaged value) after its help, from
  their classes;
- ``dashboards/grafana/*.json``: the Grafana dashboards (:mod:`gpufleet.dashboards.generate`); a
  JSON file there that no builder makes is stale too (``--check`` names it, a rewrite removes it).

A checkout only: the docs are not installed. ``tests/test_regen.py`` fails while any file is stale.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = "dashboards/grafana"


def _scale_arithmetic(root: Path):
    path = root / "docs" / "scale_arithmetic.py"
    name = "scale_arithmetic"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise SystemExit(f"regen: cannot load {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _schema(root: Path, current: str | None) -> str:
    from gpufleet.schema_doc import render

    return render()


def _dcgm(root: Path, current: str | None) -> str:
    from gpufleet.dcgm_doc import render

    return render()


def _scale(root: Path, current: str | None) -> str:
    mod = _scale_arithmetic(ROOT)
    if current is None or mod.BEGIN not in current or mod.END not in current:
        raise SystemExit(f"regen: {root / 'docs' / 'scale.md'} lacks the generated block's markers")
    start, end = current.index(mod.BEGIN), current.index(mod.END) + len(mod.END)
    return current[:start] + mod.render(mod.Fleet()) + current[end:]


def _block(rel: str, name: str, render: Callable[[], str], comment: tuple[str, str] = ("<!--", " -->"),
           *more: tuple[str, Callable[[], str]]) -> Callable[[Path, str | None], str]:
    """The maker of a file whose generated blocks (``name`` and any ``more``) are rewritten, the
    rest of it kept."""
    def make(root: Path, current: str | None) -> str:
        from gpufleet.options import replace_block

        text = current or ""
        try:
            for block, body in ((name, render), *more):
                text = replace_block(text, block, body(), comment)
        except ValueError as exc:
            raise SystemExit(f"regen: {root / rel}: {exc}") from None
        return text

    return make


def _agent_keys() -> str:
    from gpufleet.agent.config import keys_markdown

    return keys_markdown()


def _own_sections() -> str:
    from gpufleet.agent.config import own_sections_toml

    return own_sections_toml()


def _collector_sections() -> str:
    from gpufleet.agent.config import collector_sections_toml

    return collector_sections_toml()


def _exporter_sections() -> str:
    from gpufleet.agent.config import exporter_sections_toml

    return exporter_sections_toml()


def _sink_keys() -> str:
    from gpufleet.analyzer.alerting.config import keys_markdown

    return keys_markdown()


def _dashboard(name: str) -> Callable[[Path, str | None], str]:
    def make(root: Path, current: str | None) -> str:
        from gpufleet.dashboards import generate

        return generate.dumps(generate.BUILDERS[name]())

    return make


def targets() -> dict[str, Callable[[Path, str | None], str]]:
    """Each generated file (path relative to the checkout) -> its maker ``(root, current text)``."""
    from gpufleet.dashboards import generate

    out: dict[str, Callable[[Path, str | None], str]] = {
        "docs/schema.md": _schema,
        "docs/scale.md": _scale,
        "docs/dcgm.md": _dcgm,
        "docs/agent.md": _block("docs/agent.md", "agent keys", _agent_keys),
        "docs/alerting.md": _block("docs/alerting.md", "sink keys", _sink_keys),
        "packaging/config/agent.toml": _block("packaging/config/agent.toml", "agent sections",
                                              _own_sections, ("#", ""),
                                              ("exporter sections", _exporter_sections),
                                              ("collector sections", _collector_sections)),
    }
    for name in generate.BUILDERS:
        out[f"{GRAFANA}/{name}.json"] = _dashboard(name)
    return out


def _orphans(root: Path) -> list[str]:
    from gpufleet.dashboards import generate

    made = {f"{name}.json" for name in generate.BUILDERS}
    return sorted(f"{GRAFANA}/{p.name}" for p in (root / GRAFANA).glob("*.json") if p.name not in made)


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def stale(root: Path = ROOT) -> list[str]:
    """The generated files under ``root`` that differ from what their sources make now."""
    out = [rel for rel, make in targets().items() if _read(root / rel) != make(root, _read(root / rel))]
    return out + _orphans(root)


def write(root: Path = ROOT) -> list[str]:
    """Rewrite the stale generated files under ``root`` (remove orphans); their paths."""
    changed = []
    for rel, make in targets().items():
        path = root / rel
        want = make(root, _read(path))
        if _read(path) != want:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(want)
            changed.append(rel)
    for rel in _orphans(root):
        (root / rel).unlink()
        changed.append(rel)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpufleet.regen", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a file is stale; write nothing")
    args = ap.parse_args(argv)
    if not (ROOT / "docs").is_dir():
        print(f"regen: {ROOT} is not a checkout (no docs/): the generated files live in the repository",
              file=sys.stderr)
        return 2
    if args.check:
        bad = stale()
        for rel in bad:
            print(f"{rel} is stale", file=sys.stderr)
        if bad:
            print("run: python -m gpufleet.regen", file=sys.stderr)
            return 1
        print("generated files are current")
        return 0
    for rel in write():
        print(rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
