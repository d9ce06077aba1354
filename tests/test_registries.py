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
SECRETS = (TOKEN, PASSWORD, QUERY)


TABLES = {"rule": [{"command": ["true"]}]}  # a "tables" option's value (the action sink's rules)


def _spec(typ: str, tmp_path: Path, host: str = "127.0.0.1:1") -> tuple[dict, list[str]]:
    """A sink table of type ``typ`` from its class's facts, carrying every kind of secret that
    type can hold: credentials in its URL (when it takes one) and each secret option it declares,
    read from a file. Also: the secret options' values."""
    cls = SINKS[typ]
    table: dict = {"type": typ}
    if cls.needs_url:  # a URL that is an address has no secret path; its password and token are secret
        path = "am" if cls.url_is_address else f"hooks/{TOKEN}"
        table["url"] = f"http://alert:{PASSWORD}@{host}/{path}?token={QUERY}"
    declared = []
    for o in cls.options:
        if o.secret:
            value = f"{typ}-{o.name}-Secret{len(o.name)}q"
            (tmp_path / f"{typ}.{o.name}").write_text(value + "\n")
            table[f"{o.name}_file"] = str(tmp_path / f"{typ}.{o.name}")
            declared.append(value)
        elif o.kind == "tables":
            table[o.name] = TABLES[o.name]
    return table, declared


def test_the_contract_covers_every_registered_sink(tmp_path):
    for typ in SINKS:  # each sink's table, derived from its class, loads
        (sink,) = load_sinks([fast(_spec(typ, tmp_path)[0])], [])
        assert sink.type == typ


@pytest.mark.parametrize("typ", sorted(SINKS))
def test_sink_secrets_never_in_repr_and_url_redacted(typ, tmp_path):
    spec, declared = _spec(typ, tmp_path)
    (sink,) = load_sinks([fast(spec)], [])
    secrets = [*SECRETS, *declared]
    text = repr(sink)
    assert not [s for s in secrets if s in text], text
    if sink.url:
        assert "127.0.0.1:1" in text, "the redacted URL still names the host"
    # anything a sink logs goes through redact(): every secret it holds, and the URL's password
    leak = f"POST {sink.url} failed: {' '.join(declared)} body={sink.url}"
    red = sink.redact(leak)
    held = [s for s in secrets if any(s in x for x in sink.secrets())]
    held += [PASSWORD, QUERY] if sink.url else []  # the URL's credentials, for every sink
    if sink.url and not sink.url_is_address:  # webhook-style URLs: the URL is the credential
        assert TOKEN in held and QUERY in held, held
    assert set(declared) <= set(held), (declared, held)  # every secret option it declares
    assert not [s for s in held if s in red], red


def test_sink_secrets_never_reach_the_logs(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    specs = [_spec(t, tmp_path) for t in sorted(SINKS) if not SINKS[t].acts]  # the action sink runs commands
    sinks = load_sinks([fast(spec, name=spec["type"]) for spec, _ in specs], [])
    n = Notifier(sinks, tmp_path / "s.db")
    n.update([incident(id="x")], now=T0)
    time.sleep(0.5)
    n.close(timeout=0.3)
    text = caplog.text + "".join(repr(s) for s in sinks)
    assert "attempt 1 failed" in caplog.text  # the sinks did fail and log it
    assert not [s for s in [*SECRETS, *(v for _, d in specs for v in d)] if s in text]


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


# the real data a collector's test may run on: a recorded or replayed NVML node, a real BMC peer
# (ipmi_sim), the live kernel every test machine has (psutil), the real compute engine
REAL_DATA = ("RecordedBackend", "ipmi_sim", "psutil.", 'engine="numpy"')


def test_every_collector_has_a_recorded_or_replay_test():
    tests = {p.name: p.read_text() for p in (ROOT / "tests").glob("test_*.py")
             if p.name != Path(__file__).name}
    for name, cls in _all_collectors().items():
        if name == "boom":
            continue
        found = [t for t, text in tests.items() if cls.__name__ in text and any(m in text for m in REAL_DATA)]
        assert found, f"collector {name}: no test names {cls.__name__} and runs it on real data {REAL_DATA}"


@pytest.mark.slow
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
