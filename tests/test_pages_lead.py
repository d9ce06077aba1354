"""Incident pages never contradict their own evidence: on the simulator's reference fleets (the
``memory`` and ``mixed`` scenarios), every incident's page lead, its alert and its summary say the
same decisive evidence (the worst hit first, labelled with its time), and what the lead says
agrees with the page's plot data and event table."""

from __future__ import annotations

import html
import re

import pytest
from gpufleet.analyzer.alerting import Notifier, write_pages
from gpufleet.analyzer.alerting.data import load
from gpufleet.analyzer.alerting.notifier import incident_key
from gpufleet.analyzer.alerting.pages import page_name, window
from gpufleet.analyzer.detectors.memory_errors import CRITICAL_XIDS
from gpufleet.analyzer.engine import evidence_line

from gpufleet import records
from gpufleet.cli import main
from gpufleet.times import parse_time

FLEETS = [("memory", 2, "90min"), ("mixed", 2, "2h")]


@pytest.fixture(scope="module")
def fleets(tmp_path_factory):
    out = []
    for scenario, nodes, duration in FLEETS:
        d = tmp_path_factory.mktemp(scenario)
        assert main(["sim", "--nodes", str(nodes), "--duration", duration, "--step", "10s", "--seed", "7",
                     "--scenario", scenario, "--out", str(d / "sim"), "--no-progress"]) == 0
        data = d / "sim" / "telemetry.lp.gz"
        assert main(["analyze", "--input", str(data), "--out", str(d / "inc.jsonl")]) == 0
        incs = records.read(d / "inc.jsonl")
        write_pages(incs, data, d / "pages")
        out.append((d, data, incs))
    return out


def _lead(page: str, name: str) -> str:
    m = re.search(rf'<td id="{name}">(.*?)</td>', page, re.S)
    return html.unescape(m.group(1)) if m else ""


def _xids(page: str) -> list[int]:
    if "GPU events" not in page:
        return []
    table = page.split("GPU events in the window", 1)[1].split("</table>", 1)[0]
    return [int(c) for c in re.findall(r"<td>xid</td><td>(\d+)</td>", table)]


@pytest.mark.slow  # renders every kind's reference fleet: ~2 min on the 2-core machine
def test_lead_alert_and_summary_say_the_same_worst_evidence_on_every_kind(fleets, tmp_path):
    kinds = set()
    notifier = Notifier([], tmp_path / "state.db")
    try:
        for d, data, incs in fleets:
            series = load(data, {r.host for r in incs}, [window(r, r.start + 6 * 3600) for r in incs])
            for r in incs:
                kinds.add(r.kind)
                page = (d / "pages" / page_name(incident_key(r))).read_text()
                line = evidence_line(r.evidence)
                alert = notifier.build_alert(incident_key(r), [r], "firing")
                # one line, three places: the page's lead, the alert's description, the summary
                assert line and _lead(page, "lead") == line, (r.kind, r.summary)
                assert line in r.summary and line in alert.description
                assert alert.impact == _lead(page, "impact") and alert.impact
                peak, first = r.evidence["peak"], r.evidence["first"]
                # each part is labelled and dated; the worst is inside the incident and the plot
                assert line.startswith("peak") and f"at {peak['time']}" in line
                if "; first" in line:
                    assert f"first{' (critical)' if first.get('critical') else ''} at {first['time']}" in line
                t_peak, t_first = parse_time(peak["time"]), parse_time(first["time"])
                lo, hi = window(r, series.last_time(r.host))
                assert r.start <= t_first <= t_peak or peak.get("critical"), (r.kind, line)
                assert lo <= t_peak <= hi
                # a critical incident leads with its critical evidence, never a lesser reading
                assert (r.severity == "critical") == bool(peak.get("critical")), (r.kind, line)
                xids = _xids(page)
                if r.kind == "memory_errors":
                    dbe = _increase(series, r, "ecc_uncorrected_volatile_total")
                    if dbe:  # the plot shows an uncorrectable error: so do the lead and the impact
                        assert "new_dbe=" in line and "uncorrectable" in alert.impact, (line, alert.impact)
                        assert "none uncorrectable" not in alert.impact
                    if CRITICAL_XIDS & set(xids) or dbe:
                        assert r.severity == "critical" and "peak (critical)" in line, (xids, line)
                    assert "new_dbe=0" not in line and "=0," not in line
                if r.kind == "gpu_lost" and 79 in xids:
                    assert "xid=79" in line
    finally:
        notifier.close()
    # every kind the reference fleets inject
    assert {"memory_errors", "gpu_lost", "sdc", "nvlink_degradation", "pcie_degradation", "straggler",
            "power_brake", "cooling_degradation"} <= kinds, kinds


def _increase(series, r, field: str) -> float:
    """How much the incident GPU's counter ``field`` grew between its start and end (the plot's data)."""
    key = ("gpu", r.host, r.gpu, None)
    pts = [(t, v) for t, v in series.data.get(key, {}).get(field, [])
           if r.start - 60 <= t <= (r.end if r.end is not None else float("inf"))]
    return pts[-1][1] - pts[0][1] if len(pts) > 1 else 0.0


@pytest.mark.slow
def test_the_pages_fast_reader_agrees_with_the_parser_on_the_corpus(tmp_path):
    """Pages read the common line fast (only the fields they plot); on every line of the
    line-protocol corpus it reads, it reads what the full parser reads, or leaves it to the parser."""
    from gpufleet.analyzer.alerting.data import _plain

    from gpufleet.lineprotocol import ParseError, parse_line
    from tests.lp_corpus import corpus

    read = 0
    for raw in corpus(tmp_path):
        line = raw.decode("utf-8", "replace")
        try:
            want = parse_line(line)
        except (ParseError, ValueError):
            want = None
        fields = frozenset(want.fields) if want is not None else frozenset({"a", "value", "v", "f"})
        got = _plain(line, fields)
        if got is None:
            continue
        read += 1
        assert want is not None, line
        assert (got.measurement, got.tags, got.time) == (want.measurement, want.tags, want.time), line
        assert got.fields == want.fields, line
    assert read > 300
