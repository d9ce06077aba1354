"""An OpenTelemetry ``MetricExporter`` that turns metric data back into wide line-protocol rows.

Each data point is mapped back to its catalogue entry (instrument name + fixed attributes);
points that share measurement, tags and time become one row (one line per GPU per timestamp,
not one per metric). Tags: the resource's ``host.name`` as ``host``, the operator labels, and the
point's remaining attributes, sorted and escaped (``gpufleet.lineprotocol``). Field types follow
the catalogue: an ``int`` field is always written ``123i``, a ``float`` field always as a float
(InfluxDB refuses a field whose type changes), strings quoted. Rows are stamped with the tick's
poll time (events with their own time) at ns or s precision, then handed to the sinks
(the file writer, the spool of the influx exporter).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from agent.pipeline.mapping import EVENT_TIME, Catalogue
from gpufleet.lineprotocol import escape_key, escape_measurement, format_value

log = logging.getLogger("gpufleet.agent.lineprotocol")

_RESOURCE_SKIP = ("service.", "telemetry.")
_STR_ESC = str.maketrans({'"': r"\"", "\\": r"\\", "\n": r"\n", "\r": r"\r"})


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
        return '"' + str(v).translate(_STR_ESC) + '"'
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
        self.lines_total = 0
        self.encode_seconds = 0.0

    # ------------------------------------------------------------------ encoding
    def rows(self, metrics_data: MetricsData, tick_ns: int) -> dict[tuple, dict[str, str]]:
        """``(measurement, tags tuple, time) -> {escaped field key: formatted value}``."""
        rows: dict[tuple, dict[str, str]] = {}
        by_name = self.cat.by_name
        for rm in metrics_data.resource_metrics:
            base: dict[str, str] = {}
            for k, v in rm.resource.attributes.items():
                if k == "host.name":
                    base["host"] = str(v)
                elif not k.startswith(_RESOURCE_SKIP):
                    base[k] = str(v)
            base_items = tuple(base.items())
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    inst = by_name.get(metric.name)
                    if inst is None:
                        continue
                    keys = inst.keys
                    meas = inst.measurement
                    if inst.kind == "event":
                        for dp in metric.data.data_points:
                            self._event_row(rows, inst, meas, base_items, dp.attributes)
                        continue
                    info = inst.kind == "info"
                    for dp in metric.data.data_points:
                        attrs = dp.attributes
                        m = self.cat.metric_for(inst, attrs)
                        if m is None:
                            continue
                        if info:
                            tags = tuple((k, v) for k, v in attrs.items()
                                         if k not in keys and k not in inst.fields_by_attr)
                            val = next((v for k, v in attrs.items() if k in inst.fields_by_attr), None)
                            fv = None if val is None else _fmt(val, str)
                        else:
                            tags = tuple((k, v) for k, v in attrs.items() if k not in keys) if keys else \
                                tuple(attrs.items())
                            fv = _fmt(dp.value, m.python_type)
                        if fv is None:
                            continue
                        key = (meas, base_items + tags, tick_ns)
                        row = rows.get(key)
                        if row is None:
                            row = rows[key] = {}
                        row[m.field] = fv
        return rows

    def _event_row(self, rows, inst, meas, base_items, attrs) -> None:
        t = attrs.get(EVENT_TIME)
        tags = []
        fields = {}
        for k, v in attrs.items():
            m = inst.fields_by_attr.get(k)
            if m is not None:
                fv = _fmt(v, m.python_type)
                if fv is not None:
                    fields[m.field] = fv
            elif k != EVENT_TIME:
                tags.append((k, v))
        if fields and t is not None:
            rows.setdefault((meas, base_items + tuple(tags), int(t)), {}).update(fields)

    def encode(self, metrics_data: MetricsData, tick_ns: int) -> list[str]:
        out = []
        heads = self._heads
        if len(heads) > 50_000:
            heads.clear()
        div = self.divisor
        for (meas, tags, t), fields in self.rows(metrics_data, tick_ns).items():
            hk = (meas, tags)
            head = heads.get(hk)
            if head is None:
                head = escape_measurement(meas)
                for k, v in sorted(tags):
                    v = str(v)
                    if v == "":
                        continue
                    head += f",{escape_key(str(k))}={escape_key(_tag_value(v))}"
                heads[hk] = head
            body = ",".join(f"{escape_key(k)}={v}" for k, v in fields.items())
            out.append(f"{head} {body} {t // div}")
        return out

    # ------------------------------------------------------------------ MetricExporter
    def export_tick(self, metrics_data: MetricsData, tick_ns: int) -> MetricExportResult:
        t0 = time.perf_counter()
        lines = self.encode(metrics_data, tick_ns)
        self.encode_seconds = time.perf_counter() - t0
        self.lines_total += len(lines)
        ok = True
        for sink in self.sinks:
            try:
                sink.write(lines)
            except Exception:  # one failing sink never stops the others
                log.exception("sink %s failed", getattr(sink, "name", type(sink).__name__))
                ok = False
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


def _tag_value(v: str) -> str:
    """Tag values: newlines become spaces; a trailing backslash would escape the separator."""
    v = v.replace("\n", " ").replace("\r", " ")
    if v.endswith("\\"):
        v = v + " "
    return v
