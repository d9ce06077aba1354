"""``gpufleet demo``: the whole mission on one machine, with nothing else installed.

1. A synthetic fleet (default 4 nodes x 8 H200-class GPUs, the ``mixed`` scenario) is generated
   with its ground truth (``gpufleet sim``).
2. One real agent process per node (``python -m gpufleet.demo --node HOST``) plays that node
   through the agent's own pipeline: the ``sim`` NVML backend, the GPU/XID/canary collectors,
   the OpenTelemetry SDK and the ``file`` exporter (the embedded store) -- or the ``influx``
   exporter when ``--influx-url`` is given. The agents run on the fleet's clock, as fast as the
   CPU allows, so six simulated hours take seconds.
3. The analyzer reads the store, raises incidents, sends them to the console (and any
   ``--sink``), writes incident pages, and the closing table scores them against the truth.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.flags import influx_options
from gpufleet.times import parse_time

SIM_ENV = ("GPUFLEET_SIM_SEED", "GPUFLEET_SIM_SCENARIO", "GPUFLEET_SIM_NODES", "GPUFLEET_SIM_GPUS_PER_NODE",
           "GPUFLEET_SIM_DURATION", "GPUFLEET_SIM_STEP", "GPUFLEET_SIM_T0")


def _sim_env(seed, scenario, nodes, gpus_per_node, duration, step, t0) -> dict[str, str]:
    values = (seed, scenario, nodes, gpus_per_node, duration, step, t0)
    return dict(zip(SIM_ENV, map(str, values), strict=True))


def _generate(out: Path, nodes, gpus_per_node, duration, step, seed, scenario, progress: bool = False):
    from gpufleet.sim import scenario as scen
    from gpufleet.sim.engine import generate
    from gpufleet.sim.fleet import Fleet
    from gpufleet.sim.units import parse_duration

    fleet = Fleet(scen.load(scenario), seed=seed, duration=parse_duration(duration, "--duration"),
                  step=parse_duration(step, "--step"), nodes=nodes, gpus_per_node=gpus_per_node)
    generate(fleet, out / "fleet", progress=progress)
    labels = {}  # the operator labels each node's agent carries, as the simulator's rows do
    for i, host in enumerate(fleet.hosts):
        rack = int(fleet.node_rack[i])
        labels[host] = {"cluster": fleet.clusters[int(fleet.rack_cluster[rack])], "rack": fleet.racks[rack]}
    return json.loads((out / "fleet" / "manifest.json").read_text()), labels


def _node_cmd(host: str, store: Path, steps: int, step: float, influx: dict,
              labels: dict | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "gpufleet.demo", "--node", host, "--store", str(store),
           "--steps", str(steps), "--step", str(step)]
    for k, v in (labels or {}).items():
        cmd += ["--label", f"{k}={v}"]
    for k, v in influx.items():
        if v:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def _run_agents(hosts, env, store: Path, logs: Path, steps: int, step: float, influx: dict, progress: bool,
                parallel: int, labels: dict | None = None) -> None:
    """One agent process per node, ``parallel`` at a time; progress from their stdout, logs to files."""
    import selectors

    from tqdm import tqdm

    logs.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=steps * len(hosts), unit="tick", desc="agents", disable=not progress, leave=False)
    waiting = list(hosts)
    sel = selectors.DefaultSelector()
    failed = []
    try:
        while waiting or sel.get_map():
            while waiting and len(sel.get_map()) < parallel:
                h = waiting.pop(0)
                with open(logs / f"agent-{h}.log", "w") as log:
                    p = subprocess.Popen(_node_cmd(h, store, steps, step, influx, (labels or {}).get(h)),
                                         env=env, text=True,
                                         stdout=subprocess.PIPE, stderr=log)
                sel.register(p.stdout, selectors.EVENT_READ, (h, p, [0]))
            for key, _ in sel.select(timeout=1.0):
                h, p, done = key.data
                line = key.fileobj.readline()
                if line.strip().isdigit():
                    bar.update(int(line) - done[0])
                    done[0] = int(line)
                elif not line:
                    sel.unregister(key.fileobj)
                    if p.wait():
                        tail = (logs / f"agent-{h}.log").read_text().strip().splitlines()
                        failed.append(f"{h}: exit {p.returncode}: {tail[-1] if tail else ''}")
    finally:
        bar.close()
        for key in list(sel.get_map().values()):
            key.data[1].kill()
    if failed:
        raise GpufleetError("agent process failed: " + "; ".join(failed), exit_code=1)


def _create_db(url: str, db: str) -> None:
    """InfluxDB 1.x answers writes to a database that does not exist with 404: make it first."""
    import requests

    try:
        r = requests.post(url.rstrip("/") + "/query", params={"q": f'CREATE DATABASE "{db}"'}, timeout=10)
    except requests.RequestException as exc:
        raise GpufleetError(f"--influx-url {url}: unreachable ({type(exc).__name__})") from None
    if r.status_code != 200:
        raise GpufleetError(f"--influx-url {url}: CREATE DATABASE answered {r.status_code}")


def _analyze(store: Path, influx: dict, start_ns: int, end_ns: int, progress: bool = False):
    from gpufleet.analyzer.config import Config
    from gpufleet.analyzer.pipeline import Analyzer
    from tqdm import tqdm

    cfg = Config.load(None)
    an = Analyzer(cfg)
    if influx.get("influx_url"):
        from gpufleet.analyzer.sources import Influx
        from gpufleet.analyzer.store import pull

        src = Influx(influx["influx_url"], influx["influx_db"])
        src.check()
        window = int(cfg.analyzer["window_seconds"] * 1e9)
        with tqdm(total=end_ns - start_ns, desc="analyzer", unit="ns", unit_scale=True, leave=False,
                  disable=not progress, bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}") as bar:
            t = start_ns
            while t < end_ns:
                pull(an, src, t, min(t + window, end_ns))
                bar.update(min(window, end_ns - t))
                t += window
    else:
        from gpufleet.analyzer.sources import read_chunks

        # a directory of per-host segment files: the analyzer's input merges them by time
        with tqdm(desc="analyzer", unit="B", unit_scale=True, leave=False, disable=not progress) as bar:
            for chunk in read_chunks(store):
                an.feed_bytes(chunk)
                bar.update(len(chunk))
    an.finish()
    return an.incidents()


@click.command("demo")
@click.option("--nodes", type=click.IntRange(1, 64), default=4, show_default=True, help="Nodes in the fleet.")
@click.option("--gpus-per-node", type=click.IntRange(1, 16), default=8, show_default=True)
@click.option("--duration", default="6h", show_default=True, help="Simulated time.")
@click.option("--step", default="10s", show_default=True, help="Agent poll interval on the fleet's clock.")
@click.option("--scenario", default="mixed", show_default=True, help="Scenario name or TOML file.")
@click.option("--seed", type=click.IntRange(0), default=7, show_default=True)
@click.option("--out", "out_dir", default="demo-out", show_default=True, type=click.Path(file_okay=False),
              help="Where the store, incidents, pages and notifier state go.")
@influx_options(defaults={"db": "gpufleet"})
@click.option("--sink", "sinks", multiple=True, help="Also page through TYPE=URL (repeatable).")
@click.option("--parallel", type=click.IntRange(1, 64), default=None,
              help="Agent processes at a time (default: the CPU count).")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the scores as one JSON object at the end.")
def demo(nodes, gpus_per_node, duration, step, scenario, seed, out_dir, influx, sinks,
         parallel, progress, as_json):
    """Run the whole pipeline on a synthetic fleet: agents -> store -> analyzer -> alerts -> scores.

    With --influx-url the agents write to that InfluxDB 1.x instead of files, and the analyzer
    reads it back."""
    from gpufleet.analyzer.alerting import Notifier, load_sinks, write_pages
    from gpufleet.analyzer.evaluate import evaluate, table

    from gpufleet import records
    from gpufleet.sim.units import parse_duration

    influx.refuse(["bucket", "org", "user", "password_file", "token_file"],
                  "the demo's agents write to an InfluxDB 1.x without authentication "
                  "(--influx-url, --influx-db)")
    if influx.api not in (None, "v1"):
        raise ConfigError(f"--influx-api {influx.api}: the demo writes InfluxDB 1.x (v1)")
    influx_url, influx_db = influx.url, influx.db
    t_start = time.monotonic()
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise GpufleetError(f"--out {out}: cannot write there ({exc.strerror})") from None
    sink_objs = load_sinks([], ["console", *sinks])  # config errors before anything runs
    progress = sys.stderr.isatty() if progress is None else progress
    step_s = parse_duration(step, "--step")

    def say(message: str) -> None:
        click.echo(message, err=True)

    say(f"gpufleet demo: {nodes} nodes x {gpus_per_node} GPUs, scenario {scenario}, {duration} at {step} "
        f"(seed {seed}) -> {out}/")
    t_stage = time.monotonic()
    manifest, labels = _generate(out, nodes, gpus_per_node, duration, step, seed, scenario, progress)
    t0 = parse_time(manifest["start"])
    steps = int(manifest["steps"])
    hosts = manifest["fleet"]["hosts"]
    truth_path = out / "fleet" / "truth.jsonl"
    truth = records.read(truth_path)
    say(f"  fleet: {len(hosts)} nodes, {manifest['fleet']['gpus']} GPUs, {len(truth)} injected faults "
        f"in {time.monotonic() - t_stage:.1f} s")

    store = out / "store"
    shutil.rmtree(store, ignore_errors=True)  # a rerun starts from an empty store
    influx = {"influx_url": influx_url, "influx_db": influx_db if influx_url else None}
    if influx_url:
        _create_db(influx_url, influx_db)
    env = dict(os.environ, **_sim_env(seed, scenario, nodes, gpus_per_node, duration, step, t0))
    t_agents = time.monotonic()
    _run_agents(hosts, env, store, out / "logs", steps, step_s, influx, progress,
                parallel or os.cpu_count() or 2, labels)
    dt = time.monotonic() - t_agents
    say(f"  agents: {len(hosts)} processes, {steps} polls each through OpenTelemetry into "
        f"{'InfluxDB ' + influx_url if influx_url else str(store) + '/'} in {dt:.1f} s")

    t_stage = time.monotonic()
    incidents = _analyze(store, influx, int(t0 * 1e9), int((t0 + steps * step_s) * 1e9), progress)
    records.write(out / "incidents.jsonl", incidents)
    say(f"  analyzer: {len(incidents)} incidents -> {out / 'incidents.jsonl'} "
        f"in {time.monotonic() - t_stage:.1f} s")

    t_stage = time.monotonic()
    pages = write_pages(incidents, store if not influx_url else out / "fleet", out / "pages",
                        progress=progress)
    (out / "notify.db").unlink(missing_ok=True)  # a rerun pages its fleet again, as a first run does
    notifier = Notifier(sink_objs, out / "notify.db", page_base_url=(out / "pages").resolve().as_uri())
    try:
        notifier.update(incidents, time.time())
    finally:
        notifier.close()
    say(f"  pages: {len(pages)} files in {out / 'pages'}/ in {time.monotonic() - t_stage:.1f} s")

    gpu_days = manifest["fleet"]["gpus"] * steps * step_s / 86400
    result = evaluate(truth, incidents, gpu_days)
    click.echo(table(result))
    say(f"done in {time.monotonic() - t_start:.0f} s; `gpufleet eval --truth {truth_path} "
        f"--incidents {out / 'incidents.jsonl'}` scores it again")
    if as_json:
        click.echo(json.dumps(result))


# ---------------------------------------------------------------- one node's agent process
def _node_main(argv: list[str]) -> int:
    """``python -m gpufleet.demo --node HOST ...``: the real agent pipeline on the fleet's clock."""
    import argparse

    from gpufleet.agent import config as agent_config
    from gpufleet.agent.daemon import Agent

    ap = argparse.ArgumentParser(prog="gpufleet.demo")
    ap.add_argument("--node", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--step", type=float, required=True)
    ap.add_argument("--influx-url")
    ap.add_argument("--influx-db")
    ap.add_argument("--label", action="append", default=[])
    a = ap.parse_args(argv)
    t0 = float(os.environ["GPUFLEET_SIM_T0"])
    exporters = ("influx",) if a.influx_url else ("file",)
    cfg = agent_config.apply_overrides(
        agent_config.load(None), exporters=exporters, backend="sim", sim_node=a.node, host=a.node,
        interval=f"{max(a.step, 1.0)}s", file_dir=a.store, spool_dir=str(Path(a.store) / f".spool-{a.node}"),
        influx_url=a.influx_url, influx_db=a.influx_db, labels=tuple(a.label))
    cfg["agent"]["collectors"] = list(DEMO_COLLECTORS)
    cfg = agent_config.validate({**cfg, **DEMO_SECTIONS})
    agent = Agent(cfg)
    try:
        for k in range(a.steps):
            agent.tick(int((t0 + (k + 1) * a.step) * 1e9))
            if (k + 1) % 50 == 0 or k + 1 == a.steps:
                print(k + 1, flush=True)
    finally:
        agent.close(flush_timeout=30.0)
    return 0


# The sources a simulated node can answer: its GPUs (NVML), their XID events and canary.
DEMO_COLLECTORS = ("gpu", "xid", "canary")
# A simulated node has no kernel log of its own: its XIDs arrive as NVML events. Its canary is the
# node's own verdict (the sim backend's engine), checked every 5 min as the simulator does, busy or
# not (a verdict costs nothing), with first answers kept in memory.
DEMO_SECTIONS = {
    "xid": {"kmsg": ""},
    "canary": {"engine": "backend", "interval": 300.0, "busy_size": 256, "busy_backoff": 300.0,
               "state_dir": ""},
}


if __name__ == "__main__":
    try:
        sys.exit(_node_main(sys.argv[1:]))
    except GpufleetError as exc:
        print(f"gpufleet: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
