"""Catalogue <-> OpenTelemetry data points: the one mapping both directions use.

Forward (samples -> observations): a sample field ``(measurement, field)`` is the catalogue entry's
instrument ``otel``; its data-point attributes are the sample's identity tags (``gpu``, ``uuid``,
``model``, ``link``, ...) under their InfluxDB names plus the entry's fixed ``attributes`` (the ones
that tell entries sharing an instrument apart, e.g. ``hw.sensor_location``).

- ``info`` entries: a gauge of value 1; the string is the value of the entry's ``"*"`` attribute.
- ``event`` entries: every event is one point of value 1 on the event instrument; each field rides
  as an attribute ``<otel>.<field>`` with its own type, and the event's own time as
  ``gpufleet.event.time_unix_nano`` (events do not happen at the tick).

GPU identity per the OpenTelemetry semantic conventions: every point of a row with a ``uuid``
tag also carries the ``[otel_identity]`` attributes of the catalogue (``hw.id``, ``hw.name``,
``hw.vendor``, ``hw.model``, ``hw.type``), built from the row's tags
(:meth:`Catalogue.identity_attributes`).

Backward (points -> wide rows): :class:`Catalogue` tells which attributes of a point are fixed
ones and which entry they select, and which are identity attributes (``identity_keys``, derived
from tags, dropped again); the rest are the row's tags.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet import catalogue

EVENT_TIME = "gpufleet.event.time_unix_nano"
WILDCARD = "*"


@dataclass(slots=True)
class Entry:
    metric: catalogue.Metric
    slot: int  # index of the instrument (one per otel name and kind family)
    fixed: dict[str, str] | None  # fixed attributes, None when the entry has none
    info_key: str | None  # info: the attribute that carries the string
    event_key: str | None  # event: the attribute that carries this field
    cast: type
    kind: str = ""  # the metric's kind, at hand on the per-point path
    slot_key: tuple = ()  # the fixed attributes as a hashable key


@dataclass(slots=True)
class Instrument:
    name: str
    kind: str  # gauge | counter | updowncounter | info | event
    unit: str
    description: str
    measurement: str
    # reverse lookup: discriminator keys and (values tuple) -> metric
    keys: tuple[str, ...]
    by_values: dict[tuple, catalogue.Metric]
    fields_by_attr: dict[str, catalogue.Metric]  # event/info: attribute -> metric


class Catalogue:
    """The catalogue compiled for the pipeline: instruments, forward and backward lookups."""

    def __init__(self, metrics=None):
        metrics = tuple(metrics if metrics is not None else catalogue.load())
        self.instruments: list[Instrument] = []
        self.by_name: dict[str, Instrument] = {}
        self.forward: dict[str, dict[str, Entry]] = {}
        self.identity = catalogue.otel_identity()
        self.identity_keys = frozenset(self.identity)
        groups: dict[str, list[catalogue.Metric]] = {}
        for m in metrics:
            groups.setdefault(m.otel, []).append(m)
        for name, ms in groups.items():
            meas = {m.measurement for m in ms}
            kinds = {m.kind if m.kind in ("info", "event") else "number" for m in ms}
            if len(meas) != 1 or len(kinds) != 1:
                raise catalogue.CatalogueError(f"instrument {name} spans measurements or kinds")
            keys = tuple(sorted({k for m in ms for k, v in m.attributes.items() if v != WILDCARD}))
            inst = Instrument(name=name, kind=ms[0].kind, unit=ms[0].unit,
                              description=ms[0].description, measurement=ms[0].measurement,
                              keys=keys, by_values={}, fields_by_attr={})
            slot = len(self.instruments)
            self.instruments.append(inst)
            self.by_name[name] = inst
            for m in ms:
                fixed = {k: v for k, v in m.attributes.items() if v != WILDCARD}
                info_key = next((k for k, v in m.attributes.items() if v == WILDCARD), None)
                if m.kind == "info" and info_key is None:
                    info_key = f"{m.otel}.value"
                event_key = f"{m.otel}.{m.field}" if m.kind == "event" else None
                if m.kind == "event":
                    inst.fields_by_attr[event_key] = m
                elif m.kind == "info":
                    inst.fields_by_attr[info_key] = m
                vals = tuple(fixed.get(k) for k in keys)
                if m.kind != "event":
                    if vals in inst.by_values:
                        raise catalogue.CatalogueError(f"{name}: two entries with attributes {fixed}")
                    inst.by_values[vals] = m
                self.forward.setdefault(m.measurement, {})[m.field] = Entry(
                    metric=m, slot=slot, fixed=fixed or None, info_key=info_key, event_key=event_key,
                    cast=m.python_type, kind=m.kind, slot_key=(slot, *sorted(fixed.items())))

    def identity_attributes(self, tags: dict) -> dict[str, str]:
        """The semantic-convention identity attributes of a GPU's row ({} without a ``uuid`` tag)."""
        if "uuid" not in tags:
            return {}
        out = {}
        for k, spec in self.identity.items():
            if "value" in spec:
                out[k] = spec["value"]
            elif "tag" in spec:
                if tags.get(spec["tag"]):
                    out[k] = str(tags[spec["tag"]])
            else:
                try:
                    out[k] = spec["template"].format_map(tags)
                except (KeyError, ValueError):
                    continue
        return out

    def metric_for(self, inst: Instrument, attrs) -> catalogue.Metric | None:
        if not inst.keys:
            return inst.by_values.get(())
        return inst.by_values.get(tuple(attrs.get(k) for k in inst.keys))
