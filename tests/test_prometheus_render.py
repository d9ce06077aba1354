"""The prometheus exporter's rendering (cached per family, C-level joins) gives exactly the body a
plain renderer writes from the same snapshot, in every names mode and both formats, over ticks
that change values, hold them, leave series without a value, and move GPUs between jobs."""

from __future__ import annotations

import math

import pytest
from gpufleet.agent.model import Sample
from gpufleet.agent.pipeline import Pipeline
from gpufleet.agent.pipeline.prometheus import PrometheusExporter


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def reference(exp: PrometheusExporter, om: bool) -> bytes:
    """The snapshot written line by line: every family with a value, each series with its labels
    (a dcgm name's series with its GPU's job as hpc_job), floats as repr, ints as str."""
    snap = exp.snapshot
    reg = snap.reg
    lines = []
    for fam, sids in snap.layout:
        got = [s for s in sids if s in snap.values]
        if not got:
            continue
        name, typ = (fam.om_name, fam.om_type) if om else (fam.sample, fam.text_type)
        lines += [f"# HELP {name} {fam.help.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}",
                  f"# TYPE {name} {typ}"]
        for s in got:
            labels = reg.labels[s]
            job = snap.jobs.get(reg.uuid[s]) if fam.dcgm else None
            if job is not None:
                labels = labels + (("hpc_job", job),)
            v = snap.values[s]
            text = repr(v) if isinstance(v, float) else str(v)
            lab = "{" + ",".join(f'{k}="{_esc(str(x))}"' for k, x in labels) + "}" if labels else ""
            lines.append(f"{fam.sample}{lab} {text}")
    if om:
        lines.append("# EOF")
    return ("\n".join(lines) + "\n").encode() if lines else b""


def _rows(t_s: int, gpus: dict, slow: bool, missing_util=(), nan_temp=()) -> list:
    rows = []
    for g, job in gpus.items():
        f = {"temperature_gpu_celsius": math.nan if g in nan_temp else 40 + g + t_s // 10 * (g == 0)}
        if g not in missing_util:
            f["utilization_gpu_ratio"] = 0.29 + 0.01 * g + (0.1 if t_s >= 10 and g == 0 else 0.0)
        if slow:
            f["memory_total_bytes"] = 2**30 * (g + 1)
            if job is not None:
                f["job_id"] = job
        rows.append(Sample("gpu", {"gpu": str(g), "uuid": f"GPU-{g}", "model": 'M "x"\\'}, f, t_s * 10**9))
    return rows


@pytest.mark.parametrize("names", ["gpufleet", "dcgm", "both"])
def test_rendered_body_is_the_plain_renderers_in_every_mode(names):
    exp = PrometheusExporter("127.0.0.1:0", names, hold_s=100)
    pipe = Pipeline("n1", {"cluster": "c1"}, [exp])
    ticks = [  # (time, GPUs and their jobs, slow poll, GPUs without utilization, GPUs with a NaN temperature)
        (0, {0: "j1", 1: None}, True, (), ()),
        (10, {0: "j1", 1: None}, False, (1,), ()),  # GPU 1's utilization absent, GPU 0's values change
        (20, {0: "j1", 1: None}, False, (1,), ()),  # the same values: every block held
        (30, {0: "j2", 1: "j3"}, True, (), (1,)),  # jobs move; GPU 1's temperature NaN: absent
        (40, {0: "j2"}, False, (), ()),  # GPU 1 gone
        (50, {0: None}, True, (), ()),  # GPU 0's job ends
    ]
    seen = set()
    try:
        for t_s, gpus, slow, missing, nan in ticks:
            pipe.observe(_rows(t_s, gpus, slow, missing, nan))
            pipe.collect(t_s * 10**9)
            for om in (False, True, False):
                body = exp._render(exp.snapshot, om)
                assert body == reference(exp, om), (names, t_s, om)
                assert exp.render(om) == body
            lines = body.decode().splitlines()
            if any('hpc_job="' in ln for ln in lines):
                seen.add("hpc_job")
            if any(ln.endswith((" 0.29", " 0.3")) for ln in lines):
                seen.add("float")
            gpu1 = [ln for ln in lines if 'gpu="1"' in ln]
            if t_s == 10 and gpu1 and not any("util" in ln.lower() for ln in gpu1):
                seen.add("absent")
        want = {"absent"} | ({"hpc_job"} if names != "gpufleet" else set()) | \
            ({"float"} if names != "dcgm" else set())
        assert want <= seen, seen
    finally:
        pipe.shutdown()


def _ask(port: int, request: bytes) -> tuple[bytes, bool]:
    """One raw request; the answer and whether the server then closed the connection."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return data, True
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                       if ln.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += s.recv(65536)
        s.settimeout(2)
        try:
            closed = s.recv(1) == b""
        except TimeoutError:
            closed = False
        return head + b"\r\n\r\n" + body, closed


def test_request_parsing_keeps_http_servers_answers():
    """GET /metrics's own request reading: keep-alive as HTTP/1.1 and 1.0 define it, Accept read
    case-insensitively, bad header lines and other request lines answered as http.server does."""
    exp = PrometheusExporter("127.0.0.1:0", "gpufleet")
    exp.start()
    try:
        port = exp.port
        om = b"GET /metrics HTTP/1.1\r\nHost: x\r\naccept: application/openmetrics-text\r\n\r\n"
        got, closed = _ask(port, om)
        assert got.startswith(b"HTTP/1.1 200 OK\r\n") and b"application/openmetrics-text" in got
        assert got.endswith(b"\r\n\r\n# EOF\n") and not closed
        assert b"Content-Length: 6\r\n" in got and b"\r\nDate: " in got and b"\r\nServer: " in got
        got, closed = _ask(port, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 200 OK\r\n") and closed
        got, closed = _ask(port, b"GET /metrics HTTP/1.0\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 200 OK\r\n") and b"version=0.0.4" in got and closed
        got, closed = _ask(port, b"GET /nothing HTTP/1.1\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 404 ") and not closed
        got, closed = _ask(port, b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 400 ") and closed
        got, closed = _ask(port, b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n")
        assert got.startswith(b"HTTP/1.1 431 ") and closed
        got, closed = _ask(port, b"BREW /metrics HTTP/1.1\r\n\r\n")  # http.server's own checks
        assert got.startswith(b"HTTP/1.1 501 ") and closed
        got, closed = _ask(port, b"GET /metrics HTTP/2.0\r\n\r\n")
        assert b"Error code: 505" in got and closed  # http.server answers it as HTTP/0.9: no head
    finally:
        exp.shutdown()
