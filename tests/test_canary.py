"""SDC canary on the CPU (numpy): planted bit flips detected, fleet reference, idle gating, budget."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from gpufleet.agent import config as agent_config
from gpufleet.agent.backends.sim import SimBackend, TinyNode
from gpufleet.agent.collectors.canary import CanaryCollector, load_reference

from gpufleet.errors import ConfigError


def rows_of(col, now_ns):
    """The gpu_canary rows of one collect (the gpufleet_canary status rows left out)."""
    return [s for s in col.collect(now_ns) if s.measurement == "gpu_canary"]


@pytest.mark.slow
def test_cpu_known_answer_and_planted_bitflips():
    col = CanaryCollector(engine="numpy", size=128, interval=0, wait=60)
    first = rows_of(col, 1)
    assert len(first) == 1
    r = first[0]
    assert r.measurement == "gpu_canary" and r.tags["gpu"] == "cpu"
    assert r.fields["passed"] == 1 and r.fields["mismatches"] == 0 and r.fields["memory_mismatches"] == 0
    assert len(r.fields["digest"]) == 64 and r.fields["duration_seconds"] > 0
    assert "reference_match" not in r.fields  # no fleet reference configured: absent
    again = rows_of(col, 2)[0]
    assert again.fields["digest"] == r.fields["digest"] and again.fields["passed"] == 1
    col.inject_bitflips(count=5, bit=3)  # flip a mantissa bit in 5 output elements
    bad = rows_of(col, 3)[0]
    assert bad.fields["passed"] == 0 and bad.fields["mismatches"] == 5
    assert bad.fields["digest"] != r.fields["digest"]
    col.inject_bitflips(count=1, bit=31)  # a sign bit
    assert rows_of(col, 4)[0].fields["mismatches"] == 1
    healed = rows_of(col, 5)[0]  # the fault was transient: the next check passes again
    assert healed.fields["passed"] == 1 and healed.fields["digest"] == r.fields["digest"]


@pytest.mark.slow
def test_fleet_reference_file_and_url(tmp_path):
    probe = CanaryCollector(engine="numpy", size=64, interval=0, wait=60)
    row = rows_of(probe, 1)[0]
    key = row.extra["key"]
    good = tmp_path / "ref.json"
    good.write_text(json.dumps({"references": {key: row.fields["digest"]}}))
    col = CanaryCollector(engine="numpy", size=64, interval=0, wait=60, reference=str(good))
    assert rows_of(col, 1)[0].fields["reference_match"] == 1
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({key: "0" * 64}))
    col = CanaryCollector(engine="numpy", size=64, interval=0, wait=60, reference=str(wrong))
    r = rows_of(col, 1)[0].fields
    assert r["reference_match"] == 0 and r["passed"] == 0 and r["mismatches"] == 0  # fleet disagrees

    body = json.dumps({"references": {key: row.fields["digest"]}}).encode()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/canary.json"
        assert load_reference(url) == {key: row.fields["digest"]}
        col = CanaryCollector(engine="numpy", size=64, interval=0, wait=60, reference=url)
        assert rows_of(col, 1)[0].fields["reference_match"] == 1
    finally:
        srv.shutdown()
    with pytest.raises(ConfigError, match="cannot load"):
        CanaryCollector(engine="numpy", reference=str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        load_reference(str(tmp_path / "bad.json"))


@pytest.mark.slow
def test_first_answer_survives_restart(tmp_path):
    a = CanaryCollector(engine="numpy", size=64, interval=0, wait=60, state_dir=str(tmp_path))
    d = rows_of(a, 1)[0].fields["digest"]
    b = CanaryCollector(engine="numpy", size=64, interval=0, wait=60, state_dir=str(tmp_path))
    b.inject_bitflips(count=3, bit=7)
    r = rows_of(b, 1)[0].fields  # compared with the answer stored before the restart
    assert r["mismatches"] == 3 and r["passed"] == 0 and r["digest"] != d


def sim_canary(t, **kw):
    node = TinyNode(n_gpus=2, t0=0.0)
    backend = SimBackend(node)
    backend.begin_poll(int(t[0] * 1e9))
    col = CanaryCollector(backend=backend, engine="numpy", standin=True, size=64, clock=lambda: t[0], wait=60,
                          **kw)
    return backend, col


@pytest.mark.slow
def test_runs_only_when_idle_and_backs_off_when_a_job_starts():
    t = [500.0]  # TinyNode: both GPUs idle at t=500 (busy 420 s of every 600 s)
    backend, col = sim_canary(t, interval=60.0, busy_backoff=300.0)
    rows = rows_of(col, int(t[0] * 1e9))
    assert sorted(r.tags["gpu"] for r in rows) == ["0", "1"]
    assert all(r.tags["uuid"].startswith("GPU-") and r.tags["model"] == "NVIDIA H200" for r in rows)
    assert all(r.fields["passed"] == 1 for r in rows)
    t[0] = 595.0  # GPU 1's job has started (phase 2 s), GPU 0 still idle
    backend.begin_poll(int(t[0] * 1e9))
    rows = rows_of(col, int(t[0] * 1e9))
    assert [r.tags["gpu"] for r in rows] == ["0"]
    assert col.skipped["1"].startswith("busy: 1 compute process")
    t[0] = 700.0  # both busy now: nothing runs, and GPU 1 is not even looked at until its backoff ends
    backend.begin_poll(int(t[0] * 1e9))
    assert rows_of(col, int(t[0] * 1e9)) == []
    assert col.gpus[1].next_due == pytest.approx(595.0 + 300.0)


@pytest.mark.slow
def test_tiny_check_under_duty_budget_when_busy():
    t = [100.0]  # both busy
    backend, col = sim_canary(t, interval=0.0, busy_size=16, duty=1e-9, busy_backoff=0.0)
    assert len(rows_of(col, 1)) == 1  # a budget of ~nothing: one tiny check, then the budget is spent
    assert col.skipped["1"] == "duty-cycle budget spent"
    assert rows_of(col, 2) == []
    backend, col = sim_canary(t, interval=0.0, busy_size=16, duty=0.5, busy_backoff=0.0)
    rows = rows_of(col, 1)
    assert len(rows) == 2 and all(r.extra["size"] == 16 and r.extra["busy"] for r in rows)
    assert all(r.fields["passed"] == 1 and "memory_mismatches" in r.fields for r in rows)


def test_config_errors():
    with pytest.raises(ConfigError, match="engine"):
        CanaryCollector(engine="tpu")
    with pytest.raises(ConfigError, match="size"):
        CanaryCollector(engine="numpy", size=8)
    with pytest.raises(ConfigError, match="duty"):
        CanaryCollector(engine="numpy", duty=0)
    with pytest.raises(ConfigError, match="float32"):
        CanaryCollector(engine="numpy", dtype="bfloat16").collect(0)


def test_config_section(tmp_path):
    dirs = {"state_dir": str(tmp_path / "s"), "drop_dir": str(tmp_path / "d")}
    cfg = agent_config.validate({"canary": {"engine": "numpy", "size": 32, "interval": 1, **dirs}})
    col = CanaryCollector(**agent_config.collector_options(cfg, "canary"), wait=60)
    assert col.size == 32 and rows_of(col, 0)[0].extra["size"] == 32
    with pytest.raises(ConfigError, match="canary.sise"):
        agent_config.validate({"canary": {"sise": 32}})
