"""``gpufleet sim`` and ``gpufleet replay``."""

from __future__ import annotations

import click

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.flags import influx_options


@click.command()
@click.option("--nodes", type=int, default=None, help="Nodes in the fleet (default: the scenario's).")
@click.option("--gpus-per-node", type=int, default=None, help="GPUs per node (default: the scenario's, 8).")
@click.option("--duration", default="6h", show_default=True, help="Simulated time, e.g. 30m, 6h, 1d.")
@click.option("--step", default="10s", show_default=True, help="Sample interval, e.g. 10s, 1s, 0.1s.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed: same seed, same bytes.")
@click.option(
    "--scenario",
    default="healthy",
    show_default=True,
    help="Built-in name (healthy, thermal, link, memory, sdc, mixed, chaos, straggler) or a TOML file.",
)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on long runs).")
@click.option(
    "--compress-level",
    type=click.IntRange(1, 9),
    default=3,
    show_default=True,
    help="gzip level of telemetry.lp.gz.",
)
def sim(nodes, gpus_per_node, duration, step, seed, scenario, out, progress, compress_level):
    """Generate a synthetic fleet: DIR/telemetry.lp.gz, DIR/truth.jsonl, DIR/manifest.json."""
    from gpufleet.sim import scenario as scen
    from gpufleet.sim.engine import generate
    from gpufleet.sim.fleet import Fleet
    from gpufleet.sim.units import parse_duration

    dur = parse_duration(duration, "--duration")
    stp = parse_duration(step, "--step")
    if dur <= 0:
        raise GpufleetError("--duration must be positive")
    if stp <= 0:
        raise GpufleetError("--step must be positive")
    if dur / stp > 50_000_000:
        raise GpufleetError(f"--duration/--step gives {dur / stp:.0f} steps; at most 50,000,000")
    if seed < 0:
        raise GpufleetError("--seed must be >= 0")
    sc = scen.load(scenario)
    fleet = Fleet(sc, seed=seed, duration=dur, step=stp, nodes=nodes, gpus_per_node=gpus_per_node)
    m = generate(fleet, out, progress=progress, level=compress_level)
    lines = sum(m["telemetry"]["lines"].values())
    click.echo(
        f"{out}: {m['fleet']['gpus']} GPUs x {m['steps']} steps, {lines} lines, "
        f"{m['truth']['records']} truth records ({sc.name}, seed {seed})"
    )


@click.command()
@click.argument("directory", type=click.Path())
@influx_options(defaults={"api": "v1"}, required=("url",))
@click.option(
    "--speed", type=float, default=None, help="Replay at X times real time (default: as fast as possible)."
)
@click.option("--as-fast-as-possible", "afap", is_flag=True, help="No pacing (the default).")
@click.option(
    "--batch", type=click.IntRange(1, 1_000_000), default=5000, show_default=True, help="Lines per write."
)
@click.option("--restart", is_flag=True, help="Ignore the stored position and start from the beginning.")
@click.option(
    "--create-db/--no-create-db", default=True, show_default=True, help="CREATE DATABASE first (v1)."
)
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
def replay(
    directory,
    influx,
    speed,
    afap,
    batch,
    restart,
    create_db,
    progress,
):
    """Load a simulated fleet (DIR from gpufleet sim) into InfluxDB, resumably."""
    from gpufleet.sim.replay import Replayer

    if speed is not None and afap:
        raise GpufleetError("--speed and --as-fast-as-possible exclude each other")
    if speed is not None and not speed > 0:
        raise GpufleetError("--speed must be positive")
    influx.refuse(["user", "password_file"], "replay writes without a user (v1) or with a token (v2)")
    if influx.api == "v3":
        raise ConfigError("--influx-api v3: replay writes through the v2 API: give --influx-api v2 with "
                          "--influx-bucket DATABASE")
    influx_url = influx.url
    r = Replayer(
        directory,
        influx_url,
        api=influx.api,
        db=influx.db,
        bucket=influx.bucket,
        org=influx.org,
        token_file=influx.token_file,
        speed=speed,
        batch=batch,
        create_db=create_db,
    )
    n = r.run(restart=restart, progress=progress)
    click.echo(f"{directory}: {n} lines written to {influx_url} ({r.target})")
