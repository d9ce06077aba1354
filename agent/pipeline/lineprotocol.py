"""An OpenTelemetry ``MetricExporter`` that turns metric data back into wide line-protocol rows.

Each data point is mapped back to its catalogue entry (instrument name + fixed attributes);
points that share measurement, tags and time become one row (one line per GPU per timestamp,
not one per metric). Tags: the resource's ``host.name`` as ``host``, the operator labels, and the
point's remaining attributes (less the GPU identity ones, ``hw.id`` ...), sorted and escaped
(``gpufleet.lineprotocol``). Field types follow the catalogue: an ``int`` field is always
written ``123i``, a ``float`` field always as a float (InfluxDB refuses a field whose type
changes), strings quoted. Rows are stamped with the tick's
poll time (events with their own time) at ns or s precision, then handed to the sinks
(the file writer, the spool of the influx exporter).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from gpufleet.agent.pipeline.mapping import EVENT_TIME, Catalogue
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from gpufleet.lineprotocol import escape_key, format_value
from gpufleet.lineprotocol import head as lp_head

log = logging.getLogger("gpufleet.agent.lineprotocol")

_RESOURCE_SKIP = ("service.", "telemetry.")
MAX_PLANS = 20_000  # cached point plans (a node's steady state is a few thousand): then start over


def _fmt(v: object, typ: type) -> str | None:
    if typ is int:
        if isinstance(v, float):
            if not math.isfinite(v):
                return None
            v = int(v)
        return f"{int(v)}i"
    if typ is float:
        v = float(v)
        if not math.isfinite(v):
            return None
        return repr(v)
    if typ is str:
        return format_value(str(v))
    return format_value(v)


class LineProtocolExporter(MetricExporter):
    """Metric data -> sorted, escaped line protocol -> every sink's ``write(lines)``."""

    name = "lineprotocol"

    def __init__(self, sinks: Sequence[object] = (), catalogue: Catalogue | None = None,
                 precision: str = "ns"):
        super().__init__()
        self.sinks = list(sinks)
        self.cat = catalogue or Catalogue()
        self.divisor = {"ns": 1, "s": 1_000_000_000}[precision]
        self._heads: dict[tuple, str] = {}
        self._plans: dict[tuple, dict[tuple, tuple | None]] = {}  # resource -> point -> plan
        self.lines_total = 0
        self.encode_seconds = 0.0
        self.encode_cpu_seconds = 0.0

    # ------------------------------------------------------------------ encoding
    def _point_plan(self, inst, attrs, base_items: tuple):
        """What a data point of ``inst`` with ``attrs`` becomes: ``(row head, "field=", type,
        formatted value or None)``; None when the point maps to no catalogue entry.

        The value is fixed for ``info`` points (their string is an attribute); the others format
        ``dp.value`` with the type. Plans are cached per instrument and attribute set.
        """
        m = self.cat.metric_for(inst, attrs)
        if m is None:
            return None
        keys = inst.keys
        fixed_value = None
        ident = self.cat.identity_keys  # derived from the tags: never tags of their own
        if inst.kind == "info":
            tags = tuple((k, v) for k, v in attrs.items()
                         if k not in keys and k not in inst.fields_by_attr and k not in ident)
            val = next((v for k, v in attrs.items() if k in inst.fields_by_attr), None)
            fixed_value = None if val is None else _fmt(val, str)
            if fixed_value is None:
                return None
        else:
            tags = tuple((k, v) for k, v in attrs.items() if k not in keys and k not in ident)
        head = self._head(inst.measurement, base_items + tags)
        return head, escape_key(m.field) + "=", m.python_type, fixed_value

    def _head(self, meas: str, tags: tuple) -> str:
        hk = (meas, tags)
        head = self._heads.get(hk)
        if head is None:
            head = self._heads[hk] = lp_head(meas, {k: str(v) for k, v in tags})
        return head

    def rows(self, metrics_data: MetricsData, tick_ns: int) -> dict[tuple[str, int], list[str]]:
        """``(row head, time) -> ["field=value", ...]``: one wide row per measurement, tag set and
        time, its fields in instrument order."""
        rows: dict[tuple[str, int], list[str]] = {}
        by_name = self.cat.by_name
        if sum(len(p) for p in self._plans.values()) > MAX_PLANS:  # tag sets and info strings come
            self._plans.clear()  # and go (jobs, GPUs): keep the caches bounded
            self._heads.clear()
        for rm in metrics_data.resource_metrics:
            base: dict[str, str] = {}
            for k, v in rm.resource.attributes.items():
                if k == "host.name":
                    base["host"] = str(v)
                elif not k.startswith(_RESOURCE_SKIP):
                    base[k] = str(v)
            base_items = tuple(base.items())
            plans = self._plans.setdefault(base_items, {})
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    inst = by_name.get(metric.name)
                    if inst is None:
                        continue
                    if inst.kind == "event":
                        for dp in metric.data.data_points:
                            self._event_row(rows, inst, base_items, dp.attributes)
                        continue
                    name = metric.name
                    for dp in metric.data.data_points:
                        attrs = dp.attributes
                        pk = (name, tuple(attrs.items()))
                        plan = plans.get(pk, _NO_PLAN)
                        if plan is _NO_PLAN:
                            plan = plans[pk] = self._point_plan(inst, attrs, base_items)
                        if plan is None:
                            continue
                        head, fkey, typ, fv = plan
                        if fv is None:
                            v = dp.value
                            if typ is float:
                                if v.__class__ is not float:
                                    v = float(v)
                                fv = repr(v) if v - v == 0.0 else None  # NaN and infinities: left out
                            elif typ is int and v.__class__ is int:
                                fv = f"{v}i"
                            else:
                                fv = _fmt(v, typ)
                            if fv is None:
                                continue
                        row = rows.get((head, tick_ns))
                        if row is None:
                            row = rows[(head, tick_ns)] = []
                        row.append(fkey + fv)
        return rows

    def _event_row(self, rows, inst, base_items, attrs) -> None:
        t = attrs.get(EVENT_TIME)
        tags = []
        fields = []
        for k, v in attrs.items():
            m = inst.fields_by_attr.get(k)
            if m is not None:
                fv = _fmt(v, m.python_type)
                if fv is not None:
                    fields.append(f"{escape_key(m.field)}={fv}")
            elif k != EVENT_TIME and k not in self.cat.identity_keys:
                tags.append((k, v))
        if fields and t is not None:
            row = rows.setdefault((self._head(inst.measurement, base_items + tuple(tags)), int(t)), [])
            if row:  # another event with the same tags and time: its fields are overwritten
                names = {f.split("=", 1)[0] for f in fields}
                row[:] = [f for f in row if f.split("=", 1)[0] not in names]
            row.extend(fields)

    def encode(self, metrics_data: MetricsData, tick_ns: int) -> list[str]:
        div = self.divisor
        return [f"{head} {','.join(fields)} {t // div}"
                for (head, t), fields in self.rows(metrics_data, tick_ns).items()]

    # ------------------------------------------------------------------ MetricExporter
    def export_tick(self, metrics_data: MetricsData, tick_ns: int) -> MetricExportResult:
        t0, c0 = time.perf_counter(), time.process_time()
        lines = self.encode(metrics_data, tick_ns)
        self.lines_total += len(lines)
        ok = True
        for sink in self.sinks:
            try:
                sink.write(lines)
            except OSError as exc:  # a sink that cannot write (spool unwritable) logs and counts it itself
                log.debug("sink %s: %s", getattr(sink, "name", type(sink).__name__), exc)
                ok = False
            except Exception:  # one failing sink never stops the others
                log.exception("sink %s failed", getattr(sink, "name", type(sink).__name__))
                ok = False
        self.encode_seconds = time.perf_counter() - t0  # encoding and the sinks' writes
        self.encode_cpu_seconds = time.process_time() - c0
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs) -> MetricExportResult:
        return self.export_tick(metrics_data, time.time_ns())

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if close is not None:
                close()


_NO_PLAN = object()

