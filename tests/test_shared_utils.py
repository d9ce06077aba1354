"""The core's one copy of each shared utility, and that every layer's thin call keeps its error type."""

from __future__ import annotations

import pytest
from gpufleet.agent import config as agent_config
from gpufleet.analyzer import config as analyzer_config
from gpufleet.analyzer.alerting.base import redact_url as sink_redact_url

from gpufleet import options
from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.net import backoff_delay, classify, redact_url, retry_after_seconds
from gpufleet.sim import units as sim_units
from gpufleet.units import parse_duration

DURATION = options.Option("interval", "duration")  # every config's duration keys: gpufleet.options


@pytest.mark.parametrize("value,seconds", [
    (10, 10.0), (2.5, 2.5), ("10", 10.0), ("1e3", 1000.0), ("500ms", 0.5), ("10s", 10.0), ("5m", 300.0),
    ("5min", 300.0), ("6h", 21600.0), ("2d", 172800.0), ("1w", 604800.0), ("1h30m", 5400.0),
    ("1d 2h", 93600.0), (" 10 s ", 10.0), ("10S", 10.0), (".5s", 0.5), ("0", 0.0),
])
def test_durations_union_of_the_three_grammars(value, seconds):
    assert parse_duration(value) == seconds
    assert options.check("config key 'agent.interval'", DURATION, value) == seconds
    assert analyzer_config.parse_duration(value, "analyzer.window") == seconds
    assert sim_units.parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["", "5x", "h", "-1s", -1, "1h-5m", float("inf"), "nan", True, None, [],
                                   "10 s s"])
def test_bad_durations_name_the_key(value):
    with pytest.raises(GpufleetError, match=r"^--step: bad duration"):
        parse_duration(value, "--step")
    with pytest.raises(ConfigError, match=r"^config key 'agent.interval': bad duration"):
        options.check("config key 'agent.interval'", DURATION, value)
    with pytest.raises(ConfigError, match=r"^analyzer.window_seconds: bad duration"):
        analyzer_config.parse_duration(value, "analyzer.window_seconds")


def test_agent_config_takes_compound_durations():
    cfg = agent_config.validate({"agent": {"interval": "1m30s"}, "file": {"segment_age": "2d"}})
    assert cfg["agent"]["interval"] == 90.0 and cfg["file"]["segment_age"] == 172800.0


def test_redact_url_one_copy_two_policies():
    # influx URLs keep the path and non-secret query; credentials never show
    assert redact_url("http://u:pw@h:8086/write?db=x&p=secret") == "http://***@h:8086/write?db=x&p=***"
    assert redact_url("http://h:8086/api?token=abc&org=o") == "http://h:8086/api?token=***&org=o"
    # webhook URLs: the path is the secret
    assert redact_url("https://hooks.slack.com/services/T/B/x?y=1", keep_path=False) == "https://hooks.slack.com/***"
    assert sink_redact_url("https://u:pw@am.example:9093/api?k=1") == "https://***@am.example:9093/***"
    assert sink_redact_url("http://127.0.0.1:9093") == "http://127.0.0.1:9093"
    for bad in ("not a url", "http://h:99999999/x", "://x", ""):
        assert redact_url(bad) == "<invalid URL>" == sink_redact_url(bad)


def test_retry_after_and_classification():
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None
    assert classify(204) == ("ok", None)
    assert classify(429, "3") == ("retry", 3.0)
    assert classify(503, "Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == ("retry", 10.0)
    assert classify(None) == ("retry", None) and classify(0) == ("retry", None)
    assert classify(401) == ("refused", None) and classify(400, "9") == ("refused", 9.0)


def test_agent_reads_retry_after_dates_too():
    from gpufleet.agent.pipeline.influx import _classify

    a = _classify(429, "slow down", "Wed, 21 Oct 2099 07:28:00 GMT")
    assert not a.ok and a.retry and a.retry_after is not None and a.retry_after > 3600
    assert _classify(400, "unable to parse 'x'", None).retry is False
    assert _classify(404, "database not found", None).retry is True
    assert _classify(204, "", None).ok


def test_backoff_doubles_to_the_cap_and_jitters_in_the_upper_half():
    # the one schedule: base after the first failure, doubling, capped
    assert [backoff_delay(n, 0.5, 30.0, jitter=False) for n in range(1, 9)] == [
        0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff_delay(0, 2.0, 10.0, jitter=False) == 2.0  # no failure yet counts as the first
    assert backoff_delay(10**6, 0.05, 300.0, jitter=False) == 300.0  # no overflow after days of failing
    for n, full in ((1, 10.0), (3, 40.0), (9, 300.0)):
        draws = [backoff_delay(n, 10.0, 300.0) for _ in range(400)]
        assert all(full / 2 <= d <= full for d in draws)
        assert max(draws) - min(draws) > full / 4  # spread out, not one fixed value

