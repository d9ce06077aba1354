"""The analyzer's side of the telemetry store: pull a window in, write incidents back.

:func:`pull` queries one time window of every measurement the analyzer reads from an
:class:`analyzer.sources.Influx` into an :class:`analyzer.pipeline.Analyzer` (batch ``analyze``,
``analyze --follow`` and ``gpufleet demo`` all step through the store with it).
:func:`incident_lines` encodes incidents as the ``incident`` measurement, whose tags and fields
are declared in ``gpufleet/catalogue.toml`` (``[measurement.incident]``).
"""

from __future__ import annotations

from gpufleet import catalogue
from gpufleet.lineprotocol import encode


def pull(an, influx, s_ns: int, e_ns: int) -> int:
    """Query [s, e) of every measurement into the analyzer; returns the rows pulled."""
    from analyzer.pipeline import MEASUREMENTS

    rows = {}
    for m in MEASUREMENTS:
        r = influx.query_rows(m, s_ns, e_ns, an.parser.series)
        if len(r):
            rows[m] = r
    an.feed_rows(rows)
    return sum(len(r) for r in rows.values())


def incident_lines(recs) -> list[str]:
    """The ``incident`` measurement for Grafana annotations: one point per incident at its start."""
    schema = catalogue.incident()
    out = []
    for r in recs:
        tags = {t: getattr(r, t) for t in schema.tags}
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
        line = encode(schema.name, tags, fields, int(r.start * 1e9))
        if line:
            out.append(line)
    return out
