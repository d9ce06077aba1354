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
@click.option("--follow", is_flag=True, help="online mode: pull new data from InfluxDB every poll")
@click.option("--listen", "listen_addr", metavar="HOST:PORT",
              help="online mode: receive the InfluxDB write protocol here (/write, /api/v2/write)")
@click.option("--token-file", help="with --listen: file holding the token writers must send "
              "(or env GPUFLEET_LISTEN_TOKEN)")
@click.option("--max-body", default="32MiB", show_default=True, help="with --listen: largest write body")
@click.option("--max-queue", default="256MiB", show_default=True,
              help="with --listen: bytes received and not yet analysed before writers get 429")
@click.option("--grace", help="online mode: how late after its timestamp a point may arrive "
              "(default: the poll interval)")
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
    listen_addr,
    token_file,
    max_body,
    max_queue,
    grace,
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
    if listen_addr and input_path:
        raise ConfigError("--listen reads no files: drop --input")
    if not listen_addr and bool(input_path) == bool(influx_url):
        raise ConfigError("give exactly one of --input PATH or --influx-url URL --db NAME")
    if follow and listen_addr:
        raise ConfigError("give --follow or --listen, not both")
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
    influx = None
    if influx_url:
        if not db:
            raise ConfigError("--influx-url needs --db NAME")
        from analyzer.sources import Influx

        influx = Influx(
            influx_url, db, **{k: v for k, v in cfg.influx.items() if k in ("username", "password", "token")}
        )
    if follow or listen_addr:
        _online(
            cfg,
            influx,
            shard_t,
            out_path,
            sinks,
            state_path,
            page_base_url,
            parse_duration(poll, "--poll"),
            parse_duration(grace, "--grace") if grace else None,
            parse_duration(since, "--since") if since else None,
            listen_addr,
            token_file,
            _size(max_body, "--max-body"),
            _size(max_queue, "--max-queue"),
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
    _pull(an, influx, s_ns, e_ns)
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


def _pull(an, influx, s_ns: int, e_ns: int) -> int:
    """Feed [s, e) from InfluxDB into the analyzer in large batches; returns the rows read."""
    from analyzer.sources import ahead, pull

    n = 0
    step = int(an.window * 1e9)
    skip = an.not_mine(influx.tag_values("host")) if an.shard else None  # a shard asks for its own hosts
    batches = pull(influx, an.wanted(), s_ns, e_ns, an.parser.series, step, words=an.tag_words(),
                   not_hosts=skip)
    for _a, _b, rows in ahead(batches):
        n += sum(len(r) for r in rows.values())
        an.feed_rows(rows)
    return n


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


def _size(value: str, what: str) -> int:
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    v = value.strip().lower()
    for u, f in units.items():
        if v.endswith(u):
            v, mult = v[: -len(u)], f
            break
    else:
        mult = 1
    try:
        n = int(float(v) * mult)
    except ValueError:
        n = 0
    if n <= 0:
        raise ConfigError(f"{what} {value!r}: expected a size, e.g. 32MiB")
    return n


def _token(token_file) -> str | None:
    import os

    if token_file:
        try:
            tok = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"--token-file {token_file}: {exc.strerror}") from None
        if not tok:
            raise ConfigError(f"--token-file {token_file}: empty")
        return tok
    return os.environ.get("GPUFLEET_LISTEN_TOKEN") or None


def _online(cfg, influx, shard_t, out_path, sinks, state_path, page_base_url, poll, grace, since,
            listen_addr, token_file, max_body, max_queue) -> None:
    """--follow and --listen: see analyzer/online.py."""
    import signal

    from analyzer.online import Checkpoint, Online, follow, listen

    if poll <= 0:
        raise ConfigError("--poll must be positive")
    grace = poll if grace is None else grace
    if grace < 0:
        raise ConfigError("--grace must not be negative")
    listener = None
    if listen_addr:
        from analyzer.listen import Listener, parse_address

        address = parse_address(listen_addr)
        token = _token(token_file)
    notifier = None
    if sinks is not None:
        sink_list, notifier_cls = sinks
        notifier = notifier_cls(sink_list, _state_path(state_path, out_path), page_base_url)
    keep = state_path or out_path or notifier is not None
    where = Path(_state_path(state_path, out_path)).with_suffix(".checkpoint.json")
    checkpoint = Checkpoint(where if keep else None)
    online = Online(cfg, shard_t, influx, notifier, out_path, checkpoint, poll, grace)

    def stop(_sig, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        if listen_addr:
            listener = Listener(address, online.an.parser, token, max_body, max_queue, retry_after=poll,
                                gauges=online.gauges)
            listen(online, listener, since)
        else:
            follow(online, since)
    except KeyboardInterrupt:
        pass
    finally:
        if listener is not None:
            listener.stop()
        online.close()


@click.command("eval")
@click.option("--truth", "truth_path", required=True, help="truth.jsonl from the simulator")
@click.option("--incidents", "inc_path", required=True, help="incidents.jsonl from gpufleet analyze")
@click.option(
    "--gpu-days", type=float, help="fleet size x duration (default: from manifest.json beside the truth)"
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def eval_cmd(truth_path, inc_path, gpu_days, as_json):
    """Score incidents against ground truth: precision, recall, F1, latency, false incidents."""
    from analyzer.evaluate import evaluate, gpu_days_from_manifest, table
    from gpufleet import records

    truth = records.read(truth_path)
    incs = records.read(inc_path)
    if gpu_days is None:
        gpu_days = gpu_days_from_manifest(truth_path)
    res = evaluate(truth, incs, gpu_days)
    if as_json:
        click.echo(json.dumps(res, sort_keys=False))
    else:
        click.echo(table(res))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(analyze())
