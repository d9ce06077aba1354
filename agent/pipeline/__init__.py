"""The export pipeline: samples -> OpenTelemetry SDK -> exporters.

One :class:`Pipeline` per agent: a ``MeterProvider`` whose ``Resource`` carries ``host.name``,
``service.name``, ``service.version`` and the operator labels; one instrument per catalogue
``otel`` name; one :class:`TickReader` that the daemon collects once per tick, right after the
poll (so the export interval is the poll interval).

Per tick: :meth:`Pipeline.observe` takes every collector's samples in one pass and files each
value under its instrument; the SDK then calls each observable instrument's single callback,
which hands back the observations filed for it (sources are polled once per tick, never once
per instrument). ``info`` and ``event`` entries are recorded on synchronous gauges with delta
temporality: a job id or an event seen once is exported once and never again. Observable
instruments are cumulative; the SDK exports an attribute set only when its callback observed it
in this collection, so a GPU that disappears leaves no stale points behind. The attribute sets
the SDK keeps are bounded by rebuilding the provider (see :class:`Pipeline`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from gpufleet.agent.model import Sample
from gpufleet.agent.pipeline.mapping import EVENT_TIME, Catalogue
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, ExemplarReservoir, MeterProvider
from opentelemetry.sdk.metrics import _Gauge as Gauge  # the synchronous gauge class readers key on
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource

from gpufleet import __version__

log = logging.getLogger("gpufleet.agent.pipeline")

SERVICE_NAME = "gpufleet-agent"
SCOPE = "gpufleet.agent"


class _NoExemplars(ExemplarReservoir):
    """Exemplars are off (``AlwaysOffExemplarFilter``); this reservoir also skips the per-point
    bookkeeping the SDK's default reservoirs still do at every collection."""

    def __init__(self, **kwargs):
        pass

    def offer(self, value, time_unix_nano, attributes, context) -> None:
        pass

    def collect(self, point_attributes) -> list:
        return []


_NO_EXEMPLARS = _NoExemplars()


def _no_exemplars(aggregation_type):
    return lambda **kwargs: _NO_EXEMPLARS


class TickReader(MetricReader):
    """A reader collected by the daemon once per tick; hands each collection to its exporters.

    ``tick_ns`` is the poll time of the collection in progress: exporters that write rows use it
    as the row timestamp (every sample of a tick was taken at that time).
    """

    def __init__(self, exporters: Sequence[MetricExporter] = ()):
        super().__init__(preferred_temporality={Gauge: AggregationTemporality.DELTA})
        self.exporters = list(exporters)
        self.tick_ns = 0
        self.results: dict[str, MetricExportResult] = {}

    def collect_tick(self, tick_ns: int) -> None:
        self.tick_ns = tick_ns
        self.collect()

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> None:
        for exp in self.exporters:
            name = getattr(exp, "name", type(exp).__name__)
            try:
                if hasattr(exp, "export_tick"):
                    res = exp.export_tick(metrics_data, self.tick_ns)
                else:
                    res = exp.export(metrics_data, timeout_millis=timeout_millis)
            except Exception:  # an exporter that raises is logged; the others still get the data
                log.exception("exporter %s failed", name)
                res = MetricExportResult.FAILURE
            self.results[name] = res

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        for exp in self.exporters:
            try:
                exp.shutdown(timeout_millis=timeout_millis)
            except Exception:
                log.exception("exporter shutdown failed")


MAX_ATTRIBUTE_SETS = 1000  # per instrument between two rebuilds: half the SDK's cardinality limit


class Pipeline:
    """Samples in, one OpenTelemetry collection per tick out to the exporters.

    **Bounded state.** The SDK keeps every attribute set an observable instrument has reported
    for the life of its ``MeterProvider`` (before opentelemetry-sdk 1.45.2 it does so for every
    instrument), and past its cardinality limit (2,000 per instrument) reports new sets only as
    ``{otel.metric.overflow: true}``, without GPU identity. Attribute sets that change with jobs
    (``gpu.job_tags``, the job id info point) and events would reach it on a long-running agent.
    The pipeline counts the distinct attribute sets it hands each instrument; when one reaches
    ``MAX_ATTRIBUTE_SETS`` it builds a fresh provider (same resource, instruments and exporters)
    before the next collection and shuts the old one down, so stale sets are dropped and no
    instrument comes near the limit. Nothing is lost: every tick observes every current value
    again (counters as their cumulative totals); an OTLP receiver sees the cumulative streams
    restart with a new start time, as after an agent restart. ``rebuilds`` counts them.
    """

    def __init__(self, host: str, labels: dict[str, str] | None = None,
                 exporters: Sequence[MetricExporter] = (), catalogue: Catalogue | None = None,
                 identity: bool = True):
        self.cat = catalogue or Catalogue()
        # GPU points carry the semantic conventions' hw.* identity (mapping.py); the agent asks for
        # it only when a listed exporter declares ``identity`` (otlp): the others drop it, and 5
        # more attributes per point cost the SDK ~17 % of a tick
        self.identity = identity
        self.host = host
        self.labels = dict(labels or {})
        attrs = {"host.name": host, "service.name": SERVICE_NAME, "service.version": __version__}
        attrs.update(self.labels)
        self.resource = Resource.create(attrs)
        self.exporters = list(exporters)
        self._obs: list[list[Observation]] = [[] for _ in self.cat.instruments]
        # per measurement: the instrument slots its fields feed (a new tag set is a new attribute
        # set on each of them)
        self._meas_slots = {meas: sorted({e.slot for e in entries.values()})
                            for meas, entries in self.cat.forward.items()}
        self.unknown: set[tuple[str, str]] = set()
        self.points = 0
        self.rebuilds = 0
        self._build()

    def _build(self) -> None:
        """The provider, its reader and one instrument per catalogue name; counts start at 0."""
        self.reader = TickReader(self.exporters)
        views = [View(instrument_name="*", exemplar_reservoir_factory=_no_exemplars)]
        self.provider = MeterProvider(resource=self.resource, metric_readers=[self.reader],
                                      exemplar_filter=AlwaysOffExemplarFilter(), views=views,
                                      shutdown_on_exit=False)
        meter = self.provider.get_meter(SCOPE, __version__)
        self._sync: dict[int, object] = {}
        for slot, inst in enumerate(self.cat.instruments):
            kw = {"unit": inst.unit, "description": inst.description}
            if inst.kind in ("info", "event"):
                self._sync[slot] = meter.create_gauge(inst.name, **kw)
                continue
            cb = self._callback(slot)
            if inst.kind == "counter":
                meter.create_observable_counter(inst.name, callbacks=[cb], **kw)
            elif inst.kind == "updowncounter":
                meter.create_observable_up_down_counter(inst.name, callbacks=[cb], **kw)
            else:
                meter.create_observable_gauge(inst.name, callbacks=[cb], **kw)
        self._attrs: dict[tuple, tuple[dict, dict]] = {}
        self._sets = [0] * len(self.cat.instruments)  # distinct attribute sets handed to each
        self._info_seen: set[tuple] = set()

    def _rebuild(self) -> None:
        old_reader, old_provider = self.reader, self.provider
        old_reader.exporters = []  # the exporters carry over to the new provider, open
        self._build()
        self.rebuilds += 1
        try:
            old_provider.shutdown()
        except Exception as exc:  # noqa: BLE001 - the old provider is dropped either way
            log.debug("old meter provider shutdown: %s", exc)
        log.debug("pipeline: fresh meter provider (%d so far), stale attribute sets dropped", self.rebuilds)

    def _callback(self, slot: int):
        obs = self._obs

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return obs[slot]

        return callback

    def observe(self, samples: Iterable[Sample]) -> int:
        """File every sample's fields under their instruments (one pass); returns the point count.

        A sample's attribute dict is built once per distinct tag set and kept (with one variant
        per set of fixed attributes), so a GPU seen every tick hands the SDK the same dicts.
        """
        if max(self._sets, default=0) >= MAX_ATTRIBUTE_SETS:
            self._rebuild()
        obs = [[] for _ in self.cat.instruments]
        forward = self.cat.forward
        sync = self._sync
        attrs_cache = self._attrs
        sets = self._sets
        info_seen = self._info_seen
        n = 0
        for s in samples:
            entries = forward.get(s.measurement)
            if entries is None:
                self._unknown(s.measurement, "*")
                continue
            tkey = tuple(s.tags.items())
            cached = attrs_cache.get(tkey)
            if cached is None:
                tags = {k: v for k, v in s.tags.items() if k != "host" and v is not None and v != ""}
                if self.identity:
                    tags.update(self.cat.identity_attributes(tags))  # hw.id, hw.name, ... (GPU rows)
                cached = attrs_cache[tkey] = (tags, {})
                for slot in self._meas_slots[s.measurement]:
                    sets[slot] += 1
            tags, variants = cached
            has_event = False
            for fname, value in s.fields.items():
                if value is None:
                    continue
                e = entries.get(fname)
                if e is None:
                    self._unknown(s.measurement, fname)
                    continue
                kind = e.kind
                if kind == "event":
                    has_event = True
                    continue
                if kind == "info":
                    a = dict(tags)
                    if e.fixed:
                        a.update(e.fixed)
                    a[e.info_key] = str(value)
                    ikey = (tkey, e.slot, a[e.info_key])
                    if ikey not in info_seen:
                        info_seen.add(ikey)
                        sets[e.slot] += 1
                    sync[e.slot].set(1, a)
                    n += 1
                    continue
                if isinstance(value, bool):
                    value = int(value)
                elif not isinstance(value, (int, float)):
                    continue
                a = tags
                if e.fixed:
                    a = variants.get(e.slot_key)
                    if a is None:
                        a = variants[e.slot_key] = {**tags, **e.fixed}
                obs[e.slot].append(Observation(value, a))
                n += 1
            if has_event:
                n += self._event(s, entries, tags)
        self._obs[:] = obs
        self.points = n
        return n

    def _event(self, s: Sample, entries, tags: dict) -> int:
        ev = None
        slot = 0
        for fname, value in s.fields.items():
            e = entries.get(fname)
            if e is None or e.kind != "event" or value is None:
                continue
            if ev is None:
                ev = dict(tags)
                ev[EVENT_TIME] = int(s.time_ns)
                slot = e.slot
            ev[e.event_key] = int(value) if isinstance(value, bool) else value
        if ev is None:
            return 0
        self._sets[slot] += 1  # every event is an attribute set of its own
        self._sync[slot].set(1, ev)
        return 1

    def _unknown(self, measurement: str, field: str) -> None:
        if (measurement, field) not in self.unknown:
            self.unknown.add((measurement, field))
            log.warning("sample field %s.%s is not in the catalogue; not exported", measurement, field)

    def collect(self, tick_ns: int | None = None) -> None:
        """One OpenTelemetry collection: every instrument read once, exporters called."""
        self.reader.collect_tick(tick_ns if tick_ns is not None else time.time_ns())
        for lst in self._obs:
            lst.clear()

    def shutdown(self) -> None:
        self.provider.shutdown()
