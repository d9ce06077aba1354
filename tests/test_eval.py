"""gpufleet eval: the public match rule and metrics."""

from __future__ import annotations

import json

from analyzer.evaluate import evaluate, matches
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
    r = evaluate(truth, incs, gpu_days=2.0)
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
