"""Config validation: the example config, overrides, secrets, and thousands of bad configs -> exit 2."""

from __future__ import annotations

import subprocess
import tomllib

import pytest
from gpufleet.agent import config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.errors import ConfigError
from gpufleet.net import redact_url
from tests.agent_support import ROOT, agent_cmd

EXAMPLE = ROOT / "packaging" / "config" / "agent.toml"


def test_example_config_holds_exactly_the_documented_keys():
    doc = tomllib.loads(EXAMPLE.read_text())
    for section, opts in config.sections().items():
        if section == "labels":
            continue
        assert set(doc[section]) == {k for o in opts for k in o.keys()}, section
    cfg = config.load(EXAMPLE)
    # the example shows the defaults, but for the collectors: every registered source, the
    # default ones first (each starts only where its source is; tests/test_agent_check.py)
    every = ["gpu", "host", *sorted(set(config.collector_classes()) - {"gpu", "host"})]
    assert {"xid", "ipmi", "canary"} <= set(every)
    assert cfg == config.validate({"agent": {"collectors": every}})
    docs = (ROOT / "docs" / "agent.md").read_text()
    for section, opts in config.sections().items():
        for key in (k for o in opts for k in o.keys()):
            assert f"`{section}.{key}`" in docs, f"{section}.{key} undocumented"


def test_values_and_overrides():
    cfg = config.parse_text('[agent]\ninterval = "2s"\nexporters = ["influx"]\n'
                            '[influx]\nurl = "http://u:pw@h:8086"\n')
    assert cfg["agent"]["interval"] == 2.0
    cfg = config.apply_overrides(cfg, interval="1s", influx_api="v2", influx_bucket="b", labels=("rack=r1",),
                                 exporters=("file,influx",))
    assert cfg["agent"]["interval"] == 1.0 and cfg["influx"]["api"] == "v2"
    assert cfg["labels"] == {"rack": "r1"} and cfg["agent"]["exporters"] == ["file", "influx"]
    assert redact_url("http://u:pw@h:8086/write?db=x&p=secret") == "http://***@h:8086/write?db=x&p=***"


@pytest.mark.parametrize("text, key", [
    ("[agent]\nintervall = 1", "agent.intervall"),
    ("[agent]\ninterval = 0.5", "agent.interval"),
    ("[agent]\ninterval = \"fast\"", "agent.interval"),
    ("[agent]\nexporters = [\"kafka\"]", "agent.exporters"),
    ("[agent]\nexporters = [\"influx\"]", "influx.url"),
    ("[agent]\nbackend = \"gpu\"", "agent.backend"),
    ("[influx]\napi = \"v3\"", "influx.api"),
    ("[influx]\nbatch_lines = 6000", "influx.batch_lines"),
    ("[spool]\nmax_bytes = \"lots\"", "spool.max_bytes"),
    ("[labels]\nhost = \"x\"", "labels.host"),
    ("[labels]\nrack = \"a\\nb\"", "labels.rack"),
    ("[labels]\nrack = \"ends\\\\\"", "labels.rack"),
    ("[nope]\nx = 1", "nope"),
])
def test_bad_values_name_the_key(text, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        config.parse_text(text)


def test_secret_from_file_and_env(tmp_path, monkeypatch):
    from gpufleet.secrets import read_secret

    f = tmp_path / "tok"
    f.write_text("t0k\n")
    assert read_secret("influx.token", str(f), "") == "t0k"
    monkeypatch.setenv("GF_TOKEN", "envtok")
    assert read_secret("influx.token", "", "GF_TOKEN") == "envtok"
    with pytest.raises(ConfigError, match="influx.token_file"):
        read_secret("influx.token", str(tmp_path / "missing"), "")


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["10s", "0s", "-1s", "1h", "9999h", "512MiB", "v1", "v2", "sim", "nvml",
                                     "recorded:", "http://", "http://h:99999", "ftp://x", "a\\", "x\ny"]))
_value = st.recursive(_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c,
                                                                                   max_size=3), max_leaves=6)
_keys = st.sampled_from([k for s in config.sections().values() for o in s for k in o.keys()] + ["bogus", ""])
_section = st.dictionaries(_keys, _value, min_size=1, max_size=4)
_doc = st.dictionaries(st.sampled_from(list(config.sections()) + ["extra"]), _section | _value, min_size=1,
                       max_size=3)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(_doc)
def test_fuzz_never_anything_but_config_error(doc):
    try:
        config.validate(doc)
    except ConfigError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg.strip() or "\\n" in repr(msg)


@pytest.mark.slow
def test_bad_configs_through_the_real_cli(tmp_path):
    cases = ["[agent]\ninterval = 0", "[agent]\nfoo = 1", "not toml [[[", "[influx]\napi = 3",
             "[agent]\nexporters = [\"influx\"]\n[influx]\nurl = \"http://h:1\"\napi = \"v2\""]
    for i, text in enumerate(cases):
        p = tmp_path / f"c{i}.toml"
        p.write_text(text)
        r = subprocess.run(agent_cmd("--config", str(p)), capture_output=True, text=True, timeout=30,
                           cwd=ROOT)
        assert r.returncode == 2, (text, r.stderr)
        assert r.stderr.startswith("gpufleet: error:") and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run(agent_cmd("--config", str(tmp_path / "absent.toml")), capture_output=True, text=True,
                       timeout=30, cwd=ROOT)
    assert r.returncode == 2 and "no such config file" in r.stderr


@pytest.mark.parametrize("host", ["ALL", "all", "gpu[001-100]", "n1,n2", "-n", "--selector=x=y", "a b",
                                  "node1 State=RESUME", "x" * 254])
@pytest.mark.slow
def test_an_unsafe_host_is_refused_in_one_line_exit_2(host, tmp_path):
    import sys

    with pytest.raises(ConfigError, match="is not a plain node name"):
        config.parse_text(f'[agent]\nhost = "{host}"\n')
    r = subprocess.run([sys.executable, "-m", "gpufleet", "agent", "run", f"--host={host}", "--backend",
                        "sim", "--exporter", "file", "--file-dir", str(tmp_path / "f"), "--spool-dir",
                        str(tmp_path / "s")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "is not a plain node name" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "f").exists() or not any((tmp_path / "f").iterdir())
