"""``gpufleet analyze`` and ``gpufleet eval``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from gpufleet.errors import ConfigError, GpufleetError


def _shard(value: str | None):
    if value is None:
        return None
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise ConfigError(f"--shard {value!r}: expected I/N, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise ConfigError(f"--shard {value!r}: need 0 <= I < N")
    return i, n


def _time(value: str, what: str) -> int:
    """RFC 3339 or epoch seconds -> ns."""
    from gpufleet.records import from_rfc3339

    try:
        return int(float(value) * 1e9)
    except ValueError:
        pass
    try:
        return int(from_rfc3339(value) * 1e9)
    except (ValueError, TypeError):
        raise ConfigError(
            f"{what} {value!r}: expected RFC 3339 (2026-11-26T03:00:00Z) or epoch seconds"
        ) from None


def _sinks(cfg, specs):
    if not cfg.sinks and not specs:
        return None
    try:
        from analyzer import alerting

        load_sinks, notifier_cls = alerting.load_sinks, alerting.Notifier
    except (ImportError, AttributeError):
        raise ConfigError("alert sinks are configured but analyzer.alerting is not available") from None
    return load_sinks(cfg.sinks, list(specs)), notifier_cls


@click.command("analyze")
@click.option("--input", "input_path", help="a .lp/.lp.gz file or a directory of them")
@click.option("--influx-url", help="InfluxDB base URL (InfluxQL over /query)")
@click.option("--db", help="InfluxDB database (or DBRP-mapped bucket)")
@click.option("--since", help="with --influx-url: analyse the last DURATION (e.g. 6h)")
@click.option("--start", help="with --influx-url: start time (RFC 3339 or epoch seconds)")
@click.option("--end", help="with --influx-url: end time")
@click.option("--follow", is_flag=True, help="online mode: analyse new data as it arrives")
@click.option("--out", "out_path", help="write incidents as JSON lines here")
@click.option("--config", "config_path", help="analyzer.toml")
@click.option("--sink", "sink_specs", multiple=True, help="alert sink TYPE=URL (repeatable)")
@click.option("--shard", help="analyse only hosts of shard I of N (I/N)")
@click.option("--state", "state_path", help="notifier state file (online mode)")
@click.option("--page-base-url", help="base URL of incident pages, for links in alerts")
@click.option("--poll", default="10s", show_default=True, help="online mode: how often to query")
@click.option("--stats", is_flag=True, help="print parse and analysis counters to stderr")
def analyze(
    input_path,
    influx_url,
    db,
    since,
    start,
    end,
    follow,
    out_path,
    config_path,
    sink_specs,
    shard,
    state_path,
    page_base_url,
    poll,
    stats,
):
    """Detect incidents in fleet telemetry (files or InfluxDB)."""
    from analyzer.config import Config, parse_duration
    from analyzer.pipeline import Analyzer

    cfg = Config.load(config_path)
    shard_t = _shard(shard)
    sinks = _sinks(cfg, sink_specs)  # a bad sink is a ConfigError before any work
    if bool(input_path) == bool(influx_url):
        raise ConfigError("give exactly one of --input PATH or --influx-url URL --db NAME")
    if follow and not influx_url:
        raise ConfigError("--follow needs --influx-url")
    if out_path:
        parent = Path(out_path).resolve().parent
        if not parent.is_dir():
            raise GpufleetError(f"--out {out_path}: directory {parent} does not exist")
    t0 = time.perf_counter()
    if input_path:
        from analyzer.sources import read_chunks

        an = Analyzer(cfg, shard_t)
        for chunk in read_chunks(input_path):
            an.feed_bytes(chunk)
        an.finish()
        _write(out_path, an.incidents())
        _notify_once(sinks, state_path, out_path, page_base_url, an)
        _report(an, stats, time.perf_counter() - t0)
        return
    if not db:
        raise ConfigError("--influx-url needs --db NAME")
    from analyzer.sources import Influx

    influx = Influx(
        influx_url, db, **{k: v for k, v in cfg.influx.items() if k in ("username", "password", "token")}
    )
    if follow:
        _follow(
            cfg,
            influx,
            shard_t,
            out_path,
            sinks,
            state_path,
            page_base_url,
            parse_duration(poll, "--poll"),
            since,
        )
        return
    influx.check()
    now = time.time_ns()
    if since:
        s_ns, e_ns = now - int(parse_duration(since, "--since") * 1e9), now
    elif start:
        s_ns, e_ns = _time(start, "--start"), _time(end, "--end") if end else now
    else:
        raise ConfigError("--influx-url needs --since DURATION or --start T [--end T]")
    if e_ns <= s_ns:
        raise ConfigError("--end must be after --start")
    an = Analyzer(cfg, shard_t)
    step = int(cfg.analyzer["window_seconds"] * 1e9)
    t = s_ns
    while t < e_ns:
        _pull(an, influx, t, min(t + step, e_ns))
        t += step
    an.finish()
    _write(out_path, an.incidents())
    _notify_once(sinks, state_path, out_path, page_base_url, an)
    _report(an, stats, time.perf_counter() - t0)


def _state_path(state_path, out_path) -> str:
    if state_path:
        return state_path
    if out_path:
        return str(Path(out_path).with_suffix(".notifier.db"))
    return "gpufleet-analyzer-notifier.db"


def _notify_once(sinks, state_path, out_path, page_base_url, an) -> None:
    """Batch mode with sinks: deliver the incidents found (new ones fire, ended ones resolve)."""
    if sinks is None:
        return
    sink_list, notifier_cls = sinks
    notifier = notifier_cls(sink_list, _state_path(state_path, out_path), page_base_url)
    try:
        notifier.update(an.incidents() + an.engine.absorbed, time.time())
    finally:
        notifier.close()


def _pull(an, influx, s_ns: int, e_ns: int) -> None:
    from analyzer.pipeline import MEASUREMENTS

    rows = {}
    for m in MEASUREMENTS:
        r = influx.query_rows(m, s_ns, e_ns, an.parser.series)
        if len(r):
            rows[m] = r
    an.feed_rows(rows)


def _write(out_path, incidents) -> None:
    from gpufleet import records

    if out_path:
        records.write(out_path, incidents)
    else:
        for r in incidents:
            click.echo(r.to_json())


def _report(an, stats: bool, seconds: float) -> None:
    if not stats:
        return
    d = an.parser.stats.as_dict()
    d.update(
        late_points=an.late_points,
        gpu_samples=an.gpu_samples,
        windows=an.windows,
        incidents=len(an.incidents()),
        seconds=round(seconds, 3),
        gpu_samples_per_s=round(an.gpu_samples / seconds) if seconds > 0 else None,
    )
    click.echo(json.dumps(d), err=True)


def incident_lines(recs, now_ns: int | None = None) -> list[str]:
    """The ``incident`` measurement for Grafana annotations: one point per incident at its start."""
    from gpufleet.lineprotocol import encode

    out = []
    for r in recs:
        tags = {"kind": r.kind, "severity": r.severity, "host": r.host, "cluster": r.cluster, "rack": r.rack}
        fields = {
            "id": r.id,
            "summary": r.summary or "",
            "state": "resolved" if r.end is not None else "firing",
        }
        if r.gpu is not None:
            fields["gpu"] = int(r.gpu)
        if r.link is not None:
            fields["link"] = int(r.link)
        if r.end is not None:
            fields["end_ns"] = int(r.end * 1e9)
            fields["duration_seconds"] = float(r.end - r.start)
        line = encode("incident", tags, fields, int(r.start * 1e9))
        if line:
            out.append(line)
    return out


def _follow(cfg, influx, shard_t, out_path, sinks, state_path, page_base_url, poll: float, since) -> None:
    """Online mode: pull new data every ``poll`` seconds, keep state, retry with backoff."""
    from analyzer.config import parse_duration
    from analyzer.pipeline import Analyzer
    from analyzer.sources import backoff

    notifier = None
    if sinks is not None:
        sink_list, notifier_cls = sinks
        notifier = notifier_cls(sink_list, _state_path(state_path, out_path), page_base_url)
    # online: short windows (a fault is reported within a poll or two), little waiting for late points
    cfg.analyzer["lateness_seconds"] = min(cfg.analyzer["lateness_seconds"], max(2 * poll, 10.0))
    cfg.analyzer["window_seconds"] = min(cfg.analyzer["window_seconds"], max(3 * poll, 10.0))
    an = Analyzer(cfg, shard_t)
    lag = int(max(poll, 5.0) * 1e9)
    cursor = time.time_ns() - int(
        parse_duration(since, "--since") * 1e9 if since else cfg.analyzer["window_seconds"] * 1e9
    )
    written: dict[str, str] = {}
    attempt = 0
    checked = False
    try:
        while True:
            try:
                if not checked:
                    influx.check()
                    checked = True
                now = time.time_ns()
                upto = now - lag
                if upto > cursor:
                    # look back over the lateness allowance: points that arrived late still count
                    _pull(an, influx, cursor - int(cfg.analyzer["lateness_seconds"] * 1e9), upto)
                    cursor = upto
                an.advance_clock(upto / 1e9)
                an.engine.advance(upto / 1e9 - cfg.analyzer["lateness_seconds"])
                incs = an.incidents() + an.engine.absorbed
                changed = [
                    r for r in incs if written.get(r.id) != ("resolved" if r.end is not None else "firing")
                ]
                influx.write(incident_lines(changed))
                for r in changed:
                    written[r.id] = "resolved" if r.end is not None else "firing"
                if notifier is not None:
                    notifier.update(incs, time.time())
                if out_path:
                    _write(out_path, an.incidents())
                if attempt:
                    click.echo("gpufleet analyze: InfluxDB reachable again", err=True)
                attempt = 0
                time.sleep(poll)
            except GpufleetError as exc:
                wait = backoff(attempt)
                click.echo(f"gpufleet analyze: {exc}; retrying in {wait:.0f}s", err=True)
                attempt += 1
                checked = False
                time.sleep(wait)
    except KeyboardInterrupt:
        pass
    finally:
        if notifier is not None:
            notifier.close()


@click.command("eval")
@click.option("--truth", "truth_path", required=True, help="truth.jsonl from the simulator")
@click.option("--incidents", "inc_path", required=True, help="incidents.jsonl from gpufleet analyze")
@click.option(
    "--gpu-days",
    type=float,
    help="GPU-days observed (default: counted from --data, else from the telemetry beside the truth)",
)
@click.option("--data", "data_path", help="the telemetry the incidents came from (.lp/.lp.gz or a directory)")
@click.option("--lenient", is_flag=True, help="old rule: every matching incident is true (duplicates hidden)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def eval_cmd(truth_path, inc_path, gpu_days, data_path, lenient, as_json):
    """Score incidents against ground truth, one page per fault: precision, recall, F1, latency,
    duplicate pages, false incidents per 1000 GPU-days."""
    from analyzer.evaluate import (
        evaluate,
        gpu_days_from_data,
        gpu_days_from_manifest,
        table,
        telemetry_beside,
    )
    from gpufleet import records

    truth = records.read(truth_path)
    incs = records.read(inc_path)
    if gpu_days is None:
        data = data_path or telemetry_beside(truth_path)
        if data is not None:
            gpu_days = gpu_days_from_data(data)
        else:
            gpu_days = gpu_days_from_manifest(truth_path)
    res = evaluate(truth, incs, gpu_days, lenient=lenient)
    if as_json:
        click.echo(json.dumps(res, sort_keys=False))
    else:
        click.echo(table(res))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(analyze())
