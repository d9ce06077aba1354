"""Generate ``docs/schema.md`` (the InfluxDB schema) from the catalogue.

``python -m gpufleet.schema_doc`` prints it; ``--write docs/schema.md`` writes it; ``--check
docs/schema.md`` exits 1 when the file is out of date. A test keeps the committed file in step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpufleet import catalogue

ROWS = {
    "gpu": "one row per GPU per poll",
    "gpu_nvlink": "one row per NVLink link per poll",
    "gpu_event": "one row per XID or ECC event, when it happens",
    "gpu_canary": "one row per silent-data-corruption known-answer check",
    "bmc_sensor": "one row per BMC sensor per poll",
    "bmc": "one row per node per poll (BMC readings)",
    "host": "one row per node per poll",
    "gpufleet_collector": "one row per agent collector per poll",
    "gpufleet_agent": "one row per agent exporter per poll",
    "gpufleet_canary": "one row per GPU every canary.status_every (60 s) with the canary's state; "
                       "one node row (no gpu tag) with the drop-directory counts",
}
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
    "severity": "`critical` or `warning`",
}

# Written by the analyzer, not by the agent: documented here so the schema is whole.
INCIDENT = {
    "measurement": "incident",
    "rows": "one point per incident, time = incident start (written when it fires, rewritten with "
            "state `resolved` when it ends)",
    "tags": ("kind", "severity", "host", "cluster", "rack"),
    "fields": (
        ("id", "string", "", "stable incident id"),
        ("summary", "string", "", "one-line human summary"),
        ("gpu", "int", "1", "GPU index the incident concerns, when it concerns one"),
        ("link", "int", "1", "NVLink link the incident concerns, when it concerns one"),
        ("state", "string", "", "`firing` or `resolved`"),
        ("end_ns", "int", "ns", "end of the incident (ns since the epoch), on resolved rows"),
        ("duration_seconds", "float", "s", "incident duration so far (firing) or in all (resolved)"),
    ),
}


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
        "<!-- Generated from gpufleet/catalogue.toml by `python -m gpufleet.schema_doc --write "
        "docs/schema.md`; do not edit by hand. -->",
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
        "  (and the first poll), `event` ones when something happens.",
        "",
        "## Measurements",
        "",
        "| measurement | rows | tags | fields |",
        "|---|---|---|---|",
    ]
    meas = catalogue.measurements()
    for m in meas:
        tags = ", ".join(f"`{t}`" for t in catalogue.tags(m))
        out.append(f"| [`{m}`](#{m}) | {ROWS.get(m, '')} | {tags} | {len(catalogue.fields(m))} |")
    tags = ", ".join(f"`{t}`" for t in INCIDENT["tags"])
    out.append(f"| [`incident`](#incident) | {INCIDENT['rows']} | {tags} | {len(INCIDENT['fields'])} |")
    for m in meas:
        out += ["", f"## {m}", "", _sentence(ROWS.get(m, "")), "", "Tags: "
                + ", ".join(f"`{t}` ({TAG_DOC.get(t, '')})" for t in catalogue.tags(m)) + ".", "",
                "| field | type | unit | kind | tier | OpenTelemetry instrument | source | description |",
                "|---|---|---|---|---|---|---|---|"]
        for x in catalogue.fields(m):
            out.append(f"| `{x.field}` | {x.type} | `{x.unit}` | {x.kind} | {x.tier} | {_cell(_otel(x))} | "
                       f"{_cell(x.source)} | {_cell(x.description)} |")
    out += ["", "## incident", "",
            "Written back to InfluxDB by the analyzer (not by the agent): "
            f"{INCIDENT['rows']}. The `id` field ties the two writes to one incident.", "",
            "Tags: " + ", ".join(f"`{t}` ({TAG_DOC.get(t, '')})" for t in INCIDENT["tags"]) + ".", "",
            "| field | type | unit | description |", "|---|---|---|---|"]
    for name, typ, unit, desc in INCIDENT["fields"]:
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
