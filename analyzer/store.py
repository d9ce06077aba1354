"""The analyzer's side of the telemetry store: pull a window in, write incidents back.

:func:`pull` queries one time window of every measurement the analyzer reads from an
:class:`gpufleet.analyzer.sources.Influx` into an :class:`gpufleet.analyzer.pipeline.Analyzer` (batch ``analyze``,
``analyze --follow`` and ``gpufleet demo`` all step through the store with it).
:func:`incident_lines` encodes incidents as the ``incident`` measurement, whose tags and fields
are declared in ``gpufleet/catalogue.toml`` (``[measurement.incident]``).
"""

from __future__ import annotations

from gpufleet import catalogue
from gpufleet.lineprotocol import encode


def pull(an, influx, s_ns: int, e_ns: int) -> int:
    """Feed [s, e) from InfluxDB into the analyzer in large batches (empty stretches skipped at
    once: :func:`gpufleet.analyzer.sources.pull`); returns the rows read."""
    from gpufleet.analyzer.sources import ahead
    from gpufleet.analyzer.sources import pull as batches_of

    n = 0
    step = int(an.window * 1e9)
    skip = an.not_mine(influx.tag_values("host")) if an.shard else None  # a shard asks for its own hosts
    batches = batches_of(influx, an.wanted(), s_ns, e_ns, an.parser.series, step, words=an.tag_words(),
                         not_hosts=skip)
    for _a, _b, rows in ahead(batches):
        n += sum(len(r) for r in rows.values())
        an.feed_rows(rows)
    return n


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
