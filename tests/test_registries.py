"""Contract tests over the registries: every sink and every collector, present and future.

Sinks (``gpufleet.analyzer.alerting.base.REGISTRY``): secrets never in ``repr`` or logs, URLs redacted,
one failing sink never stops the others. Collectors (``gpufleet.agent.model.REGISTRY``): each has a test
on recorded or replayed real data, one raising collector never stops the others, and a new
collector is one module plus one ``@register`` line: a toy one, written as a module the agent
has never seen, is loaded by name and its rows reach the sink.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import time
from pathlib import Path

import pytest
from gpufleet.analyzer.alerting import REGISTRY as SINKS
from gpufleet.analyzer.alerting import Notifier, load_sinks

from tests.alerting_receiver import T0, Receiver, fast, incident

ROOT = Path(__file__).resolve().parent.parent
TOKEN, PASSWORD, QUERY = "T0000/B0000/sEcReTtOkEn42", "pw-Secret9x", "qTok77secret"
ROUTING_KEY, HMAC = "R" * 31 + "k", "hmac-Secret-Zq9"
SECRETS = (TOKEN, PASSWORD, QUERY, ROUTING_KEY, HMAC)


def _spec(typ: str, tmp_path: Path, host: str = "127.0.0.1:1") -> dict:
    """A sink table of type ``typ`` carrying every kind of secret that type can hold."""
    url = f"http://alert:{PASSWORD}@{host}/hooks/{TOKEN}?token={QUERY}"
    key, hmac = tmp_path / "routing_key", tmp_path / "hmac"
    key.write_text(ROUTING_KEY + "\n")
    hmac.write_text(HMAC + "\n")
    return {
        # an Alertmanager URL's path is an address; its password and a token parameter are not
        "alertmanager": {"type": "alertmanager", "url": f"http://alert:{PASSWORD}@{host}/am?token={QUERY}"},
        "pagerduty": {"type": "pagerduty", "url": url, "routing_key_file": str(key)},
        "slack": {"type": "slack", "url": url},
        "webhook": {"type": "webhook", "url": url, "secret_file": str(hmac)},
        "console": {"type": "console"},
        "action": {"type": "action", "rule": [{"command": ["true"]}]},
    }[typ]


def test_the_contract_covers_every_registered_sink(tmp_path):
    for typ in SINKS:  # a new sink type must say here how it carries its secrets
        assert _spec(typ, tmp_path)["type"] == typ


@pytest.mark.parametrize("typ", sorted(SINKS))
def test_sink_secrets_never_in_repr_and_url_redacted(typ, tmp_path):
    (sink,) = load_sinks([fast(_spec(typ, tmp_path))], [])
    text = repr(sink)
    assert not [s for s in SECRETS if s in text], text
    if sink.url:
        assert "127.0.0.1:1" in text, "the redacted URL still names the host"
    # anything a sink logs goes through redact(): every secret it holds, and the URL's password
    leak = f"POST {sink.url} failed: key={ROUTING_KEY} sig={HMAC} body={sink.url}"
    red = sink.redact(leak)
    held = [s for s in SECRETS if any(s in x for x in sink.secrets())]
    held += [PASSWORD, QUERY] if sink.url else []  # the URL's credentials, for every sink
    if typ not in ("alertmanager", "console", "action"):  # webhook-style URLs: the URL is the credential
        assert TOKEN in held and QUERY in held, held
    assert (ROUTING_KEY in held) == (typ == "pagerduty") and (HMAC in held) == (typ == "webhook")
    assert not [s for s in held if s in red], red


def test_sink_secrets_never_reach_the_logs(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    sinks = load_sinks([fast(_spec(t, tmp_path), name=t) for t in sorted(set(SINKS) - {"action"})], [])
    n = Notifier(sinks, tmp_path / "s.db")
    n.update([incident(id="x")], now=T0)
    time.sleep(0.5)
    n.close(timeout=0.3)
    text = caplog.text + "".join(repr(s) for s in sinks)
    assert "attempt 1 failed" in caplog.text  # the sinks did fail and log it
    assert not [s for s in SECRETS if s in text]


def test_one_failing_sink_never_stops_the_others(tmp_path):
    with Receiver() as rx:
        sinks = load_sinks([fast({"type": "webhook", "url": "http://127.0.0.1:1/down", "name": "down"}),
                            fast({"type": "webhook", "url": rx.url + "/up", "name": "up"})], [])
        n = Notifier(sinks, tmp_path / "s.db")
        try:
            n.update([incident(id="inc-1")], now=T0)
            got = rx.wait_for(1, timeout=5)
        finally:
            left = n.close(timeout=0.3)
    assert got and got[0]["json"]["key"] == "inc-1" and got[0]["json"]["status"] == "firing"
    assert left.get("down") == 1 and not left.get("up")


# ------------------------------------------------------------------------------ collectors
def _all_collectors() -> dict:
    import gpufleet.agent.collectors as pkg
    from gpufleet.agent.model import REGISTRY

    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"gpufleet.agent.collectors.{m.name}")
    return dict(REGISTRY)


# where each collector is tested on recorded or replayed real data, or on the real source itself
# (a real BMC peer, the live kernel every test machine has, the real compute engine)
RECORDED = {
    "gpu": ("test_gpu_collector.py", "RecordedBackend"),
    "xid": ("test_xid.py", "RecordedBackend"),
    "ipmi": ("test_ipmi.py", "ipmi_sim"),
    "host": ("test_host_collector.py", "psutil.virtual_memory()"),
    "canary": ("test_canary.py", 'engine="numpy"'),
}


def test_every_collector_has_a_recorded_or_replay_test():
    names = set(_all_collectors()) - {"boom"}
    assert names == set(RECORDED), "a new collector needs a test on recorded/replayed data, listed here"
    for name, (test, marker) in RECORDED.items():
        text = (ROOT / "tests" / test).read_text()
        assert marker in text and name in text, (name, test)


def test_one_raising_collector_never_stops_the_others(tmp_path, monkeypatch):
    from gpufleet.agent import config
    from gpufleet.agent.daemon import Agent
    from gpufleet.agent.model import REGISTRY, register

    monkeypatch.setitem(REGISTRY, "boom", None)  # removed again after the test

    @register("boom")
    class Boom:  # a toy collector: one class and one registry line
        def __init__(self, **_):
            pass

        def collect(self, now_ns):
            raise RuntimeError("sensor on fire")

        def close(self):
            pass

    cfg = config.apply_overrides(config.load(None), backend="sim", file_dir=str(tmp_path))
    cfg = config.validate({**cfg, "agent": {**cfg["agent"], "collectors": ["boom", "gpu", "host"]},
                           "file": {**cfg["file"], "compress": False}})
    a = Agent(cfg)
    try:
        assert [c.name for c in a.collectors] == ["boom", "gpu", "host"]
        assert a.tick(int(T0 * 1e9))
        assert a.stats["boom"][1] is False and a.stats["gpu"][1] and a.stats["host"][1]
    finally:
        a.close()
    text = "".join(p.read_text() for p in tmp_path.glob("*.lp"))
    assert "gpu," in text and "host," in text
    assert "collector=boom" in text and "success=0" in text


TOY = '''"""A toy collector: this module plus its one registry line."""
from gpufleet.agent.model import Sample, register


@register("toy")
class Toy:
    def __init__(self, config=None, **_):
        self.polls = 0

    def collect(self, now_ns):
        self.polls += 1
        return [Sample("host", {}, {"load1": 0.25 * self.polls}, now_ns)]

    def close(self):
        pass
'''


def test_a_new_collector_is_one_module_and_one_registry_line(tmp_path, monkeypatch):
    """A collector module the agent has never seen (written here, found on the collectors'
    package path) is loaded by name from ``[agent] collectors`` and its rows reach the sink."""
    import sys

    import gpufleet.agent.collectors as pkg
    from gpufleet.agent import config
    from gpufleet.agent.daemon import Agent
    from gpufleet.agent.model import REGISTRY

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "toy.py").write_text(TOY)
    monkeypatch.setattr(pkg, "__path__", [*pkg.__path__, str(mods)])
    assert "toy" not in REGISTRY
    out = tmp_path / "lp"
    cfg = config.apply_overrides(config.load(None), backend="sim", file_dir=str(out))
    cfg = config.validate({**cfg, "agent": {**cfg["agent"], "collectors": ["toy", "gpu"]},
                           "file": {**cfg["file"], "compress": False}})
    try:
        a = Agent(cfg)
        try:
            assert [c.name for c in a.collectors] == ["toy", "gpu"]
            assert a.tick(int(T0 * 1e9)) and a.tick(int((T0 + 1) * 1e9))
            assert a.stats["toy"][1] is True and a.stats["gpu"][1]
        finally:
            a.close()
    finally:
        REGISTRY.pop("toy", None)
        sys.modules.pop("gpufleet.agent.collectors.toy", None)
    lines = "".join(p.read_text() for p in out.glob("*.lp")).splitlines()
    toy = [ln for ln in lines if ln.startswith("host,") and "load1=" in ln]
    assert [ln.split("load1=")[1].split(",")[0].split(" ")[0] for ln in toy] == ["0.25", "0.5"]
    assert any(ln.startswith("gpu,") for ln in lines)
    assert any("collector=toy" in ln and "success=1" in ln for ln in lines)


def test_every_collector_declares_its_facts():
    """``options``, ``needs_nvml`` and ``measurements`` on each class: the measurements are the
    catalogue's, and every catalogue measurement but the agent's own rows has a collector."""
    from gpufleet import catalogue
    from gpufleet.options import Option

    written = set()
    for name, cls in _all_collectors().items():
        if name == "boom":
            continue
        assert isinstance(cls.needs_nvml, bool), name
        assert all(isinstance(o, Option) for o in cls.options), name
        assert cls.measurements and set(cls.measurements) <= set(catalogue.measurements()), name
        written |= set(cls.measurements)
    own = {"gpufleet_collector", "gpufleet_agent"}  # the daemon's rows about itself
    assert written | own == set(catalogue.measurements())
