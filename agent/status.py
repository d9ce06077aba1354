"""What the agent collects and where it sends it, in one line each: at start (``gpufleet agent
run`` logs them) and before it (``gpufleet agent check``, the unit's ExecStartPre and the
package's postinst).

Each registered collector is ``on`` (with what it reads), ``off`` (not in ``agent.collectors``) or
``unavailable`` (listed, but its source is not on this node: why, and what would bring it): the
collector's class says which (``unavailable``, ``describe``; :mod:`gpufleet.agent.model`). A
collector that is unavailable for want of hardware (no ``/dev/ipmi0``, no FreeIPMI) is not
started, so the packaged config can list every source the README promises and each node runs
the ones it has. The lines come in ``agent.collectors``' order, then the unlisted ones by name.
"""

from __future__ import annotations

from gpufleet.agent import config as agent_config
from gpufleet.agent.model import Node


def unavailable(name: str, cfg: dict) -> str | None:
    """Why the listed collector ``name`` cannot run on this node (it is then not started), or None
    (a site collector, ``package.module:Class``, is not asked)."""
    cls = agent_config.collector_classes().get(name)
    return None if cls is None else cls.unavailable(cfg.get(name, {}))


def collector_lines(cfg: dict, gpus: int | None, nvml_error: str | None,
                    started: set[str] | None = None) -> list[str]:
    """One line per listed collector, in the listed order, then one per registered collector left
    out. ``gpus``: how many GPUs NVML shows (None: NVML did not answer, ``nvml_error`` says why);
    ``started``: the collectors the agent could start (None: not started, ``agent check``)."""
    listed = list(cfg["agent"]["collectors"])
    classes = agent_config.collector_classes()
    node = Node(gpus, nvml_error, float(cfg["agent"]["interval"]))
    out = []
    for name in [*listed, *(n for n in classes if n not in listed)]:
        cls = classes.get(name)
        if name not in listed:
            state, why = "off", "not in agent.collectors"
        elif (missing := unavailable(name, cfg)) is not None:
            state, why = "unavailable", missing
        elif started is not None and name not in started:
            state, why = "unavailable", "could not start (see the line above)"
        elif cls is None:
            state, why = "on", "site collector"
        else:
            state, why = cls.describe(cfg.get(name, {}), node)
        out.append(f"collector {name}: {state} ({why})")
    return out


def exporter_lines(cfg: dict) -> list[str]:
    """One line per exporter the agent runs, and why (the url that switched influx on)."""
    from gpufleet.net import redact_url

    out = []
    given = cfg["agent"]["exporters"]
    dests = {d.name: d for d in agent_config.influx_destinations(cfg)}
    for name in agent_config.exporters(cfg):
        if name in dests:
            d = dests[name]
            where = d.cfg["db"] if d.cfg["api"] == "v1" else f"bucket {d.cfg['bucket']}"
            why = "" if given else " (switched on by [influx] url)"
            out.append(f"exporter {name}: {redact_url(d.cfg['url'])} {d.cfg['api']} {where}, spool "
                       f"{d.spool_dir}{why}")
        else:  # its class says where it sends (the file exporter when none is listed: the default)
            cls = agent_config.exporter_classes()[name]
            out.append(f"exporter {name}: {cls.describe(cfg[name])}" + (
                " ([influx] url is not set)" if not given else ""))
    return out


def nvml_gpus(backend) -> tuple[int | None, str | None]:
    """(GPU count, None) or (None, why NVML did not answer) of an initialised backend."""
    try:
        return int(backend.nvmlDeviceGetCount()), None
    except Exception as exc:  # noqa: BLE001 - any NVML failure: the line says it
        return None, " ".join(str(exc).split()) or type(exc).__name__
