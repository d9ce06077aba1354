"""The ``prometheus`` exporter: a scrape endpoint (``GET /metrics``) serving the last completed poll.

Names (``[prometheus] names``):

- ``gpufleet``: ``<measurement>_<field>`` with the row's InfluxDB tags as labels -- the same
  series a VictoriaMetrics fed by the ``influx`` exporter stores, so one set of PromQL serves both.
- ``dcgm``: dcgm-exporter's names, types, units and labels (``gpu``, ``UUID``, ``device``,
  ``modelName``, ``Hostname``, and ``hpc_job`` where the GPU collector knows the job), from the
  catalogue's ``dcgm`` column (``docs/dcgm.md``); ``both``: the two sets side by side.

How it runs: every tick the SDK hands :meth:`PrometheusExporter.export_tick` the tick's metric
data; each point is filed under its series (a plan per instrument and attribute set, cached) and
the values are published as one immutable :class:`Snapshot`, swapped in by one assignment. A
scrape (a thread of a ``ThreadingHTTPServer``) reads the snapshot it finds and renders it (once per
snapshot and format, cached), so scrapes never call NVML, never wait for the poll loop and the
loop never waits for a scraper. Values of the slow tiers (limits, retired pages, NVLink rows, the
canary's last check) are held between the polls that read them, for as long as their GPU is
still reported and at most ``hold_s``; a GPU that disappears takes its series with it.

Why our own rendering: ``prometheus_client`` 0.26 (``generate_latest`` over a custom collector)
took 60 ms of CPU for the 1,700 series of an 8-GPU NVLink node on the 2-core test machine, 30
times the 2 ms a scrape may cost; the OpenTelemetry SDK's Prometheus exporter renames instruments
(unit suffixes, dots to underscores) and can serve neither dcgm-exporter's names nor the InfluxDB
ones. Here each series' name and labels are rendered once, and a scrape formats values only.
Both formats are checked with prometheus_client's parsers and by a real VictoriaMetrics
scraping the agent (``tests/test_prometheus.py``).

Content negotiation: ``Accept: application/openmetrics-text`` gets OpenMetrics 1.0.0 (counter
families without ``_total`` in the name are ``unknown`` there, as that format requires);
anything else the Prometheus text format 0.0.4.
"""

from __future__ import annotations

import http.client
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from operator import itemgetter

from gpufleet.agent.config import collector_classes, parse_listen
from gpufleet.agent.model import Exporter, register_exporter
from gpufleet.agent.pipeline.mapping import Catalogue
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from gpufleet.errors import ConfigError
from gpufleet.options import Option

log = logging.getLogger("gpufleet.agent.prometheus")

NAMES = ("gpufleet", "dcgm", "both")
TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
MAX_PLANS = 5_000  # cached point plans per instrument (a node's steady state: one per series)
MAX_HEADERS = 100  # request header lines, as http.client allows
MAX_SERIES = 100_000  # distinct series before the registry starts over (tag sets come and go)
_RESOURCE_SKIP = ("service.", "telemetry.")


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(pairs) -> str:
    return ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in pairs)


@dataclass(slots=True)
class Family:
    """One metric family: its sample name, types in both formats, help, and its series ids."""

    sample: str  # the name samples carry (a counter's includes _total)
    text_type: str  # TYPE in the text format
    om_name: str  # family name in OpenMetrics
    om_type: str
    help: str
    series: list[int] = field(default_factory=list)
    dcgm: bool = False  # a dcgm-exporter name: its GPU series carry the hpc_job label


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one scrape reads: the tick's time, series id -> value, and the jobs by GPU."""

    tick_ns: int
    values: dict
    jobs: dict  # uuid -> job id (dcgm names' hpc_job label)
    layout: tuple  # ((family, (series id, ...)), ...) as registered when the snapshot was made
    reg: _Registry | None = None  # the series registry those ids index (a reset starts a new one)


class _Registry:
    """Series id -> rendered name and labels, its GPU; the render caches. Appended to by the
    tick, read by scrapes; a reset replaces it whole, so a snapshot keeps the one it indexes."""

    __slots__ = ("prefix", "labels", "uuid", "job_prefix", "blocks", "family_prefixes", "job_prefixes",
                 "heads")

    def __init__(self):
        self.prefix: list[str] = []  # 'name{labels} '
        self.labels: list[tuple] = []
        self.uuid: list[str | None] = []
        self.job_prefix: dict[tuple[int, str], str] = {}  # (series id, job) -> prefix with hpc_job
        self.blocks: dict[tuple, tuple] = {}  # (family, format) -> (its values, jobs, text), last render
        self.family_prefixes: dict[tuple, tuple] = {}  # (family, series count) -> (getter, prefixes)
        self.job_prefixes: dict[tuple, tuple] = {}  # (family, series count) -> (jobs, prefixes with hpc_job)
        self.heads: dict[tuple, str] = {}  # (family, format) -> its HELP and TYPE lines


@dataclass(slots=True)
class _Out:
    sid: int
    scale: float
    held: bool  # a slow-tier value: kept between the polls that read it
    summed: bool  # dcgm sum over links
    integer: bool  # dcgm int64 field: the scaled value rounded down
    group: tuple  # the held group it belongs to (replaced whole when the group is read again)


@dataclass(slots=True)
class _Plan:
    outs: list
    uuid: str | None
    fast: bool  # this point's entry is read every poll (its GPU is present this tick)
    job_of: str | None = None  # gpu.job_id info point: the GPU uuid it names the job of
    slow_group: tuple | None = None


@register_exporter("prometheus")
class PrometheusExporter(MetricExporter, Exporter):
    """OTel metric data -> the latest snapshot; a threaded HTTP server renders it on GET /metrics."""

    # GET /metrics (dcgm-exporter's port); beyond loopback only when listen says so
    options = (  # the [prometheus] section
        Option("listen", "str", "127.0.0.1:9400", "`HOST:PORT` (`[v6]:PORT`) of `GET /metrics`, "
               "dcgm-exporter's port; beyond loopback only when given (`0.0.0.0:9400` to be scraped from "
               "other hosts)"),
        Option("names", "choice", "gpufleet", "`dcgm`: dcgm-exporter's names (docs/dcgm.md)",
               choices=("gpufleet", "dcgm", "both")),
    )

    @classmethod
    def check_active(cls, table: dict) -> None:
        parse_listen(table["listen"])

    @classmethod
    def describe(cls, table: dict) -> str:
        return f"GET /metrics on {table['listen']} ({table['names']} names)"

    @classmethod
    def build(cls, table: dict, agent) -> PrometheusExporter:
        # slow-tier values are held between the polls that read them: the longest cadence
        cfg = agent.cfg
        slow = [s for name, c in collector_classes().items() if name in cfg
                and (s := c.slowest_rows(cfg[name])) is not None]
        return cls(table["listen"], table["names"], hold_s=2 * max(60.0, *slow) + agent.interval)

    @classmethod
    def open_part(cls, part) -> None:
        part.start()

    @classmethod
    def close_part(cls, part) -> None:
        part.shutdown()

    def __init__(self, listen: str = "127.0.0.1:9400", names: str = "gpufleet", hold_s: float = 900.0,
                 catalogue: Catalogue | None = None):
        super().__init__()
        if names not in NAMES:
            raise ConfigError(f"config key 'prometheus.names': expected one of {', '.join(NAMES)}, "
                              f"got {names!r}")
        self.listen = listen
        self.host, self.port = parse_listen(listen)
        self.names = names
        self.hold_ns = int(hold_s * 1e9)
        self.cat = catalogue or Catalogue()
        self._gpufleet = names in ("gpufleet", "both")
        self._dcgm = names in ("dcgm", "both")
        self._reset()
        self._held: dict[tuple, tuple] = {}  # group -> (tick read, {sid: value}, its GPU's uuid)
        self._jobs: dict[str, str] = {}
        self.snapshot = Snapshot(0, {}, {}, ())
        self._cache: dict[tuple, bytes] = {}  # (snapshot id, format) -> rendered body
        self._cache_lock = threading.Lock()
        self.scrapes = 0
        self.export_cpu_seconds = 0.0
        self.server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _reset(self) -> None:
        self._families: list[Family] = []
        self._family_ix: dict[str, Family] = {}
        self._series: dict[tuple, int] = {}
        self._reg = _Registry()
        self._prefix = self._reg.prefix  # series id -> 'name{labels} ' (text and OpenMetrics alike)
        self._series_labels = self._reg.labels  # series id -> label pairs (for the job label)
        self._series_uuid = self._reg.uuid
        self._plans: dict[str, dict[int, tuple[object, _Plan | None]]] = {}
        self._resources: dict[int, tuple[object, tuple]] = {}
        self._layout: tuple = ()
        self._layout_len = -1

    # ------------------------------------------------------------------ server
    def start(self) -> None:
        """Bind and serve in a daemon thread; a bind failure is one ConfigError line."""
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # a stalled client loses its connection, never a thread for good
            protocol_version = "HTTP/1.1"

            def parse_request(self) -> bool:
                """A plain ``GET <path> HTTP/1.x`` read here (its headers into an HTTPMessage without
                the email parser, a third of a scrape's HTTP cost); any other request line as
                http.server checks it."""
                line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
                words = line.split()
                if (len(words) != 3 or words[0] != "GET" or words[2] not in ("HTTP/1.1", "HTTP/1.0")
                        or words[1].startswith("//")):
                    return super().parse_request()
                self.requestline = line
                self.command, self.path, self.request_version = words
                self.close_connection = words[2] == "HTTP/1.0"
                headers = http.client.HTTPMessage()
                for _ in range(MAX_HEADERS + 1):
                    raw = self.rfile.readline(65537)
                    if len(raw) > 65536:
                        self.send_error(431, "Line too long")
                        return False
                    if raw in (b"\r\n", b"\n", b""):
                        break
                    name, colon, value = raw.decode("iso-8859-1").partition(":")
                    if not colon or not name or name != name.strip():
                        self.send_error(400, "Bad header line")
                        return False
                    headers[name] = value.strip()
                else:
                    self.send_error(431, "Too many headers")
                    return False
                self.headers = headers
                conn = headers.get("Connection", "").lower()
                if conn == "close":
                    self.close_connection = True
                elif conn == "keep-alive":
                    self.close_connection = False
                return True

            def do_GET(self):  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    om = "application/openmetrics-text" in (self.headers.get("Accept") or "")
                    body = exporter.render(om)
                    self._send(200, OPENMETRICS if om else TEXT, body)
                elif path == "/":
                    self._send(200, "text/plain; charset=utf-8", b"gpufleet agent: metrics at /metrics\n")
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                # send_response's status line and headers, written with the body in one send
                self.log_request(code)
                if self.request_version == "HTTP/0.9":  # no status line, no headers
                    self.wfile.write(body)
                    return
                head = (f"{self.protocol_version} {code} {self.responses[code][0]}\r\n"
                        f"Server: {self.version_string()}\r\nDate: {self.date_time_string()}\r\n"
                        f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n")
                self.wfile.write(head.encode("latin-1") + body)

            def log_message(self, fmt, *args):
                log.debug("scrape from %s: " + fmt, self.client_address[0], *args)

        family = ThreadingHTTPServer.address_family
        if ":" in self.host:
            import socket

            family = socket.AF_INET6
        server_cls = type("Server", (ThreadingHTTPServer,),
                          {"address_family": family, "daemon_threads": True})
        try:
            self.server = server_cls((self.host, self.port), Handler)
        except OSError as exc:
            raise ConfigError(f"config key 'prometheus.listen': cannot listen on {self.listen}: "
                              f"{exc.strerror or exc}") from None
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="prometheus", daemon=True)
        self._thread.start()
        where = "" if is_loopback(self.host) else " (beyond loopback: prometheus.listen says so)"
        log.info("prometheus endpoint: http://%s:%d/metrics, names %s%s", self.host, self.port, self.names,
                 where)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs) -> MetricExportResult:
        return self.export_tick(metrics_data, time.time_ns())

    # ------------------------------------------------------------------ registry
    def _family(self, sample: str, text_type: str, om_name: str, om_type: str, help_: str) -> Family:
        fam = self._family_ix.get(sample)
        if fam is None:
            fam = self._family_ix[sample] = Family(sample, text_type, om_name, om_type, help_,
                                                   dcgm=sample.startswith("DCGM_"))
            self._families.append(fam)
        return fam

    def _sid(self, fam: Family, labels: tuple, uuid: str | None) -> int:
        key = (fam.sample, labels)
        sid = self._series.get(key)
        if sid is None:
            sid = self._series[key] = len(self._prefix)
            self._prefix.append(f"{fam.sample}{{{_labels(labels)}}} " if labels else f"{fam.sample} ")
            self._series_labels.append(labels)
            self._series_uuid.append(uuid)
            fam.series.append(sid)
        return sid

    def _gpufleet_family(self, m) -> Family | None:
        base = f"{m.measurement}_{m.field}"
        help_ = f"{m.description} ({m.unit})" if m.unit not in ("", "1") else m.description
        if m.kind == "info":
            return self._family(f"{base}_info", "gauge", base, "info", help_)
        if m.kind == "counter":
            if base.endswith("_total"):
                return self._family(base, "counter", base[: -len("_total")], "counter", help_)
            return self._family(base, "untyped", base, "unknown", help_)
        return self._family(base, "gauge", base, "gauge", help_)

    def _dcgm_family(self, m) -> Family:
        d = m.dcgm
        name = d["name"]
        help_ = f"{m.description} ({d['unit']})" if d["unit"] else m.description
        if d["type"] == "counter":  # dcgm-exporter's counters lack _total: OpenMetrics calls them unknown
            return self._family(name, "counter", name, "unknown", help_)
        return self._family(name, "gauge", name, "gauge", help_)

    def _dcgm_labels(self, tags: dict, base: dict) -> tuple:
        gpu = tags.get("gpu", "")
        out = [("gpu", gpu), ("UUID", tags.get("uuid", "")), ("device", f"nvidia{gpu}"),
               ("modelName", tags.get("model", "")), ("Hostname", base.get("host", ""))]
        names = {k for k, _ in out}
        out += [(k, v) for k, v in base.items() if k != "host" and k not in names]
        return tuple(out)

    def _plan(self, inst, attrs, base: dict) -> _Plan | None:
        m = self.cat.metric_for(inst, attrs)
        if m is None:
            return None
        ident = self.cat.identity_keys
        skip = set(inst.keys) | set(inst.fields_by_attr) | ident
        tags = {k: str(v) for k, v in attrs.items() if k not in skip}
        uuid = tags.get("uuid")
        held = m.tier != "fast"
        entity = (m.measurement, tuple(sorted(tags.items())))
        outs = []
        if m.kind == "info":
            val = next((v for k, v in attrs.items() if k in inst.fields_by_attr), None)
            if val is None:
                return None
            plan = _Plan([], uuid, False)
            if self._gpufleet:
                fam = self._gpufleet_family(m)
                labels = tuple(base.items()) + tuple(sorted(tags.items())) + ((m.field, str(val)),)
                sid = self._sid(fam, labels, uuid)
                plan.outs.append(_Out(sid, 1.0, held, False, False, (entity, m.tier)))
            if m.measurement == "gpu" and m.field == "job_id" and uuid:
                plan.job_of = uuid
            return plan
        if self._gpufleet:
            fam = self._gpufleet_family(m)
            labels = tuple(base.items()) + tuple(sorted(tags.items()))
            outs.append(_Out(self._sid(fam, labels, uuid), 1.0, held, False, False, (entity, m.tier)))
        if self._dcgm and m.dcgm and uuid and "gpu" in tags:
            fam = self._dcgm_family(m)
            summed = m.dcgm.get("sum") == "link"
            gtags = {k: v for k, v in tags.items() if k != "link"} if summed else tags
            gentity = ("dcgm", tuple(sorted(gtags.items())))
            sid = self._sid(fam, self._dcgm_labels(gtags, base), uuid)
            outs.append(_Out(sid, float(m.dcgm.get("scale", 1)), held, summed, m.dcgm.get("value") != "float",
                             (gentity, m.tier)))
        return _Plan(outs, uuid, not held, slow_group=((entity, "slow") if m.measurement == "gpu" else None))

    def _base(self, resource) -> dict:
        key = id(resource)
        got = self._resources.get(key)
        if got is None or got[0] is not resource:
            if len(self._resources) > 100:  # a fresh resource per provider rebuild
                self._resources.clear()
            base = {}
            for k, v in resource.attributes.items():
                if k == "host.name":
                    base["host"] = str(v)
                elif not k.startswith(_RESOURCE_SKIP):
                    base[k] = str(v)
            got = self._resources[key] = (resource, tuple(base.items()))
        return dict(got[1])

    # ------------------------------------------------------------------ per tick
    def export_tick(self, metrics_data: MetricsData, tick_ns: int) -> MetricExportResult:
        c0 = time.process_time()
        if len(self._prefix) > MAX_SERIES:
            self._reset()
            self._held.clear()
        cur: dict[int, float] = {}
        groups: dict[tuple, dict] = {}
        present: set = set()
        jobs_seen: dict[str, str] = {}
        slow_read: set = set()
        by_name = self.cat.by_name
        for rm in metrics_data.resource_metrics:
            base = self._base(rm.resource)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    inst = by_name.get(metric.name)
                    if inst is None:
                        continue
                    if inst.kind == "event":
                        if self._dcgm:
                            self._events(inst, metric.data.data_points, base, groups)
                        continue
                    plans = self._plans.get(metric.name)
                    if plans is None or len(plans) > MAX_PLANS:  # info points: a new dict each tick
                        plans = self._plans[metric.name] = {}
                    for dp in metric.data.data_points:
                        attrs = dp.attributes
                        got = plans.get(id(attrs))
                        if got is None or got[0] is not attrs:
                            got = plans[id(attrs)] = (attrs, self._plan(inst, attrs, base))
                        plan = got[1]
                        if plan is None:
                            continue
                        if plan.fast:
                            present.add(plan.uuid)
                        elif plan.slow_group is not None:
                            slow_read.add(plan.uuid)
                        if plan.job_of is not None:
                            jobs_seen[plan.job_of] = next(
                                (str(v) for k, v in attrs.items() if k in inst.fields_by_attr), "")
                        v = dp.value
                        if v.__class__ is float and v - v != 0.0:  # NaN and infinities: left out
                            continue
                        for o in plan.outs:
                            x = v * o.scale if o.scale != 1.0 else v
                            if o.integer and x.__class__ is not int:
                                x = math.floor(x + 1e-6)  # 0.29 * 100 is 28.999999999999996
                            if o.held:
                                g = groups.get(o.group)
                                if g is None:
                                    g = groups[o.group] = {}
                                target = g
                            else:
                                target = cur
                            if o.summed:
                                target[o.sid] = target.get(o.sid, 0) + x
                            else:
                                target[o.sid] = x
        held = self._held
        uuid_of = self._series_uuid
        for gk, vals in groups.items():  # a group's series are one entity's: one GPU
            held[gk] = (tick_ns, vals, uuid_of[next(iter(vals))])
        for uuid in slow_read:  # a slow poll of the GPU: its job is what that poll said
            if uuid in jobs_seen and jobs_seen[uuid]:
                self._jobs[uuid] = jobs_seen[uuid]
            else:
                self._jobs.pop(uuid, None)
        stale = tick_ns - self.hold_ns
        if present:  # the GPU collector reported: a held group of a GPU it no longer reports goes
            # a slow poll of a GPU replaces all its slow groups (a job-tag change leaves none behind)
            for gk in [gk for gk, (t, _, u) in held.items()
                       if (t < stale and gk[1] != "event") or (u is not None and u not in present)
                       or (t != tick_ns and gk[1] == "slow" and u in slow_read
                           and gk[0][0] in ("gpu", "dcgm"))]:
                del held[gk]
            for u in [u for u in self._jobs if u not in present]:
                del self._jobs[u]
        values = dict(cur)
        for _, vals, _ in held.values():
            values.update(vals)
        if len(self._prefix) != self._layout_len:
            self._layout = tuple((fam, tuple(fam.series)) for fam in self._families)
            self._layout_len = len(self._prefix)
        self.snapshot = Snapshot(tick_ns, values, dict(self._jobs), self._layout, self._reg)  # the one swap
        self.export_cpu_seconds = time.process_time() - c0
        return MetricExportResult.SUCCESS

    def _events(self, inst, points, base: dict, groups: dict) -> None:
        """Event points served under a dcgm name (the last XID code of a GPU), held until replaced."""
        for dp in points:
            attrs = dp.attributes
            for attr, m in inst.fields_by_attr.items():
                if not m.dcgm or attr not in attrs:
                    continue
                if any(str(attrs.get(k)) != str(v) for k, v in m.dcgm["match"].items()):
                    continue
                tags = {k: str(v) for k, v in attrs.items()
                        if k not in inst.fields_by_attr and k not in self.cat.identity_keys
                        and k in ("gpu", "uuid", "model")}
                if "uuid" not in tags or "gpu" not in tags:
                    continue
                v = attrs[attr]
                if not isinstance(v, (int, float)) or isinstance(v, float) and not math.isfinite(v):
                    continue
                fam = self._dcgm_family(m)
                sid = self._sid(fam, self._dcgm_labels(tags, base), tags["uuid"])
                gk = (("dcgm", tuple(sorted(tags.items())), fam.sample), "event")
                groups[gk] = {sid: int(v)}  # the latest event wins

    # ------------------------------------------------------------------ per scrape
    def render(self, openmetrics: bool = False) -> bytes:
        """The snapshot in the text format (or OpenMetrics), rendered once per snapshot and format."""
        snap = self.snapshot
        key = (id(snap), openmetrics)
        with self._cache_lock:
            self.scrapes += 1
            body = self._cache.get(key)
            if body is None:
                body = self._render(snap, openmetrics)
                self._cache = {key: body, **{k: v for k, v in self._cache.items()
                                             if k[0] == id(snap) and k != key}}
                self._cache_snap = snap  # keeps id(snap) from being reused while cached
        return body

    def _render(self, snap: Snapshot, om: bool) -> bytes:
        values, jobs, reg = snap.values, snap.jobs, snap.reg
        if reg is None:
            return b"# EOF\n" if om else b""
        blocks, plain, with_job = reg.blocks, reg.family_prefixes, reg.job_prefixes
        prefix, uuid_of = reg.prefix, reg.uuid
        out: list[bytes] = []
        add = out.append
        get = values.get
        for fam, sids in snap.layout:
            pkey = (fam.sample, len(sids))  # a family's series only ever grow
            fp = plain.get(pkey)
            if fp is None:  # its values' getter (a C-level one), its series' name and labels
                fp = plain[pkey] = (itemgetter(*sids) if len(sids) > 1 else None,
                                    tuple(map(prefix.__getitem__, sids)))
            try:
                vals = full = fp[0](values) if fp[0] is not None else tuple(map(get, sids))
            except KeyError:  # a series without a value this tick
                vals = full = tuple(map(get, sids))
            key = (fam.sample, om)
            fam_jobs = jobs if jobs and fam.dcgm else None  # the job rides as a label of dcgm series
            hit = blocks.get(key)
            if hit is not None and hit[0] == vals and hit[1] == fam_jobs:  # all held: its text again
                if hit[2]:
                    add(hit[2])
                continue
            if fam_jobs is None:
                pre = fp[1]
            else:  # each series' name and labels as its GPU's job has them
                got = with_job.get(pkey)
                if got is None or got[0] != fam_jobs:
                    pre = tuple(prefix[s] if (j := fam_jobs.get(uuid_of[s])) is None
                                else self._with_job(reg, s, j) for s in sids)
                    got = with_job[pkey] = (dict(fam_jobs), pre)
                pre = got[1]
            if None in vals:  # series without a value this tick: absent, never 0
                pre = [p for p, v in zip(pre, vals, strict=True) if v is not None]
                vals = [v for v in vals if v is not None]
            if vals:  # str of a float is its repr (shortest round-trip); ints as they are
                head = reg.heads.get(key)
                if head is None:
                    name, typ = (fam.om_name, fam.om_type) if om else (fam.sample, fam.text_type)
                    head = reg.heads[key] = f"# HELP {name} {_escape_help(fam.help)}\n# TYPE {name} {typ}\n"
                block = (head + "\n".join(map(str.__add__, pre, map(str, vals)))).encode()
                add(block)
            else:
                block = b""
            blocks[key] = (full, None if fam_jobs is None else dict(fam_jobs), block)
        if om:
            add(b"# EOF")
        if out:
            add(b"")  # the last line's newline
        return b"\n".join(out)

    @staticmethod
    def _with_job(reg: _Registry, sid: int, job: str) -> str:
        key = (sid, job)
        p = reg.job_prefix.get(key)
        if p is None:
            if len(reg.job_prefix) > MAX_SERIES:
                reg.job_prefix.clear()
            labels = reg.labels[sid] + (("hpc_job", job),)
            name = reg.prefix[sid].split("{", 1)[0]
            p = reg.job_prefix[key] = f"{name}{{{_labels(labels)}}} "
        return p
