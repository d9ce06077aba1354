"""gpufleet eval: the public match rule and metrics."""

from __future__ import annotations

import json

from gpufleet.analyzer.evaluate import evaluate, matches

from gpufleet.cli import main
from gpufleet.records import Record, write

T = 1_795_000_000.0


def rec(kind="sdc", host="h1", gpu=0, link=None, start=T, end=None, impact_at=None, rack=None):
    return Record(
        kind=kind,
        host=host,
        gpu=gpu,
        link=link,
        start=start,
        end=end,
        severity="critical",
        impact_at=impact_at,
        rack=rack,
    )


def test_match_window_edges():
    tr = rec(end=T + 600)
    assert matches(rec(start=T - 60), tr)
    assert not matches(rec(start=T - 60.5), tr)
    assert matches(rec(start=T + 600 + 300), tr)
    assert not matches(rec(start=T + 600 + 301), tr)
    assert matches(rec(start=T + 10 * 86400), rec(end=None))  # no end: any time after


def test_match_scope():
    assert not matches(rec(kind="straggler"), rec())
    assert not matches(rec(host="h2"), rec())
    assert not matches(rec(gpu=1), rec())
    assert matches(rec(gpu=None), rec(gpu=None))
    assert matches(rec(gpu=3), rec(gpu=None))  # truth names no GPU: any GPU of the host
    assert matches(rec(kind="nvlink_degradation", link=4), rec(kind="nvlink_degradation", link=None))
    assert not matches(rec(kind="nvlink_degradation", link=4), rec(kind="nvlink_degradation", link=5))
    rack_truth = rec(kind="cooling_degradation", host=None, gpu=None, rack="r1")
    assert matches(rec(kind="cooling_degradation", host=None, gpu=None, rack="r1"), rack_truth)
    assert not matches(rec(kind="cooling_degradation", host=None, gpu=None, rack="r2"), rack_truth)


def test_metrics():
    truth = [
        rec(),
        rec(host="h2", start=T + 100),
        rec(kind="cooling_degradation", gpu=1, impact_at=T + 500),
        rec(kind="cooling_degradation", gpu=2, impact_at=T + 500),
    ]
    incs = [
        rec(start=T + 10),
        rec(start=T + 20),
        rec(host="h3"),  # 2 true, 1 false sdc
        rec(kind="cooling_degradation", gpu=1, start=T + 400),  # before impact
        rec(kind="cooling_degradation", gpu=2, start=T + 900),
    ]  # after impact
    r = evaluate(truth, incs, gpu_days=2.0, lenient=True)
    sdc = r["per_kind"]["sdc"]
    assert (sdc["precision"], sdc["recall"]) == (round(2 / 3, 4), 0.5)
    assert sdc["latency_median_s"] == 10.0
    assert r["per_kind"]["cooling_degradation"]["f1"] == 1.0
    assert r["cooling_before_impact"] == 0.5
    assert r["false_per_1000_gpu_days"] == 500.0
    assert r["overall"]["precision"] == 0.8 and r["overall"]["recall"] == 0.75
    assert set(r) >= {
        "precision",
        "recall",
        "f1",
        "latency_median_s",
        "latency_p95_s",
        "per_kind",
        "cooling_before_impact",
        "false_per_1000_gpu_days",
    }


def test_cli_json_and_bad_truth(tmp_path, capsys):
    t, i = tmp_path / "truth.jsonl", tmp_path / "inc.jsonl"
    write(t, [rec()])
    write(i, [rec(start=T + 5)])
    (tmp_path / "manifest.json").write_text(json.dumps({"duration_seconds": 86400, "fleet": {"gpus": 1000}}))
    assert main(["eval", "--truth", str(t), "--incidents", str(i), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["f1"] == 1.0 and out["gpu_days"] == 1000.0 and out["false_per_1000_gpu_days"] == 0.0
    t.write_text(rec().to_json() + "\n{not json\n")
    assert main(["eval", "--truth", str(t), "--incidents", str(i)]) == 2
    err = capsys.readouterr().err
    assert "truth.jsonl:2" in err and len(err.strip().splitlines()) == 1
    assert main(["eval", "--truth", str(tmp_path / "missing"), "--incidents", str(i)]) == 2


def test_one_to_one_duplicate_pages():
    """A node-wide fault paged once per GPU: one true page, seven duplicates (lenient hides them)."""
    truth = [rec(kind="power_brake", gpu=None, start=T, end=T + 3600), rec(host="h2", start=T)]
    incs = [rec(kind="power_brake", gpu=g, start=T + 5 + g) for g in range(8)] + [rec(host="h2", start=T + 3)]
    r = evaluate(truth, incs, gpu_days=10.0)
    pb = r["per_kind"]["power_brake"]
    assert r["scoring"] == "one-to-one"
    assert (pb["true_incidents"], pb["duplicates"], pb["false_incidents"]) == (1, 7, 7)
    assert pb["precision"] == 0.125 and pb["recall"] == 1.0
    assert pb["pages_per_fault"] == 8.0 and pb["max_pages_per_fault"] == 8
    assert pb["latency_median_s"] == 5.0  # the earliest page is the one that counts
    assert r["duplicates"] == 7 and r["false_incidents"] == 7
    assert r["false_per_1000_gpu_days"] == 700.0
    assert {d["gpu"] for d in r["duplicate_pages"]} == set(range(1, 8))
    assert all(d["repeats"].startswith("power_brake h1 from ") for d in r["duplicate_pages"])
    assert r["per_kind"]["sdc"]["duplicates"] == 0 and r["per_kind"]["sdc"]["precision"] == 1.0
    lenient = evaluate(truth, incs, gpu_days=10.0, lenient=True)
    assert lenient["per_kind"]["power_brake"]["precision"] == 1.0 and lenient["duplicates"] == 0


def test_one_to_one_two_faults_share_a_place():
    """Two faults on one GPU, two incidents: each fault takes one (earliest free), none is a duplicate."""
    truth = [rec(start=T, end=T + 600), rec(start=T + 3600)]
    incs = [rec(start=T + 3610), rec(start=T + 10)]
    r = evaluate(truth, incs)
    assert r["recall"] == 1.0 and r["precision"] == 1.0 and r["duplicates"] == 0
    assert r["latency_median_s"] == 10.0


def test_cli_gpu_days_from_data_and_lenient(tmp_path, capsys):
    """GPU-days come from the GPU rows present, not the manifest's nominal fleet."""
    t, i = tmp_path / "truth.jsonl", tmp_path / "inc.jsonl"
    write(t, [rec()])
    write(i, [rec(start=T + 5), rec(start=T + 50), rec(host="h9")])
    (tmp_path / "manifest.json").write_text(json.dumps({"duration_seconds": 86400, "fleet": {"gpus": 1000}}))
    # 2 GPUs x 6 h at a 10 s poll, with a 1 h hole on one of them (not observed: not counted)
    lines = []
    for g in (0, 1):
        for k in range(6 * 360 + 1):
            if g == 1 and 360 <= k < 720:
                continue
            lines.append(f"gpu,host=h1,gpu={g} power_watts=100 {int((T + 10 * k) * 1e9)}")
    (tmp_path / "telemetry.lp").write_text("\n".join(lines) + "\n")
    (tmp_path / "manifest.json").write_text(
        json.dumps(
            {"duration_seconds": 86400, "fleet": {"gpus": 1000}, "telemetry": {"file": "telemetry.lp"}}
        )
    )
    assert main(["eval", "--truth", str(t), "--incidents", str(i), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["gpu_days"] - (6 + 5) / 24) < 0.01
    assert out["duplicates"] == 1 and out["false_incidents"] == 2
    assert main(["eval", "--truth", str(t), "--incidents", str(i)]) == 0
    text = capsys.readouterr().out
    assert "scoring: one-to-one" in text and "duplicates: 1" in text and "duplicate page" in text
    assert main(["eval", "--truth", str(t), "--incidents", str(i), "--lenient", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scoring"] == "lenient" and out["false_incidents"] == 1


def test_informational_records_are_not_scored_as_pages(tmp_path, capsys):
    """A setting or the room (severity info) is neither a true nor a false incident: counted apart."""
    truth = [rec(kind="straggler", gpu=5, start=T)]
    note = rec(kind="power_limit_below_peers", gpu=None, start=T - 3600)
    note.severity = "info"
    room = rec(kind="inlet_above_room", host=None, gpu=None, rack="r1", start=T)
    room.severity = "info"
    incs = [rec(kind="straggler", gpu=5, start=T + 30), note, room]
    r = evaluate(truth, incs, gpu_days=10.0)
    assert (r["precision"], r["recall"], r["false_incidents"]) == (1.0, 1.0, 0)
    assert r["overall"]["incidents"] == 1 and set(r["per_kind"]) == {"straggler"}
    assert r["notes"] == {"inlet_above_room": 1, "power_limit_below_peers": 1}
    t, i = tmp_path / "truth.jsonl", tmp_path / "inc.jsonl"
    write(t, truth)
    write(i, incs)
    assert main(["eval", "--truth", str(t), "--incidents", str(i), "--gpu-days", "10"]) == 0
    out = capsys.readouterr().out
    assert "(0 false, GPU-days: 10.0)" in out
    assert "informational records, not scored: inlet_above_room 1, power_limit_below_peers 1" in out


def test_the_analysis_s_own_records_are_not_scored_unless_the_truth_has_their_kind(tmp_path, capsys):
    """A node that stopped reporting (its network cut) and rows left unanalysed claim no GPU fault:
    counted apart, neither true nor false; against a truth of that kind they are scored."""
    truth = [rec(kind="straggler", gpu=5, start=T)]
    quiet = rec(kind="node_stopped_reporting", host="h2", gpu=None, start=T + 60)
    gap = rec(kind="analysis_gap", host="h2", gpu=None, start=T + 60)
    incs = [rec(kind="straggler", gpu=5, start=T + 30), quiet, gap]
    r = evaluate(truth, incs)
    assert (r["precision"], r["recall"], r["false_incidents"]) == (1.0, 1.0, 0)
    assert r["analysis"] == {"analysis_gap": 1, "node_stopped_reporting": 1}
    t, i = tmp_path / "truth.jsonl", tmp_path / "inc.jsonl"
    write(t, truth)
    write(i, incs)
    assert main(["eval", "--truth", str(t), "--incidents", str(i)]) == 0
    assert "not scored: analysis_gap 1, node_stopped_reporting 1" in capsys.readouterr().out
    scored = evaluate([*truth, rec(kind="node_stopped_reporting", host="h3", gpu=None, start=T)], incs)
    assert scored["recall"] == 0.5 and scored["false_incidents"] == 1
    assert scored["analysis"] == {"analysis_gap": 1}
