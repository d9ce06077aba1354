"""Generate ``docs/dcgm.md`` (the dcgm-exporter names the agent serves) from the catalogue.

``python -m gpufleet.regen`` writes it with the other generated files, and
``tests/test_regen.py`` keeps the committed file in step.
"""

from __future__ import annotations

from gpufleet import catalogue
from gpufleet.schema_doc import _cell


def _scale(m: catalogue.Metric) -> str:
    s = float(m.dcgm.get("scale", 1))
    if s == 1:
        return "as is"
    if s == 2.0**-20:
        return "÷ 1,048,576"
    return f"× {s:g}"


def render() -> str:
    out = [
        "# dcgm-exporter names",
        "",
        "<!-- Generated from gpufleet/catalogue.toml by `python -m gpufleet.regen`; "
        "do not edit by hand. -->",
        "",
        "With `[prometheus] names = \"dcgm\"` (or `\"both\"`) the agent's scrape endpoint serves these",
        "dcgm-exporter metrics, with dcgm-exporter's labels: `gpu` (NVML index), `UUID`, `device`",
        "(`nvidia` + the NVML index), `modelName`, `Hostname`, the operator labels, and `hpc_job`",
        "while the GPU collector sees a Slurm job or pod on the GPU. The values come from NVML",
        "(GPM for the `DCGM_FI_PROF_*` ones), never from DCGM; the `dcgm` column of",
        "`gpufleet/catalogue.toml` holds the mapping. Integers unless the unit column says",
        "otherwise, as DCGM's int64 fields are (the scaled value rounded down). A counter's TYPE is",
        "`counter` in the Prometheus text format, as dcgm-exporter writes it, and `unknown` in",
        "OpenMetrics (which requires `_total` on a counter's samples).",
        "",
        "| dcgm-exporter name | type | unit | gpufleet source | conversion | difference |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in sorted(catalogue.dcgm_names().items()):
        d = m.dcgm
        src = f"`{m.measurement}.{m.field}`"
        if d.get("sum") == "link":
            src += ", summed over the GPU's links"
        if d.get("match"):
            src += " of events with " + ", ".join(f"{k}={v}" for k, v in d["match"].items())
        unit = d["unit"] + (" (float)" if d.get("value") == "float" else "")
        out.append(f"| `{name}` | {d['type']} | {unit} | {src} | {_scale(m)} | {_cell(d.get('note', ''))} |")
    out += ["", "## Not served", "",
            "dcgm-exporter metrics (of its default and DCP counter lists) the agent does not serve, and why.",
            "They are absent from the scrape, never filled in.", "",
            "| dcgm-exporter name | why |", "|---|---|"]
    for name, why in sorted(catalogue.dcgm_not_served().items()):
        out.append(f"| `{name}` | {_cell(why)} |")
    out += ["", "Labels dcgm-exporter writes that the agent does not: `pci_bus_id`,",
            "`DCGM_FI_DRIVER_VERSION`,"
            " `err_code`/`err_msg` on `DCGM_FI_DEV_XID_ERRORS`, Kubernetes `pod`/`namespace`/`container`",
            "(the agent knows a pod's UID, written as `hpc_job`), MIG `GPU_I_ID`/`GPU_I_PROFILE`.",
            "`device` is `nvidia` + the NVML index, where dcgm-exporter uses the device minor number",
            "(the same on most nodes)."]
    return "\n".join(out) + "\n"
