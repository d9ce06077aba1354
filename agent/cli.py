"""``gpufleet agent``: print one poll (``once``) or run the node agent (``run``, gpufleet.agent.daemon)."""

from __future__ import annotations

import json
import socket
import sys
import time

import click

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.flags import FLAG, influx_options

FORMATS = ("table", "json", "lp")


class _AgentGroup(click.Group):
    """``run`` is imported only when used, so ``once`` works on its own."""

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | {"run"})

    def get_command(self, ctx, name):
        if name == "run":
            return _run_command()
        return super().get_command(ctx, name)


def _run_command():
    try:
        from gpufleet.agent.daemon import run_command

        return run_command
    except (ImportError, AttributeError) as exc:
        from gpufleet.extras import message

        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        line = message(getattr(exc, "name", None), "agent run")

        @click.command("run", help="Run the node agent (not available in this installation).",
                       context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
        @click.argument("args", nargs=-1, type=click.UNPROCESSED)
        def unavailable(args):
            raise GpufleetError(line or f"'gpufleet agent run' is not available here ({reason})")

        return unavailable


@click.group("agent", cls=_AgentGroup)
def agent():
    """The node agent: NVML, host (and other) collectors."""


@agent.command("resend-rejected")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="agent.toml (its [influx] and [spool] sections)")
@click.option("--destination", default="influx", show_default=True,
              help="influx, or influx.NAME for an [influx.NAME] table")
@click.option("--spool-dir", default=None, help="the spool (default: spool.dir of the config)")
@influx_options()
def resend_rejected_command(config_path, destination, spool_dir, influx):
    """Send the batches InfluxDB refused (spool/rejected/) again; delivered ones are deleted.

    Safe while the agent runs (it never reads rejected/); a re-sent line carries its original
    timestamp, so InfluxDB stores it once.
    """
    from pathlib import Path

    from gpufleet.agent import config as agent_config
    from gpufleet.agent.pipeline.influx import resend_rejected

    cfg = agent_config.load(Path(config_path) if config_path else None)
    if destination == agent_config.INFLUX:
        cfg = agent_config.apply_overrides(cfg, influx=influx, spool_dir=spool_dir, exporters=(destination,))
    else:  # the flags name [influx]'s keys; a named destination's come from its table only
        influx.refuse(list(FLAG), "the --influx-* flags are for --destination influx")
        if spool_dir:
            raise GpufleetError("--spool-dir is for --destination influx", exit_code=2)
        cfg = agent_config.apply_overrides(cfg, exporters=(destination,))
    dest = agent_config.influx_destinations(cfg)[0]
    ix = dest.cfg
    secret = agent_config.influx_secret(ix, dest.name)
    rdir = Path(dest.spool_dir) / "rejected"
    if not rdir.is_dir():
        raise GpufleetError(f"{rdir}: no such directory (nothing was rejected?)")
    files, lines, problems = resend_rejected(rdir, ix, secret)
    for p in problems:
        click.echo(f"gpufleet: {p}", err=True)
    click.echo(f"re-sent {files} batches ({lines} lines) from {rdir}; {len(problems)} left")
    if problems:
        raise GpufleetError(f"{len(problems)} rejected batches are left in {rdir}", exit_code=1)


@agent.command("check")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="agent.toml (default: /etc/gpufleet/agent.toml where it exists, else built-in defaults)")
def check_command(config_path):
    """Check a config as the agent would run it and say what it collects and where it sends it.

    One line per exporter and per collector (on, off, or unavailable and why); exit 2 with one
    line when the config is invalid, a secret file cannot be read, or an [influx.NAME] table names
    a url that agent.exporters does not list. The packaged unit runs it before the agent starts
    (ExecStartPre), the package after an install or upgrade.
    """
    import os
    from pathlib import Path

    from gpufleet.agent import config as agent_config
    from gpufleet.agent import status

    if config_path is None and os.path.isfile("/etc/gpufleet/agent.toml"):
        config_path = "/etc/gpufleet/agent.toml"
    cfg = agent_config.load(Path(config_path) if config_path else None)
    for name in agent_config.unexported(cfg):
        raise GpufleetError(f"[{name}] names a url but agent.exporters does not list \"{name}\": "
                            "nothing would be sent there; add it to agent.exporters (or leave "
                            "agent.exporters empty), or remove the url")
    for d in agent_config.influx_destinations(cfg):
        agent_config.influx_secret(d.cfg, d.name)  # readable by this user, or one line and exit 2
    gpus, why = None, "not read by these collectors"
    from gpufleet.agent.daemon import needs_nvml

    if needs_nvml(cfg["agent"]["collectors"]):
        from gpufleet.agent.backends import get_backend

        backend = get_backend(cfg["agent"]["backend"])
        try:
            backend.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - no driver: the gpu line says so
            gpus, why = None, " ".join(str(exc).split()) or type(exc).__name__
        else:
            gpus, why = status.nvml_gpus(backend)
            try:
                backend.nvmlShutdown()
            except Exception:  # noqa: BLE001 - best effort
                pass
    click.echo(f"config {config_path or '(built-in defaults)'}: valid")
    for line in status.exporter_lines(cfg) + status.collector_lines(cfg, gpus, why):
        click.echo(line)


def poll_once(collectors, now_ns: int | None = None):
    """Run each collector once; returns (samples, problems). Adds a ``gpufleet_collector`` row
    (duration, success) per collector; a collector that fails is reported, never fatal."""
    from gpufleet.agent.model import Sample

    now_ns = now_ns or time.time_ns()
    samples, problems = [], []
    for c in collectors:
        t0 = time.perf_counter()
        ok = 1
        try:
            samples.extend(c.collect(now_ns))
        except GpufleetError as exc:
            ok = 0
            problems.append(f"{c.name}: {exc}")
        except Exception as exc:  # one broken collector never stops the others
            ok = 0
            problems.append(f"{c.name}: {type(exc).__name__}: {exc}")
        samples.append(Sample("gpufleet_collector", {"collector": c.name},
                              {"duration_seconds": time.perf_counter() - t0, "success": ok}, now_ns))
    return samples, problems


@agent.command("once")
@click.option("--backend", "backend_spec", default="nvml", show_default=True, metavar="SPEC",
              help="nvml | sim | recorded:PATH (an NVML dump .json or nvidia-smi -q -x .xml)")
@click.option("--format", "fmt", default="table", show_default=True, metavar="FORMAT",
              help="table | json | lp (InfluxDB line protocol)")
@click.option("--host", "hostname", default=None, help="host tag (default: this machine's name)")
@click.option("--no-nvlink", is_flag=True, help="skip per-link NVLink rows")
@click.option("--allow-no-gpu", is_flag=True,
              help="exit 0 on a node where NVML shows no GPU (no driver, no device)")
def once(backend_spec, fmt, hostname, no_nvlink, allow_no_gpu):
    """Poll the GPU and host collectors once and print the samples.

    Exits 1 (after printing what the other collectors read) when the GPU collector read no GPU:
    no NVIDIA driver, no NVML library, no device; --allow-no-gpu accepts that.
    """
    if fmt not in FORMATS:
        raise GpufleetError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    from gpufleet.hosts import problem, shown

    hostname = hostname or socket.gethostname()
    if problem(hostname):
        raise ConfigError(f"--host '{shown(hostname)}': not a plain node name: {problem(hostname)}")
    from gpufleet.agent.backends import get_backend
    from gpufleet.agent.collectors.gpu import GpuCollector
    from gpufleet.agent.collectors.host import HostCollector

    backend = get_backend(backend_spec)
    host = HostCollector(first_sample_s=0.2)
    gpu = GpuCollector(backend, nvlink=not no_nvlink, deadline_s=5.0)
    try:
        samples, problems = poll_once([gpu, host])
    finally:
        gpu.close()
    for p in problems:
        if allow_no_gpu or not p.startswith(f"{gpu.name}: "):  # else: the error line below says it
            click.echo(f"gpufleet: warning: {p}", err=True)
    for s in samples:
        s.tags = {"host": hostname, **s.tags}
    out = sys.stdout
    if fmt == "json":
        out.write(format_json(samples))
    elif fmt == "lp":
        from gpufleet.lineprotocol import encode

        for s in samples:
            line = encode(s.measurement, s.tags, s.fields, s.time_ns)
            if line:
                out.write(line + "\n")
    else:
        out.write(format_table(samples))
    out.flush()
    if not allow_no_gpu and not any(s.measurement == "gpu" for s in samples):
        mine = [p.split(": ", 1)[1] for p in problems if p.startswith(f"{gpu.name}: ")]
        why = mine[0] if mine else "NVML shows no GPU"
        raise GpufleetError(f"no GPU read: {why}; --allow-no-gpu accepts a node without one", exit_code=1)


def format_json(samples) -> str:
    rows = [json.dumps({"measurement": s.measurement, "tags": s.tags, "fields": s.fields,
                        "time_ns": s.time_ns}, separators=(",", ":")) for s in samples]
    return "[\n" + ",\n".join(rows) + "\n]\n"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) < 1e6 else f"{v:.0f}"
    return str(v)


def format_table(samples) -> str:
    """Samples grouped by measurement; wide rows (more fields than rows) shown transposed."""
    from gpufleet import catalogue

    units = {(m.measurement, m.field): m.unit for m in catalogue.load()}
    groups: dict[str, list] = {}
    for s in samples:
        groups.setdefault(s.measurement, []).append(s)
    blocks = []
    for meas, rows in groups.items():
        fields = list(dict.fromkeys(k for s in rows for k in s.fields))
        keys = [k for k in dict.fromkeys(k for s in rows for k in s.tags)
                if k not in ("host", "uuid", "model")]
        labels = [" ".join(f"{k}={s.tags[k]}" for k in keys if k in s.tags) or meas for s in rows]
        if len(fields) > len(rows):
            head = ["field", "unit", *labels]
            body = [[f, units.get((meas, f), ""),
                     *(_fmt(s.fields[f]) if f in s.fields else "-" for s in rows)] for f in fields]
        else:
            head = [*keys, *(f"{f} [{units.get((meas, f), '')}]" for f in fields)]
            body = [[s.tags.get(k, "") for k in keys] + [_fmt(s.fields[f]) if f in s.fields else "-"
                                                         for f in fields] for s in rows]
        widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
        lines = [f"# {meas}"]
        for r in [head, *body]:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        models = sorted({s.tags["model"] for s in rows if "model" in s.tags})
        if models:
            lines.insert(1, f"# model: {', '.join(models)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
