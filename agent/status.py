"""What the agent collects and where it sends it, in one line each: at start (``gpufleet agent
run`` logs them) and before it (``gpufleet agent check``, the unit's ExecStartPre and the
package's postinst).

Each built-in collector is ``on`` (with what it reads), ``off`` (not in ``agent.collectors``) or
``unavailable`` (listed, but its source is not on this node: why, and what would bring it). A
collector that is unavailable for want of hardware (no ``/dev/ipmi0``, no FreeIPMI) is not
started, so the packaged config can list every source the README promises and each node runs
the ones it has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from gpufleet.agent import config as agent_config

BUILTIN = ("gpu", "host", "xid", "ipmi", "canary")
IPMI_DEVICES = ("/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0")


def unavailable(name: str, cfg: dict) -> str | None:
    """Why the listed collector ``name`` cannot run on this node (it is then not started), or None."""
    if name == "ipmi" and not cfg["ipmi"]["host"]:  # in-band: the local BMC
        if not any(os.path.exists(d) for d in IPMI_DEVICES):
            return ("no /dev/ipmi0 (no local BMC, or the ipmi_si/ipmi_devintf modules are not loaded) "
                    "and no [ipmi] host")
        if shutil.which("ipmi-sensors") is None:
            return "FreeIPMI's ipmi-sensors is not installed (apt install freeipmi-tools)"
    return None


def canary_engines(python: str = "") -> list[str]:
    """The CUDA engines (torch, cupy) the canary's child interpreter can import, looked up in a
    child: the agent itself never imports them or asks its import system for them."""
    probe = "import importlib.util as u; print(' '.join(m for m in ('torch', 'cupy') if u.find_spec(m)))"
    try:
        r = subprocess.run([python or sys.executable, "-P", "-c", probe], capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return r.stdout.split() if r.returncode == 0 else []


def _seconds(v: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if v >= n and v % n == 0:
            return f"{v / n:g}{unit}"
    return f"{v:g}s"


def describe(name: str, cfg: dict, gpus: int | None, nvml_error: str | None,
             engines: list[str] | None = None) -> tuple[str, str]:
    """(state, why) of a built-in collector that is listed and not unavailable for want of hardware.

    ``gpus``: how many GPUs NVML shows (None: NVML did not answer, ``nvml_error`` says why)."""
    if name == "gpu":
        if gpus is None:
            return "unavailable", f"NVML: {nvml_error}; tried again while the agent runs"
        return "on", f"{gpus} GPU(s) through NVML, every {_seconds(cfg['agent']['interval'])}"
    if name == "host":
        return "on", "CPU, memory, disks and network of this host"
    if name == "xid":
        x = cfg["xid"]
        src = f"kernel log {x['kmsg']} (else the journal)" if x["kmsg"] else "no kernel log"
        ev = "NVML events" if x["nvml_events"] and gpus else (
            "no NVML events (no GPU)" if x["nvml_events"] else "NVML events off")
        return "on", f"XID lines from the {src}; {ev}"
    if name == "ipmi":
        host = cfg["ipmi"]["host"]
        return "on", f"BMC {host}:{cfg['ipmi']['port']} over IPMI LAN" if host else \
            "local BMC in-band (/dev/ipmi0, FreeIPMI)"
    if name == "canary":
        c = cfg["canary"]
        hooks = f"results of job-boundary checks (Slurm Epilog/Prolog hooks) from {c['drop_dir']}"
        if c["engine"] == "numpy":
            own = f"its own check on the CPU (numpy) every {_seconds(c['interval'])}"
        elif not gpus:
            own = "no checks of its own (no NVML GPU here)"
        elif c["engine"] == "backend":
            own = f"its own checks of {gpus} GPU(s) by the backend's engine"
        else:
            found = canary_engines(c["python"]) if engines is None else engines
            wanted = [e for e in found if c["engine"] in ("auto", e)]
            py = c["python"] or "gpufleet's interpreter"
            need = "torch or cupy" if c["engine"] == "auto" else c["engine"]
            if wanted:
                own = f"its own checks of {gpus} idle GPU(s) every {_seconds(c['interval'])} with {wanted[0]}"
            else:
                own = (f"no checks of its own: no CUDA engine ({need}) in {py} "
                       "(set canary.python, docs/sources.md)")
        return "on", f"{hooks}; {own}"
    return "on", "site collector"


def collector_lines(cfg: dict, gpus: int | None, nvml_error: str | None,
                    started: set[str] | None = None) -> list[str]:
    """One line per built-in collector and per listed site collector, in a fixed order."""
    listed = list(cfg["agent"]["collectors"])
    out = []
    for name in [*BUILTIN, *(n for n in listed if n not in BUILTIN)]:
        if name not in listed:
            state, why = "off", "not in agent.collectors"
        else:
            missing = unavailable(name, cfg)
            if missing:
                state, why = "unavailable", missing
            elif started is not None and name not in started:
                state, why = "unavailable", "could not start (see the line above)"
            else:
                state, why = describe(name, cfg, gpus, nvml_error)
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
                " ([influx] url is not set)" if name == "file" and not given else ""))
    return out


def nvml_gpus(backend) -> tuple[int | None, str | None]:
    """(GPU count, None) or (None, why NVML did not answer) of an initialised backend."""
    try:
        return int(backend.nvmlDeviceGetCount()), None
    except Exception as exc:  # noqa: BLE001 - any NVML failure: the line says it
        return None, " ".join(str(exc).split()) or type(exc).__name__
