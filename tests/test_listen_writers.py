"""``--listen-writers``: each writer's token bound to the hosts it may write (analyzer/writers.py),
over real HTTP against the real receiver: a node writing another node's name is refused (403,
counted, nothing of the body taken), a relay writes its pattern, the shared token stays unbound."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests
from gpufleet.analyzer.listen import Listener
from gpufleet.analyzer.parse import Parser
from gpufleet.analyzer.pipeline import FIELDS, MEASUREMENTS
from gpufleet.analyzer.writers import Writers

from gpufleet.errors import ConfigError

T = 1795000000000000000
N1, N2 = "node01-token-aaaaaaaa", "node02-token-bbbbbbbb"
RELAY, ALL = "rack7-relay-cccccccc", "subscr-dddddddddddd"


def line(host: str, t: int = T) -> bytes:
    return f"gpu,host={host},gpu=0 power_watts=300 {t}\n".encode()


@pytest.fixture
def listener(tmp_path):
    f = tmp_path / "writers"
    f.write_text(f"# token  hosts\n{N1} node01\n{N2} node02 node02-bmc  # two names\n"
                 f"{RELAY} rack7-*\n{ALL} *\n")
    ls = Listener(("127.0.0.1", 0), Parser(set(MEASUREMENTS), FIELDS), token="shared-token-eeeeeeee",
                  writers=Writers.load(str(f))).start()
    ls.url = f"http://127.0.0.1:{ls.address[1]}/write"
    yield ls
    ls.stop()


def post(ls, token, body):
    return requests.post(ls.url, data=body, headers={"Authorization": f"Token {token}"}, timeout=10)


def hosts_taken(ls):
    return sorted({ls.parser.series.written(int(s))["host"] for got in ls.take() for r in got.values()
                   for s in r.sid})


def test_each_token_writes_only_its_own_hosts(listener):
    ls = listener
    assert post(ls, N1, line("node01")).status_code == 204
    r = post(ls, N1, line("node01") + line("node02"))  # one foreign row: the whole body is refused
    assert r.status_code == 403 and "may not write host node02" in r.json()["error"]
    assert post(ls, N2, line("node02-bmc")).status_code == 204
    assert post(ls, N1, line("ALL")).status_code == 403
    assert post(ls, RELAY, line("rack7-n01") + line("rack7-n02")).status_code == 204
    assert post(ls, RELAY, line("rack8-n01")).status_code == 403
    assert post(ls, RELAY, line("rack7-[01]")).status_code == 403  # a pattern never admits an unsafe name
    assert post(ls, ALL, line("node09")).status_code == 204
    assert post(ls, "shared-token-eeeeeeee", line("node10")).status_code == 204  # the shared token: unbound
    assert post(ls, "node01-token-wrong!!", line("node01")).status_code == 401
    assert hosts_taken(ls) == ["node01", "node02-bmc", "node09", "node10", "rack7-n01", "rack7-n02"]
    m = requests.get(ls.url.replace("/write", "/metrics"), timeout=10).text
    assert 'gpufleet_analyzer_listen_refused_total{reason="forbidden"} 4' in m
    assert 'gpufleet_analyzer_listen_refused_total{reason="auth"} 1' in m


@pytest.mark.parametrize("text,why", [
    ("short node01\n", "line 1: the token is shorter than 16 characters"),
    (f"{N1}\n", "line 1: no host or pattern after the token"),
    (f"{N1} node01\n{N1} node02\n", "line 2: the same token as line 1"),
    (f"# nothing\n{N1} node01,node02\n", "line 2: 'node01,node02' is neither"),
    ("# only comments\n", "no writer in the file"),
])
@pytest.mark.slow
def test_a_bad_writers_file_is_one_line_naming_the_line_never_the_token(tmp_path, text, why):
    f = tmp_path / "w"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        Writers.load(str(f))
    assert why in str(e.value) and N1 not in str(e.value)
    r = subprocess.run([sys.executable, "-m", "gpufleet", "analyze", "--listen", "127.0.0.1:0",
                        "--listen-writers", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert N1 not in r.stderr
