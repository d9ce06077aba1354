"""``gpufleet analyze`` and ``gpufleet eval``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click
from gpufleet.analyzer.store import pull as _pull

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.flags import influx_options
from gpufleet.units import parse_size


class _SinkOption(click.Option):
    """``--sink``: its help names the registered sink types, read when help is shown (importing
    every sink module is kept off the command's start)."""

    def get_help_record(self, ctx):
        from gpufleet.analyzer.alerting import sink_classes

        template = self.__dict__.setdefault("template", self.help or "")
        self.help = template.format(types=", ".join(sink_classes()))
        return super().get_help_record(ctx)


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
    """RFC 3339 (no zone: UTC) or epoch seconds -> ns."""
    from gpufleet.times import parse_time

    try:
        return int(parse_time(value, what) * 1e9)
    except GpufleetError:
        raise ConfigError(
            f"{what} {value!r}: expected RFC 3339 (2026-11-26T03:00:00Z) or epoch seconds"
        ) from None


def _sinks(cfg, specs):
    if not cfg.sinks and not specs:
        return None
    try:
        from gpufleet.analyzer import alerting

        load_sinks, notifier_cls = alerting.load_sinks, alerting.Notifier
    except (ImportError, AttributeError):
        raise ConfigError("alert sinks are configured but gpufleet.analyzer.alerting is not available") \
            from None
    return load_sinks(cfg.sinks, list(specs)), notifier_cls


@click.command("analyze")
@click.option("--input", "input_path", help="a .lp/.lp.gz file or a directory of them")
@influx_options()
@click.option("--since", help="with --influx-url: analyse the last DURATION (e.g. 6h)")
@click.option("--start", help="with --influx-url: start time (RFC 3339 or epoch seconds)")
@click.option("--end", help="with --influx-url: end time")
@click.option("--follow", is_flag=True, help="online mode: pull new data from InfluxDB every poll")
@click.option("--listen", "listen_addr", metavar="HOST:PORT",
              help="online mode: receive the InfluxDB write protocol here (/write, /api/v2/write)")
@click.option("--listen-token-file", "token_file",
              help="with --listen: file holding the token writers must send (or env GPUFLEET_LISTEN_TOKEN)")
@click.option("--listen-writers", "writers_file",
              help="with --listen: file of per-writer tokens, each bound to the hosts it may write "
                   "(docs/alerting.md, trust model)")
@click.option("--max-body", default="32MiB", show_default=True, help="with --listen: largest write body")
@click.option("--max-queue", default="256MiB", show_default=True,
              help="with --listen: bytes received and not yet analysed before writers get 429")
@click.option("--listen-timeout", default="10s", show_default=True,
              help="with --listen: a request head (and each read of a body) must arrive within this")
@click.option("--listen-max-connections", default=10000, show_default=True, type=click.IntRange(min=8),
              help="with --listen: open connections at most (and always 64 below the open-files limit)")
@click.option("--grace", help="online mode: how late after its timestamp a point may arrive "
              "(default: the poll interval)")
@click.option("--lateness", help="online mode: how far behind the analysis a host's rows may land and "
              "still be analysed in its own time (default: [analyzer] late_bound_seconds, 24h)")
@click.option("--out", "out_path", help="write incidents as JSON lines here")
@click.option("--config", "config_path", help="analyzer.toml")
@click.option("--sink", "sink_specs", multiple=True, metavar="TYPE=URL", cls=_SinkOption,
              help="alert sink (repeatable); TYPE: {types} (docs/alerting.md)")
@click.option("--shard", help="analyse only hosts of shard I of N (I/N)")
@click.option("--state", "state_path", help="notifier state file: what was paged, so a rerun pages only "
              "what is new (batch: none kept unless given; online: default beside --out)")
@click.option("--page-base-url", help="base URL of incident pages, for links in alerts")
@click.option("--runbook-base-url", help="base URL of the runbooks (docs/runbooks/), for links in alerts "
              "[env GPUFLEET_RUNBOOK_BASE_URL]")
@click.option("--poll", default="10s", show_default=True, help="online mode: how often to query")
@click.option("--stats", is_flag=True, help="print parse and analysis counters to stderr")
def analyze(
    input_path,
    influx,
    since,
    start,
    end,
    follow,
    listen_addr,
    token_file,
    writers_file,
    max_body,
    max_queue,
    listen_timeout,
    listen_max_connections,
    grace,
    lateness,
    out_path,
    config_path,
    sink_specs,
    shard,
    state_path,
    page_base_url,
    runbook_base_url,
    poll,
    stats,
):
    """Detect incidents in fleet telemetry (files or InfluxDB)."""
    if runbook_base_url:  # read where alerts are built (gpufleet.analyzer.alerting.actions.runbook_base)
        os.environ["GPUFLEET_RUNBOOK_BASE_URL"] = runbook_base_url
    from gpufleet.analyzer.config import Config, parse_duration
    from gpufleet.analyzer.pipeline import Analyzer

    cfg = Config.load(config_path)
    shard_t = _shard(shard)
    sinks = _sinks(cfg, sink_specs)  # a bad sink is a ConfigError before any work
    influx.refuse(["org"], "analyze reads with InfluxQL (/query), which names no org: give --influx-db "
                  "(or --influx-bucket) as the DBRP-mapped database")
    influx_url, db = influx.url, influx.db or influx.bucket
    if influx.api in ("v2", "v3") and not (influx.token_file or cfg.influx.get("token_file")
                                           or cfg.influx.get("token_env")):
        raise ConfigError(f"--influx-api {influx.api} needs --influx-token-file (or [influx] token_file)")
    if not input_path:  # the store named in the config ([influx] url, db), as the packaged unit runs it
        influx_url = influx_url or cfg.influx.get("url")
        db = db or cfg.influx.get("db")
    if listen_addr and input_path:
        raise ConfigError("--listen reads no files: drop --input")
    if not listen_addr and bool(input_path) == bool(influx_url):
        raise ConfigError("give exactly one of --input PATH or --influx-url URL --influx-db NAME "
                          "(or [influx] url and db in --config)")
    if follow and listen_addr:
        raise ConfigError("give --follow or --listen, not both")
    if writers_file and not listen_addr:
        raise ConfigError("--listen-writers binds --listen's writers: give --listen too")
    if follow and not influx_url:
        raise ConfigError("--follow needs --influx-url")
    if out_path:
        _check_out(out_path)
    poll_s = parse_duration(poll, "--poll")
    if poll_s < 1.0:
        raise ConfigError(f"--poll {poll}: at least 1s")
    t0 = time.perf_counter()
    if input_path:
        from gpufleet.analyzer.sources import read_chunks

        an = Analyzer(cfg, shard_t)
        for chunk in read_chunks(input_path):
            an.feed_bytes(chunk)
        st = an.parser.stats
        if st.points == 0:
            raise GpufleetError(f"--input {input_path}: nothing parsed: no line-protocol point of a "
                                f"measurement the analyzer reads ({st.lines} lines, "
                                f"{st.bad_lines} malformed)")
        an.finish()
        _write(out_path, an.incidents())
        _notify_once(sinks, state_path, page_base_url, an)
        _report(an, stats, time.perf_counter() - t0)
        return
    auth = influx
    influx = None
    if influx_url:
        if not db:
            raise ConfigError("--influx-url needs --influx-db NAME (or [influx] db in --config)")
        from gpufleet.analyzer.sources import Influx

        influx = Influx(influx_url, db, **{**cfg.influx_auth(), **auth.secrets()})
    if follow or listen_addr:
        _online(
            cfg,
            influx,
            shard_t,
            out_path,
            sinks,
            state_path,
            page_base_url,
            poll_s,
            parse_duration(grace, "--grace") if grace else None,
            parse_duration(since, "--since") if since else None,
            listen_addr,
            token_file,
            parse_size(max_body, "--max-body", ConfigError, minimum=1),
            parse_size(max_queue, "--max-queue", ConfigError, minimum=1),
            writers_file,
            {"read_timeout": parse_duration(listen_timeout, "--listen-timeout"),
             "max_connections": listen_max_connections},
            parse_duration(lateness, "--lateness") if lateness else None,
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
    _notify_once(sinks, state_path, page_base_url, an)
    _report(an, stats, time.perf_counter() - t0)


def _check_out(out_path: str) -> None:
    """``--out`` must name a file that can be written (checked before any work): the records are
    written to ``OUT.tmp`` beside it, then renamed over it."""
    import os

    p = Path(out_path)
    if p.is_dir():
        raise ConfigError(f"--out {out_path}: is a directory; give a file path")
    parent = p.resolve().parent
    if not parent.is_dir():
        raise ConfigError(f"--out {out_path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out_path}: directory {parent} is not writable")
    if p.exists() and not (p.is_file() and os.access(p, os.W_OK)):
        raise ConfigError(f"--out {out_path}: not a writable file")
    tmp = p.with_suffix(p.suffix + ".tmp")
    if tmp.is_dir():
        raise ConfigError(f"--out {out_path}: {tmp} (its temporary file) is a directory")


def _state_path(state_path, out_path) -> str:
    if state_path:
        return state_path
    if out_path:
        return str(Path(out_path).with_suffix(".notifier.db"))
    # the user's state directory, never the current one (a checkout would grow an untracked file)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    path = Path(base) / "gpufleet" / "analyzer-notifier.db"
    click.echo(f"alerts: notifier state in {path} (--state FILE to choose)", err=True)
    return str(path)


def _notify_once(sinks, state_path, page_base_url, an) -> None:
    """Batch mode with sinks: deliver the incidents found (new ones fire, ended ones resolve).

    The notifier's state is kept only in ``--state`` (a rerun with it pages only what is new, and
    says how many it did not page again); without it, nothing is kept and every run pages all."""
    if sinks is None:
        return
    sink_list, notifier_cls = sinks
    notifier = notifier_cls(sink_list, state_path or ":memory:", page_base_url)
    notifier.fleet = _members(an.reg)
    incidents = an.incidents() + an.engine.absorbed
    try:
        known = notifier.known(incidents) if state_path else 0
        notifier.update(incidents, time.time())
    finally:
        notifier.close()
    if known:
        click.echo(f"alerts: {known} of {len(incidents)} incident(s) not paged again: --state {state_path} "
                   "records them as already sent (drop --state or use another file to page them again)",
                   err=True)


def _members(reg):
    """(host, rack, cluster) of every host the analysis knows (the lists only grow: a read from
    the notifier's threads sees a consistent prefix)."""
    return lambda: zip(list(reg.hosts), list(reg.host_rack), list(reg.host_cluster), strict=False)


def _write(out_path, incidents) -> None:
    from gpufleet import records

    if out_path:
        records.write(out_path, incidents)
    else:
        for r in incidents:
            click.echo(r.to_json())


def summary_line(an, seconds: float) -> str:
    """One line on what ``analyze`` did: rows, GPUs, time span, incidents by kind, informational records
    (severity info, never paged) by kind, time taken."""
    from collections import Counter

    from gpufleet.times import to_rfc3339

    recs = an.incidents()
    incs = [r for r in recs if r.severity != "info"]
    kinds = Counter(r.kind for r in incs)
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    info = Counter(r.kind for r in recs if r.severity == "info")
    notes = ", ".join(f"{k} {n}" for k, n in sorted(info.items()))
    last = max(an.stream_wm.values(), default=None)
    span = ""
    if last is not None and an.t_first <= last:
        span = (f", {to_rfc3339(an.t_first / 1e9)} .. {to_rfc3339(last / 1e9)} "
                f"({(last - an.t_first) / 3.6e12:.1f} h)")
    return (f"analyze: {an.rows} rows, {len(an.reg.gpu_host)} GPUs{span}, {len(incs)} incident(s)"
            + (f" ({by_kind})" if by_kind else "")
            + (f", {sum(info.values())} informational ({notes})" if notes else "") + f" in {seconds:.1f} s")


def _report(an, stats: bool, seconds: float) -> None:
    click.echo(summary_line(an, seconds), err=True)
    if not stats:
        return
    d = an.parser.stats.as_dict()
    d.update(
        late_points=an.late_points,
        future_points=an.future_points,
        gpu_samples=an.gpu_samples,
        windows=an.windows,
        unsafe_host_series=an.parser.series.unsafe_series,
        incidents=len(an.incidents()),
        seconds=round(seconds, 3),
        gpu_samples_per_s=round(an.gpu_samples / seconds) if seconds > 0 else None,
    )
    click.echo(json.dumps(d), err=True)




def _token(token_file) -> str | None:
    """The token writers must send to --listen: --listen-token-file, else env GPUFLEET_LISTEN_TOKEN."""
    from gpufleet.secrets import read_secret

    if token_file:
        return read_secret("--listen-token", token_file)
    return os.environ.get("GPUFLEET_LISTEN_TOKEN") or None


def _online(cfg, influx, shard_t, out_path, sinks, state_path, page_base_url, poll, grace, since,
            listen_addr, token_file, max_body, max_queue, writers_file=None, limits=None,
            lateness=None) -> None:
    """--follow and --listen: see analyzer/online.py."""
    import signal

    from gpufleet.analyzer.online import Checkpoint, Online, follow, listen

    if poll <= 0:
        raise ConfigError("--poll must be positive")
    grace = poll if grace is None else grace
    if grace < 0:
        raise ConfigError("--grace must not be negative")
    listener = None
    if listen_addr:
        from gpufleet.analyzer.listen import Listener, parse_address

        address = parse_address(listen_addr)
        token = _token(token_file)
        writers = None
        if writers_file:
            from gpufleet.analyzer.writers import Writers

            writers = Writers.load(writers_file)
    notifier = None
    if sinks is not None:
        sink_list, notifier_cls = sinks
        state_path = _state_path(state_path, out_path)
        notifier = notifier_cls(sink_list, state_path, page_base_url)
    keep = state_path or out_path
    checkpoint = Checkpoint(Path(_state_path(state_path, out_path)).with_suffix(".checkpoint.json")
                            if keep else None)
    online = Online(cfg, shard_t, influx, notifier, out_path, checkpoint, poll, grace, lateness)
    if notifier is not None:
        notifier.fleet = _members(online.an.reg)
    for d in online.an.detectors:  # a daemon pays its imports at start, not on the window that
        d.warm()                    # first needs them (that window's alert would wait for them)

    def stop(_sig, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        if listen_addr:
            listener = Listener(address, online.an.parser, token, max_body, max_queue, retry_after=poll,
                                gauges=online.gauges, writers=writers, **(limits or {}))
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
    import math

    from gpufleet.analyzer.evaluate import (
        evaluate,
        gpu_days_from_data,
        gpu_days_from_manifest,
        table,
        telemetry_beside,
    )

    from gpufleet import records

    if gpu_days is not None and not (math.isfinite(gpu_days) and gpu_days > 0):
        raise ConfigError(f"--gpu-days {gpu_days}: must be a positive number")
    truth = records.read(truth_path)
    incs = records.read(inc_path)
    if gpu_days is None:
        data = data_path or telemetry_beside(truth_path)
        if data is not None:
            gpu_days = gpu_days_from_data(data)
        else:
            gpu_days = gpu_days_from_manifest(truth_path)
        if gpu_days is not None and not (math.isfinite(gpu_days) and gpu_days > 0):
            raise GpufleetError(f"{truth_path}: the GPU-days counted from the data or manifest.json "
                                f"beside it are {gpu_days}; pass --gpu-days")
    res = evaluate(truth, incs, gpu_days, lenient=lenient)
    if as_json:
        click.echo(json.dumps(res, sort_keys=False))
    else:
        click.echo(table(res))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(analyze())
