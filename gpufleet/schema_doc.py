"""Generate ``docs/schema.md`` (the InfluxDB schema) from the catalogue.

``python -m gpufleet.schema_doc`` prints it; ``--write docs/schema.md`` writes it; ``--check
docs/schema.md`` exits 1 when the file is out of date. ``python -m gpufleet.regen`` rewrites it with
the other generated files, and ``tests/test_regen.py`` keeps the committed file in step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpufleet import catalogue

TAG_DOC = {
    "host": "node name",
    "gpu": "GPU index on the node (NVML order)",
    "uuid": "GPU UUID (`GPU-...`)",
    "model": "product name (`NVIDIA H200`)",
    "link": "NVLink link number",
    "type": "event type (`xid`, `ecc_sbe`, `ecc_dbe`, ...)",
    "source": "where the event was read (`nvml`, `kmsg`)",
    "sensor": "BMC sensor name",
    "sensor_type": "BMC sensor type (Temperature, Fan, Power, ...)",
    "unit": "unit of the BMC reading",
    "collector": "agent collector name",
    "exporter": "agent exporter name",
    "cluster": "operator label",
    "rack": "operator label",
    "kind": "incident kind (`thermal_throttle`, `nvlink_degradation`, `gpu_lost`, ...)",
    "severity": "`critical`, `warning` or `info` (an informational record, never paged)",
}

def _rows(measurement: str) -> str:
    m = catalogue.MEASUREMENTS.get(measurement)
    return m.rows if m else ""


def _sentence(s: str) -> str:
    return (s[:1].upper() + s[1:] + ".") if s else ""


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _otel(m: catalogue.Metric) -> str:
    if not m.attributes:
        return f"`{m.otel}`"
    attrs = ", ".join(f"{k}={v}" for k, v in m.attributes.items())
    return f"`{m.otel}` {{{attrs}}}"


def render() -> str:
    out = [
        "# InfluxDB schema",
        "",
        "<!-- Generated from gpufleet/catalogue.toml by `python -m gpufleet.regen`; do not edit by hand. -->",
        "",
        "Every producer (the agent, the simulator) writes exactly these measurements, tags and fields;",
        "every consumer (the analyzer, dashboards, outside tools) reads them. The catalogue",
        "(`gpufleet/catalogue.toml`) is the source; this page is generated from it.",
        "",
        "- Line protocol, nanosecond timestamps. One wide row per entity per poll.",
        "- Units are part of field names (`_celsius`, `_watts`, `_bytes`, `_mhz`, `_ratio` in 0..1,",
        "  `_ns_total`, `_joules_total`); `_total` fields are cumulative counters as the hardware",
        "  reports them (resets at driver reload; rollover and resets are handled by readers).",
        "- A value the hardware does not support or did not report is **absent** from the row, never 0.",
        "- Tags are low-cardinality identity only; operator labels `cluster` and `rack` are added to",
        "  every row. Job ids and other high-cardinality values are fields, never tags.",
        "- Tiers: `fast` fields are in every poll's row, `slow` ones in the rows of the slow cadence",
        "  (and the first poll), `nvlink` ones at the NVLink cadence (`[gpu] nvlink_interval`, and the",
        "  first poll), `event` ones when something happens.",
        "",
        "## Measurements",
        "",
        "| measurement | rows | tags | fields |",
        "|---|---|---|---|",
    ]
    meas = catalogue.measurements()
    for m in meas:
        tags = ", ".join(f"`{t}`" for t in catalogue.tags(m))
        out.append(f"| [`{m}`](#{m}) | {_rows(m)} | {tags} | {len(catalogue.fields(m))} |")
    inc = catalogue.incident()
    tags = ", ".join(f"`{t}`" for t in inc.tags)
    out.append(f"| [`incident`](#incident) | {inc.rows} | {tags} | {len(inc.fields)} |")
    for m in meas:
        out += ["", f"## {m}", "", _sentence(_rows(m)), "", "Tags: "
                + ", ".join(f"`{t}` ({TAG_DOC.get(t, '')})" for t in catalogue.tags(m)) + ".", "",
                "| field | type | unit | kind | tier | OpenTelemetry instrument | source | description |",
                "|---|---|---|---|---|---|---|---|"]
        for x in catalogue.fields(m):
            out.append(f"| `{x.field}` | {x.type} | `{x.unit}` | {x.kind} | {x.tier} | {_cell(_otel(x))} | "
                       f"{_cell(x.origin)} | {_cell(x.description)} |")
    out += ["", "## incident", "",
            "Written back to InfluxDB by the analyzer (not by the agent): "
            f"{inc.rows}. The `id` field ties the two writes to one incident.", "",
            "Tags: " + ", ".join(f"`{t}` ({TAG_DOC.get(t, '')})" for t in inc.tags) + ".", "",
            "| field | type | unit | description |", "|---|---|---|---|"]
    for name, typ, unit, desc in inc.fields:
        out.append(f"| `{name}` | {typ} | {f'`{unit}`' if unit else ''} | {_cell(desc)} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="PATH", help="write the schema page to PATH")
    g.add_argument("--check", metavar="PATH", help="exit 1 when PATH differs from the catalogue")
    args = ap.parse_args(argv)
    text = render()
    if args.write:
        Path(args.write).write_text(text)
    elif args.check:
        p = Path(args.check)
        if not p.is_file() or p.read_text() != text:
            print(f"{p} is out of date: python -m gpufleet.schema_doc --write {p}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
