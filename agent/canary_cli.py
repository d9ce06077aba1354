"""``gpufleet canary``: run the SDC canary once, now, outside the agent (job boundaries, drills).

Same engines, children and comparisons as the agent's canary collector
(:mod:`gpufleet.agent.collectors.canary`): each GPU's check is a short-lived child process, a failing
check is rechecked (``--confirm``), an idle gate skips GPUs with a foreign compute process
(``--force`` turns it off: the Slurm Epilog runs when the job's processes are gone). With
``--drop-dir`` each result is written there as one JSON file, which the agent (``canary.drop_dir``,
the same directory) turns into a ``gpu_canary`` row.

Exit 0 when every device asked for was checked and passed; 1 when a check failed (or a result
could not be written to the drop directory); 3 ("not checked") when a device asked for was not
checked: no GPU here (``--engine auto`` never falls back to the CPU: ``--engine numpy`` checks
the CPU, and only when asked), no CUDA engine, a busy GPU, a child that crashed or was killed;
2 for bad usage. ``--json`` says ``checked: false`` in the last case.
"""

from __future__ import annotations

import json
import socket
import time

import click

from gpufleet.errors import ConfigError, GpufleetError

DEFAULT_CONFIG = "/etc/gpufleet/agent.toml"


def _backend(spec: str):
    """The NVML backend, or None where there is no driver (the CPU engine still runs)."""
    from gpufleet.agent.backends import get_backend

    b = get_backend(spec)
    try:
        init = getattr(b, "nvmlInit", None)
        if callable(init):
            init()
        b.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001 - no NVML here: the CPU check
        return None
    return b


NOT_CHECKED = 3  # the exit status when a device asked for was not checked


def run_canary(gpu: str, engine: str = "auto", backend_spec: str = "nvml", size: int = 0, dtype: str = "",
               memory_bytes: int = 0, state_dir: str = "", timeout: float = 120.0, confirm: int = 2,
               force: bool = False, reference: str = "", max_rss: int = 4 << 30, python: str = ""):
    """Check the GPUs ``gpu`` names (an index, a UUID, ``cpu`` or ``all``) once; returns
    (collector, rows, skipped) where rows are the ``gpu_canary`` samples."""
    from gpufleet.agent.collectors.canary import CanaryCollector

    backend = _backend(backend_spec)
    col = CanaryCollector(backend=backend, engine=engine, size=size, dtype=dtype, memory_bytes=memory_bytes,
                          interval=1e9, duty=1.0, idle_for=0.0, confirm=confirm, timeout=timeout,
                          max_rss=max_rss, reference=reference, state_dir=state_dir,
                          wait=timeout + 5.0, status_every=1e18, python=python)
    if not col.gpus:  # no NVML GPU: the CPU is checked only when asked for (--engine numpy)
        col.close()
        why = "no NVML here (no driver or no GPU)" if backend is None else "NVML shows no GPU"
        return col, [], {gpu: f"{why}; --engine numpy checks the CPU instead"}
    if gpu != "all":
        chosen = [g for g in col.gpus if gpu in (g.label, g.uuid)]
        if not chosen:
            col.close()
            have = ", ".join(g.label for g in col.gpus) or "none"
            raise ConfigError(f"--gpu {gpu}: no such device here (devices: {have})")
        col.gpus = chosen
    col.parallel = max(1, len(col.gpus))  # one child per GPU at once: a job boundary is short
    if force:
        col._busy = lambda g: None  # the caller knows the GPU is free (a job boundary)
    try:
        rows = [s for s in col.collect(time.time_ns()) if s.measurement == "gpu_canary"]
    finally:
        col.close()
    checked = {s.tags["gpu"] for s in rows}
    skipped = {k: v for k, v in col.skipped.items() if k not in checked}
    for g in col.gpus:
        if g.label not in checked and g.label not in skipped:
            skipped[g.label] = "not checked"
    return col, rows, skipped


@click.command("canary")
@click.option("--gpu", default="all", show_default=True, metavar="N|UUID|cpu|all", help="which GPU(s)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--engine", default="auto", show_default=True,
              type=click.Choice(["auto", "torch", "cupy", "numpy"]))
@click.option("--backend", "backend_spec", default="nvml", show_default=True, metavar="SPEC",
              help="NVML backend for identity and the idle gate: nvml | recorded:PATH")
@click.option("--size", type=int, default=0, help="GEMM size (0: 4096 on a GPU, 256 on the CPU)")
@click.option("--dtype", default="", help="'' = bfloat16 with torch, float32 otherwise")
@click.option("--memory-bytes", type=int, default=0, help="memory pattern size (0: 256 MiB GPU, 8 MiB CPU)")
@click.option("--state-dir", default="/var/lib/gpufleet-agent/canary", show_default=True,
              help="first answers, shared with the agent (unwritable: kept for this run only)")
@click.option("--reference", default="", help="fleet reference digests: JSON file or URL")
@click.option("--drop-dir", default="", metavar="DIR", help="write each result here for the agent")
@click.option("--max-files", type=int, default=1000, show_default=True,
              help="a drop dir holding this many is full")
@click.option("--source", default="cli", show_default=True, help="who ran it (slurm-epilog, k8s-hook, ...)")
@click.option("--timeout", type=float, default=120.0, show_default=True,
              help="seconds before a check is killed")
@click.option("--confirm", type=int, default=2, show_default=True, help="rechecks after a failed check")
@click.option("--force", is_flag=True, help="skip the idle gate (the scheduler says the GPU is free)")
@click.option("--python", "python", default=None, metavar="PATH",
              help="interpreter that runs the check (one with torch or cupy); default: canary.python "
                   f"of {DEFAULT_CONFIG} when set, else gpufleet's own")
def canary(gpu, as_json, engine, backend_spec, size, dtype, memory_bytes, state_dir, reference, drop_dir,
           max_files, source, timeout, confirm, force, python):
    """Run the SDC canary once on GPU N (or all) and report; optionally hand it to the agent."""
    if timeout <= 0 or confirm < 0 or max_files < 1:
        raise ConfigError("--timeout, --confirm and --max-files must be positive")
    import logging

    from gpufleet.agent.canary_drop import write_drop

    # each GPU's problem is in the output and the exit line: not also as a log warning
    logging.getLogger("gpufleet.agent.collectors.canary").addFilter(
        lambda r: not r.getMessage().startswith("canary gpu "))
    if python is None:
        python = configured_python()
    col, rows, skipped = run_canary(gpu, engine, backend_spec, size, dtype, memory_bytes, state_dir, timeout,
                                    confirm, force, reference, python=python)
    problems = []
    written = []
    if drop_dir:
        for s in rows:
            try:
                written.append(str(write_drop(drop_dir, s, source, max_files)))
            except OSError as exc:
                problems.append(f"drop dir {drop_dir}: {exc.strerror or exc}")
    host = socket.gethostname()
    results = [{"gpu": s.tags["gpu"], "uuid": s.tags.get("uuid"), "model": s.tags.get("model"),
                "time_ns": s.time_ns, "fields": s.fields, "engine": s.extra.get("engine"),
                "key": s.extra.get("key"), "timing": s.extra.get("timing"), "wall_s": s.extra.get("wall_s")}
               for s in rows]
    checked = bool(rows) and not skipped
    ok = checked and all(s.fields.get("passed") == 1 for s in rows) and not problems
    if as_json:
        click.echo(json.dumps({"host": host, "source": source, "ok": ok, "checked": checked,
                               "results": results, "skipped": skipped, "drop_files": written,
                               "problems": problems}))
    else:
        for r in results:
            f = r["fields"]
            verdict = "passed" if f.get("passed") == 1 else "FAILED"
            n_bad, n = f.get("checks_failed", 0), f.get("checks", 1)
            click.echo(f"gpu {r['gpu']}: {verdict} ({n_bad} of {n} checks failed; "
                       f"mismatches {f.get('mismatches')}, memory {f.get('memory_mismatches')}; "
                       f"{r['engine']}, {r['wall_s']:.2f} s)")
        for k, v in skipped.items():
            click.echo(f"gpu {k}: not checked: {v}")
    if not ok:  # one line on stderr: 1 when a check failed, 3 when only checks are missing
        failed = [r["gpu"] for r in results if r["fields"].get("passed") != 1]
        why = problems + [f"gpu {g}: check failed" for g in failed]
        why += [f"gpu {g}: not checked ({v})" for g, v in skipped.items()]
        raise GpufleetError("; ".join(why) or "nothing was checked",
                            exit_code=1 if failed or problems else NOT_CHECKED)


def configured_python() -> str:
    """``canary.python`` of the packaged agent config, so that a hook or a person on call runs the
    same engine as the agent; "" when the file is absent or does not set it."""
    import os

    if not os.path.isfile(DEFAULT_CONFIG):
        return ""
    from gpufleet.agent import config as agent_config

    return str(agent_config.load(DEFAULT_CONFIG)["canary"]["python"])
