"""Sink configuration: every mistake is a ConfigError naming the sink, before anything is sent."""

from __future__ import annotations

import pytest
from gpufleet.analyzer.alerting import load_sinks
from gpufleet.analyzer.alerting.base import redact_url

from gpufleet.cli import main
from gpufleet.errors import ConfigError
from gpufleet.net import retry_after_seconds


def err(config, cli=(), match=None) -> str:
    with pytest.raises(ConfigError) as e:
        load_sinks(config, list(cli))
    if match:
        assert match in str(e.value), str(e.value)
    return str(e.value)


def test_bad_sinks_are_config_errors_naming_them(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUFLEET_PAGERDUTY_ROUTING_KEY", raising=False)
    monkeypatch.delenv("GPUFLEET_PAGERDUTY_ROUTING_KEY_FILE", raising=False)
    err([{"type": "opsgenie", "url": "http://x"}], match="sink #1 (opsgenie): unknown sink type 'opsgenie'")
    err([], ["teams=http://x"], match="--sink 'teams': unknown sink type")
    err([{"type": "alertmanager", "url": "localhost:9093"}], match="sink #1 (alertmanager): invalid URL")
    err([{"type": "webhook", "url": "ftp://h/x"}], match="invalid URL")
    err([{"type": "alertmanager", "url": "http://h:99999"}], match="invalid URL")
    err([{"type": "webhook"}], match="missing url")
    err([{"type": "pagerduty", "name": "oncall"}],
        match="sink #1 (oncall): routing_key: missing (set routing_key_file or routing_key_env)")
    err([], ["pagerduty=https://events.pagerduty.com/v2/enqueue"],
        match="--sink pagerduty: routing_key: missing")
    err([{"type": "pagerduty", "routing_key": "abc"}],
        match="sink #1 (pagerduty): routing_key: a secret is never written in the config; "
              "use routing_key_file or routing_key_env")
    err([{"type": "pagerduty", "routing_key_env": "NOPE_UNSET"}],
        match="routing_key_env: environment variable NOPE_UNSET is not set")
    err([{"type": "webhook", "url": "http://h", "secret_file": str(tmp_path / "none")}], match="cannot read")
    (tmp_path / "empty").write_text("\n")
    err([{"type": "webhook", "url": "http://h", "secret_file": str(tmp_path / "empty")}], match="is empty")
    slack = {"type": "slack", "url": "http://h/x"}
    err([{**slack, "timeout": -1}], match="sink #1 (slack): timeout: bad duration -1")
    err([{**slack, "timeout": 0}], match="sink #1 (slack): timeout: 0 is not above the minimum 0")
    err([{"type": "slack", "url": "http://h/x", "burst": 2.5}], match="burst: expected an integer, got 2.5")
    err([{"type": "slack", "url": "http://h/x", "rate_limit": "fast"}], match="rate_limit: expected a number")
    err([{"type": "alertmanager", "url": "http://h", "repost_interval": "often"}],
        match="sink #1 (alertmanager): repost_interval: bad duration 'often'")
    err([{**slack, "colour": "red"}], match="sink #1 (slack): colour: unknown key")
    err([{"type": "slack", "url": "http://h/x", "url_file": "/a", "url_env": "B"}],
        match="url_file: give url_file or url_env, not both")
    err([{"type": "console"}, {"type": "console", "name": "console"}], match="used twice")
    err([], ["slack"], match="expected slack=URL")


def test_errors_never_print_secret_urls():
    msg = err([{"type": "slack", "url": "htp://hooks.slack.com/services/T00/B00/SECRETTOKEN"}])
    assert "SECRETTOKEN" not in msg and "invalid URL" in msg


def test_good_config_and_cli_specs(tmp_path, monkeypatch):
    (tmp_path / "key").write_text("R0123456789abcdef0123456789ABCDE\n")
    monkeypatch.setenv("GPUFLEET_WEBHOOK_SECRET", "whsec")
    monkeypatch.delenv("GPUFLEET_PAGERDUTY_ROUTING_KEY", raising=False)
    config = [{"type": "pagerduty", "routing_key_file": str(tmp_path / "key"), "rate_limit": 30},
              {"type": "alertmanager", "url": "http://127.0.0.1:9093", "repost_interval": 30}]
    sinks = load_sinks(config, ["slack=https://hooks.slack.com/services/T/B/tok", "slack=https://h/2",
                                "webhook=https://example.com/in", "console",
                                "pagerduty=https://pd.example/v2/enqueue"])
    names = [s.name for s in sinks]
    assert names == ["pagerduty", "alertmanager", "slack", "slack-2", "webhook", "console", "pagerduty-2"]
    pd, am = sinks[0], sinks[1]
    assert pd.routing_key == "R0123456789abcdef0123456789ABCDE" and pd.delivery.rate_limit == 30
    assert pd.url == "https://events.pagerduty.com/v2/enqueue"
    assert am.target_url() == "http://127.0.0.1:9093/api/v2/alerts" and am.repost_interval == 30
    assert sinks[4].secret == "whsec"
    # the CLI pagerduty sink takes its routing key from the configured one
    assert sinks[6].routing_key == pd.routing_key and sinks[6].url == "https://pd.example/v2/enqueue"
    assert "tok" not in repr(sinks[2]) and "R0123" not in repr(pd)


def test_helpers():
    assert redact_url("https://hooks.slack.com/services/T/B/x?y=1") == "https://hooks.slack.com/***"
    assert redact_url("http://127.0.0.1:9093") == "http://127.0.0.1:9093"
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_report_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "inc.jsonl"
    bad.write_text('{"kind": "meteor", "severity": "critical", "start": "2026-01-01T00:00:00Z"}\n')
    rc = main(["report", "--incidents", str(bad), "--input", str(tmp_path), "--out", str(tmp_path / "o")])
    err_text = capsys.readouterr().err
    assert rc == 2 and "malformed record" in err_text and "Traceback" not in err_text
    rc = main(["report", "--incidents", str(tmp_path / "missing.jsonl"), "--input", str(tmp_path),
               "--out", str(tmp_path / "o")])
    assert rc == 2
