"""``--listen`` against broken and hostile writers, over real sockets: heads that never finish,
the cap on connections, the token and the size checked before any body byte, gzip bodies of
many members, 200 writers at once; and a real ``gpufleet analyze --listen`` process under the
packaged unit's open-files limits holding 2,000 idle or trickling connections."""

from __future__ import annotations

import gzip
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests
from gpufleet.analyzer import listen
from gpufleet.analyzer.listen import MAX_MEMBERS, Listener, connection_cap
from gpufleet.analyzer.parse import Parser
from gpufleet.analyzer.pipeline import FIELDS, MEASUREMENTS

from tests.agent_support import ROOT
from tests.servers import answers_ping, free_port

LINE = b"gpu,host=n1,gpu=0 power_watts=300.5 1795000000000000000\n"
TOKEN = "tok3n"


def make(**kw) -> Listener:
    kw = {"token": TOKEN, "max_body": 1 << 20, "max_queue": 64 << 20, **kw}
    ls = Listener(("127.0.0.1", 0), Parser(set(MEASUREMENTS), FIELDS), **kw).start()
    ls.url = f"http://127.0.0.1:{ls.address[1]}"
    return ls


@pytest.fixture
def listener():
    ls = make(read_timeout=1.0)
    yield ls
    ls.stop()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def answer_of(s: socket.socket) -> bytes:
    """What the server sent until it closed its side."""
    out = b""
    while True:
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return out


def closed_by_server(s: socket.socket, wait: float) -> bool:
    s.settimeout(wait)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def post(url: str, body: bytes = LINE, **headers) -> requests.Response:
    return requests.post(url + "/write", data=body, headers={"Authorization": f"Token {TOKEN}", **headers},
                         timeout=10)


def test_token_and_size_are_checked_on_the_head_before_any_body_byte(listener):
    """401 and 413 come back while the client has sent only the head of a 30 MiB upload; the
    server then closes the connection (nothing of the body is read, so it cannot be reused)."""
    port = listener.address[1]
    for head, want in ((b"POST /write HTTP/1.1\r\nHost: x\r\nContent-Length: 31457280\r\n\r\n", b" 401 "),
                       (b"POST /write HTTP/1.1\r\nHost: x\r\nAuthorization: Token nope\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n", b" 401 "),
                       (b"POST /write HTTP/1.1\r\nHost: x\r\nAuthorization: Token tok3n\r\n"
                        b"Content-Length: 31457280\r\n\r\n", b" 413 "),
                       (b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 31457280\r\n\r\n", b" 404 ")):
        s = connect(port)
        s.sendall(head)
        got = answer_of(s)
        assert got.startswith(b"HTTP/1.1") and want in got.split(b"\r\n")[0] + b" ", got
        assert b"Connection: close" in got and b"tok3n" not in got
        s.close()
    # a client that waits for 100-continue sends no body at all when refused, and gets it when taken
    s = connect(port)
    s.sendall(b"POST /write HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n")
    assert b" 401 " in answer_of(s)
    s.close()
    s = connect(port)
    s.sendall(b"POST /write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok3n\r\n"
              b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % len(LINE))
    assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    s.sendall(LINE)
    assert s.recv(1000).startswith(b"HTTP/1.1 204 ")
    s.close()
    c = listener.counters
    got = (c["refused_auth"], c["refused_too_large"], c["refused_not_found"], c["accepted_points"])
    assert got == (3, 1, 1, 1)


def test_idle_and_trickling_connections_are_closed_at_the_timeout_and_writers_go_on(listener):
    ls = listener
    port = ls.address[1]
    t0 = time.monotonic()
    idle = [connect(port) for _ in range(40)]
    trickle = [connect(port) for _ in range(10)]
    half = [connect(port) for _ in range(10)]
    for s in half:
        s.sendall(b"POST /write HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
    stop = threading.Event()

    def drip():
        while not stop.wait(0.2):
            for s in trickle:
                try:
                    s.send(b"G")
                except OSError:
                    pass

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        for _ in range(3):
            w = time.monotonic()
            assert post(ls.url).status_code == 204
            assert time.monotonic() - w < 1.0
        assert all(closed_by_server(s, 3.0) for s in idle + trickle + half)
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join()
        for s in idle + trickle + half:
            s.close()
    assert 1.0 <= took < 3.0  # at the timeout (1 s), not before nor long after
    assert ls.counters["timeouts"] >= 60
    r = requests.get(ls.url + "/metrics", timeout=5).text
    assert "gpufleet_analyzer_listen_timeouts_total" in r


def test_beyond_the_cap_the_longest_waiting_head_makes_room():
    ls = make(read_timeout=30.0, max_connections=20)
    try:
        port = ls.address[1]
        socks = [connect(port) for _ in range(60)]
        for _ in range(3):  # the writer's connection evicts an idle one; it is answered at once
            w = time.monotonic()
            assert post(ls.url).status_code == 204
            assert time.monotonic() - w < 1.0
        time.sleep(0.2)
        assert ls.server.open_connections <= 20
        assert ls.counters["evicted"] >= 40
        assert closed_by_server(socks[0], 2.0)  # the oldest went first
        for s in socks:
            s.close()
    finally:
        ls.stop()
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap(None) == min(10_000, soft - 64) and connection_cap(10) == 10


def test_many_gzip_members_are_refused_or_inflated_in_linear_time(listener):
    ls = listener
    empty = gzip.compress(b"")
    bomb = empty * 1_000_000  # 20 MB of empty members
    ls.max_body = len(bomb) + 1
    t = time.process_time()
    body, code, err = ls.inflate(bomb)
    assert body is None and code == 400 and "members" in err
    assert time.process_time() - t < 1.0
    # up to MAX_MEMBERS members are inflated; the cost grows with the body, not its square
    few = empty * (MAX_MEMBERS // 4 - 1) + gzip.compress(LINE)
    many = empty * (MAX_MEMBERS - 1) + gzip.compress(LINE)

    def cost(b):
        best = 1e9
        for _ in range(5):  # CPU time, best of 5: another process's load is not this one's cost
            t = time.process_time()
            got, code, _err = ls.inflate(b)
            best = min(best, time.process_time() - t)
            assert got == LINE and code == 0
        return best

    ratio = cost(many) / cost(few)
    assert ratio < 10, ratio  # linear: about 4; quadratic: about 16
    r = post(ls.url, many, **{"Content-Encoding": "gzip"})
    assert r.status_code == 204
    r = post(ls.url, empty * (MAX_MEMBERS + 1), **{"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "members" in r.json()["error"]


def test_200_writers_connecting_at_once_are_all_answered_and_counted():
    ls = make(read_timeout=10.0)
    try:
        n = 200
        go = threading.Barrier(n)
        codes = []

        def one(i):
            s = socket.socket()
            s.settimeout(30)
            go.wait()
            s.connect(("127.0.0.1", ls.address[1]))
            body = b"gpu,host=w%d,gpu=0 power_watts=1 1795000000000000000\n" % i
            s.sendall(b"POST /write HTTP/1.1\r\nHost: x\r\nAuthorization: Token tok3n\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            codes.append(s.recv(100)[:12])
            s.close()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert codes == [b"HTTP/1.1 204"] * n
        assert ls.counters["accepted_points"] == n and ls.counters["requests"] == n
        assert sum(len(r["gpu"]) for r in ls.take()) == n
    finally:
        ls.stop()


# ---------------------------------------------------------------- the real process
def _peak_rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _start(tmp_path, nofile: int, timeout_s: int):
    """``gpufleet analyze --listen`` with its open-files limit set as a unit's LimitNOFILE would."""
    port = free_port()
    (tmp_path / "token").write_text(TOKEN + "\n")

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    err = open(tmp_path / f"err-{nofile}", "w")
    p = subprocess.Popen([sys.executable, "-m", "gpufleet", "analyze", "--listen", f"127.0.0.1:{port}",
                          "--listen-token-file", str(tmp_path / "token"), "--listen-timeout", f"{timeout_s}s",
                          "--poll", "1s", "--out", str(tmp_path / f"inc-{nofile}.jsonl")],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=limit)
    url = f"http://127.0.0.1:{port}"
    assert answers_ping(url, 60), (tmp_path / f"err-{nofile}").read_text()
    return p, port, url


def _our_fd_room(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"this test opens {need} sockets; the open-files limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _unit_nofile() -> int:
    """The packaged analyzer unit's LimitNOFILE, as far as this machine's hard limit allows."""
    from tests.test_packaging import ANALYZER, one

    unit = int(one(ANALYZER, "LimitNOFILE"))
    assert unit >= 4096  # room for 2,000 writers and the reserve
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return unit if hard == resource.RLIM_INFINITY else min(unit, hard)


@pytest.mark.slow
@pytest.mark.parametrize("nofile", ["unit", 1024])  # the packaged unit's limit, and systemd's default
def test_2000_idle_or_trickling_connections_do_not_stop_a_writer_nor_the_process(tmp_path, nofile):
    _our_fd_room(2300)
    nofile = _unit_nofile() if nofile == "unit" else nofile
    timeout_s = 4
    p, port, url = _start(tmp_path, nofile, timeout_s)
    socks: list[socket.socket] = []
    stop = threading.Event()
    try:
        for i in range(2000):
            s = connect(port)
            if i % 2:
                s.sendall(b"POST /write HTTP/1.1\r\n")  # trickled further below
            socks.append(s)
        t_open = time.monotonic()

        def drip():
            while not stop.wait(0.5):
                for s in socks[1::2]:
                    try:
                        s.send(b"X")
                    except OSError:
                        pass

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        slowest = 0.0
        for _ in range(5):
            w = time.monotonic()
            r = post(url)
            slowest = max(slowest, time.monotonic() - w)
            assert r.status_code == 204
            time.sleep(0.2)
        assert slowest < 1.0, slowest
        # every one of them is closed by the server at the timeout (or earlier, evicted at the cap)
        assert all(closed_by_server(s, timeout_s + 5 - (time.monotonic() - t_open)) for s in socks)
        assert p.poll() is None
        w = time.monotonic()
        assert post(url).status_code == 204 and time.monotonic() - w < 1.0
        m = requests.get(url + "/metrics", timeout=5).text
        still = int(m.split("gpufleet_analyzer_listen_open_connections ")[1].split()[0])
        assert still <= 3, still  # this request's, and the writers' just closed
        if nofile == 1024:
            assert "gpufleet_analyzer_listen_evicted_total 0" not in m
    finally:
        stop.set()
        for s in socks:
            s.close()
        p.terminate()
        code = p.wait(30)
    err = (tmp_path / f"err-{nofile}").read_text()
    assert code == 0 and "Too many open files" not in err and "Traceback" not in err, err


@pytest.mark.slow
def test_unauthenticated_uploads_cost_no_memory(tmp_path):
    """60 parallel unauthenticated 30 MiB posts: each gets its 401, and the process's peak
    resident memory grows by less than one of them."""
    _our_fd_room(400)
    p, port, url = _start(tmp_path, 4096, 10)
    try:
        requests.get(url + "/metrics", timeout=5)
        before = _peak_rss_kib(p.pid)
        blob = os.urandom(1 << 20) * 30
        codes = []

        def one():
            try:
                r = requests.post(url + "/write", data=blob, timeout=30)
                codes.append(r.status_code)
            except requests.ConnectionError:
                codes.append("reset")  # the answer came, the rest of the upload was not read

        threads = [threading.Thread(target=one) for _ in range(60)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        grown = _peak_rss_kib(p.pid) - before
        assert len(codes) == 60 and codes.count(401) >= 30, codes
        assert set(codes) <= {401, "reset"}
        assert grown < 16 * 1024, f"peak RSS grew by {grown} KiB"
        assert post(url).status_code == 204
    finally:
        p.terminate()
        assert p.wait(30) == 0


def test_keep_alive_pipelining_chunked_and_head_requests(listener):
    """The HTTP/1.1 a writer relies on: a session reuses its connection, pipelined requests are
    answered in order, a chunked body is taken, HEAD has no body, a bad request line is a 400."""
    ls = listener
    with requests.Session() as s:
        for _ in range(3):
            r = s.post(ls.url + "/write", data=LINE, headers={"Authorization": f"Token {TOKEN}"}, timeout=5)
            assert r.status_code == 204
    assert ls.counters["connections"] == 1
    r = requests.post(ls.url + "/write", data=iter([LINE[:10], LINE[10:]]),  # chunked
                      headers={"Authorization": f"Token {TOKEN}"}, timeout=5)
    assert r.status_code == 204
    sock = connect(ls.address[1])
    one = b"POST /write?p=tok3n HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(LINE), LINE)
    sock.sendall(b"\r\n" + one + one + b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got = answer_of(sock)
    sock.close()
    heads = [line for line in got.split(b"\r\n") if line.startswith(b"HTTP/1.1")]
    assert heads == [b"HTTP/1.1 204 No Content"] * 2 + [b"HTTP/1.1 200 OK", b"HTTP/1.1 204 No Content"]
    assert b"pass" not in got  # HEAD: headers only
    sock = connect(ls.address[1])
    sock.sendall(b"NONSENSE\r\n\r\n")
    assert answer_of(sock).startswith(b"HTTP/1.1 400 ")
    sock.close()
    assert ls.counters["accepted_points"] == 6


def test_a_kept_alive_connection_waits_for_its_next_request_past_the_head_timeout(listener, monkeypatch):
    """A writer that keeps its connection (an InfluxDB subscription) is not closed on between
    writes a few head timeouts apart: a POST it starts as the server closes would be lost. It is
    closed once idle for KEEP_ALIVE."""
    monkeypatch.setattr(listen, "KEEP_ALIVE", 3.0)
    request = (b"POST /write HTTP/1.1\r\nHost: x\r\nAuthorization: Token %s\r\nContent-Length: %d\r\n\r\n%s"
               % (TOKEN.encode(), len(LINE), LINE))
    s = connect(listener.address[1])

    def answered() -> bytes:
        got = b""
        while not got.endswith(b"\r\n\r\n"):  # (a 204: a head, no body)
            more = s.recv(4096)
            assert more, f"closed by the server, after {got!r}"
            got += more
        return got

    try:
        for _ in range(2):
            s.sendall(request)
            assert answered().startswith(b"HTTP/1.1 204")
            time.sleep(2.0)  # twice the head timeout (1 s), idle: still open
        s.sendall(request)
        assert answered().startswith(b"HTTP/1.1 204")
        assert closed_by_server(s, 5.0)  # idle past KEEP_ALIVE (3 s)
    finally:
        s.close()
