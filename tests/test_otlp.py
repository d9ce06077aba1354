"""The ``otlp`` exporter's output decoded with the official OpenTelemetry proto: GPU identity per
the semantic conventions (``hw.id``, ``hw.name``, ``hw.vendor``, ``hw.model``, ``hw.type``) on
every GPU data point, ``host.name`` and ``service.*`` on the resource, the InfluxDB tags as before."""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from gpufleet.agent import config
from gpufleet.agent.daemon import Agent

from gpufleet import catalogue
from gpufleet.lineprotocol import parse_line

metrics_service_pb2 = pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")


class Receiver:
    """An OTLP/HTTP metrics endpoint: every POST body decoded as ExportMetricsServiceRequest."""

    def __init__(self):
        self.requests: list = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                req = metrics_service_pb2.ExportMetricsServiceRequest()
                req.ParseFromString(body)
                outer.requests.append(req)
                out = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _attrs(kvs) -> dict:
    out = {}
    for kv in kvs:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def test_the_identity_is_added_only_when_a_listed_exporter_declares_it(tmp_path):
    from gpufleet.agent.config import exporter_classes

    assert [n for n, c in exporter_classes().items() if c.identity] == ["otlp"]
    for exporters, want in ((["file"], False), (["file", "otlp"], True)):
        cfg = config.validate({"agent": {"backend": "sim", "exporters": exporters, "collectors": ["host"]},
                               "file": {"dir": str(tmp_path / "lp")}})
        ag = Agent(cfg)
        try:
            assert ag.pipeline.identity is want, exporters
        finally:
            ag.close(0)


@pytest.mark.slow
def test_gpu_points_carry_semconv_identity_and_line_protocol_keeps_its_tags(tmp_path):
    rx = Receiver()
    cfg = config.validate({"agent": {"backend": "sim", "interval": 1, "exporters": ["otlp", "file"],
                                     "collectors": ["gpu", "host"], "host": "n1"},
                           "otlp": {"endpoint": rx.url},
                           "file": {"dir": str(tmp_path / "lp"), "compress": False}})
    ag = Agent(cfg)
    try:
        ag.tick(time.time_ns())
    finally:
        ag.close(0)
        rx.close()
    assert rx.requests
    gpu_otel = {m.otel for m in catalogue.load() if "uuid" in catalogue.IDENTITY_TAGS[m.measurement]}
    gpu_points = other_points = 0
    seen_gpus = set()
    for req in rx.requests:
        for rm in req.resource_metrics:
            res = _attrs(rm.resource.attributes)
            assert res["host.name"] == "n1" and res["service.name"] == "gpufleet-agent"
            assert res["service.version"]
            assert not any(k.startswith("hw.") for k in res)
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    for dp in getattr(m, kind).data_points:
                        a = _attrs(dp.attributes)
                        if "uuid" in a:
                            assert m.name in gpu_otel
                            assert a["hw.id"] == a["uuid"] and a["hw.id"].startswith("GPU-")
                            assert a["hw.name"] == f"GPU {a['gpu']}"
                            assert a["hw.vendor"] == "NVIDIA" and a["hw.type"] == "gpu"
                            assert a["hw.model"] == a["model"] == "NVIDIA H200"
                            assert "host.name" not in a
                            gpu_points += 1
                            seen_gpus.add(a["hw.id"])
                        else:
                            assert not set(a) & set(catalogue.otel_identity()), a
                            other_points += 1
    assert len(seen_gpus) == 8 and gpu_points > 8 * 40 and other_points
    # the line protocol of the same tick: InfluxDB tag names as before, no hw.* tag
    tags = set()
    for f in (tmp_path / "lp").rglob("*.lp"):
        for line in f.read_text().splitlines():
            tags |= set(parse_line(line).tags)
    assert {"host", "gpu", "uuid", "model"} <= tags
    assert not any(t.startswith("hw.") for t in tags)
