"""One secret reader (gpufleet.secrets) and one time parser (gpufleet.times) for every caller."""

from __future__ import annotations

import time

import pytest

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.secrets import read_secret
from gpufleet.times import parse_time, to_rfc3339


@pytest.fixture
def tz_far_from_utc(monkeypatch):
    """The machine's local zone set 10 hours off UTC, so 'read as local' cannot pass by chance."""
    monkeypatch.setenv("TZ", "Pacific/Honolulu")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


EPOCH = 1795220400.0  # 2026-11-21T00:20:00Z


def test_zoneless_time_is_utc_everywhere(tz_far_from_utc):
    from gpufleet.analyzer.cli import _time

    from gpufleet import records
    from gpufleet.sim.scenario import parse_time as scenario_parse_time

    naive = "2026-11-21T00:20:00"
    assert time.localtime(EPOCH).tm_hour != 0  # the zone really is off UTC here
    assert parse_time(naive) == EPOCH
    assert parse_time(naive + "Z") == EPOCH
    assert parse_time("2026-11-21 02:20:00+02:00") == EPOCH
    assert records.from_rfc3339(naive) == EPOCH  # truth/incident files
    assert _time(naive, "--start") == int(EPOCH * 1e9)  # analyzer command line
    assert scenario_parse_time is parse_time  # scenario files
    rec = records.Record.from_dict({"kind": "gpu_lost", "host": "n1", "gpu": 0, "link": None,
                                    "start": naive, "end": None, "severity": "critical"})
    assert rec.start == EPOCH and to_rfc3339(rec.start) == "2026-11-21T00:20:00Z"


def test_time_forms_and_errors():
    assert parse_time(EPOCH) == EPOCH
    assert parse_time(str(int(EPOCH))) == EPOCH
    assert parse_time("2026-11-21T00:20:00.250Z") == EPOCH + 0.25
    assert records_roundtrip(EPOCH + 0.25) == EPOCH + 0.25
    for bad in ("yesterday", "", "2026-13-01T00:00:00Z", None, True, float("nan")):
        with pytest.raises(GpufleetError, match="bad"):
            parse_time(bad)
    with pytest.raises(ValueError):  # readers that catch ValueError still catch it
        parse_time("not a time")


def records_roundtrip(t: float) -> float:
    return parse_time(to_rfc3339(t))


def test_secret_rule(tmp_path, monkeypatch):
    f = tmp_path / "s"
    f.write_text("  hunter2 \r\n")
    assert read_secret("x.password", f) == "hunter2"
    monkeypatch.setenv("GF_SECRET", " tok\n")
    assert read_secret("x.password", None, "GF_SECRET") == "tok"
    assert read_secret("x.password", "", "") is None
    cases = [
        ((tmp_path / "missing", None), "x.password_file: cannot read"),
        ((None, "GF_UNSET_VAR"), "x.password_env: environment variable GF_UNSET_VAR is not set"),
        ((f, "GF_SECRET"), "not both"),
    ]
    monkeypatch.delenv("GF_UNSET_VAR", raising=False)
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "two").write_text("line1\nline2\n")
    cases += [((tmp_path / "empty", None), "is empty"), ((tmp_path / "two", None), "more than one line")]
    monkeypatch.setenv("GF_EMPTY", "")
    cases.append(((None, "GF_EMPTY"), "not set or empty"))
    for (file, env), msg in cases:
        with pytest.raises(ConfigError, match=msg) as e:
            read_secret("x.password", file, env)
        assert "hunter2" not in str(e.value) and "line2" not in str(e.value)
    with pytest.raises(ConfigError, match="--token-file: cannot read"):
        read_secret("--token", tmp_path / "missing")


def test_every_caller_applies_the_same_rule(tmp_path, monkeypatch):
    """An empty variable, a two-line file: refused by the agent, the BMC collector, the alert sinks
    and replay alike (each used to apply its own rule)."""
    from gpufleet.agent.collectors.ipmi import IpmiCollector
    from gpufleet.agent.daemon import Agent
    from gpufleet.analyzer.alerting.config import load_sinks

    from gpufleet.sim.replay import Replayer

    two = tmp_path / "two"
    two.write_text("s3cret\npassword injected-line\n")
    monkeypatch.setenv("GF_EMPTY", "")
    with pytest.raises(ConfigError, match="ipmi.password_env: environment variable GF_EMPTY"):
        IpmiCollector(bmc_host="10.0.0.1", username="u", password_env="GF_EMPTY")
    with pytest.raises(ConfigError, match="ipmi.password_file: .* more than one line"):
        IpmiCollector(bmc_host="10.0.0.1", username="u", password_file=str(two))
    with pytest.raises(ConfigError, match="routing_key_file: .* more than one line"):
        load_sinks([{"type": "pagerduty", "routing_key_file": str(two)}], [])
    (tmp_path / "telemetry.lp.gz").write_bytes(b"")
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match="--influx-token-file: .* more than one line"):
        Replayer(str(tmp_path), "http://127.0.0.1:9", api="v2", bucket="b", org="o", token_file=str(two))
    from gpufleet.agent import config as agent_config

    cfg = agent_config.parse_text(f'[agent]\nexporters = ["influx"]\n[influx]\napi = "v2"\n'
                                  f'url = "http://127.0.0.1:9"\norg = "o"\nbucket = "b"\n'
                                  f'token_file = "{two}"\n[spool]\ndir = "{tmp_path / "spool"}"\n')
    with pytest.raises(ConfigError, match="influx.token_file: .* more than one line"):
        Agent(cfg)
