"""Options declared on the class, checked by one mechanism (``gpufleet.options``), for every part.

One parameter check runs over every registry: each option of every agent section and collector,
every sink type and every analyzer section is fed, through the real entry point (the agent's
``config.validate``, the analyzer's ``Config.update``, ``load_sinks``), its own default (passes),
a value of the wrong type and values just past its range (each one ConfigError line naming the
key), and for a secret an inline value (refused, the value never in the message). Then a toy part
of each kind, written at test time, gets its options validated, its rows in the generated docs and
its values through the real pipeline.
"""

from __future__ import annotations

import sys

import pytest
from gpufleet.agent import config as agent_config
from gpufleet.analyzer.alerting import REGISTRY as SINKS
from gpufleet.analyzer.alerting import Notifier, load_sinks
from gpufleet.analyzer.alerting import config as sink_config
from gpufleet.analyzer.alerting.base import Sink, register
from gpufleet.analyzer.config import ANALYZER_OPTIONS, INFLUX_OPTIONS, Config, detector_defaults, param_option

from gpufleet import options
from gpufleet.errors import ConfigError
from gpufleet.options import Option
from tests.alerting_receiver import T0, Receiver, fast, incident

SECRET = "s3cr3t-Value-9q"


def _wrong(o: Option) -> object:
    """A value of the wrong type for ``o``."""
    return {"str": 5, "path": 5, "choice": 5, "bool": "yes", "int": "many", "float": "much",
            "duration": "soon", "size": "big", "strlist": "gpu", "intlist": ["a"], "tables": "x"}[o.kind]


def _outside(o: Option) -> list:
    """Values just past ``o``'s range (or outside its choices)."""
    out: list = []
    if o.kind in ("int", "float", "duration", "size"):
        step = 1 if o.kind in ("int", "size") else max(abs(o.lo or 0) * 1e-3, 1e-6)
        if o.lo is not None:
            out.append(o.lo if o.lo_open else (int(o.lo) - 1 if o.kind in ("int", "size") else o.lo - step))
        if o.hi is not None:
            out.append(int(o.hi) + 1 if o.kind in ("int", "size") else o.hi * 1.001 + step)
    if o.kind == "choice":
        out.append("no-such-choice")
    if o.kind == "strlist" and o.choices:
        out.append(["no-such-name"])
    return [v for v in out if not (o.kind in ("duration", "size") and v < 0)] + (
        [-1] if o.kind in ("duration", "size") else [])


def _refused(check, key: str, value: object) -> str:
    with pytest.raises(ConfigError) as e:
        check(value)
    msg = str(e.value)
    assert key in msg and "\n" not in msg, (key, value, msg)
    return msg


# ------------------------------------------------------------------ every option of every registry
def _agent_cases():
    for section, opts in agent_config.sections().items():
        for o in opts:
            yield pytest.param(section, o, id=f"{section}.{o.name}")


@pytest.mark.parametrize("section, opt", list(_agent_cases()))
def test_every_agent_option_is_checked_as_declared(section, opt):
    def check(v, key=opt.name):
        return agent_config.validate({section: {key: v}})

    if opt.secret:
        assert check("", f"{opt.name}_file")[section][f"{opt.name}_file"] == ""
        msg = _refused(lambda v: check(v, opt.name), f"'{section}.{opt.name}'", SECRET)
        assert SECRET not in msg and f"{opt.name}_file" in msg
        _refused(lambda v: check(v, f"{opt.name}_env"), f"'{section}.{opt.name}_env'", 5)
        return
    if opt.default not in ("", None, []):  # written as the example config writes it
        assert check(opt.default)[section][opt.name] == opt.default
    _refused(check, f"'{section}.{opt.name}'", _wrong(opt))
    for v in _outside(opt):
        _refused(check, f"'{section}.{opt.name}'", v)
    _refused(lambda v: agent_config.validate({section: {opt.name + "_typo": v}}),
             f"'{section}.{opt.name}_typo'", opt.default)


def _sink_cases():
    for typ, cls in SINKS.items():
        for o in cls.table_options():
            yield pytest.param(typ, o, id=f"{typ}.{o.name}{'_file' if o.secret else ''}")


def _base(typ: str, tmp_path) -> dict:
    """The least table a sink of ``typ`` needs, built from what its class declares."""
    cls = SINKS[typ]
    table: dict = {"type": typ}
    if cls.needs_url and not cls.default_url:
        table["url"] = "http://127.0.0.1:1/hook"
    for o in cls.options:
        if o.secret and o.required:
            (tmp_path / o.name).write_text("k" * 32 + "\n")
            table[f"{o.name}_file"] = str(tmp_path / o.name)
        if o.kind == "tables":  # the one such key today: the action sink's rules
            table[o.name] = [{"command": ["true"]}]
    return table


@pytest.mark.parametrize("typ, opt", list(_sink_cases()))
def test_every_sink_option_is_checked_as_declared(typ, opt, tmp_path):
    base = _base(typ, tmp_path)
    label = f"sink #1 ({typ}): {opt.name}"

    def check(v, key=opt.name):
        return load_sinks([{**base, key: v}], [])

    if opt.secret:
        if opt.name == "url" and "url" in base:
            _refused(lambda v: check(v, "url_env"), "give url, url_file or url_env, not two", "SOME_VAR")
            base.pop("url", None)
        if f"{opt.name}_file" in base:
            _refused(lambda v: check(v, f"{opt.name}_env"), "not both", "SOME_VAR")
            base.pop(f"{opt.name}_file")
        msg = _refused(lambda v: check(v, f"{opt.name}_env"), f"{opt.name}_env", "GPUFLEET_TEST_UNSET_VAR")
        assert "GPUFLEET_TEST_UNSET_VAR" in msg
        if opt.name != "url":  # an inline url is a url; any other secret inline is refused
            msg = _refused(check, label, SECRET)
            assert SECRET not in msg
        return
    if opt.default not in ("", None, []):
        check(opt.default)
    if opt.kind != "str":  # url: a string; checked as a URL below
        _refused(check, label, _wrong(opt))
    for v in _outside(opt):
        _refused(check, label, v)
    _refused(lambda v: check(v, opt.name + "_typo"), f"sink #1 ({typ}): {opt.name}_typo: unknown key", 1)


def _analyzer_cases():
    for o in ANALYZER_OPTIONS:
        yield pytest.param("analyzer", o.name, o, id=f"analyzer.{o.name}")
    for o in INFLUX_OPTIONS:
        yield pytest.param("influx", o.name, o, id=f"influx.{o.name}")
    for kind, params in detector_defaults().items():
        for name, default in params.items():
            yield pytest.param(f"detectors.{kind}", name, param_option(name, default), id=f"{kind}.{name}")


@pytest.mark.parametrize("where, name, opt", list(_analyzer_cases()))
def test_every_analyzer_option_is_checked_as_declared(where, name, opt):
    section, _, kind = where.partition(".")

    def check(v, key=name):
        table = {key: v}
        Config().update({section: {kind: table} if kind else table}, "a.toml")

    if opt.secret:
        msg = _refused(check, f"a.toml: {where}.{name}", SECRET)
        assert SECRET not in msg
        return
    if opt.default not in ("", None):
        check(opt.default)
    _refused(check, f"a.toml: {where}.{name}", _wrong(opt))
    for v in _outside(opt):
        _refused(check, f"a.toml: {where}.{name}", v)


# ------------------------------------------------------------------ a toy part of each kind
TOY_COLLECTOR = '''"""A toy collector: this module; its section, [toy], declared on the class."""
from gpufleet.agent.model import Sample, register
from gpufleet.options import Option


@register("toy")
class Toy:
    needs_nvml = False
    measurements = ("host",)
    options = (
        Option("load", "float", 0.25, "the load1 it reports", 0.0, 64.0),
        Option("token", "secret", help="a credential, read by the agent's secret reader"),
        Option("every", "duration", 10.0, "how often", 1.0, 3600.0, arg="every_s"),
    )

    @classmethod
    def unavailable(cls, table):
        return "no load to report here" if table["load"] == 0 else None

    @classmethod
    def describe(cls, table, node):
        return "on", f"load1 {table['load']:g} every {table['every']:g}s"

    def __init__(self, load=0.25, token_file="", token_env="", every_s=10.0):
        from gpufleet.secrets import read_secret

        self.load, self.every_s = load, every_s
        self.token = read_secret("toy.token", token_file, token_env)
        self.polls = 0

    def collect(self, now_ns):
        self.polls += 1
        return [Sample("host", {}, {"load1": self.load * self.polls}, now_ns)]

    def close(self):
        pass
'''


@pytest.fixture
def toy_collector(tmp_path, monkeypatch):
    import gpufleet.agent.collectors as pkg
    from gpufleet.agent.model import REGISTRY

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "toy.py").write_text(TOY_COLLECTOR)
    monkeypatch.setattr(pkg, "__path__", [*pkg.__path__, str(mods)])
    assert "toy" not in REGISTRY
    yield
    REGISTRY.pop("toy", None)
    sys.modules.pop("gpufleet.agent.collectors.toy", None)


def test_a_toy_collector_is_one_module_its_section_validated_documented_and_run(toy_collector, tmp_path,
                                                                                monkeypatch, caplog):
    from gpufleet.agent.daemon import Agent

    # validated: its own keys, ranges and secret rule, one line naming the key
    for text, key in (("[toy]\nload = 99.0\n", "toy.load"), ("[toy]\nlod = 1.0\n", "toy.lod"),
                      ('[toy]\nevery = "0.5s"\n', "toy.every"), ('[toy]\ntoken = "x"\n', "toy.token")):
        _refused(agent_config.parse_text, f"'{key}'", text)
    # documented: its rows in the generated key table
    doc = agent_config.keys_markdown()
    assert "| `toy.load` | `0.25` | the load1 it reports (0 .. 64) |" in doc
    assert "`toy.token_file`, `toy.token_env`" in doc and "| `toy.every` | `10s` |" in doc
    # run: the section's values reach the constructor (under its own keyword names) and its rows
    # reach the sink; the secret is read from the environment and never logged
    monkeypatch.setenv("GPUFLEET_TOY_TOKEN", SECRET)
    out = tmp_path / "lp"
    cfg = agent_config.parse_text('[agent]\ncollectors = ["toy"]\nbackend = "sim"\n'
                                  '[toy]\nload = 0.5\nevery = "1m"\ntoken_env = "GPUFLEET_TOY_TOKEN"\n'
                                  f'[file]\ndir = "{out}"\ncompress = false\n')
    assert agent_config.collector_options(cfg, "toy") == {"load": 0.5, "token_file": "",
                                                          "token_env": "GPUFLEET_TOY_TOKEN", "every_s": 60.0}
    caplog.set_level("DEBUG")
    a = Agent(cfg)
    try:
        (toy,) = a.collectors
        assert (toy.load, toy.every_s, toy.token) == (0.5, 60.0, SECRET)
        assert a.backend is None  # needs_nvml = False: no NVML backend opened for it
        assert a.tick(int(T0 * 1e9)) and a.tick(int((T0 + 1) * 1e9))
    finally:
        a.close()
    lines = "".join(p.read_text() for p in out.glob("*.lp")).splitlines()
    toy_rows = [ln for ln in lines if ln.startswith("host,") and "load1=" in ln]
    assert [ln.split("load1=")[1].split(",")[0].split(" ")[0] for ln in toy_rows] == ["0.5", "1.0"]
    assert SECRET not in caplog.text
    # its status line, from its class: the listed toy first, then every other registered collector off
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("collector ")]
    assert said[0] == "collector toy: on (load1 0.5 every 60s)"
    assert said[1:] == [f"collector {n}: off (not in agent.collectors)"
                        for n in agent_config.collector_classes() if n != "toy"]
    # unavailable on this node, by its class's word: not started, and the line says why
    caplog.clear()
    a = Agent(agent_config.parse_text('[agent]\ncollectors = ["toy", "host"]\n[toy]\nload = 0.0\n'
                                      f'[file]\ndir = "{out}"\n'))
    try:
        assert [c.name for c in a.collectors] == ["host"]
    finally:
        a.close()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("collector ")]
    assert said[:2] == ["collector toy: unavailable (no load to report here)",
                        "collector host: on (CPU, memory, disks and network of this host)"]


class ToySink(Sink):
    """A toy sink: one class; its keys, secret and defaults declared on it."""

    type = "toy"
    options = (
        Option("channel", "choice", "ops", "where it posts", choices=("ops", "dev")),
        Option("api_key", "secret", help="sent as X-Toy-Key", required=True, env="GPUFLEET_TOY_KEY"),
    )
    delivery_defaults = {"rate_limit": 120.0}

    def __init__(self, name, url, delivery=None, channel="ops", api_key="", **kw):
        super().__init__(name, url, delivery, **kw)
        self.channel, self.api_key = channel, api_key

    def secrets(self):
        return [self.api_key, *super().secrets()]

    def headers(self, body):
        return {"X-Toy-Key": self.api_key}

    def render(self, alert):
        return {"channel": self.channel, "text": f"{alert.status}: {alert.kind} {alert.key}"}


@pytest.fixture
def toy_sink(monkeypatch):
    monkeypatch.setitem(SINKS, "toy", ToySink)  # removed again after the test
    register(ToySink)
    yield ToySink


def test_a_toy_sink_is_one_class_its_table_validated_documented_and_run(toy_sink, tmp_path, monkeypatch,
                                                                        caplog, capsys):
    from gpufleet.cli import main

    monkeypatch.delenv("GPUFLEET_TOY_KEY", raising=False)
    key = tmp_path / "key"
    key.write_text(SECRET + "\n")
    # validated
    _refused(lambda t: load_sinks([t], []), "sink #1 (toy): channel: expected one of ops, dev",
             {"type": "toy", "url": "http://h/x", "api_key_file": str(key), "channel": "prod"})
    msg = _refused(lambda t: load_sinks([t], []), "sink #1 (toy): api_key: a secret is never written",
                   {"type": "toy", "url": "http://h/x", "api_key": SECRET})
    assert SECRET not in msg
    _refused(lambda t: load_sinks([t], []), "sink #1 (toy): api_key: missing", {"type": "toy", "url": "http://h"})
    _refused(lambda t: load_sinks([t], []), "sink #1 (toy): missing url",
             {"type": "toy", "api_key_file": str(key)})
    # documented
    doc = sink_config.keys_markdown()
    assert "| `toy` | `channel` | `ops` | where it posts (one of `ops`, `dev`) |" in doc
    assert "`toy` | `api_key_file`, `api_key_env` | | secret: required; sent as X-Toy-Key" in doc
    assert "toy: 120" in doc  # its own rate-limit default
    assert main(["analyze", "--help"]) == 0  # and named where --sink says which types there are
    assert "toy, webhook" in " ".join(capsys.readouterr().out.split())
    # run: --sink toy=URL reads the secret from its declared variable; the notifier delivers
    monkeypatch.setenv("GPUFLEET_TOY_KEY", SECRET)
    caplog.set_level("DEBUG")
    with Receiver() as rx:
        (sink,) = load_sinks([], [f"toy={rx.url}/hook"])
        assert sink.delivery.rate_limit == 120.0 and sink.api_key == SECRET
        (sink,) = load_sinks([fast({"type": "toy", "url": rx.url + "/hook", "api_key_env": "GPUFLEET_TOY_KEY",
                                    "channel": "dev"})], [])
        n = Notifier([sink], tmp_path / "s.db")
        try:
            n.update([incident(id="inc-1")], now=T0)
            got = rx.wait_for(1, timeout=5)
        finally:
            n.close(timeout=0.5)
    assert got and got[0]["json"]["channel"] == "dev" and "inc-1" in got[0]["json"]["text"]
    assert got[0]["headers"].get("x-toy-key") == SECRET  # sent where it belongs ...
    assert SECRET not in caplog.text and SECRET not in repr(sink)  # ... and nowhere else


def test_markdown_rows_show_defaults_ranges_and_secrets_as_the_config_writes_them():
    rows = options.markdown_rows("x.", (
        Option("wait", "duration", 90.0, "how long", 1.0, 86400.0),
        Option("cap", "size", 64 * 2**20, "", 4096),
        Option("pw", "secret", help="the password", required=True),
        Option("mode", "choice", "", choices=("", "a")),
    ))
    assert rows == [
        "| `x.wait` | `90s` | how long (1s .. 1d) |",
        "| `x.cap` | `64MiB` | ≥ 4KiB |",
        "| `x.pw_file`, `x.pw_env` | | secret: required; the password (a file, or an environment variable; "
        "never inline) |",
        '| `x.mode` | | one of `""`, `a` |',
    ]


TOY_EXPORTER = '''"""A toy exporter: this module; its section, [toyout], declared on the class."""
from pathlib import Path

from gpufleet.agent.model import Exporter, register_exporter
from gpufleet.errors import ConfigError
from gpufleet.options import Option


@register_exporter("toyout")
class ToyOut(Exporter):
    lines = True  # fed the encoded line protocol, like the file exporter
    options = (
        Option("path", "path", "", "where the lines go"),
        Option("every", "int", 1, "keep every Nth line", 1, 100),
    )

    @classmethod
    def check_active(cls, table):
        if not table["path"]:
            raise ConfigError("config key 'toyout.path': needed when toyout is listed")

    @classmethod
    def build(cls, table, agent):
        return cls(table["path"], table["every"], agent.host)

    def __init__(self, path, every, host):
        self.fh, self.every, self.host, self.closed = open(path, "a"), every, host, False

    def write(self, lines):
        self.fh.writelines(ln + "\\n" for ln in lines[::self.every])
        self.fh.flush()

    def close(self):
        self.fh.close()
'''


@pytest.fixture
def toy_exporter(tmp_path, monkeypatch):
    import gpufleet.agent.pipeline as pkg
    from gpufleet.agent.model import EXPORTERS

    mods = tmp_path / "expmods"
    mods.mkdir()
    (mods / "toyout.py").write_text(TOY_EXPORTER)
    monkeypatch.setattr(pkg, "__path__", [*pkg.__path__, str(mods)])
    assert "toyout" not in EXPORTERS
    yield
    EXPORTERS.pop("toyout", None)
    sys.modules.pop("gpufleet.agent.pipeline.toyout", None)


def test_a_toy_exporter_is_one_module_its_section_validated_documented_and_run(toy_exporter, tmp_path):
    from gpufleet.agent.daemon import Agent

    for text, key in (("[toyout]\nevery = 0\n", "toyout.every"), ("[toyout]\npth = 1\n", "toyout.pth"),
                      ('[agent]\nexporters = ["toyout"]\n', "toyout.path")):
        _refused(agent_config.parse_text, f"'{key}'", text)
    _refused(agent_config.parse_text, "expected file, influx, otlp, prometheus, toyout or influx.NAME",
             '[agent]\nexporters = ["toyou"]\n')
    assert "| `toyout.every` | `1` | keep every Nth line (1 .. 100) |" in agent_config.keys_markdown()
    out = tmp_path / "toy.lp"
    cfg = agent_config.parse_text(f'[agent]\ncollectors = ["gpu"]\nbackend = "sim"\nexporters = ["toyout"]\n'
                                  f'[toyout]\npath = "{out}"\n')
    a = Agent(cfg)
    try:
        assert a.tick(int(T0 * 1e9))
    finally:
        a.close()
    (cls, part), = a.parts
    assert cls.name == "toyout" and part.fh.closed  # built from its section, closed with the agent
    lines = out.read_text().splitlines()
    assert any(ln.startswith("gpu,") for ln in lines) and any("collector=gpu" in ln for ln in lines)


def test_each_exporter_line_says_where_it_sends(tmp_path):
    """``gpufleet agent check``'s exporter lines come from each exporter's class."""
    from gpufleet.agent import status

    cfg = agent_config.parse_text(f'[agent]\nexporters = ["file", "otlp", "prometheus"]\n'
                                  f'[file]\ndir = "{tmp_path}"\n[prometheus]\nlisten = "127.0.0.1:9500"\n')
    assert status.exporter_lines(cfg) == [
        f"exporter file: {tmp_path}",
        "exporter otlp: http://127.0.0.1:4318/v1/metrics (http/protobuf)",
        "exporter prometheus: GET /metrics on 127.0.0.1:9500 (gpufleet names)",
    ]
